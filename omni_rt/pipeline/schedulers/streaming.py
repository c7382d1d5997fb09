"""StreamingSimpleScheduler: a stage that computes on stream chunks as they arrive.

Handles every ordering of the three inputs of a request: chunks, ``stream_done`` (once per stream source)
and the payload. A request completes (``on_complete``) only when it has its payload, every stream source has
said done, and none of its deferred work is left.

Deferred work (``defer``) is how a stage shared by several sessions chooses what to compute next: messages
are cheap bookkeeping and are all taken from the inbox first; then one unit of work runs, the one due
earliest. A talker says a response's first clause is due at once and a later one when the audio before it
will have played, so a new answer's first audio goes ahead of the tail of a long answer that is already
sounding (what a FIFO inbox cannot do: there the newcomer waits behind every clause queued before it).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from omni_rt.pipeline.messages import IncomingMessage, StageTiming
from omni_rt.pipeline.schedulers.base import ThreadedScheduler


@dataclass
class StreamState:
    payload: Any = None
    has_payload: bool = False
    done_sources: set[str] = field(default_factory=set)
    user: dict[str, Any] = field(default_factory=dict)  # subclass per-request state
    timed: bool = False  # the first stream output has carried its StageTiming
    pending: int = 0  # deferred units not yet run


    def inputs_complete(self, sources: set[str]) -> bool:
        """The payload arrived and every stream source said ``stream_done``."""
        return self.has_payload and sources <= self.done_sources


@dataclass(order=True)
class _Work:
    due: float  # perf_counter seconds: earliest first
    seq: int  # then in the order deferred (keeps one request's units in order when their due times tie)
    request_id: str = field(compare=False)
    state: StreamState = field(compare=False)
    run: Callable[[], None] = field(compare=False)
    arrived: float = field(compare=False)  # when the message that produced it reached the inbox


class StreamingSimpleScheduler(ThreadedScheduler):
    """Override ``on_stream_chunk``, ``on_stream_done`` and ``on_complete``; emit with ``self.emit``.

    A request's first ``stream`` output emitted while a message is handled carries a ``StageTiming``: the
    message's wait in the inbox, and the time from taking it to that output (what the first clause's
    synthesis, the first audio chunk cost). Two clock reads per message; nothing per later output."""

    accepts_streams = True

    def __init__(self, name: str = "streaming") -> None:
        super().__init__()
        self.name = name
        self.stream_sources: list[str] = []  # set by the pipeline builder from the compiled routing
        self.states: dict[str, StreamState] = {}
        self._handling: tuple[str, StreamState, float, float] | None = None  # (request, state, arrived, taken)
        self._work: list[_Work] = []  # heap of deferred units
        self._seq = itertools.count()

    # ---- hooks -------------------------------------------------------------------------------------
    def on_payload(self, request_id: str, state: StreamState) -> None:
        """The payload arrived (before, between or after chunks)."""

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        raise NotImplementedError

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        """One stream source finished. Default: nothing (emit already-computed tail here if needed)."""

    def on_complete(self, request_id: str, state: StreamState) -> None:
        """Payload present and all streams done: emit the final ``result``."""
        self.emit(request_id, "result", state.payload)

    def on_abort(self, request_id: str, state: StreamState) -> None:
        """Release per-request resources."""

    # ---- machinery ---------------------------------------------------------------------------------
    def live_state(self) -> int:
        return len(self.states)

    def _expected_done(self) -> set[str]:
        return set(self.stream_sources)

    def arrived(self) -> float:
        """When the message being handled reached the inbox (now, outside a handler)."""
        return self._handling[2] if self._handling is not None else time.perf_counter()

    def defer(self, request_id: str, state: StreamState, run: Callable[[], None], due: float) -> None:
        """Run ``run`` later, when it is the earliest ``due`` (perf_counter s) of all requests' deferred work.
        Call from a hook; the request completes only after its deferred units have run (an abort drops them)."""
        state.pending += 1
        heapq.heappush(self._work, _Work(due, next(self._seq), request_id, state, run, self.arrived()))

    def run_loop(self) -> None:
        while self.running:
            if not self._work:
                self._handle_safely(self.inbox.get())
            while True:  # every waiting message first: they may abort work or bring work due sooner
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._handle_safely(msg)
            if self._work and self.running:
                self._run_due()

    def _run_due(self) -> None:
        work = heapq.heappop(self._work)
        rid, state = work.request_id, work.state
        if self.states.get(rid) is not state:  # aborted or failed since: its work is dropped
            return
        self._handling = (rid, state, work.arrived, time.perf_counter())
        try:
            work.run()
        except Exception as exc:  # noqa: BLE001 - fail the request, keep the stage alive
            self._fail(rid, exc)
            return
        finally:
            self._handling = None
        state.pending -= 1
        self._complete_if_ready(rid, state)

    def _complete_if_ready(self, request_id: str, state: StreamState) -> None:
        if state.pending == 0 and state.inputs_complete(self._expected_done()):
            del self.states[request_id]
            self.on_complete(request_id, state)

    def _handle_safely(self, msg: IncomingMessage) -> None:
        """Handle one message; an exception fails that message's request only."""
        try:
            self._handle(msg)
        except Exception as exc:  # noqa: BLE001 - fail the request, keep the stage alive
            self._fail(msg.request_id, exc)
        finally:
            self._handling = None

    def emit(self, request_id: str, type_: str, data=None, **metadata) -> None:
        h = self._handling
        if type_ == "stream" and h is not None and h[0] == request_id and not h[1].timed:
            h[1].timed = True
            metadata.setdefault("timing", StageTiming.since(h[2], h[3]))
        super().emit(request_id, type_, data, **metadata)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        """Drop a request's state (``on_abort``) and report the error downstream."""
        state = self.states.pop(request_id, None)
        if state is not None:
            try:
                self.on_abort(request_id, state)
            except Exception:  # noqa: BLE001
                pass
        self.emit_error(request_id, exc)

    def _handle(self, msg: IncomingMessage) -> None:
        rid = msg.request_id
        if msg.type == "abort":
            if msg.data == "__stop__":
                return
            state = self.states.pop(rid, None)
            if state is not None:
                self.on_abort(rid, state)
            return
        state = self.states.get(rid)
        if state is None:
            state = self.states[rid] = StreamState()
        self._handling = (rid, state, msg.t, time.perf_counter())
        if msg.type == "new_request":
            state.payload, state.has_payload = msg.data, True
            self.on_payload(rid, state)
        elif msg.type == "stream_chunk":
            self.on_stream_chunk(rid, state, msg.data, msg.source)
        elif msg.type == "stream_done":
            state.done_sources.add(msg.source or "")
            self.on_stream_done(rid, state, msg.source)
        self._complete_if_ready(rid, state)
