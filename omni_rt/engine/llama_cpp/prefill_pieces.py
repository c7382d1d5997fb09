"""A long new prompt fed to llama-server one batch at a time, paused while a short request is prefilling.

Why (issue #26): llama-server fills each ``-b`` batch slot by slot, and the scheduler puts a short request in
a lower slot than a long one (``LlamaCppThinker._take_slot``), so the short one's tokens go first — but the
long prefill still fills the rest of every batch. The short request's forward is then a full 16-token batch
instead of its own dozen tokens, and it waits behind the full batch in flight when it arrives, so a bystander's
first token took several times its solo time beside a heavy session. llama-server has no
per-request batch share, so omni-rt feeds a heavy prompt's new tokens itself: prefill-only requests
(``n_predict: 0``, the same slot, ``cache_prompt``) each one batch longer than the last, and before each one it
waits while any short request is still prefilling (``ShortPrefills``). The real request then finds all but
the last piece cached; the heavy prompt pays one small HTTP round trip per piece, a few percent of a
16-token forward. Numbers: docs/tuning-cpu.md ("prefill pieces"), docs/benchmarks/soak.md.

Why heavy prompts also hold each other back (issue #51): llama-server fills each batch in slot order and a
heavy request takes the highest free slot, so when every session sends long turns, the heavy prefills in low
slots take every batch whole and a heavy prompt parked in a high slot got no token for minutes while the
sessions below kept starting turns. A heavy prompt still prefilling ``AGE_CAP_S`` after it started is aged
(``ShortPrefills.begin_heavy``): the pieces of every heavy prompt that started after it wait for it (up to
``AGED_WAIT_CAP_S`` a piece: with several younger prompts each sending a piece every ``WAIT_CAP_S``, their
pieces alone filled the batches), so the oldest one gets the batches and finishes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)

WAIT_CAP_S = 0.5  # at most this long per piece behind short prefills: a heavy prompt is slowed, never starved
AGE_CAP_S = 2.0  # a heavy prompt still prefilling this long after it started holds younger heavy pieces back
AGED_WAIT_CAP_S = 5.0  # at most this long per piece behind an aged heavy prompt (one stuck upstream ends no one)


class ShortPrefills:
    """The requests whose prefill the heavy pieces wait for: the short (not heavy) requests that hold a slot and
    have not produced their first words yet (the thinker's ``short_priority_tokens``: its first token, then the
    next ones of its first clause, would otherwise share each forward with a heavy piece again), and the aged
    heavy prompts (``begin_heavy`` more than ``AGE_CAP_S`` ago), which hold back only the heavy prompts that
    started after them.

    Lives in the scheduler's event loop; its methods are called from its generate coroutines."""

    def __init__(self) -> None:
        self._n = 0
        self._heavy: dict[object, float] = {}  # a heavy request before its first token -> when it started
        self._changed: asyncio.Event | None = None  # set (and replaced) at every change: waiters look again

    def _pulse(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _aged(self, now: float) -> list[tuple[object, float]]:
        return [(k, s) for k, s in self._heavy.items() if now - s >= AGE_CAP_S]

    @property
    def count(self) -> int:
        """Short prefills and aged heavy ones: what a paced answer steps out for."""
        return self._n + len(self._aged(time.perf_counter()))

    def enter(self) -> None:
        self._n += 1
        self._pulse()

    def leave(self) -> None:
        self._n = max(0, self._n - 1)
        self._pulse()

    def begin_heavy(self, key: object, since: float) -> None:
        """``key``'s heavy prefill started at ``since`` (perf_counter); aged ``AGE_CAP_S`` later."""
        self._heavy.setdefault(key, since)

    def end_heavy(self, key: object) -> None:
        """``key`` has its first token (or ended): younger heavy pieces go on."""
        if self._heavy.pop(key, None) is not None:
            self._pulse()

    def _holds(self, key: object | None, since: float | None, now: float) -> tuple[bool, bool]:
        """(a short request is prefilling, an aged heavy one older than ``since`` other than ``key`` is)."""
        return self._n > 0, any(k != key and (since is None or s < since) for k, s in self._aged(now))

    async def wait_idle(self, cap_s: float = WAIT_CAP_S, key: object | None = None, since: float | None = None,
                        aged_cap_s: float | None = None) -> float:
        """Wait while a short request is prefilling (at most ``cap_s``) or an aged heavy one that started before
        ``since`` (None: any) other than ``key`` is (at most ``aged_cap_s``, default ``cap_s``); returns the
        seconds waited."""
        aged_cap = cap_s if aged_cap_s is None else aged_cap_s
        t0 = time.perf_counter()
        if not any(self._holds(key, since, t0)):
            return 0.0
        for _ in range(100_000):  # a pass per change or per 50 ms; the caps end it anyway
            now = time.perf_counter()
            short, aged = self._holds(key, since, now)
            left = max(cap_s - (now - t0) if short else 0.0, aged_cap - (now - t0) if aged else 0.0)
            if left <= 0:
                break
            if self._changed is None:
                self._changed = asyncio.Event()
            try:  # a heavy prompt ages without an event: look again every 50 ms
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except asyncio.TimeoutError:
                pass
        return time.perf_counter() - t0


def prefill_only_body(ids: list[int], slot: int) -> dict[str, Any]:
    """A llama-server ``/completions`` body that only prefills ``ids`` into ``slot``'s cache (no token out)."""
    return {"prompt": ids, "n_predict": 0, "id_slot": slot, "cache_prompt": True}


async def prefill_in_pieces(
    client: httpx.AsyncClient,
    url: str,
    ids: list[int],
    *,
    cached: int,
    piece: int,
    slot: int,
    shorts: ShortPrefills,
    whole: bool = False,
    key: object | None = None,
    since: float | None = None,
) -> dict[str, Any]:
    """Prefill ``ids[:n]`` in ``slot`` for growing ``n`` (``cached + piece``, ``+ 2 piece``, ...), leaving the
    last piece or less to the real request (``whole``: all of ``ids``, for a prompt no request follows yet). A
    failed piece ends the feeding (the real request prefills the rest); cancellation propagates (the open piece
    request is closed, and llama-server drops it). ``complete``: every piece went in. ``key``/``since``: the
    request and when it started, for ``ShortPrefills`` (the caller registers it with ``begin_heavy``, so it ages
    even while a piece is stuck, and ends it at its first token); without them (a hint) it waits for every aged
    prompt."""
    sent, waited = 0, 0.0
    ends = list(range(cached + piece, len(ids), piece)) + ([len(ids)] if whole and len(ids) > cached else [])
    for end in ends:
        waited += await shorts.wait_idle(key=key, since=since, aged_cap_s=AGED_WAIT_CAP_S)
        try:
            resp = await client.post(url, json=prefill_only_body(ids[:end], slot))
        except httpx.HTTPError as exc:
            log.debug("prefill piece to %d tokens failed (%s): the request prefills the rest", end, exc)
            break
        if resp.status_code != 200:
            log.debug("prefill piece to %d tokens: HTTP %d; the request prefills the rest", end, resp.status_code)
            break
        sent += 1
    return {"pieces": sent, "waited_s": round(waited, 4), "complete": sent == len(ends)}
