"""StreamingSimpleScheduler: a stage that computes on stream chunks as they arrive.

Handles every ordering of the three inputs of a request: chunks, ``stream_done`` (once per stream source)
and the payload. A request completes (``on_complete``) only when it has its payload *and* every stream
source has said done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omni_rt.core.messages import IncomingMessage, StageTiming
from omni_rt.core.scheduler import ThreadedScheduler


@dataclass
class StreamState:
    payload: Any = None
    has_payload: bool = False
    done_sources: set[str] = field(default_factory=set)
    user: dict[str, Any] = field(default_factory=dict)  # subclass per-request state
    timed: bool = False  # the first stream output has carried its StageTiming

    def inputs_complete(self, sources: set[str]) -> bool:
        """The payload arrived and every stream source said ``stream_done``."""
        return self.has_payload and sources <= self.done_sources


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

    def run_loop(self) -> None:
        while self.running:
            self._handle_safely(self.inbox.get())

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
        if state.inputs_complete(self._expected_done()):
            del self.states[rid]
            self.on_complete(rid, state)
