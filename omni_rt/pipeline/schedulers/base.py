"""The scheduler protocol every stage scheduler implements, and a thread-safe outbox that wakes the shell."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Protocol, runtime_checkable

from omni_rt.pipeline.messages import IncomingMessage, OutgoingMessage


class Outbox(queue.Queue):
    """A ``queue.Queue`` that calls a waker after each put.

    The asyncio shell installs a waker that does ``loop.call_soon_threadsafe(event.set)``, so results reach
    the event loop in tens of microseconds instead of waiting for a polling interval.
    """

    def __init__(self) -> None:
        super().__init__()
        self._waker: Callable[[], None] | None = None

    def set_waker(self, waker: Callable[[], None] | None) -> None:
        self._waker = waker

    def put(self, item: OutgoingMessage, block: bool = True, timeout: float | None = None) -> None:  # type: ignore[override]
        super().put(item, block, timeout)
        waker = self._waker
        if waker is not None:
            waker()


@runtime_checkable
class Scheduler(Protocol):
    """Everything a stage shell or the coordinator uses of a scheduler; nobody looks further than this."""

    inbox: "queue.Queue[IncomingMessage]"
    outbox: Outbox
    accepts_streams: bool  # takes stream_chunk / stream_done (may be a `stream_to` target)

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def abort(self, request_id: str) -> None:
        """Drop a request's queued work and state."""
        ...

    def close_session(self, session_id: str) -> None:
        """A session ended: drop what is kept under its id across requests (session state, cached prefixes)."""
        ...

    def prefill_hint(self, session_id: str, payload: Any) -> None:
        """A session's next request will likely start with this one's prompt (the conversation so far, the
        user's words heard so far): a scheduler that caches prompts per session may prefill it now, while the
        user speaks, instead of on the answer's critical path. Never answered; ignored where nothing is cached."""
        ...

    def set_stream_sources(self, sources: list[str]) -> None:
        """The stages that stream into this one (compiled from the config), each ending with stream_done."""
        ...

    def live_state(self) -> int:
        """Count of per-request (or per-session) entries the scheduler still holds; 0 when idle."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters for /metrics and benchmarks (monotonic unless reset)."""
        ...

    def cache_state(self) -> dict[str, int]:
        """What the scheduler keeps beyond live requests (cached prefixes, KV bytes...); {} when nothing."""
        ...

    def release_memory(self) -> None:
        """The server is idle: hand back buffers kept only for reuse (e.g. onnxruntime arenas a long input grew).
        Called from a worker thread of the server, never while a session is open."""
        ...


class ThreadedScheduler:
    """Base for schedulers that compute in one daemon thread reading ``inbox``.

    Subclasses implement ``run_loop``. ``abort`` is thread-safe: it records the id and posts an abort
    message so a blocked loop wakes up and drops the request's state.
    """

    name: str = "scheduler"
    accepts_streams = False

    def __init__(self) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox = Outbox()
        self._thread: threading.Thread | None = None
        self._running = threading.Event()

    @property
    def running(self) -> bool:
        return self._running.is_set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._running.set()
        self._thread = threading.Thread(target=self._guarded_loop, name=f"sched-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._running.clear()
        self.inbox.put(IncomingMessage(request_id="", type="abort", data="__stop__"))
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def abort(self, request_id: str) -> None:
        self.inbox.put(IncomingMessage(request_id=request_id, type="abort"))

    def close_session(self, session_id: str) -> None:
        """Default: nothing is kept per session. Schedulers that keep some override this."""

    def prefill_hint(self, session_id: str, payload: Any) -> None:
        """Default: no prompt cache to warm. Schedulers that keep one per session override this."""

    def set_stream_sources(self, sources: list[str]) -> None:
        self.stream_sources = list(sources)

    def live_state(self) -> int:
        return 0

    def stats(self) -> dict[str, float]:
        return {}

    def cache_state(self) -> dict[str, int]:
        return {}

    def release_memory(self) -> None:
        """Default: nothing kept for reuse beyond what the allocator holds."""

    def _guarded_loop(self) -> None:
        self.run_loop()

    def run_loop(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # helpers for subclasses
    def emit(self, request_id: str, type_: str, data=None, **metadata) -> None:
        self.outbox.put(OutgoingMessage(request_id=request_id, type=type_, data=data, metadata=metadata))  # type: ignore[arg-type]

    def emit_error(self, request_id: str, exc: BaseException | str, code: str = "stage_error") -> None:
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.emit(request_id, "error", f"{self.name}: {msg}", code=code)
