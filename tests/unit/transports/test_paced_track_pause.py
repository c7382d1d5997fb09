"""The WebRTC answer track held and resumed (``PacedAudioTrack.pause``): while speech over the answer may be a
backchannel the track sends silence and keeps its queue; resumed, it goes on from the very frame it held, on
the next 20 ms tick; a barge-in's ``clear`` drops the queue and ends the pause."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

pytest.importorskip("aiortc")

from omni_rt.transports.webrtc_media import FRAME_SAMPLES, WIRE_RATE, PacedAudioTrack  # noqa: E402


def frames(n: int, start: int = 1) -> np.ndarray:
    """``n`` frames, frame k a constant level k/100 (so each frame is recognisable after int16)."""
    return np.concatenate([np.full(FRAME_SAMPLES, (start + k) / 100, np.float32) for k in range(n)])


async def test_pause_holds_the_queue_and_resume_goes_on_from_the_held_frame() -> None:
    started, stopped = [], []
    track = PacedAudioTrack(started.append, stopped.append)
    track.push("r1", "i1", frames(10))
    track.end("r1", "i1")
    for _ in range(3):
        await track.recv()
    assert track.played["i1"] == 3 * FRAME_SAMPLES and track.queued_frames() == 7
    track.pause(True)
    for _ in range(5):  # 100 ms of silence: nothing of the answer goes out, nothing is dropped
        await track.recv()
    assert track.played["i1"] == 3 * FRAME_SAMPLES and track.queued_frames() == 7 and not stopped
    t0 = time.perf_counter()
    track.pause(False)
    await track.recv()
    resumed_ms = (time.perf_counter() - t0) * 1000
    assert track.played["i1"] == 4 * FRAME_SAMPLES and track.queued_frames() == 6
    assert resumed_ms <= 40, resumed_ms  # the next tick, not later
    for _ in range(6):
        await track.recv()
    assert track.played["i1"] == 10 * FRAME_SAMPLES and stopped == ["r1"] and started == ["r1"]
    track.stop()


async def test_clear_ends_a_pause() -> None:
    track = PacedAudioTrack(lambda r: None, lambda r: None)
    track.push("r1", "i1", frames(5))
    track.pause(True)
    await track.recv()
    assert track.clear() == "r1" and not track.paused and track.queued_frames() == 0
    track.push("r2", "i2", frames(2))
    await asyncio.wait_for(track.recv(), 1.0)
    assert track.played.get("i2") == FRAME_SAMPLES
    assert WIRE_RATE == 48000
    track.stop()
