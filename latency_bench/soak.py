"""Soak benchmark: heavy + bystander + dropper sessions against a real server, on each thinker engine in one
command, then one long session — does the server stay fair, answer every turn, and give its memory back?

    python -m latency_bench soak --quick          # both engines: 4 sessions x 3 turns, a 12-turn long session
    python -m latency_bench soak                  # both engines: 8 sessions x 6 turns, a 100-turn long session
    python -m latency_bench soak --engines llama.cpp            # one engine only (llama.cpp, torch)
    python -m latency_bench soak --url ws://127.0.0.1:8000 --pid 1234   # a running server

Per engine (``llama.cpp`` = the CPU preset, ``torch`` = ``latency_bench/presets/torch.yaml``) a fresh server runs:
1. a ``short`` solo baseline on the idle server (after an unrecorded warm-up: one turn of each class at once);
2. the mix, session classes assigned round-robin by index:
   * ``long``    — each turn a ~300-word user text item (the heavy user of issues #12 and #26);
   * ``short``   — each turn a short question (the bystander whose first audio must stay near its solo value);
   * ``dropper`` — a short question, then the socket is closed at the first audio delta (a client vanishing
     mid-answer); the next turn opens a new session;
3. ``marathon`` — one session of many turns of ~400 words (issue #27: from turn 19 every answer failed before
   the history had a token budget); it must end with 0 failed turns.
Turns are text (``conversation.item.create`` + ``response.create``), so the figures isolate the thinker,
talker and session layer; the ASR's commit fairness has its own regression test (tests/unit/stages/test_asr_fairness.py).

TTFA here = ``response.create`` sent -> first ``response.output_audio.delta`` received (client clock); TTFT =
-> first transcript delta (the thinker's first token as the client sees it). The bystander ratio is the
``short`` class's p50 under load over its solo p50 — both measured in the same run, on the same server, so
the ratio is fair even on a shared machine (absolute numbers are noisy; compare within one run). Reported:
TTFA/TTFT p50/p95 per class, failures (error events, timeouts, responses not completed), the RSS of the
server and its children (llama-server) sampled every second over the run, open file descriptors, and
``/debug/state`` after the run (cached prefixes of closed sessions must be 0; the history trims).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latency_bench.procstat import rss_mb, tree
from latency_bench.server_proc import PRESETS_DIR, Server

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SHORT = ["What is the capital of France?", "How many legs does a spider have?", "Who wrote Romeo and Juliet?",
         "Which planet is closest to the sun?", "What color is the sky?", "How many days are in a week?"]
_FILLER = ("I have been thinking about my garden this spring and the tomatoes the beans the roses and the small "
           "apple tree near the fence that my grandmother planted many years ago when she first moved here ").split()
CLASSES = ("long", "short", "dropper")
ENGINES = {"llama.cpp": "cpu", "torch": str(PRESETS_DIR / "torch.yaml")}  # engine -> preset it is served by


def long_text(turn: int, words: int = 300) -> str:
    body = " ".join(_FILLER[(i + turn) % len(_FILLER)] for i in range(words))
    return f"{body}. So, in one sentence, what should I plant next to the apple tree? (turn {turn})"


@dataclass
class TurnResult:
    cls: str
    session: int
    turn: int
    ttfa_s: float | None = None
    ttft_s: float | None = None
    status: str = "pending"  # completed | dropped | failed | timeout
    detail: str = ""
    input_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass
class Stats:
    turns: list[TurnResult] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


async def _connect(url: str):
    from websockets.asyncio.client import connect

    ws = await connect(f"{url}/v1/realtime?model=gpt-realtime", max_size=None, open_timeout=60,
                       ping_interval=None, compression=None)
    first = json.loads(await asyncio.wait_for(ws.recv(), 30))
    if first.get("type") != "session.created":
        raise RuntimeError(f"expected session.created, got {first.get('type')}")
    await ws.send(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["audio"],
        "audio": {"input": {"turn_detection": None}, "output": {"format": {"type": "audio/pcm", "rate": 24000}}}}}))
    return ws


async def _turn(ws, text: str, res: TurnResult, stats: Stats, drop: bool, timeout: float) -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create"}))
    deadline = t0 + timeout
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            res.status = "timeout"
            await _cancel(ws)
            return
        try:
            ev = json.loads(await asyncio.wait_for(ws.recv(), left))
        except (asyncio.TimeoutError, TimeoutError):
            continue
        kind = ev.get("type")
        if kind == "response.output_audio_transcript.delta" and res.ttft_s is None:
            res.ttft_s = time.perf_counter() - t0
        if kind == "response.output_audio.delta" and res.ttfa_s is None:
            res.ttfa_s = time.perf_counter() - t0
            if drop:
                res.status = "dropped"
                return
        elif kind == "error":
            stats.errors.append({"class": res.cls, "turn": res.turn, **(ev.get("error") or {})})
        elif kind == "response.done":
            status = (ev.get("response") or {}).get("status")
            res.status = "completed" if status == "completed" else "failed"
            details = (ev.get("response") or {}).get("status_details")
            res.detail = "" if status == "completed" else json.dumps(details)[:200]
            usage = (ev.get("response") or {}).get("usage") or {}
            res.input_tokens = usage.get("input_tokens")
            res.cached_tokens = (usage.get("input_token_details") or {}).get("cached_tokens")
            return


async def _cancel(ws, wait_s: float = 30.0) -> None:
    """A timed-out turn is cancelled and drained, so its late audio is not taken for the next turn's."""
    await ws.send(json.dumps({"type": "response.cancel"}))
    end = time.perf_counter() + wait_s
    while time.perf_counter() < end:
        try:
            ev = json.loads(await asyncio.wait_for(ws.recv(), end - time.perf_counter()))
        except (asyncio.TimeoutError, TimeoutError):
            return
        if ev.get("type") == "response.done":
            return


async def _session(url: str, idx: int, cls: str, turns: int, stats: Stats, timeout: float, t_stop: float) -> None:
    ws = None
    try:
        for turn in range(turns):
            if time.perf_counter() > t_stop:
                return
            res = TurnResult(cls, idx, turn)
            stats.turns.append(res)
            try:
                if ws is None:
                    ws = await _connect(url)
                if cls == "marathon":
                    text = long_text(turn, words=400)
                elif cls == "long":
                    text = long_text(turn + 10 * idx)
                else:
                    text = SHORT[(turn + idx) % len(SHORT)]
                await _turn(ws, text, res, stats, drop=cls == "dropper", timeout=timeout)
            except (asyncio.TimeoutError, TimeoutError):
                res.status = "timeout"
            except Exception as exc:  # a refused or broken connection is a failure of this turn
                res.status, res.detail = "failed", f"{type(exc).__name__}: {exc}"[:200]
                ws = None
            if cls == "dropper" and ws is not None:
                await ws.close()  # vanishes mid-answer; the next turn is a new session
                ws = None
            await asyncio.sleep(0.3 if cls != "marathon" else 0.05)
    finally:
        if ws is not None:
            await ws.close()


def _proc(pid: int | None) -> dict[str, Any]:
    """RSS of the server process and of it with its children; its open file descriptors (Linux ``/proc``)."""
    if pid is None:
        return {}
    try:
        total = 0.0
        for p in tree(pid):
            with contextlib.suppress(OSError, StopIteration, ValueError):
                total += rss_mb(p)
        return {"rss_mb": round(rss_mb(pid), 1), "rss_tree_mb": round(total, 1), "open_fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, StopIteration, ValueError):
        return {}


async def _sample_rss(pid: int | None, out: list[float], period_s: float = 1.0) -> None:
    """RSS (server + children, MB) every ``period_s`` until cancelled."""
    while pid is not None:
        if (mb := _proc(pid).get("rss_tree_mb")) is not None:
            out.append(mb)
        await asyncio.sleep(period_s)


def _debug_state(http_url: str) -> dict[str, Any]:
    import httpx

    try:
        return httpx.get(f"{http_url}/debug/state", timeout=10).json()
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _ms(xs: list[float], q: float) -> int | None:
    return round(_pct(xs, q) * 1000) if xs else None


def summarize(stats: Stats, solo: list[TurnResult]) -> dict[str, Any]:
    solo_ttfa = [t.ttfa_s for t in solo if t.ttfa_s is not None]
    solo_ttft = [t.ttft_s for t in solo if t.ttft_s is not None]
    out: dict[str, Any] = {"solo_short_ttfa_p50_ms": _ms(solo_ttfa, 0.5), "solo_short_ttft_p50_ms": _ms(solo_ttft, 0.5)}
    for cls in (*CLASSES, "marathon"):
        rows = [t for t in stats.turns if t.cls == cls]
        ttfa = [t.ttfa_s for t in rows if t.ttfa_s is not None]
        ttft = [t.ttft_s for t in rows if t.ttft_s is not None]
        ok = "dropped" if cls == "dropper" else "completed"
        out[cls] = {
            "turns": len(rows),
            "ok": sum(t.status == ok for t in rows),
            "failures": [f"s{t.session}t{t.turn}:{t.status}{(' ' + t.detail) if t.detail else ''}"
                         for t in rows if t.status != ok],
            "ttfa_p50_ms": _ms(ttfa, 0.5), "ttfa_p95_ms": _ms(ttfa, 0.95),
            "ttft_p50_ms": _ms(ttft, 0.5), "ttft_p95_ms": _ms(ttft, 0.95),
        }
        if cls in ("long", "marathon"):
            out[cls]["input_tokens_max"] = max((t.input_tokens or 0 for t in rows), default=0)
            out[cls]["turns_with_cached_prefix"] = sum(1 for t in rows if (t.cached_tokens or 0) > 0)
    for key, metric in (("bystander_ratio_p50", "ttfa"), ("bystander_ttft_ratio_p50", "ttft")):
        base, loaded = out[f"solo_short_{metric}_p50_ms"], out["short"][f"{metric}_p50_ms"]
        out[key] = round(loaded / base, 2) if base and loaded else None
    return out


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"soak [{result['engine']}]: {result['sessions']} sessions x {result['turns']} turns in {result['wall_s']} s, "
             f"then a {result['marathon_turns']}-turn long session in {result['marathon_wall_s']} s "
             f"({result['when']}; shared machine: noisy)",
             f"{'class':8} {'turns':>5} {'ok':>4} {'fail':>4} {'TTFT p50':>9} {'TTFA p50':>9} {'TTFA p95':>9}"]
    for cls in (*CLASSES, "marathon"):
        c = s[cls]
        lines.append(f"{cls:8} {c['turns']:5d} {c['ok']:4d} {len(c['failures']):4d} {str(c['ttft_p50_ms']) + ' ms':>9} "
                     f"{str(c['ttfa_p50_ms']) + ' ms':>9} {str(c['ttfa_p95_ms']) + ' ms':>9}")
    lines.append(f"short solo TTFT p50 {s['solo_short_ttft_p50_ms']} ms, TTFA p50 {s['solo_short_ttfa_p50_ms']} ms; "
                 f"bystander/solo p50: TTFT {s['bystander_ttft_ratio_p50']}x, TTFA {s['bystander_ratio_p50']}x")
    for cls in ("long", "marathon"):
        lines.append(f"{cls}: prompt at most {s[cls].get('input_tokens_max')} tokens; "
                     f"{s[cls].get('turns_with_cached_prefix')} of {s[cls]['turns']} turns reused a cached prefix")
    a, b = result["server_start"], result["server_end"]
    rss = result["rss_samples_mb"]
    lines.append(f"server+children RSS {a.get('rss_tree_mb')} -> {b.get('rss_tree_mb')} MB (drift {_rss_drift(result)}) "
                 f"(sampled {min(rss) if rss else None}..{max(rss) if rss else None} MB over {len(rss)} s); "
                 f"open FDs {a.get('open_fds')} -> {b.get('open_fds')}")
    st = result.get("debug_state_end") or {}
    mem = st.get("memory") or {}
    lines.append(f"server RSS after the first session {a.get('rss_mb')} MB, after every session closed {b.get('rss_mb')} MB "
                 f"(goal: within 50 MB); idle releases {mem.get('releases')}, the last returned "
                 f"{(mem.get('last') or {}).get('returned_mb')} MB")
    cache = st.get("cache") or {}
    lines.append(f"/debug/state after: total={st.get('total')} sessions={st.get('sessions')} "
                 f"cache={json.dumps(cache or 'not exposed')[:600]}")
    errs = result["error_codes"]
    if errs:
        lines.append(f"error events: {errs}")
    return "\n".join(lines)


async def run_engine(args: Any, engine: str) -> dict[str, Any]:
    """One engine: a fresh server (or ``--url``), the solo baseline, the mix, then the long session."""
    sessions, turns = (4, 3) if args.quick else (8, 6)
    sessions, turns = args.sessions or sessions, args.turns or turns
    marathon_turns = args.marathon_turns if args.marathon_turns is not None else (12 if args.quick else 100)
    server = None
    if args.url:
        url, http_url, pid = args.url, args.url.replace("ws", "http", 1), args.pid
    else:
        log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="soak-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        server = Server(ENGINES[engine], f"soak-{engine}", log_dir, max_sessions=max(16, 2 * sessions)).start()
        url, http_url, pid = server.ws_url, server.http_url, server.proc.pid
    rss: list[float] = []
    sampler = asyncio.create_task(_sample_rss(pid, rss))
    try:
        stats, warm, solo = Stats(), Stats(), Stats()
        # unrecorded warm-up: one turn of every class at once, so the buffers the run's shapes need once (Piper's
        # and the engine's arenas for a long answer, a thread's malloc arena) are in place before RSS is judged;
        # without it the first mix added 30-50 MB to the Python server that a second mix on the same server
        # never added again (+2 MB)
        await asyncio.gather(*(_session(url, 90 + i, cls, 1, warm, args.turn_timeout, float("inf"))
                               for i, cls in enumerate(CLASSES)))
        await _session(url, 98, "short", 3, solo, args.turn_timeout, float("inf"))
        await asyncio.sleep(1.0)
        start = _proc(pid)
        warm_samples = len(rss)  # RSS is judged from here (after the warm-up loaded what it loads once)
        t0 = time.perf_counter()
        t_stop = t0 + args.max_s
        await asyncio.gather(*(
            _session(url, i, args.classes[i % len(args.classes)], turns, stats, args.turn_timeout, t_stop)
            for i in range(sessions)
        ))
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        if marathon_turns:
            await _session(url, 50, "marathon", marathon_turns, stats, args.turn_timeout, float("inf"))
        marathon_wall = time.perf_counter() - t1
        await asyncio.sleep(3.0)  # let closed sessions be reaped before the end figures
        end = _proc(pid)
        codes: dict[str, int] = {}
        for e in stats.errors:
            codes[str(e.get("code"))] = codes.get(str(e.get("code")), 0) + 1
        return {
            "when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "engine": engine if not args.url else args.url, "preset": ENGINES[engine] if not args.url else args.url,
            "sessions": sessions, "turns": turns, "quick": bool(args.quick), "wall_s": round(wall, 1),
            "marathon_turns": marathon_turns, "marathon_wall_s": round(marathon_wall, 1),
            "summary": summarize(stats, solo.turns),
            "server_start": start, "server_end": end, "rss_samples_mb": rss[warm_samples:],
            "rss_warmup_samples_mb": rss[:warm_samples],
            "debug_state_end": _debug_state(http_url),
            "error_codes": codes,
            "turn_records": [t.__dict__ for t in stats.turns],
        }
    finally:
        sampler.cancel()
        if server is not None:
            server.stop()


def _rss_drift(result: dict[str, Any]) -> float | None:
    """Server + children RSS once every session has closed, minus before the mix: what the run left behind.
    The spread during the run is the live working set (each session's KV up to its budget, the prefix cache);
    the drift is what a leak, or memory never handed back, would show."""
    a, b = result["server_start"].get("rss_tree_mb"), result["server_end"].get("rss_tree_mb")
    return round(b - a, 1) if a is not None and b is not None else None


def verdict(result: dict[str, Any]) -> str:
    """One line per engine: the figures the issues hold (bystander <= 2x solo, RSS flat, 0 failed long turns)."""
    s, rss = result["summary"], result["rss_samples_mb"]
    spread = round(max(rss) - min(rss), 1) if rss else None
    return (f"{result['engine']:9} bystander/solo TTFT {s['bystander_ttft_ratio_p50']}x TTFA {s['bystander_ratio_p50']}x; "
            f"RSS over the run {min(rss) if rss else None}..{max(rss) if rss else None} MB (spread {spread}), "
            f"after it {_rss_drift(result)} MB from its start; long session {s['marathon']['ok']}/{s['marathon']['turns']} answered, "
            f"{len(s['marathon']['failures'])} failed; mix failures "
            f"{sum(len(s[c]['failures']) for c in CLASSES)}")


async def run(args: Any) -> dict[str, Any]:
    engines = ["remote"] if args.url else args.engines
    results = {}
    for engine in engines:
        results[engine] = await run_engine(args, engine)
        print(table(results[engine]), flush=True)
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="4 sessions x 3 turns and a 12-turn long session per engine")
    p.add_argument("--engines", default="llama.cpp,torch", type=lambda v: [e for e in v.split(",") if e],
                   help=f"comma-separated, of {', '.join(ENGINES)} (default both), or LABEL=PRESET_PATH (a variant)")
    p.add_argument("--marathon-turns", type=int, default=None, help="turns of the long session (default 100, 12 quick)")
    p.add_argument("--sessions", type=int, default=None)
    p.add_argument("--classes", default=",".join(CLASSES), type=lambda v: [c for c in v.split(",") if c],
                   help=f"session classes of the mix, assigned round-robin (default {','.join(CLASSES)}); "
                        "e.g. --classes long --sessions 10 --turns 100: ten heavy sessions for the memory figure")
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--url", default=None, help="ws://HOST:PORT of a running server")
    p.add_argument("--pid", type=int, default=None, help="that server's pid, for RSS and FDs")
    p.add_argument("--turn-timeout", type=float, default=90.0)
    p.add_argument("--max-s", type=float, default=None,
                   help="stop starting turns after this long (default 120 quick, 480)")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=None, help="JSON path (default latency_bench/results/soak[-quick].json)")


def command(args: argparse.Namespace) -> int:
    for e in args.engines:
        if "=" in e:
            label, path = e.split("=", 1)
            ENGINES[label] = path
    args.engines = [e.split("=", 1)[0] for e in args.engines]
    if bad := [c for c in args.classes if c not in CLASSES]:
        raise SystemExit(f"python -m latency_bench soak: error: unknown class(es) {bad}; choose from {list(CLASSES)}")
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"python -m latency_bench soak: error: unknown engine(s) {unknown}; choose from {list(ENGINES)}")
    if args.max_s is None:
        args.max_s = 120.0 if args.quick else 480.0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = asyncio.run(run(args))
    out = Path(args.out or RESULTS_DIR / ("soak-quick.json" if args.quick else "soak.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for r in result.values():
        print(verdict(r))
    print(f"JSON: {out}")
    return 0
