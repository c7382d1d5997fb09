"""Model weights: the CPU preset's thinker (SmolLM2-135M-Instruct shipped as a GGUF inside a pip package)
and a generic loader.

The GGUF takes ~15-40 s to dequantize through transformers, so it is converted once to safetensors in a
cache directory outside the repo; later loads take well under a second. Nothing here touches the network.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from omni_rt.engine.weights.smollm2 import packaged_gguf_path
from omni_rt.resources import cache_root

log = logging.getLogger(__name__)

SMOLLM2_DIRNAME = "smollm2-135m-instruct"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer_config.json")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def ensure_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a directory with SmolLM2-135M-Instruct as safetensors + tokenizer, converting it once."""
    target = Path(cache_dir) if cache_dir is not None else cache_root() / SMOLLM2_DIRNAME
    if all((target / f).is_file() for f in _REQUIRED):
        return target
    gguf = packaged_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once)", gguf, target)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the weights are already dequantized; without this save_pretrained refuses a "quantized" model
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # a partial earlier attempt
            shutil.rmtree(target)
        os.replace(tmp, target)  # atomic: a concurrent reader sees all files or none
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def resolve_model(model: str) -> str:
    """``"smollm2"`` names the packaged CPU thinker; anything else is a local path (or a hub id)."""
    return str(ensure_smollm2()) if model.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct") else model


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def load_model(path_or_dir: str | os.PathLike, dtype: str | torch.dtype = "float32", device: str = "cpu"):
    """A transformers causal LM with SDPA attention, in eval mode on ``device``. A ``.gguf`` file works too."""
    from transformers import AutoModelForCausalLM

    path = Path(path_or_dir)
    kwargs = {"dtype": torch_dtype(dtype), "attn_implementation": "sdpa"}
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path_or_dir), **kwargs)
    return model.to(device).eval()


def load_tokenizer(path_or_dir: str | os.PathLike):
    from transformers import AutoTokenizer

    path = Path(path_or_dir)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path_or_dir))
