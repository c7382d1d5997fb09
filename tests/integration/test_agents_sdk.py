"""The OpenAI Agents SDK's realtime agent, unchanged, against the live CPU server: a spoken turn, and tool
flows as a voice agent drives them: the tool forced for the first response, ``tool_choice`` back to ``auto``
once it ran. The tool must run exactly once and a spoken answer using its output must follow (the 135M thinker
used to call it again and again); a two-step chain of two different tools must run both. Both thinker engines:
the preset's llama.cpp one and the built-in PyTorch one (a server on the same preset with ``backend: torch``).
Every server event the SDK receives is validated against openai-python's ``RealtimeServerEvent``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from rt_helpers import speech_with_silence, validate_event

from omni_rt.audio.pcm import float_to_pcm16

agents = __import__("pytest").importorskip("agents", reason="openai-agents is part of the test extras")
from agents import function_tool  # noqa: E402
from agents.realtime import RealtimeAgent, RealtimeRunner  # noqa: E402
from agents.realtime.model_inputs import RealtimeModelRawClientMessage, RealtimeModelSendRawMessage  # noqa: E402

from openai.types.responses import ToolChoiceFunction  # noqa: E402


CALLS: list[tuple[str, str]] = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    CALLS.append(("get_weather", city))
    return f"In {city} it is raining and 12 degrees."


@function_tool
def get_location() -> str:
    """The city the user is in."""
    CALLS.append(("get_location", ""))
    return "The user is in Lisbon."


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


@pytest.fixture(params=["llama.cpp", "torch"])
def server(request):
    return request.getfixturevalue("live_server" if request.param == "llama.cpp" else "torch_server")


async def run_tool_flow(server, tools: list, first_choice, switch: dict, question: str, timeout: float = 150) -> tuple[list, list]:
    """Drive one typed question through the SDK; ``switch`` maps a tool name to the ``tool_choice`` the client
    sets when that tool starts (sent before the SDK's function_call_output + response.create, in order on the
    socket). Ends at the first agent_end after the last expected tool with audio after it; returns the SDK
    events and its history."""
    CALLS.clear()
    session = await runner(tools, tool_choice=first_choice).run(
        model_config={"url": f"{server.ws_url}/v1/realtime", "api_key": "unused"})
    seen: list = []
    async with session:
        await session.send_message(question)
        try:
            async with asyncio.timeout(timeout):
                async for event in session:
                    seen.append(event)
                    assert event.type != "error", event
                    assert len(CALLS) <= 4, f"the tools were called again and again: {CALLS[:6]} ..."
                    if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                        validate_event(event.data.data)
                    if event.type == "tool_start" and event.tool.name in switch:
                        await session.model.send_event(RealtimeModelSendRawMessage(message=RealtimeModelRawClientMessage(
                            type="session.update", other_data={"session": {"type": "realtime", "tool_choice": switch[event.tool.name]}})))
                    if event.type == "agent_end" and "audio" in [e.type for e in seen[_answer_start(seen):]]:
                        break
        except TimeoutError:
            raise AssertionError(f"no spoken answer after the tools: {[e.type for e in seen if e.type not in ('audio', 'raw_model_event')][-20:]}, "
                                 f"calls {CALLS[:6]}, history {session._history[-4:]}") from None
        await asyncio.sleep(1.0)  # a repeated call would start right after the answer's response.done
        history = list(session._history)
    return seen, history


def _answer_start(seen: list) -> int:
    """Where the answer after the last tool's output begins: the first response created after the last tool_end
    (the response that made the call may still be speaking its preamble when a fast tool ends); len(seen) if none."""
    ends = [i for i, e in enumerate(seen) if e.type == "tool_end"]
    if not ends:
        return len(seen)
    return next((i for i, e in enumerate(seen) if i > ends[-1] and e.type == "raw_model_event"
                 and e.data.type == "raw_server_event" and e.data.data.get("type") == "response.created"), len(seen))


def _spoken_after_last_tool(seen: list) -> int:
    return sum(len(e.audio.data) for e in seen[_answer_start(seen):] if e.type == "audio")


def _no_empty_assistant_messages(history: list) -> None:
    for it in history:
        if getattr(it, "type", None) == "message" and getattr(it, "role", None) == "assistant":
            text = " ".join(str(getattr(c, "transcript", None) or getattr(c, "text", None) or "") for c in it.content)
            assert text.strip(), f"empty assistant message in the history: {it}"


async def test_agents_sdk_tool_forced_then_auto_runs_once_and_speaks(server):
    seen, history = await run_tool_flow(server, [get_weather], "required", {"get_weather": "auto"},
                                        "What is the weather in Paris?")
    assert [name for name, _ in CALLS] == ["get_weather"] and CALLS[0][1].strip(), CALLS
    assert sum(e.type == "tool_start" for e in seen) == 1
    assert "raining" in str(next(e for e in seen if e.type == "tool_end").output)
    assert _spoken_after_last_tool(seen) > 24000
    answer = [it for it in history if getattr(it, "role", None) == "assistant" and getattr(it, "type", None) == "message"][-1]
    spoken = " ".join(str(getattr(c, "transcript", "") or "") for c in answer.content).lower()
    assert any(w in spoken for w in ("rain", "12", "twelve")), spoken  # the answer uses the tool's output
    _no_empty_assistant_messages(history)


async def test_agents_sdk_two_tool_chain_runs_both_once(server):
    # each step forced by name (which tool comes next is the 135M model's weakest judgement; that a different
    # tool stays callable under auto is checked on both engines in test_engine_tools / test_engine_llamacpp),
    # then auto: once both outputs are in, the answer is spoken and nothing is called again
    seen, history = await run_tool_flow(server, [get_location, get_weather], ToolChoiceFunction(type="function", name="get_location"),
                                        {"get_location": {"type": "function", "name": "get_weather"}, "get_weather": "auto"},
                                        "What is the weather where I am?")
    assert [name for name, _ in CALLS] == ["get_location", "get_weather"], CALLS
    assert "lisbon" in CALLS[1][1].lower(), CALLS  # the second call used the first one's output
    assert _spoken_after_last_tool(seen) > 24000
    _no_empty_assistant_messages(history)


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


@function_tool
async def get_order_status(order_id: str) -> str:
    """The delivery status of a customer's order."""
    CALLS.append(("get_order_status", order_id))
    await asyncio.sleep(3.0)  # a real backend taking its time
    return "The order has shipped and arrives on Tuesday."


async def test_agents_sdk_slow_tool_hears_a_preamble_and_runs_once(live_server):
    """A 3 s tool: the agent speaks its preamble while the tool runs (audio before the tool ends), the tool runs
    once, and the answer after it says what the tool returned."""
    seen, history = await run_tool_flow(live_server, [get_order_status], "required", {"get_order_status": "auto"},
                                        "Where is my order 42?")
    assert [name for name, _ in CALLS] == ["get_order_status"], CALLS
    assert sum(e.type == "tool_start" for e in seen) == 1
    first_tool = next(i for i, e in enumerate(seen) if e.type == "tool_start")
    tool_end = next(i for i, e in enumerate(seen) if e.type == "tool_end")
    preamble_audio = sum(len(e.audio.data) for e in seen[:tool_end] if e.type == "audio")
    assert preamble_audio > 24000, f"{preamble_audio} bytes of audio before the tool ended (tool_start at {first_tool})"
    messages = [it for it in history if getattr(it, "role", None) == "assistant" and getattr(it, "type", None) == "message"]
    spoken = " ".join(str(getattr(c, "transcript", "") or "") for c in messages[-1].content).lower()
    assert any(w in spoken for w in ("tuesday", "shipped")), spoken
    assert "look up the order status" in " ".join(str(getattr(c, "transcript", "") or "") for m in messages for c in m.content).lower()
    _no_empty_assistant_messages(history)
