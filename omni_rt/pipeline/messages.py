"""Messages between a stage's IO shell and its scheduler (the only coupling between them).

Payloads stay plain data (dicts, lists, numpy arrays, str) so that a stage can later move to its own
process behind a pickling queue without changing any scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

IncomingType = Literal["new_request", "stream_chunk", "stream_done", "abort", "session_close", "prefill_hint"]
OutgoingType = Literal["result", "stream", "error", "event"]


@dataclass(slots=True)
class IncomingMessage:
    """Shell -> scheduler. ``source`` names the upstream stage for stream chunks / stream_done.

    ``session_close`` (request_id = a session id) is sent only to schedulers that keep per-session state;
    ``prefill_hint`` (request_id = a session id, data = a request payload) only to those that warm a prompt cache.
    ``t``: ``perf_counter`` when the message entered the inbox, so a scheduler can tell how long it waited there.
    """

    request_id: str
    type: IncomingType
    data: Any = None
    source: str | None = None
    t: float = field(default_factory=time.perf_counter)


@dataclass(slots=True)
class OutgoingMessage:
    """Scheduler -> shell.

    ``result``: the request's final output (routed to ``next`` or to the coordinator when terminal).
    ``stream``: a chunk, sent to every ``stream_to`` target (and to the coordinator for client-visible stages).
    ``error``: the request failed in this stage; ``data`` is a human-readable message, ``code`` in metadata.
    ``event``: a session-level event (VAD speech started/stopped, partial/final transcript) for the
    coordinator's session listeners; ``request_id`` is the session id.

    ``metadata["timing"]`` (``StageTiming``), on the message that carries a request's first output: how long
    that output's input waited in this stage's inbox/queues and how long it was computed. The shell hands it to
    the coordinator (first one per stage and request kept), which reports it with the request's result.
    """

    request_id: str
    type: OutgoingType
    data: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StageTiming:
    """Where one request's first output of a stage spent its time: waiting (``queue_s``: the inbox, a worker
    queue, an upstream engine's own queue) vs computing (``compute_s``). Seconds, both >= 0."""

    queue_s: float
    compute_s: float

    @classmethod
    def since(cls, arrived: float, started: float, done: float | None = None) -> "StageTiming":
        """Input in the inbox at ``arrived``, taken at ``started``, output at ``done`` (default: now)."""
        done = time.perf_counter() if done is None else done
        return cls(max(0.0, started - arrived), max(0.0, done - started))
