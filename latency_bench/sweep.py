"""``python -m latency_bench report``: real speech, paced in real time, over N concurrent ``/v1/realtime`` sessions.

Every session streams 24 kHz PCM16 microphone audio continuously (``--chunk-ms`` chunks, each sent at its
real-time instant: silence between questions, Piper-spoken questions when it "talks") with ``server_vad``
(silence_duration_ms 500), and times every event it receives with the client's clock. Per turn:

* TTFA    — ``input_audio_buffer.speech_stopped`` arrival -> first ``response.output_audio.delta`` arrival
            (and the server's own ``response.done.response.metadata.ttfa_ms``);
* V2V     — the instant the chunk holding the last speech sample of the question was sent -> first audio delta;
* ASR final (speech_stopped -> ``...input_audio_transcription.completed``), thinker first token
  (speech_stopped -> first ``response.output_audio_transcript.delta``), talker+vocoder (first text -> first audio);
* underruns — playback simulated at 24 kHz from the first delta: each time the buffer would run dry before the
  next delta of the same answer arrives is one underrun (its gap summed);
* barge-in — in a dedicated turn the client starts a new question while a long answer streams:
  ``speech_started`` arrival -> the last audio delta of that answer (and -> its ``response.done``).

Servers are started here (``omni-rt serve --preset PATH``), one per pipeline variant (``latency_bench/ablations.py``),
sequentially; ``--url`` loads a server that is already running instead (no ablations then). ``/metrics``
histograms are scraped before and after each concurrency level for the server-side view
(``latency_bench/metrics_scrape.py``). The client is ``latency_bench/session_driver.py``.

    python -m latency_bench report                 # CPU preset: sweep 1, 2, 4 sessions + ablations (< 15 min on 2 cores)
    python -m latency_bench report --quick         # sweep 1, 2 sessions, 2 turns each, short ablations (< 5 min)
    python -m latency_bench report --preset gpu    # GPU machine: sweep 1, 4, 16 sessions
    python -m latency_bench report --url ws://127.0.0.1:8000 --sessions 1,8   # load a running server (no ablations)
    python -m latency_bench report --thinker my-model.gguf --sessions 1,4 --variants none   # another thinker
    python -m latency_bench report --update-docs   # also rewrite docs/benchmarks/index.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import logging
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latency_bench import procstat, report
from latency_bench.ablations import BASELINE, QUICK_VARIANTS, VARIANTS, ratios_and_checks, variant_preset
from latency_bench.corpus import INTERRUPT, LONG_QUESTION, QUESTIONS, SR, Utterance, synthesize_corpus
from latency_bench.metrics_scrape import histogram_delta, scrape, stage_samples, stage_times
from latency_bench.server_proc import ROOT, bench_server, measured_thinker
from latency_bench.session_driver import BenchSession, turn_record


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="short run: levels 1,2; 2 turns; one barge-in; 2-turn ablations of 4 variants")
    p.add_argument("--preset", default="cpu", help="base preset for the servers started here: cpu | gpu | YAML path")
    p.add_argument("--thinker", default=None, metavar="MODEL",
                   help="every server started here runs this thinker (omni-rt serve --thinker: a .gguf file or "
                        "http(s)://HOST:PORT/v1); the report names it. The 'torch' ablation is skipped with it")
    p.add_argument("--url", default=None, help="ws://HOST:PORT of a running server (skips server start and ablations)")
    p.add_argument("--sessions", default=None, help="concurrency levels, comma-separated (default 1,2,4; gpu 1,4,16)")
    p.add_argument("--turns", type=int, default=None, help="questions per session per level (default 4; quick 2)")
    p.add_argument("--ablation-turns", type=int, default=None, help="questions per ablation variant (default 3; quick 2)")
    p.add_argument("--variants", default=None,
                   help="comma-separated: " + ",".join(VARIANTS) + " (default all; quick: " + ",".join(QUICK_VARIANTS)
                        + "; 'none' to skip); no_async and windowed bring no_held, their baseline")
    add_session_arguments(p)
    p.add_argument("--no-barge", action="store_true", help="skip the barge-in turns")
    p.add_argument("--barge-delay-s", type=float, default=0.3, help="talk over the answer this long after its first audio")
    p.add_argument("--out", default=str(report.RESULTS_DIR / "latest.json"))
    p.add_argument("--png", default=str(report.RESULTS_DIR / "latest.png"))
    p.add_argument("--update-docs", action="store_true", help="rewrite docs/benchmarks/index.md from this run")
    p.add_argument("--from-json", default=None, metavar="JSON",
                   help="no run: re-report a saved result (its ratios and checks by today's rules) into it, its .md and, "
                        "with --update-docs, the docs page")


def add_session_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the client sessions and servers, shared with ``turns``."""
    p.add_argument("--chunk-ms", type=int, default=20, help="microphone chunk, sent at its real-time instant (20-40)")
    p.add_argument("--gap-s", type=float, default=0.8, help="pause after an answer before the next question")
    p.add_argument("--pace", choices=("done", "playback"), default="done",
                   help="the pause starts at the answer's response.done (default) or once its audio has played")
    p.add_argument("--turn-timeout", type=float, default=90.0, help="seconds a turn may take before it counts as failed")
    p.add_argument("--no-warmup", action="store_true", help="skip the unrecorded warm-up turn on each server")
    p.add_argument("--log-dir", default=None, help="keep server logs here (default: a temp dir)")
    p.add_argument("--note", action="append", help="a note printed with the report (repeatable)")


@dataclass
class Plan:
    levels: list[int]
    turns: int
    barge: str  # all | first | none
    ablation_turns: int
    variants: list[str]
    chunk_ms: int
    gap_s: float
    turn_timeout: float
    barge_delay_s: float
    warmup: bool
    transcription: bool
    # when a session speaks again: gap_s after the answer's response.done ("done": the answers' audio arrives
    # faster than it plays, so sessions talk while their last answer would still sound) or after it has played
    # ("playback": a listener who hears the answer out; the offered load then no longer depends on how far ahead
    # of playback the server sends its audio)
    pace: str = "done"


def log_line(msg: str) -> None:
    """One timestamped progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def run_scripts(sessions: list[BenchSession], script) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every session's script at once, close them all, and return the turn records plus run-wide facts."""
    try:
        await asyncio.gather(*(script(s) for s in sessions))
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    records = [turn_record(t) for s in sessions for t in s.turns]
    info = {"client_late_ms_max": round(max(s.mic.late_s_max for s in sessions if s.mic) * 1000, 1),
            "error_events": [e for s in sessions for e in s.errors],
            "unexpected_responses": sum(len(s.unexpected) for s in sessions)}
    return records, info


async def run_sessions(url: str, n: int, corpus: dict[str, Utterance], plan: Plan, turns: int, barge_sessions: set[int],
                       offset: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    sessions = [BenchSession(url, i, plan.chunk_ms, plan.transcription) for i in range(n)]
    await asyncio.gather(*(s.open() for s in sessions))
    stagger = min(1.0, 4.0 / n) if n > 1 else 0.0

    async def script(s: BenchSession) -> None:
        await asyncio.sleep(0.5 + s.idx * stagger)
        for k in range(turns):
            q = QUESTIONS[(offset + s.idx + k) % len(QUESTIONS)]
            await s.rest(await s.ask(corpus[q], plan.turn_timeout), plan)
        if s.idx in barge_sessions:
            await s.barge(corpus[LONG_QUESTION], corpus[INTERRUPT], plan.turn_timeout, plan.barge_delay_s)
            await asyncio.sleep(plan.gap_s)

    return await run_scripts(sessions, script)


def level_result(records: list[dict[str, Any]], info: dict[str, Any], hist: dict[str, Any] | None = None,
                 samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ok = [r for r in records if r["ok"] and r["kind"] != "barge_target"]
    barge = [r for r in records if r["kind"] == "barge_target" and r["ok"]]
    summary = report.summarize_turns(ok)
    summary.update(report.summarize_turns(barge, report.BARGE_METRICS))
    return {"turns_ok": len(ok), "turns_failed": sum(1 for r in records if not r["ok"] and not r.get("no_sample")),
            "barge_no_sample": sum(1 for r in records if r.get("no_sample")), "summary": summary,
            "server_histograms": hist or {}, "stage_times": stage_times(hist or {}, samples), "client": info, "turns": records}



async def warmup(url: str, corpus: dict[str, Utterance], plan: Plan) -> None:
    """One unrecorded short turn: whisper, the VAD and the thinker run once before anything is timed."""
    s = BenchSession(url, 0, plan.chunk_ms, plan.transcription, max_output_tokens=12)
    await s.open()
    try:
        await s.ask(corpus[QUESTIONS[1]], plan.turn_timeout)
    finally:
        await s.close()


async def run_sweep(url: str, http_url: str, corpus: dict[str, Utterance], plan: Plan,
                    pid: int | None = None) -> dict[str, Any]:
    """Each level's turns; ``pid``: the server's process (one this run started), whose CPU and its children's
    (llama-server) each level charges to its answered turns."""
    out: dict[str, Any] = {}
    for li, n in enumerate(plan.levels):
        barge = set(range(n)) if plan.barge == "all" else ({0} if plan.barge == "first" else set())
        log_line(f"sweep: {n} session(s) x {plan.turns} turn(s){' + barge-in' if barge else ''}")
        before = scrape(http_url) if http_url else {}
        mark = stage_samples(http_url) if http_url else None
        t0, cpu0 = time.perf_counter(), procstat.cpu_split(pid)
        records, info = await run_sessions(url, n, corpus, plan, plan.turns, barge, offset=li)
        cpu1 = procstat.cpu_split(pid)
        hist = histogram_delta(before, scrape(http_url)) if http_url else {}
        got = stage_samples(http_url, mark["last"]) if mark is not None else None
        res = level_result(records, info, hist, got["samples"] if got is not None else None)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        if cpu0 and cpu1 and res["turns_ok"]:
            res["cpu_ms_per_turn"] = {k: round((cpu1[k] - cpu0[k]) * 1000 / res["turns_ok"]) for k in cpu0}
        s = res["summary"]["ttfa_ms"]
        log_line(f"  {n} session(s): {res['turns_ok']} ok, {res['turns_failed']} failed; TTFA p50 {s['p50']} p95 {s['p95']} ms"
                 + ("; barge-in: no sample (the answer was all sent before speech_started)" if res["barge_no_sample"] else ""))
        out[str(n)] = res
    return out


async def run_variant(url: str, corpus: dict[str, Utterance], plan: Plan, name: str) -> dict[str, Any]:
    log_line(f"ablation '{name}': 1 session x {plan.ablation_turns} turn(s)")
    records, info = await run_sessions(url, 1, corpus, plan, plan.ablation_turns, set())
    res = level_result(records, info)
    res["description"] = VARIANTS[name][0]
    s = res["summary"]["ttfa_ms"]
    log_line(f"  {name}: {res['turns_ok']} ok; TTFA p50 {s['p50']} ms")
    return res



async def run(args: Any) -> dict[str, Any]:
    measured = measured_thinker(args)  # a wrong --thinker stops the run here, before anything else
    quick = args.quick
    plan = Plan(
        levels=[int(x) for x in (args.sessions or ("1,2" if quick else ("1,4,16" if "gpu" in args.preset else "1,2,4"))).split(",")],
        turns=args.turns or (2 if quick else 4),
        barge="none" if args.no_barge else ("first" if quick else "all"),
        ablation_turns=args.ablation_turns or (2 if quick else 3),
        variants=[v for v in (args.variants or ",".join(QUICK_VARIANTS if quick else VARIANTS)).split(",") if v and v != "none"],
        chunk_ms=args.chunk_ms, gap_s=args.gap_s, turn_timeout=args.turn_timeout, barge_delay_s=args.barge_delay_s,
        warmup=not args.no_warmup, transcription=True, pace=args.pace,
    )
    for v in plan.variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {list(VARIANTS)}")
    for v in list(plan.variants):  # an ablation compared with another variant brings it along
        if (b := BASELINE.get(v)) and b not in plan.variants:
            plan.variants.insert(plan.variants.index(v), b)
    if args.url:
        plan.variants = []
    thinker = getattr(args, "thinker", None)
    if thinker and "torch" in plan.variants:  # --thinker sets the engine, so the 'torch' ablation would not be one
        plan.variants.remove("torch")
        log_line("variant 'torch' skipped: --thinker chooses the thinker's engine")
    argv = " ".join(shlex.quote(a) for a in (args.argv or []))
    result: dict[str, Any] = {
        "started_at": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": report.machine_info(),
        "config": {"preset": args.preset, "mode": "quick" if quick else "full", "command": f"python -m latency_bench {argv}".strip(),
                   "url": args.url, "thinker": measured, **{k: v for k, v in plan.__dict__.items()}, "silence_duration_ms": 500,
                   "questions": QUESTIONS, "barge_question": LONG_QUESTION, "interrupt": INTERRUPT},
        "notes": list(args.note or []),
    }
    t_start = time.perf_counter()
    log_line("synthesizing the spoken questions with Piper")
    corpus = synthesize_corpus(QUESTIONS + [LONG_QUESTION, INTERRUPT])
    result["config"]["question_audio_s"] = {u.text: round(u.speech_end / SR, 2) for u in corpus.values()}

    tmp = Path(tempfile.mkdtemp(prefix="latency_bench-"))
    log_dir = Path(args.log_dir) if args.log_dir else tmp
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[str, Any] = {}
    if args.url:
        ws = args.url.rstrip("/")
        http = ws.replace("ws://", "http://").replace("wss://", "https://")
        result["sweep"] = await run_sweep(ws, http, corpus, plan)
    else:
        # The base server stays up (idle) while each variant runs on its own server; right after each variant,
        # the same questions run again on the base server, so every ratio compares turns a minute apart (a
        # shared machine's load drifts more than some of these effects).
        ablation: dict[str, Any] = {}
        baseline: list[dict[str, Any]] = []
        base = bench_server(args, args.preset, "streaming", log_dir)
        log_line(f"starting server (preset {args.preset})")
        await asyncio.to_thread(base.start)
        servers["streaming"] = {"preset": args.preset, "startup_s": base.startup_s}
        try:
            if plan.warmup:
                await warmup(base.ws_url, corpus, plan)
            result["sweep"] = await run_sweep(base.ws_url, base.http_url, corpus, plan, base.proc.pid if base.proc else None)
            others = [v for v in plan.variants if v != "streaming"]
            if "streaming" in plan.variants and not others:
                baseline.append(await run_variant(base.ws_url, corpus, plan, "streaming"))
            for name in others:
                preset = variant_preset(args.preset, name, tmp)
                srv = bench_server(args, preset, name, log_dir, extra=VARIANTS[name][2])
                log_line(f"starting server '{name}' ({preset})")
                try:
                    await asyncio.to_thread(srv.start)
                except RuntimeError as exc:
                    log_line(f"variant {name} failed to start: {exc}")
                    ablation[name] = {"description": VARIANTS[name][0], "error": str(exc)[:2000], "summary": {}, "turns": [],
                                      "turns_ok": 0}
                    continue
                servers[name] = {"preset": str(Path(preset).relative_to(ROOT)) if Path(preset).is_relative_to(ROOT) else preset,
                                 "serve_flags": VARIANTS[name][2], "startup_s": srv.startup_s}
                try:
                    if plan.warmup:
                        await warmup(srv.ws_url, corpus, plan)
                    ablation[name] = await run_variant(srv.ws_url, corpus, plan, name)
                finally:
                    await asyncio.to_thread(srv.stop)
                if "streaming" in plan.variants:
                    pair = await run_variant(base.ws_url, corpus, plan, "streaming")
                    baseline.append(pair)
                    ablation[name]["paired_streaming"] = {"summary": pair["summary"], "turns_ok": pair["turns_ok"],
                                                          "turns": [{k: r.get(k) for k in ("question", "ok", "ttfa_ms", "v2v_ms")}
                                                                    for r in pair["turns"]]}
        finally:
            await asyncio.to_thread(base.stop)
        if baseline:
            pooled = level_result([r for b in baseline for r in b["turns"]],
                                  {"client_late_ms_max": max(b["client"]["client_late_ms_max"] for b in baseline)})
            pooled["description"] = VARIANTS["streaming"][0] + (" (all paired runs pooled)" if len(baseline) > 1 else "")
            ablation = {"streaming": pooled, **ablation}
        result["ablation"] = ablation
    result["servers"] = servers
    result["machine"]["loadavg_end"] = report.loadavg()
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    ratios_and_checks(result, args.preset)
    return result


def command(args: Any) -> int:
    """``python -m latency_bench report``: run, then write latest.{json,png,md} (and docs/benchmarks/index.md)."""
    logging.basicConfig(level=logging.WARNING)
    if args.from_json:
        result = report.rereport(Path(args.from_json), Path(args.png), docs=args.update_docs)
        report.plot(result, Path(args.png))
        print(report.text_report(result))
        return 0
    result = asyncio.run(run(args))
    out_json = Path(args.out)
    out_png = Path(args.png)
    report.write_json(result, out_json)
    report.plot(result, out_png)
    print(report.text_report(result))
    report.write_markdown(result, out_json, out_png, docs=args.update_docs)
    print(f"\nwrote {out_json}, {out_png}, {out_json.with_suffix('.md')} in {result['wall_s']:.0f} s"
          + (f" and {report.DOCS_INDEX.relative_to(ROOT)}" if args.update_docs else ""))
    return 0
