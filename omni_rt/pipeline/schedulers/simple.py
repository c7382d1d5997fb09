"""SimpleScheduler: one function per request, optional batching with idle-immediate dispatch."""

from __future__ import annotations

import queue
import time
from collections import deque
from typing import Any, Callable

from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.pipeline.schedulers.base import ThreadedScheduler


class SimpleScheduler(ThreadedScheduler):
    """Runs ``compute_fn(payload)`` (or ``batch_compute_fn([payloads])``) in its own thread.

    Idle-immediate batching (``batch_wait_when_idle=False``, the default): a request that finds the inbox
    empty runs at once; the ``max_batch_wait_ms`` window arms only after a second request has joined the
    batch. With ``batch_wait_when_idle=True`` the window starts with the first request (the classic, slower
    behaviour at low load, kept for comparison).
    """

    def __init__(
        self,
        compute_fn: Callable[[Any], Any] | None = None,
        batch_compute_fn: Callable[[list[Any]], list[Any]] | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0.0,
        batch_wait_when_idle: bool = False,
        name: str = "simple",
    ) -> None:
        super().__init__()
        if compute_fn is None and batch_compute_fn is None:
            raise ValueError("SimpleScheduler needs compute_fn or batch_compute_fn")
        self.name = name
        self.compute_fn = compute_fn
        self.batch_compute_fn = batch_compute_fn
        self.max_batch_size = max(1, max_batch_size)
        self.max_batch_wait_s = max_batch_wait_ms / 1000.0
        self.batch_wait_when_idle = batch_wait_when_idle
        self._pending: deque[IncomingMessage] = deque()
        self._aborted: set[str] = set()

    def live_state(self) -> int:
        return sum(1 for m in self._pending if m.type == "new_request")

    def _next_message(self, timeout: float | None) -> IncomingMessage:
        if self._pending:
            return self._pending.popleft()
        return self.inbox.get(timeout=timeout) if timeout is not None else self.inbox.get()

    def collect_batch(self, first: IncomingMessage) -> list[IncomingMessage]:
        batch = [first]
        if self.batch_compute_fn is None or self.max_batch_size <= 1:
            return batch
        deadline = time.monotonic() + self.max_batch_wait_s if self.batch_wait_when_idle else None
        while len(batch) < self.max_batch_size:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                if deadline is None:
                    break  # idle: nobody else is waiting, dispatch now
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    msg = self.inbox.get(timeout=remaining)
                except queue.Empty:
                    break
            if msg.type == "new_request":
                batch.append(msg)
                if deadline is None:  # a second request joined: now the window is worth waiting for
                    deadline = time.monotonic() + self.max_batch_wait_s
            elif msg.type == "abort":
                batch = [m for m in batch if m.request_id != msg.request_id]
                self._drop(msg.request_id)
                if not batch:
                    return batch
            else:
                self._pending.append(msg)
        return batch

    def _drop(self, request_id: str) -> None:
        self._pending = deque(m for m in self._pending if m.request_id != request_id)

    def run_loop(self) -> None:
        while self.running:
            msg = self._next_message(timeout=None)
            if msg.type == "abort":
                if msg.data == "__stop__":
                    continue
                self._drop(msg.request_id)
                continue
            if msg.type != "new_request":
                continue  # a non-streaming stage ignores stream traffic (routing validation prevents it)
            batch = self.collect_batch(msg)
            if batch:
                self._compute(batch)

    def _compute(self, batch: list[IncomingMessage]) -> None:
        try:
            if self.batch_compute_fn is not None and (len(batch) > 1 or self.compute_fn is None):
                outputs = self.batch_compute_fn([m.data for m in batch])
                if len(outputs) != len(batch):
                    raise RuntimeError(f"batch_compute_fn returned {len(outputs)} results for {len(batch)} inputs")
                for m, out in zip(batch, outputs):
                    self.emit(m.request_id, "result", out)
                return
        except Exception as exc:  # noqa: BLE001 - one batch failing fails only its requests
            for m in batch:
                self.emit_error(m.request_id, exc)
            return
        for m in batch:
            try:
                out = self.compute_fn(m.data)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001
                self.emit_error(m.request_id, exc)
                continue
            self.emit(m.request_id, "result", out)
