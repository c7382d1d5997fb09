"""Prometheus metrics, one registry per server instance (tests start several in one process)."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
# queue waits are often a few ms: finer at the bottom, so p50s there are not all "somewhere under 50 ms"
STAGE_TIME_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
                      1.0, 1.5, 2.0, 3.0, 5.0)
STAGE_TIME_KINDS = ("queue", "compute")
STAGE_SAMPLES_KEPT = 8192  # the last stage-time observations, exact, for /debug/stage_times (a bench's quantiles)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sessions = Gauge("omni_rt_active_sessions", "Open realtime/telephony sessions", registry=self.registry)
        self.ttfa = Histogram("omni_rt_ttfa_seconds", "End-of-turn decision to first audio delta sent",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.stage_latency = Histogram("omni_rt_stage_latency_seconds", "Per-stage latency", ["stage"],
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        # per answered turn, each stage on the path after the last word: its first output's wait vs compute
        # (asr_final and smart_turn from the session's events; thinker/talker/vocoder from ResultItem.timings)
        self.stage_time = Histogram("omni_rt_stage_time_seconds", "Per answered turn, where each stage's first "
                                    "output waited (kind=queue) and was computed (kind=compute)", ["stage", "kind"],
                                    buckets=STAGE_TIME_BUCKETS, registry=self.registry)
        self.errors = Counter("omni_rt_errors_total", "Error events sent, by code", ["code"], registry=self.registry)
        self.connections = Counter("omni_rt_connections_total", "WebSocket connections, by outcome", ["surface", "outcome"],
                                   registry=self.registry)
        self.speculative = Counter("omni_rt_speculative_responses_total",
                                   "Answers started in the end-of-turn silence, by outcome (released/discarded)", ["outcome"],
                                   registry=self.registry)
        self.tcp = Counter("omni_rt_tcp_connections_total", "Connections the connection guard closed or refused, by "
                           "outcome (evicted: made room; timed_out: headers not complete in time; refused: 503/1013; "
                           "dropped: closed unread)", ["outcome"], registry=self.registry)
        self.connection_cap = Gauge("omni_rt_connection_cap", "Connections held at most (from the open-file limit)",
                                    registry=self.registry)
        self.pending_calls = Gauge("omni_rt_webrtc_pending_calls", "WebRTC calls answered but not yet connected "
                                   "(they hold no session; freed at connect, ICE failure or the connect deadline)",
                                   registry=self.registry)
        self.live_state = Gauge("omni_rt_live_request_state", "Live per-request/per-session entries held by the runtime",
                                registry=self.registry)

        self._stage_samples: deque[tuple[int, str, str, float]] = deque(maxlen=STAGE_SAMPLES_KEPT)
        self._stage_seq = itertools.count(1)

    def observe_stage(self, stage: str, kind: str, seconds: float) -> None:
        """One answered turn's wait (kind=queue) or compute (kind=compute) in ``stage``: the histogram, and the
        exact value kept for ``stage_samples`` (bucket interpolation is too coarse to decide from at n=8)."""
        self.stage_time.labels(stage=stage, kind=kind).observe(seconds)
        self._stage_samples.append((next(self._stage_seq), stage, kind, seconds))

    def stage_samples(self, after: int = 0) -> dict[str, Any]:
        """Observations numbered above ``after`` (oldest first) and the last number: a client reads the number
        before a run and asks for what came after it. Only the event loop writes, so a snapshot is consistent."""
        rows = [{"seq": n, "stage": st, "kind": k, "ms": round(v * 1000, 2)} for n, st, k, v in self._stage_samples if n > after]
        last = self._stage_samples[-1][0] if self._stage_samples else 0
        return {"last": last, "samples": rows}

    def render(self) -> bytes:
        return generate_latest(self.registry)
