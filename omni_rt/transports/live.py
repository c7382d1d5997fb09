"""The GPT-Live WebSocket (``/v1/live/sessions``): a ``LiveSession`` (``omni_rt.session.live``) over the same
session core, runner and pipeline as ``/v1/realtime``.

The socket opens with nothing sent; the first client event must be ``session.start``. Only once it is valid
does the connection take a session from the one session factory (``omni_rt.transports.host.new_session``) and
a ``SessionRunner``. One sender task runs the output clock: every tick (40 ms) it translates the core's events,
advances the real-time audio stream and sends what is due, in order; the receiver feeds client messages. The
session ends with ``session.closed`` and close 1000 (client close, expiry), or as ``/v1/realtime`` does (the
client leaves, idles out, stops reading, the server shuts down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_rt.session.live import LiveSession
from omni_rt.transports.live_backend import BackendTasks
from omni_rt.transports.host import new_session
from omni_rt.transports.runner import SessionRunner
from omni_rt.transports.sideband import Sidebands
from omni_rt.transports.websocket import CLOSE_FULL, CLOSE_GOING_AWAY, CLOSE_INTERNAL, CLOSE_NORMAL, CLOSE_POLICY, safe_reason

if TYPE_CHECKING:
    from omni_rt.transports.host import TransportHost

log = logging.getLogger("omni_rt.live")


class LiveRegistry:
    """The Live sessions of this server by id, for their ``/attach`` sidebands. An entry has ``sidebands`` (a set
    ``omni_rt.transports.sideband.Sidebands``), ``ended`` (an ``asyncio.Event``) and ``sideband_message(raw)``."""

    def __init__(self) -> None:
        self.sessions: dict[str, Any] = {}

    async def attach(self, session_id: str, ws: WebSocket) -> None:
        entry = self.sessions.get(session_id)
        if entry is None:
            await ws.close(code=CLOSE_POLICY, reason="unknown session id")
            return
        await entry.sidebands.serve(ws, ended=entry.ended, feed=entry.sideband_message, ended_reason="session ended")


class LiveConnection:
    def __init__(self, ws: WebSocket, runtime: "TransportHost", delegation_policy: str,
                 registry: LiveRegistry | None = None) -> None:
        self.ws, self.runtime = ws, runtime
        self.registry = registry
        self.sidebands = Sidebands()
        self.ended = asyncio.Event()
        url = getattr(runtime.settings, "delegate", None)
        self.live = LiveSession(voices=tuple(runtime.config.voices), delegation_policy=delegation_policy,
                                responses_backend=url is not None)
        self.backend = BackendTasks(url, getattr(runtime.settings, "delegate_api_key", None), self._deliver)
        self.runner: SessionRunner | None = None
        self.close_code, self.close_reason = CLOSE_NORMAL, ""

    def _feed_core(self) -> None:
        if self.live.overflow:
            raise _Refused(CLOSE_POLICY, f"client is not reading: over {self.live.limits.max_queued_events} events queued")
        if self.runner is None and self.live.core_session is not None:
            self._open_core()
        if self.runner is not None:
            for event in self.live.core_events():
                self.runner.feed_event(event)
        self.backend.start(self.live.take_backend_jobs())

    def sideband_message(self, raw: str | bytes) -> None:
        self.live.receive_message(raw, sideband=True)
        with contextlib.suppress(_Refused):
            self._feed_core()

    def _deliver(self, response_id: str, kind: str, data: object) -> None:
        self.live.receive_backend(response_id, kind, data)
        with contextlib.suppress(_Refused):  # an overflow is seen by the sender's next turn
            self._feed_core()

    def _open_core(self) -> None:
        rt, cfg = self.runtime, self.live.config
        assert cfg is not None
        if len(rt.sessions) >= rt.settings.max_sessions:  # filled up since this socket was admitted
            self.live.events_to_send()  # session.started never goes out: nothing started
            raise _Refused(CLOSE_FULL, f"server full: {rt.settings.max_sessions} sessions")
        self.runner = SessionRunner(rt, new_session(rt, cfg.model, session=self.live.core_session), "live")
        rt.sessions.add(self.runner)
        rt.metrics.sessions.inc()
        if self.registry is not None:
            self.registry.sessions[self.live.id] = self
        self.runner.open()
        self.runner.session.events_to_send()  # session.created: the Live session.started stands for it

    async def receive(self) -> None:
        settings = self.runtime.settings
        while not self.live.finished:
            msg = await asyncio.wait_for(self.ws.receive(), timeout=settings.idle_timeout_s)
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", CLOSE_NORMAL))
            data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
            if data is not None:
                self.live.receive_message(data)
                self._feed_core()

    async def send(self) -> None:
        loop = asyncio.get_running_loop()
        tick = self.live.limits.tick_s
        timeout = self.runtime.settings.send_timeout_s
        next_tick = loop.time()
        while True:
            wait = max(0.0, next_tick - loop.time())
            events = None
            if self.runner is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    events = await asyncio.wait_for(self.runner.next_events(), timeout=wait)
                if events is None and (self.runner.session.closed or self.runner.close_request is not None):
                    if self.runner.close_request is not None:
                        self.close_code, self.close_reason = self.runner.close_request.code, self.runner.close_request.reason
                    return
            else:
                await asyncio.sleep(wait)
            if events:
                self.live.receive_core(events)
                self._feed_core()
            if loop.time() >= next_tick:
                next_tick += tick
                if next_tick < loop.time():  # the loop fell behind: do not send a burst of ticks
                    next_tick = loop.time() + tick
                self.live.tick()
                self._feed_core()
            for event in self.live.events_to_send():
                self.sidebands.fan_out(event)
                try:
                    await asyncio.wait_for(self.ws.send_json(event), timeout=timeout)
                except asyncio.TimeoutError:
                    raise _Refused(CLOSE_POLICY, f"client is not reading: a send waited over {timeout:g} s") from None
            if self.live.finished:
                return

    async def serve(self) -> None:
        sender = asyncio.create_task(self.send(), name=f"live-send-{self.live.id}")
        receiver = asyncio.create_task(self.receive(), name=f"live-recv-{self.live.id}")
        for task in (sender, receiver):
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if isinstance(exc, _Refused):
                    self.close_code, self.close_reason = exc.code, exc.reason
                elif isinstance(exc, asyncio.TimeoutError):
                    self.close_code, self.close_reason = CLOSE_NORMAL, "idle timeout"
                elif exc is not None and not isinstance(exc, WebSocketDisconnect):
                    log.warning("live session %s failed: %r", self.live.id, exc)
                    self.close_code, self.close_reason = CLOSE_INTERNAL, "internal error"
            if receiver in done and sender not in done and self.live.finished:
                with contextlib.suppress(BaseException):  # session.closed goes out before the close frame
                    await asyncio.wait_for(sender, timeout=2.0)
            if self.live.finished:
                self.close_code, self.close_reason = CLOSE_NORMAL, self.live.close_reason or ""
        except asyncio.CancelledError:
            self.close_code, self.close_reason = CLOSE_GOING_AWAY, "server shutting down"
            raise
        finally:
            receiver.cancel()
            sender.cancel()
            self.backend.close()
            self.ended.set()
            if self.registry is not None:
                self.registry.sessions.pop(self.live.id, None)
            if self.runner is not None:
                await self.runner.close()
                self.runtime.sessions.discard(self.runner)
                self.runtime.metrics.sessions.dec()
            ws = self.ws
            if ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.close(code=self.close_code, reason=safe_reason(self.close_reason)), timeout=2.0)


class _Refused(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


async def live_endpoint(ws: WebSocket, runtime: "TransportHost", delegation_policy: str = "off",
                        registry: LiveRegistry | None = None) -> None:
    """Serve one ``/v1/live/sessions`` connection (already admitted: auth, origin, capacity)."""
    await LiveConnection(ws, runtime, delegation_policy, registry).serve()
