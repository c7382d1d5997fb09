"""Soak benchmark: N sessions x M turns against a real server, mixed long and short turns, some clients
dropping mid-answer — does the server stay fair and give its memory back?

    python -m latency_bench.soak --quick          # 4 sessions x 3 turns (< 3 min on 2 cores)
    python -m latency_bench.soak                  # 8 sessions x 6 turns (< 10 min on 2 cores)
    python -m latency_bench.soak --url ws://127.0.0.1:8000 --pid 1234   # a running server

Session classes (assigned round-robin by index):
* ``long``    — each turn a ~300-word user text item (the heavy user of issue #12);
* ``short``   — each turn a short question (the bystander whose first audio must stay near its solo value);
* ``dropper`` — a short question, then the socket is closed at the first audio delta (a client vanishing
  mid-answer); the next turn opens a new session.
Turns are text (``conversation.item.create`` + ``response.create``), so the figures isolate the thinker,
talker and session layer; the ASR's commit fairness has its own regression test (tests/test_asr_fairness.py).

TTFA here = ``response.create`` sent -> first ``response.output_audio.delta`` received (client clock). A
``short`` solo baseline is measured first on the idle server. Reported: TTFA p50/p95 per class, failures
(error events, timeouts, responses not completed), server RSS and open file descriptors at start and end
(Linux ``/proc``), and ``/debug/state`` after the run (cached prefixes of closed sessions must be 0).
The machine is usually shared: numbers are noisy; compare classes within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latency_bench.realtime_bench import Server

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SHORT = ["What is the capital of France?", "How many legs does a spider have?", "Who wrote Romeo and Juliet?",
         "Which planet is closest to the sun?", "What color is the sky?", "How many days are in a week?"]
_FILLER = ("I have been thinking about my garden this spring and the tomatoes the beans the roses and the small "
           "apple tree near the fence that my grandmother planted many years ago when she first moved here ").split()
CLASSES = ("long", "short", "dropper")


def long_text(turn: int, words: int = 300) -> str:
    body = " ".join(_FILLER[(i + turn) % len(_FILLER)] for i in range(words))
    return f"{body}. So, in one sentence, what should I plant next to the apple tree? (turn {turn})"


@dataclass
class TurnResult:
    cls: str
    session: int
    turn: int
    ttfa_s: float | None = None
    status: str = "pending"  # completed | dropped | failed | timeout
    detail: str = ""


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
                text = long_text(turn + 10 * idx) if cls == "long" else SHORT[(turn + idx) % len(SHORT)]
                await _turn(ws, text, res, stats, drop=cls == "dropper", timeout=timeout)
            except (asyncio.TimeoutError, TimeoutError):
                res.status = "timeout"
            except Exception as exc:  # a refused or broken connection is a failure of this turn
                res.status, res.detail = "failed", f"{type(exc).__name__}: {exc}"[:200]
                ws = None
            if cls == "dropper" and ws is not None:
                await ws.close()  # vanishes mid-answer; the next turn is a new session
                ws = None
            await asyncio.sleep(0.3)
    finally:
        if ws is not None:
            await ws.close()


def _proc(pid: int | None) -> dict[str, Any]:
    if pid is None:
        return {}
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return {"rss_mb": round(rss_kb / 1024, 1), "open_fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, StopIteration, ValueError):
        return {}


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


def summarize(stats: Stats, solo: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"solo_short_ttfa_p50_ms": round(statistics.median(solo) * 1000) if solo else None}
    for cls in CLASSES:
        rows = [t for t in stats.turns if t.cls == cls]
        ttfa = [t.ttfa_s for t in rows if t.ttfa_s is not None]
        ok = "dropped" if cls == "dropper" else "completed"
        out[cls] = {
            "turns": len(rows),
            "ok": sum(t.status == ok for t in rows),
            "failures": [f"s{t.session}t{t.turn}:{t.status}{(' ' + t.detail) if t.detail else ''}"
                         for t in rows if t.status != ok],
            "ttfa_p50_ms": round(_pct(ttfa, 0.5) * 1000) if ttfa else None,
            "ttfa_p95_ms": round(_pct(ttfa, 0.95) * 1000) if ttfa else None,
        }
    base, loaded = out["solo_short_ttfa_p50_ms"], out["short"]["ttfa_p50_ms"]
    out["bystander_ratio_p50"] = round(loaded / base, 2) if base and loaded else None
    return out


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"soak: {result['sessions']} sessions x {result['turns']} turns, {result['wall_s']} s "
             f"({result['when']}; shared machine: noisy)",
             f"{'class':8} {'turns':>5} {'ok':>4} {'fail':>4} {'TTFA p50':>9} {'TTFA p95':>9}"]
    for cls in CLASSES:
        c = s[cls]
        lines.append(f"{cls:8} {c['turns']:5d} {c['ok']:4d} {len(c['failures']):4d} "
                     f"{str(c['ttfa_p50_ms']) + ' ms':>9} {str(c['ttfa_p95_ms']) + ' ms':>9}")
    lines.append(f"short solo TTFA p50 {s['solo_short_ttfa_p50_ms']} ms; "
                 f"bystander p50 ratio {s['bystander_ratio_p50']}x")
    a, b = result["server_start"], result["server_end"]
    lines.append(f"server RSS {a.get('rss_mb')} -> {b.get('rss_mb')} MB; "
                 f"open FDs {a.get('open_fds')} -> {b.get('open_fds')}")
    st = result.get("debug_state_end") or {}
    lines.append(f"/debug/state after: total={st.get('total')} sessions={st.get('sessions')} "
                 f"cache={json.dumps(st.get('cache') or st.get('thinker_cache') or 'not exposed')}")
    errs = result["error_codes"]
    if errs:
        lines.append(f"error events: {errs}")
    return "\n".join(lines)


async def run(args: Any) -> dict[str, Any]:
    sessions, turns = (4, 3) if args.quick else (8, 6)
    sessions, turns = args.sessions or sessions, args.turns or turns
    server = None
    if args.url:
        url, http_url, pid = args.url, args.url.replace("ws", "http", 1), args.pid
    else:
        log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="soak-"))
        server = Server(args.preset, "soak", log_dir, max_sessions=max(16, 2 * sessions)).start()
        url, http_url, pid = server.ws_url, server.http_url, server.proc.pid
    try:
        stats = Stats()
        warm = Stats()
        await _session(url, 99, "short", 1, warm, args.turn_timeout, float("inf"))  # unrecorded warm-up
        solo_stats = Stats()
        await _session(url, 98, "short", 3, solo_stats, args.turn_timeout, float("inf"))
        solo = [t.ttfa_s for t in solo_stats.turns if t.ttfa_s is not None]
        await asyncio.sleep(1.0)
        start = _proc(pid)
        t0 = time.perf_counter()
        t_stop = t0 + args.max_s
        await asyncio.gather(*(
            _session(url, i, CLASSES[i % len(CLASSES)], turns, stats, args.turn_timeout, t_stop)
            for i in range(sessions)
        ))
        wall = time.perf_counter() - t0
        await asyncio.sleep(3.0)  # let closed sessions be reaped before the end figures
        end = _proc(pid)
        codes: dict[str, int] = {}
        for e in stats.errors:
            codes[str(e.get("code"))] = codes.get(str(e.get("code")), 0) + 1
        return {
            "when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "preset": args.preset if not args.url else args.url,
            "sessions": sessions, "turns": turns, "quick": bool(args.quick), "wall_s": round(wall, 1),
            "summary": summarize(stats, solo),
            "server_start": start, "server_end": end,
            "debug_state_end": _debug_state(http_url),
            "error_codes": codes,
            "turn_records": [t.__dict__ for t in stats.turns],
        }
    finally:
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 sessions x 3 turns (< 3 min)")
    p.add_argument("--sessions", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--url", default=None, help="ws://HOST:PORT of a running server")
    p.add_argument("--pid", type=int, default=None, help="that server's pid, for RSS and FDs")
    p.add_argument("--turn-timeout", type=float, default=90.0)
    p.add_argument("--max-s", type=float, default=None,
                   help="stop starting turns after this long (default 120 quick, 480)")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=None, help="JSON path (default latency_bench/results/soak[-quick].json)")
    args = p.parse_args(argv)
    if args.max_s is None:
        args.max_s = 120.0 if args.quick else 480.0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = asyncio.run(run(args))
    out = Path(args.out or RESULTS_DIR / ("soak-quick.json" if args.quick else "soak.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
