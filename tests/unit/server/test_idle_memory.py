"""``IdleMemoryRelease`` with the real ``malloc_trim``: closes close together fold into one trim, and a server
that is busy again when the trim is due does not trim."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from omni_rt.server.memory import IdleMemoryRelease


async def until(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return pred()


async def test_closes_within_the_interval_fold_into_one_trim_at_its_end() -> None:
    release = IdleMemoryRelease(min_interval_s=1.0)
    release()
    assert await until(lambda: release.releases == 1)
    assert release.last["returned_mb"] is not None and release.last["rss_after_mb"] > 0
    release(), release(), release()  # three more closes inside the interval
    await asyncio.sleep(0.3)
    assert release.releases == 1  # not yet: the interval since the last trim has not passed
    assert await until(lambda: release.releases == 2)  # one trim for the three, at the end of the interval
    await asyncio.sleep(0.3)
    assert release.releases == 2  # nothing left pending


async def test_a_session_back_before_the_trim_is_due_defers_it() -> None:
    busy = [False]
    release = IdleMemoryRelease(idle=lambda: not busy[0], min_interval_s=0.5)
    release()
    assert await until(lambda: release.releases == 1)
    release()
    busy[0] = True  # a session opened before the folded trim is due
    await asyncio.sleep(1.0)
    assert release.releases == 1
    busy[0] = False
    release()  # that session's close
    assert await until(lambda: release.releases == 2)
