"""Runtime: the pipeline (coordinator + stages) behind every session of one server process."""

from __future__ import annotations

import logging
import time
from typing import Any

from models.presets import load_preset
from omni_rt.core.config import PipelineConfig
from omni_rt.core.coordinator import Coordinator
from omni_rt.server.metrics import Metrics
from omni_rt.server.settings import ServerSettings

log = logging.getLogger("omni_rt.runtime")


class Runtime:
    def __init__(self, settings: ServerSettings, config: PipelineConfig | None = None) -> None:
        self.settings = settings
        overrides = {"asr": {"max_sessions": settings.max_sessions,
                             "max_buffered_bytes": int(settings.max_buffered_audio_s * 16000 * 2)}}
        self.config = config or load_preset(settings.preset, overrides)
        self.metrics = Metrics()
        self.model_name = f"omni-rt-{self.config.name}"
        self.max_response_tokens = settings.max_response_tokens
        self.speculative_responses = settings.speculative_responses
        self.coordinator: Coordinator | None = None  # type: ignore[assignment]
        self.sessions: set[Any] = set()

    async def start(self) -> None:
        t0 = time.perf_counter()
        self.coordinator = Coordinator(self.config)
        await self.coordinator.start()
        log.info("pipeline '%s' ready in %.1f s", self.config.name, time.perf_counter() - t0)

    async def stop(self) -> None:
        if self.coordinator is not None:
            await self.coordinator.stop()

    def live_state(self) -> dict[str, Any]:
        state = self.coordinator.live_state()
        self.metrics.live_state.set(self.coordinator.live_total())
        return state
