"""Realtime latency benchmark: real speech, paced in real time, over N concurrent ``/v1/realtime`` sessions.

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

Servers are started here (``omni-rt serve --preset PATH``), one per pipeline variant, sequentially; ``--url``
loads a server that is already running instead (no ablations then). ``/metrics`` histograms are scraped before
and after each concurrency level for the server-side view.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as _dt
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latency_bench import procstat, report

log = logging.getLogger("latency_bench")

SR = 24000
ROOT = Path(__file__).resolve().parents[1]
PRESETS_DIR = Path(__file__).resolve().parent / "presets"

# Short factual questions; a few invite a two-sentence answer, as a voice assistant gets.
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "Who wrote Romeo and Juliet?",
    "Which planet is closest to the sun?",
    "How do plants make their food?",
]
SEMANTIC_VAD = {"type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}
SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
              "create_response": True, "interrupt_response": True}
TURN_DETECTION = {"server_vad": SERVER_VAD, "semantic_vad": SEMANTIC_VAD}
LONG_QUESTION = "Tell me a long story about a dragon who lived in the mountains and loved to read books."
INTERRUPT = "Wait, stop. What is two plus two?"

# name -> (description, YAML written to latency_bench/presets/ for the cpu base, extra `omni-rt serve` flags)
VARIANTS: dict[str, tuple[str, str | None, list[str]]] = {
    "streaming": ("the preset as is", None, []),
    "naive": ("naive cascade, each stage waits for the whole previous output, ASR after the turn ends", "naive.yaml",
              ["--no-speculative"]),
    "no_held": ("no answer started in the end-of-turn silence (serve --no-speculative)", None, ["--no-speculative"]),
    "no_async": ("async decode lookahead off", "no_async.yaml", []),
    "no_prefix": ("per-session prefix reuse off", "no_prefix.yaml", []),
    "windowed": ("thinker batching window 50 ms even when idle", "windowed.yaml", []),
    "torch": ("the fp32 PyTorch thinker instead of llama.cpp", "torch.yaml", []),
    "arrival_talker": ("the talker speaks clauses in arrival order, not earliest-due first (matters with several "
                       "sessions: run it with --preset latency_bench/presets/arrival_talker.yaml --sessions 4,8)",
                       "arrival_talker.yaml", []),
}
QUICK_VARIANTS = ["streaming", "naive", "no_held", "windowed"]
WINDOW_MS = 50.0


# ============================================================================================ speech corpus
@dataclass
class Utterance:
    text: str
    pcm: bytes  # PCM16 LE mono 24 kHz
    speech_end: int  # index just past the last speech sample
    speech_start: int = 0  # index of the first speech sample
    pauses: tuple[int, ...] = ()  # hesitant utterances: index where each mid-sentence silence starts

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / SR


def speech_bounds(audio: np.ndarray, frame: int = 240, rel: float = 0.05) -> tuple[int, int]:
    """(start of the first, end of the last) 10 ms frame whose RMS is above ``rel`` x the loudest frame's."""
    n = len(audio) // frame
    if n == 0:
        return 0, len(audio)
    rms = np.sqrt((audio[: n * frame].reshape(n, frame).astype(np.float64) ** 2).mean(axis=1))
    loud = np.nonzero(rms > rel * rms.max())[0]
    return (int(loud[0] * frame), int((loud[-1] + 1) * frame)) if len(loud) else (0, len(audio))


def synthesize_corpus(texts: list[str]) -> dict[str, Utterance]:
    from omni_rt.audio.pcm import float_to_pcm16, resample
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS()
    out: dict[str, Utterance] = {}
    for text in texts:
        audio = resample(tts.synthesize(text).astype(np.float32), tts.sample_rate, SR)
        start, end = speech_bounds(audio)
        out[text] = Utterance(text, float_to_pcm16(audio), end, start)
    return out


def turn_set_utterances(variant: str = "plain") -> tuple[list[Utterance], list[Utterance]]:
    """The labelled end-of-turn set (``latency_bench.turn_set``) in one voice, as 24 kHz utterances: (complete, hesitant).
    Each ends at its last word (the mic streams silence after it, as a live one does)."""
    from omni_rt.audio.pcm import float_to_pcm16, resample

    from latency_bench.turn_set import LEAD_MS, SR as SET_SR, spoken_set

    complete: list[Utterance] = []
    hesitant: list[Utterance] = []
    k = SR / SET_SR
    for sp in spoken_set((variant,)):
        audio = resample(sp.audio[: sp.speech_end], SET_SR, SR).astype(np.float32)
        utt = Utterance(sp.item.text, float_to_pcm16(audio), audio.size, int(SR * LEAD_MS / 1000),
                        tuple(int(a * k) for a, _ in sp.pauses))
        (complete if sp.item.kind == "complete" else hesitant).append(utt)
    return complete, hesitant


def stage_level_turn_rates(silence_duration_ms: int) -> dict[str, Any]:
    """The set scored at the stage level (no server): per mode, the false end-of-turn rates and the end silence
    the verdict picks, and Smart Turn's score distributions (``latency_bench.turn_scores``)."""
    from latency_bench import turn_scores as ts
    from latency_bench.turn_set import spoken_set

    t0 = time.perf_counter()
    scores = ts.score_set(spoken_set(), *ts.load_scorers())
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


# ============================================================================================ client
@dataclass
class Resp:
    id: str
    t_created: float
    t_first_text: float | None = None
    t_first_audio: float | None = None
    deltas: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples)
    t_done: float | None = None
    status: str | None = None
    ttfa_server_ms: float | None = None
    text: str = ""


@dataclass
class Turn:
    kind: str  # ask | barge_target | interrupt
    question: str
    session: int
    index: int
    t_speech_start_sent: float | None = None
    t_speech_end_sent: float | None = None
    t_speech_started: float | None = None
    t_speech_stopped: float | None = None
    speech_stopped_count: int = 0
    t_stops: list[float] = field(default_factory=list)  # arrival of every speech_stopped while this turn is current
    t_transcript: float | None = None
    transcript: str | None = None
    resp: Resp | None = None
    responses: int = 0
    t_barge: float | None = None  # barge_target: speech_started of the interrupting question
    t_interrupt_sent: float | None = None  # barge_target: first speech sample of the interruption sent
    errors: list[str] = field(default_factory=list)
    failure: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    first_audio: asyncio.Event = field(default_factory=asyncio.Event)


def _playback(deltas: list[tuple[float, int]], prebuffer_ms: float = 0.0) -> tuple[int, float, float | None]:
    """A 24 kHz player that starts ``prebuffer_ms`` after the first delta: (underruns, total gap ms, when it has
    played the last sample; None without audio)."""
    count, gap = 0, 0.0
    play_end: float | None = None
    for t, n in deltas:
        d = n / SR
        if play_end is None:
            play_end = t + prebuffer_ms / 1000.0 + d
        elif t > play_end + 1e-3:
            count += 1
            gap += t - play_end
            play_end = t + d
        else:
            play_end += d
    return count, gap * 1000.0, play_end


def simulate_playback(deltas: list[tuple[float, int]], prebuffer_ms: float = 0.0) -> tuple[int, float]:
    """Underruns of a 24 kHz player that starts ``prebuffer_ms`` after the first delta: (count, total gap ms)."""
    count, gap, _ = _playback(deltas, prebuffer_ms)
    return count, gap


def turn_record(t: Turn) -> dict[str, Any]:
    r = t.resp
    ms = lambda a, b: round((a - b) * 1000.0, 1) if a is not None and b is not None else None  # noqa: E731
    rec: dict[str, Any] = {
        "kind": t.kind, "session": t.session, "index": t.index, "question": t.question, "transcript": t.transcript,
        "speech_stopped_events": t.speech_stopped_count, "responses": t.responses, "errors": t.errors,
        "failure": t.failure,
    }
    if r is not None:
        rec.update({
            "response_id": r.id, "status": r.status, "answer": r.text,
            "ttfa_ms": ms(r.t_first_audio, t.t_speech_stopped),
            "ttfa_server_ms": r.ttfa_server_ms,
            "v2v_ms": ms(r.t_first_audio, t.t_speech_end_sent),
            "first_token_ms": ms(r.t_first_text, t.t_speech_stopped),
            "token_to_audio_ms": ms(r.t_first_audio, r.t_first_text),
            "answer_audio_s": round(sum(n for _, n in r.deltas) / SR, 2),
            "answer_stream_s": round(r.deltas[-1][0] - r.deltas[0][0], 2) if r.deltas else None,
        })
        if t.kind != "barge_target":
            count, gap = simulate_playback(r.deltas)
            rec["underrun_count"], rec["underrun_ms"] = count, round(gap, 1)
        else:
            cancelled = r.status == "cancelled" and t.t_barge is not None
            rec["barge_cancelled"] = cancelled
            if not cancelled and rec["failure"] is None and r.status == "completed":
                # a fast thinker and talker can send the whole answer before the interruption's speech_started:
                # nothing is left to cancel (a client truncates what it has not played), so it is no barge-in sample
                rec["failure"] = "the whole answer was sent before the barge-in's speech_started"
            if cancelled:
                last = max((ts for ts, _ in r.deltas), default=None)
                rec["barge_stop_ms"] = max(0.0, ms(last, t.t_barge) or 0.0) if last is not None else 0.0
                rec["barge_done_ms"] = ms(r.t_done, t.t_barge)
                if t.t_interrupt_sent is not None and last is not None:
                    rec["barge_from_speech_ms"] = round(max(0.0, last - t.t_interrupt_sent) * 1000.0, 1)
    rec["endpoint_ms"] = ms(t.t_speech_stopped, t.t_speech_end_sent)
    # a turn ended while the speaker was still mid-sentence (a speech_stopped before the last word was sent)
    rec["false_stops"] = sum(1 for ts in t.t_stops if t.t_speech_end_sent is not None and ts < t.t_speech_end_sent)
    rec["asr_final_ms"] = ms(t.t_transcript, t.t_speech_stopped)
    # a turn counts when its answer started; the barge-in target counts when it was actually interrupted
    if t.kind == "barge_target":
        rec["ok"] = bool(rec.get("barge_cancelled"))
    else:
        rec["ok"] = r is not None and r.status == "completed" and r.t_first_audio is not None and t.failure is None
    return rec


class Mic:
    """Streams PCM16 at real time in fixed chunks: queued speech when there is some, silence otherwise."""

    def __init__(self, ws: Any, chunk_ms: int) -> None:
        self.ws = ws
        self.chunk = int(SR * chunk_ms / 1000)
        self.chunk_s = self.chunk / SR
        self.queue: list[list[Any]] = []  # [utterance, position, end_future, start_future]
        self.silence_msg = json.dumps({"type": "input_audio_buffer.append",
                                       "audio": base64.b64encode(bytes(2 * self.chunk)).decode()})
        self.late_s_max = 0.0
        self.closed = False

    def speak(self, utt: Utterance) -> tuple[asyncio.Future, asyncio.Future]:
        loop = asyncio.get_running_loop()
        start, end = loop.create_future(), loop.create_future()
        self.queue.append([utt, 0, end, start])
        return start, end

    def _next(self) -> tuple[str, list[asyncio.Future]]:
        if not self.queue:
            return self.silence_msg, []
        item = self.queue[0]
        utt, pos, end_fut, start_fut = item
        total = len(utt.pcm) // 2
        take = min(self.chunk, total - pos)
        data = utt.pcm[2 * pos: 2 * (pos + take)]
        if take < self.chunk:
            data += bytes(2 * (self.chunk - take))
        fired = []
        if pos <= utt.speech_start < pos + take:
            fired.append(start_fut)
        if pos < utt.speech_end <= pos + take:
            fired.append(end_fut)
        item[1] = pos + take
        if item[1] >= total:
            self.queue.pop(0)
            fired += [f for f in (start_fut, end_fut) if not f.done() and f not in fired]
        return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()}), fired

    async def run(self) -> None:
        t0 = time.perf_counter()
        k = 0
        while not self.closed:
            k += 1
            delay = t0 + k * self.chunk_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.late_s_max = max(self.late_s_max, -delay)
            msg, fired = self._next()
            await self.ws.send(msg)
            now = time.perf_counter()
            for fut in fired:
                if not fut.done():
                    fut.set_result(now)


class BenchSession:
    def __init__(self, url: str, idx: int, chunk_ms: int, transcription: bool = True, max_output_tokens: int | None = None,
                 turn_detection: dict[str, Any] | None = None) -> None:
        self.url = url
        self.turn_detection = dict(turn_detection or SERVER_VAD)
        self.max_output_tokens = max_output_tokens
        self.idx = idx
        self.chunk_ms = chunk_ms
        self.transcription = transcription
        self.turns: list[Turn] = []
        self.current: Turn | None = None
        self.barge_watch: Turn | None = None
        self.by_resp: dict[str, Turn] = {}
        self.errors: list[dict[str, Any]] = []
        self.unexpected: list[str] = []
        self.ws: Any = None
        self.mic: Mic | None = None
        self.tasks: list[asyncio.Task] = []
        self.trace: list[tuple] | None = [] if os.environ.get("LATENCY_BENCH_TRACE") else None

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(f"{self.url}/v1/realtime?model=gpt-realtime", max_size=None, open_timeout=60,
                                ping_interval=None, compression=None)
        first = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
        if first.get("type") != "session.created":
            raise RuntimeError(f"expected session.created, got {first}")
        audio_in: dict[str, Any] = {
            "format": {"type": "audio/pcm", "rate": SR},
            "turn_detection": self.turn_detection,
        }
        if self.transcription:
            audio_in["transcription"] = {"model": "whisper-1"}
        session: dict[str, Any] = {"type": "realtime", "output_modalities": ["audio"],
                                   "audio": {"input": audio_in, "output": {"format": {"type": "audio/pcm", "rate": SR}}}}
        if self.max_output_tokens:
            session["max_output_tokens"] = self.max_output_tokens
        await self.ws.send(json.dumps({"type": "session.update", "session": session}))
        while True:
            ev = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if ev.get("type") == "session.updated":
                break
            if ev.get("type") == "error":
                raise RuntimeError(f"session.update failed: {ev}")
        self.mic = Mic(self.ws, self.chunk_ms)
        self.tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self.mic.run())]

    async def close(self) -> None:
        if self.mic is not None:
            self.mic.closed = True
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), 5)

    # ---- events ------------------------------------------------------------------------------------
    async def _receive(self) -> None:
        async for raw in self.ws:
            t = time.perf_counter()
            try:
                self._on_event(json.loads(raw), t)
            except Exception as exc:  # noqa: BLE001 - a bench bug must not kill the session silently
                log.exception("session %d: bad event handling: %s", self.idx, exc)

    def _on_event(self, ev: dict[str, Any], t: float) -> None:
        et = ev.get("type", "")
        if self.trace is not None:
            self.trace.append((round(t, 4), et, ev.get("response_id") or (ev.get("response") or {}).get("id"),
                               ev.get("delta", "") if et.endswith("transcript.delta") else None))
        turn = self.current
        if et == "input_audio_buffer.speech_started":
            if self.barge_watch is not None and self.barge_watch.t_barge is None:
                self.barge_watch.t_barge = t
                self.barge_watch = None
            if turn is not None and turn.t_speech_started is None:
                turn.t_speech_started = t
        elif et == "input_audio_buffer.speech_stopped":
            if turn is not None:
                turn.t_speech_stopped = t
                turn.speech_stopped_count += 1
                turn.t_stops.append(t)
        elif et == "conversation.item.input_audio_transcription.completed":
            if turn is not None:
                turn.t_transcript = t
                turn.transcript = ev.get("transcript", "")
                if not turn.transcript.strip() and turn.resp is None:
                    turn.failure = "empty transcript (no response)"
                    turn.done.set()
        elif et == "response.created":
            rid = ev["response"]["id"]
            if turn is None:
                self.unexpected.append(rid)
                return
            turn.resp = Resp(rid, t)
            turn.responses += 1
            self.by_resp[rid] = turn
        elif et in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            r = self._resp(ev)
            if r is not None:
                if r.t_first_text is None and ev.get("delta"):
                    r.t_first_text = t
                r.text += ev.get("delta", "")
        elif et == "response.output_audio.delta":
            r = self._resp(ev)
            if r is not None:
                n = len(base64.b64decode(ev["delta"])) // 2
                r.deltas.append((t, n))
                if r.t_first_audio is None:
                    r.t_first_audio = t
                    owner = self.by_resp[r.id]
                    owner.first_audio.set()
        elif et == "response.done":
            resp = ev.get("response", {})
            owner = self.by_resp.get(resp.get("id"))
            if owner is None or owner.resp is None or owner.resp.id != resp.get("id"):
                return
            r = owner.resp
            r.t_done, r.status = t, resp.get("status")
            meta = resp.get("metadata") or {}
            if meta.get("ttfa_ms") is not None:
                r.ttfa_server_ms = float(meta["ttfa_ms"])
            owner.first_audio.set()
            owner.done.set()
        elif et == "error":
            err = ev.get("error", {})
            self.errors.append(err)
            if turn is not None:
                turn.errors.append(f"{err.get('code')}: {err.get('message')}")

    def _resp(self, ev: dict[str, Any]) -> Resp | None:
        owner = self.by_resp.get(ev.get("response_id", ""))
        if owner is None or owner.resp is None or owner.resp.id != ev.get("response_id"):
            return None
        return owner.resp

    # ---- scenario ----------------------------------------------------------------------------------
    def _new_turn(self, kind: str, utt: Utterance) -> Turn:
        turn = Turn(kind, utt.text, self.idx, len(self.turns))
        self.turns.append(turn)
        self.current = turn
        return turn

    async def _speak(self, turn: Turn, utt: Utterance) -> None:
        start, end = self.mic.speak(utt)
        turn.t_speech_start_sent = await start
        turn.t_speech_end_sent = await end
        if self.trace is not None:
            self.trace.append((round(turn.t_speech_end_sent, 4), "client.speech_end_sent", None, utt.text))

    async def _wait(self, turn: Turn, timeout: float) -> None:
        try:
            await asyncio.wait_for(turn.done.wait(), timeout)
        except TimeoutError:
            turn.failure = turn.failure or f"no response.done within {timeout:.0f} s"

    async def ask(self, utt: Utterance, timeout: float) -> Turn:
        turn = self._new_turn("ask", utt)
        await self._speak(turn, utt)
        await self._wait(turn, timeout)
        return turn

    @staticmethod
    async def rest(turn: Turn, plan: "Plan") -> None:
        """The pause before the session speaks again: ``plan.gap_s``, after the answer has played (a simulated
        24 kHz player) when ``plan.pace`` is "playback"."""
        end = _playback(turn.resp.deltas)[2] if plan.pace == "playback" and turn.resp is not None else None
        await asyncio.sleep(max(0.0, (end or 0.0) - time.perf_counter()) + plan.gap_s)

    async def ask_hesitant(self, utt: Utterance, timeout: float) -> Turn:
        """A hesitant utterance: an answer cut off by a false end of turn does not count as the turn's answer."""
        turn = self._new_turn("hesitant", utt)
        await self._speak(turn, utt)
        if turn.resp is not None and turn.resp.t_created < (turn.t_speech_end_sent or 0.0):
            turn.done.clear()  # that answer started at a pause; wait for the one to the whole sentence
            if turn.resp.t_done is not None and turn.resp.status != "cancelled":
                turn.done.set()
        await self._wait(turn, timeout)
        return turn

    async def barge(self, long_utt: Utterance, interrupt: Utterance, timeout: float, delay_s: float) -> None:
        target = self._new_turn("barge_target", long_utt)
        await self._speak(target, long_utt)
        try:
            await asyncio.wait_for(target.first_audio.wait(), timeout)
        except TimeoutError:
            target.failure = "no first audio to interrupt"
            return
        if target.done.is_set():
            target.failure = "answer finished before the barge-in"
        await asyncio.sleep(delay_s)
        self.barge_watch = target
        turn = self._new_turn("interrupt", interrupt)
        start, end = self.mic.speak(interrupt)
        turn.t_speech_start_sent = target.t_interrupt_sent = await start
        turn.t_speech_end_sent = await end
        await self._wait(target, timeout)
        await self._wait(turn, timeout)
        self.barge_watch = None


# ============================================================================================ servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``omni-rt serve`` subprocess of ``preset`` on a free port; ``thinker``: its ``--thinker MODEL``."""

    def __init__(self, preset: str, name: str, log_dir: Path, max_sessions: int = 64, extra: list[str] | None = None,
                 thinker: str | None = None) -> None:
        self.preset, self.name, self.log_dir, self.max_sessions = preset, name, log_dir, max_sessions
        self.extra = list(extra or []) + (["--thinker", thinker] if thinker else [])
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.startup_s = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "omni_rt.cli", "serve", "--port", str(self.port), "--preset", self.preset,
                "--max-sessions", str(self.max_sessions), "--log-level", "warning", *self.extra]

    def start(self, timeout: float = 300.0) -> "Server":
        import httpx

        self.port = free_port()
        self.log_path = self.log_dir / f"server-{self.name}-{self.port}.log"
        logf = open(self.log_path, "w")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server '{self.name}' exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.http_url}/healthz", timeout=1).status_code == 200:
                    self.startup_s = round(time.perf_counter() - t0, 1)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server '{self.name}' not healthy after {timeout:.0f} s:\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def bench_server(args: Any, preset: str, name: str, log_dir: Path, extra: list[str] | None = None, **kw: Any) -> Server:
    """A server this run starts: ``preset`` with the run's ``--thinker`` (not started yet)."""
    return Server(preset, name, log_dir, extra=extra, thinker=getattr(args, "thinker", None), **kw)


def measured_thinker(args: Any) -> str:
    """The thinker the run measures, one line for its report (checks ``--thinker`` before any server starts)."""
    if getattr(args, "url", None):
        return f"the running server's at {args.url}"
    from omni_rt.inventory import thinker_line

    return thinker_line(args.preset, getattr(args, "thinker", None), os.environ.get("OMNI_RT_THINKER_API_KEY"))


def derive_variant(data: dict[str, Any], variant: str) -> dict[str, Any]:
    """Apply an ablation to a preset dict (for base presets without a YAML in latency_bench/presets/)."""
    data = json.loads(json.dumps(data))
    stages = {st["name"]: st for st in data["stages"]}
    entry = stages[data["entry"]]
    entry.setdefault("args", {})
    if variant == "naive":
        for st in data["stages"]:
            if st.get("can_accept_stream_before_payload"):
                st["can_accept_stream_before_payload"] = False
        if "asr" in stages:
            asr_args = stages["asr"].setdefault("args", {})
            asr_args["speculative_after_ms"] = 100000
            asr_args.pop("speculative_alone_after_ms", None)
    elif variant == "no_async":
        entry["args"]["async_decode"] = False
    elif variant == "no_prefix":
        entry["args"]["prefix_reuse"] = False
    elif variant == "torch":
        entry["args"]["backend"] = "torch"
    elif variant == "arrival_talker":
        stages["talker"].setdefault("args", {})["clause_order"] = "arrival"
    elif variant == "windowed":
        if entry["factory"] != "omni_rt.engine.factory:create_ar_scheduler":
            raise ValueError(f"windowed: the entry stage factory is {entry['factory']}, not create_ar_scheduler")
        entry["args"].update(batch_wait_ms=WINDOW_MS, batch_wait_when_idle=True)
    elif variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {list(VARIANTS)}")
    data["name"] = f"{data.get('name', 'preset')}-{variant}"
    return data


def dump_preset(data: dict[str, Any], header: str) -> str:
    import yaml

    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=200)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def variant_preset(base: str, variant: str, tmp: Path) -> str:
    """Path of the preset a variant server runs: the base preset with the ablation applied. For the ``cpu`` base
    it is (re)written to ``latency_bench/presets/<variant>.yaml`` (so the file there is exactly what ran and
    follows ``models/cpu.yaml``); other bases go to a temp dir."""
    if VARIANTS[variant][1] is None:
        return base  # the base pipeline (streaming), or a server flag rather than a pipeline change
    import yaml

    from omni_rt.presets import PRESET_DIR

    path = Path(base) if Path(base).suffix else PRESET_DIR / f"{base}.yaml"
    data = derive_variant(yaml.safe_load(path.read_text()), variant)
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    header = (f"Ablation '{variant}' of {rel}: {VARIANTS[variant][0]}.\n"
              f"Generated by latency_bench (realtime_bench.derive_variant) from {rel}; serve it with\n"
              f"omni-rt serve {' '.join(VARIANTS[variant][2] + [''])}--preset THIS_FILE")
    text = dump_preset(data, header)
    fname = VARIANTS[variant][1]
    out = PRESETS_DIR / fname if base == "cpu" and fname else tmp / f"{path.stem}-{variant}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return str(out)


# ============================================================================================ metrics scrape
def scrape(http_url: str) -> dict[str, list[tuple[float, float]]]:
    """{series: cumulative buckets} for the TTFA, per-stage latency and per-stage queue/compute histograms of
    /metrics (the last as ``stage_time:<stage>:<queue|compute>``)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{http_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in ("omni_rt_ttfa_seconds", "omni_rt_stage_latency_seconds", "omni_rt_stage_time_seconds"):
            continue
        for s in fam.samples:
            if not s.name.endswith("_bucket"):
                continue
            if fam.name == "omni_rt_stage_time_seconds":
                key = f"stage_time:{s.labels.get('stage', '?')}:{s.labels.get('kind', '?')}"
            else:
                key = "ttfa" if fam.name == "omni_rt_ttfa_seconds" else s.labels.get("stage", "?")
            out.setdefault(key, []).append((float(s.labels["le"]), float(s.value)))
    return out


def stage_samples(http_url: str, after: int = 0) -> dict[str, Any] | None:
    """The server's exact per-turn stage times numbered above ``after`` (``/debug/stage_times``); None when
    the server has no such endpoint (then the table falls back to the histograms)."""
    import httpx

    try:
        r = httpx.get(f"{http_url}/debug/stage_times", params={"after": after}, timeout=10)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def histogram_delta(before: dict, after: dict) -> dict[str, dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {}
    for key, buckets in after.items():
        prev = dict(before.get(key, []))
        diff = [(le, c - prev.get(le, 0.0)) for le, c in buckets]
        total = max((c for _, c in diff), default=0.0)
        if total <= 0:
            continue
        qs = {p: report.histogram_quantile(diff, p) for p in (0.5, 0.95)}
        res[key] = {"count": int(total), **{f"p{int(p * 100)}_ms": (None if v is None else round(v * 1000, 1)) for p, v in qs.items()}}
    return res


# ============================================================================================ runs
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


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def _run_scripts(sessions: list[BenchSession], script) -> tuple[list[dict[str, Any]], dict[str, Any]]:
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

    return await _run_scripts(sessions, script)


def level_result(records: list[dict[str, Any]], info: dict[str, Any], hist: dict[str, Any] | None = None,
                 samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ok = [r for r in records if r["ok"] and r["kind"] != "barge_target"]
    barge = [r for r in records if r["kind"] == "barge_target" and r["ok"]]
    summary = report.summarize_turns(ok)
    summary.update(report.summarize_turns(barge, report.BARGE_METRICS))
    return {"turns_ok": len(ok), "turns_failed": sum(1 for r in records if not r["ok"]), "summary": summary,
            "server_histograms": hist or {}, "stage_times": stage_times(hist or {}, samples), "client": info, "turns": records}


def stage_times(hist: dict[str, dict[str, Any]], samples: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """{stage: {queue|compute: {count, p50_ms, p95_ms, max_ms, exact}}} for one level (server-side, per answered
    turn: each stage's first output after the last word). From the exact ``samples`` of /debug/stage_times when
    given, else out of the histogram deltas (quantiles interpolated inside buckets)."""
    out: dict[str, dict[str, Any]] = {}
    if samples is not None:
        values: dict[tuple[str, str], list[float]] = {}
        for row in samples:
            values.setdefault((row["stage"], row["kind"]), []).append(float(row["ms"]))
        for (stage, kind), v in values.items():
            out.setdefault(stage, {})[kind] = {"count": len(v), "p50_ms": round(report.percentile(v, 50), 1),
                                               "p95_ms": round(report.percentile(v, 95), 1), "max_ms": round(max(v), 1),
                                               "exact": True}
        return out
    for key, v in hist.items():
        if key.startswith("stage_time:"):
            _, stage, kind = key.split(":", 2)
            out.setdefault(stage, {})[kind] = {**v, "exact": False}
    return out


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
        _log(f"sweep: {n} session(s) x {plan.turns} turn(s){' + barge-in' if barge else ''}")
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
        _log(f"  {n} session(s): {res['turns_ok']} ok, {res['turns_failed']} failed; TTFA p50 {s['p50']} p95 {s['p95']} ms")
        out[str(n)] = res
    return out


async def run_variant(url: str, corpus: dict[str, Utterance], plan: Plan, name: str) -> dict[str, Any]:
    _log(f"ablation '{name}': 1 session x {plan.ablation_turns} turn(s)")
    records, info = await run_sessions(url, 1, corpus, plan, plan.ablation_turns, set())
    res = level_result(records, info)
    res["description"] = VARIANTS[name][0]
    s = res["summary"]["ttfa_ms"]
    _log(f"  {name}: {res['turns_ok']} ok; TTFA p50 {s['p50']} ms")
    return res


def per_question_ratios(variant: dict[str, Any]) -> dict[str, float]:
    """TTFA ratio per question: the variant's turns vs the paired streaming turns (medians per question)."""
    paired = (variant.get("paired_streaming") or {}).get("turns") or []

    def by_q(turns: list[dict[str, Any]]) -> dict[str, float]:
        acc: dict[str, list[float]] = {}
        for r in turns:
            if r.get("ok") and r.get("ttfa_ms") is not None:
                acc.setdefault(r["question"], []).append(r["ttfa_ms"])
        return {q: report.percentile(v, 50) for q, v in acc.items()}

    mine, base = by_q(variant.get("turns", [])), by_q(paired)
    return {q: round(mine[q] / base[q], 2) for q in mine if base.get(q)}


def ratios_and_checks(result: dict[str, Any], preset: str) -> None:
    ab = result.get("ablation", {})
    ratios: list[dict[str, Any]] = []
    base = ab.get("streaming", {}).get("summary", {})

    def p50(v: dict, key: str = "ttfa_ms") -> float | None:
        return (v.get("summary", {}).get(key) or {}).get("p50")

    pooled_b = base.get("ttfa_ms", {}).get("p50")
    for name, v in ab.items():
        b = p50(v["paired_streaming"]) if v.get("paired_streaming") else pooled_b
        if name == "streaming" or not b or p50(v) is None:
            continue
        x = p50(v)
        entry = {"variant": name, "ttfa_p50_ms": x, "streaming_ttfa_p50_ms": b, "ratio": round(x / b, 2), "diff_ms": round(x - b, 1)}
        text = f"{name}/streaming TTFA p50: {x:.0f}/{b:.0f} ms = {x / b:.2f}x ({x - b:+.0f} ms)"
        if v.get("paired_streaming"):
            text += " (streaming measured right after)"
        if name == "windowed":
            text += f"; window {WINDOW_MS:.0f} ms"
        pairs = per_question_ratios(v)
        if pairs:
            entry["by_question"] = pairs
            if name == "naive":
                text += "; by question: " + ", ".join(f"{q!r} {x:.1f}x" for q, x in pairs.items())
        if name == "no_prefix":
            later = lambda v: report.summarize(r.get("first_token_ms") for r in v["turns"] if r["ok"] and r["index"] >= 1)["p50"]  # noqa: E731
            lp, lb = later(v), later(ab["streaming"])  # pooled baseline: per-turn records are kept there
            if lp and lb:
                entry["first_token_later_turns"] = {"no_prefix": lp, "streaming": lb}
                text += f"; thinker 1st token on turns >= 2: {lp:.0f} vs {lb:.0f} ms"
        entry["text"] = text
        ratios.append(entry)
    result["ratios"] = ratios

    checks: list[dict[str, Any]] = []
    sweep = result.get("sweep", {})
    gpu = "gpu" in Path(preset).stem
    one = sweep.get("1", {}).get("summary", {})
    add = lambda name, value, goal, ok: checks.append({"name": name, "value": value, "goal": goal,  # noqa: E731
                                                       "status": "n/a" if ok is None else ("PASS" if ok else "FAIL")})
    ttfa1 = one.get("ttfa_ms", {}).get("p50")
    goal_ttfa = 150 if gpu else 400
    add("TTFA p50 at 1 session", f"{ttfa1} ms", f"<= {goal_ttfa} ms", None if ttfa1 is None else ttfa1 <= goal_ttfa)
    if not gpu:
        v2v = one.get("v2v_ms", {}).get("p50")
        add("V2V p50 at 1 session", f"{v2v} ms", "<= 900 ms", None if v2v is None else v2v <= 900)
    else:
        top = sweep.get("16", {}).get("summary", {}).get("ttfa_ms", {}).get("p95")
        add("TTFA p95 at 16 sessions", f"{top} ms", "<= 300 ms", None if top is None else top <= 300)
        under = sum((lv["summary"].get("underrun_count", {}).get("max") or 0) for lv in sweep.values())
        add("playback underruns", f"max {under} per answer", "none", under == 0)
    naive = next((r for r in ratios if r["variant"] == "naive"), None)
    add("naive/streaming TTFA", f"{naive['ratio']}x" if naive else "-", ">= 3x", None if naive is None else naive["ratio"] >= 3)
    win = next((r for r in ratios if r["variant"] == "windowed"), None)
    add("windowed - idle-immediate TTFA p50", f"{win['diff_ms']:+.0f} ms" if win else "-",
        f">= +{0.8 * WINDOW_MS:.0f} ms (idle-immediate saves the {WINDOW_MS:.0f} ms window)",
        None if win is None else win["diff_ms"] >= 0.8 * WINDOW_MS)
    barge = [r.get("barge_stop_ms") for lv in sweep.values() for r in lv["turns"] if r.get("barge_cancelled")]
    bs = report.summarize(barge)
    add("barge-in stop (speech_started -> last delta)", f"p50 {bs['p50']} / max {bs['max']} ms (n={bs['n']})", "<= 100 ms",
        None if not bs["n"] else bs["max"] <= 100)
    result["checks"] = checks

    notes = result.setdefault("notes", [])
    m = result["machine"]
    start_load = (m.get("loadavg_start") or [0.0])[0]
    if start_load > 0.5 * (m.get("cpus_usable") or 1):
        notes.append(f"other processes were using the machine when this run started (load average {start_load:.1f} on "
                     f"{m.get('cpus_usable')} CPUs, before any server of the run existed): the numbers are inflated; rerun "
                     "on an idle machine for the real figures")
    late = max((lv.get("client", {}).get("client_late_ms_max") or 0) for lv in list(result.get("sweep", {}).values())
               + list(result.get("ablation", {}).values()))
    if late > 50:
        notes.append(f"the load generator itself ran late (a microphone chunk up to {late:.0f} ms behind its real-time instant)")


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
    if args.url:
        plan.variants = []
    thinker = getattr(args, "thinker", None)
    if thinker and "torch" in plan.variants:  # --thinker sets the engine, so the 'torch' ablation would not be one
        plan.variants.remove("torch")
        _log("variant 'torch' skipped: --thinker chooses the thinker's engine")
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
    _log("synthesizing the spoken questions with Piper")
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
        _log(f"starting server (preset {args.preset})")
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
                _log(f"starting server '{name}' ({preset})")
                try:
                    await asyncio.to_thread(srv.start)
                except RuntimeError as exc:
                    _log(f"variant {name} failed to start: {exc}")
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


def main(args: Any) -> int:
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(run(args))
    out_json = Path(args.out)
    out_png = Path(args.png)
    report.write_json(result, out_json)
    report.plot(result, out_png)
    text = report.text_report(result)
    print(text)
    md = report.markdown_report(result, png_rel=os.path.relpath(out_png, ROOT) if out_png.is_relative_to(ROOT) else str(out_png))
    out_json.with_suffix(".md").write_text(md)
    if args.update_readme:
        report.update_readme(md)
    print(f"\nwrote {out_json}, {out_png}, {out_json.with_suffix('.md')} in {result['wall_s']:.0f} s"
          + (" and README.md '## Benchmarks'" if args.update_readme else ""))
    return 0


# ============================================================================================ turn taking
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

    return await _run_scripts(sessions, script)


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
                   "hesitant_per_session": args.hesitant, "turn_set": "latency_bench/turn_set.py (live: voice 'plain')"},
        "notes": list(args.note or []),
    }
    t_start = time.perf_counter()
    _log("scoring the labelled end-of-turn set at the stage level (all voices)")
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
        _log(f"starting server (preset {args.preset})")
        await asyncio.to_thread(srv.start)
        url = srv.ws_url
    try:
        if plan.warmup:
            await warmup(url, corpus, plan)
        for li, n in enumerate(plan.levels):
            for mode in modes:
                all_c, all_h = plan.turns or len(complete), args.hesitant or len(hesitant)  # default: the whole set
                turns = all_c if n == 1 else max(1, all_c // 3)
                n_h = all_h if n == 1 else max(1, all_h // 4)
                turns, n_h = min(turns, len(complete)), min(n_h, len(hesitant))
                _log(f"{mode}: {n} session(s) x {turns} complete + {n_h} hesitant")
                t0 = time.perf_counter()
                records, info = await run_turn_sessions(url, n, mode, complete, hesitant, plan, turns, n_h, offset=li)
                for r in records:
                    if r["kind"] == "hesitant":
                        r["pauses"] = next(len(u.pauses) for u in hesitant if u.text == r["question"])
                summ = turn_level_summary(records)
                out[mode][str(n)] = {"summary": summ, "client": info, "turns": records, "wall_s": round(time.perf_counter() - t0, 1)}
                c, h = summ["complete"], summ["hesitant"]
                _log(f"  {mode} x{n}: V2V p50 {c['v2v_ms']['p50']} p95 {c['v2v_ms']['p95']} ms ({c['ok']}/{c['turns']} ok); "
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
    """The server_vad vs semantic_vad tables (what README.md's benchmark section shows): the labelled set scored at
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
        lines += [f"On the labelled set (`latency_bench/turn_set.py`, {st['pauses']} pauses in 3 Piper voices), scored at "
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


def main_turn_taking(args: Any) -> int:
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
    out_json = Path(args.out).with_name("turn_taking.json") if Path(args.out).name == "latest.json" else Path(args.out)
    report.write_json(result, out_json)
    md = turn_taking_markdown(result)
    out_json.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out_json} and {out_json.with_suffix('.md')} in {result['wall_s']:.0f} s")
    return 0
