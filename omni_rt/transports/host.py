"""What a transport needs from the server that hosts it, as a ``Protocol``, and the one way a transport opens a
session on it (``new_session``).

Transports sit below ``server/``: they take the server's runtime as a parameter typed by this protocol, so
no transport imports the server (``omni_rt.server.runtime.Runtime`` satisfies it).
"""

from __future__ import annotations

from typing import Any, Protocol

from omni_rt.pipeline.config import PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator
from omni_rt.session.core import RealtimeSession, SessionLimits, SessionOptions

MAX_MODEL_NAME_CHARS = 64  # a client-chosen model name is echoed in session.created: clipped to this


class TransportSettings(Protocol):
    idle_timeout_s: float  # a connection silent this long is closed
    send_timeout_s: float  # a send blocked this long means the client stopped reading
    speculative_responses: bool
    max_sessions: int  # sessions open at once, every transport together
    max_message_bytes: int
    max_outgoing_bytes: int
    webrtc_max_pending_calls: int  # WebRTC calls answered but not connected (omni_rt.transports.webrtc_admission)
    webrtc_max_pending_per_client: int  # of those, from one source address
    webrtc_connect_timeout_s: float  # a pending call not connected by then is freed
    tool_preamble: str  # "auto" | "off": the sessions' default (omni_rt.engine.tools.preamble)
    backchannel_filter: bool  # speech over a heard answer is decided before it barges in (omni_rt.stages.asr.interruption)


class TransportHost(Protocol):
    coordinator: Coordinator
    config: PipelineConfig
    settings: TransportSettings
    model_name: str  # the model a session reports when its client names none
    metrics: Any  # the server's Prometheus metrics (sessions, errors, ttfa, speculative, stage_latency,
    # observe_stage: per-stage queue/compute)
    sessions: set[Any]  # live session runners, for draining at shutdown

    def session_limits(self) -> SessionLimits: ...


def new_session(host: TransportHost, model: str | None = None, *, beta_events: bool = False,
                session: dict[str, Any] | None = None) -> RealtimeSession:
    """A new realtime session on ``host``: the server's options (speculative answers, the preset's voices), its
    per-session limits, and the model name the client asked for (clipped) or the server's.

    ``session``: an initial ``session.update`` payload (WebRTC's offer, Twilio's μ-law formats); a bad one
    raises ``ProtocolError`` as ``session.update`` would. Every transport opens its sessions here; it then
    drives the session with a ``SessionRunner`` (``omni_rt.transports.runner``).
    """
    options = SessionOptions(model_name=model[:MAX_MODEL_NAME_CHARS] if model else host.model_name,
                             speculative_responses=host.settings.speculative_responses, beta_events=beta_events,
                             tool_preamble=getattr(host.settings, "tool_preamble", "auto"),
                             backchannel_filter=getattr(host.settings, "backchannel_filter", True),
                             voices=tuple(host.config.voices))
    return RealtimeSession(options, host.session_limits(), session=session)
