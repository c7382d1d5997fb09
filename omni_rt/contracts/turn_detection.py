"""Turn-detection config: the one owner of ``session.audio.input.turn_detection`` (GA ``server_vad`` /
``semantic_vad``), its defaults, its validation, the ``semantic_vad`` rule and every number it uses.

Why here, in the shared vocabulary: the protocol layer parses it once into a ``TurnDetectionConfig`` and echoes
it, the session reads its flags, the ASR stage executes it; all must agree on the defaults and on what
``eagerness`` means, so all take the same typed value from this module.

``semantic_vad`` decides from sound and words. Silero finds pauses; at ``SCORE_AFTER_MS`` of silence the ASR
stage starts two things on the turn so far, side by side: Smart Turn's audio score and the speculative Whisper
decode (the transcript the answer is prefilled from anyway). The words give a *cue* (``words_cue``):

* ``open``: the transcript ends in a filler, a conjunction, an article/determiner, a preposition or an
  auxiliary ("um", "and", "the", "for", "is"), or in "..." / "," / "-": the sentence cannot end here;
* ``lead_in``: nothing but a greeting or interjection ("Hi there.", "Hello?", "So"): people go on after it;
* ``can_end``: anything else (a sentence that could be finished);
* ``empty``: Whisper heard no words (a cough, a breath): the audio alone decides.

The verdict (``Eagerness.end_silence_ms``) is then a silence to wait:

==========  =============================================  ===========================================
words       audio (Smart Turn)                             the turn ends after
==========  =============================================  ===========================================
not in yet  any                                            ``max_silence_ms`` (no turn ends unheard)
open        any                                            ``max_silence_ms``
lead_in     any                                            ``unsure_silence_ms``
can_end     >= ``sure_threshold``                          ``complete_silence_ms`` (the "sure" end)
can_end     below                                          ``unsure_silence_ms``
empty       >= sure / >= ``complete_threshold`` / below    complete / unsure / max silence
==========  =============================================  ===========================================

=========  ====  ========  ========  =======  ====  ===========================================================
eagerness  sure  complete  audio-    unsure   max   why
           >=    silence   only >=   silence
=========  ====  ========  ========  =======  ====  ===========================================================
``low``    0.9   400 ms    0.7       1500 ms  8 s   GA max 8 s; waits out most thinking pauses
``medium`` 0.85  200 ms    0.5       1000 ms  4 s   GA 4 s; 200 ms: Smart Turn's stop silence; 1 s outlasts the
                                                    set's hesitations (400-900 ms)
``high``   0.7   150 ms    0.3       600 ms   2 s   GA 2 s; ends on a lukewarm "complete"
``auto``   = medium                                 the GA default, "equivalent to medium"
=========  ====  ========  ========  =======  ====  ===========================================================

Why this shape (measured on the labelled set, ``latency_bench/turn_set.py``: 24 complete and 20 hesitant
utterances in 3 Piper voices, 229 pauses; ``python -m latency_bench.turn_scores``):

* Smart Turn alone cannot separate them: complete utterances score 0.01-0.99 at their end (a dozen-word
  request 0.02-0.28, a statement 0.15-0.5), hesitations 0.006-0.98; and the comma pause inside "Hi there, how
  are you" scores 0.94-0.99, so audio alone ended 9 of 72 complete utterances mid-sentence at 200 ms.
* The words alone cannot either: Whisper drops most fillers ("I would like to order, uh," -> "I would like to
  order.") and writes a full stop after a fragment, so "a finished-looking sentence ends the turn at 200 ms"
  cut 14 of 60 hesitations. What words do tell reliably is the *open* end (the last word is "for", "the",
  "and", "does"...): none of the 132 complete endings in the set does, 47 of the 60 hesitations do. And a
  greeting alone ("Hi there.", "Hello?") is a lead-in, not a turn (11 pauses, all mid-utterance).
* So the words hold a turn open or cap how long a finished-looking one can wait (``unsure_silence_ms``, longer
  than the set's hesitations, so a dropped filler costs latency, not a cut), and the audio decides between
  the sure and the unsure end. On the set (auto): 62 of 127 endings at 200 ms, the other 65 at 1000 ms (none
  waits the 4 s max; Smart Turn alone: 54 of 117 at 200 ms, p95 4 s); complete utterances cut at an inner
  pause: 1 of 72 (9 with audio alone); hesitations cut: 4 of 60 (6 alone), all where Whisper invented a closing
  word ("park or" -> "parkour.", "to" -> "to you.") and Smart Turn was sure (>= 0.98). The target was <= 5%.
* The thinker's own end-of-turn probability (SmolLM2-135M, P(<|im_end|> | transcript), the cue LiveKit
  uses with a model trained for it; ``python -m latency_bench.turn_scores --thinker``) was measured and is not
  used: complete endings p5/p50/p95 0.001/0.16/0.87, hesitation pauses 0.000/0.004/0.62; it gives 0.001 to
  "I just got back from a long trip to Spain." and 0.74 to the fragment "Can you tell me that?", and where the
  two cues above leave doubt (a finished-looking transcript, Smart Turn unsure) it overlaps completely.

The audio is scored at ``SCORE_AFTER_MS`` = 120 ms of silence (about four 32 ms Silero frames: shorter gaps are
the stops inside words); with Smart Turn's ~30 ms and Whisper's ~100 ms (idle, 2 cores) the verdict is in by
~230 ms of silence, so the "sure" end comes at max(200 ms, the verdict).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PARAM = "session.audio.input.turn_detection"
EAGERNESS = ("low", "medium", "high", "auto")
SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")
IDLE_TIMEOUT_RANGE = (1000, 600_000)
SCORE_AFTER_MS = 120
SEMANTIC_PREFIX_PADDING_MS = 300
SEMANTIC_THRESHOLD = 0.5  # Silero's speech threshold under semantic_vad (the GA field is server_vad-only)

# ---- the words' cue
FILLERS = frozenset("um umm uh uhm uhh er erm ah hmm mm mhm".split())
OPEN_WORDS = frozenset((
    "and or but so because if that then when while than whether "  # conjunctions
    "a an the my your his her our their its this these those some any every "  # articles, determiners
    "for to of in on at with from about by into between like as "  # prepositions
    "is are was were am be does do did can could would will should shall must").split()) | FILLERS  # auxiliaries
LEAD_IN_WORDS = frozenset("hi hello hey there good morning afternoon evening so well okay ok oh".split())
OPEN_ENDINGS = ("...", "\u2026", ",", "-")
GUESSED_WORD_BELOW = 0.5  # Whisper's probability of the last word under which it is a guess (cue ``guess``)
QUESTION_SURE_FROM = 0.8  # ... from which a "?" ending is a finished question (cue ``question``)
WORDS_CUES = ("open", "lead_in", "guess", "question", "can_end", "empty")
_WORD = re.compile(r"[a-z']+")


def words_cue(text: str, last_word_prob: float | None = None) -> str:
    """What the speculative transcript says about the turn's end (one of ``WORDS_CUES``); ``last_word_prob``:
    Whisper's probability of the last word (None: not known, so neither ``guess`` nor ``question``)."""
    t = text.strip().lower()
    words = _WORD.findall(t)
    if not words:
        return "empty"
    if t.endswith(OPEN_ENDINGS) or words[-1] in OPEN_WORDS:
        return "open"
    if all(w in LEAD_IN_WORDS for w in words):
        return "lead_in"
    if last_word_prob is not None and last_word_prob < GUESSED_WORD_BELOW:
        return "guess"
    if last_word_prob is not None and last_word_prob >= QUESTION_SURE_FROM and t.endswith("?"):
        return "question"
    return "can_end"


@dataclass(frozen=True)
class Eagerness:
    """How sure the turn model must be, and how long to wait when it is and when it is not."""

    sure_threshold: float
    complete_silence_ms: int
    complete_threshold: float  # audio-only "unsure" threshold (no words), and the least a "question" needs to be sure
    unsure_silence_ms: int
    max_silence_ms: int

    def end_silence_ms(self, prob: float | None, cue: str | None) -> int:
        """Silence after which the turn ends, given this pause's audio score and words cue (None: not in yet)."""
        if prob is None or cue is None or cue == "open":
            return self.max_silence_ms
        if cue in ("lead_in", "guess"):
            return self.unsure_silence_ms
        if prob >= self.sure_threshold or cue == "question" and prob >= self.complete_threshold:
            return self.complete_silence_ms
        if cue != "empty" or prob >= self.complete_threshold:
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

