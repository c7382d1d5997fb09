"""``ShortPrefills``: the gate a heavy prompt's pieces wait at while short requests prefill (issue #26)."""

from __future__ import annotations

import asyncio
import time

from omni_rt.engine.llama_cpp.prefill_pieces import ShortPrefills


def test_waits_until_the_last_short_request_has_its_first_token():
    async def run() -> tuple[float, float]:
        shorts = ShortPrefills()
        assert await shorts.wait_idle() == 0.0  # nothing prefilling: no wait at all
        shorts.enter()
        shorts.enter()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, shorts.leave)
        loop.call_later(0.15, shorts.leave)
        t0 = time.perf_counter()
        waited = await shorts.wait_idle(cap_s=5.0)
        return waited, time.perf_counter() - t0

    waited, elapsed = asyncio.run(run())
    assert 0.1 <= waited <= elapsed < 3.0, (waited, elapsed)


def test_a_heavy_prompt_is_slowed_never_starved():
    async def run() -> float:
        shorts = ShortPrefills()
        shorts.enter()  # a short request that never gets its first token (queued, or stuck upstream)
        return await shorts.wait_idle(cap_s=0.1)

    waited = asyncio.run(run())
    assert 0.09 <= waited < 2.0, waited


def test_leave_never_goes_below_zero():
    async def run() -> int:
        shorts = ShortPrefills()
        shorts.leave()
        shorts.enter()
        return shorts.count

    assert asyncio.run(run()) == 1
