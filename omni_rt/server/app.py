"""The FastAPI app: /v1/realtime, /v1/telephony/twilio, the demo page, /healthz, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omni_rt.server.realtime import RealtimeSession
from omni_rt.server.runtime import Runtime
from omni_rt.server.settings import ServerSettings

log = logging.getLogger("omni_rt.server")

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_FULL = 1013
CLOSE_GOING_AWAY = 1001


def check_access(ws: WebSocket, settings: ServerSettings) -> str | None:
    """Return why the connection is refused (auth / origin), or None."""
    origin = ws.headers.get("origin")
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        return f"origin '{origin}' is not allowed"
    if settings.api_key:
        auth = ws.headers.get("authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else ws.query_params.get("token", "")
        if not hmac.compare_digest(token.encode(), settings.api_key.encode()):
            return "missing or invalid API key"
    return None


async def admit(ws: WebSocket, runtime: Runtime, surface: str) -> bool:
    """Accept the socket, then close it with a clear code if it may not stay (auth 1008, full 1013)."""
    subprotocols = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    await ws.accept(subprotocol="realtime" if "realtime" in subprotocols else None)
    refused = check_access(ws, runtime.settings)
    if refused is not None:
        runtime.metrics.connections.labels(surface=surface, outcome="refused_auth").inc()
        await ws.close(code=CLOSE_POLICY, reason=refused)
        return False
    if len(runtime.sessions) >= runtime.settings.max_sessions:
        runtime.metrics.connections.labels(surface=surface, outcome="refused_full").inc()
        await ws.close(code=CLOSE_FULL, reason=f"server full: {runtime.settings.max_sessions} sessions")
        return False
    runtime.metrics.connections.labels(surface=surface, outcome="accepted").inc()
    return True


async def pump_outgoing(ws: WebSocket, session: RealtimeSession, encode=None) -> None:
    """Send the session's events in order; ``encode`` maps a Realtime event to the surface's messages."""
    while True:
        event = await session.outgoing.get()
        if event is None:
            return
        messages = encode(event) if encode is not None else [event]
        for msg in messages:
            await ws.send_json(msg)


def create_app(settings: ServerSettings | None = None, runtime: Runtime | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    runtime = runtime or Runtime(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await runtime.start()
        try:
            yield
        finally:
            await shutdown(runtime)

    app = FastAPI(title="omni-rt", lifespan=lifespan)
    app.state.runtime = runtime

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok = runtime.coordinator is not None and runtime.coordinator.started
        return JSONResponse({"status": "ok" if ok else "starting", "preset": runtime.config.name,
                             "sessions": len(runtime.sessions)}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        runtime.live_state()
        return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/debug/state")
    async def debug_state(request: Request) -> JSONResponse:
        """Live per-request state of every stage (tests assert it returns to zero)."""
        return JSONResponse({"live": runtime.live_state(), "total": runtime.coordinator.live_total(),
                             "sessions": len(runtime.sessions)})

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html")

    if WEB_DIR.exists():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        if not await admit(ws, runtime, "realtime"):
            return
        beta = ws.query_params.get("beta") in ("1", "true") or "realtime=v1" in ws.headers.get("openai-beta", "")
        session = RealtimeSession(runtime, model=ws.query_params.get("model"), beta=beta)
        await serve_session(ws, runtime, session, receive_realtime)

    from omni_rt.server.twilio import twilio_endpoint

    @app.websocket("/v1/telephony/twilio")
    async def twilio(ws: WebSocket) -> None:
        if not await admit(ws, runtime, "twilio"):
            return
        await twilio_endpoint(ws, runtime)

    return app


async def receive_realtime(ws: WebSocket, session: RealtimeSession) -> None:
    settings = session.runtime.settings
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout=settings.idle_timeout_s)
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
        if data is not None:
            session.handle_text(data)


async def serve_session(ws: WebSocket, runtime: Runtime, session: Any, receive, encode=None) -> None:
    """Run one session until the client leaves, idles out, or the server shuts down; then free it all."""
    runtime.sessions.add(session)
    session.open()
    sender = asyncio.create_task(pump_outgoing(ws, session, encode))
    close_code, reason = 1000, ""
    try:
        receiver = asyncio.create_task(receive(ws, session))
        # the receiver may finish (client gone) in the same loop turn the sender does: retrieve its
        # exception always, or asyncio logs "Task exception was never retrieved" for every dropped client
        receiver.add_done_callback(lambda t: t.cancelled() or t.exception())
        done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        if receiver in done:
            exc = receiver.exception()
            if isinstance(exc, asyncio.TimeoutError):
                close_code, reason = 1000, "idle timeout"
            elif exc is not None and not isinstance(exc, WebSocketDisconnect):
                log.warning("session %s receive failed: %r", session.id, exc)
                close_code, reason = 1011, "internal error"
        receiver.cancel()
    except asyncio.CancelledError:
        close_code, reason = CLOSE_GOING_AWAY, "server shutting down"
        raise
    finally:
        await session.close()
        runtime.sessions.discard(session)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(sender, timeout=1.0)
        sender.cancel()
        if ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await ws.close(code=close_code, reason=reason)


async def shutdown(runtime: Runtime) -> None:
    """Drain: give open answers a grace period, then cancel them and close sessions, then stop stages."""
    deadline = asyncio.get_running_loop().time() + runtime.settings.shutdown_grace_s
    while any(getattr(s, "response", None) is not None for s in runtime.sessions):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    for session in list(runtime.sessions):
        await session.close("server_shutdown")
    await runtime.stop()
