"""A voice agent's tool call, timed: first audio after the question, dead air while the tool runs, and the time to
the answer that uses the tool's result, with the spoken preamble on and off, at 1 and 4 concurrent sessions.

    python -m latency_bench tools                    # CPU preset, levels 1,4, 3 turns per session and mode
    python -m latency_bench tools --url http://127.0.0.1:8000 --sessions 1 --tool-s 3

Each turn is a raw-protocol client: a typed question ("Where is my order N?") with ``tool_choice: required`` on
a ``get_order_status`` tool, then ``response.create`` (the end of the question: t0). The client starts its tool
when the call's arguments are done and it "runs" ``--tool-s`` seconds; the output and the next
``response.create`` go out when both the tool and the calling response are done.

* first audio — t0 -> the first ``response.output_audio.delta`` of any response (the preamble, or with it off
  the answer after the tool).
* dead air    — the silence a listener hears between the question and the answer: playback of each response
  starts at its first delta and runs in real time; the silence is t0 -> first sound plus the gap from the end
  of the preamble's playback to the answer's first delta.
* answer      — t0 -> the first audio of the answer after the tool's output; ``uses result``: its transcript
  names what the tool returned.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from latency_bench.bench_command import run_bench
from latency_bench.server_proc import Server

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "tools.md"
ORDER = {"type": "function", "name": "get_order_status", "description": "The delivery status of a customer's order.",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}
BYTES_PER_S = 24000 * 2  # the session's output: 24 kHz PCM16
MAX_EVENTS_PER_TURN = 20000


async def _until(ws: Any, etype: str, seen: list[tuple[float, dict[str, Any]]]) -> None:
    for _ in range(MAX_EVENTS_PER_TURN):
        event = json.loads(await ws.recv())
        seen.append((time.perf_counter(), event))
        if event["type"] == "error":
            raise RuntimeError(f"server error: {event['error']}")
        if event["type"] == etype:
            return
    raise RuntimeError(f"no {etype} within {MAX_EVENTS_PER_TURN} events")


def _audio(seen: list[tuple[float, dict[str, Any]]], rid: str) -> tuple[float | None, float]:
    """(arrival of the response's first audio delta, its audio seconds)."""
    deltas = [(t, e) for t, e in seen if e["type"] == "response.output_audio.delta" and e["response_id"] == rid]
    if not deltas:
        return None, 0.0
    return deltas[0][0], sum(len(base64.b64decode(e["delta"])) for _, e in deltas) / BYTES_PER_S


async def one_turn(ws_url: str, n: int, preamble: bool, tool_s: float) -> dict[str, Any]:
    import websockets

    async with websockets.connect(f"{ws_url}/v1/realtime", max_size=None, open_timeout=60) as ws:
        seen: list[tuple[float, dict[str, Any]]] = []
        await _until(ws, "session.created", seen)
        instructions = "You are a helpful voice assistant. Answer in one short sentence." + ("" if preamble else " No tool preamble.")
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": instructions, "tools": [ORDER], "tool_choice": "required"}}))
        await _until(ws, "session.updated", seen)
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"Where is my order {40 + n}?"}]}}))
        await _until(ws, "conversation.item.done", seen)
        seen.clear()
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "response.create"}))
        await _until(ws, "response.done", seen)
        first = seen[-1][1]["response"]
        call = next((o for o in first["output"] if o["type"] == "function_call"), None)
        if call is None:
            raise RuntimeError(f"no call: {first['output']}")
        called = next(t for t, e in seen if e["type"] == "response.function_call_arguments.done")
        await asyncio.sleep(max(0.0, called + tool_s - time.perf_counter()))  # the tool runs from its call
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"], "output": "shipped, arrives on Tuesday"}}))
        await _until(ws, "conversation.item.done", seen)
        await ws.send(json.dumps({"type": "response.create", "response": {"tool_choice": "none"}}))
        await _until(ws, "response.done", seen)
        answer = seen[-1][1]["response"]
    pre_at, pre_s = _audio(seen, first["id"])
    ans_at, _ = _audio(seen, answer["id"])
    spoken = "".join(e["delta"] for _, e in seen if e["type"] == "response.output_audio_transcript.delta"
                     and e["response_id"] == answer["id"]).lower()
    first_sound = pre_at if pre_at is not None else ans_at
    dead = None
    if ans_at is not None:
        dead = (first_sound - t0) + (max(0.0, ans_at - (pre_at + pre_s)) if pre_at is not None else 0.0)
    ms = lambda x: round(x * 1000, 1) if x is not None else None  # noqa: E731
    return {"preamble": preamble, "first_audio_ms": ms(first_sound - t0 if first_sound else None),
            "call_ms": ms(called - t0), "preamble_audio_ms": ms(pre_s), "dead_air_ms": ms(dead),
            "answer_ms": ms(ans_at - t0 if ans_at else None), "uses_result": any(w in spoken for w in ("tuesday", "shipped"))}


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"turns": len(recs), "uses_result": sum(r["uses_result"] for r in recs)}
    for key in ("first_audio_ms", "call_ms", "dead_air_ms", "answer_ms"):
        vals = sorted(r[key] for r in recs if r[key] is not None)
        if vals:
            out[key] = {"p50": round(statistics.median(vals), 1), "max": vals[-1]}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = None
    ws_url = "ws" + args.url.rstrip("/")[4:] if args.url else ""
    if not args.url:
        server = Server(args.preset, "tools", Path(args.log_dir or tempfile.mkdtemp())).start()
        ws_url = server.ws_url
    result: dict[str, Any] = {"preset": args.preset, "tool_s": args.tool_s, "load_1m_start": round(os.getloadavg()[0], 2),
                              "levels": {}}
    try:
        await one_turn(ws_url, 0, True, 0.0)  # warm-up
        for n in args.sessions:
            level: dict[str, Any] = {}
            for preamble in (True, False):
                recs: list[dict[str, Any]] = []
                for t in range(args.turns):
                    recs += await asyncio.wait_for(asyncio.gather(*(one_turn(ws_url, t * n + i, preamble, args.tool_s)
                                                                    for i in range(n))), args.turn_timeout)
                level["preamble" if preamble else "no_preamble"] = {**summarize(recs), "records": recs}
            result["levels"][str(n)] = level
    finally:
        if server is not None:
            server.stop()
    result["load_1m_end"] = round(os.getloadavg()[0], 2)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Tool of {result['tool_s']} s, preset `{result['preset']}`, load {result['load_1m_start']} -> {result['load_1m_end']}.", "",
             "| sessions | preamble | first audio p50 / max (ms) | dead air p50 / max (ms) | answer p50 / max (ms) | answers using the result |",
             "|---|---|---|---|---|---|"]
    for n, level in result["levels"].items():
        for mode, s in level.items():
            cell = lambda k: f"{s[k]['p50']:.0f} / {s[k]['max']:.0f}" if k in s else "-"  # noqa: E731
            lines.append(f"| {n} | {'on' if mode == 'preamble' else 'off'} | {cell('first_audio_ms')} | {cell('dead_air_ms')} | "
                         f"{cell('answer_ms')} | {s['uses_result']}/{s['turns']} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu")
    p.add_argument("--url", default=None, help="http://HOST:PORT of a running server")
    p.add_argument("--sessions", default="1,4")
    p.add_argument("--turns", type=int, default=3, help="tool turns per session and mode (preamble on, off)")
    p.add_argument("--tool-s", type=float, default=3.0, help="how long the client's tool runs")
    p.add_argument("--turn-timeout", type=float, default=180.0)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=str(RESULTS_DIR / "tools.json"))


def command(args: argparse.Namespace) -> int:
    return run_bench(args, run, markdown)
