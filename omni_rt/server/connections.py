"""Connection headroom: a cap on open connections derived from the process's file limit, a header deadline,
and room made for newcomers by closing connections that have not sent a request.

Why not uvicorn's options alone: ``limit_concurrency`` answers 503 only once a request's headers have
arrived, so silent or half-sent connections still take a file descriptor each; ``timeout_keep_alive`` runs
only while no bytes arrive (any byte disarms it), so a client that sends half a header and stops is held for
ever; and neither knows the file limit. Once the descriptor table is full, accept() fails with EMFILE — the
event loop pauses accepting (asyncio), or libuv under uvloop accepts and closes whatever is queued — and
``/healthz`` and real sessions cannot get in. So uvicorn's own httptools protocol is kept and extended here at
the hooks it has (connection made, headers complete, WebSocket upgrade, response complete). The numbers:

* ``backlog`` (uvicorn's option; the listen queue, which is also how many sockets one wake-up of the loop may
  accept before any of them is looked at) = file limit / 8, within 16..2048;
* ``cap`` = file limit - descriptors open once the models are loaded - backlog - a reserve for the engine's
  sockets (2 per session), files opened later and logs (32) - ``REFUSE_ROOM``; ``max_connections`` only lowers it;
* over the cap, the oldest connection without a request in progress is closed to make room (a flood of idle
  sockets cannot lock real users out); if every connection is busy, the newcomer is refused at once, after at
  most ``REFUSE_HEADER_S`` for its headers: HTTP gets uvicorn's own 503, a WebSocket is accepted and closed
  with 1013 and a reason by the app (``over_capacity``); past ``REFUSE_ROOM`` such refusals it is closed unread;
* a connection must complete its request headers within ``header_timeout_s`` of connecting or of its last
  response, however slowly it trickles bytes; otherwise it is closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("omni_rt.server.connections")

ENGINE_FDS_PER_SESSION = 2  # the thinker's HTTP stream to llama-server, and one spare (speculative answers)
FD_RESERVE = 32  # files opened after startup (lazy model parts, logs), the listening socket, pipes
REFUSE_ROOM = 8  # connections over the cap that may stay just long enough to read their 503
REFUSE_HEADER_S = 1.0  # how long such a connection may take to send its headers
MIN_CAP = 4
_NO_LIMIT = 1 << 20  # RLIM_INFINITY: count as Linux's default nr_open
_LOG_EVERY_S = 10.0
OVER_CAPACITY = "omni_rt.over_capacity"  # in a refused WebSocket's ASGI scope state


def over_capacity(scope: dict[str, Any]) -> bool:
    """Was this WebSocket admitted over the connection cap only to be told so (close 1013)?"""
    return bool((scope.get("state") or {}).get(OVER_CAPACITY))


def file_limit() -> int:
    """The soft RLIMIT_NOFILE: the number of descriptors this process may hold."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _NO_LIMIT if soft == resource.RLIM_INFINITY else int(soft)


def open_fds() -> int:
    """Descriptors open now (Linux /proc, macOS /dev/fd)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return 64  # unknown platform: a typical count after loading the models


def accept_backlog(limit: int) -> int:
    """The listen backlog, also the largest burst of sockets accepted in one wake-up: kept inside the room."""
    return max(16, min(2048, limit // 8))


def connection_cap(limit: int, in_use: int, max_sessions: int, configured: int | None = None) -> int:
    """Connections held at once: what the file limit leaves after the descriptors in use, the accept burst,
    the engine's sockets, a reserve and the refusal room (see the module docstring)."""
    room = limit - in_use - accept_backlog(limit) - FD_RESERVE - ENGINE_FDS_PER_SESSION * max_sessions - REFUSE_ROOM
    cap = max(MIN_CAP, room)
    return min(cap, configured) if configured else cap


class Verdict(Enum):
    ADMIT = "admit"
    REFUSE = "refuse"  # read the headers (briefly), answer 503, close
    DROP = "drop"  # close unread


@dataclass
class ConnectionGuard:
    """Counts the server's connections and keeps the ones without a request in progress in arrival order, so
    the oldest can make room. One per server; the cap is settled at the first connection (the models are loaded
    by then: uvicorn listens only after the lifespan startup)."""

    header_timeout_s: float
    max_sessions: int
    configured_cap: int | None = None
    on_event: Callable[[str, int], None] | None = None  # (outcome or "cap", count): for /metrics
    cap: int | None = None
    pending: dict[GuardedHttpProtocol, None] = field(default_factory=dict)  # insertion order = age
    closing: set[GuardedHttpProtocol] = field(default_factory=set)  # evicted, descriptor not yet released
    counts: dict[str, int] = field(default_factory=lambda: {"evicted": 0, "refused": 0, "dropped": 0, "timed_out": 0})
    _logged_at: float = 0.0

    def settle(self) -> int:
        if self.cap is None:
            limit, in_use = file_limit(), open_fds()
            self.cap = connection_cap(limit, in_use, self.max_sessions, self.configured_cap)
            log.info("connection cap %d: file limit %d, %d open after startup, accept backlog %d, %d reserved "
                     "(engine %d/session x %d sessions + %d), %d for refusals; header timeout %.1f s", self.cap,
                     limit, in_use, accept_backlog(limit), FD_RESERVE + ENGINE_FDS_PER_SESSION * self.max_sessions,
                     ENGINE_FDS_PER_SESSION, self.max_sessions, FD_RESERVE, REFUSE_ROOM, self.header_timeout_s)
            if self.on_event is not None:
                self.on_event("cap", self.cap)
            if self.configured_cap and self.configured_cap > self.cap:
                log.warning("max_connections %d is above what the file limit allows; using %d",
                            self.configured_cap, self.cap)
        return self.cap

    def admit(self, conn: GuardedHttpProtocol, open_now: int) -> Verdict:
        """``open_now`` counts every connection of the server (WebSocket ones too), this one included."""
        cap = self.settle()
        held = open_now - len(self.closing)
        if held <= cap:
            return Verdict.ADMIT
        victim = next(iter(self.pending), None)
        if victim is not None:
            self.close(victim, "evicted")
            return Verdict.ADMIT
        verdict = Verdict.REFUSE if held <= cap + REFUSE_ROOM else Verdict.DROP
        self._count("refused" if verdict is Verdict.REFUSE else "dropped")
        return verdict

    def close(self, conn: GuardedHttpProtocol, why: str) -> None:
        self.pending.pop(conn, None)
        self.closing.add(conn)
        conn.close_idle()
        self._count(why)

    def forget(self, conn: GuardedHttpProtocol) -> None:
        self.pending.pop(conn, None)
        self.closing.discard(conn)

    def _count(self, what: str) -> None:
        self.counts[what] += 1
        if self.on_event is not None:
            self.on_event(what, 1)
        now = time.monotonic()
        if now - self._logged_at > _LOG_EVERY_S:
            self._logged_at = now
            log.warning("connections at the cap (%s): so far %s", self.cap, self.counts)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a :class:`ConnectionGuard` (build with ``functools.partial``)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False

    # -- uvicorn's protocol hooks ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        verdict = self.guard.admit(self, len(self.connections))
        if verdict is Verdict.DROP:
            self.guard.closing.add(self)
            transport.abort()
            return
        self._refused = verdict is Verdict.REFUSE
        if self._refused:
            self.limit_concurrency = 0  # uvicorn's own 503 (service_unavailable, connection: close) answers it
            self._arm(REFUSE_HEADER_S)
        else:
            self._idle()

    def on_headers_complete(self) -> None:
        self._disarm()
        self.guard.pending.pop(self, None)  # a request in progress is never closed to make room
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        if self._refused:  # the WebSocket protocol copies app_state into the scope: the app closes it with 1013
            self.app_state = {**self.app_state, OVER_CAPACITY: True}
        super().handle_websocket_upgrade()  # the WebSocket protocol takes the transport; this one is done

    def on_response_complete(self) -> None:
        idle = not self.pipeline  # no pipelined request waiting to run
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    # -- the header deadline -----------------------------------------------------------------------------------
    def _idle(self) -> None:
        """No request in progress: may be closed to make room, and must send its next headers in time."""
        self.guard.pending[self] = None
        self._arm(self.guard.header_timeout_s)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.guard.close(self, "timed_out")

    def close_idle(self) -> None:
        """Close a connection without a request in progress (nothing to answer, so nothing is lost)."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()
