"""``python -m latency_bench turns``: turn taking on the labelled set (``omni_rt.testing.turn_set``).

server_vad vs semantic_vad on one server, one mode after the other at each level: complete questions (V2V/TTFA)
and hesitant ones (false end-of-turn rate), after the set is scored at the stage level (no server). With
``--stage-level`` only that scoring runs, printing the rates behind the eagerness table.

    python -m latency_bench turns                                   # server_vad,semantic_vad, 1 session (~15 min)
    python -m latency_bench turns --turn-detection semantic_vad --sessions 1,4
    python -m latency_bench turns --stage-level [--held-out] [--room-noise] [--thinker-cue] [--score-from-silero]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import logging
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from latency_bench import report
from latency_bench.corpus import SERVER_VAD, TURN_DETECTION, Utterance, turn_set_utterances
from latency_bench.server_proc import bench_server, measured_thinker
from latency_bench.session_driver import BenchSession
from latency_bench.sweep import Plan, add_session_arguments, log_line, run_scripts, warmup


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turn-detection", default="server_vad,semantic_vad",
                   help="comma-separated modes (server_vad,semantic_vad), each on the same server: complete questions "
                        "(V2V/TTFA) and hesitant ones (false end-of-turn rate)")
    p.add_argument("--preset", default="cpu", help="preset of the server started here: cpu | gpu | YAML path")
    p.add_argument("--thinker", default=None, metavar="MODEL", help="the server started here runs this thinker (omni-rt serve --thinker)")
    p.add_argument("--url", default=None, help="ws://HOST:PORT of a running server (skips server start)")
    p.add_argument("--sessions", default=None, help="concurrency levels, comma-separated (default 1)")
    p.add_argument("--turns", type=int, default=None, help="complete questions per session at 1 session (default: all of the set's first items, turn_set.TEST_ITEMS)")
    p.add_argument("--hesitant", type=int, default=None,
                   help="hesitant utterances per session at 1 session (default: all of the set's first items)")
    p.add_argument("--max-output-tokens", type=int, default=32, help="answer length cap")
    add_session_arguments(p)
    p.add_argument("--out", default=str(report.RESULTS_DIR / "turn_taking.json"))
    g = p.add_argument_group("stage level (no server)")
    g.add_argument("--stage-level", action="store_true", help="only score the set at the stage level and print the rates")
    g.add_argument("--held-out", action="store_true", help="the items written after the rule was fitted (turn_set.HELD_OUT)")
    g.add_argument("--room-noise", action="store_true", help="light white noise under the audio (turn_set.with_room_noise)")
    g.add_argument("--thinker-cue", action="store_true", help="also the thinker's end-of-turn probability on the transcripts")
    g.add_argument("--score-from-silero", action="store_true", help="the score point counted from Silero's frames")


def stage_level_turn_rates(silence_duration_ms: int) -> dict[str, Any]:
    """The set's first items (``TEST_ITEMS``: those the live run speaks) scored at the stage level (no server):
    per mode, the false end-of-turn rates and the end silence the verdict picks, and Smart Turn's score
    distributions (``omni_rt.testing.turn_scores``). The whole set: ``--stage-level``."""
    from omni_rt.testing import turn_scores as ts
    from omni_rt.testing.turn_set import TEST_ITEMS, spoken_set

    t0 = time.perf_counter()
    scores = ts.score_set(spoken_set(first=TEST_ITEMS), *ts.load_scorers())
    out: dict[str, Any] = {"pauses": len(scores), "score_s": round(time.perf_counter() - t0, 1),
                           "distributions": ts.distributions(scores), "modes": {}}
    by_key: dict[str, list[Any]] = {}
    for sc in scores:
        by_key.setdefault(sc.key, []).append(sc)
    cut = {"hesitant": [0, 0], "complete": [0, 0]}
    for pauses in by_key.values():  # server_vad: any pause as long as the silence duration ends the turn
        kind = pauses[0].kind
        cut[kind][0] += any(not p.final and p.lasts_ms >= silence_duration_ms for p in pauses)
        cut[kind][1] += 1
    out["modes"][f"server_vad ({silence_duration_ms} ms)"] = {
        "false_end_hesitant": cut["hesitant"], "false_end_complete": cut["complete"],
        "end_silence_ms": {"p50": silence_duration_ms, "p95": silence_duration_ms}}
    for eagerness in ("low", "medium", "high"):
        out["modes"][f"semantic_vad {eagerness}" + (" (= auto)" if eagerness == "medium" else "")] = ts.rates(scores, eagerness)
        out["modes"][f"semantic_vad {eagerness}, Smart Turn alone"] = ts.rates(scores, eagerness, words=False)
    return out



async def run_turn_sessions(url: str, n: int, mode: str, complete: list[Utterance], hesitant: list[Utterance], plan: Plan,
                            turns: int, n_hesitant: int, offset: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """n sessions under ``mode``: each asks ``turns`` complete questions, then speaks ``n_hesitant`` hesitant ones."""
    sessions = [BenchSession(url, i, plan.chunk_ms, plan.transcription, max_output_tokens=plan_max_tokens(plan),
                             turn_detection=TURN_DETECTION[mode]) for i in range(n)]
    await asyncio.gather(*(s.open() for s in sessions))
    stagger = min(1.0, 4.0 / n) if n > 1 else 0.0

    async def script(s: BenchSession) -> None:
        await asyncio.sleep(0.5 + s.idx * stagger)
        for k in range(turns):
            await s.rest(await s.ask(complete[(offset + s.idx * turns + k) % len(complete)], plan.turn_timeout), plan)
        for k in range(n_hesitant):
            await s.rest(await s.ask_hesitant(hesitant[(offset + s.idx * n_hesitant + k) % len(hesitant)],
                                              plan.turn_timeout), plan)

    return await run_scripts(sessions, script)


def plan_max_tokens(plan: Plan) -> int | None:
    return getattr(plan, "max_output_tokens", None)


def turn_level_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """V2V/TTFA on complete questions; false end-of-turn rate on hesitant ones."""
    asks = [r for r in records if r["kind"] == "ask"]
    ok = [r for r in asks if r["ok"]]
    hes = [r for r in records if r["kind"] == "hesitant"]
    false_turns = sum(1 for r in hes if r["false_stops"] > 0)
    pauses = sum(r.get("pauses", 1) for r in hes)
    return {
        "complete": {"turns": len(asks), "ok": len(ok), "v2v_ms": report.summarize(r.get("v2v_ms") for r in ok),
                     "false_end_turns": sum(1 for r in asks if r["false_stops"] > 0),
                     "v2v_max_ms": max((r["v2v_ms"] for r in ok if r.get("v2v_ms") is not None), default=None),
                     "ttfa_ms": report.summarize(r.get("ttfa_ms") for r in ok),
                     "endpoint_ms": report.summarize(r.get("endpoint_ms") for r in ok)},
        "hesitant": {"turns": len(hes), "pauses": pauses, "false_end_turns": false_turns,
                     "false_end_rate": round(false_turns / len(hes), 3) if hes else None,
                     "false_stops": sum(r["false_stops"] for r in hes),
                     "v2v_ms": report.summarize(r.get("v2v_ms") for r in hes if r["ok"])},
    }


async def run_turn_taking(args: Any, plan: Plan, modes: list[str]) -> dict[str, Any]:
    """server_vad vs semantic_vad on one server, one mode after the other at each level (the load drifts less)."""
    result: dict[str, Any] = {
        "started_at": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": report.machine_info(),
        "config": {"preset": args.preset, "command": "python -m latency_bench " + " ".join(shlex.quote(a) for a in (args.argv or [])),
                   "thinker": measured_thinker(args), "modes": {m: TURN_DETECTION[m] for m in modes}, "levels": plan.levels, "turns": plan.turns,
                   "hesitant_per_session": args.hesitant, "turn_set": "omni_rt/testing/turn_set.py (live: voice 'plain')"},
        "notes": list(args.note or []),
    }
    t_start = time.perf_counter()
    log_line("scoring the labelled end-of-turn set at the stage level (all voices)")
    result["stage_level"] = stage_level_turn_rates(SERVER_VAD["silence_duration_ms"])
    complete, hesitant = turn_set_utterances("plain")
    corpus = {u.text: u for u in complete}
    tmp = Path(tempfile.mkdtemp(prefix="latency_bench-"))
    log_dir = Path(args.log_dir) if args.log_dir else tmp
    log_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {m: {} for m in modes}
    if args.url:
        url = args.url.rstrip("/")
        srv = None
    else:
        srv = bench_server(args, args.preset, "turn-taking", log_dir)
        log_line(f"starting server (preset {args.preset})")
        await asyncio.to_thread(srv.start)
        url = srv.ws_url
    try:
        if plan.warmup:
            await warmup(url, corpus, plan)
        for li, n in enumerate(plan.levels):
            for mode in modes:
                all_c, all_h = plan.turns or len(complete), args.hesitant or len(hesitant)  # default: all the live corpus (the set's first items)
                turns = all_c if n == 1 else max(1, all_c // 3)
                n_h = all_h if n == 1 else max(1, all_h // 4)
                turns, n_h = min(turns, len(complete)), min(n_h, len(hesitant))
                log_line(f"{mode}: {n} session(s) x {turns} complete + {n_h} hesitant")
                t0 = time.perf_counter()
                records, info = await run_turn_sessions(url, n, mode, complete, hesitant, plan, turns, n_h, offset=li)
                for r in records:
                    if r["kind"] == "hesitant":
                        r["pauses"] = next(len(u.pauses) for u in hesitant if u.text == r["question"])
                summ = turn_level_summary(records)
                out[mode][str(n)] = {"summary": summ, "client": info, "turns": records, "wall_s": round(time.perf_counter() - t0, 1)}
                c, h = summ["complete"], summ["hesitant"]
                log_line(f"  {mode} x{n}: V2V p50 {c['v2v_ms']['p50']} p95 {c['v2v_ms']['p95']} ms ({c['ok']}/{c['turns']} ok); "
                     f"false end of turn {h['false_end_turns']}/{h['turns']}")
    finally:
        if srv is not None:
            await asyncio.to_thread(srv.stop)
    result["turn_taking"] = out
    result["machine"]["loadavg_end"] = report.loadavg()
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    m = result["machine"]
    start_load = (m.get("loadavg_start") or [0.0])[0]
    if start_load > 0.5 * (m.get("cpus_usable") or 1):
        result["notes"].append(f"other processes were using the machine when this run started (load average {start_load:.1f} on "
                               f"{m.get('cpus_usable')} CPUs): the numbers are inflated and noisy")
    return result


def turn_taking_markdown(result: dict[str, Any]) -> str:
    """The server_vad vs semantic_vad tables (what docs/benchmarks/turn-taking.md shows): the labelled set scored at
    the stage level (rates per mode, all voices), then live turns through the server (latency)."""
    m = result["machine"]
    lines = [f"Turn taking: `{result['config']['command']}` ({result['started_at']}, preset `{result['config']['preset']}`, "
             f"thinker {report.thinker_of(result)}), "
             f"{m.get('cpu_model', '?')}, {m.get('cpus_usable', '?')} CPUs usable, load avg "
             f"{(m.get('loadavg_start') or ['?'])[0]} -> {(m.get('loadavg_end') or ['?'])[0]}, {result['wall_s']:.0f} s.", ""]
    lines += [f"> **Note:** {n}" for n in result.get("notes", [])]
    if result.get("notes"):
        lines.append("")
    st = result.get("stage_level")
    if st:
        frac = lambda a: f"{a[0]}/{a[1]} ({100 * a[0] / a[1]:.0f}%)" if a and a[1] else "-"  # noqa: E731
        lines += [f"On the labelled set (`omni_rt/testing/turn_set.py`, {st['pauses']} pauses in 3 Piper voices), scored at "
                  "the stage level (the end silence each verdict picks; compute time not included):", "",
                  "| mode | hesitant utterances cut | complete utterances cut mid-way | ended at the sure silence | end silence p50 / p95 |",
                  "|---|---|---|---|---|"]
        for mode, r in st["modes"].items():
            sure = f"{r['ended_sure']}/{r['endings']}" if "ended_sure" in r else "-"
            if r.get("ended_second_look"):
                sure += f" (+{r['ended_second_look']} at the second look)"
            e = r["end_silence_ms"]
            lines.append(f"| {mode} | {frac(r['false_end_hesitant'])} | {frac(r['false_end_complete'])} | {sure} | "
                         f"{e['p50']:.0f} / {e['p95']:.0f} |")
        from omni_rt.stages.asr import turn_rule as tdm

        cues = " / ".join(c.replace("_", " ") for c in tdm.WORDS_CUES)
        lines += ["", f"Smart Turn's score and the transcript's cue ({cues}) per kind of pause:", "",
                  f"| pause | n | Smart Turn p5 / p50 / p95 | words: {cues} |", "|---|---|---|---|"]
        for name, d in st["distributions"].items():
            w = d["words"]
            lines.append(f"| {name} | {d['n']} | {d['audio_p5']:.3f} / {d['audio_p50']:.3f} / {d['audio_p95']:.3f} | "
                         + " / ".join(str(w.get(c, 0)) for c in tdm.WORDS_CUES) + " |")
        lines.append("")
    lines += ["Live, through the server (voice 'plain', a client streaming like a live mic):", "",
              "| mode | sessions | complete turns ok | V2V p50 / p95 / max | TTFA p50 / p95 | end of speech -> speech_stopped p50 / p95 "
              "| complete: cut mid-way | hesitant: false end of turn | hesitant V2V p50 |",
              "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda s: f"{s['p50']:.0f} / {s['p95']:.0f}" if s.get("p50") is not None else "-"  # noqa: E731
    for mode, levels in result["turn_taking"].items():
        td = result["config"]["modes"][mode]
        label = f"{mode} ({'eagerness ' + td['eagerness'] if mode == 'semantic_vad' else str(td['silence_duration_ms']) + ' ms silence'})"
        for n, lv in levels.items():
            c, h = lv["summary"]["complete"], lv["summary"]["hesitant"]
            rate = f"{h['false_end_turns']}/{h['turns']} ({100 * h['false_end_rate']:.0f}%)" if h["turns"] else "-"
            hv = h["v2v_ms"]["p50"]
            vmax = c.get("v2v_max_ms")
            lines.append(f"| {label} | {n} | {c['ok']}/{c['turns']} | {fmt(c['v2v_ms'])} / {vmax if vmax is not None else '-'} | "
                         f"{fmt(c['ttfa_ms'])} | {fmt(c['endpoint_ms'])} | {c.get('false_end_turns', '-')}/{c['turns']} | {rate} | "
                         f"{hv if hv is not None else '-'} |")
    lines += ["", "V2V = last speech sample sent -> first answer audio; TTFA = `speech_stopped` -> first audio; hesitant "
              "utterances are Piper fragments cut at a filler (\"..., um,\") or an open clause (\"for\", \"and\", \"the\") "
              "and a 500-900 ms silence; a false end of turn is a `speech_stopped` before the speaker's last word was sent."]
    return "\n".join(lines) + "\n"


def command(args: Any) -> int:
    """``python -m latency_bench turns``: the live run (or, with ``--stage-level``, the set scored without a server)."""
    if args.stage_level:
        return stage_level_command(args)
    logging.basicConfig(level=logging.WARNING)
    modes = [m.strip() for m in args.turn_detection.split(",") if m.strip()]
    for mode in modes:
        if mode not in TURN_DETECTION:
            raise SystemExit(f"--turn-detection: unknown mode {mode!r}; choose from {list(TURN_DETECTION)}")
    plan = Plan(levels=[int(x) for x in (args.sessions or "1").split(",")], turns=args.turns or 0, barge="none",
                ablation_turns=0, variants=[], chunk_ms=args.chunk_ms, gap_s=args.gap_s, turn_timeout=args.turn_timeout,
                barge_delay_s=0.0, warmup=not args.no_warmup, transcription=True, pace=args.pace)
    plan.max_output_tokens = args.max_output_tokens  # type: ignore[attr-defined]
    result = asyncio.run(run_turn_taking(args, plan, modes))
    out_json = Path(args.out)
    report.write_json(result, out_json)
    md = turn_taking_markdown(result)
    out_json.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out_json} and {out_json.with_suffix('.md')} in {result['wall_s']:.0f} s")
    return 0


def stage_level_command(args: Any) -> int:
    """``python -m latency_bench turns --stage-level [--held-out] [--room-noise] [--thinker-cue] [--score-from-silero]``:
    score the set and print the rates the eagerness table rests on, for four rules: Smart Turn alone, with the
    words (text only: the rule before Whisper's last-word probability), with the words and that probability, and
    with the second look too (what the stage runs); then, for what the stage runs, per eagerness: the complete
    utterances' end silence (p50 / p95 / max, and those the words held past the unsure silence) and the share of
    hesitant utterances split. Writes that JSON (``--out``; default ``results/turn_set_stage[_held_out].json``).
    ``--held-out``: the items written after the rule was fitted (``turn_set.HELD_OUT``) instead of the set;
    ``--room-noise``: with light white noise under the audio (``turn_set.with_room_noise``), silences included;
    ``--thinker-cue``: also the thinker's end-of-turn probability on the same transcripts;
    ``--score-from-silero``: the score point counted from Silero's frames (the rule before 2026-12-03)."""
    from omni_rt.stages.asr import turn_rule as tdm
    from omni_rt.testing.turn_scores import pct, distributions, load_scorers, rates, score_set, thinker_end_of_turn
    from omni_rt.testing.turn_set import HELD_OUT, ITEMS, spoken_set, with_room_noise

    t0 = time.perf_counter()
    spoken = spoken_set(held_out=args.held_out)
    scores = score_set(with_room_noise(spoken) if args.room_noise else spoken, *load_scorers(),
                       score_from_sound_end=not args.score_from_silero)
    wall = time.perf_counter() - t0
    print(f"{len(scores)} pauses scored in {wall:.0f} s")
    dist = distributions(scores)
    print(json.dumps(dist, indent=1))
    for eagerness in ("low", "medium", "high"):
        for name, words, confidence, second in (("audio only   ", False, False, False), ("audio+text   ", True, False, False),
                                                ("audio+words  ", True, True, False), ("+second look ", True, True, True)):
            r = rates(scores, eagerness, words, confidence, second)
            print(f"{eagerness:6} {name}: false end hesitant {r['false_end_hesitant']}, complete {r['false_end_complete']}; "
                  f"ended sure {r['ended_sure']}/{r['endings']} (complete {r['ended_sure_complete']}/{r['endings_complete']}, "
                  f"+{r['ended_second_look_complete']} at {tdm.SECOND_LOOK_MS} ms), end silence {r['end_silence_ms']}")
            if words and eagerness == "medium":
                print("   cut:", r["cut"])
    stage: dict[str, Any] = {}
    for eagerness in ("low", "medium", "high", "auto"):
        r = rates(scores, eagerness)
        h, e = r["false_end_hesitant"], r["end_silence_complete_ms"]
        r["hesitant_split_rate"] = round(h[0] / h[1], 3) if h[1] else None
        stage[eagerness] = r
        print(f"{eagerness:6} (the stage's rule): hesitant split {h[0]}/{h[1]}, complete cut mid-way {r['false_end_complete']}, "
              f"complete end silence p50 {e['p50']} / p95 {e['p95']} / max {e['max']} ms; held past the unsure silence: "
              f"{r['waited_complete']}")
    set_name = "held_out" if args.held_out else "tuning"
    result = {"started_at": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": report.machine_info(),
              "config": {"command": "python -m latency_bench " + " ".join(shlex.quote(a) for a in (args.argv or [])),
                         "set": set_name, "items": len(HELD_OUT if args.held_out else ITEMS), "clips": len(spoken),
                         "room_noise": args.room_noise, "score_from_silero": args.score_from_silero},
              "pauses": len(scores), "score_s": round(wall, 1), "distributions": dist, "eagerness": stage}
    if args.thinker_cue:  # the third cue, measured: does P(end of turn | transcript) separate them?
        ends = [s for s in scores if s.final]
        hes = [s for s in scores if s.hesitation]
        p_end, p_hes = thinker_end_of_turn([s.text for s in ends]), thinker_end_of_turn([s.text for s in hes])
        print(f"thinker P(<|im_end|>): complete endings p5/p50/p95 {pct(p_end, 5):.3f}/{pct(p_end, 50):.3f}/"
              f"{pct(p_end, 95):.3f}; hesitation pauses {pct(p_hes, 5):.3f}/{pct(p_hes, 50):.3f}/{pct(p_hes, 95):.3f}")
    out = Path(args.out)
    if out == report.RESULTS_DIR / "turn_taking.json":  # the live run's default: the stage level has its own file
        out = report.RESULTS_DIR / f"turn_set_stage{'_held_out' if args.held_out else ''}{'_room_noise' if args.room_noise else ''}.json"
    report.write_json(result, out)
    print(f"wrote {out}")
    return 0
