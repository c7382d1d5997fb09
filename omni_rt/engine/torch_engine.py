"""Built-in engine: a transformers causal LM over a slot KV cache — per-sequence prefill, batched decode.

Why not ``transformers.generation.continuous_batching`` (ContinuousBatchingManager): it owns its own
background thread and request queue, so the stage would hold two schedulers and could not overlap host work
with the next step (async lookahead); logits processing is configured once per manager, not per request;
and its prefix sharing only reuses full pages still resident in the paged cache, while a voice session
needs the previous turn's KV kept (bounded, LRU) until the next turn arrives. It is a good library piece,
but it is the whole scheduler, not a part of one. So this module borrows the model classes (and their SDPA
attention) and keeps the loop: gpt-fast/nano-vllm style static KV and CUDA graphs per batch-size bucket.

Batched decode of different-length requests: every row writes K/V at its own position in its own slot and a
[B, 1, 1, L] boolean mask hides each row's unused tail, so batched greedy equals one-at-a-time greedy.
On CPU the buffer grows on demand and each step reads only ``max(len)+1`` positions; on GPU it is
preallocated at ``max_seq_len`` so a decode step is a fixed-address CUDA graph (eager costs ~27 ms/step
whatever the model size; graphs 3–7 ms).
"""

from __future__ import annotations

import inspect
import logging
from typing import Sequence

import torch

from omni_rt.engine.kv_cache import KVBlob, SlotKVCache
from omni_rt.engine.request import SamplingParams
from omni_rt.engine.sampling import SlotSampler

log = logging.getLogger(__name__)

_CPU_INITIAL_CAPACITY = 256


def _eos_ids(model) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)


class TorchEngine:
    """Owns the model, the KV slots and the per-slot decode state; called from one thread at a time."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_batch_size: int = 8,
        max_seq_len: int | None = None,
        cuda_graphs: bool = True,
        static_kv: bool | None = None,
    ) -> None:
        """``static_kv`` (default: on GPU) preallocates ``max_seq_len`` and decodes fixed shapes — batch padded to
        a bucket, attention over the whole buffer — which is what CUDA graphs replay. It runs eagerly on CPU too,
        so tests check that path's correctness without a GPU."""
        self.model = model.eval()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_batch_size = max_batch_size
        limit = getattr(cfg, "max_position_embeddings", None) or 4096
        self.max_seq_len = min(max_seq_len or 4096, limit)
        self.eos_token_ids = _eos_ids(model)
        self.vocab_size = cfg.vocab_size

        attn = getattr(cfg, "_attn_implementation", "sdpa") or "sdpa"
        if attn not in ("sdpa", "eager"):
            raise ValueError(f"attention implementation {attn!r} unsupported; load with attn_implementation='sdpa'")
        self._bool_mask = attn == "sdpa"
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

        on_gpu = self.device.type == "cuda"
        self.static_kv = on_gpu if static_kv is None else static_kv
        heads = cfg.num_attention_heads
        self.kv = SlotKVCache(
            num_layers=cfg.num_hidden_layers,
            num_slots=max_batch_size,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            capacity=self.max_seq_len if self.static_kv else min(_CPU_INITIAL_CAPACITY, self.max_seq_len),
            max_capacity=self.max_seq_len,
            initial_slots=None if self.static_kv else 1,
            dtype=self.dtype,
            device=self.device,
        )
        # per-slot decode state: next input token, its position (== tokens already in KV)
        self.tokens = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self.lengths = [0] * max_batch_size
        # per-slot sampling parameters and generated-token history (penalties, n-grams, seeded noise)
        self.sampler = SlotSampler(max_batch_size, self.vocab_size, self.max_seq_len, self.device)
        self._arange = torch.arange(self.max_seq_len, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._graph_logits: dict[int, torch.Tensor] = {}
        if self.static_kv and on_gpu and cuda_graphs:
            self._capture_graphs()

    # ---------------------------------------------------------------- forward
    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        if self._bool_mask:
            return allowed
        return torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min
        )

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            attention_mask=self._mask(allowed),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: self.kv},
        )
        return out.logits[:, -1]

    def _decode_forward(self, n: int, view_len: int) -> torch.Tensor:
        self.kv.for_decode(n, self.pos[:n], view_len)
        allowed = (self._arange[None, :view_len] <= self.pos[:n, None])[:, None, None, :]
        return self._forward(self.tokens[:n, None], self.pos[:n, None], allowed)

    # ---------------------------------------------------------------- CUDA graphs
    def _buckets(self) -> list[int]:
        sizes = [1, 2, 4, 8] + list(range(16, self.max_batch_size + 1, 8))
        return sorted({b for b in sizes if b < self.max_batch_size} | {self.max_batch_size})

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """One graph per batch-size bucket, largest first so smaller ones reuse its memory pool (nano-vllm).

        Attention reads the whole preallocated length (fixed shapes); rows of a bucket past the live batch
        are free slots: they compute garbage into their own slot, which the next prefill overwrites.
        """
        cap = self.kv.capacity
        pool = None
        try:
            for b in sorted(self._buckets(), reverse=True):
                self._decode_forward(b, cap)  # warm-up: lazy inits, cuBLAS workspaces
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._graph_logits[b] = self._decode_forward(b, cap)
                pool = graph.pool() if pool is None else pool
                self.graphs[b] = graph
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # a model whose forward cannot be captured still serves, eagerly
            log.warning("CUDA graph capture failed (%s: %s); decoding eagerly", type(exc).__name__, exc)
            self.graphs.clear()
            self._graph_logits.clear()
        self.kv.k.zero_()
        self.kv.v.zero_()

    # ---------------------------------------------------------------- steps
    @torch.inference_mode()
    def prefill(
        self,
        slot: int,
        token_ids: list[int],
        start: int,
        params: SamplingParams,
        generator: object = None,
        mask: torch.Tensor | None = None,
        sample_next: bool = True,
    ) -> int:
        """Compute KV for ``token_ids`` at positions ``start..`` of ``slot`` (``[:start]`` already there) and
        pick the next token, which becomes the slot's next decode input. ``mask`` [1, V] bool: allowed tokens
        (a tool-call grammar). ``sample_next=False`` is a chunk of a longer prompt (chunked prefill): no token
        is picked; returns -1. (``generator`` is unused: seeded randomness is per slot, see ``sampling``.)"""
        end = start + len(token_ids)
        if end >= self.max_seq_len:
            raise ValueError(f"prompt of {end} tokens does not fit max_seq_len={self.max_seq_len}")
        if max(token_ids) >= self.vocab_size:
            raise ValueError(f"token id {max(token_ids)} out of the model's vocabulary ({self.vocab_size})")
        self.kv.ensure_capacity(end, slot + 1)
        self.kv.for_prefill(slot, start)
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        pos = self._arange[start:end]
        allowed = self._arange[None, :end] <= pos[:, None]
        logits = self._forward(ids, pos[None], allowed[None, None])
        self.pos[slot] = end
        self.lengths[slot] = end
        self.sampler.assign(slot, params)
        if not sample_next:
            return -1
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        tok = self.sampler.select(logits, slice(slot, slot + 1))
        self.tokens[slot] = tok[0]
        return int(tok[0])

    @torch.inference_mode()
    def decode(
        self,
        n: int,
        params: Sequence[SamplingParams] | None = None,
        generators: Sequence[object] | None = None,
        mask: torch.Tensor | None = None,
    ) -> list[int]:
        """One decode step for slots ``0..n-1``: feed each slot's last token, sample the next one (each slot's
        sampling parameters were set at its prefill; ``params``/``generators`` are unused). ``mask`` [n, V]
        bool: allowed tokens per row (grammar rows; unconstrained rows all True)."""
        if self.static_kv:
            bucket = next(b for b in self._buckets() if b >= n)
            if bucket in self.graphs:
                self.graphs[bucket].replay()
                logits = self._graph_logits[bucket][:n]
            else:
                logits = self._decode_forward(bucket, self.kv.capacity)[:n]
        else:
            view_len = max(self.lengths[:n]) + 1
            self.kv.ensure_capacity(view_len, n)
            logits = self._decode_forward(n, view_len)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        tok = self.sampler.select(logits, slice(0, n))
        self.tokens[:n] = tok
        self.pos[:n] += 1
        for i in range(n):
            self.lengths[i] += 1
        return tok.tolist()

    # ---------------------------------------------------------------- slots
    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Compaction: live sequences stay in slots ``0..B-1``."""
        self.kv.move(src, dst, self.lengths[src])
        self.tokens[dst] = self.tokens[src]
        self.pos[dst] = self.pos[src]
        self.lengths[dst] = self.lengths[src]
        self.sampler.move(src, dst)
        self.release(src)

    def reset(self) -> None:
        """Forget every slot (a new scheduler taking over this engine)."""
        for slot in range(self.max_batch_size):
            self.release(slot)

    @torch.inference_mode()
    def swap(self, a: int, b: int) -> None:
        """Exchange two slots' KV and decode state (a finished chunked prefill taking the next decode row)."""
        self.kv.swap(a, b, max(self.lengths[a], self.lengths[b]))
        for t in (self.tokens, self.pos):
            t[a], t[b] = t[b].clone(), t[a].clone()
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]
        self.sampler.swap(a, b)

    def release(self, slot: int) -> None:
        """Free a slot; on the growable (CPU) path the buffer shrinks once what grew it has left."""
        self.lengths[slot] = 0
        self.pos[slot] = 0
        self.sampler.release(slot)
        if not self.static_kv:
            used = [i for i, n in enumerate(self.lengths) if n > 0]
            self.kv.shrink(used[-1] + 1 if used else 1, max(self.lengths) + 1, _CPU_INITIAL_CAPACITY)

    def kv_bytes(self) -> int:
        """Bytes held by the slot KV buffer (what ``/debug/state`` reports as the engine's KV)."""
        return self.kv.nbytes()

    @torch.inference_mode()
    def export_kv(self, slot: int, n: int) -> KVBlob:
        return self.kv.export(slot, n)

    @torch.inference_mode()
    def load_kv(self, slot: int, blob: KVBlob, n: int) -> None:
        self.kv.load(slot, blob, n)
        self.lengths[slot] = n
        self.pos[slot] = n
