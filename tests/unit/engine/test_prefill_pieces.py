"""``ShortPrefills``: the gate a heavy prompt's pieces wait at while short requests prefill (issue #26)."""

from __future__ import annotations

import asyncio
import time

from omni_rt.engine.llama_cpp.prefill_pieces import AGE_CAP_S, ShortPrefills


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


def test_an_aged_heavy_prompt_holds_younger_ones_back_not_older_ones():
    """Issue #51: a heavy prompt registered ``AGE_CAP_S`` ago holds back the pieces of heavy prompts that
    started after it and of hints (up to ``aged_cap_s``), never its own or an older one's, nor anyone before it
    has aged; ``end_heavy`` lets them go at once."""
    async def run() -> dict[str, float]:
        shorts = ShortPrefills()
        now = time.perf_counter()
        shorts.begin_heavy("fresh", since=now)
        got = {"before_aged": await shorts.wait_idle(cap_s=1.0, key="young", since=now + 1)}
        shorts.begin_heavy("old", since=now - AGE_CAP_S - 1)
        got["own"] = await shorts.wait_idle(cap_s=1.0, key="old", since=now - AGE_CAP_S - 1)
        got["older"] = await shorts.wait_idle(cap_s=1.0, key="older", since=now - AGE_CAP_S - 5)
        got["hint"] = await shorts.wait_idle(cap_s=0.1)
        got["count"] = shorts.count
        asyncio.get_running_loop().call_later(0.3, shorts.end_heavy, "old")
        t0 = time.perf_counter()
        got["younger"] = await shorts.wait_idle(cap_s=0.05, key="young", since=now, aged_cap_s=5.0)
        got["elapsed"] = time.perf_counter() - t0
        return got

    got = asyncio.run(run())
    assert got["before_aged"] == got["own"] == got["older"] == 0.0, got
    assert 0.09 <= got["hint"] < 2.0 and got["count"] == 1, got
    assert 0.25 <= got["younger"] <= got["elapsed"] < 3.0, got  # past cap_s: an aged prompt holds up to aged_cap_s
