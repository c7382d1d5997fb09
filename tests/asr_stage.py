"""The real ASR stage (Silero VAD, Whisper tiny.en, Smart Turn) driven through its queues, shared by the unit tests
of turn detection on single utterances and the integration tests over the whole labelled turn set."""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from omni_rt.contracts import payloads as c
from omni_rt.contracts import turn_detection as tdm
from omni_rt.contracts.audio_in import AudioInSettings, OpenAudioIn
from omni_rt.pipeline.messages import IncomingMessage

SR = 16000


@pytest.fixture(scope="module")
def turn_model():
    from omni_rt.backends.turn_model import SmartTurnModel

    return SmartTurnModel()


@pytest.fixture(scope="module")
def asr_stage(turn_model):
    """The real ASR stage scheduler (Silero VAD, Whisper tiny.en, Smart Turn), driven through its queues."""
    from omni_rt.backends.whisper import FasterWhisperASR
    from omni_rt.backends.vad import SileroVadModel
    from omni_rt.stages.asr.stage import AsrWorker

    sched = AsrWorker(FasterWhisperASR(), SileroVadModel(), turn_model=turn_model)
    sched.start()
    yield sched
    sched.stop()


# the stage's typed events (omni_rt.contracts.payloads) as dicts with a short name, to keep the checks terse
EVENT_NAMES = {c.SpeechStarted: "speech_started", c.SpeechStopped: "speech_stopped", c.Committed: "committed",
               c.Cleared: "cleared", c.TranscriptPartial: "transcript.delta", c.TranscriptSpeculative: "transcript.speculative",
               c.SpeculationCancelled: "speculative.cancelled", c.TranscriptFinal: "transcript.final",
               c.TurnScored: "turn.scored", c.TimeoutTriggered: "timeout_triggered",
               c.InterruptionCandidate: "interruption.candidate", c.BackchannelDropped: "backchannel.dropped"}


def as_dict(ev: Any) -> dict[str, Any]:
    return {"type": EVENT_NAMES[type(ev)], **dataclasses.asdict(ev)}


def run_stream(sched: Any, sid: str, td: dict[str, Any] | None, audio: np.ndarray, until: str = "transcript.final",
               realtime: bool = True, settle_s: float = 20.0, hold_at: int | None = None,
               ops: tuple[Any, ...] = (), settled: Callable[[list[dict[str, Any]]], bool] | None = None) -> list[dict[str, Any]]:
    """Open a session, append ``audio`` in 20 ms chunks (at real time), then collect its events up to the last ``until``.

    ``hold_at``: once that many samples are in, hold the audio until the turn model's verdict arrives, as if it
    scored instantly: the decision logic is tested here, its timing on a shared machine in latency_bench.
    ``ops``: session ops sent right after the open (e.g. ``AnswerStarted``: an answer is being heard).
    ``settled``: once the audio is in, stop waiting as soon as it says the events are complete (default: one
    ``until`` per ``speech_stopped``, at least one); ``settle_s`` bounds the wait either way."""
    events: list[dict[str, Any]] = []

    def drain(block_s: float = 0.0) -> None:
        deadline = time.monotonic() + block_s
        while True:
            try:
                msg = sched.outbox.get(timeout=max(0.0, deadline - time.monotonic()) if block_s else 0.0)
            except queue.Empty:
                return
            assert msg.request_id == sid, msg
            if msg.type == "error":
                raise AssertionError(f"stage error: {msg.data}")
            if msg.type == "event":
                events.append(as_dict(msg.data))

    sched.inbox.put(IncomingMessage(sid, "new_request", OpenAudioIn(AudioInSettings(tdm.parse_turn_detection(td), partials=False))))
    for op in ops:
        sched.inbox.put(IncomingMessage(sid, "new_request", op))
    step = SR // 50
    t0 = time.perf_counter()
    for i, start in enumerate(range(0, audio.size, step)):
        sched.inbox.put(IncomingMessage(sid, "stream_chunk", audio[start : start + step]))
        if realtime:
            time.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.perf_counter()))
        drain()
        if hold_at is not None and start + step >= hold_at and not of(events, "turn.scored"):
            held = time.perf_counter()
            while not of(events, "turn.scored") and time.perf_counter() - held < 10:
                drain(0.05)
            t0 += time.perf_counter() - held
    deadline = time.monotonic() + settle_s
    if settled is None:
        def settled(evs: list[dict[str, Any]]) -> bool:
            return len(of(evs, until)) >= max(1, len(of(evs, "speech_stopped")))
    while time.monotonic() < deadline and not settled(events):
        drain(0.1)
    sched.inbox.put(IncomingMessage(sid, "stream_done"))
    time.sleep(0.05)
    drain()
    return events


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def end_after_speech_ms(events: list[dict[str, Any]], speech_end_ms: float) -> float:
    stops = of(events, "speech_stopped")
    assert len(stops) == 1, [e["type"] for e in events]
    return stops[0]["audio_end_ms"] - speech_end_ms
