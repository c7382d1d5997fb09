"""The GPU preset's code paths on CPU: tiny random-init Whisper, Qwen2 thinker, Llama codec talker and a
random SNAC, built from configs, saved, and loaded back through the same factories the gpu preset names."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import yaml

from omni_rt.presets import PRESET_DIR, load_preset
from omni_rt.stages.contracts import TranscriptFinal
from omni_rt.core.config import PipelineConfig
from omni_rt.core.coordinator import Coordinator, ResultItem, StreamItem


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, WhisperConfig,
                              WhisperFeatureExtractor, WhisperForConditionalGeneration)

    from omni_rt.engine.weights import ensure_smollm2, load_tokenizer

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
        "talker": {"model": str(root / "talker"), "device": "cpu", "dtype": "float32", "max_batch_size": 4,
                   "max_tokens_per_clause": 7 * 6, "ignore_eos": True, "temperature": 1.0},
        "vocoder": {"model": None, "random_init": True, "device": "cpu"},
    }
    for st in data["stages"]:
        st["args"] = {k: v for k, v in {**st["args"], **args[st["name"]]}.items() if k != "cuda_graphs"}
    return PipelineConfig.model_validate(copy.deepcopy(data))


def test_gpu_preset_loads_and_names_its_models():
    cfg = load_preset("gpu")
    assert [s.name for s in cfg.stages] == ["asr", "thinker", "talker", "vocoder"]
    assert cfg.stage("talker").factory.endswith("create_codec_talker")


async def test_gpu_preset_paths_on_cpu(tiny_models, speech_samples):
    coord = Coordinator(gpu_like_config(tiny_models))
    await coord.start()
    try:
        # ASR: transformers Whisper behind the session stage produces a final transcript for a spoken turn
        events = []
        coord.open_session("s1", "asr", {"turn_detection": None, "partials": False}, lambda stage, ev: events.append(ev))
        audio, sr, _ = speech_samples["capital"]
        from omni_rt.audio.pcm import resample

        coord.append("s1", "asr", resample(audio, sr, 16000))
        coord.session_control("s1", "asr", "commit")
        import asyncio

        async with asyncio.timeout(60):
            while not any(isinstance(e, TranscriptFinal) for e in events):
                assert not [e for e in events if isinstance(e, dict) and e.get("type") == "error"], events
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
        total = sum(len(a) for a in audio_chunks)
        assert total == result["output_samples"] == result["frames"] * 2048
        assert len(audio_chunks) >= 2, "SNAC audio should stream in several chunks"
        await asyncio.sleep(0.2)
        assert coord.live_total() == 0
    finally:
        await coord.stop()
