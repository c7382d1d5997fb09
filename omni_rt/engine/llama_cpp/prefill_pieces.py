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
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)

WAIT_CAP_S = 0.5  # at most this long per piece behind short prefills: a heavy prompt is slowed, never starved


class ShortPrefills:
    """The short (not heavy) requests that hold a slot and have not produced their first words yet (the
    thinker's ``short_priority_tokens``: its first token, then the next ones of its first clause, would
    otherwise share each forward with a heavy piece again).

    Lives in the scheduler's event loop; ``enter``/``leave`` are called from its generate coroutines."""

    def __init__(self) -> None:
        self._n = 0
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:  # created in the loop that uses it
            self._idle = asyncio.Event()
            self._idle.set()
        return self._idle

    @property
    def count(self) -> int:
        return self._n

    def enter(self) -> None:
        self._n += 1
        self._event().clear()

    def leave(self) -> None:
        self._n = max(0, self._n - 1)
        if self._n == 0:
            self._event().set()

    async def wait_idle(self, cap_s: float = WAIT_CAP_S) -> float:
        """Wait until no short request is prefilling, at most ``cap_s``; returns the seconds waited."""
        if self._n == 0:
            return 0.0
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(self._event().wait(), cap_s)
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
) -> dict[str, Any]:
    """Prefill ``ids[:n]`` in ``slot`` for growing ``n`` (``cached + piece``, ``+ 2 piece``, ...), leaving the
    last piece or less to the real request (``whole``: all of ``ids``, for a prompt no request follows yet). A
    failed piece ends the feeding (the real request prefills the rest); cancellation propagates (the open piece
    request is closed, and llama-server drops it). ``complete``: every piece went in."""
    sent, waited = 0, 0.0
    ends = list(range(cached + piece, len(ids), piece)) + ([len(ids)] if whole and len(ids) > cached else [])
    for end in ends:
        waited += await shorts.wait_idle()
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
