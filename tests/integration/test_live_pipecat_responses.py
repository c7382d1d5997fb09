"""Pipecat's GPT-Live service (``OpenAILiveLLMService``) in Responses delegation, unchanged but for its
``base_url``, against a live CPU server started with ``--delegate``: the backend is SmolLM2 behind omni-rt's
own OpenAI-compatible chat server (any such server would do). A spoken question is delegated
(``session.delegation.created`` with target ``responses``), the voice says its preamble at once, and the
backend's answer is spoken when it arrives; Pipecat sees the preamble and the answer as its speech output. A
function tool in the context, registered with ``register_function``, is called by the backend, Pipecat answers it
(``response.item.create`` + ``response.create``), and the continuation's answer is spoken."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from pipecat_helpers import run_pipeline
from rt_helpers import heard, speech_with_silence

from omni_rt.audio.pcm import float_to_pcm16

pytest.importorskip("loguru", reason="Pipecat's runtime deps come with the test extra")
live_llm = pytest.importorskip("pipecat.services.openai.live.llm")

CHUNK = 1920  # 40 ms of 24 kHz PCM16
PREAMBLE = "Let me check that."


class Call:
    """Pipecat's Live service in Responses delegation, run by Pipecat's own worker with a recorder each side of
    it (every frame it pushes, with its arrival time), fed a spoken question in real time."""

    def __init__(self, server, context, **responses) -> None:
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.processors.frame_processor import FrameProcessor
        from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService

        seen: list[tuple[float, object]] = []
        backend_text: list[str] = []

        class Recorder(FrameProcessor):
            async def process_frame(self, frame, direction):
                await super().process_frame(frame, direction)
                seen.append((time.perf_counter(), frame))
                await self.push_frame(frame, direction)

        class Service(live_llm.OpenAILiveLLMService):
            """Pipecat's service as it is, with a look at the delegated response's text as it streams by."""

            async def _handle_evt_response(self, evt):
                if evt.inner_type == "response.output_text.delta":
                    backend_text.append(evt.event.get("delta", ""))
                await super()._handle_evt_response(evt)

        self.seen, self.backend_text, self.context = seen, backend_text, context
        self.llm = Service(api_key="unused", base_url=f"{server.ws_url}/v1/live/sessions",
                           delegation=live_llm.OpenAILiveLLMService.ResponsesDelegation(
                               settings=OpenAIResponsesLLMService.Settings(model="smollm2", **responses)))
        self.delegations: list[tuple[float, object]] = []
        self.end = 0.0  # the speaker's last word

        @self.llm.event_handler("on_delegation_created")
        async def _delegated(service, delegation):
            self.delegations.append((time.perf_counter(), delegation))

        self.worker = PipelineWorker(Pipeline([Recorder(), self.llm, Recorder()]), cancel_on_idle_timeout=False,
                                     params=PipelineParams())
        self.started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def _started(w, frame):
            self.started.set()

    def of(self, kind, since: float = 0.0) -> list[tuple[float, object]]:
        return [(t, f) for t, f in self.seen if isinstance(f, kind) and t >= since]

    def said(self, since: float = 0.0) -> str:
        from pipecat.frames.frames import TTSTextFrame

        return "".join(f.text for _, f in self.of(TTSTextFrame, since))

    def spoken_after_preamble(self, quiet_s: float = 2.0) -> bool:
        """A delegation, its preamble and more words after it, the last of them ``quiet_s`` ago."""
        from pipecat.frames.frames import TTSTextFrame

        text = self.said(self.end).strip()
        return bool(self.delegations) and text.startswith(PREAMBLE) and bool(text.removeprefix(PREAMBLE).strip()) \
            and time.perf_counter() - self.of(TTSTextFrame)[-1][0] > quiet_s

    async def run(self, pcm: bytes, until, timeout: float = 90) -> None:
        """The context, 1.5 s, the question in real time, then the microphone's silence until ``until()``; the
        pipeline's ``EndFrame`` closes the session."""
        from pipecat.frames.frames import ErrorFrame, InputAudioRawFrame, LLMContextFrame

        async def drive():
            await self.worker.queue_frame(LLMContextFrame(self.context))
            await asyncio.sleep(1.5)
            t0, k = time.perf_counter(), 0
            while time.perf_counter() - t0 < timeout:
                chunk = pcm[k * CHUNK:(k + 1) * CHUNK] or b"\x00" * CHUNK
                await asyncio.sleep(max(0.0, t0 + k * 0.04 - time.perf_counter()))
                await self.worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1))
                k += 1
                if k * CHUNK >= len(pcm) and not self.end:
                    self.end = time.perf_counter()
                assert not self.of(ErrorFrame), self.of(ErrorFrame)
                if self.end and until():
                    return
            raise AssertionError(f"not done within {timeout} s: delegations {self.delegations}, said {self.said()!r}")

        await run_pipeline(self.worker, self.started, drive, timeout + 10)
        assert not self.of(ErrorFrame), self.of(ErrorFrame)

    def first_voiced(self, since: float) -> float:
        from pipecat.frames.frames import SpeechOutputAudioRawFrame

        return next(t for t, f in self.of(SpeechOutputAudioRawFrame, since)
                    if np.abs(np.frombuffer(f.audio, np.int16)).max(initial=0) > 1000)


def system_context(**kw):
    from pipecat.processors.aggregators.llm_context import LLMContext

    return LLMContext(messages=[{"role": "system", "content": "You are a helpful voice assistant."}], **kw)


async def test_pipecat_responses_delegation_preamble_then_backend_answer(responses_server, speech_samples):
    from pipecat.frames.frames import TranscriptionFrame, TTSTextFrame

    call = Call(responses_server, system_context(), system_instruction="Answer in one short sentence.")
    audio, sr, _ = speech_samples["capital"]
    await call.run(float_to_pcm16(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.0)), call.spoken_after_preamble)
    asked = " ".join(f.text for _, f in call.of(TranscriptionFrame))
    assert "capital" in asked.lower() or "france" in asked.lower(), asked
    assert len(call.delegations) == 1 and call.delegations[0][1].target == "responses", call.delegations
    text = call.said(call.end).strip()
    answer = text.removeprefix(PREAMBLE).strip()
    preamble_t = call.first_voiced(call.end)
    words = call.of(TTSTextFrame, call.end)
    answer_t = next(t for t, _ in words if "".join(g.text for u, g in words if u <= t).strip() not in ("", PREAMBLE))
    backend = "".join(call.backend_text)
    print(f"\nPipecat Live responses delegation: preamble audio {1000 * (preamble_t - call.end):.0f} ms after the "
          f"last word, delegation created {1000 * (call.delegations[0][0] - call.end):.0f} ms, backend answer's first words "
          f"{1000 * (answer_t - call.end):.0f} ms; heard {asked!r}; backend {backend!r}; said {text!r}")
    assert preamble_t - call.end < 5.0
    assert "paris" in backend.lower()  # the backend got the question (not the preamble) last
    assert heard("paris", answer), answer  # and its answer is what the voice says


async def test_pipecat_responses_delegation_function_tool(responses_server):
    """``tool_choice: "required"`` in the context (the 135M backend would answer without the tool otherwise),
    set to ``none`` through Pipecat's own ``LLMSetToolsFrame`` when the tool starts, as an app would once it has
    what it needs: the continuation answers from the result instead of calling again."""
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import LLMSetToolsFrame
    from pipecat.services.llm_service import FunctionCallParams

    from omni_rt.backends.tts_piper import PiperTTS

    weather = FunctionSchema(name="get_weather", description="Current weather in a city.",
                             properties={"city": {"type": "string"}}, required=["city"])
    context = system_context(tools=ToolsSchema(standard_tools=[weather]), tool_choice="required")
    call = Call(responses_server, context, system_instruction="Answer in one short sentence.")
    calls: list[tuple[float, dict]] = []

    async def get_weather(params: FunctionCallParams):
        calls.append((time.perf_counter(), dict(params.arguments)))
        context.set_tool_choice("none")
        await call.llm.queue_frame(LLMSetToolsFrame(tools=context.tools))
        await asyncio.sleep(0.5)  # a quick lookup; the session.update goes out before the result
        await params.result_callback("Sunny, 21 degrees.")

    call.llm.register_function("get_weather", get_weather)
    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    pcm = float_to_pcm16(speech_with_silence(tts.synthesize("What is the weather in Paris?"), tts.sample_rate, lead_s=0.3, tail_s=0.0))

    def answered() -> bool:
        return bool(calls) and bool(call.said(calls[0][0]).strip()) and call.spoken_after_preamble()

    await call.run(pcm, answered)
    assert len(calls) == 1, calls
    assert "paris" in str(calls[0][1].get("city", "")).lower(), calls
    answer = call.said(calls[0][0]).strip()
    print(f"\nPipecat Live responses tool: called {1000 * (calls[0][0] - call.end):.0f} ms after the last word with "
          f"{calls[0][1]}; backend {''.join(call.backend_text)!r}; said {call.said(call.end)!r}")
    assert any(w in answer.lower() for w in ("sunny", "21", "twenty")), answer
