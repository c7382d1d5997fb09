"""Batched next-token selection with per-request parameters and per-request RNG.

Greedy rows take one vectorised argmax; sampled rows (usually few in a voice server) loop, each with its own
``torch.Generator`` so a seeded request gives the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from omni_rt.engine.request import SamplingParams


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
    return gen


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    x = logits.float() / p.temperature
    if p.top_k > 0 and p.top_k < x.numel():
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    probs = torch.softmax(x, dim=-1)
    return torch.multinomial(probs, 1, generator=gen)[0]


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """``logits`` [B, V] -> token ids [B] (int64, on the logits' device; no host sync)."""
    out = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        if not p.greedy:
            out[i] = _sample_row(logits[i], p, generators[i])
    return out
