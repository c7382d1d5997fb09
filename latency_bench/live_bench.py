"""GPT-Live vs Realtime in one run: first audio after the user's last word on ``/v1/live/sessions`` next to
``/v1/realtime``, at 1 and 4 concurrent sessions, on one server.

    python -m latency_bench live                          # CPU preset, levels 1,4, 2 rounds x 3 questions
    python -m latency_bench live --live-delegation always # the Live side: the preamble of a delegated turn

Both endpoints hear the same Piper questions in real time (40 ms appends, silence streamed between questions, as
Live clients do) with ``semantic_vad`` (the Live session always uses it; the Realtime session is set to it). The
two alternate per round (A B B A ...) so slow drifts of a shared machine fall on both.

* V2V — the client sending the chunk that holds the question's last speech sample -> the arrival of the first
  audio delta holding a 5 ms window louder than -40 dBFS (RMS 0.01): the Live stream's digital zeros between
  answers never count, and the Realtime answer's quiet first samples count as they do on the Live side.
* gapped turns — Live turns whose stream, after the last word, holds more than one loud stretch (separated by
  >= 400 ms of quiet): a second answer to one turn, or an answer whose audio came slower than real time (the
  stream plays zeros meanwhile, which a Realtime client's buffer would hide).
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

import numpy as np
import websockets

from latency_bench.bench_command import run_bench
from latency_bench.corpus import QUESTIONS, SR, Utterance, synthesize_corpus
from latency_bench.report import RESULTS_DIR
from latency_bench.server_proc import Server
from latency_bench.sweep import log_line

CHUNK = SR * 40 // 1000  # samples per append
WINDOW = SR // 200  # 5 ms
LOUD_RMS = 0.01
LISTEN_S = 7.0  # silence streamed after each question: its answer plays within it


def loud_offset(pcm: np.ndarray) -> int | None:
    """Index of the first 5 ms window of ``pcm`` (int16) with RMS above ``LOUD_RMS``, or None."""
    n = len(pcm) // WINDOW
    if not n:
        return None
    x = pcm[: n * WINDOW].astype(np.float32).reshape(n, WINDOW) / 32768.0
    loud = np.nonzero(np.sqrt((x * x).mean(axis=1)) > LOUD_RMS)[0]
    return int(loud[0]) * WINDOW if len(loud) else None


def loud_stretches(pcm: np.ndarray, gap_s: float = 0.4) -> int:
    n = len(pcm) // WINDOW
    if not n:
        return 0
    x = pcm[: n * WINDOW].astype(np.float32).reshape(n, WINDOW) / 32768.0
    loud = np.sqrt((x * x).mean(axis=1)) > LOUD_RMS
    stretches, quiet = 0, 10**9
    for is_loud in loud:
        if is_loud:
            if quiet * WINDOW >= gap_s * SR:
                stretches += 1
            quiet = 0
        else:
            quiet += 1
    return stretches


class Client:
    """One session on either endpoint: streams questions in real time and timestamps loud output."""

    def __init__(self, base: str, live: bool) -> None:
        self.url = f"{base}/v1/live/sessions" if live else f"{base}/v1/realtime"
        self.live = live
        self.audio: list[tuple[float, np.ndarray]] = []  # (arrival, int16 samples) of output deltas
        self.errors: list[dict[str, Any]] = []

    async def _read(self, ws: Any) -> None:
        kind = "session.output_audio.delta" if self.live else "response.output_audio.delta"
        async for raw in ws:
            ev = json.loads(raw)
            if ev["type"] == kind:
                self.audio.append((time.perf_counter(), np.frombuffer(base64.b64decode(ev["delta"]), np.int16)))
            elif ev["type"] == "error":
                self.errors.append(ev["error"])

    async def run(self, utts: list[Utterance]) -> list[dict[str, Any]]:
        recs = []
        async with websockets.connect(self.url, max_size=None, open_timeout=60) as ws:
            reader = asyncio.create_task(self._read(ws))
            if self.live:
                await ws.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
            else:
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                    "input": {"turn_detection": {"type": "semantic_vad"}}}}}))
            await asyncio.sleep(0.5)
            append = "session.input_audio.append" if self.live else "input_audio_buffer.append"
            silence = base64.b64encode(b"\x00" * CHUNK * 2).decode()
            for utt in utts:
                pcm = utt.pcm
                n_chunks = -(-len(pcm) // (CHUNK * 2))
                last_chunk = utt.speech_end // CHUNK
                t_last, start = None, time.perf_counter()
                for i in range(n_chunks + int(LISTEN_S * SR / CHUNK)):
                    data = base64.b64encode(pcm[i * CHUNK * 2:(i + 1) * CHUNK * 2]).decode() if i < n_chunks else silence
                    await ws.send(json.dumps({"type": append, "audio": data}))
                    if i == last_chunk:
                        t_last = time.perf_counter()
                    await asyncio.sleep(max(0.0, start + (i + 1) * 0.04 - time.perf_counter()))
                recs.append(self._record(utt, t_last or start))
            reader.cancel()
        return recs

    def _record(self, utt: Utterance, t_last: float) -> dict[str, Any]:
        after = [(t, a) for t, a in self.audio if t >= t_last]
        v2v = None
        for t, a in after:
            if loud_offset(a) is not None:
                v2v = t - t_last
                break
        rec = {"question": utt.text, "v2v_ms": None if v2v is None else round(1000 * v2v, 1)}
        if self.live:
            rec["answers"] = loud_stretches(np.concatenate([a for _, a in after])) if after else 0
        return rec


async def level(base: str, n: int, live: bool, corpus: dict[str, Utterance], turns: int, offset: int) -> list[dict[str, Any]]:
    qs = [corpus[q] for q in QUESTIONS]
    clients = [Client(base, live) for _ in range(n)]
    results = await asyncio.gather(*[c.run([qs[(offset + i + k) % len(qs)] for k in range(turns)]) for i, c in enumerate(clients)])
    errors = [e for c in clients for e in c.errors]
    if errors:
        log_line(f"errors: {errors[:3]}")
    return [r for rs in results for r in rs]


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    v = sorted(r["v2v_ms"] for r in recs if r["v2v_ms"] is not None)
    out: dict[str, Any] = {"n": len(recs), "answered": len(v)}
    if v:
        out["v2v_ms"] = {"p50": round(statistics.median(v), 1), "p95": round(v[min(len(v) - 1, int(0.95 * len(v)))], 1),
                         "max": round(v[-1], 1)}
    answers = [r["answers"] for r in recs if "answers" in r]
    if answers:
        out["gapped_turns"] = sum(a > 1 for a in answers)
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = ["| sessions | endpoint | answered | V2V p50 / p95 / max (ms) | gapped turns |", "|---|---|---|---|---|"]
    for n, lv in result["levels"].items():
        for ep in ("realtime", "live"):
            s = lv[ep]
            v = s.get("v2v_ms")
            v2v = f"{v['p50']} / {v['p95']} / {v['max']}" if v else "-"
            lines.append(f"| {n} | {ep} | {s['answered']}/{s['n']} | {v2v} | {s.get('gapped_turns', '-')} |")
        lines.append(f"| {n} | live - realtime (p50) | | {lv['v2v_p50_delta_ms']} | |")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    log_line("synthesizing questions with Piper")
    corpus = synthesize_corpus(QUESTIONS)
    server = None
    if args.url:
        base = "ws" + args.url.rstrip("/")[4:]
    else:
        server = Server(args.preset, "live", Path(args.log_dir or tempfile.mkdtemp()),
                        extra=["--live-delegation", args.live_delegation]).start()
        base = server.ws_url
        log_line(f"server up in {server.startup_s} s")
    result: dict[str, Any] = {"preset": args.preset, "live_delegation": args.live_delegation,
                              "load_1m_start": round(os.getloadavg()[0], 2), "levels": {}}
    try:
        await level(base, 1, False, corpus, 1, 0)  # warm-up
        await level(base, 1, True, corpus, 1, 1)
        for n in args.sessions:
            recs: dict[str, list[dict[str, Any]]] = {"realtime": [], "live": []}
            for r in range(args.rounds):
                order = ("realtime", "live") if (r + n) % 2 == 0 else ("live", "realtime")
                for ep in order:
                    log_line(f"{n} session(s), round {r + 1}: {ep}")
                    recs[ep] += await level(base, n, ep == "live", corpus, args.turns, r * args.turns)
            lv = {ep: summarize(v) for ep, v in recs.items()}
            a, b = lv["realtime"].get("v2v_ms"), lv["live"].get("v2v_ms")
            lv["v2v_p50_delta_ms"] = round(b["p50"] - a["p50"], 1) if a and b else None
            lv["turns"] = recs
            result["levels"][str(n)] = lv
    finally:
        if server is not None:
            server.stop()
    result["load_1m_end"] = round(os.getloadavg()[0], 2)
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu")
    p.add_argument("--url", default=None, help="http://HOST:PORT of a running server (its --live-delegation applies)")
    p.add_argument("--sessions", default="1,4")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two endpoints per level")
    p.add_argument("--turns", type=int, default=3, help="questions per session per round")
    p.add_argument("--live-delegation", default="off", choices=["auto", "always", "off"])
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=str(RESULTS_DIR / "live.json"))


def command(args: argparse.Namespace) -> int:
    return run_bench(args, run, markdown)
