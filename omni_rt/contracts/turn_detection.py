"""The ``turn_detection`` wire config (``session.audio.input.turn_detection``, GA ``server_vad`` / ``semantic_vad``):
its fields, defaults and validation, and what ``session.created`` / ``session.updated`` echo.

Why here, in the shared vocabulary: the protocol layer parses it once into a ``TurnDetectionConfig`` and echoes
words       audio (Smart Turn)                             the turn ends after
==========  =============================================  ===========================================
not in yet  any                                            ``max_silence_ms`` (no turn ends unheard)
open        any                                            ``max_silence_ms``
lead_in     any                                            ``unsure_silence_ms``
asked_open  any                                            ``unsure_silence_ms``, at least ``ASKED_OPEN_SILENCE_MS``
guess       any                                            ``unsure_silence_ms``
question    >= ``complete_threshold`` / below              ``complete_silence_ms`` / as can_end below
can_end     >= ``sure_threshold``                          ``complete_silence_ms`` (the "sure" end)
can_end     below; a second look >= sure / below           ``SECOND_LOOK_MS`` (300 ms) / ``unsure_silence_ms``
empty       >= sure / >= ``complete_threshold`` / below    complete / unsure / max silence
==========  =============================================  ===========================================

=========  ====  ========  ========  =======  ====  ===========================================================
eagerness  sure  complete  audio-    unsure   max   why
           >=    silence   only >=   silence
=========  ====  ========  ========  =======  ====  ===========================================================
``low``    0.9   400 ms    0.7       1500 ms  8 s   GA max 8 s; waits out most thinking pauses (no second look)
``medium`` 0.85  200 ms    0.5       1000 ms  4 s   GA 4 s; 200 ms: Smart Turn's stop silence; 1 s outlasts the
                                                    set's hesitations (400-900 ms)
``high``   0.7   150 ms    0.3       600 ms   2 s   GA 2 s; ends on a lukewarm "complete"
``auto``   = medium                                 the GA default, "equivalent to medium"
=========  ====  ========  ========  =======  ====  ===========================================================

Why this shape (measured on the labelled set, ``omni_rt/testing/turn_set.py``: 24 complete and 20 hesitant
utterances in 3 Piper voices, 229 pauses; ``python -m latency_bench turns --stage-level``, 2026-12-02):

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
  the sure and the unsure end. With the text alone (no last-word probability), auto: 62 of 127 endings at
  200 ms (complete utterances 50 of 71), the rest at 1000 ms (none waits the 4 s max; Smart Turn alone: 54 of
  117, p95 4 s); complete utterances cut at an inner pause 1 of 72 (9 alone); hesitations cut 4 of 60 (6
  alone), all where Whisper invented a closing word ("parkour.", "for it.", "to you.") and Smart Turn was sure.
* Whisper's probability of its last word (``guess``) catches those: on the 132 complete endings it is p5 0.56,
  p10 0.74, median 0.98 (3 below 0.5, all already unsure by the audio); on the 13 hesitation pauses the text
  could end at it is median 0.45, and 3 of the 4 cuts were 0.19, 0.26 and 0.498 ("for it." was 0.65: still
  cut). The 0.498 is a thin margin: another machine's rounding could give that one back (2 of 60).
* A confident "?" (``question``) is a finished question far more often than Smart Turn says: the long request
  "Could you please tell me ... on a normal day?" scores 0.15-0.28 and "Why is the sky blue?" 0.47-0.58. But a
  fragment can be a confident question too: on the held-out items "Can you, uh," -> "Can you?" (p 0.96) and
  "Where did I, um," -> "Where did I?" (0.97), which Smart Turn scored 0.01-0.13. So the question is sure only
  when Smart Turn is at least at its audio-only level (``complete_threshold``); without that floor the set
  gave 59 of 71 complete utterances at 200 ms but the held-out items 2 more cuts. (That floor was chosen after
  seeing the held-out items, so for it they are no longer held out.)
* Together (without the second look, below), auto, on the set: hesitations cut 1 of 60 (was 4), complete
  utterances cut mid-way 1 of 72 (was 1), complete utterances ended at 200 ms 54 of 71 (was 50), all endings 73
  of 130 (was 62 of 127), end silence p50 200 ms / p95 1000 ms (was 1000 / 1000). low: 1/60 (was 4), 0/72, 50 of 72 at 400 ms (was 47). high:
  7/60 (was 9), 1/72, 58 of 71 at 150 ms (was 54). On the held-out items (``turn_set.HELD_OUT``: 8 complete,
  8 hesitant, written after the last-word rule was chosen; ``turn_scores --held-out``), auto: hesitations cut
  2 of 24 (text alone 3, Smart Turn alone 9), complete cut mid-way 1 of 24 (1), complete utterances ended at
  200 ms 15 of 23 (14); high: 8 of 24 (7: "Where did I?" at a 160 ms comma pause, sure at 150 ms).
* The thinker's own end-of-turn probability (SmolLM2-135M, P(<|im_end|> | transcript), the cue LiveKit
  uses with a model trained for it; ``python -m latency_bench turns --stage-level --thinker-cue``) was measured and is not
  used: complete endings p5/p50/p95 0.001/0.16/0.87, hesitation pauses 0.000/0.004/0.62; it gives 0.001 to
  "I just got back from a long trip to Spain." and 0.74 to the fragment "Can you tell me that?", and where the
  two cues above leave doubt (a finished-looking transcript, Smart Turn unsure) it overlaps completely.
* The second look (``Eagerness.second_look``, not with ``low``): an unsure verdict on words that can end, whose
  last word Whisper is sure of (p >= ``SURE_WORD_FROM``), is scored by Smart Turn again at ``SECOND_LOOK_MS`` =
  300 ms of silence, and ends the turn then if sure. Smart Turn is much surer of a finished sentence a little
  later (the London request, plain voice: 0.15 at 120 ms, 0.99 at 500 ms), while a dropped filler stays low
  ("I would like to order.", 0.01 at 300 ms). On the set, auto: 5 more complete utterances end at 300 ms (54 +
  5 of 71 by 300 ms), no more cut; high +6; held-out auto +6 (15 + 6 of 23), no more cut. At 200 ms it gained
  0 (auto), at 500 ms 12 but later and closer to the hesitations' 400-900 ms. Without the sure-word gate it
  gained 2 more held-out endings, but under room noise (below) it cut 3 more hesitations of 60: Whisper hears
  "is in the" as "is in there." and "for" as "for it." with p 0.56-0.73, and Smart Turn at 300 ms was sure
  (0.91-0.97). (The held-out and room-noise numbers were seen before the look and its gate were adopted: for
  those two choices they are not held out.) Re-decoding with Whisper at 300 or 500 ms was measured too and is
  not used: it gave the same transcript at every hesitation cut (the invented word stays), so it cannot undo
  one. The cost: one more Smart Turn score (~30 ms) on such a pause once it lasts 300 ms.
* Light room noise (``turn_scores --room-noise``: seeded white noise at RMS 0.003, ~30 dB under the speech,
  silences included), auto: hesitations cut 3 of 60 (sound + text: 7, Smart Turn alone: 15; the noise makes
  Smart Turn surer of everything), complete cut mid-way 1 of 72, complete utterances ended at 200 ms 59 of 71
  + 2 at 300 ms (text: 58); held-out with noise: 1 of 24 cut (text: 4), 21 of 23 at 200 ms (21).

The audio is scored at ``SCORE_AFTER_MS`` = 120 ms of silence (about four 32 ms Silero frames: shorter gaps are
the stops inside words; counted from the sound's end, ``TurnDetection.silence_from_sound_end``); with Smart Turn's ~30 ms and Whisper's ~100 ms (idle, 2 cores) the verdict is in by
~230 ms of silence, so the "sure" end comes at max(200 ms, the verdict).
=======
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
