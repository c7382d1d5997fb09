"""``audio.input.noise_reduction`` end to end through a real server: accepted and echoed, a question asked at 5 dB
SNR in pink noise heard right and answered, and 3 s of noise alone (pink, dish clatter) starting no turn; the
same with it off, for the comparison (printed; run with ``-s``). The denoiser itself: tests/unit/backends/test_denoise.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from rt_helpers import heard, pcm_chunks_b64
from servers import start_server, stop_server
from test_server_protocol import connect, of_type

from omni_rt.audio.pcm import resample
from omni_rt.testing.noise import clatter as clatter_noise
from omni_rt.testing.noise import pink_noise

QUESTION = "What is the capital of France?"
RATE = 24000
SNR_DB = 5.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(Path(tmp_path_factory.mktemp("noise")))
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def noisy_question() -> tuple[np.ndarray, float]:
    """(0.5 s of noise, the question, 1.5 s of noise: the noise goes on through the end of the turn) at 24 kHz,
    the noise's RMS (the same level for the noise-alone check)."""
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    speech = resample(tts.synthesize(QUESTION), tts.sample_rate, RATE).astype(np.float32)
    rms = float(np.sqrt(np.mean(speech ** 2) / 10 ** (SNR_DB / 10)))
    clean = np.concatenate([np.zeros(RATE // 2, np.float32), speech, np.zeros(RATE * 3 // 2, np.float32)])
    return np.clip(clean + rms * pink_noise(clean.size, np.random.default_rng(7)), -1, 1).astype(np.float32), rms


async def _stream(rt, audio: np.ndarray) -> None:
    for chunk in pcm_chunks_b64(audio, chunk_ms=20):
        await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        await asyncio.sleep(0.02)


async def _ask(server, noisy: np.ndarray, nr: dict | None) -> dict:
    async with asyncio.timeout(120), connect(server) as rt:
        upd = await rt.update({"max_output_tokens": 16, "audio": {"input": {
            "noise_reduction": nr, "transcription": {"model": "whisper-1"}}}})
        assert upd["session"]["audio"]["input"]["noise_reduction"] == nr, upd
        t0 = time.monotonic()
        await _stream(rt, noisy)
        done = await rt.until("response.done")
        transcript = of_type(rt.events, "conversation.item.input_audio_transcription.completed")[0]["transcript"]
        stopped = of_type(rt.events, "input_audio_buffer.speech_stopped")
        return {"status": done["response"]["status"], "transcript": transcript, "turns": len(stopped),
                "audio": len(of_type(rt.events, "response.output_audio.delta")),
                "audio_end_ms": stopped[0]["audio_end_ms"] if stopped else None, "s": round(time.monotonic() - t0, 2)}


async def _noise_alone(server, noise: np.ndarray, nr: dict | None) -> list[str]:
    """The turn events 3 s of ``noise`` start."""
    async with asyncio.timeout(60), connect(server) as rt:
        await rt.update({"audio": {"input": {"noise_reduction": nr}}})
        await _stream(rt, noise)
        await rt.send({"type": "input_audio_buffer.clear"})
        await rt.until("input_audio_buffer.cleared")
        return [e["type"] for e in rt.events if e["type"].startswith("input_audio_buffer.speech") or e["type"] == "response.created"]


async def test_noisy_question_heard_and_noise_alone_starts_no_turn(server, noisy_question):
    noisy, rms = noisy_question
    on = await _ask(server, noisy, {"type": "near_field"})
    off = await _ask(server, noisy, None)
    pink = rms * pink_noise(3 * RATE, np.random.default_rng(8))
    clatter = np.clip(rms * clatter_noise(3 * RATE, np.random.default_rng(9), RATE), -1, 1)  # dishes, a kitchen
    alone_on = await _noise_alone(server, pink, {"type": "near_field"})
    clatter_on = await _noise_alone(server, clatter, {"type": "near_field"})
    alone_off = await _noise_alone(server, pink, None)
    print(f"\nnoise_reduction near_field: {on}; noise alone: {alone_on}; clatter alone: {clatter_on}"
          f"\nnoise_reduction off: {off}; noise alone: {alone_off}")
    assert on["status"] == "completed" and on["audio"] > 0 and on["turns"] == 1, on
    assert heard("capital", on["transcript"]) and heard("france", on["transcript"]), on
    assert "input_audio_buffer.speech_started" not in alone_on, alone_on
    assert "input_audio_buffer.speech_started" not in clatter_on, clatter_on
    assert off["status"] == "completed", off  # off still works the same as before


async def test_far_field_is_accepted_and_echoed_and_bad_values_refused_by_name(server):
    async with asyncio.timeout(60), connect(server) as rt:
        upd = await rt.update({"audio": {"input": {"noise_reduction": {"type": "far_field"}}}})
        assert upd["session"]["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
        for bad, param in (({"type": "loud"}, "session.audio.input.noise_reduction.type"),
                           ("near_field", "session.audio.input.noise_reduction"),
                           ({"type": "near_field", "level": 3}, "session.audio.input.noise_reduction.level")):
            await rt.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"noise_reduction": bad}}}})
            err = (await rt.until("error"))["error"]
            assert err["param"] == param, (bad, err)
        upd = await rt.update({"audio": {"input": {"noise_reduction": None}}})  # the refused ones changed nothing before
        assert upd["session"]["audio"]["input"]["noise_reduction"] is None


def test_a_preset_can_turn_it_off_server_wide(tmp_path):
    """``noise_reduction: false`` in the preset's asr args: the update is refused by name and code, the rest of it
    applies, and the session echoes noise_reduction off."""
    import yaml

    from omni_rt.resources import preset_dir

    cfg = yaml.safe_load((preset_dir() / "cpu.yaml").read_text())
    next(st for st in cfg["stages"] if st["name"] == "asr")["args"]["noise_reduction"] = False
    preset = tmp_path / "cpu-no-denoise.yaml"
    preset.write_text(yaml.safe_dump(cfg))
    server = start_server(tmp_path, "--preset", str(preset))
    try:
        async def run() -> None:
            async with asyncio.timeout(60), connect(server) as rt:
                await rt.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
                                                                     "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}})
                err = (await rt.until("error"))["error"]
                assert err["code"] == "noise_reduction_unavailable" and err["param"] == "session.audio.input.noise_reduction", err
                assert "noise_reduction" in err["message"], err
                session = (await rt.until("session.updated"))["session"]
                assert session["audio"]["input"]["noise_reduction"] is None and session["instructions"] == "Be brief.", session

        asyncio.run(run())
    finally:
        stop_server(server)
