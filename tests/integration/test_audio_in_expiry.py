"""A long-lived session whose microphone was quiet past the audio-in stage's idle expiry (issue #51, "long
sessions never get stuck"): against a real `omni-rt serve` whose ASR stage expires idle state after 2 s.

Before, the client got a ``session_expired`` server error after 10 minutes of text-only turns, and its next
audio found no state in the stage. Now the session opens the stage's state again: no error when nothing was
lost, a spoken question afterwards is heard and answered; a manual buffer that was dropped is reported."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import websockets
import yaml
from rt_helpers import pcm_chunks_b64, speech_with_silence, validate_event
from servers import start_server, stop_server

from omni_rt.presets import PRESET_DIR

pytestmark = pytest.mark.integration

IDLE_S = 2.0


@pytest.fixture(scope="module")
def expiring_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("expiry")
    preset = yaml.safe_load((PRESET_DIR / "cpu.yaml").read_text())
    asr = next(s for s in preset["stages"] if s["name"] == "asr")
    asr.setdefault("args", {})["idle_timeout_s"] = IDLE_S
    path = Path(tmp) / "cpu-expiring.yaml"
    path.write_text(yaml.safe_dump(preset))
    server = start_server(tmp, "--preset", str(path))
    yield server
    stop_server(server)


async def _events_for(ws: Any, seconds: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(seconds):
            while True:
                out.append(json.loads(await ws.recv()))
    except TimeoutError:
        return out


async def _until(ws: Any, etype: str, timeout_s: float = 90) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        while True:
            event = json.loads(await ws.recv())
            validate_event(event)
            seen.append(event)
            assert event["type"] != "error", event
            if event["type"] == etype:
                return seen


async def test_a_quiet_session_is_heard_again_with_no_error(expiring_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    async with websockets.connect(f"{expiring_server.ws_url}/v1/realtime", max_size=None, open_timeout=60) as ws:
        await _until(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "transcription": {"model": "whisper-1"}, "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}}))
        await _until(ws, "session.updated")
        quiet = await _events_for(ws, 3 * IDLE_S)  # the stage's state for this session expires meanwhile
        assert [e for e in quiet if e["type"] == "error"] == [], quiet
        for chunk in pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.2, tail_s=1.2), chunk_ms=40):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        seen = await _until(ws, "response.done", timeout_s=120)
        types = [e["type"] for e in seen]
        assert "input_audio_buffer.speech_started" in types and "input_audio_buffer.committed" in types, types
        done = seen[-1]["response"]
        assert done["status"] == "completed", done
        heard = next(e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert "capital" in heard["transcript"].lower(), heard


async def test_a_dropped_manual_buffer_is_reported_and_the_next_commit_works(expiring_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    chunks = pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.2, tail_s=0.3), chunk_ms=40)
    async with websockets.connect(f"{expiring_server.ws_url}/v1/realtime", max_size=None, open_timeout=60) as ws:
        await _until(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                  "audio": {"input": {"transcription": {"model": "whisper-1"}, "turn_detection": None}}}}))
        await _until(ws, "session.updated")
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunks[0]}))
        quiet = await _events_for(ws, 3 * IDLE_S)
        errors = [e["error"] for e in quiet if e["type"] == "error"]
        assert [e["code"] for e in errors] == ["session_expired"] and "dropped" in errors[0]["message"], quiet
        for chunk in chunks:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        seen = await _until(ws, "conversation.item.input_audio_transcription.completed")
        assert "capital" in seen[-1]["transcript"].lower(), seen[-1]
