"""The WebSocket side of a session: receive client messages, send server events, close with a reason.

``serve_session`` is shared by ``/v1/realtime`` (messages are Realtime events) and the Twilio bridge
(``receive`` and ``encode`` translate Twilio's messages). It owns the two tasks of a connection and the close:
the client leaving, an idle timeout, a client that stops reading, a sender failure, or server shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_rt.transports.runner import SessionRunner

if TYPE_CHECKING:
    from omni_rt.transports.host import TransportHost

log = logging.getLogger("omni_rt.server")

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_FULL = 1013
MAX_REASON_BYTES = 120  # a close frame's reason is at most 123 bytes


def safe_reason(reason: str) -> str:
    """A close reason that fits the frame and echoes nothing long or unprintable from the client."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in reason)
    data = clean.encode("utf-8")[:MAX_REASON_BYTES]
    return data.decode("utf-8", errors="ignore")


Receive = Callable[[WebSocket, SessionRunner], Awaitable[None]]
Encode = Callable[[dict[str, Any]], list[dict[str, Any]]]


class SlowReader(Exception):
    pass


async def pump_outgoing(ws: WebSocket, runner: SessionRunner, encode: Encode | None, send_timeout_s: float) -> None:
    """Send the session's events in order; a send that cannot complete in ``send_timeout_s`` means the
    client stopped reading (its TCP window is full)."""
    while True:
        events = await runner.next_events()
        if events is None:
            return
        for i, event in enumerate(events):
            for msg in (encode(event) if encode is not None else [event]):
                try:
                    await asyncio.wait_for(ws.send_json(msg), timeout=send_timeout_s)
                except asyncio.TimeoutError:
                    runner.session.requeue_unsent(events[i + 1:])
                    raise SlowReader(f"client is not reading: a send waited over {send_timeout_s:g} s") from None


async def receive_realtime(ws: WebSocket, runner: SessionRunner) -> None:
    settings = runner.runtime.settings
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout=settings.idle_timeout_s)
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", CLOSE_NORMAL))
        data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
        if data is not None:
            runner.feed_message(data)
            if runner.close_request is not None:
                return


async def serve_session(ws: WebSocket, runtime: "TransportHost", runner: SessionRunner, receive: Receive,
                        encode: Encode | None = None) -> None:
    """Run one session until the client leaves, idles out, stops reading, or the server shuts down; then
    free everything it held and close the socket with a code and a reason."""
    runtime.sessions.add(runner)
    runtime.metrics.sessions.inc()
    runner.open()
    sender = asyncio.create_task(pump_outgoing(ws, runner, encode, runtime.settings.send_timeout_s), name=f"send-{runner.session.id}")
    receiver = asyncio.create_task(receive(ws, runner), name=f"recv-{runner.session.id}")
    # either task may finish in the same loop turn as the other: always retrieve both exceptions
    for task in (sender, receiver):
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
    code, reason = CLOSE_NORMAL, ""
    try:
        done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        if receiver in done:
            exc = receiver.exception()
            if isinstance(exc, asyncio.TimeoutError):
                code, reason = CLOSE_NORMAL, "idle timeout"
            elif exc is not None and not isinstance(exc, WebSocketDisconnect):
                log.warning("session %s receive failed: %r", runner.session.id, exc)
                code, reason = CLOSE_INTERNAL, "internal error"
        if sender in done:
            exc = sender.exception()
            if isinstance(exc, SlowReader):
                log.info("session %s: %s", runner.session.id, exc)
                code, reason = CLOSE_POLICY, str(exc)
            elif exc is not None and not isinstance(exc, WebSocketDisconnect):
                log.warning("session %s send failed: %r", runner.session.id, exc)
                code, reason = CLOSE_INTERNAL, "internal error while sending"
        if runner.close_request is not None:
            code, reason = runner.close_request.code, runner.close_request.reason
            log.info("session %s closed: %s", runner.session.id, reason)
        receiver.cancel()
    except asyncio.CancelledError:
        code, reason = CLOSE_GOING_AWAY, "server shutting down"
        raise
    finally:
        await runner.close()
        runtime.sessions.discard(runner)
        runtime.metrics.sessions.dec()
        if code == CLOSE_NORMAL or code == CLOSE_GOING_AWAY:
            with contextlib.suppress(BaseException):  # let the last events (response.done) go out first
                await asyncio.wait_for(sender, timeout=1.0)
        sender.cancel()
        if ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=code, reason=safe_reason(reason)), timeout=2.0)
