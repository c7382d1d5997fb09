"""The official openai SDK's realtime client against a real `omni-rt serve` (CPU preset): a full spoken turn."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from openai import AsyncOpenAI

from rt_helpers import heard, pcm_chunks_b64, speech_with_silence, validate_event


async def run_spoken_turn(ws_url: str, audio: np.ndarray, sr: int) -> list[dict]:
    client = AsyncOpenAI(api_key="unused-when-auth-is-off", websocket_base_url=f"{ws_url}/v1")
    events: list[dict] = []
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.session.update(session={
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                "transcription": {"model": "whisper-1"},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}},
                      "output": {"format": {"type": "audio/pcm", "rate": 24000}}},
        })

        async def feed() -> None:
            for chunk in pcm_chunks_b64(speech_with_silence(audio, sr)):
                await conn.input_audio_buffer.append(audio=chunk)
                await asyncio.sleep(0.01)  # faster than real time; VAD runs on audio time

        feeder = asyncio.create_task(feed())
        async with asyncio.timeout(90):
            async for event in conn:
                raw = event.model_dump(mode="json", exclude_unset=True)
                events.append(raw)
                if event.type == "response.done":
                    break
        await feeder
    return events


async def test_sdk_spoken_turn(live_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    events = await run_spoken_turn(live_server.ws_url, audio, sr)
    types = [e["type"] for e in events]
    for e in events:
        validate_event(e)
    assert types[0] == "session.created"
    for needed in ("session.updated", "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                   "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                   "response.created", "response.output_audio.delta", "response.output_audio_transcript.delta",
                   "response.done"):
        assert needed in types, f"missing {needed}; got {types}"
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped")
    transcript = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")["transcript"]
    assert "capital" in transcript.lower() and heard("france", transcript), transcript
    done = events[-1]["response"]
    assert done["status"] == "completed"
    audio_bytes = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] == "response.output_audio.delta")
    assert audio_bytes > 24000 * 2 * 0.5, "less than half a second of answer audio"
    # every delta belongs to the announced response/item
    rid = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    assert all(e["response_id"] == rid for e in events if e["type"] == "response.output_audio.delta")
    assert live_server.wait_idle()["total"] == 0


async def test_sdk_audio_streams_while_thinker_generates(live_server):
    """Streaming, not a cascade: the first audio of a long answer leaves before the thinker has finished."""
    client = AsyncOpenAI(api_key="unused", websocket_base_url=f"{live_server.ws_url}/v1")
    types: list[str] = []
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Tell me a long story about a dragon who loved books."}]})
        await conn.response.create()
        async with asyncio.timeout(120):
            async for event in conn:
                validate_event(event.model_dump(mode="json", exclude_unset=True))
                types.append(event.type)
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    break
    first_audio = types.index("response.output_audio.delta")
    text_deltas = [i for i, t in enumerate(types) if t == "response.output_audio_transcript.delta"]
    assert len(text_deltas) > 10  # the answer policy releases the first sentence word by word, later ones whole
    assert first_audio < text_deltas[-1], "audio started only after the whole answer text was generated"
    assert sum(1 for i in text_deltas if i > first_audio) >= 1, "text should still be coming after the first audio"
