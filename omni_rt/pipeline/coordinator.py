"""Coordinator: builds the stages from a PipelineConfig, submits requests, streams results, broadcasts aborts.

Requests: ``submit`` awaits the final result; ``stream`` yields ``StreamItem``s (client-visible chunks from
any stage marked ``client_stream`` and from terminal stages) and ends with the final ``ResultItem``.
Sessions: ``open_session`` registers a listener for the session stage's events, ``append`` feeds it. A typed op
(``omni_rt.contracts.audio_in``) reaches the stage as it is, and the listener gets typed events only: the stage's
own, and an error on the session as ``AsrError`` (``omni_rt.contracts.payloads``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from omni_rt.contracts.audio_in import OpenAudioIn, SessionOp
from omni_rt.contracts.payloads import AsrError
from omni_rt.pipeline.config import ConfigError, PipelineConfig, StageConfig, resolve_callable
from omni_rt.pipeline.messages import StageTiming
from omni_rt.pipeline.stage import Routing, Stage

log = logging.getLogger(__name__)


class PipelineError(RuntimeError):
    """A request failed in a stage. ``stage`` and ``code`` say where and why."""

    def __init__(self, stage: str, message: str, code: str = "stage_error") -> None:
        super().__init__(message)
        self.stage = stage
        self.code = code


@dataclass(slots=True)
class StreamItem:
    stage: str
    data: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    t: float = 0.0


@dataclass(slots=True)
class ResultItem:
    """The terminal stage's result. ``timings``: per stage, where the request's first output of that stage
    waited vs computed (stages that report it: ``OutgoingMessage`` metadata ``timing``)."""

    stage: str
    data: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    t: float = 0.0
    timings: dict[str, StageTiming] = field(default_factory=dict)


@dataclass
class _Request:
    queue: asyncio.Queue
    submitted: float
    timings: dict[str, StageTiming] = field(default_factory=dict)


EventListener = Callable[[str, Any], None]


def compile_routing(st: StageConfig) -> Routing:
    """Turn one stage's declarative routing into callables (import errors name stage and field)."""
    route_fn = resolve_callable(st.name, "route_fn", st.route_fn)
    allowed = list(st.next)

    if st.terminal:
        def get_next(request_id: str, result: Any) -> list[str]:
            return []
    elif route_fn is not None:
        def get_next(request_id: str, result: Any, _fn=route_fn) -> list[str]:
            picked = _fn(request_id, result)
            picked = [picked] if isinstance(picked, str) else list(picked)
            bad = [p for p in picked if p not in allowed]
            if bad or not picked:
                raise ValueError(f"stage '{st.name}' route_fn returned {picked}; allowed: {allowed}")
            return picked
    else:
        def get_next(request_id: str, result: Any) -> list[str]:
            return allowed

    project = {
        target: resolve_callable(st.name, "project_payload", path) for target, path in st.project_payload.items()
    }
    return Routing(
        get_next=get_next,
        project=project,  # type: ignore[arg-type]
        stream_to=list(st.stream_to),
        client_stream=st.client_stream,
        terminal=st.terminal,
        wait_for=list(st.wait_for),
        merge_fn=resolve_callable(st.name, "merge_fn", st.merge_fn),
        wait_for_fn=resolve_callable(st.name, "wait_for_fn", st.wait_for_fn),
        buffer_stream_until_payload=not st.can_accept_stream_before_payload,
    )


def build_scheduler(st: StageConfig) -> Any:
    factory = resolve_callable(st.name, "factory", st.factory)
    assert factory is not None
    try:
        return factory(**st.args)
    except TypeError as exc:
        raise ConfigError(st.name, "args", f"factory '{st.factory}' rejected its args: {exc}") from exc


class Coordinator:
    def __init__(self, config: PipelineConfig, schedulers: dict[str, Any] | None = None) -> None:
        """Build every stage. ``schedulers`` may pass prebuilt schedulers by stage name (tests, shared models)."""
        self.config = config
        self.stages: dict[str, Stage] = {}
        schedulers = schedulers or {}
        stream_sources: dict[str, list[str]] = {s.name: [] for s in config.stages}
        for st in config.stages:
            for target in st.stream_to:
                stream_sources[target].append(st.name)
        built: list[Any] = []
        try:
            for st in config.stages:
                routing = compile_routing(st)
                sched = schedulers.get(st.name)
                if sched is None:
                    sched = build_scheduler(st)
                    built.append(sched)
                self.stages[st.name] = Stage(st.name, sched, routing)
            for st in config.stages:
                for target in st.stream_to:
                    if not self.stages[target].scheduler.accepts_streams:
                        raise ConfigError(
                            st.name, "stream_to", f"target '{target}' cannot accept streams (its scheduler has no stream hooks)"
                        )
                if stream_sources[st.name]:
                    self.stages[st.name].scheduler.set_stream_sources(stream_sources[st.name])
        except BaseException:
            for sched in built:  # a built stage may already hold a process (llama.cpp launches at build)
                sched.stop()
            raise
        for stage in self.stages.values():
            stage.coordinator = self
            stage.peers = self.stages
        self.roles = config.roles.model_copy(update={"response": config.roles.response or config.entry})
        self._requests: dict[str, _Request] = {}
        self._listeners: dict[str, EventListener] = {}
        self._ids = itertools.count()
        self.started = False

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        for stage in self.stages.values():
            await stage.start()
        self.started = True

    async def stop(self) -> None:
        for rid in list(self._requests):
            self._finish(rid, PipelineError("coordinator", "pipeline is shutting down", "shutdown"))
        for stage in self.stages.values():
            await stage.stop()
        self.started = False

    def live_state(self) -> dict[str, Any]:
        """Per-stage live per-request state plus the coordinator's own; all zero when idle."""
        return {
            "requests": len(self._requests),
            "sessions": len(self._listeners),
            "stages": {name: st.live_state() for name, st in self.stages.items()},
        }

    def release_memory(self) -> None:
        """Every stage hands back what it keeps only for reuse (the server is idle); a stage that fails is logged."""
        for name, st in self.stages.items():
            try:
                st.scheduler.release_memory()
            except Exception as exc:  # noqa: BLE001 - an optimisation: a failure must not stop the others
                log.warning("stage %s: releasing memory failed: %r", name, exc)

    def live_total(self) -> int:
        state = self.live_state()
        return state["requests"] + state["sessions"] + sum(sum(v.values()) for v in state["stages"].values())

    # ---- requests --------------------------------------------------------------------------------
    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}_{next(self._ids)}"

    def _enter(self, request_id: str, payload: Any, entry: str | None) -> _Request:
        if request_id in self._requests:
            raise ValueError(f"request id '{request_id}' is already in flight")
        stage = self.stages[entry or self.config.entry]
        req = _Request(queue=asyncio.Queue(), submitted=time.perf_counter())
        self._requests[request_id] = req
        for st in self.stages.values():
            st.forget_abort(request_id)
        stage.deliver_payload(request_id, payload, None)
        return req

    async def submit(self, request_id: str, payload: Any, entry: str | None = None) -> Any:
        """Run one request through the pipeline and return the terminal stage's result."""
        async for item in self.stream(request_id, payload, entry):
            if isinstance(item, ResultItem):
                return item.data
        raise PipelineError("coordinator", "request ended without a result")

    async def stream(self, request_id: str, payload: Any, entry: str | None = None) -> AsyncIterator[StreamItem | ResultItem]:
        """Yield client-visible chunks as they are produced, then the final result. Raises PipelineError."""
        req = self._enter(request_id, payload, entry)
        try:
            while True:
                item = await req.queue.get()
                if isinstance(item, PipelineError):
                    raise item
                yield item
                if isinstance(item, ResultItem):
                    return
        finally:
            if request_id in self._requests:  # consumer left early (cancelled / closed): abort everywhere
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Broadcast: every stage drops queued work and per-request state for this id."""
        for stage in self.stages.values():
            stage.abort(request_id)
        self._finish(request_id, PipelineError("coordinator", "request aborted", "aborted"))

    def _finish(self, request_id: str, item: Any) -> None:
        req = self._requests.pop(request_id, None)
        if req is not None:
            req.queue.put_nowait(item)

    # ---- called by stage shells --------------------------------------------------------------------
    def on_stream(self, stage: str, request_id: str, data: Any, metadata: dict[str, Any]) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            req.queue.put_nowait(StreamItem(stage, data, metadata, time.perf_counter()))

    def on_result(self, stage: str, request_id: str, data: Any, metadata: dict[str, Any]) -> None:
        listener = self._listeners.get(request_id)
        if listener is not None and request_id not in self._requests:
            listener(stage, {"type": "session.result", "data": data})
            return
        req = self._requests.get(request_id)
        timings = dict(req.timings) if req is not None else {}
        self._finish(request_id, ResultItem(stage, data, metadata, time.perf_counter(), timings))

    def on_timing(self, stage: str, request_id: str, timing: StageTiming) -> None:
        """A stage's first output of a request says where it waited and computed; the first report counts."""
        req = self._requests.get(request_id)
        if req is not None:
            req.timings.setdefault(stage, timing)

    def on_error(self, stage: str, request_id: str, message: str, code: str) -> bool:
        """A stage failed ``request_id``. Returns True when that ends the request (False for session ops)."""
        listener = self._listeners.get(request_id)
        if listener is not None:
            listener(stage, AsrError(0, code, message))
            return False
        log.warning("request %s failed in stage %s: %s", request_id, stage, message)
        if request_id in self._requests:
            for st in self.stages.values():  # drop the rest of the request everywhere, the failing stage too:
                st.abort(request_id)  # its scheduler may still hold state / queued input for the request
            self._finish(request_id, PipelineError(stage, message, code))
        return True

    def on_event(self, stage: str, session_id: str, event: Any) -> None:
        listener = self._listeners.get(session_id)
        if listener is not None:
            listener(stage, event)

    # ---- sessions --------------------------------------------------------------------------------
    def open_session(self, session_id: str, stage: str, params: OpenAudioIn | dict[str, Any], listener: EventListener) -> None:
        """Open per-session state in a session stage; its events go to ``listener(stage, event)``. ``params``: the
        typed open op, delivered as it is, or (a stage without typed ops) the params of an ``open`` op. Opening
        again with the same listener opens the stage's state again (after the stage expired it, idle)."""
        known = self._listeners.get(session_id)
        if known is not None and known != listener:
            raise ValueError(f"session '{session_id}' is already open")
        self._listeners[session_id] = listener
        st = self.stages[stage]
        st.forget_abort(session_id)
        st.deliver_payload(session_id, params if isinstance(params, SessionOp) else {"op": "open", "params": params}, None)

    def session_control(self, session_id: str, stage: str, op: SessionOp | str, **data: Any) -> None:
        """A typed op, delivered as it is, or (a stage without typed ops) an op name and its data."""
        self.stages[stage].deliver_payload(session_id, op if isinstance(op, SessionOp) else {"op": op, **data}, None)

    def append(self, session_id: str, stage: str, data: Any) -> None:
        self.stages[stage].deliver_stream(session_id, data, "client")

    def prefill_hint(self, session_id: str, stage: str, payload: Any) -> None:
        """Tell ``stage`` what the session's next request will likely start with (``Scheduler.prefill_hint``)."""
        self.stages[stage].prefill_hint(session_id, payload)

    def close_session(self, session_id: str) -> None:
        """Close the session: no more events reach its listener, and every stage drops what it keeps under
        the session id (the session stage's state, a thinker's per-session prefix cache). Its own message,
        not an abort: session ids and request ids are separate namespaces."""
        self._listeners.pop(session_id, None)
        for st in self.stages.values():
            st.close_session(session_id)
