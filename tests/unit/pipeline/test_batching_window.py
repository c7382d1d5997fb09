"""Experiment 2: the batching window, idle-immediate vs windowed."""

from __future__ import annotations

import asyncio
import time

import pytest

from omni_rt.pipeline.messages import IncomingMessage

try:  # the repo root is on sys.path (python -m pytest / PYTHONPATH=.)
    from tests import toy_stages as toy
except ImportError:  # bare `pytest`: pytest put tests/ itself on sys.path
    import toy_stages as toy  # type: ignore[no-redef]
running, stage = toy.running, toy.stage

WINDOW_MS = 200


def _config(batch_wait_when_idle: bool) -> dict:
    return {
        "entry": "encoder",
        "stages": [stage("encoder", "create_encoder", terminal=True,
                         args={"max_batch_wait_ms": WINDOW_MS, "batch_wait_when_idle": batch_wait_when_idle})],
    }


async def _lone(coord, rid: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    res = await asyncio.wait_for(coord.submit(rid, 0), 5)
    return time.perf_counter() - t0, res


@pytest.mark.parametrize("batch_wait_when_idle", [True, False])
async def test_simultaneous_requests_batch_together(batch_wait_when_idle):
    async with running(_config(batch_wait_when_idle)) as coord:
        results = await asyncio.wait_for(asyncio.gather(*(coord.submit(f"burst-{i}", i) for i in range(4))), 5)
        assert [r["batch_size"] for r in results] == [4, 4, 4, 4]
        assert [r["x"] for r in results] == [0, 1, 2, 3]  # each request got its own output back

        waited, lone = await _lone(coord, "lone")
        assert lone["batch_size"] == 1
        if batch_wait_when_idle:
            assert waited >= 0.18, f"windowed batching should wait out the {WINDOW_MS} ms window, took {waited:.3f}s"
        else:
            # best of three, so a noisy machine cannot fail it; the window is 200 ms
            best = min([waited] + [(await _lone(coord, f"lone{i}"))[0] for i in range(2)])
            assert best < 0.12, f"an idle stage must dispatch a lone request at once, took {best:.3f}s"
        assert coord.live_total() == 0


def test_collect_batch_direct_idle_immediate_arms_window_after_second_request():
    """Driven directly: with two queued requests the window arms and a third joining within it is batched."""
    sched = toy.create_encoder(max_batch_wait_ms=300, batch_wait_when_idle=False)
    sched.inbox.put(IncomingMessage("a", "new_request", 1))
    sched.inbox.put(IncomingMessage("b", "new_request", 2))
    sched.start()
    try:
        time.sleep(0.05)
        sched.inbox.put(IncomingMessage("c", "new_request", 3))  # joins the armed window
        outs = [sched.outbox.get(timeout=3) for _ in range(3)]
        assert [(o.request_id, o.data["batch_size"]) for o in outs] == [("a", 3), ("b", 3), ("c", 3)]
        # an abort while the window is open removes that request from the batch
        sched.inbox.put(IncomingMessage("d", "new_request", 4))
        sched.inbox.put(IncomingMessage("e", "new_request", 5))
        sched.inbox.put(IncomingMessage("d", "abort"))
        outs = [sched.outbox.get(timeout=3)]
        assert [(o.request_id, o.data["batch_size"]) for o in outs] == [("e", 1)]
        assert toy.drain(sched.outbox, 0.1) == []
        assert sched.live_state() == 0
    finally:
        sched.stop()
