"""The bench's Realtime client over ``/v1/realtime``: one ``BenchSession`` per simulated user, a ``Mic`` that streams
24 kHz PCM16 at its real-time instants (speech when there is some, silence otherwise), and the event timing of
every turn (``Turn``, ``Resp``) reduced to a record by ``turn_record``.

Scenarios on a session: ``ask`` (a question, wait for its answer), ``ask_hesitant`` (a sentence with mid-way
pauses: an answer started at a pause is not the turn's answer), ``barge`` (talk over a long answer: times
``speech_started`` -> the last audio delta of the cancelled answer), and ``rest`` (the pause before the next
question, optionally after the answer has played on a simulated player)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from latency_bench.corpus import SERVER_VAD, SR, Utterance
from omni_rt.testing.playback import playback, simulate_playback

if TYPE_CHECKING:
    from latency_bench.sweep import Plan

log = logging.getLogger("latency_bench")


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
                # (more often with the backchannel filter: speech over an answer is decided before speech_started)
                rec["failure"] = "the whole answer was sent before the barge-in's speech_started"
                rec["no_sample"] = True
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
        end = playback(turn.resp.deltas)[2] if plan.pace == "playback" and turn.resp is not None else None
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
