"""Random-init of the GPU preset's real shapes (``omni_rt.engine.weights.random_init``): the configs match the published
models, the factories build working stages from them, and ``--random-weights`` reaches every stage that can."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omni_rt.engine.weights.random_init import (CODEC_LM_CODES_END, CONFIGS, ORPHEUS_CODE_OFFSET, apply_random_weights,
                                        build_causal_lm, build_whisper, model_config)
from omni_rt.testing.stage_driver import collect, send
from omni_rt.presets import load_preset

THINKER, CODEC_LM, WHISPER = "Qwen/Qwen2.5-7B-Instruct", "canopylabs/orpheus-3b-0.1-ft", "openai/whisper-large-v3-turbo"


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_full_shapes_have_the_published_parameter_counts():
    """Built on the meta device (no memory): a wrong width, depth or vocabulary shows in the count."""
    published = {THINKER: 7.6156e9, CODEC_LM: 3.3009e9}  # Qwen2.5-7B: 7.62B; Llama-3.2-3B + Orpheus vocab: 3.30B
    for mid, n in published.items():
        assert _params(build_causal_lm(mid, device="meta", dtype=torch.bfloat16)) == pytest.approx(n, rel=1e-3), mid
    assert _params(build_whisper(WHISPER, device="meta", dtype=torch.float16)) == pytest.approx(808.9e6, rel=1e-3)


def test_tiny_keeps_the_vocabulary_layout():
    for mid in CONFIGS:
        full, tiny = model_config(mid), model_config(mid, "tiny")
        assert tiny["vocab_size"] == full["vocab_size"]
        assert (tiny.get("hidden_size") or tiny["d_model"]) == 64
    assert model_config(CODEC_LM)["vocab_size"] == 156940 and CODEC_LM_CODES_END == 128266 + 7 * 4096
    assert model_config(WHISPER, "tiny")["num_mel_bins"] == 128
    with pytest.raises(ValueError, match="no built-in config for model 'org/unknown'"):
        model_config("org/unknown")
    with pytest.raises(ValueError, match="random_size"):
        model_config(THINKER, "huge")


def test_random_thinker_answers_through_the_factory():
    from omni_rt.engine.factory import create_ar_scheduler

    sched = create_ar_scheduler(THINKER, random_init=True, random_size="tiny", max_batch_size=2)
    assert sched.tokenizer is not None  # the offline stand-in (SmolLM2, ChatML)
    sched.start()
    try:
        send(sched, "r", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "ignore_eos": True})
        res = collect(sched, ["r"], timeout=60)["r"]
    finally:
        sched.stop()
    assert res["error"] is None, res["error"]
    assert res["result"]["completion_tokens"] == 8
    assert all(t < len(sched.tokenizer) for t in res["result"]["token_ids"])  # the favoured rows: decodable text
    assert "".join(c.text for c in res["stream"]).strip()


def test_random_codec_lm_speaks_audio_codes():
    from omni_rt.engine.factory import create_ar_scheduler

    sched = create_ar_scheduler(CODEC_LM, random_init=True, random_size="tiny", max_batch_size=2, name="codec_lm")
    sched.start()
    try:
        send(sched, "c", {"prompt_ids": [128259, 1, 2, 3, 128009, 128260], "output": "tokens", "max_tokens": 21,
                          "ignore_eos": True, "temperature": 0.6, "seed": 0})
        res = collect(sched, ["c"], timeout=60)["c"]
    finally:
        sched.stop()
    toks = res["result"]["token_ids"]
    assert len(toks) == 21 and all(ORPHEUS_CODE_OFFSET <= t < CODEC_LM_CODES_END for t in toks)


def test_a_factory_naming_random_init_gets_it():
    from omni_rt.engine.weights.random_init import supports_random_init

    assert supports_random_init("omni_rt.stages.vocoder:create_snac_vocoder", {})
    assert not supports_random_init("omni_rt.stages.talker.piper:create_piper_talker", {})  # no such parameter
    assert not supports_random_init("omni_rt.engine.factory:create_ar_scheduler", {"model": "smollm2"})
    assert not supports_random_init("omni_rt.engine.factory.create_ar_scheduler", {"model": "smollm2"})  # dotted
    assert supports_random_init("omni_rt.engine.factory.create_ar_scheduler", {"model": THINKER})
    assert not supports_random_init("no.such.module:fn", {})


def test_random_init_refuses_what_it_cannot_build():
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.stages.asr.factory import create_asr_stage

    with pytest.raises(ValueError, match="only the torch backend"):
        create_ar_scheduler(THINKER, backend="remote", base_url="http://x/v1", random_init=True)
    with pytest.raises(ValueError, match="only the transformers backend"):
        create_asr_stage(backend="faster-whisper", random_init=True)


def test_random_weights_flag_reaches_every_supporting_stage(monkeypatch):
    """``omni-rt serve --random-weights tiny`` -> settings -> the runtime's config, by factory (not stage name)."""
    import omni_rt.server.serve as serve_mod
    from omni_rt.cli import main
    from omni_rt.server.runtime import Runtime

    seen = {}
    monkeypatch.setattr(serve_mod, "serve", lambda settings, log_level: seen.setdefault("settings", settings))
    main(["serve", "--preset", "gpu", "--random-weights", "tiny"])
    assert seen["settings"].random_weights == "tiny"
    cfg = Runtime(seen["settings"]).config
    by_factory = {st.factory.rsplit(":", 1)[1]: st for st in cfg.stages}
    for fn in ("create_asr_stage", "create_ar_scheduler", "create_snac_vocoder"):  # thinker at least
        assert by_factory[fn].args["random_init"] is True, fn
        assert by_factory[fn].args.get("random_size") == (None if fn == "create_snac_vocoder" else "tiny")
    codec = [st for st in cfg.stages if st.args.get("model") == CODEC_LM]  # the talker, or a codec_lm stage
    assert codec and all(st.args["random_init"] is True for st in codec)
    prompts = [st for st in cfg.stages if st.factory.endswith("create_speech_prompts")]
    assert prompts and all(st.args["random_init"] is True for st in prompts), "the talker gets the stand-in tokenizer"
    cpu = load_preset("cpu")  # faster-whisper, the packaged SmolLM2, Piper: nothing to randomise there
    assert apply_random_weights(cpu) == []
    assert not any("random_init" in st.args for st in cpu.stages)


@pytest.mark.integration  # a real model runs for seconds
async def test_gpu_preset_on_random_weights_end_to_end(speech_samples):
    """The gpu preset file, every stage on tiny random weights through its factory's ``random_init``, on CPU:
    a spoken turn gets a transcript, a text turn gets streamed SNAC audio."""
    import inspect

    from omni_rt.audio.pcm import resample
    from omni_rt.pipeline.config import import_string
    from omni_rt.pipeline.coordinator import Coordinator, ResultItem, StreamItem
    from omni_rt.contracts.audio_in import AudioInSettings, CommitAudioIn, OpenAudioIn
    from omni_rt.contracts.payloads import AsrError, TranscriptFinal

    cfg = load_preset("gpu")
    assert len(apply_random_weights(cfg, "tiny")) == len(cfg.stages)  # ASR, thinker, talker, codec LM, vocoder
    for st in cfg.stages:
        params = inspect.signature(import_string(st.factory)).parameters
        small = {"device": "cpu", "dtype": "float32", "max_batch_size": 2, "max_tokens_per_clause": 7 * 4}
        st.args.update({k: v for k, v in small.items() if k in params})  # by what the factory takes, not by name
    coord = Coordinator(cfg)
    await coord.start()
    try:
        events = []
        coord.open_session("s1", cfg.roles.audio_in, OpenAudioIn(AudioInSettings(None, partials=False)),
                           lambda stage, ev: events.append(ev))
        audio, sr, _ = speech_samples["capital"]
        coord.append("s1", cfg.roles.audio_in, resample(audio, sr, 16000))
        coord.session_control("s1", cfg.roles.audio_in, CommitAudioIn())
        async with asyncio.timeout(60):
            while not any(isinstance(e, TranscriptFinal) for e in events):
                assert not [e for e in events if isinstance(e, AsrError)], events
                await asyncio.sleep(0.05)
        coord.close_session("s1")

        payload = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "ignore_eos": True}
        pcm, result = [], None
        async with asyncio.timeout(120):
            async for item in coord.stream("r1", payload, entry=cfg.roles.response or cfg.entry):
                if isinstance(item, StreamItem) and item.stage == cfg.roles.audio:
                    pcm.append(np.frombuffer(item.data.pcm, dtype=np.int16))
                elif isinstance(item, ResultItem):
                    result = item.data
        assert result is not None and result["completion_tokens"] == 12
        assert sum(len(p) for p in pcm) == result["output_samples"] > 0
    finally:
        await coord.stop()


def test_stand_in_tokenizer_from_a_saved_directory(tmp_path, monkeypatch):
    """What travels to a GPU machine (the 94 MB package does not fit): the tokenizer's files alone."""
    from omni_rt.engine.weights.random_init import STAND_IN_TOKENIZER_ENV, stand_in_tokenizer

    packaged = stand_in_tokenizer()
    packaged.save_pretrained(tmp_path / "tok")
    monkeypatch.setenv(STAND_IN_TOKENIZER_ENV, str(tmp_path / "tok"))
    carried = stand_in_tokenizer()
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert carried.apply_chat_template(msgs, tokenize=False) == packaged.apply_chat_template(msgs, tokenize=False)
    assert carried.encode("tara: Hello there.") == packaged.encode("tara: Hello there.")
    assert sum(f.stat().st_size for f in (tmp_path / "tok").iterdir()) < 8 * 2**20
