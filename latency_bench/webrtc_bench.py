"""WebRTC vs WebSocket in one run: V2V and TTFA per transport at 1 and 4 concurrent sessions, on one server.

    python -m latency_bench webrtc                  # CPU preset, levels 1,4, 2 rounds x 3 turns per session
    python -m latency_bench webrtc --url http://127.0.0.1:8000 --sessions 1

Both transports speak the same Piper questions in real time with server_vad (500 ms) and input transcription.
WebSocket sessions are ``latency_bench.session_driver.BenchSession`` (20 ms appends); WebRTC sessions are the aiortc client of
``omni_rt/testing/webrtc_client.py`` (a 20 ms Opus microphone track). The two alternate per round (A B B A ...) so
slow drifts of a shared machine fall on both.

* V2V  — the client sending the frame that holds the question's last speech sample -> the answer's first sound,
         one definition for both: the first 5 ms louder than -40 dBFS (RMS 0.01) starting to play. WebRTC: in the
         frame coming out of the client's aiortc receiver, decoded on arrival and played from then (Opus and RTP
         counted, no playout buffer: aiortc's default holds 4 frames, a browser's NetEq adapts); WebSocket: playback
         started at the first ``response.output_audio.delta`` with no prebuffer (a real player adds its own; the demo
         page 80 ms). (Before 2026-12-02 the WebSocket side counted the end of the first loud 20 ms frame and WebRTC
         its start, 20 ms in WebRTC's favour; and a 20 ms grid turned Opus's 6.5 ms delay into ~20 ms.)
         Also shown: WebSocket V2V to the first delta (``latency_bench report``'s definition) and WebRTC V2V to
         ``output_audio_buffer.started`` on the data channel (the server handing out the first frame).
* TTFA — ``input_audio_buffer.speech_stopped`` arriving -> the same first sound.
* Opus CPU — encode (the answer) + decode (the microphone) of one stream, measured in-process with aiortc's codecs:
  ms of CPU per second of audio; and the server process's CPU per session while each transport ran.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from latency_bench.bench_command import run_bench
from latency_bench.corpus import QUESTIONS, SERVER_VAD, SR, Utterance, synthesize_corpus
from latency_bench.report import RESULTS_DIR
from latency_bench.server_proc import Server
from latency_bench.session_driver import BenchSession, turn_record
from latency_bench.sweep import Plan, log_line, run_scripts, warmup
from omni_rt.testing.webrtc_client import first_loud

GAP_S = 0.8
ONSET_24K = SR // 200  # 5 ms windows, as omni_rt/testing/webrtc_client.py finds the first sound


class SoundSession(BenchSession):
    """A WebSocket bench session that also finds the answer's first *sound*, as the WebRTC client does: the
    first 5 ms above ``SOUND_RMS`` starting to play, played from the first delta's arrival (no prebuffer)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.sound: dict[str, list[Any]] = {}  # response id -> [t first delta, samples before this delta, t sound]

    def _on_event(self, ev: dict[str, Any], t: float) -> None:
        super()._on_event(ev, t)
        if ev.get("type") != "response.output_audio.delta":
            return
        st = self.sound.setdefault(ev["response_id"], [t, 0, None])
        if st[2] is not None:
            return
        x = np.frombuffer(base64.b64decode(ev["delta"]), "<i2").astype(np.float32) / 32768.0
        i = first_loud(x, ONSET_24K)
        if i is not None:  # when that 5 ms starts to play, as the WebRTC client times it
            st[2] = max(t, st[0] + (st[1] + i) / SR)
            return
        st[1] += len(x)


async def ws_level(url: str, n: int, corpus: dict[str, Utterance], turns: int, offset: int, timeout: float) -> list[dict[str, Any]]:
    sessions = [SoundSession(url, i, 20, True) for i in range(n)]
    await asyncio.gather(*(s.open() for s in sessions))
    stagger = min(1.0, 4.0 / n) if n > 1 else 0.0

    async def script(s: BenchSession) -> None:
        await asyncio.sleep(0.5 + s.idx * stagger)
        for k in range(turns):
            await s.ask(corpus[QUESTIONS[(offset + s.idx + k) % len(QUESTIONS)]], timeout)
            await asyncio.sleep(GAP_S)

    await run_scripts(sessions, script)
    out = []
    for s in sessions:
        for turn in s.turns:
            r = turn_record(turn)
            sound = s.sound.get(r.get("response_id") or "", [None, 0, None])[2]
            ms = lambda a, b: round((a - b) * 1000, 1) if a is not None and b is not None else None  # noqa: E731
            out.append({"transport": "websocket", "ok": r["ok"] and sound is not None, "v2v_ms": ms(sound, turn.t_speech_end_sent),
                        "ttfa_ms": ms(sound, turn.t_speech_stopped), "v2v_first_delta_ms": r.get("v2v_ms"),
                        "endpoint_ms": r.get("endpoint_ms"),
                        "question": r["question"], "answer": r.get("answer")})
    return out


PLAYBACK_ENDS = ("output_audio_buffer.stopped", "output_audio_buffer.cleared")


async def rtc_level(http_url: str, n: int, corpus: dict[str, Utterance], turns: int, offset: int, timeout: float) -> list[dict[str, Any]]:
    from omni_rt.testing.webrtc_client import RealtimeCall

    calls = [RealtimeCall(http_url, decode_on_arrival=True) for _ in range(n)]
    session = {"type": "realtime", "output_modalities": ["audio"],
               "audio": {"input": {"turn_detection": SERVER_VAD, "transcription": {"model": "whisper-1"}}}}
    await asyncio.gather(*(c.connect(session=session, body="json") for c in calls))
    stagger = min(1.0, 4.0 / n) if n > 1 else 0.0
    records: list[dict[str, Any]] = []

    async def script(i: int, c: RealtimeCall) -> None:
        await asyncio.sleep(0.5 + i * stagger)
        for k in range(turns):
            utt = corpus[QUESTIONS[(offset + i + k) % len(QUESTIONS)]]
            audio = np.frombuffer(utt.pcm, "<i2").astype(np.float32) / 32768.0
            mark = len(c.events)
            c.mic.say(audio, SR, speech_end=utt.speech_end)
            rec: dict[str, Any] = {"transport": "webrtc", "ok": False, "question": utt.text}
            try:
                done = await c.next_event("response.done", timeout)
                if not any(e["type"] in PLAYBACK_ENDS for e in c.events[mark:]):  # a short answer may end first
                    await c.next_event(PLAYBACK_ENDS, 30)
            except TimeoutError:
                records.append(rec)
                continue
            await asyncio.sleep(0.3)  # the tail of the jitter buffer
            end = c.mic.speech_end
            new = c.events[mark:]
            stopped = next((e["_t"] for e in new if e["type"] == "input_audio_buffer.speech_stopped"), None)
            started = next((e["_t"] for e in new if e["type"] == "output_audio_buffer.started"), None)
            sound = c.first_sound_after(end) if end is not None else None
            ms = lambda a, b: round((a - b) * 1000, 1) if a is not None and b is not None else None  # noqa: E731
            rec.update(ok=done["response"]["status"] == "completed" and sound is not None, v2v_ms=ms(sound, end),
                       ttfa_ms=ms(sound, stopped), v2v_event_ms=ms(started, end), endpoint_ms=ms(stopped, end),
                       answer=next((e["transcript"] for e in new if e["type"] == "response.output_audio_transcript.done"), None))
            records.append(rec)
            await asyncio.sleep(GAP_S)

    try:
        await asyncio.gather(*(script(i, c) for i, c in enumerate(calls)))
    finally:
        for c in calls:
            if c.call_id:
                await c.hangup()
            await c.close()
    return records


def opus_cpu_ms_per_s(seconds: float = 10.0) -> dict[str, float]:
    """CPU ms per second of audio for one stream's Opus work on the server: decode the mic, encode the answer."""
    import fractions

    from aiortc.codecs import get_decoder, get_encoder
    from aiortc.jitterbuffer import JitterFrame
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters
    from av import AudioFrame

    codec = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2)
    enc, dec = get_encoder(codec), get_decoder(codec)
    rng = np.random.default_rng(0)
    t = np.arange(960 * int(seconds * 50)) / 48000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767 + rng.normal(0, 300, t.size)).astype(np.int16)
    frames = []
    for i in range(0, len(pcm), 960):
        f = AudioFrame(format="s16", layout="mono", samples=960)
        f.planes[0].update(pcm[i:i + 960].tobytes())
        f.sample_rate, f.pts, f.time_base = 48000, i, fractions.Fraction(1, 48000)
        frames.append(f)
    c0 = time.process_time()
    packets = []
    for f in frames:
        payloads, ts = enc.encode(f)
        packets += [(p, ts) for p in payloads]
    c1 = time.process_time()
    for p, ts in packets:
        dec.decode(JitterFrame(data=p, timestamp=ts))
    c2 = time.process_time()
    return {"encode_ms_per_s": round((c1 - c0) * 1000 / seconds, 2), "decode_ms_per_s": round((c2 - c1) * 1000 / seconds, 2),
            "stream_core_pct": round((c2 - c0) * 100 / seconds, 2)}


def process_cpu_s(pid: int | None) -> float | None:
    """user + system CPU seconds of a process so far (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, TypeError):
        return None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if r["ok"]]
    out: dict[str, Any] = {"turns_ok": len(ok), "turns_failed": len(records) - len(ok)}
    for key in ("v2v_ms", "ttfa_ms", "v2v_event_ms", "v2v_first_delta_ms", "endpoint_ms"):
        xs = sorted(r[key] for r in ok if r.get(key) is not None)
        if xs:
            out[key] = {"p50": round(statistics.median(xs), 1), "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1),
                        "n": len(xs)}
    return out


def markdown(result: dict[str, Any]) -> str:
    rows = ["| sessions | transport | turns ok | V2V p50 / p95 ms | TTFA p50 / p95 ms | V2V to the first delta (WS) / to `output_audio_buffer.started` (WebRTC) p50 | server CPU per session |",
            "|---|---|---|---|---|---|---|"]
    for n, level in result["levels"].items():
        for tr in ("websocket", "webrtc"):
            s = level[tr]
            f = lambda k: f"{s[k]['p50']:.0f} / {s[k]['p95']:.0f}" if k in s else "–"  # noqa: E731
            key = "v2v_event_ms" if tr == "webrtc" else "v2v_first_delta_ms"
            ev = f"{s[key]['p50']:.0f}" if key in s else ""
            core = f"{s['server_core_pct_per_session']}% of a core" if "server_core_pct_per_session" in s else ""
            rows.append(f"| {n} | {tr} | {s['turns_ok']}/{s['turns_ok'] + s['turns_failed']} | {f('v2v_ms')} | {f('ttfa_ms')} | {ev} | {core} |")
        d = level.get("v2v_p50_delta_ms")
        if d is not None:
            rows.append(f"| {n} | WebRTC − WebSocket | | {d:+.0f} | | | |")
    o = result["opus"]
    rows.append("")
    rows.append(f"Opus per stream (aiortc, in-process): encode {o['encode_ms_per_s']} + decode {o['decode_ms_per_s']} ms CPU per "
                f"second of audio = {o['stream_core_pct']}% of a core.")
    return "\n".join(rows)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    log_line("synthesizing questions with Piper")
    corpus = synthesize_corpus(QUESTIONS)
    server, pid = None, None
    if args.url:
        http_url = args.url.rstrip("/")
    else:
        server = Server(args.preset, "webrtc", Path(args.log_dir or tempfile.mkdtemp()),  # calls on the loopback
                        extra=["--webrtc-host", "127.0.0.1"]).start()
        http_url = server.http_url
        pid = server.proc.pid
        log_line(f"server up in {server.startup_s} s")
    ws_url = "ws" + http_url[4:]
    result: dict[str, Any] = {"preset": args.preset, "load_1m_start": round(os.getloadavg()[0], 2), "levels": {}}
    try:
        plan = Plan(levels=args.sessions, turns=args.turns, barge="none", ablation_turns=0, variants=[], chunk_ms=20,
                       gap_s=GAP_S, turn_timeout=args.turn_timeout, barge_delay_s=0.3, warmup=True, transcription=True)
        await warmup(ws_url, corpus, plan)
        for n in args.sessions:
            recs: dict[str, list[dict[str, Any]]] = {"websocket": [], "webrtc": []}
            cpu = {"websocket": [0.0, 0.0], "webrtc": [0.0, 0.0]}  # server CPU s, session-seconds
            for r in range(args.rounds):
                order = ("websocket", "webrtc") if (r + n) % 2 == 0 else ("webrtc", "websocket")
                for tr in order:
                    log_line(f"{n} session(s), round {r + 1}: {tr}")
                    c0, w0 = process_cpu_s(pid), time.perf_counter()
                    if tr == "websocket":
                        recs[tr] += await ws_level(ws_url, n, corpus, args.turns, r * args.turns, args.turn_timeout)
                    else:
                        recs[tr] += await rtc_level(http_url, n, corpus, args.turns, r * args.turns, args.turn_timeout)
                    c1 = process_cpu_s(pid)
                    if c0 is not None and c1 is not None:
                        cpu[tr][0] += c1 - c0
                        cpu[tr][1] += n * (time.perf_counter() - w0)
            level = {tr: summarize(v) for tr, v in recs.items()}
            for tr, (cs, ss) in cpu.items():
                if ss:
                    level[tr]["server_core_pct_per_session"] = round(100 * cs / ss, 1)
            a, b = level["websocket"].get("v2v_ms"), level["webrtc"].get("v2v_ms")
            level["v2v_p50_delta_ms"] = round(b["p50"] - a["p50"], 1) if a and b else None
            level["turns"] = recs
            result["levels"][str(n)] = level
    finally:
        if server is not None:
            server.stop()
    result["opus"] = opus_cpu_ms_per_s()
    result["load_1m_end"] = round(os.getloadavg()[0], 2)
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu")
    p.add_argument("--url", default=None, help="http://HOST:PORT of a running server")
    p.add_argument("--sessions", default="1,4")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two transports per level")
    p.add_argument("--turns", type=int, default=3, help="questions per session per round")
    p.add_argument("--turn-timeout", type=float, default=90.0)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=str(RESULTS_DIR / "webrtc.json"))


def command(args: argparse.Namespace) -> int:
    return run_bench(args, run, markdown)
