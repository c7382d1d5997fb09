"""Stage = asyncio IO shell around a scheduler.

The shell receives messages (from the coordinator or upstream shells), does fan-in and stream buffering,
puts work into the scheduler's ``inbox``, drains its ``outbox`` in bounded bursts and routes what comes
out. It never looks at what kind of scheduler it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from omni_rt.pipeline.messages import IncomingMessage, OutgoingMessage, StageTiming
from omni_rt.pipeline.schedulers.base import Scheduler

log = logging.getLogger(__name__)

OUTBOX_BURST = 64  # messages handled before yielding the event loop to other stages


class StageOwner(Protocol):
    """What a stage reports to whoever runs the pipeline (the ``Coordinator``).

    Named here, at the stage, so the stage depends on a contract rather than on the coordinator that imports it.
    """

    def on_stream(self, stage: str, request_id: str, data: Any, metadata: dict[str, Any]) -> None: ...

    def on_result(self, stage: str, request_id: str, data: Any, metadata: dict[str, Any]) -> None: ...

    def on_timing(self, stage: str, request_id: str, timing: StageTiming) -> None: ...

    def on_error(self, stage: str, request_id: str, message: str, code: str) -> bool: ...

    def on_event(self, stage: str, session_id: str, event: Any) -> None: ...


@dataclass
class Routing:
    """What the config compiles into for one stage."""

    get_next: Callable[[str, Any], list[str]]
    project: dict[str, Callable[[str, Any], Any]]
    stream_to: list[str]
    client_stream: bool
    terminal: bool
    wait_for: list[str] = field(default_factory=list)
    merge_fn: Callable[[str, dict[str, Any]], Any] | None = None
    wait_for_fn: Callable[[str, str, Any], list[str]] | None = None
    buffer_stream_until_payload: bool = False


@dataclass
class _FanIn:
    expected: set[str]
    inputs: dict[str, Any] = field(default_factory=dict)


class Stage:
    def __init__(self, name: str, scheduler: Scheduler, routing: Routing) -> None:
        self.name = name
        self.scheduler = scheduler
        self.routing = routing
        self.coordinator: StageOwner | None = None
        self.peers: dict[str, Stage] = {}
        self.active: set[str] = set()
        self.aborted: OrderedDict[str, None] = OrderedDict()  # recent aborts, to drop late outputs
        self.fan_in: dict[str, _FanIn] = {}
        self.stream_buffer: dict[str, list[IncomingMessage]] = {}  # chunks waiting for their payload
        self.dropped_outputs = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.scheduler.outbox.set_waker(lambda: loop.call_soon_threadsafe(self._wake.set))
        self.scheduler.start()
        self._task = asyncio.create_task(self._drain(), name=f"stage-{self.name}")

    async def stop(self) -> None:
        self.scheduler.outbox.set_waker(None)
        await asyncio.to_thread(self.scheduler.stop)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def live_state(self) -> dict[str, int]:
        return {
            "active": len(self.active),
            "fan_in": len(self.fan_in),
            "stream_buffers": len(self.stream_buffer),
            "scheduler": self.scheduler.live_state(),
        }

    # ---- inbound ---------------------------------------------------------------------------------
    def _is_aborted(self, request_id: str) -> bool:
        return request_id in self.aborted

    def deliver_payload(self, request_id: str, payload: Any, source: str | None) -> None:
        """A request's payload arrives (from the coordinator or an upstream stage's result)."""
        if self._is_aborted(request_id):
            return
        r = self.routing
        if r.wait_for and source is not None and source in r.wait_for:
            pending = self.fan_in.get(request_id)
            if pending is None:
                try:
                    expected = set(r.wait_for_fn(request_id, source, payload)) if r.wait_for_fn else set(r.wait_for)
                except Exception as exc:  # noqa: BLE001 - fail the request here, not in the upstream stage
                    self._fail(request_id, f"wait_for_fn failed: {type(exc).__name__}: {exc}")
                    return
                if not expected <= set(r.wait_for):
                    self._fail(request_id, f"wait_for_fn returned {sorted(expected)}, not a subset of {r.wait_for}")
                    return
                pending = self.fan_in[request_id] = _FanIn(expected=expected)
            pending.inputs[source] = payload
            if not pending.expected <= pending.inputs.keys():
                return
            del self.fan_in[request_id]
            assert r.merge_fn is not None
            try:
                payload = r.merge_fn(request_id, {s: pending.inputs[s] for s in sorted(pending.expected)})
            except Exception as exc:  # noqa: BLE001 - fail the request here, not in the upstream stage
                self._fail(request_id, f"merge_fn failed: {type(exc).__name__}: {exc}")
                return
        self.active.add(request_id)
        self.scheduler.inbox.put(IncomingMessage(request_id, "new_request", payload, source))
        for msg in self.stream_buffer.pop(request_id, []):
            self.scheduler.inbox.put(msg)

    def deliver_stream(self, request_id: str, data: Any, source: str, done: bool = False) -> None:
        if self._is_aborted(request_id):
            return
        msg = IncomingMessage(request_id, "stream_done" if done else "stream_chunk", data, source)
        if self.routing.buffer_stream_until_payload and request_id not in self.active:
            self.stream_buffer.setdefault(request_id, []).append(msg)
            return
        self.active.add(request_id)
        self.scheduler.inbox.put(msg)

    def abort(self, request_id: str) -> None:
        """Drop everything held for the request, here and in the scheduler; later outputs are dropped."""
        self.aborted[request_id] = None
        while len(self.aborted) > 4096:
            self.aborted.popitem(last=False)
        self.active.discard(request_id)
        self.fan_in.pop(request_id, None)
        self.stream_buffer.pop(request_id, None)
        self.scheduler.abort(request_id)

    def close_session(self, session_id: str) -> None:
        """The session ended: the shell forgets it, the scheduler drops its per-session state."""
        self.active.discard(session_id)
        self.stream_buffer.pop(session_id, None)
        self.scheduler.close_session(session_id)

    def prefill_hint(self, session_id: str, payload: Any) -> None:
        """A session's likely next prompt, for the scheduler to warm its cache with (``Scheduler.prefill_hint``)."""
        self.scheduler.prefill_hint(session_id, payload)

    def forget_abort(self, request_id: str) -> None:
        """Allow a request id to be reused (session ids are reopened by reconnecting clients)."""
        self.aborted.pop(request_id, None)

    # ---- outbound --------------------------------------------------------------------------------
    async def _drain(self) -> None:
        outbox = self.scheduler.outbox
        while True:
            await self._wake.wait()
            self._wake.clear()
            handled = 0
            while True:
                try:
                    out = outbox.get_nowait()
                except Exception:  # queue.Empty
                    break
                try:
                    self._route(out)
                except Exception as exc:  # noqa: BLE001 - a routing bug must not kill the stage
                    log.exception("stage %s: routing %s failed", self.name, out.type)
                    self._fail(out.request_id, f"internal routing error: {type(exc).__name__}: {exc}")
                handled += 1
                if handled % OUTBOX_BURST == 0:
                    await asyncio.sleep(0)  # let other stages and sockets run

    def _fail(self, request_id: str, message: str, code: str = "stage_error") -> None:
        """Report an error; the coordinator says whether it ends the request (a session op's does not)."""
        if self.coordinator is None or self.coordinator.on_error(self.name, request_id, message, code):
            self.active.discard(request_id)

    def _route(self, out: OutgoingMessage) -> None:
        rid = out.request_id
        coord = self.coordinator
        assert coord is not None
        if out.type == "event":
            coord.on_event(self.name, rid, out.data)
            return
        if rid not in self.active:
            self.dropped_outputs += 1
            return
        r = self.routing
        timing = out.metadata.pop("timing", None)  # for the coordinator only, not in what the client sees
        if timing is not None:
            coord.on_timing(self.name, rid, timing)
        if out.type == "stream":
            for target in r.stream_to:
                self.peers[target].deliver_stream(rid, out.data, self.name)
            if r.client_stream or r.terminal:
                coord.on_stream(self.name, rid, out.data, out.metadata)
        elif out.type == "error":
            self._fail(rid, str(out.data), out.metadata.get("code", "stage_error"))
        elif out.type == "result":
            self.active.discard(rid)
            for target in r.stream_to:  # stream_done always precedes the final result
                self.peers[target].deliver_stream(rid, None, self.name, done=True)
            if r.terminal:
                coord.on_result(self.name, rid, out.data, out.metadata)
                return
            targets = r.get_next(rid, out.data)
            for target in targets:
                project = r.project.get(target)
                payload = project(rid, out.data) if project is not None else out.data
                self.peers[target].deliver_payload(rid, payload, self.name)
