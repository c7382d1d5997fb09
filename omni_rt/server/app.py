"""The FastAPI app: routes (/v1/realtime, /v1/live/sessions, /v1/telephony/twilio, the demo page, /healthz, /metrics,
/debug/state, /debug/stage_times), admission (auth, origin, capacity) and shutdown. Sessions live in ``omni_rt.session``; the
socket handling in ``omni_rt.transports``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from threadpoolctl import threadpool_info

from omni_rt.resources import web_dir
from omni_rt.server.connections import over_capacity
from omni_rt.server.runtime import Runtime
from omni_rt.server.settings import ServerSettings
from omni_rt.transports.host import new_session
from omni_rt.transports.runner import SessionRunner
from omni_rt.transports.live import LiveRegistry, live_endpoint
from omni_rt.transports.live_webrtc import LiveCall, read_live_offer, start_live
from omni_rt.transports.twilio import twilio_endpoint
from omni_rt.transports.webrtc import CallError, CallRegistry, read_offer
from omni_rt.transports.websocket import CLOSE_FULL, CLOSE_GOING_AWAY, CLOSE_POLICY, receive_realtime, safe_reason, serve_session

log = logging.getLogger("omni_rt.server")


def presented_key(headers, query_params) -> str:
    auth = headers.get("authorization", "")
    return auth[7:] if auth.lower().startswith("bearer ") else query_params.get("token", "")


def key_ok(settings: ServerSettings, key: str) -> bool:
    return not settings.api_key or hmac.compare_digest(key.encode(), settings.api_key.encode())


def check_access(ws: WebSocket | Request, settings: ServerSettings) -> str | None:
    """Return why the connection is refused (auth / origin), or None. Never echoes the client's values."""
    origin = ws.headers.get("origin")
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        return "origin not allowed"
    if not key_ok(settings, presented_key(ws.headers, ws.query_params)):
        return "missing or invalid API key"
    return None


async def admit(ws: WebSocket, runtime: Runtime, surface: str, new_session: bool = True) -> bool:
    """Accept the socket, then close it with a clear code if it may not stay (auth 1008, full 1013).
    ``new_session``: False for a WebRTC call's sideband, which joins a session that already holds its slot."""
    subprotocols = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    await ws.accept(subprotocol="realtime" if "realtime" in subprotocols else None)
    if over_capacity(ws.scope):  # every connection busy (omni_rt/server/connections.py)
        runtime.metrics.connections.labels(surface=surface, outcome="refused_full").inc()
        await ws.close(code=CLOSE_FULL, reason="server full: connections")
        return False
    refused = check_access(ws, runtime.settings)
    if refused is not None:
        runtime.metrics.connections.labels(surface=surface, outcome="refused_auth").inc()
        await ws.close(code=CLOSE_POLICY, reason=safe_reason(refused))
        return False
    if (new_session and len(runtime.sessions) >= runtime.settings.max_sessions) or runtime.draining:
        runtime.metrics.connections.labels(surface=surface, outcome="refused_full").inc()
        why = "server shutting down" if runtime.draining else f"server full: {runtime.settings.max_sessions} sessions"
        await ws.close(code=CLOSE_FULL, reason=why)
        return False
    runtime.metrics.connections.labels(surface=surface, outcome="accepted").inc()
    return True


def error_body(message: str, code: str, param: str | None = None, type_: str = "invalid_request_error") -> dict:
    """OpenAI's error shape, for every HTTP error this server answers."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# HTTP status -> (code, message) of the errors Starlette raises itself (unknown path, wrong method...)
HTTP_ERRORS = {
    400: ("bad_request", "the request is not valid"),
    401: ("invalid_api_key", "missing or invalid API key"),
    403: ("forbidden", "this request is not allowed"),
    404: ("not_found", "no such path on this server"),
    405: ("method_not_allowed", "this path does not take that method"),
    413: ("request_too_large", "the request body is too large"),
    415: ("unsupported_media_type", "unsupported content type"),
}


def install_error_handlers(app: FastAPI) -> None:
    """Unknown paths, wrong methods and bad query values answer in OpenAI's error shape (not FastAPI's
    ``{"detail": ...}``), with messages written for clients (no validator internals)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, message = HTTP_ERRORS.get(exc.status_code, ("http_error", f"the request failed (HTTP {exc.status_code})"))
        if exc.status_code == 404:
            message = f"no such path on this server: {request.url.path[:100]}"
        elif exc.status_code == 405:
            message = f"{request.url.path[:100]} does not take {request.method[:10]}"
        status = exc.status_code
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return JSONResponse(error_body(message, code, None, kind), status_code=status, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body", "header")]
        param = ".".join(loc) or None
        kind = str(first.get("type", ""))
        what = "an integer" if "int" in kind else "a number" if "float" in kind else "a boolean" if "bool" in kind else None
        message = f"'{param}' must be {what}" if param and what else f"'{param}' is not valid" if param else "the request is not valid"
        return JSONResponse(error_body(message, "invalid_value", param), status_code=400)


def create_app(settings: ServerSettings | None = None, runtime: Runtime | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    runtime = runtime or Runtime(settings)
    web = web_dir()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await runtime.start()
        try:
            yield
        finally:
            calls.close_pending("server shutting down")
            await shutdown(runtime)

    calls = CallRegistry(runtime)  # WebRTC calls and the pool of those connecting (omni_rt.transports.webrtc)
    live_registry = LiveRegistry()  # GPT-Live sessions by id, for their /attach sidebands
    app = FastAPI(title="omni-rt", lifespan=lifespan)
    app.state.calls = calls
    app.state.runtime = runtime
    install_error_handlers(app)

    def guarded(request: Request) -> JSONResponse | None:
        """/metrics and /debug/* need the API key when one is set."""
        if key_ok(settings, presented_key(request.headers, request.query_params)):
            return None
        return JSONResponse(error_body("missing or invalid API key", "invalid_api_key"), status_code=401)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok = runtime.coordinator is not None and runtime.coordinator.started and not runtime.draining
        return JSONResponse({"status": "ok" if ok else ("draining" if runtime.draining else "starting"),
                             "preset": runtime.config.name, "sessions": len(runtime.sessions)}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if (refused := guarded(request)) is not None:
            return refused
        runtime.live_state()
        return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/debug/state")
    async def debug_state(request: Request) -> JSONResponse:
        """Live per-request state of every stage (tests assert it returns to zero)."""
        if (refused := guarded(request)) is not None:
            return refused
        cache = {name: state for name, st in runtime.coordinator.stages.items()
                 if (state := st.scheduler.cache_state())}  # e.g. the thinker's prefix/KV accounting
        pools = [{"library": Path(p["filepath"]).name, "api": p["internal_api"], "threads": p["num_threads"]}
                 for p in threadpool_info()]  # the native thread pools loaded here: what shares the cores
        return JSONResponse({"live": runtime.live_state(), "total": runtime.coordinator.live_total(),
                             "sessions": len(runtime.sessions), "webrtc": calls.state(), "cache": cache,
                             "thread_pools": pools, "memory": runtime.memory.state()})

    @app.get("/debug/stage_times")
    async def debug_stage_times(request: Request, after: int = 0) -> JSONResponse:
        """Exact per-turn stage waits and computes (``omni_rt_stage_time_seconds``' observations) numbered above
        ``after``: latency_bench reads ``last`` before a run and the samples after it."""
        if (refused := guarded(request)) is not None:
            return refused
        return JSONResponse(runtime.metrics.stage_samples(after))

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(web / "index.html")

    app.mount("/static", StaticFiles(directory=web), name="static")

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        if not await admit(ws, runtime, "realtime", new_session="call_id" not in ws.query_params):
            return
        if (call_id := ws.query_params.get("call_id")) is not None:  # sideband of a WebRTC call
            await calls.sideband(call_id, ws)
            return
        beta = ws.query_params.get("beta") in ("1", "true") or "realtime=v1" in ws.headers.get("openai-beta", "")
        runner = SessionRunner(runtime, new_session(runtime, ws.query_params.get("model"), beta_events=beta), "websocket")
        await serve_session(ws, runtime, runner, receive_realtime)

    @app.post("/v1/realtime/calls")
    async def create_call(request: Request) -> Response:
        """OpenAI's WebRTC flow: SDP offer in, 201 + SDP answer + Location out (omni_rt.transports.webrtc). The
        call waits in the pending pool (per client address) and takes a session slot only once it connects."""
        refused = check_access(request, settings)
        if refused is not None:
            runtime.metrics.connections.labels(surface="webrtc", outcome="refused_auth").inc()
            status = 403 if refused.startswith("origin") else 401
            return JSONResponse(CallError(status, "invalid_api_key" if status == 401 else "origin_not_allowed", refused).body(), status_code=status)
        try:
            sdp, session = await read_offer(request)
            if len(runtime.sessions) >= settings.max_sessions or runtime.draining:
                runtime.metrics.connections.labels(surface="webrtc", outcome="refused_full").inc()
                why = "server shutting down" if runtime.draining else f"server full: {settings.max_sessions} sessions"
                raise CallError(503, "server_full", why)
            client = request.client.host if request.client is not None else "unknown"
            call = await calls.create(sdp, session, request.query_params.get("model"), client)
        except CallError as exc:
            if exc.code in ("rate_limit_exceeded", "too_many_pending_calls"):
                runtime.metrics.connections.labels(surface="webrtc", outcome="refused_pending").inc()
            return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())
        runtime.metrics.connections.labels(surface="webrtc", outcome="accepted").inc()
        return Response(call.pc.localDescription.sdp, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call.id}"})

    @app.post("/v1/realtime/calls/{call_id}/hangup")
    async def hangup_call(call_id: str, request: Request) -> Response:
        if (refused := guarded(request)) is not None:
            return refused
        if not calls.hangup(call_id):
            return JSONResponse(CallError(404, "call_not_found", "no such call").body(), status_code=404)
        return Response(status_code=200)

    @app.websocket("/v1/live/sessions")
    async def live_sessions(ws: WebSocket) -> None:
        """GPT-Live over WebSocket (omni_rt.transports.live): the Live protocol over the same session core."""
        if not await admit(ws, runtime, "live"):
            return
        await live_endpoint(ws, runtime, settings.live_delegation, live_registry)

    @app.websocket("/v1/live/sessions/{session_id}/attach")
    async def live_attach(ws: WebSocket, session_id: str) -> None:
        """A sideband controller of a running Live session (WebSocket or WebRTC): its events, its commands."""
        if not await admit(ws, runtime, "live_sideband", new_session=False):
            return
        await live_registry.attach(session_id, ws)

    @app.post("/v1/live/sessions")
    async def create_live_session(request: Request) -> Response:
        """GPT-Live over WebRTC (omni_rt.transports.live_webrtc): {session, transport: {type: webrtc, sdp}} in,
        {session: {id}, transport: {type: webrtc, sdp}} out; the call waits in the same pending pool as
        /v1/realtime/calls."""
        refused = check_access(request, settings)
        if refused is not None:
            runtime.metrics.connections.labels(surface="live_webrtc", outcome="refused_auth").inc()
            status = 403 if refused.startswith("origin") else 401
            return JSONResponse(CallError(status, "invalid_api_key" if status == 401 else "origin_not_allowed", refused).body(), status_code=status)
        try:
            sdp, session = await read_live_offer(request)
            live = start_live(session, tuple(runtime.config.voices), settings.live_delegation, settings.delegate is not None)
            if len(runtime.sessions) >= settings.max_sessions or runtime.draining:
                runtime.metrics.connections.labels(surface="live_webrtc", outcome="refused_full").inc()
                why = "server shutting down" if runtime.draining else f"server full: {settings.max_sessions} sessions"
                raise CallError(503, "server_full", why)
            client = request.client.host if request.client is not None else "unknown"
            call = await calls.create(sdp, live.core_session, live.config.model if live.config else None, client,
                                      call_type=lambda *a: LiveCall(*a, live=live, live_registry=live_registry))
        except CallError as exc:
            return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())
        runtime.metrics.connections.labels(surface="live_webrtc", outcome="accepted").inc()
        return JSONResponse({"session": {"id": live.id}, "transport": {"type": "webrtc", "sdp": call.pc.localDescription.sdp}})

    @app.websocket("/v1/telephony/twilio")
    async def twilio(ws: WebSocket) -> None:
        if not await admit(ws, runtime, "twilio"):
            return
        await twilio_endpoint(ws, runtime)

    return app


async def drain(runtime: Runtime) -> None:
    """Stop admitting, give open answers the grace period, then cancel the rest (``response.done`` cancelled)
    and close every socket with 1001 and a reason."""
    runtime.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + runtime.settings.shutdown_grace_s
    while any(r.session.response is not None for r in runtime.sessions) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    for runner in list(runtime.sessions):
        runner.request_close(CLOSE_GOING_AWAY, "server shutting down")
    while runtime.sessions and loop.time() < deadline + 2.0:  # the sockets close themselves
        await asyncio.sleep(0.05)


async def shutdown(runtime: Runtime) -> None:
    await drain(runtime)
    for runner in list(runtime.sessions):
        await runner.close()
    await runtime.stop()
