"""The GPU preset's code paths on CPU: tiny random-init Whisper, Qwen2 thinker, Llama codec LM and a random
SNAC, built from configs, saved, and loaded back through the same factories the gpu preset names. Also the codec
talker's two stages on their own: clause prompts (token budget from the words, Orpheus start tokens) and the
codec LM as a plain AR stage running a response's prompts in order (streamed requests)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import yaml

from omni_rt.presets import PRESET_DIR, load_preset
from omni_rt.contracts.audio_in import AudioInSettings, CommitAudioIn, OpenAudioIn
from omni_rt.contracts.payloads import AsrError, SpeechPrompt, TranscriptFinal
from omni_rt.pipeline.config import PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator, ResultItem, StreamItem


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, WhisperConfig,
                              WhisperFeatureExtractor, WhisperForConditionalGeneration)

    from omni_rt.engine.weights.loader import ensure_smollm2, load_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    tok = load_tokenizer(ensure_smollm2())
    torch.manual_seed(0)
    whisper = WhisperForConditionalGeneration(WhisperConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512, num_mel_bins=80, max_source_positions=1500,
        max_target_positions=448, decoder_start_token_id=1, eos_token_id=2, pad_token_id=2, bos_token_id=1))
    whisper.generation_config.forced_decoder_ids = None
    whisper.save_pretrained(root / "whisper")
    WhisperFeatureExtractor(feature_size=80).save_pretrained(root / "whisper")
    thinker = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=2048,
                                           eos_token_id=tok.eos_token_id, tie_word_embeddings=True))
    thinker.save_pretrained(root / "thinker")
    tok.save_pretrained(root / "thinker")
    # the codec talker keeps Orpheus' real vocabulary layout: specials at 128257.. and SNAC codes from 128266
    talker = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=128266 + 7 * 4096, max_position_embeddings=4096,
                                          eos_token_id=128258, tie_word_embeddings=False))
    with torch.no_grad():  # random weights would rarely pick audio codes; make them the likely tokens, as trained ones are
        talker.lm_head.weight[:128266] = 0
        talker.lm_head.weight[128266:] *= 100
    talker.save_pretrained(root / "talker")
    tok.save_pretrained(root / "talker")
    return root


def gpu_like_config(root) -> PipelineConfig:
    """The gpu preset file, with local tiny weights and CPU devices: same factories, same routing."""
    data = yaml.safe_load((PRESET_DIR / "gpu.yaml").read_text())
    args = {
        "asr": {"model": str(root / "whisper"), "device": "cpu"},
        "thinker": {"model": str(root / "thinker"), "device": "cpu", "dtype": "float32", "max_batch_size": 4},
        "talker": {"tokenizer": str(root / "talker"), "max_tokens_per_clause": 7 * 6, "ignore_eos": True, "temperature": 1.0},
        "codec_lm": {"model": str(root / "talker"), "device": "cpu", "dtype": "float32", "max_batch_size": 4},
        "vocoder": {"model": None, "random_init": True, "device": "cpu"},
    }
    for st in data["stages"]:
        st["args"] = {k: v for k, v in {**st["args"], **args[st["name"]]}.items() if k != "cuda_graphs"}
    return PipelineConfig.model_validate(copy.deepcopy(data))


def test_gpu_preset_loads_and_names_its_models():
    cfg = load_preset("gpu")
    assert [s.name for s in cfg.stages] == ["asr", "thinker", "talker", "codec_lm", "vocoder"]
    assert cfg.stage("talker").factory.endswith("create_speech_prompts")
    assert cfg.stage("codec_lm").factory.endswith("create_ar_scheduler")  # a normal AR stage, no nested scheduler


@pytest.mark.integration  # a real model runs for seconds
async def test_gpu_preset_paths_on_cpu(tiny_models, speech_samples):
    coord = Coordinator(gpu_like_config(tiny_models))
    await coord.start()
    try:
        # ASR: transformers Whisper behind the session stage produces a final transcript for a spoken turn
        events = []
        coord.open_session("s1", "asr", OpenAudioIn(AudioInSettings(None, partials=False)), lambda stage, ev: events.append(ev))
        audio, sr, _ = speech_samples["capital"]
        from omni_rt.audio.pcm import resample

        coord.append("s1", "asr", resample(audio, sr, 16000))
        coord.session_control("s1", "asr", CommitAudioIn())
        import asyncio

        async with asyncio.timeout(60):
            while not any(isinstance(e, TranscriptFinal) for e in events):
                assert not [e for e in events if isinstance(e, AsrError)], events
                await asyncio.sleep(0.05)
        coord.close_session("s1")

        # response: random thinker (fixed length) -> codec talker -> SNAC vocoder, streamed
        payload = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "ignore_eos": True,
                   "temperature": 1.0, "seed": 3}  # random weights: sample, or greedy repeats one token
        text, audio_chunks, result = [], [], None
        async with asyncio.timeout(120):
            async for item in coord.stream("r1", payload, entry="thinker"):
                if isinstance(item, StreamItem) and item.stage == "thinker":
                    text.append(item.data.text)
                elif isinstance(item, StreamItem) and item.stage == "vocoder":
                    audio_chunks.append(np.frombuffer(item.data.pcm, dtype=np.int16))
                elif isinstance(item, ResultItem):
                    result = item.data
        assert result is not None and result["completion_tokens"] == 16
        assert result["frames"] > 0
        # every clause was its own codec request, each cut at the (capped) budget of 6 frames; a random model
        # also samples a few non-code tokens, which the vocoder skips (at most 6 whole frames per clause)
        assert result["segments"] == len(result["spoken_clauses"]) >= 2
        assert result["segment_tokens"] == 7 * 6 * result["segments"] and result["frames"] <= 6 * result["segments"]
        total = sum(len(a) for a in audio_chunks)
        assert total == result["output_samples"] == result["frames"] * 2048
        assert len(audio_chunks) >= 2, "SNAC audio should stream in several chunks"
        await asyncio.sleep(0.2)
        assert coord.live_total() == 0
    finally:
        await coord.stop()


# ---- the codec talker's two stages on their own -------------------------------------------------------
def test_clause_budget_covers_slow_speech():
    """No mid-word cut: a clause's budget is whole frames for it spoken at 80 words/min or 8 chars/s (slower
    than any Orpheus voice), so the old 48-frame cap (4 s, cutting 24-word clauses) is gone."""
    from omni_rt.stages.talker.speech_prompts import FRAMES_PER_SECOND, clause_token_budget

    for clause in ["Yes.", "The capital of France is Paris.", "Internationalization considerations notwithstanding,",
                   " ".join(["word"] * 24), "Call 555 0134 or 1-800-275-2273 before 12:45."]:
        budget = clause_token_budget(clause)
        seconds = budget / 7 / FRAMES_PER_SECOND
        assert budget % 7 == 0, clause
        assert seconds >= 0.75 * len(clause.split()) and seconds >= len(clause) / 8, (clause, seconds)
    assert clause_token_budget(" ".join(["word"] * 24)) > 7 * 48 * 4


def test_speech_prompts_are_orpheus_prompts_with_start_tokens(tiny_models):
    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.contracts.payloads import SpeechPrompt, TextDelta
    from omni_rt.stages.talker.speech_prompts import (END_OF_HUMAN, END_OF_SPEECH, START_OF_AI, START_OF_HUMAN, START_OF_SPEECH,
                                               clause_token_budget, create_speech_prompts)

    sched = create_speech_prompts(str(tiny_models / "talker"))
    sched.set_stream_sources(["thinker"])
    sched.start()
    try:
        answer = "Sure thing, the capital of France is Paris, which sits on the Seine. It is lovely in spring."
        for i in range(0, len(answer), 7):
            sched.inbox.put(IncomingMessage("r", "stream_chunk", TextDelta(answer[i:i + 7]), "thinker"))
        sched.inbox.put(IncomingMessage("r", "stream_done", None, "thinker"))
        sched.inbox.put(IncomingMessage("r", "new_request", {"text": answer}, "thinker"))
        prompts, result = [], None
        while result is None:
            msg = sched.outbox.get(timeout=30)
            if msg.type == "stream":
                prompts.append(msg.data)
            else:
                result = msg.data
    finally:
        sched.stop()
    assert len(prompts) >= 2 and all(isinstance(p, SpeechPrompt) for p in prompts)
    assert " ".join(p.text for p in prompts).split() == answer.split(), "every word is spoken once, in order"
    assert result["spoken_clauses"] == [p.text for p in prompts]
    for p in prompts:
        ids = p.request["prompt_ids"]
        assert ids[0] == START_OF_HUMAN and ids[-3:] == [END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]
        assert p.request["max_tokens"] == clause_token_budget(p.text)
        assert p.request["stop_token_ids"] == [END_OF_SPEECH] and p.request["output"] == "tokens"
        assert p.request["token_chunk"] == 7, "the codec LM streams one 7-code frame per message"
        assert p.request["repetition_penalty"] == 1.1


def _prompt(n: int, first: int) -> SpeechPrompt:
    return SpeechPrompt(f"clause {first}", {"prompt_ids": [128259, first, first + 1, 128260], "output": "tokens",
                                            "max_tokens": n, "ignore_eos": True})


def test_codec_lm_abort_mid_segment_leaks_no_inner_id(tiny_models):
    """Aborting a response while one of its prompts is generating stops it, and nothing that segment still
    emits (its tokens, its abort result) leaves under the internal segment id."""
    import time

    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.engine.builtin.segments import SEGMENT_SEP

    sched = create_ar_scheduler(str(tiny_models / "talker"), dtype="float32", max_batch_size=2, name="codec_lm",
                                prefix_reuse=False)
    sched.set_stream_sources(["talker"])
    sched.start()
    try:
        sched.inbox.put(IncomingMessage("a", "stream_chunk", _prompt(7 * 200, 100), "talker"))
        sched.inbox.put(IncomingMessage("a", "stream_chunk", _prompt(7, 200), "talker"))
        first = sched.outbox.get(timeout=60)
        assert (first.request_id, first.type) == ("a", "stream")
        sched.inbox.put(IncomingMessage("a", "abort"))
        ids, deadline = set(), time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                ids.add(sched.outbox.get(timeout=0.2).request_id)
            except Exception:  # queue.Empty: keep listening until the deadline
                pass
        assert not any(SEGMENT_SEP in i for i in ids), ids
        assert sched.live_state() == 0 and not sched._segments.owner, "the aborted response holds nothing"
    finally:
        sched.stop()


def test_codec_lm_runs_a_responses_prompts_in_order(tiny_models):
    """The codec LM is a plain AR scheduler: stream chunks are prompts, generated one after another under the
    response's id (segment numbers in order), batched with another response's; the result comes after the last
    segment, the payload's keys kept; abort mid-stream and a bad chunk each end only their own response."""
    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.contracts.payloads import TokenDelta

    sched = create_ar_scheduler(str(tiny_models / "talker"), dtype="float32", max_batch_size=4, name="codec_lm",
                                prefix_reuse=False)
    sched.set_stream_sources(["talker"])
    sched.start()
    put = sched.inbox.put
    try:
        for rid in ("a", "b"):
            for k in range(3):
                put(IncomingMessage(rid, "stream_chunk", _prompt(7 * (k + 1), 100 + k), "talker"))
        put(IncomingMessage("a", "new_request", {"text": "three clauses", "completion_tokens": 16}, "talker"))
        put(IncomingMessage("a", "stream_done", None, "talker"))
        put(IncomingMessage("c", "stream_chunk", "not a prompt", "talker"))
        got: dict[str, list] = {"a": [], "b": []}
        results, errors = {}, {}
        while "a" not in results or "c" not in errors or sum(len(d.token_ids) for d in got["b"]) < 7 * 3:
            msg = sched.outbox.get(timeout=60)
            if msg.type == "stream":
                got[msg.request_id].append(msg.data)
            elif msg.type == "result":
                results[msg.request_id] = msg.data
            else:
                errors[msg.request_id] = msg.data
        put(IncomingMessage("b", "abort"))  # b is on its last segment and never got its payload
        assert all(isinstance(d, TokenDelta) for d in got["a"])
        assert [d.segment for d in got["a"]] == sorted(d.segment for d in got["a"])
        per_segment = [sum(len(d.token_ids) for d in got["a"] if d.segment == k) for k in range(3)]
        assert per_segment == [7, 14, 21]
        res = results["a"]
        assert res["segments"] == 3 and res["segment_tokens"] == 42
        assert res["completion_tokens"] == 16 and res["text"] == "three clauses", "the thinker's usage survives"
        assert "SpeechPrompt" in errors["c"]
        import time

        deadline = time.monotonic() + 10
        while sched.live_state() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sched.live_state() == 0, "aborted and failed responses hold nothing"
    finally:
        sched.stop()
