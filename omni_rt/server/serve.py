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


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self._drain_task: asyncio.Task | None = None

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


def serve(settings: ServerSettings, log_level: str = "info") -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(RedactSecrets())
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
                            log_level=log_level, timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
                            timeout_keep_alive=settings.connect_timeout_s, backlog=accept_backlog(file_limit()),
                            http=functools.partial(GuardedHttpProtocol, guard=guard))  # type: ignore[arg-type]
    DrainingServer(config, app.state.runtime).run()
