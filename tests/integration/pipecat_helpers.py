"""Running a Pipecat pipeline under a test, bounded: Pipecat's own worker runs it while the test's scenario drives
it; the scenario's end (or failure) ends the pipeline with an ``EndFrame`` (the service closes its session), and a
pipeline that does not finish is cancelled, so no worker outlives its test on the shared event loop."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

END_TIMEOUT_S = 20.0  # an EndFrame reaches the pipeline's end in well under a second


async def run_pipeline(worker: Any, started: asyncio.Event, scenario: Callable[[], Awaitable[None]], timeout: float) -> None:
    """Run ``worker`` (a ``PipelineWorker`` whose ``on_pipeline_started`` sets ``started``) and, once it has
    started, ``scenario()`` within ``timeout`` seconds; re-raises the scenario's failure after the pipeline is
    down."""
    from pipecat.frames.frames import EndFrame
    from pipecat.workers.runner import WorkerRunner

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), timeout=30)
        await asyncio.wait_for(scenario(), timeout=timeout)
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(asyncio.shield(running), timeout=END_TIMEOUT_S)
        except TimeoutError:
            await runner.cancel("the test's pipeline did not end")
            await asyncio.wait_for(running, timeout=END_TIMEOUT_S)
