"""Turn-detection config: the one owner of ``session.audio.input.turn_detection`` (GA ``server_vad`` /
``semantic_vad``), its defaults, its validation, and what the ASR stage needs to run it.

Why here, in the shared vocabulary: the protocol layer parses it once into a ``TurnDetectionConfig`` and echoes
it, the session reads its flags, the ASR stage executes it; all must agree on the defaults and on what
``eagerness`` means, so all take the same typed value from this module.

``semantic_vad``: Silero finds pauses; at each pause of ``score_after_ms`` the Smart Turn model scores the
turn so far. A sure "complete" (score >= ``sure_threshold``) ends the turn once the pause reaches
``complete_silence_ms``; an unsure one (>= ``complete_threshold``) after ``unsure_silence_ms``; otherwise the
turn ends only after ``max_silence_ms`` (the GA protocol's max timeouts). Numbers per eagerness and why:

=========  ====  ========  ======  =======  ====  ===================================================================
eagerness  sure  complete  unsure  unsure   max   why
           >=    silence   >=      silence
=========  ====  ========  ======  =======  ====  ===================================================================
``low``    0.9   400 ms    0.7     1500 ms  8 s   GA max 8 s; waits out most thinking pauses
``medium`` 0.85  200 ms    0.5     1000 ms  4 s   GA 4 s; 200 ms is the stop silence Smart Turn is trained for
``high``   0.7   150 ms    0.3     600 ms   2 s   GA 2 s; ends on a lukewarm "complete"
``auto``   = medium                               the GA default, "equivalent to medium"
=========  ====  ========  ======  =======  ====  ===================================================================

Why two tiers: on Piper speech finished questions score >= 0.95, fragments cut at a filler ("Who wrote, uh,")
mostly < 0.05 but some 0.7; a 400-900 ms hesitation outlasts 200 ms, not 1000 ms.

The model scores at ``score_after_ms`` = 120 ms of silence (about four 32 ms Silero frames: shorter gaps
are the stops inside words) so that with its ~40-130 ms cost the verdict is in by ~200 ms of silence. Piper
speech with a hesitation filler ("..., um,") scores < 0.06, a finished question > 0.95 (tests/test_turn_detection.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PARAM = "session.audio.input.turn_detection"
EAGERNESS = ("low", "medium", "high", "auto")
SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")
IDLE_TIMEOUT_RANGE = (1000, 600_000)
SCORE_AFTER_MS = 120
SEMANTIC_PREFIX_PADDING_MS = 300
SEMANTIC_THRESHOLD = 0.5  # Silero's speech threshold under semantic_vad (the GA field is server_vad-only)


@dataclass(frozen=True)
class Eagerness:
    """How sure the turn model must be, and how long to wait when it is and when it is not."""

    sure_threshold: float
    complete_silence_ms: int
    complete_threshold: float
    unsure_silence_ms: int
    max_silence_ms: int

    def end_silence_ms(self, prob: float | None) -> int:
        """Silence after which the turn ends, given the model's verdict on this pause (None: not scored yet)."""
        if prob is not None and prob >= self.sure_threshold:
            return self.complete_silence_ms
        if prob is not None and prob >= self.complete_threshold:
            return self.unsure_silence_ms
        return self.max_silence_ms


EAGERNESS_SETTINGS: dict[str, Eagerness] = {
    "low": Eagerness(0.9, 400, 0.7, 1500, 8000),
    "medium": Eagerness(0.85, 200, 0.5, 1000, 4000),
    "high": Eagerness(0.7, 150, 0.3, 600, 2000),
}
EAGERNESS_SETTINGS["auto"] = EAGERNESS_SETTINGS["medium"]


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


@dataclass(frozen=True)
class TurnDetection:
    """The ASR stage's view: VAD numbers, plus the turn model's rule under ``semantic_vad``.

    ``enabled=False`` means the client commits turns itself. Under ``semantic_vad`` the VAD's
    ``silence_duration_ms`` is the eagerness' max silence, so a turn the model calls incomplete still ends.
    """

    enabled: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    semantic: Eagerness | None = None
    idle_timeout_ms: int | None = None

    @classmethod
    def from_config(cls, cfg: TurnDetectionConfig | None) -> "TurnDetection":
        if cfg is None:
            return cls(enabled=False)
        if cfg.semantic:
            eager = EAGERNESS_SETTINGS[cfg.eagerness]
            return cls(threshold=SEMANTIC_THRESHOLD, prefix_padding_ms=SEMANTIC_PREFIX_PADDING_MS,
                       silence_duration_ms=eager.max_silence_ms, semantic=eager)
        return cls(threshold=float(cfg.threshold), prefix_padding_ms=cfg.prefix_padding_ms,
                   silence_duration_ms=cfg.silence_duration_ms, idle_timeout_ms=cfg.idle_timeout_ms)
