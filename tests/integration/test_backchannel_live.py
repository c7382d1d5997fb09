"""Backchannels over a playing answer, against a real `omni-rt serve` (CPU preset) on `WS /v1/realtime`.

A client that plays a long answer in real time says "Yeah." over it: no ``input_audio_buffer.speech_started``,
no cancel, no new turn, the answer goes on. Then it says "Wait, stop. What time is it?": ``speech_started``
comes, the answer (if still generating) ends ``cancelled`` (``turn_detected``), and the question is answered.
The microphone streams at real time throughout (the server hears the answer on the input stream's clock).
Every event is validated against openai-python's GA ``RealtimeServerEvent``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import numpy as np
import websockets
from rt_helpers import pcm_chunks_b64, speech_with_silence, validate_event

LONG_ASK = "Tell me a long story about a dragon."
CHUNK_MS = 40


class Client:
    def __init__(self, ws: Any) -> None:
        self.ws, self.events, self.times = ws, [], []

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def reader(self) -> None:
        async for raw in self.ws:
            event = json.loads(raw)
            validate_event(event)
            self.events.append(event)
            self.times.append(time.perf_counter())

    def of(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == etype]

    async def wait_for(self, pred, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events:
                if pred(e):
                    return e
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out; events: {[e['type'] for e in self.events][-40:]}")


def say(tts, text: str, lead_s: float, tail_s: float) -> list[str]:
    return pcm_chunks_b64(speech_with_silence(tts.synthesize(text), tts.sample_rate, lead_s=lead_s, tail_s=tail_s), CHUNK_MS)


async def test_answer_goes_on_through_yeah_and_stops_on_wait_stop(live_server):
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    yeah = say(tts, "Yeah.", lead_s=0.6, tail_s=1.5)
    interrupt = say(tts, "Wait, stop. What time is it?", lead_s=0.3, tail_s=2.0)
    silence = pcm_chunks_b64(np.zeros(24000 * 8, np.float32), CHUNK_MS)
    ws = await websockets.connect(f"{live_server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    rt = Client(ws)
    reader = asyncio.create_task(rt.reader())
    try:
        async with asyncio.timeout(180):
            await rt.wait_for(lambda e: e["type"] == "session.created", 30)
            await rt.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "transcription": {"model": "whisper-1"}, "turn_detection": {"type": "server_vad"}}}}})
            await rt.wait_for(lambda e: e["type"] == "session.updated", 30)
            await rt.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_ASK}]}})
            await rt.send({"type": "response.create", "response": {"max_output_tokens": 96}})
            r1 = (await rt.wait_for(lambda e: e["type"] == "response.created", 30))["response"]["id"]
            await rt.wait_for(lambda e: e["type"] == "response.output_audio.delta", 60)
            t_first_audio = time.perf_counter()  # a client playing in real time hears the answer from here

            async def mic(chunks: list[str]) -> None:  # a microphone: real time
                t0 = time.perf_counter()
                for i, chunk in enumerate(chunks):
                    await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * CHUNK_MS / 1000 - time.perf_counter()))

            await mic(yeah)  # the answer is playing: "Yeah." then 1.5 s of silence
            i_yeah_end = len(rt.events)
            audio_ms = sum(len(base64.b64decode(e["delta"])) for e in rt.of("response.output_audio.delta")) / 48
            print(f"\nafter 'Yeah.': {audio_ms:.0f} ms of answer audio received; "
                  f"{[e['type'] for e in rt.events if not e['type'].endswith('delta')]}")
            still_streaming = not rt.of("response.done")
            assert still_streaming or audio_ms / 1000 > time.perf_counter() - t_first_audio + 2.5, \
                "the answer is too short to be heard while the test talks over it"
            assert not rt.of("input_audio_buffer.speech_started"), "a backchannel barged in"
            assert not rt.of("input_audio_buffer.committed") and not rt.of("conversation.item.input_audio_transcription.completed")
            assert all(e["response"]["status"] == "completed" for e in rt.of("response.done")), rt.of("response.done")
            assert len(rt.of("response.created")) == 1

            talk = asyncio.create_task(mic(interrupt + silence))
            started = await rt.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_started", 10)
            t_started = rt.times[rt.events.index(started)]
            done1 = [e for e in rt.of("response.done") if e["response"]["id"] == r1]
            if not done1 or rt.events.index(done1[0]) > rt.events.index(started):  # still generating at the barge-in
                done = await rt.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] == r1, 5)
                cancel_ms = 1000 * (rt.times[rt.events.index(done)] - t_started)
                print(f"cancelled {cancel_ms:.0f} ms after speech_started")
                assert done["response"]["status"] == "cancelled" and done["response"]["status_details"]["reason"] == "turn_detected"
                assert cancel_ms <= 100, cancel_ms
            completed = await rt.wait_for(lambda e: e["type"] == "conversation.item.input_audio_transcription.completed", 30)
            print(f"heard: {completed['transcript']!r}")
            assert "time" in completed["transcript"].lower() or "stop" in completed["transcript"].lower(), completed
            r2 = await rt.wait_for(lambda e: e["type"] == "response.created" and e["response"]["id"] != r1, 30)
            await rt.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] == r2["response"]["id"], 60)
            assert len(rt.of("input_audio_buffer.speech_started")) == 1
            talk.cancel()
            assert i_yeah_end <= rt.events.index(started)
    finally:
        reader.cancel()
        await ws.close()
    assert live_server.wait_idle()["total"] == 0


async def test_switched_off_yeah_barges_in(tmp_path):
    """``--no-backchannel-filter``: the server barges in on any speech over the answer, "Yeah." included."""
    from omni_rt.backends.tts_piper import PiperTTS
    from servers import start_server, stop_server

    server = start_server(tmp_path, "--no-backchannel-filter")
    try:
        tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
        yeah = say(tts, "Yeah.", lead_s=0.6, tail_s=1.0)
        ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
        rt = Client(ws)
        reader = asyncio.create_task(rt.reader())
        try:
            async with asyncio.timeout(120):
                await rt.wait_for(lambda e: e["type"] == "session.created", 30)
                await rt.send({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_ASK}]}})
                await rt.send({"type": "response.create", "response": {"max_output_tokens": 96}})
                await rt.wait_for(lambda e: e["type"] == "response.output_audio.delta", 60)
                t0 = time.perf_counter()
                for i, chunk in enumerate(yeah):
                    await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * CHUNK_MS / 1000 - time.perf_counter()))
                await rt.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_started", 10)
        finally:
            reader.cancel()
            await ws.close()
    finally:
        stop_server(server)
