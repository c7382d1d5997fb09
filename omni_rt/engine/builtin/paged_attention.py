"""Paged decode attention: each row reads exactly its own live tokens, through page tables (FlashInfer).

Why: the static-KV decode step of ``torch_engine`` (what CUDA graphs replay) attends over a context *bucket*
(256, 512, ... ``max_seq_len``) with a mask, so a row reads up to twice the context it uses, and every row
reads as far as the longest one. FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` reads each row's pages
and nothing else, splits long rows across SMs, and its CUDA-graph mode needs one graph per batch bucket only
(the page tables are re-planned into fixed buffers before each replay), not one per batch x context bucket.

No copy is needed to get pages: ``SlotKVCache(page_size=..)`` stores each slot token-major, so slot ``s``
is pages ``s * pages_per_slot ..`` of a layer's buffer (``SlotKVCache.paged``). ``page_tables`` lists them.

Two readers of the same page tables:

* ``FlashInferDecode`` — the kernel, on CUDA with the ``gpu`` extra (``pip install 'omni-rt[gpu]'``);
* ``GatherDecode`` — gathers each row's pages and runs packed-GQA SDPA over them with a key mask: plain
  torch, any device. It is what FlashInfer is checked against (the CPU tests prove the page tables and
  the cache plumbing with it; on a GPU, ``latency_bench gpu`` compares the two), not a fast path.

``reader_for`` picks the reader an engine's ``attention`` setting asks for (or none, where ``"auto"`` finds no
working FlashInfer or the model's attention is one a page reader cannot reproduce).

Prefill is unchanged (packed-GQA SDPA over the slot's head-major view): FlashInfer is used for decode only.
The engine passes its reader to the model as the ``paged_decode`` keyword, which transformers forwards to
the attention function (checked in 5.17 and 5.24); a call without it is an ordinary packed-GQA call.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from omni_rt.engine.builtin.attention import SDPA_FAMILY, packed_gqa_attention

log = logging.getLogger(__name__)

PAGED_DECODE = "omni_paged_decode"
PAGE_SIZE = 16  # FlashInfer's common page size: small enough that a row wastes < 16 positions


@dataclass(slots=True)
class PageTables:
    """FlashInfer's CSR page tables for rows ``0..B-1``: row ``r`` reads pages ``indices[indptr[r]:indptr[r+1]]``,
    the last of them holding ``last_page_len[r]`` tokens (int32, on the host; ``lengths`` = tokens per row)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    lengths: list[int]


def page_tables(lengths: Sequence[int], page_size: int, pages_per_slot: int) -> PageTables:
    """Page tables for rows ``0..len(lengths)-1``, row ``r`` being slot ``r`` with ``lengths[r]`` tokens to
    attend (its KV including the token this step writes). A length below 1 is read as 1 (a padding row of
    a batch bucket attends to its own first position: finite garbage nobody reads)."""
    n = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if n.size and int(n.max()) > page_size * pages_per_slot:
        raise ValueError(f"a row of {int(n.max())} tokens does not fit {pages_per_slot} pages of {page_size}")
    counts = -(-n // page_size)
    # runs once per decode step before the graph replays: array ops, no Python loop per page (slot r's pages
    # are always r * pages_per_slot + 0..counts[r]-1)
    page = np.arange(pages_per_slot)
    indices = (np.arange(len(n))[:, None] * pages_per_slot + page)[page < counts[:, None]]
    indptr = np.concatenate([[0], np.cumsum(counts)])
    last = n - (counts - 1) * page_size
    as_i32 = lambda a: torch.from_numpy(a.astype(np.int32))  # noqa: E731
    return PageTables(as_i32(indptr), as_i32(indices), as_i32(last), n.tolist())


class PagedDecode(Protocol):
    """What the engine needs of a paged decode reader: ``plan`` once per step, ``run`` once per layer."""

    name: str
    graphable: bool  # whether a decode step using it can be captured in a CUDA graph

    def plan(self, tables: PageTables, batch: int) -> None: ...

    def run(self, module: torch.nn.Module, query: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            scaling: float | None) -> torch.Tensor:
        """``query`` [B, H, 1, D], the layer's paged K/V -> [B, 1, H, D] (the attention function's layout)."""


class GatherDecode:
    """Reads the page tables with gather + packed-GQA SDPA (a key mask hides each row's last-page tail)."""

    name = "paged_sdpa"
    graphable = False  # the gather's width follows the longest row, so shapes change from step to step

    def __init__(self, page_size: int, device: torch.device) -> None:
        self.page_size, self.device = page_size, device
        self._pages: torch.Tensor | None = None  # [B, most pages] page ids (a row's short list padded)
        self._mask: torch.Tensor | None = None  # [B, 1, 1, most pages * page_size] bool

    def plan(self, tables: PageTables, batch: int) -> None:
        ptr = tables.indptr.tolist()
        most = max(ptr[r + 1] - ptr[r] for r in range(batch))
        ids = torch.empty((batch, most), dtype=torch.long)
        for r in range(batch):
            row = tables.indices[ptr[r] : ptr[r + 1]].long()
            ids[r] = torch.cat([row, row[-1:].expand(most - len(row))])  # padding pages are masked out
        span = torch.arange(most * self.page_size)
        mask = span[None, :] < torch.tensor(tables.lengths[:batch])[:, None]
        self._pages, self._mask = ids.to(self.device), mask[:, None, None, :].to(self.device)

    def run(self, module, query, k_pages, v_pages, scaling):
        b, heads, dim = self._pages.shape[0], k_pages.shape[2], k_pages.shape[3]
        k = k_pages[self._pages].reshape(b, -1, heads, dim).transpose(1, 2)
        v = v_pages[self._pages].reshape(b, -1, heads, dim).transpose(1, 2)
        out, _ = packed_gqa_attention(module, query, k, v, self._mask, scaling=scaling)
        return out


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


class FlashInferDecode:
    """FlashInfer's batch decode over the page tables. Under CUDA graphs: one wrapper per batch bucket, each
    with fixed index buffers (FlashInfer's CUDA-graph mode fixes the batch size per wrapper); ``plan`` before
    the graph's capture and before every replay rewrites those buffers in place. The float workspace is
    shared: graphs replay one at a time on one stream."""

    name = "flashinfer"
    graphable = True

    def __init__(self, *, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, pages_per_row: int,
                 dtype: torch.dtype, device: torch.device, cuda_graphs: bool, scaling: float | None = None) -> None:
        import flashinfer

        self._fi, self.device, self.dtype = flashinfer, device, dtype
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.page_size, self.scaling = page_size, scaling
        # FlashInfer's recommended split-k workspace; zeroed before its first use, as it asks
        self._workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        self._wrappers: dict[int, object] = {}  # batch size (graphs) or 0 (eager: one wrapper for any batch)
        self._cuda_graphs = cuda_graphs
        self._pages_per_row = pages_per_row
        self._current: object | None = None
        # FlashInfer's CUDA-core decode is compiled for query groups 1, 2, 3, 4, 6, 8 and 16 only
        # (DISPATCH_GQA_GROUP_SIZE) and it recommends tensor cores for large groups: Qwen2.5-7B's group is 7
        self.tensor_cores = num_qo_heads // num_kv_heads > 4

    def _wrapper(self, batch: int):
        key = batch if self._cuda_graphs else 0
        w = self._wrappers.get(key)
        if w is None:
            if self._cuda_graphs:
                i32 = dict(dtype=torch.int32, device=self.device)
                w = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                    self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.tensor_cores,
                    paged_kv_indptr_buffer=torch.zeros(batch + 1, **i32),
                    paged_kv_indices_buffer=torch.zeros(batch * self._pages_per_row, **i32),
                    paged_kv_last_page_len_buffer=torch.zeros(batch, **i32),
                )
            else:
                w = self._fi.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD", use_tensor_cores=self.tensor_cores)
            self._wrappers[key] = w
        return w

    def plan(self, tables: PageTables, batch: int) -> None:
        w = self._wrapper(batch)
        qo, kv, dim = self.heads
        # host tensors: plan schedules on the host and copies them into the wrapper's (fixed) device buffers
        w.plan(tables.indptr, tables.indices, tables.last_page_len, qo, kv, dim, self.page_size,
               q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.scaling)
        self._current = w

    def run(self, module, query, k_pages, v_pages, scaling):
        if scaling is not None and self.scaling is not None and abs(scaling - self.scaling) > 1e-9:
            raise ValueError(f"layer softmax scale {scaling} differs from the planned {self.scaling}")
        out = self._current.run(query[:, :, 0].contiguous(), (k_pages, v_pages))  # [B, H, D]
        return out[:, None]


def probe_flashinfer(**reader_args) -> FlashInferDecode:
    """A ``FlashInferDecode`` that has planned and run one step on zeros: FlashInfer builds (JIT) or loads its
    kernels at first use, so a machine where that fails is found at startup, not at the first answer."""
    reader = FlashInferDecode(**reader_args)
    qo, kv, dim = reader.heads
    pages = torch.zeros((1, reader.page_size, kv, dim), dtype=reader.dtype, device=reader.device)
    reader.plan(page_tables([1], reader.page_size, 1), 1)
    out = reader.run(None, torch.zeros((1, qo, 1, dim), dtype=reader.dtype, device=reader.device), pages, pages, None)
    torch.cuda.synchronize(reader.device)
    if out.shape != (1, 1, qo, dim):
        raise RuntimeError(f"FlashInfer decode returned shape {tuple(out.shape)}, expected {(1, 1, qo, dim)}")
    return reader


def paged_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           paged_decode: PagedDecode | None = None, **kwargs):
    """The registered attention function: a decode step with a ``paged_decode`` reader goes to it (``key`` /
    ``value`` are then the layer's paged buffers, from ``SlotKVCache.update``); anything else is packed GQA."""
    if paged_decode is not None and query.shape[2] == 1:
        for feature in ("sliding_window", "softcap", "s_aux"):  # read by neither reader: refused, not ignored
            if kwargs.get(feature) is not None:
                raise NotImplementedError(f"paged decode does not apply {feature}; use attention: packed_gqa")
        return paged_decode.run(module, query, key, value, scaling), None
    return packed_gqa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                is_causal=is_causal, **kwargs)


# ------------------------------------------------------------------ which reader serves a model
def paged_unsupported(cfg) -> str | None:
    """Why a paged decode reader cannot serve this model (it reads whole pages with plain softmax), or None."""
    if getattr(cfg, "use_sliding_window", False) or (
        getattr(cfg, "sliding_window", None) and "use_sliding_window" not in cfg.to_dict()
    ):
        return "does not apply sliding-window attention (the model's config uses it)"
    if getattr(cfg, "attn_logit_softcapping", None):
        return "does not apply attention soft-capping (the model's config uses it)"
    return None


def reader_for(attention: str, model, cfg, attn: str, *, heads: int, kv_heads: int, head_dim: int, device: torch.device,
               dtype: torch.dtype, max_seq_len: int, static_kv: bool, cuda_graphs: bool) -> PagedDecode | None:
    """The paged decode reader ``attention`` asks for; None where ``"auto"`` finds no working FlashInfer
    (not CUDA, not installed, or its kernels fail to build or run: then the warning says why)."""
    sdpa_like = attn in SDPA_FAMILY
    problem = paged_unsupported(cfg)
    if attention == "paged_sdpa":
        if problem is None and not sdpa_like:
            problem = f"needs an SDPA model, not {attn!r}"
        if problem is not None:
            raise ValueError(f"attention='paged_sdpa' {problem}")
        return GatherDecode(PAGE_SIZE, device)
    if problem is None and device.type != "cuda":
        problem = f"needs a CUDA device (the model is on {device.type})"
    elif problem is None and not flashinfer_available():
        problem = "needs FlashInfer: pip install 'omni-rt[gpu]'"
    elif problem is None and not sdpa_like:
        problem = f"needs an SDPA model, not {attn!r}"
    if problem is not None:
        if attention == "auto":
            return None
        raise ValueError(f"attention='flashinfer' {problem}")
    # the decoder layers' softmax scale (attention modules carry layer_idx); run() checks every layer's
    scaling = next((m.scaling for m in model.modules()
                    if hasattr(m, "layer_idx") and isinstance(getattr(m, "scaling", None), float)), None)
    try:
        return probe_flashinfer(
            num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, page_size=PAGE_SIZE,
            pages_per_row=-(-max_seq_len // PAGE_SIZE), dtype=dtype, device=device,
            cuda_graphs=cuda_graphs and static_kv, scaling=scaling,
        )
    except Exception as exc:  # JIT build without nvcc, an unsupported head_dim or dtype, ...
        if attention != "auto":
            raise
        log.warning("FlashInfer decode unavailable (%s: %s); using packed-GQA SDPA", type(exc).__name__, exc)
        return None
