"""Turn-taking end to end: one spoken turn per mode (``semantic_vad``, ``idle_timeout_ms``) through the live
server. The Smart Turn model, the config and the ASR stage: tests/unit/stages/test_turn_detection.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from rt_helpers import heard, pcm_chunks_b64, speech_with_silence
from test_server_protocol import connect, of_type


COMPLETE = "What is the capital of France?"


@pytest.fixture(scope="module")
def tts():
    """Deterministic speech (no VITS noise): otherwise each run's audio differs — now and then Piper's pause at
    the comma of "for, um," was long enough for a pause of its own, which Smart Turn scored complete."""
    from omni_rt.backends.tts_piper import PiperTTS

    return PiperTTS(noise_scale=0.0, noise_w_scale=0.0)


# ---------------------------------------------------------------- end to end


async def test_semantic_vad_and_idle_timeout_end_to_end(live_server, tts):
    """Through the live server: semantic_vad ends a complete question early and answers it; then with
    server_vad idle_timeout_ms the silence after the answer fires input_audio_buffer.timeout_triggered."""
    audio = speech_with_silence(tts.synthesize(COMPLETE), tts.sample_rate, lead_s=0.3, tail_s=1.5)
    async with asyncio.timeout(180), connect(live_server) as rt:
        upd = await rt.update({"max_output_tokens": 16, "audio": {"input": {
            "transcription": {"model": "whisper-1"}, "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
        assert upd["session"]["audio"]["input"]["turn_detection"]["eagerness"] == "high"
        for chunk in pcm_chunks_b64(audio, chunk_ms=20):
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
            await asyncio.sleep(0.02)
        done = await rt.until("response.done")
        assert done["response"]["status"] == "completed", done
        stopped = of_type(rt.events, "input_audio_buffer.speech_stopped")
        assert len(stopped) == 1
        speech_end_ms = 300 + 1000 * len(tts.synthesize(COMPLETE)) / tts.sample_rate
        # a sure end: 300 ms of silence after Silero's last speech frame (~390 ms after the sound); server_vad's
        # default would be >= 500, high's unsure end 600
        assert stopped[0]["audio_end_ms"] - speech_end_ms < 500, stopped
        transcript = of_type(rt.events, "conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert heard("france", transcript)

        await rt.update({"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 1000}}}})
        silent = pcm_chunks_b64(np.zeros(24000 * 12, np.float32), chunk_ms=100)  # past the answer's playback too
        start = len(rt.events)
        for chunk in silent:
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        fired = await rt.until("input_audio_buffer.timeout_triggered")
        assert fired["audio_end_ms"] - fired["audio_start_ms"] >= 1000, fired
        committed = await rt.until("input_audio_buffer.committed")
        assert committed["item_id"] == fired["item_id"]
        await rt.until("response.created")  # the GA protocol answers the silence (a prompt to go on)
        types = [e["type"] for e in rt.events[start:]]
        assert "error" not in types, types
