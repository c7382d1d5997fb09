"""What a transport needs from the server that hosts it, as a ``Protocol``.

Transports sit below ``server/``: they take the server's runtime as a parameter typed by this protocol, so
no transport imports the server (``omni_rt.server.runtime.Runtime`` satisfies it).
"""

from __future__ import annotations

from typing import Any, Protocol

from omni_rt.pipeline.config import PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator
from omni_rt.session.core import SessionLimits


class TransportSettings(Protocol):
    idle_timeout_s: float  # a connection silent this long is closed
    send_timeout_s: float  # a send blocked this long means the client stopped reading
    speculative_responses: bool


class TransportHost(Protocol):
    coordinator: Coordinator
    config: PipelineConfig
    settings: TransportSettings
    metrics: Any  # the server's Prometheus metrics (sessions, errors, ttfa, speculative, stage_latency,
    # observe_stage: per-stage queue/compute)
    sessions: set[Any]  # live session runners, for draining at shutdown

    def session_limits(self) -> SessionLimits: ...
