"""SessionScheduler: per-session state that lives across requests (turns), with limits.

A session maps onto the four incoming message kinds so the stage shell needs nothing special:
``new_request`` with an ``open`` op opens it (other ops such as ``commit``/``clear``/``update`` act on an open
session), ``stream_chunk`` appends (audio), ``stream_done`` closes, ``abort`` drops it. An op is a typed
``SessionOp`` (``omni_rt.contracts.audio_in``: the audio-in stage's) or, for a stage without typed ops, a dict
``{"op": name, ...}``. Session-level happenings leave as ``event`` messages whose request id is the session id;
an idle session's end is ``SessionExpired``. A typed op with an ``ack`` gets exactly one reply event, the op's
own ``done()`` or ``failed(code, message)`` (the session's ``update`` uses it, so ``session.updated`` follows
what the stage accepted).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from omni_rt.contracts.audio_in import SessionOp
from omni_rt.contracts.payloads import SessionExpired
from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.pipeline.schedulers.base import ThreadedScheduler


class SessionLimitError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    session_id: str
    params: Any  # the typed open op (a SessionOp), or the params dict of an untyped one
    state: dict[str, Any] = field(default_factory=dict)
    buffered_bytes: int = 0
    last_activity: float = field(default_factory=time.monotonic)


class SessionScheduler(ThreadedScheduler):
    """Override ``on_open``, ``on_append``, ``on_control``, ``on_close`` (and ``buffered_bytes``).

    Limits: ``max_sessions`` (opening one more fails with code ``session_limit``), ``max_buffered_bytes``
    per session (an append beyond it fails with ``buffer_full`` and is not applied), ``idle_timeout_s``
    (a session with no traffic for that long is closed with an ``event`` ``SessionExpired``).
    """

    accepts_streams = True

    def __init__(
        self,
        max_sessions: int = 64,
        max_buffered_bytes: int = 16 * 1024 * 1024,
        idle_timeout_s: float = 600.0,
        name: str = "session",
    ) -> None:
        super().__init__()
        self.name = name
        self.max_sessions = max_sessions
        self.max_buffered_bytes = max_buffered_bytes
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[str, Session] = {}

    # ---- hooks -------------------------------------------------------------------------------------
    def on_open(self, session: Session) -> None: ...

    def on_append(self, session: Session, data: Any) -> None: ...

    def on_control(self, session: Session, op: str, data: Any) -> None:
        """``op``: the op's name; ``data``: the typed op itself, or an untyped op's dict."""
        raise ValueError(f"unknown session op '{op}'")

    def on_close(self, session: Session) -> None: ...

    def on_idle(self) -> None:
        """Called when the inbox has been empty for ``idle_tick_s``; background work goes here."""

    def buffered_bytes(self, session: Session, data: Any) -> int:
        """Bytes this append would add to the session's buffer (default: len of bytes-like data)."""
        try:
            return len(data)
        except TypeError:
            return 0

    idle_tick_s = 0.05

    # ---- machinery ---------------------------------------------------------------------------------
    def close_session(self, session_id: str) -> None:
        self.inbox.put(IncomingMessage(session_id, "session_close"))

    def live_state(self) -> int:
        return len(self.sessions)

    def run_loop(self) -> None:
        last_sweep = time.monotonic()
        while self.running:
            try:
                msg = self.inbox.get(timeout=self.idle_tick_s)
            except queue.Empty:
                self._safe(None, self.on_idle)
                msg = None
            if msg is not None:
                self._handle(msg)
            now = time.monotonic()
            if now - last_sweep > 1.0:
                last_sweep = now
                self._expire_idle(now)

    def _safe(self, sid: str | None, fn, *args) -> bool:
        try:
            fn(*args)
            return True
        except SessionLimitError as exc:
            if sid is not None:
                self.emit_error(sid, str(exc), code=exc.code)
        except Exception as exc:  # noqa: BLE001 - a failing session op fails only that session's op
            if sid is not None:
                self.emit_error(sid, exc)
        return False

    def _acknowledged(self, sid: str, sess: Session | None, op: str, data: SessionOp) -> None:
        """A typed op with an ``ack``: exactly one reply event, ``data.done()`` once ``on_control`` returned, or
        ``data.failed(code, message)`` instead of an ``error`` when it raised (the hook raises before changing
        anything, so the session's previous state stands)."""
        try:
            if sess is None:
                raise SessionLimitError("session_not_found", f"session '{sid}' is not open (op '{op}')")
            sess.last_activity = time.monotonic()
            self.on_control(sess, op, data)
        except Exception as exc:  # noqa: BLE001 - a failing session op fails only that op
            code = exc.code if isinstance(exc, SessionLimitError) else "stage_error"
            message = str(exc) if isinstance(exc, SessionLimitError) else f"{type(exc).__name__}: {exc}"
            self.emit(sid, "event", data.failed(code, f"{self.name}: {message}"))
        else:
            self.emit(sid, "event", data.done())

    def _expire_idle(self, now: float) -> None:
        for sid, sess in list(self.sessions.items()):
            if now - sess.last_activity > self.idle_timeout_s:
                self.sessions.pop(sid, None)
                self._safe(sid, self.on_close, sess)
                self.emit(sid, "event", SessionExpired(0, round(now - sess.last_activity, 1)))

    def _handle(self, msg: IncomingMessage) -> None:
        sid = msg.request_id
        if msg.type in ("abort", "session_close"):
            if msg.data == "__stop__":
                return
            sess = self.sessions.pop(sid, None)
            if sess is not None:
                self._safe(None, self.on_close, sess)
            return
        sess = self.sessions.get(sid)
        if msg.type == "new_request":
            data = msg.data or {}
            typed = isinstance(data, SessionOp)
            op = data.op if typed else data.get("op", "open")
            if op == "open":
                if sess is not None:
                    self.emit_error(sid, f"session '{sid}' is already open", code="session_exists")
                    return
                if len(self.sessions) >= self.max_sessions:
                    self.emit_error(
                        sid, f"too many sessions: {len(self.sessions)} open, limit {self.max_sessions}",
                        code="session_limit",
                    )
                    return
                sess = Session(session_id=sid, params=data if typed else dict(data.get("params") or {}))
                if self._safe(sid, self.on_open, sess):
                    self.sessions[sid] = sess
                return
            if typed and data.ack is not None:
                self._acknowledged(sid, sess, op, data)
                return
            if sess is None:
                self.emit_error(sid, f"session '{sid}' is not open (op '{op}')", code="session_not_found")
                return
            sess.last_activity = time.monotonic()
            self._safe(sid, self.on_control, sess, op, data)
        elif msg.type == "stream_chunk":
            if sess is None:
                self.emit_error(sid, f"session '{sid}' is not open (append)", code="session_not_found")
                return
            sess.last_activity = time.monotonic()
            added = self.buffered_bytes(sess, msg.data)
            if sess.buffered_bytes + added > self.max_buffered_bytes:
                self.emit_error(
                    sid,
                    f"input buffer full: {sess.buffered_bytes} + {added} bytes exceeds the limit of "
                    f"{self.max_buffered_bytes} bytes per session; commit or clear the buffer",
                    code="buffer_full",
                )
                return
            if self._safe(sid, self.on_append, sess, msg.data):
                sess.buffered_bytes += added
        elif msg.type == "stream_done":
            if sess is None:
                return
            self.sessions.pop(sid, None)
            self._safe(sid, self.on_close, sess)
            self.emit(sid, "result", {"type": "session.closed"})
