"""The OpenAI Agents SDK's realtime agent, unchanged, against the live CPU server: a spoken turn, and a turn
where a function tool is called (forced with tool_choice, so the check does not rest on the 135M model's
judgement) with parsed arguments and the spoken answer uses its result."""

from __future__ import annotations

import asyncio

import numpy as np
from rt_helpers import speech_with_silence

from omni_rt.audio.pcm import float_to_pcm16

agents = __import__("pytest").importorskip("agents", reason="openai-agents is part of the test extras")
from agents import function_tool  # noqa: E402
from agents.realtime import RealtimeAgent, RealtimeRunner  # noqa: E402
from agents.realtime.model_inputs import RealtimeModelRawClientMessage, RealtimeModelSendRawMessage  # noqa: E402

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    CALLS.append(city)
    return f"In {city} it is raining and 12 degrees."


def runner(tools: list, tool_choice=None) -> RealtimeRunner:
    settings = {"voice": "joe", "output_modalities": ["audio"],
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}
    if tool_choice is not None:
        settings["tool_choice"] = tool_choice
    agent = RealtimeAgent(name="assistant", instructions="You are a helpful voice assistant. Answer in one short sentence.",
                          tools=tools)
    return RealtimeRunner(agent, config={"model_settings": settings, "tracing_disabled": True})


async def collect(session, until: str, timeout: float = 120) -> list:
    seen = []
    async with asyncio.timeout(timeout):
        async for event in session:
            seen.append(event)
            if event.type == "error":
                raise AssertionError(f"agents SDK reported an error: {event}")
            if event.type == until:
                return seen
    return seen


async def test_agents_sdk_spoken_turn(live_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    pcm = float_to_pcm16(speech_with_silence(audio, sr, lead_s=0.3, tail_s=1.5))
    session = await runner([]).run(model_config={"url": f"{live_server.ws_url}/v1/realtime", "api_key": "unused"})
    async with session:
        for i in range(0, len(pcm), 1920):  # 40 ms chunks, a little faster than real time
            await session.send_audio(pcm[i:i + 1920])
            await asyncio.sleep(0.02)
        events = await collect(session, "agent_end")
        audio_bytes = sum(len(e.audio.data) for e in events if e.type == "audio")
        assert audio_bytes > 24000, [e.type for e in events]
        history = session._history  # the SDK's own view of the conversation
        user = [it for it in history if getattr(it, "role", None) == "user"]
        assert user, history


async def test_agents_sdk_function_tool_forced(live_server):
    CALLS.clear()
    session = await runner([get_weather], tool_choice="required").run(
        model_config={"url": f"{live_server.ws_url}/v1/realtime", "api_key": "unused"})
    async with session:
        # the SDK sends the tool's output and a response.create right after the tool returns: switch the
        # session back to tool_choice auto first (in order on the socket), or every answer would be forced again
        async def unforce(event) -> None:
            if event.type == "tool_start":
                await session.model.send_event(RealtimeModelSendRawMessage(message=RealtimeModelRawClientMessage(
                    type="session.update", other_data={"session": {"type": "realtime", "tool_choice": "none"}})))

        await session.send_message("What is the weather in Paris?")
        seen: list = []
        try:
            async with asyncio.timeout(120):
                async for event in session:
                    seen.append(event)
                    assert event.type != "error", event
                    await unforce(event)
                    if event.type == "agent_end" and any(e.type == "tool_end" for e in seen) and any(
                            e.type == "audio" for e in seen[[e.type for e in seen].index("tool_end"):]):
                        break
        except TimeoutError:
            raise AssertionError(f"no spoken answer after the tool: {[e.type for e in seen if e.type != 'audio']}, "
                                 f"calls {CALLS}, history {session._history}") from None
        assert CALLS and CALLS[0].strip(), CALLS
        tool_end = next(e for e in seen if e.type == "tool_end")
        assert "raining" in str(tool_end.output)
        after = seen[seen.index(tool_end):]
        spoken = sum(len(e.audio.data) for e in after if e.type == "audio")
        assert spoken > 24000
        transcript = " ".join(str(getattr(it, "content", "")) for it in session._history).lower()
        assert any(w in transcript for w in ("rain", "12", "twelve")), transcript
    assert np.isfinite(spoken)


async def test_agents_sdk_default_settings_answer_a_spoken_question_promptly(live_server):
    """The SDK's defaults (it asks for semantic_vad, eagerness auto) and a client streaming like a live mic: a
    complete question that opens with a greeting (Smart Turn alone once made it wait the 4 s max) is answered
    within 1 s of the speaker stopping. On a shared machine (load above half the cores) the bound is 3 s."""
    import os
    import time

    from omni_rt.audio.pcm import resample
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    speech = resample(tts.synthesize("Hello, what is the weather like tomorrow?"), tts.sample_rate, 24000)
    lead, tail = np.zeros(24000 * 3 // 10, np.float32), np.zeros(24000 * 2, np.float32)
    pcm = float_to_pcm16(np.concatenate([lead, speech, tail]))
    speech_end_byte = 2 * (lead.size + speech.size)
    busy = os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1)
    limit_ms = 3000 if busy else 1000
    agent = RealtimeAgent(name="assistant", instructions="You are a helpful voice assistant. Answer in one short sentence.")
    session = await RealtimeRunner(agent, config={"tracing_disabled": True}).run(
        model_config={"url": f"{live_server.ws_url}/v1/realtime", "api_key": "unused"})
    first_audio: list[float] = []
    seen: list[str] = []

    async def listen() -> None:
        async for event in session:
            seen.append(event.type)
            assert event.type != "error", event
            if event.type == "audio" and not first_audio:
                first_audio.append(time.perf_counter())
            if event.type == "agent_end":
                return

    async with session:
        listener = asyncio.create_task(listen())
        t0, step, t_end = time.perf_counter(), 960, None  # 20 ms chunks at their real-time instants
        for k, i in enumerate(range(0, len(pcm), step)):
            await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.perf_counter()))
            await session.send_audio(pcm[i:i + step])
            if t_end is None and i + step >= speech_end_byte:
                t_end = time.perf_counter()
        async with asyncio.timeout(120):
            await listener
    assert first_audio and t_end is not None, seen
    v2v_ms = (first_audio[0] - t_end) * 1000
    print(f"\nAgents SDK defaults: first answer audio {v2v_ms:.0f} ms after the speaker stopped (limit {limit_ms}, busy={busy})")
    assert v2v_ms <= limit_ms, (v2v_ms, seen[:20])
