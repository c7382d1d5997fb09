"""Pipecat's GPT-Live service (``OpenAILiveLLMService``) in Responses delegation, unchanged but for its
``base_url``, against a live CPU server started with ``--delegate``: the backend is SmolLM2 behind omni-rt's
own OpenAI-compatible chat server (any such server would do). A spoken question is delegated
(``session.delegation.created`` with target ``responses``), the voice says its preamble at once, and the
backend's answer is spoken when it arrives; Pipecat sees the preamble and the answer as its speech output."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from rt_helpers import heard, speech_with_silence

from omni_rt.audio.pcm import float_to_pcm16

pytest.importorskip("loguru", reason="Pipecat's runtime deps come with the test extra")
live_llm = pytest.importorskip("pipecat.services.openai.live.llm")

CHUNK = 1920  # 40 ms of 24 kHz PCM16
PREAMBLE = "Let me check that."


@pytest.fixture(scope="module")
def backend_url():
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app

    sched = create_ar_scheduler("smollm2", max_batch_size=2, default_max_tokens=40)
    server = ServerThread(create_app(sched, model_name="smollm2")).start(timeout=120)
    yield server.base_url
    server.stop()


@pytest.fixture(scope="module")
def responses_server(tmp_path_factory, backend_url):
    from servers import start_server, stop_server

    server = start_server(tmp_path_factory.mktemp("live-pipecat-responses"), "--live-delegation", "always",
                          "--delegate", backend_url, "--max-sessions", "2")
    yield server
    stop_server(server)


async def test_pipecat_responses_delegation_preamble_then_backend_answer(responses_server, speech_samples):
    from pipecat.frames.frames import (EndFrame, ErrorFrame, InputAudioRawFrame, LLMContextFrame, SpeechOutputAudioRawFrame,
                                       TranscriptionFrame, TTSTextFrame)
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService
    from pipecat.workers.runner import WorkerRunner

    seen: list[tuple[float, object]] = []

    class Recorder(FrameProcessor):  # every frame the service pushes, either way, with its arrival time
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            seen.append((time.perf_counter(), frame))
            await self.push_frame(frame, direction)

    def of(kind, since: float = 0.0) -> list[tuple[float, object]]:
        return [(t, f) for t, f in seen if isinstance(f, kind) and t >= since]

    backend_text: list[str] = []

    class Service(live_llm.OpenAILiveLLMService):
        """Pipecat's service as it is, with a look at the delegated response's text as it streams by."""

        async def _handle_evt_response(self, evt):
            if evt.inner_type == "response.output_text.delta":
                backend_text.append(evt.event.get("delta", ""))
            await super()._handle_evt_response(evt)

    llm = Service(
        api_key="unused", base_url=f"{responses_server.ws_url}/v1/live/sessions",
        delegation=live_llm.OpenAILiveLLMService.ResponsesDelegation(
            settings=OpenAIResponsesLLMService.Settings(model="smollm2", system_instruction="Answer in one short sentence.")))
    delegations: list[tuple[float, object]] = []

    @llm.event_handler("on_delegation_created")
    async def on_delegation(service, delegation):
        delegations.append((time.perf_counter(), delegation))

    worker = PipelineWorker(Pipeline([Recorder(), llm, Recorder()]), cancel_on_idle_timeout=False, params=PipelineParams())
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(w, frame):
        started.set()

    audio, sr, _ = speech_samples["capital"]
    pcm = float_to_pcm16(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.0))
    marks: dict[str, float] = {}

    def said(since: float = 0.0) -> str:
        return "".join(f.text for _, f in of(TTSTextFrame, since))

    def answered() -> bool:  # the preamble and then the backend's answer, spoken and finished 2 s ago
        text = said(marks["end"]).strip()
        return bool(delegations) and text.startswith(PREAMBLE) and bool(text.removeprefix(PREAMBLE).strip()) \
            and time.perf_counter() - of(TTSTextFrame)[-1][0] > 2.0

    async def drive():
        try:
            await asyncio.wait_for(started.wait(), timeout=30)
            await worker.queue_frame(LLMContextFrame(LLMContext(messages=[
                {"role": "system", "content": "You are a helpful voice assistant."}])))
            await asyncio.sleep(1.5)
            t0, k = time.perf_counter(), 0
            while time.perf_counter() - t0 < 90:  # the question in real time, then the microphone's silence
                chunk = pcm[k * CHUNK:(k + 1) * CHUNK] or b"\x00" * CHUNK
                await asyncio.sleep(max(0.0, t0 + k * 0.04 - time.perf_counter()))
                await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1))
                k += 1
                if k * CHUNK >= len(pcm) and "end" not in marks:
                    marks["end"] = time.perf_counter()  # the speaker's last word
                assert not of(ErrorFrame), of(ErrorFrame)
                if "end" in marks and answered():
                    return
            raise AssertionError(f"no delegated answer within 90 s: delegations {delegations}, said {said()!r}")
        finally:
            await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    async with asyncio.timeout(150):
        await asyncio.gather(runner.run(), drive())

    assert not of(ErrorFrame), of(ErrorFrame)
    asked = " ".join(f.text for _, f in of(TranscriptionFrame))
    assert "capital" in asked.lower() or "france" in asked.lower(), asked
    assert len(delegations) == 1 and delegations[0][1].target == "responses", delegations
    text = said(marks["end"]).strip()
    answer = text.removeprefix(PREAMBLE).strip()
    voiced = [(t, f) for t, f in of(SpeechOutputAudioRawFrame, marks["end"])
              if np.abs(np.frombuffer(f.audio, np.int16)).max(initial=0) > 1000]
    assert voiced, "no speech after the question"
    preamble_t = voiced[0][0]
    words = of(TTSTextFrame, marks["end"])
    answer_t = next(t for t, f in words if "".join(g.text for _, g in words if _ <= t).strip() != PREAMBLE
                    and "".join(g.text for _, g in words if _ <= t).strip().startswith(PREAMBLE))
    print(f"\nPipecat Live responses delegation: preamble audio {1000 * (preamble_t - marks['end']):.0f} ms after the "
          f"last word, delegation created {1000 * (delegations[0][0] - marks['end']):.0f} ms, backend answer's first words "
          f"{1000 * (answer_t - marks['end']):.0f} ms; heard {asked!r}; backend {''.join(backend_text)!r}; said {text!r}")
    assert preamble_t - marks["end"] < 5.0
    assert "paris" in "".join(backend_text).lower()  # the backend got the question (not the preamble) last
    assert heard("paris", answer), answer  # and its answer is what the voice says
