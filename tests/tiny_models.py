"""Tiny random-init causal LMs saved like real checkpoints: a real (but instant) AR scheduler for the tests,
loaded through the same code as real weights, with nothing from a hub. Also a narrow SNAC layout
(``SMALL_SNAC_CONFIG``) and a metadata-only GGUF (``metadata_gguf``) for start-up checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import torch

from omni_rt.backends.snac_codec import SNAC_24KHZ_CONFIG

# Same layout as the 24 kHz model (rates, strides, kernels: the same receptive field), narrow enough to stream 40
# frames in a few seconds on 2 cores.
SMALL_SNAC_CONFIG = {**SNAC_24KHZ_CONFIG, "encoder_dim": 4, "decoder_dim": 32}


def build_tiny_model(
    arch: str, out_dir: str | Path, *, vocab_size: int = 256, seed: int = 0, tokenizer: Any = None, **config: Any
) -> Path:
    """Save a 2-layer, hidden-64 ``llama`` or ``qwen2`` with random weights (GQA: 4 query / 2 KV heads);
    ``config``: fields replaced (e.g. ``head_dim=64``).

    ``initializer_range`` is large so greedy outputs vary from step to step instead of repeating one token.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
        **config,
    )
    cls, cfg = {
        "llama": (LlamaForCausalLM, LlamaConfig),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config),
    }[arch]
    if tokenizer is not None:
        common.update(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id
        )
    torch.manual_seed(seed)
    model = cls(cfg(**common))
    out = Path(out_dir)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def metadata_gguf(path: Path, chat_template: str | None) -> Path:
    """A GGUF holding only metadata (no tensors): enough for the start-up checks, written by ``gguf``."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-check")
    w.add_tokenizer_model("gpt2")
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
