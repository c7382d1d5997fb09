"""Abort mid-stream, late outputs, consumers leaving early, and one request failing without harming others."""

from __future__ import annotations

import asyncio

import pytest

from omni_rt.pipeline.coordinator import PipelineError, StreamItem

try:  # the repo root is on sys.path (python -m pytest / PYTHONPATH=.)
    from tests import toy_stages as toy
except ImportError:  # bare `pytest`: pytest put tests/ itself on sys.path
    import toy_stages as toy  # type: ignore[no-redef]
poll_until, running, stage = toy.poll_until, toy.running, toy.stage


async def test_abort_mid_stream_returns_live_state_to_zero():
    async with running(toy.stream_config()) as coord:
        seen = []
        with pytest.raises(PipelineError) as info:
            async for item in coord.stream("r", {"steps": 200, "step_delay": 0.01}):
                seen.append(item)
                if len(seen) == 3:
                    assert coord.live_total() > 0  # the request holds state while it runs
                    coord.abort("r")
        assert info.value.code == "aborted"
        assert all(isinstance(i, StreamItem) for i in seen) and len(seen) < 200
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()
        # the pipeline keeps serving, and the same id can be used again
        res = await asyncio.wait_for(coord.submit("r", {"steps": 2}), 10)
        assert res["total_samples"] == 4


async def test_late_outputs_of_an_aborted_request_are_dropped():
    """A talker that ignores aborts keeps emitting: the shell drops all of it, nothing reaches the client."""
    cfg = toy.stream_config(talker_args={"honor_abort": False})
    async with running(cfg) as coord:
        talker_stage, voc_stage = coord.stages["talker"], coord.stages["vocoder"]
        talker = talker_stage.scheduler
        agen = coord.stream("late", {"steps": 30, "step_delay": 0.01})
        first = await asyncio.wait_for(agen.__anext__(), 5)
        assert isinstance(first, StreamItem)
        already_queued = coord._requests["late"].queue.qsize()
        coord.abort("late")
        # the talker goes on generating; everything it emits after the abort is dropped at its shell
        assert await poll_until(lambda: talker.emitted_after_abort >= 5, timeout=5)
        assert await poll_until(lambda: talker_stage.dropped_outputs >= 5, timeout=5)
        # the consumer gets only the items already queued before the abort, then the abort error
        rest = []
        with pytest.raises(PipelineError) as info:
            async for item in agen:
                rest.append(item)
        assert info.value.code == "aborted"
        assert len(rest) == already_queued and all(isinstance(i, StreamItem) for i in rest)
        # wait until the talker has finished (its result is dropped too), then nothing is left anywhere
        assert await poll_until(lambda: talker.live_state() == 0 and talker._current is None, timeout=5)
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()
        assert "late" not in voc_stage.active and voc_stage.scheduler.live_state() == 0


async def test_consumer_breaking_out_of_stream_aborts_request():
    async with running(toy.stream_config()) as coord:
        n = 0
        async for item in coord.stream("brk", {"steps": 200, "step_delay": 0.01}):
            n += 1
            if n == 2:
                break
        # the generator is finalized on the event loop: the request is aborted everywhere
        assert await poll_until(lambda: "brk" in coord.stages["talker"].aborted, timeout=3)
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


async def test_cancelled_consumer_aborts_request():
    async with running(toy.stream_config()) as coord:
        async def consume():
            async for _ in coord.stream("cxl", {"steps": 200, "step_delay": 0.01}):
                pass

        task = asyncio.ensure_future(consume())
        assert await poll_until(lambda: coord.stages["vocoder"].scheduler.orders.get("cxl"), timeout=3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "cxl" in coord.stages["talker"].aborted
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


def _flaky_config() -> dict:
    return {
        "entry": "flaky",
        "stages": [
            stage("flaky", "create_flaky", next="after"),
            stage("after", "create_identity", terminal=True),
        ],
    }


async def test_failing_stage_fails_only_its_request():
    async with running(_flaky_config()) as coord:
        bad = asyncio.ensure_future(coord.submit("bad", {"id": "bad", "fail": True, "sleep": 0.05}))
        good = asyncio.ensure_future(coord.submit("good", {"id": "good", "sleep": 0.1}))
        with pytest.raises(PipelineError) as info:
            await asyncio.wait_for(bad, 5)
        assert info.value.stage == "flaky"
        assert "boom on bad" in str(info.value) and "ValueError" in str(info.value)
        assert await asyncio.wait_for(good, 5) == {"ok": "good"}
        # the stage keeps serving afterwards
        assert await asyncio.wait_for(coord.submit("after", {"id": "after"}), 5) == {"ok": "after"}
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


async def test_failing_streaming_stage_mid_stream_frees_everything():
    """The vocoder fails on chunk 1 while more chunks of that request wait in its inbox; nothing may leak."""
    cfg = toy.stream_config(vocoder_args={"decode_delay": 0.02})
    async with running(cfg) as coord:
        bad = asyncio.ensure_future(coord.submit("bad", {"steps": 6, "fail_at": 1, "tail_delay": 0.5}))
        good = asyncio.ensure_future(coord.submit("good", {"steps": 3}))
        with pytest.raises(PipelineError) as info:
            await asyncio.wait_for(bad, 5)
        assert info.value.stage == "vocoder" and "cannot decode step 1" in str(info.value)
        assert (await asyncio.wait_for(good, 5))["total_samples"] == 6
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()
        assert (await asyncio.wait_for(coord.submit("again", {"steps": 2}), 5))["total_samples"] == 4


async def test_route_fn_outside_next_fails_that_request_clearly():
    cfg = {
        "entry": "a",
        "stages": [
            stage("a", "create_identity", next=["b"], route_fn=f"{toy.M}:route_outside_next"),
            stage("b", "create_identity", terminal=True),
        ],
    }
    async with running(cfg) as coord:
        with pytest.raises(PipelineError) as info:
            await asyncio.wait_for(coord.submit("r", {"x": 1}), 5)
        assert info.value.stage == "a"
        msg = str(info.value)
        assert "route_fn" in msg and "nowhere" in msg, msg
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()
