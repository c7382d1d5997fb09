"""Built-in engine: a transformers causal LM over a slot KV cache — batched prefill, batched decode.

Why not ``transformers.generation.continuous_batching`` (ContinuousBatchingManager): it owns its own
background thread and request queue, so the stage would hold two schedulers and could not overlap host work
with the next step (async lookahead); logits processing is configured once per manager, not per request;
and its prefix sharing only reuses full pages still resident in the paged cache, while a voice session
needs the previous turn's KV kept (bounded, LRU) until the next turn arrives. It is a good library piece,
but it is the whole scheduler, not a part of one. So this module borrows the model classes (with SDPA
attention, GQA packed so K/V are not copied per head: ``omni_rt.engine.builtin.attention``) and keeps the loop:
gpt-fast/nano-vllm style static KV and CUDA graphs per batch-size x context-length bucket.

Batched decode of different-length requests: every row writes K/V at its own position in its own slot and a
[B, 1, 1, L] boolean mask hides each row's unused tail, so batched greedy equals one-at-a-time greedy.
On CPU the buffer grows on demand and each step reads only ``max(len)+1`` positions; on GPU it is
preallocated at ``max_seq_len`` so a decode step is a fixed-address CUDA graph (eager costs ~27 ms/step
whatever the model size; graphs 3–7 ms), one graph per batch bucket x context bucket, so a step attends over
the used context rounded up to a bucket, not over all ``max_seq_len`` positions.

Why this module is over 400 lines: it is one concept, the engine's slots and the forwards over them. Prefill,
decode, the CUDA graphs and slot moves all address the same preallocated buffers (KV, per-slot tokens and
positions, the graphs' shared logits), and a graph replays exactly what the eager decode step does, so they
stay side by side. Which paged decode reader serves a model is ``paged_attention.reader_for``; the KV layout
is ``kv_cache``, sampling ``sampling``.
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from omni_rt.engine.builtin.attention import PACKED_GQA, SDPA_FAMILY, switch_attention
from omni_rt.engine.builtin.kv_cache import KVBlob, SlotKVCache
from omni_rt.engine.builtin.paged_attention import (
    PAGE_SIZE, PAGED_DECODE, PagedDecode, page_tables, paged_decode_attention, reader_for,
)
from omni_rt.engine.prompt.request import SamplingParams
from omni_rt.engine.builtin.sampling import SlotSampler

log = logging.getLogger(__name__)

_CPU_INITIAL_CAPACITY = 256
_ATTENTIONS = ("auto", "packed_gqa", "sdpa", "flashinfer", "paged_sdpa")


def _eos_ids(model) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)


@dataclass(slots=True)
class PrefillItem:
    """One slot's prefill chunk in a batched prefill (the arguments of ``TorchEngine.prefill``)."""

    slot: int
    token_ids: list[int]
    start: int
    params: SamplingParams
    mask: torch.Tensor | None = None  # [1, V] bool: allowed next tokens (a tool-call grammar)
    sample_next: bool = True  # False: a chunk of a longer prompt, no token picked


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
        attention: str = "auto",
        context_buckets: Sequence[int] | None = None,
    ) -> None:
        """``static_kv`` (default: on GPU) preallocates ``max_seq_len`` and decodes fixed shapes — batch padded to
        a bucket, attention over the first ``context bucket`` positions (the smallest of ``context_buckets``,
        default 256, 512, 1024, ... and ``max_seq_len``, that holds every live row's next position) — which is
        what the CUDA graphs, one per batch bucket x context bucket, replay. A step so reads what is in use,
        rounded up, not the whole buffer. It runs eagerly on CPU too, so tests check that path without a GPU.

        ``attention``: ``"auto"`` (default) is ``"flashinfer"`` on CUDA when FlashInfer is installed and runs,
        else ``"packed_gqa"`` (``omni_rt.engine.builtin.attention``). ``"sdpa"``: transformers' stock SDPA, which copies
        K/V per layer per step for GQA models when a mask is passed. ``"flashinfer"``: paged decode, each row
        reading exactly its own pages (``omni_rt.engine.builtin.paged_attention``), one CUDA graph per batch bucket, so
        ``context_buckets`` do not apply. ``"paged_sdpa"``: the same page tables read by gather + SDPA (any
        device; what FlashInfer is checked against, not a fast path, never graph-captured)."""
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
        if attn not in SDPA_FAMILY and attn != "eager":
            raise ValueError(f"attention implementation {attn!r} unsupported; load with attn_implementation='sdpa'")
        sdpa_like = attn in SDPA_FAMILY  # sdpa, or one of ours (a model another engine switched)
        if attention not in _ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(map(repr, _ATTENTIONS))}, got {attention!r}")
        on_gpu = self.device.type == "cuda"
        self.static_kv = on_gpu if static_kv is None else static_kv
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.paged: PagedDecode | None = None
        if attention in ("auto", "flashinfer", "paged_sdpa"):
            if attention != "auto" and context_buckets is not None:
                raise ValueError(f"context_buckets do not apply to attention={attention!r}: a paged decode step "
                                 "reads each row's own pages")
            self.paged = reader_for(attention, model, cfg, attn, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                    device=self.device, dtype=self.dtype, max_seq_len=self.max_seq_len,
                                    static_kv=self.static_kv, cuda_graphs=cuda_graphs)
        # decode via the reader, prefill packed GQA
        if self.paged is not None and not switch_attention(model, PAGED_DECODE, paged_decode_attention):
            if attention != "auto":
                raise ValueError(f"attention={attention!r}: {type(model).__name__} takes no custom attention function")
            self.paged = None
        if self.paged is None and attention in ("auto", "packed_gqa"):
            switch_attention(model, PACKED_GQA)  # GQA without per-layer K/V copies (omni_rt.engine.builtin.attention)
        elif attention == "sdpa":
            switch_attention(model, "sdpa")
        self.attention = self.paged.name if self.paged else getattr(model.config, "_attn_implementation", attn)
        self._bool_mask = sdpa_like
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

        self.kv = SlotKVCache(
            num_layers=cfg.num_hidden_layers,
            num_slots=max_batch_size,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            capacity=self.max_seq_len if self.static_kv else min(_CPU_INITIAL_CAPACITY, self.max_seq_len),
            max_capacity=self.max_seq_len,
            initial_slots=None if self.static_kv else 1,
            page_size=PAGE_SIZE if self.paged else None,
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
        # a paged step reads each row's own pages: the static shape fixes only the batch
        self.context_buckets = [self.max_seq_len] if self.paged else self._context_buckets(context_buckets)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch bucket, context bucket)
        self._graph_out: torch.Tensor | None = None  # [max_batch_size, V]: every graph writes its logits here
        if self.static_kv and on_gpu and cuda_graphs and (self.paged is None or self.paged.graphable):
            self._capture_graphs()

    # ---------------------------------------------------------------- forward
    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        if self._bool_mask:
            return allowed
        return torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min
        )

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor, paged: bool = False
                 ) -> torch.Tensor:
        extra = {"paged_decode": self.paged} if paged else {}  # transformers hands it to the attention function
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            attention_mask=self._mask(allowed),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: self.kv},
            **extra,
        )
        return out.logits[:, -1]

    def _decode_forward(self, n: int, view_len: int) -> torch.Tensor:
        """Rows ``0..n-1`` (a paged step's tables planned first: ``_plan_pages``)."""
        paged = self.paged is not None
        self.kv.for_decode(n, self.pos[:n], view_len, paged=paged)
        allowed = (self._arange[None, :view_len] <= self.pos[:n, None])[:, None, None, :]
        return self._forward(self.tokens[:n, None], self.pos[:n, None], allowed, paged=paged)

    def _plan_pages(self, rows: int) -> None:
        """Page tables of a decode step over rows ``0..rows-1``: each reads its KV plus the token it writes.
        Host work only, outside any graph (a graph replays whatever tables were planned last)."""
        tables = page_tables([n + 1 for n in self.lengths[:rows]], PAGE_SIZE, self.kv.pages_per_slot)
        self.paged.plan(tables, rows)

    # ---------------------------------------------------------------- CUDA graphs
    def _buckets(self) -> list[int]:
        sizes = [1, 2, 4, 8] + list(range(16, self.max_batch_size + 1, 8))
        return sorted({b for b in sizes if b < self.max_batch_size} | {self.max_batch_size})

    def _context_buckets(self, asked: Sequence[int] | None) -> list[int]:
        """Attention lengths a static decode step reads: powers of two from 256 (or ``asked``) below
        ``max_seq_len``, then ``max_seq_len``. Few buckets (5 for 4096) bound graph count and capture time;
        rounding up at most doubles what a step reads."""
        if asked is None:
            asked, b = [], 256
            while b < self.max_seq_len:
                asked.append(b)
                b *= 2
        if any(int(c) < 1 for c in asked):
            raise ValueError(f"context_buckets must be positive, got {list(asked)}")
        return sorted({int(c) for c in asked if int(c) < self.max_seq_len} | {self.max_seq_len})

    def _static_shape(self, n: int) -> tuple[int, int]:
        """(batch bucket, context bucket) of a static decode step over rows ``0..n-1``."""
        need = max(self.lengths[:n]) + 1  # each row attends to its KV and writes its next position
        if need > self.max_seq_len or n > self.max_batch_size:
            raise ValueError(f"decode of {n} rows up to position {need} exceeds max_batch_size="
                             f"{self.max_batch_size} / max_seq_len={self.max_seq_len}")
        return next(b for b in self._buckets() if b >= n), next(c for c in self.context_buckets if c >= need)

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """One graph per batch bucket x context bucket, largest first, all in one memory pool (nano-vllm):
        intermediates are reused across graphs, and every graph copies its logits into one shared output
        buffer, so memory is about one largest step, not one per graph.

        Rows of a bucket past the live batch are free (or still-prefilling) slots: they compute garbage into
        their own slot at their own position, which that slot's next prefill overwrites.
        """
        t0 = time.perf_counter()
        pool = None
        try:
            for ctx in sorted(self.context_buckets, reverse=True):
                for b in sorted(self._buckets(), reverse=True):
                    if self.paged is not None:
                        self._plan_pages(b)  # the graph captures this bucket's wrapper and its fixed buffers
                    logits = self._decode_forward(b, ctx)  # warm-up: lazy inits, cuBLAS workspaces
                    if self._graph_out is None:
                        self._graph_out = torch.empty(
                            (self.max_batch_size, logits.shape[-1]), dtype=logits.dtype, device=self.device
                        )
                    torch.cuda.synchronize(self.device)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._graph_out[:b].copy_(self._decode_forward(b, ctx))
                    pool = graph.pool() if pool is None else pool
                    self.graphs[(b, ctx)] = graph
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # a model whose forward cannot be captured still serves, eagerly
            log.warning("CUDA graph capture failed (%s: %s); decoding eagerly", type(exc).__name__, exc)
            self.graphs.clear()
        if self.graphs:
            log.info("captured %d decode graphs (%d batch x %d context buckets) in %.1f s",
                     len(self.graphs), len(self._buckets()), len(self.context_buckets), time.perf_counter() - t0)
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
        self._check_prefill(token_ids, start)
        end = start + len(token_ids)
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
    def prefill_batch(self, items: Sequence[PrefillItem]) -> list[int]:
        """Several slots' prefill chunks in one forward (concurrent new sessions): rows right-aligned to the
        longest chunk (left padding, so ``logits_to_keep=1`` is each row's last real token), each row writing
        its own slot's K/V at its own positions; pad tokens are never written (``SlotKVCache.for_prefill_batch``).
        Returns each item's next token, as ``prefill`` does (-1 where ``sample_next`` is False). The caller
        bounds ``len(items) x longest chunk``: that is what the forward costs."""
        if len(items) == 1:
            it = items[0]
            return [self.prefill(it.slot, it.token_ids, it.start, it.params, None, it.mask, it.sample_next)]
        slots = [it.slot for it in items]
        if len(set(slots)) != len(slots):
            raise ValueError(f"prefill_batch: a slot appears twice in {slots}")
        for it in items:
            self._check_prefill(it.token_ids, it.start)
        width = max(it.start + len(it.token_ids) for it in items)
        t_max = max(len(it.token_ids) for it in items)
        self.kv.ensure_capacity(width, max(slots) + 1)
        rows = len(items)
        ids = torch.zeros((rows, t_max), dtype=torch.long)
        pos = torch.zeros((rows, t_max), dtype=torch.long)
        for r, it in enumerate(items):
            pad = t_max - len(it.token_ids)
            ids[r, pad:] = torch.tensor(it.token_ids, dtype=torch.long)
            # pad tokens get (clamped) positions before the row's first: their queries see only that row's
            # real KV, so they stay finite, and nothing reads them
            pos[r] = (torch.arange(t_max) - pad + it.start).clamp(min=0)
        ids, pos = ids.to(self.device), pos.to(self.device)
        self.kv.for_prefill_batch(slots, [it.start for it in items], [len(it.token_ids) for it in items], t_max)
        allowed = (self._arange[None, None, :width] <= pos[:, :, None])[:, None]
        logits = self._forward(ids, pos, allowed)
        out = []
        for r, it in enumerate(items):
            end = it.start + len(it.token_ids)
            self.pos[it.slot] = end
            self.lengths[it.slot] = end
            self.sampler.assign(it.slot, it.params)
            if not it.sample_next:
                out.append(-1)
                continue
            row = logits[r : r + 1]
            if it.mask is not None:
                row = row.masked_fill(~it.mask, float("-inf"))
            tok = self.sampler.select(row, slice(it.slot, it.slot + 1))
            self.tokens[it.slot] = tok[0]
            out.append(int(tok[0]))
        return out

    def _check_prefill(self, token_ids: list[int], start: int) -> None:
        end = start + len(token_ids)
        if not token_ids:
            raise ValueError("empty prefill chunk")
        if end >= self.max_seq_len:
            raise ValueError(f"prompt of {end} tokens does not fit max_seq_len={self.max_seq_len}")
        if max(token_ids) >= self.vocab_size:
            raise ValueError(f"token id {max(token_ids)} out of the model's vocabulary ({self.vocab_size})")

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
            key = self._static_shape(n)
            if self.paged is not None:
                self._plan_pages(key[0])
            graph = self.graphs.get(key)
            if graph is not None:
                graph.replay()
                logits = self._graph_out[:n]
            else:
                logits = self._decode_forward(*key)[:n]
        else:
            view_len = max(self.lengths[:n]) + 1
            self.kv.ensure_capacity(view_len, n)
            if self.paged is not None:
                self._plan_pages(n)
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
