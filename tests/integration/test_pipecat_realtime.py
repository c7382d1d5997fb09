"""Pipecat's OpenAI Realtime service (``OpenAIRealtimeLLMService``), unchanged but for its ``base_url``, on its
default settings against the live CPU server's ``/v1/realtime``, in the pipeline a Pipecat app builds: the
context aggregator pair around the service, a spoken question streamed as ``InputAudioRawFrame``s in real time,
the server's VAD deciding the turn. A question is heard and answered in audio; a slow function tool registered
the Pipecat way (``register_function``, a ``ToolsSchema`` in the context) runs once while the server's preamble
is spoken, and the answer after its result says what it returned."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from pipecat_helpers import run_pipeline
from rt_helpers import heard, speech_with_silence

from omni_rt.audio.pcm import float_to_pcm16

pytest.importorskip("loguru", reason="Pipecat's runtime deps come with the test extra")
rt_llm = pytest.importorskip("pipecat.services.openai.realtime.llm")

CHUNK = 1920  # 40 ms of 24 kHz PCM16


class Harness:
    """One Pipecat pipeline (user aggregator, the realtime service, the assistant aggregator) run by Pipecat's
    own worker, with a recorder each side of the service: every frame it pushes, with its arrival time."""

    def __init__(self, llm, context) -> None:
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

        seen: list[tuple[float, object]] = []

        class Recorder(FrameProcessor):
            async def process_frame(self, frame, direction):
                await super().process_frame(frame, direction)
                seen.append((time.perf_counter(), frame))
                await self.push_frame(frame, direction)

        self.seen, self.context = seen, context
        pair = LLMContextAggregatorPair(context)
        self.worker = PipelineWorker(Pipeline([pair.user(), Recorder(), llm, Recorder(), pair.assistant()]),
                                     cancel_on_idle_timeout=False, params=PipelineParams())
        self.started = asyncio.Event()
        self.down = FrameDirection.DOWNSTREAM

        @self.worker.event_handler("on_pipeline_started")
        async def _started(worker, frame):
            self.started.set()

    def no_error(self) -> None:
        """Pipecat ends the session on any server ``error``: fail at once rather than wait out the timeout."""
        from pipecat.frames.frames import ErrorFrame

        if self.of(ErrorFrame):
            raise AssertionError(f"Pipecat reported an error: {self.of(ErrorFrame)}")

    def of(self, kind, since: float = 0.0) -> list[tuple[float, object]]:
        return [(t, f) for t, f in self.seen if isinstance(f, kind) and t >= since]

    async def opening_turn(self, timeout: float = 60) -> None:
        """Pipecat runs the model on its first context: wait for that opening response to end and go quiet."""
        from pipecat.frames.frames import LLMFullResponseEndFrame, TTSAudioRawFrame

        deadline = time.perf_counter() + timeout
        while not self.of(LLMFullResponseEndFrame) and time.perf_counter() < deadline:
            self.no_error()
            await asyncio.sleep(0.1)
        await self.quiet(TTSAudioRawFrame, 1.0, timeout=max(1.0, deadline - time.perf_counter()))

    def responded(self, since: float, settle_s: float = 1.0) -> bool:
        """A response with audio, begun after ``since``, ended ``settle_s`` ago (its last events are in)."""
        from pipecat.frames.frames import LLMFullResponseEndFrame, TTSAudioRawFrame

        audio = self.of(TTSAudioRawFrame, since)
        ends = self.of(LLMFullResponseEndFrame, audio[0][0]) if audio else []
        return bool(ends) and time.perf_counter() - ends[0][0] > settle_s

    async def quiet(self, kind, for_s: float, timeout: float) -> None:
        """Wait until no ``kind`` frame has arrived for ``for_s`` seconds (bounded by ``timeout``)."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            last = max((t for t, _ in self.of(kind)), default=0.0)
            if time.perf_counter() - last >= for_s:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"still receiving {kind.__name__} after {timeout} s")

    async def say(self, pcm: bytes, until, timeout: float) -> float:
        """Stream ``pcm`` in real time, then the microphone's silence until ``until()`` holds; returns the
        instant the last speech chunk went out."""
        from pipecat.frames.frames import InputAudioRawFrame

        t0, sent_end = time.perf_counter(), 0.0
        deadline = t0 + timeout
        k = 0
        while time.perf_counter() < deadline:
            chunk = pcm[k * CHUNK:(k + 1) * CHUNK] or b"\x00" * CHUNK
            await asyncio.sleep(max(0.0, t0 + k * 0.04 - time.perf_counter()))
            await self.worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1), self.down)
            k += 1
            if k * CHUNK >= len(pcm) and not sent_end:
                sent_end = time.perf_counter()
            self.no_error()
            if sent_end and until():
                return sent_end
        shown = [type(f).__name__ for _, f in self.seen if not isinstance(f, InputAudioRawFrame)]
        raise AssertionError(f"not done within {timeout} s: {shown[-30:]}")


def spoken(text: str) -> bytes:
    """``text`` in the preset's Piper voice, as 24 kHz PCM16 with 0.3 s of lead and trailing silence."""
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    return float_to_pcm16(speech_with_silence(tts.synthesize(text), tts.sample_rate, lead_s=0.3, tail_s=0.3))


async def run(h: Harness, scenario, timeout: float = 150) -> None:
    """Run the pipeline while ``scenario`` drives it, then end it with an ``EndFrame`` (session closed)."""
    await run_pipeline(h.worker, h.started, scenario, timeout)


def text_of(h: Harness, kind, since: float = 0.0) -> str:
    return "".join(f.text for _, f in h.of(kind, since))


async def test_pipecat_realtime_answers_a_spoken_question(live_server, speech_samples):
    from pipecat.frames.frames import ErrorFrame, LLMContextFrame, TranscriptionFrame, TTSAudioRawFrame, TTSTextFrame
    from pipecat.processors.aggregators.llm_context import LLMContext

    context = LLMContext(messages=[{"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."}])
    llm = rt_llm.OpenAIRealtimeLLMService(api_key="unused", base_url=f"{live_server.ws_url}/v1/realtime")
    h = Harness(llm, context)
    audio, sr, _ = speech_samples["capital"]
    question = float_to_pcm16(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.3))
    marks: dict[str, float] = {}

    async def scenario():
        await h.worker.queue_frame(LLMContextFrame(context))
        await h.opening_turn()
        marks["asked"] = time.perf_counter()
        marks["end"] = await h.say(question, lambda: h.responded(marks["asked"]), timeout=60)

    await run(h, scenario)
    assert not h.of(ErrorFrame), h.of(ErrorFrame)
    assert not h.of(TranscriptionFrame)  # input transcription is off unless the session asks for it, as at OpenAI
    answer = h.of(TTSAudioRawFrame, marks["end"])
    pcm = np.frombuffer(b"".join(f.audio for _, f in answer), np.int16)
    assert len(pcm) > 24000 and np.abs(pcm).max() > 1000
    said = text_of(h, TTSTextFrame, marks["end"])
    print(f"\nPipecat realtime: first answer audio {1000 * (answer[0][0] - marks['end']):.0f} ms after the question's "
          f"last chunk (speech ended 300 ms before it); said {said!r}")
    assert heard("paris", said) or "france" in said.lower(), said


async def test_pipecat_realtime_slow_tool_preamble_then_answer(live_server):
    """``tool_choice: "required"`` for the question's response through Pipecat's own settings (an
    ``LLMUpdateSettingsFrame`` with ``session_properties``; the 135M thinker would often answer without the tool
    otherwise), set after Pipecat's opening turn (which runs before any user speaks and must not call the tool)
    and back to ``auto`` when the tool starts, as the Agents SDK test does. Pipecat's first ``session.update``
    goes out before it has the context's tools, so ``required`` cannot be in the constructor's settings: the
    server refuses ``required`` with no tools, and Pipecat ends the session on any ``error``."""
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (ErrorFrame, FunctionCallInProgressFrame, FunctionCallResultFrame, LLMContextFrame,
                                       LLMUpdateSettingsFrame, TranscriptionFrame, TTSAudioRawFrame, TTSTextFrame)
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.services.llm_service import FunctionCallParams

    Settings, SP = rt_llm.OpenAIRealtimeLLMService.Settings, rt_llm.events.SessionProperties
    order_status = FunctionSchema(name="get_order_status", description="The delivery status of a customer's order.",
                                  properties={"order_id": {"type": "string"}}, required=["order_id"])
    context = LLMContext(messages=[{"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."}],
                         tools=ToolsSchema(standard_tools=[order_status]))
    ev = rt_llm.events  # the user's words too, as a Pipecat app asks for them
    hear = ev.AudioConfiguration(input=ev.AudioInput(transcription=ev.InputAudioTranscription()))
    llm = rt_llm.OpenAIRealtimeLLMService(api_key="unused", base_url=f"{live_server.ws_url}/v1/realtime",
                                          settings=Settings(session_properties=SP(audio=hear)))
    h = Harness(llm, context)
    calls: list[tuple[float, float, dict]] = []

    async def get_order_status(params: FunctionCallParams):
        start = time.perf_counter()
        await llm.queue_frame(LLMUpdateSettingsFrame(delta=Settings(session_properties=SP(tool_choice="auto", audio=hear))))
        await asyncio.sleep(3.0)  # a real backend taking its time
        calls.append((start, time.perf_counter(), dict(params.arguments)))
        await params.result_callback("The order has shipped and arrives on Tuesday.")

    llm.register_function("get_order_status", get_order_status)
    question = spoken("Where is my order 42?")
    marks: dict[str, float] = {}

    def answered() -> bool:
        if not calls:
            return False
        after = h.of(TTSTextFrame, calls[0][1])
        return bool(after) and time.perf_counter() - after[-1][0] > 2.0 and time.perf_counter() - calls[0][1] > 4.0

    async def scenario():
        await h.worker.queue_frame(LLMContextFrame(context))
        await h.opening_turn()
        await h.worker.queue_frame(LLMUpdateSettingsFrame(delta=Settings(session_properties=SP(tool_choice="required", audio=hear))))
        marks["asked"] = time.perf_counter()
        marks["end"] = await h.say(question, answered, timeout=90)

    await run(h, scenario)
    assert not h.of(ErrorFrame), h.of(ErrorFrame)
    assert len(calls) == 1, calls
    started, ended, args = calls[0]
    assert "42" in str(args.get("order_id", "")), args
    asked = text_of(h, TranscriptionFrame)
    assert "order" in asked.lower(), asked
    assert len({f.tool_call_id for _, f in h.of(FunctionCallInProgressFrame)}) == 1  # each recorder sees the broadcast
    preamble = [(t, f) for t, f in h.of(TTSAudioRawFrame, marks["end"]) if t < ended]
    assert sum(len(f.audio) for _, f in preamble) > 24000, "no preamble audio while the tool ran"
    result_t = h.of(FunctionCallResultFrame)[0][0]
    answer = h.of(TTSTextFrame, result_t)
    said = "".join(f.text for _, f in answer)
    first = h.of(TTSAudioRawFrame, result_t)[0][0]
    words = "".join(f.text for t, f in h.of(TTSTextFrame, marks["end"]) if t < ended)
    print(f"\nPipecat realtime tool: first audio {1000 * (preamble[0][0] - marks['end']):.0f} ms after the question's last "
          f"chunk (speech ended 300 ms before it), tool ran {ended - started:.1f} s, answer audio {1000 * (first - result_t):.0f} ms "
          f"after its result ({1000 * (first - marks['end']):.0f} ms after the question); preamble {words!r}; answer {said!r}")
    assert words.strip(), "the preamble's transcript"
    assert any(w in said.lower() for w in ("tuesday", "shipped")), said
