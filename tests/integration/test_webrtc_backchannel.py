"""A backchannel over a WebRTC call's answer: the server, which paces the answer's track, holds it while "Yeah."
may be an interruption and resumes it from where it held once it is known to be a backchannel; no
``speech_started``, no ``output_audio_buffer.cleared``, the answer plays on to its end."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from rt_helpers import validate_event

pytest.importorskip("aiortc")
from omni_rt.testing.webrtc_client import RealtimeCall  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SILENT_RMS = 0.003


def longest_silence(heard: list[tuple[float, float]], t0: float, t1: float) -> tuple[float, float]:
    """(start, seconds) of the longest run of silent 20 ms frames received between t0 and t1."""
    best, run_start = (t0, 0.0), None
    for t, rms in heard:
        if t < t0 or t > t1:
            continue
        if rms <= SILENT_RMS:
            run_start = t if run_start is None else run_start
            if t - run_start > best[1]:
                best = (run_start, t - run_start)
        else:
            run_start = None
    return best


async def test_webrtc_answer_pauses_for_yeah_and_resumes(live_server, speech_samples):
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    yeah = np.concatenate([tts.synthesize("Yeah."), np.zeros(tts.sample_rate, np.float32)])
    audio, sr, _ = speech_samples["long"]
    call = RealtimeCall(live_server.http_url)
    assert (await call.connect()).status_code == 201
    try:
        await call.next_event("session.created")
        call.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}})
        call.mic.say(np.concatenate([audio, np.zeros(int(sr * 1.5), np.float32)]), sr)
        started = await call.next_event("output_audio_buffer.started", 90)
        await asyncio.sleep(1.5)  # some of the answer plays
        t_say = time.perf_counter()
        call.mic.say(yeah, tts.sample_rate)
        await asyncio.sleep(3.0)
        types = [e["type"] for e in call.events]
        assert "input_audio_buffer.speech_started" not in types[types.index("output_audio_buffer.started"):], types
        assert "output_audio_buffer.cleared" not in types, types
        gap_at, gap = longest_silence(call.heard, t_say, t_say + 2.0)
        after = call.sound_seconds(since=gap_at + gap)
        print(f"\nheld {gap * 1000:.0f} ms, starting {1000 * (gap_at - t_say):.0f} ms after 'Yeah.' began; "
              f"{after:.1f} s of the answer sounded after it resumed")
        assert gap >= 0.25, "the answer was not held while 'Yeah.' was decided"
        assert after >= 1.0, "the answer did not resume"
        stopped = await call.next_event("output_audio_buffer.stopped", 120)  # it plays on to its end
        assert stopped["response_id"] == started["response_id"]
        done = [e for e in call.events if e["type"] == "response.done"]
        assert done and done[0]["response"]["status"] == "completed", done
        for event in call.events:
            validate_event({k: v for k, v in event.items() if k != "_t"})
    finally:
        await call.close()
