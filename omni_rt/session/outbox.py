"""The session's outgoing server events: one ordered queue, with a byte cap for a client that stops reading.

Every part sends through ``Outbox.send``; the driver drains it (``drain``) and puts back what it could not send
yet (``requeue``). Barge-in drops a cancelled answer's queued audio (``purge_audio``)."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from omni_rt.realtime.events import BETA_SERVER_NAMES, new_id


def _delta_bytes(event: dict[str, Any]) -> int:
    delta = event.get("delta")
    return len(delta) if isinstance(delta, str) else 0


class Outbox:
    def __init__(self, max_bytes: int, beta_events: bool, on_overflow: Callable[[], None]) -> None:
        """``on_overflow``: called once more than ``max_bytes`` of deltas are queued (the session closes)."""
        self.max_bytes = max_bytes
        self.beta_events = beta_events
        self._on_overflow = on_overflow
        self._events: deque[dict[str, Any]] = deque()
        self._queued_bytes = 0
        self.closed = False  # set by the session's close: nothing more is queued

    def send(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        event.setdefault("event_id", new_id("event"))
        if self.beta_events:
            event["type"] = BETA_SERVER_NAMES.get(event["type"], event["type"])
        self._events.append(event)
        self._queued_bytes += _delta_bytes(event)
        if self._queued_bytes > self.max_bytes:
            self._on_overflow()

    def drain(self) -> list[dict[str, Any]]:
        out = list(self._events)
        self._events.clear()
        self._queued_bytes = 0
        return out

    def requeue(self, events: list[dict[str, Any]]) -> None:
        """The driver could not send these yet: keep them first in line (caps still count them)."""
        for ev in reversed(events):
            self._events.appendleft(ev)
            self._queued_bytes += _delta_bytes(ev)

    def purge_audio(self, response_id: str) -> None:
        """Drop a cancelled answer's queued audio: nothing more of it reaches the listener."""
        kept = [ev for ev in self._events if not (ev.get("response_id") == response_id and ev["type"].endswith("audio.delta"))]
        self._events = deque(kept)
        self._queued_bytes = sum(_delta_bytes(ev) for ev in kept)

    def __len__(self) -> int:
        return len(self._events)
