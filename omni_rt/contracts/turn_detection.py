"""The ``turn_detection`` wire config (``session.audio.input.turn_detection``, GA ``server_vad`` / ``semantic_vad``):
its fields, defaults and validation, and what ``session.created`` / ``session.updated`` echo.

Why here, in the shared vocabulary: the protocol layer parses it once into a ``TurnDetectionConfig`` and echoes
it, the session reads its flags and hands it to the audio-in stage (``omni_rt.contracts.audio_in``), and the ASR
stage runs it; all take the same typed value from this module. What ``eagerness`` and the VAD numbers *do* (the
turn rule) is the ASR stage's: ``omni_rt.stages.asr.turn_rule``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PARAM = "session.audio.input.turn_detection"
EAGERNESS = ("low", "medium", "high", "auto")
SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")
IDLE_TIMEOUT_RANGE = (1000, 600_000)


class TurnDetectionError(ValueError):
    """A turn_detection value we refuse; ``param`` names the field (the protocol layer turns it into an error event)."""

    def __init__(self, code: str, message: str, param: str) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def _number(td: dict[str, Any], key: str, typ: type | tuple[type, ...], lo: float, hi: float) -> Any:
    v = td[key]
    if not isinstance(v, typ) or isinstance(v, bool) or not (lo <= v <= hi):
        raise TurnDetectionError("invalid_value", f"turn_detection.{key} must be a number in [{lo}, {hi}]", f"{PARAM}.{key}")
    return v


def parse_turn_detection(td: Any) -> "TurnDetectionConfig | None":
    """Validate a client's ``turn_detection`` once; the typed result (defaults filled) is what the session
    echoes (``to_wire``) and what the ASR stage runs (``TurnDetection.from_config``). ``None``: client commits."""
    if td is None:
        return None
    if not isinstance(td, dict):
        raise TurnDetectionError("invalid_type", "turn_detection must be an object or null", PARAM)
    kind = td.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise TurnDetectionError("invalid_value", f"turn_detection.type '{kind}' is not supported (server_vad, semantic_vad or null)",
                                 f"{PARAM}.type")
    flags: dict[str, bool] = {}
    for key in ("create_response", "interrupt_response"):
        if td.get(key) is not None:
            if not isinstance(td[key], bool):
                raise TurnDetectionError("invalid_type", f"turn_detection.{key} must be a boolean", f"{PARAM}.{key}")
            flags[key] = td[key]
    if kind == "semantic_vad":
        for key in SERVER_VAD_ONLY:
            if td.get(key) is not None:
                raise TurnDetectionError("invalid_value", f"turn_detection.{key} is only used with server_vad, not semantic_vad",
                                         f"{PARAM}.{key}")
        eagerness = td.get("eagerness")
        eagerness = "auto" if eagerness is None else eagerness
        if eagerness not in EAGERNESS:
            raise TurnDetectionError("invalid_value", f"turn_detection.eagerness must be one of {list(EAGERNESS)}, not {eagerness!r}",
                                     f"{PARAM}.eagerness")
        return TurnDetectionConfig(type="semantic_vad", eagerness=eagerness, **flags)
    if td.get("eagerness") is not None:
        raise TurnDetectionError("invalid_value", "turn_detection.eagerness is only used with semantic_vad, not server_vad",
                                 f"{PARAM}.eagerness")
    numbers: dict[str, Any] = {}
    for key, typ, lo, hi in (("threshold", (int, float), 0.0, 1.0), ("prefix_padding_ms", int, 0, 5000),
                             ("silence_duration_ms", int, 100, 10000), ("idle_timeout_ms", int, *IDLE_TIMEOUT_RANGE)):
        if td.get(key) is not None:
            numbers[key] = _number(td, key, typ, lo, hi)
    return TurnDetectionConfig(type="server_vad", **flags, **numbers)


@dataclass(frozen=True)
class TurnDetectionConfig:
    """A validated ``turn_detection`` (GA field names): plain frozen data, so it crosses the stage queue as is."""

    type: str = "server_vad"  # server_vad | semantic_vad
    create_response: bool = True
    interrupt_response: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"  # semantic_vad only

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad"

    def to_wire(self) -> dict[str, Any]:
        """What ``session.created/updated`` echo: the fields of this type, defaults filled."""
        out: dict[str, Any] = {"type": self.type}
        if self.semantic:
            out.update(create_response=self.create_response, interrupt_response=self.interrupt_response, eagerness=self.eagerness)
            return out
        out.update(threshold=self.threshold, prefix_padding_ms=self.prefix_padding_ms, silence_duration_ms=self.silence_duration_ms,
                   create_response=self.create_response, interrupt_response=self.interrupt_response)
        if self.idle_timeout_ms is not None:
            out["idle_timeout_ms"] = self.idle_timeout_ms
        return out


SERVER_VAD = TurnDetectionConfig()
