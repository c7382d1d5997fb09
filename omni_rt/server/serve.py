"""Run the app under uvicorn with a real drain on SIGTERM / Ctrl-C.

uvicorn's own shutdown closes every WebSocket with 1012 the moment the signal arrives, before the app's
lifespan shutdown runs, so open answers would be cut with no ``response.done`` and no reason. Here the first
signal only starts the drain — no new sessions, open answers get ``shutdown_grace_s`` to finish, the rest
end ``cancelled``, then every socket closes with 1001 and a reason — and uvicorn exits after it. A second
signal exits at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import socket
from types import FrameType

import uvicorn

from omni_rt.server.app import create_app, drain
from omni_rt.server.connections import ConnectionGuard, GuardedHttpProtocol, accept_backlog, file_limit
from omni_rt.server.settings import ServerSettings

log = logging.getLogger("omni_rt.server")

_SECRET_QUERY = re.compile(r"((?:token|api_key|key)=)[^&\s\"']+", re.IGNORECASE)


class RedactSecrets(logging.Filter):
    """Access and connection log lines carry the request path: never let a ``?token=`` reach the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = tuple(_SECRET_QUERY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = _SECRET_QUERY.sub(r"\1***", record.msg)
        return True


_LOOPBACK_URL = re.compile(r"https?://(?:127\.0\.0\.1|localhost|\[::1\]|0\.0\.0\.0):(\d+)[^\s\"',)]*")
# Quiet libraries: httpx logs one INFO line per request (every thinker call, with the engine's internal URL)
QUIET_LOGGERS = ("httpx", "httpcore", "hpack", "aioice", "aiortc")


class HideInternalUrls(logging.Filter):
    """No internal address (the engine's loopback URL) in a log line below WARNING: it is replaced with
    ``<engine>``. The server's own address (its port) is kept. At DEBUG the line is left as it is."""

    def __init__(self, own_port: int) -> None:
        super().__init__()
        self.own_port = str(own_port)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or record.levelno <= logging.DEBUG:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report
            return True
        if "://" not in message:
            return True
        hidden = _LOOPBACK_URL.sub(lambda m: m.group(0) if m.group(1) == self.own_port else "<engine>", message)
        if hidden != message:
            record.msg, record.args = hidden, None
        return True


class ClientMistakesAtInfo(logging.Filter):
    """uvicorn logs a client's invalid UTF-8 text frame at ERROR with a traceback; it is the client's mistake
    (the socket is closed with 1007): one INFO line, no traceback. Its per-WebSocket "connection open/closed"
    lines go to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and record.msg in ("connection open", "connection closed"):
            # one line per WebSocket from uvicorn, saying nothing the access line and the session lines do not
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("uvicorn.error").isEnabledFor(logging.DEBUG)
        if record.levelno >= logging.ERROR and isinstance(record.msg, str) and record.msg.startswith("Invalid UTF-8"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "client sent invalid UTF-8 in a text frame: closed with 1007", None
            record.exc_info = record.exc_text = None
        return True


def quiet_logs(own_port: int) -> None:
    """The server's log policy: library per-request lines off at INFO, no internal URL below WARNING, client
    mistakes at INFO (omni_rt/server/serve.py)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    hide = HideInternalUrls(own_port)
    for handler in logging.getLogger().handlers:
        handler.addFilter(hide)
    for name in ("uvicorn.error", "uvicorn.access", "uvicorn"):
        logging.getLogger(name).addFilter(hide)
    logging.getLogger("uvicorn.error").addFilter(ClientMistakesAtInfo())


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self._drain_task: asyncio.Task | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets is not None and not self.should_exit:  # uvicorn says where it listens only on sockets it bound
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            logging.getLogger("uvicorn.error").info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", shown, port)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or not self.started:
            return super().handle_exit(sig, frame)  # second signal, or not serving yet: exit now
        log.info("signal %s: draining (grace %.1f s)", sig, self.runtime.settings.shutdown_grace_s)
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_task(self._drain_then_exit(sig, frame))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            await drain(self.runtime)
        finally:
            super().handle_exit(sig, frame)


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's TCP socket, bound and listening now, before the models load; uvicorn accepts on it once they
    have (a client that connects meanwhile waits in the listen queue).

    Why not let uvicorn bind it: it binds after the lifespan startup, seconds later, so a port that is in use
    was reported only after the models had loaded, and a child the startup spawns (llama-server picks a free port
    of its own) could take the port meanwhile. ``SO_REUSEADDR`` as uvicorn sets it (a restart right after a stop
    binds again); listening at once is what keeps a second server started on the same port meanwhile out (two
    sockets with ``SO_REUSEADDR`` may share a port until one listens)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen()
    except OSError as exc:
        sock.close()
        raise SystemExit(f"omni-rt: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(settings: ServerSettings, log_level: str = "info") -> None:
    listener = bind_listener(settings.host, settings.port)
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(RedactSecrets())
    quiet_logs(settings.port)
    app = create_app(settings)
    metrics = app.state.runtime.metrics

    def count(what: str, n: int) -> None:
        if what == "cap":
            metrics.connection_cap.set(n)
        else:
            metrics.tcp.labels(outcome=what).inc(n)

    # Connections are counted and capped by the guard (omni_rt/server/connections.py): uvicorn's limit_concurrency
    # answers 503 only after the headers and would count the same sockets twice, so it stays off.
    guard = ConnectionGuard(header_timeout_s=settings.connect_timeout_s, max_sessions=settings.max_sessions,
                            configured_cap=settings.max_connections, on_event=count)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, ws_max_size=settings.max_message_bytes,
                            ws_ping_interval=settings.ping_interval_s, ws_ping_timeout=settings.ping_interval_s,
                            log_level=log_level, timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
                            timeout_keep_alive=settings.connect_timeout_s, backlog=accept_backlog(file_limit()),
                            http=functools.partial(GuardedHttpProtocol, guard=guard))  # type: ignore[arg-type]
    DrainingServer(config, app.state.runtime).run(sockets=[listener])
