"""openai-python's own GPT-Live client (``AsyncOpenAI(base_url=...).live.connect()``), unchanged but for its
``base_url``, against the live CPU server: start, a spoken question whose words and answer come back as the
SDK's typed events, a greeting commentary, and close -> ``session.closed``."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from rt_helpers import heard, pcm_chunks_b64, speech_with_silence

openai = pytest.importorskip("openai")
if not hasattr(openai.AsyncOpenAI, "live"):
    pytest.skip("this openai-python has no client.live", allow_module_level=True)


async def test_openai_python_live_client(live_server, speech_samples):
    client = openai.AsyncOpenAI(base_url=f"{live_server.http_url}/v1", api_key="unused")
    audio, sr, _ = speech_samples["capital"]
    speech = pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)
    silence = base64.b64encode(b"\x00" * 1920).decode()
    events: list = []
    async with client.live.connect(max_retries=0) as conn:
        await conn.session.start(session={"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 24000},
                                                                         "output": {"voice": "marin"}}})

        async def read() -> None:
            async for event in conn:
                events.append(event)
                if event.type == "session.closed":
                    return

        reader = asyncio.create_task(read())

        def types() -> list[str]:
            return [e.type for e in events]

        async def until(pred, timeout: float) -> None:
            deadline = time.perf_counter() + timeout
            while not pred() and time.perf_counter() < deadline and not reader.done():
                await asyncio.sleep(0.05)
            assert pred(), types()[-20:]

        await until(lambda: "session.started" in types(), 30)
        started = next(e for e in events if e.type == "session.started")
        assert started.session.id.startswith("live_") and started.session.status == "active"
        for chunk in speech + [silence] * 150:
            await conn.session.input_audio.append(audio=chunk)
            await asyncio.sleep(0.04)
            if "session.output_transcript.delta" in types():
                break
        await until(lambda: "session.output_transcript.delta" in types(), 60)
        asked = "".join(e.delta for e in events if e.type == "session.input_transcript.delta")
        assert heard("france", asked) or "capital" in asked.lower(), asked
        await conn.session.commentary.append(content="Thanks for asking!", delegation_id=None)
        await until(lambda: "session.commentary.appended" in types(), 10)
        await conn.session.close()
        await asyncio.wait_for(reader, timeout=20)
    closed = events[-1]
    assert closed.type == "session.closed" and closed.reason == "close_requested" and closed.usage.seconds > 0
    pcm = np.frombuffer(b"".join(base64.b64decode(e.delta) for e in events if e.type == "session.output_audio.delta"), np.int16)
    assert np.abs(pcm).max() > 1000
