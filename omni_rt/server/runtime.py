"""Runtime: the pipeline (coordinator + stages) behind every session of one server process."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from threadpoolctl import threadpool_limits

from omni_rt.presets import load_preset
from omni_rt.audio import PIPELINE_INPUT_RATE
from omni_rt.pipeline.config import ConfigError, PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.server.memory import IdleMemoryRelease
from omni_rt.server.metrics import Metrics
from omni_rt.server.settings import ServerSettings
from omni_rt.session.core import SessionLimits

log = logging.getLogger("omni_rt.runtime")
session_log = logging.getLogger("omni_rt.sessions")


class SessionRegistry(set):
    """The open sessions (each transport's ``SessionRunner``), logging one structured line when a session opens
    and one when it closes: what an operator reads per session (id, transport, duration, answers, errors)."""

    def __init__(self, on_idle: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._opened: dict[int, tuple[float, str]] = {}
        self._on_idle = on_idle  # called when the last open session has closed

    @staticmethod
    def _transport(runner: Any) -> str:
        return getattr(runner, "transport", None) or "unknown"

    def add(self, runner: Any) -> None:
        if runner in self:
            return
        super().add(runner)
        transport = self._transport(runner)
        self._opened[id(runner)] = (time.monotonic(), transport)
        session_log.info("session opened id=%s transport=%s open=%d", runner.session.id, transport, len(self))

    def discard(self, runner: Any) -> None:
        if runner not in self:
            return
        super().discard(runner)
        t0, transport = self._opened.pop(id(runner), (time.monotonic(), "unknown"))
        stats = getattr(runner.session, "stats", {})
        session_log.info("session closed id=%s transport=%s duration_s=%.1f responses=%d errors=%d items=%d open=%d",
                 runner.session.id, transport, time.monotonic() - t0, stats.get("responses", 0), stats.get("errors", 0),
                 stats.get("items", 0), len(self))
        if not self and self._on_idle is not None:
            self._on_idle()

    def remove(self, runner: Any) -> None:
        if runner not in self:
            raise KeyError(runner)
        self.discard(runner)


class Runtime:
    def __init__(self, settings: ServerSettings, config: PipelineConfig | None = None) -> None:
        self.settings = settings
        self.config = config or load_preset(settings.preset)
        audio_in = self.config.roles.audio_in
        for role in ("audio_in", "text"):
            if getattr(self.config.roles, role) is None:
                raise ConfigError(self.config.name, f"roles.{role}", "a realtime server needs this role "
                                  "(e.g. roles: {audio_in: asr, text: thinker, clauses: talker, audio: vocoder})")
        if audio_in is not None and config is None:  # the session stage's limits follow the server's
            self.config.stage(audio_in).args.update(max_sessions=settings.max_sessions,
                                                    max_buffered_bytes=int(settings.max_buffered_audio_s * PIPELINE_INPUT_RATE * 2))
        if settings.thinker and config is None:  # --thinker: any GGUF or OpenAI-compatible server
            from omni_rt.engine.weights.thinker_choice import apply_thinker

            stage = apply_thinker(self.config, settings.thinker, settings.thinker_api_key)
            log.info("thinker (stage %s): %s", stage, settings.thinker)
        if settings.random_weights:  # offline benchmarking: no hub weights (omni_rt.engine.weights.random_init)
            from omni_rt.engine.weights.random_init import apply_random_weights

            changed = apply_random_weights(self.config, settings.random_weights)
            log.info("random weights (%s) on stages %s", settings.random_weights, changed)
        self.metrics = Metrics()
        self.model_name = f"omni-rt-{self.config.name}"
        self.max_response_tokens = settings.max_response_tokens
        self.speculative_responses = settings.speculative_responses
        self.coordinator: Coordinator | None = None  # type: ignore[assignment]
        self.memory = IdleMemoryRelease(idle=lambda: not self.sessions, release_caches=self._release_stage_memory)  # freed heap back to the OS once no session is open
        self.sessions: set[Any] = SessionRegistry(on_idle=self.memory)  # SessionRunner of every open connection
        self.draining = False  # shutting down: no new sessions
        self._warm_task: asyncio.Task | None = None

    async def start(self) -> None:
        t0 = time.perf_counter()
        # numpy's OpenBLAS wakes its second thread for Whisper's mel filter (an 80x201 matmul, ~0.5 ms) and that
        # thread then spins for far longer than the call, CPU the sessions' decodes need (docs/tuning-cpu.md,
        # "numpy's BLAS"). threadpoolctl: the maintained way to reach a loaded BLAS at run time.
        threadpool_limits(limits=self.settings.blas_threads, user_api="blas")
        self.coordinator = Coordinator(self.config)
        await self.coordinator.start()
        log.info("pipeline '%s' ready in %.1f s", self.config.name, time.perf_counter() - t0)
        self._warm_task = asyncio.create_task(self._warm_thinker())

    async def _warm_thinker(self) -> None:
        """Let a thinker that keeps prompts per slot (llama.cpp) prefill the default instructions, in the
        background: a fresh server's first turns then find their system prompt cached."""
        warm = getattr(self._response_scheduler(), "warm_system_prompt", None)
        if warm is None:
            return
        t0 = time.perf_counter()
        try:
            n = await asyncio.to_thread(warm, SessionConfig().instructions)
        except Exception as exc:  # an optimisation only: the first turns then prefill it themselves
            log.warning("warming the thinker's slots failed: %s", exc)
            return
        log.info("thinker: default instructions prefilled into %d slots in %.1f s", n, time.perf_counter() - t0)

    async def stop(self) -> None:
        if self._warm_task is not None:
            await asyncio.wait([self._warm_task], timeout=5)
        if self.coordinator is not None:
            await self.coordinator.stop()

    def _release_stage_memory(self) -> None:
        if self.coordinator is not None:
            self.coordinator.release_memory()

    def _response_scheduler(self) -> Any:
        """The scheduler of the stage that answers (the thinker), None before start or without one."""
        coord = self.coordinator
        if coord is None or coord.roles.response not in coord.stages:
            return None
        return coord.stages[coord.roles.response].scheduler

    def session_limits(self) -> SessionLimits:
        """Per-session caps; with the thinker's history budget (``omni_rt.engine.prompt.history``) once it is known, so
        an item too large for any prompt is refused when it is created."""
        history = getattr(self._response_scheduler(), "history", None)
        budget = {} if history is None else dict(
            item_tokens=history.count, max_item_tokens=history.max_item_tokens, item_budget_note=f" ({history.describe()})")
        return SessionLimits(max_response_tokens=self.settings.max_response_tokens,
                             max_outgoing_bytes=self.settings.max_outgoing_bytes, **budget)

    def live_state(self) -> dict[str, Any]:
        state = self.coordinator.live_state()
        self.metrics.live_state.set(self.coordinator.live_total())
        return state
