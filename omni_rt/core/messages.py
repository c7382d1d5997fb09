"""Messages between a stage's IO shell and its scheduler (the only coupling between them).

Payloads stay plain data (dicts, lists, numpy arrays, str) so that a stage can later move to its own
process behind a pickling queue without changing any scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

IncomingType = Literal["new_request", "stream_chunk", "stream_done", "abort", "session_close"]
OutgoingType = Literal["result", "stream", "error", "event"]


@dataclass(slots=True)
class IncomingMessage:
    """Shell -> scheduler. ``source`` names the upstream stage for stream chunks / stream_done.

    ``session_close`` (request_id = a session id) is sent only to schedulers that keep per-session state.
    """

    request_id: str
    type: IncomingType
    data: Any = None
    source: str | None = None


@dataclass(slots=True)
class OutgoingMessage:
    """Scheduler -> shell.

    ``result``: the request's final output (routed to ``next`` or to the coordinator when terminal).
    ``stream``: a chunk, sent to every ``stream_to`` target (and to the coordinator for client-visible stages).
    ``error``: the request failed in this stage; ``data`` is a human-readable message, ``code`` in metadata.
    ``event``: a session-level event (VAD speech started/stopped, partial/final transcript) for the
    coordinator's session listeners; ``request_id`` is the session id.
    """

    request_id: str
    type: OutgoingType
    data: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
