"""Test helpers: tiny random-init causal LMs saved like real checkpoints, and an outbox collector.

Useful to any stage test that needs a real (but instant) AR scheduler without weights from a hub.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from omni_rt.core.messages import IncomingMessage


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


def send(scheduler: Any, request_id: str, data: dict[str, Any]) -> None:
    scheduler.inbox.put(IncomingMessage(request_id, "new_request", data))


def collect(scheduler: Any, request_ids: Iterable[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """Read the outbox until every id has a ``result`` or ``error``.

    Returns ``{id: {"stream": [chunk data...], "result": data | None, "error": (message, code) | None}}``.
    """
    out = {rid: {"stream": [], "result": None, "error": None} for rid in request_ids}
    open_ids = set(out)
    deadline = time.monotonic() + timeout
    while open_ids:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no result for {sorted(open_ids)} within {timeout} s")
        try:
            msg = scheduler.outbox.get(timeout=left)
        except queue.Empty:
            continue
        entry = out.setdefault(msg.request_id, {"stream": [], "result": None, "error": None})
        if msg.type == "stream":
            entry["stream"].append(msg.data)
        elif msg.type == "result":
            entry["result"] = msg.data
            open_ids.discard(msg.request_id)
        elif msg.type == "error":
            entry["error"] = (msg.data, msg.metadata.get("code"))
            open_ids.discard(msg.request_id)
    return out


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
