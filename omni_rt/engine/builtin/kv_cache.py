"""Slot-based KV cache that transformers attention layers write into.

Why not transformers' own caches: ``StaticCache`` writes every batch row at one shared ``cache_position``, so
requests of different lengths cannot join and leave a running batch without re-padding it; ``DynamicCache``
concatenates (new tensors every step, no CUDA graphs, and batching rows of different lengths means left
padding that must be rebuilt when a request joins). Here each request owns a *slot* (a row of a
preallocated buffer) and writes its new K/V at its own position, gpt-fast style; the attention mask hides
each row's unused tail. Live requests always occupy slots ``0..B-1`` (the scheduler compacts on leave), so
a decode step reads the contiguous prefix ``[:B]`` — a fixed-address view a CUDA graph can capture.

The object only needs ``update(k, v, layer_idx, ...)``: that is the one call transformers' attention makes
on a cache when the caller passes a prepared 4D mask and explicit ``position_ids``.

With ``page_size`` the same buffer is also a *paged* cache (``paged``): storage is token-major per slot
(``[layers, slots, capacity, kv_heads, head_dim]``, FlashInfer's ``NHD``), so a layer's buffer reshapes
without a copy into pages of ``page_size`` tokens, slot ``s`` owning pages ``s * capacity / page_size ..``.
``k``/``v`` stay the head-major views every other method indexes, so nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class KVBlob:
    """A copy of one sequence's KV: [layers, kv_heads, tokens, head_dim] each (kept for prefix reuse)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.k.shape[2]


class SlotKVCache:
    is_compileable = False  # transformers checks this on caches; we capture graphs ourselves

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        max_capacity: int,
        initial_slots: int | None = None,
        page_size: int | None = None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.max_capacity = max_capacity
        self.num_slots = num_slots
        self.page_size = page_size
        # slots past ``initial_slots`` are allocated when first used (``ensure_capacity(.., slots=)``)
        shape = (num_layers, initial_slots or num_slots, num_kv_heads, self._pages_round(capacity), head_dim)
        self.k = self._zeros(shape, dtype, device)
        self.v = self._zeros(shape, dtype, device)
        self.rows = torch.arange(num_slots, device=device)
        self._mode = "decode"
        self._n = 0  # decode: rows in the step
        self._pos: torch.Tensor | None = None  # decode: [n] write position per row
        self._view = 0  # decode: how many positions attention reads
        self._slot = 0  # prefill: the slot
        self._start = 0  # prefill: first position written
        self._batch_write: tuple[torch.Tensor, ...] = ()  # batched prefill: (dst slot, dst pos, src row, src col)
        self._batch_rows: slice | torch.Tensor = slice(0)
        self._batch_view = 0

    def _zeros(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [layers, slots, heads, capacity, dim] buffer; token-major underneath when paged. Zeros, not empty:
        masked positions still enter SDPA's matmul with V, and 0 * NaN = NaN."""
        if self.page_size is None:
            return torch.zeros(shape, dtype=dtype, device=device)
        layers, slots, heads, cap, dim = shape
        return torch.zeros((layers, slots, cap, heads, dim), dtype=dtype, device=device).transpose(2, 3)

    def _pages_round(self, capacity: int) -> int:
        ps = self.page_size
        return capacity if ps is None else -(-capacity // ps) * ps

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def pages_per_slot(self) -> int:
        return self.capacity // (self.page_size or self.capacity)

    def paged(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer`` as FlashInfer's ``NHD`` paged cache: ``(k, v)``, each ``[slots * pages_per_slot,
        page_size, kv_heads, head_dim]``, a view of the buffer (no copy)."""
        if self.page_size is None:
            raise ValueError("this KV cache was built without page_size")
        _, slots, heads, _, dim = self.k.shape
        shape = (slots * self.pages_per_slot, self.page_size, heads, dim)
        return self.k[layer].transpose(1, 2).view(shape), self.v[layer].transpose(1, 2).view(shape)

    def bytes_per_token(self) -> int:
        layers, _, heads, _, dim = self.k.shape
        return 2 * layers * heads * dim * self.k.element_size()

    @property
    def allocated_slots(self) -> int:
        return self.k.shape[1]

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def ensure_capacity(self, needed: int, slots: int = 0) -> None:
        """Grow (CPU path only; doubling, so rarely) — the GPU path preallocates ``max_capacity`` for graphs.

        ``slots``: how many leading slots must exist. Slots are allocated lazily too, so a long request
        in one slot costs ``used slots x its length``, not ``max_batch_size x its length``."""
        slots = min(max(slots, self.allocated_slots), self.num_slots)
        if needed <= self.capacity and slots <= self.allocated_slots:
            return
        if needed > self.max_capacity:
            raise ValueError(f"sequence of {needed} tokens exceeds max_seq_len={self.max_capacity}")
        new_cap = self.capacity if needed <= self.capacity else min(self.max_capacity, max(needed, 2 * self.capacity))
        self._resize(slots, new_cap)

    def shrink(self, slots: int, needed: int, min_capacity: int) -> None:
        """Give memory back once the long or many requests that grew the buffer have left (CPU path).

        Only when it at least halves a dimension, so a buffer that is in use does not flap."""
        cap = min_capacity
        while cap < needed:
            cap *= 2
        cap = min(cap, self.max_capacity)
        slots = max(1, slots)
        if 2 * cap <= self.capacity or 2 * slots <= self.allocated_slots:
            self._resize(min(slots, self.allocated_slots), min(max(cap, needed), self.capacity))

    def _resize(self, slots: int, cap: int) -> None:
        keep_s, keep_c = min(slots, self.allocated_slots), min(cap, self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            shape = list(old.shape)
            shape[1], shape[3] = slots, self._pages_round(cap)
            new = self._zeros(shape, old.dtype, old.device)
            new[:, :keep_s, :, :keep_c] = old[:, :keep_s, :, :keep_c]
            setattr(self, name, new)
            del old

    # ---- set by the engine before each forward ----
    def for_decode(self, n: int, positions: torch.Tensor, view_len: int, paged: bool = False) -> None:
        """``paged``: the step's attention reads the page tables (``paged``), so ``update`` returns the layer's
        whole paged buffer instead of the first ``view_len`` positions of rows ``0..n-1``."""
        self._mode = "decode_paged" if paged else "decode"
        self._n, self._pos, self._view = n, positions, view_len

    def for_prefill(self, slot: int, start: int) -> None:
        self._mode, self._slot, self._start = "prefill", slot, start

    def for_prefill_batch(self, slots: list[int], starts: list[int], lengths: list[int], width: int) -> None:
        """Rows ``r`` of the next forward hold ``lengths[r]`` real tokens right-aligned in ``width`` columns,
        for ``slots[r]`` at positions ``starts[r]..``; only real tokens are written (padding would overwrite
        the row's cached prefix or run past ``max_seq_len``). Index tensors are built once per forward."""
        dst_slot, dst_pos, src_row, src_col = [], [], [], []
        for r, (s, a, n) in enumerate(zip(slots, starts, lengths)):
            dst_slot += [s] * n
            dst_pos += range(a, a + n)
            src_row += [r] * n
            src_col += range(width - n, width)
        dev = self.k.device
        self._mode = "prefill_batch"
        self._batch_write = tuple(torch.tensor(x, dtype=torch.long, device=dev)
                                  for x in (dst_slot, dst_pos, src_row, src_col))
        self._batch_view = max(a + n for a, n in zip(starts, lengths))
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        # consecutive slots are read as a view; otherwise gathered (a copy, once per layer per chunk)
        self._batch_rows = slice(slots[0], slots[0] + len(slots)) if contiguous else torch.tensor(slots, device=dev)

    # ---- the transformers Cache interface actually used ----
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        k, v = self.k[layer_idx], self.v[layer_idx]
        if self._mode in ("decode", "decode_paged"):
            n, rows = self._n, self.rows[: self._n]
            k[rows, :, self._pos] = key_states[:, :, 0]
            v[rows, :, self._pos] = value_states[:, :, 0]
            if self._mode == "decode_paged":
                return self.paged(layer_idx)
            return k[:n, :, : self._view], v[:n, :, : self._view]
        if self._mode == "prefill_batch":
            dst_slot, dst_pos, src_row, src_col = self._batch_write
            k[dst_slot, :, dst_pos] = key_states[src_row, :, src_col]
            v[dst_slot, :, dst_pos] = value_states[src_row, :, src_col]
            rows, width = self._batch_rows, self._batch_view
            return k[rows, :, :width], v[rows, :, :width]
        s, a = self._slot, self._start
        b = a + key_states.shape[2]
        k[s, :, a:b] = key_states[0]
        v[s, :, a:b] = value_states[0]
        return k[s : s + 1, :, :b], v[s : s + 1, :, :b]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only consulted when position_ids is None
        return 0

    # ---- slot bookkeeping ----
    def move(self, src: int, dst: int, n: int) -> None:
        self.ensure_capacity(n, max(src, dst) + 1)
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]

    def export(self, slot: int, n: int) -> KVBlob:
        return KVBlob(self.k[:, slot, :, :n].clone(), self.v[:, slot, :, :n].clone())

    def swap(self, a: int, b: int, n: int) -> None:
        """Exchange the first ``n`` positions of two slots (a finished prefill taking the next decode row)."""
        self.ensure_capacity(n, max(a, b) + 1)
        for t in (self.k, self.v):
            tmp = t[:, a, :, :n].clone()
            t[:, a, :, :n] = t[:, b, :, :n]
            t[:, b, :, :n] = tmp

    def load(self, slot: int, blob: KVBlob, n: int) -> None:
        self.ensure_capacity(n, slot + 1)
        self.k[:, slot, :, :n] = blob.k[:, :, :n]
        self.v[:, slot, :, :n] = blob.v[:, :, :n]
