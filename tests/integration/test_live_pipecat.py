"""Pipecat's GPT-Live service (``OpenAILiveLLMService``), unchanged but for its ``base_url``, against the live
CPU server: Pipecat's own test runner streams a spoken question as ``InputAudioRawFrame``s in real time; the
user's words come back as Pipecat's ``TranscriptionFrame`` and the answer as its speech output audio, and the
pipeline's end closes the session (``session.close`` -> ``session.closed``) without an error frame."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from rt_helpers import heard, pcm_chunks_b64, speech_with_silence

pytest.importorskip("loguru", reason="Pipecat's runtime deps come with the test extra")
live_llm = pytest.importorskip("pipecat.services.openai.live.llm")


async def test_pipecat_live_service_hears_and_answers(live_server, speech_samples):
    from pipecat.frames.frames import ErrorFrame, InputAudioRawFrame, LLMContextFrame, SpeechOutputAudioRawFrame, TranscriptionFrame
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.tests.utils import SleepFrame, run_test

    audio, sr, _ = speech_samples["capital"]
    chunks = [base64.b64decode(c) for c in pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)]
    silence = b"\x00" * 1920
    frames: list = [LLMContextFrame(LLMContext(messages=[{"role": "system", "content": "You are a helpful voice assistant."}])),
                    SleepFrame(1.5)]
    for chunk in chunks + [silence] * 150:  # speech, then 6 s of the microphone's silence, in real time
        frames += [InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1), SleepFrame(0.04)]
    llm = live_llm.OpenAILiveLLMService(api_key="unused", base_url=f"{live_server.ws_url}/v1/live/sessions")
    down, up = await run_test(llm, frames_to_send=frames, start_timeout=10.0)
    errors = [f for f in [*down, *up] if isinstance(f, ErrorFrame)]
    assert not errors, errors
    asked = " ".join(f.text for f in up if isinstance(f, TranscriptionFrame))  # pushed upstream, to the user aggregator
    assert heard("france", asked) or "capital" in asked.lower(), asked
    out = [f for f in down if isinstance(f, SpeechOutputAudioRawFrame)]
    pcm = np.frombuffer(b"".join(f.audio for f in out), np.int16)
    assert len(pcm) > 24000 * 4 and np.abs(pcm).max() > 1000  # the continuous stream, with the answer in it


@pytest.fixture(scope="module")
def backend_chat_server():
    """The client's backend: SmolLM2 behind omni-rt's OpenAI-compatible chat server, which Pipecat's
    ``OpenAILLMService`` talks to as it would to any chat-completions endpoint."""
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app

    sched = create_ar_scheduler("smollm2", max_batch_size=2, default_max_tokens=48)
    server = ServerThread(create_app(sched, model_name="smollm2")).start(timeout=120)
    yield server
    server.stop()


async def test_pipecat_client_delegation_backend_answer_spoken(delegating_server, backend_chat_server, speech_samples):
    """Pipecat's ``ClientDelegation`` with its ``BackendLLMWorker``: the server delegates the spoken question,
    the voice says its preamble, Pipecat runs the backend on the transcript and appends its answer with the
    delegation id, and the voice speaks again."""
    import dataclasses

    from pipecat.frames.frames import ErrorFrame, InputAudioRawFrame, LLMContextFrame, TTSTextFrame
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.tests.utils import SleepFrame, run_test
    from pipecat.workers.llm.backend_llm_worker import BackendLLMWorker

    async def spoken(output):  # the app's choice: everything the backend says is for the user
        return dataclasses.replace(output, prefers_spoken=True)

    backend = BackendLLMWorker(llm=OpenAILLMService(api_key="unused", base_url=backend_chat_server.base_url,
                                                    settings=OpenAILLMService.Settings(model="smollm2")),
                               transform_output=spoken)
    llm = live_llm.OpenAILiveLLMService(api_key="unused", base_url=f"{delegating_server.ws_url}/v1/live/sessions",
                                        delegation=live_llm.OpenAILiveLLMService.ClientDelegation(backend=backend))
    delegations = []

    @llm.event_handler("on_delegation_created")
    async def on_delegation(service, delegation):
        delegations.append(delegation)

    audio, sr, _ = speech_samples["capital"]
    chunks = [base64.b64decode(c) for c in pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)]
    frames: list = [LLMContextFrame(LLMContext(messages=[{"role": "system", "content": "You are a helpful voice assistant."}])),
                    SleepFrame(1.5)]
    for chunk in chunks + [b"\x00" * 1920] * 375:  # speech, then 15 s of silence in real time
        frames += [InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1), SleepFrame(0.04)]
    down, up = await run_test(llm, frames_to_send=frames, start_timeout=10.0)
    assert not [f for f in [*down, *up] if isinstance(f, ErrorFrame)]
    assert len(delegations) == 1 and delegations[0].target == "client"
    said = "".join(f.text for f in down if isinstance(f, TTSTextFrame))
    print("the voice said:", said)
    assert said.startswith("Let me check that.")
    assert said.removeprefix("Let me check that.").strip()  # the backend's answer, relayed
