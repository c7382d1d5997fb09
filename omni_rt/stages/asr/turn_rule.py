"""The ASR stage's turn rule: what ``turn_detection`` means once it runs. ``TurnDetection`` (the stage's view of
the parsed config: VAD numbers, and under ``semantic_vad`` the eagerness' rule), ``Eagerness`` (how sure and how
long to wait), the words' cue (``words_cue``) and every number they use.

The wire config (field names, defaults, validation, the echo) is ``omni_rt.contracts.turn_detection``: every layer
shares it. Only this stage runs the rule, so it lives here; ``omni_rt.testing.turn_scores`` replays it on recorded
pauses.

``semantic_vad`` decides from sound and words. Silero finds pauses; at ``SCORE_AFTER_MS`` of silence the ASR
stage starts two things on the turn so far, side by side (one after the other for a session alone on the server,
the words first: ``omni_rt.stages.asr.stage.AsrWorker._words_first``): Smart Turn's audio score and the speculative Whisper
decode (the transcript the answer is prefilled from anyway), which also reports Whisper's probability of the
transcript's last word. The words give a *cue* (``words_cue``):

* ``open``: the transcript ends in a filler, a conjunction, an article/determiner, a preposition or an
  auxiliary ("um", "and", "the", "for", "is"), or in "..." / "," / "-": the sentence cannot end here;
* ``lead_in``: nothing but a greeting or interjection ("Hi there.", "Hello?", "So"): people go on after it;
* ``asked_open``: it ends in "?" on an auxiliary or a preposition and Whisper is sure of that word ("what time
  it is?", "where are you from?"): often a finished question, but Whisper also puts "?" on a fragment ("the
  time in?", "the capital of?"), so it waits the unsure silence (at least 1 s, longer than the hesitation
  pauses of the labelled set) rather than the maximum, with no second look;
* ``guess``: it could end, but Whisper's last word has p < ``GUESSED_WORD_BELOW`` (0.5): at a pause after a
  clause that cannot end, Whisper often invents a closing word ("park or" -> "parkour.", "to" -> "to you.");
* ``question``: it ends in "?" and Whisper is sure of the last word (p >= ``SURE_WORD_FROM``, 0.8);
* ``can_end``: anything else (a sentence that could be finished);
* ``empty``: Whisper heard no words (a cough, a breath): the audio alone decides.

The verdict (``Eagerness.end_silence_ms``) is then a silence to wait:

==========  =============================================  ===========================================
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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omni_rt.contracts.turn_detection import EAGERNESS, TurnDetectionConfig

SCORE_AFTER_MS = 120
SECOND_LOOK_MS = 300  # an unsure verdict on words that can end is scored again at this silence (``Eagerness.second_look``)
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
SURE_WORD_FROM = 0.8  # ... from which Whisper is sure of it: a "?" is a question (cue), an unsure verdict gets a second look
# a sure "?" on an auxiliary or a preposition waits at least this: with high's 600 ms it cut 22/60 noisy
# hesitations (the set's pauses last 500-900 ms) against 12/60 before the cue existed
ASKED_OPEN_SILENCE_MS = 1000
WORDS_CUES = ("open", "lead_in", "asked_open", "guess", "question", "can_end", "empty")
_WORD = re.compile(r"[a-z']+")


def words_cue(text: str, last_word_prob: float | None = None) -> str:
    """What the speculative transcript says about the turn's end (one of ``WORDS_CUES``); ``last_word_prob``:
    Whisper's probability of the last word (None: not known, so neither ``guess`` nor ``question``)."""
    t = text.strip().lower()
    words = _WORD.findall(t)
    if not words:
        return "empty"
    asked = last_word_prob is not None and last_word_prob >= SURE_WORD_FROM and t.endswith("?")
    if t.endswith(OPEN_ENDINGS) or words[-1] in FILLERS:
        return "open"
    if words[-1] in OPEN_WORDS:
        return "asked_open" if asked else "open"
    if all(w in LEAD_IN_WORDS for w in words):
        return "lead_in"
    if last_word_prob is not None and last_word_prob < GUESSED_WORD_BELOW:
        return "guess"
    if asked:
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
    second_look: bool = True  # re-score an unsure pause whose words can end at SECOND_LOOK_MS; sure then: end there

    def end_silence_ms(self, prob: float | None, cue: str | None, second: float | None = None) -> int:
        """Silence after which the turn ends, given this pause's audio score and words cue (None: not in yet) and
        the second look's audio score (None: not taken or not in yet)."""
        if prob is None or cue is None or cue == "open":
            return self.max_silence_ms
        if cue == "asked_open":
            return max(self.unsure_silence_ms, ASKED_OPEN_SILENCE_MS)
        if cue in ("lead_in", "guess"):
            return self.unsure_silence_ms
        if self._sure(prob, cue):
            return self.complete_silence_ms
        if cue != "empty":  # can_end or question, unsure: the second look may still make it sure
            return SECOND_LOOK_MS if self.second_look and second is not None and second >= self.sure_threshold else self.unsure_silence_ms
        return self.unsure_silence_ms if prob >= self.complete_threshold else self.max_silence_ms

    def ends_whatever_the_sound(self, cue: str | None) -> bool:
        """The words alone already say the turn ends before ``max_silence_ms``, whatever Smart Turn scores (it only
        picks the silence): every cue but ``open`` (holds the turn) and ``empty`` (the audio alone decides)."""
        return cue is not None and cue not in ("open", "empty")

    def _sure(self, prob: float, cue: str) -> bool:
        return prob >= self.sure_threshold or cue == "question" and prob >= self.complete_threshold

    def wants_second_look(self, prob: float | None, cue: str | None, last_word_prob: float | None) -> bool:
        """The first verdict is unsure although the words can end and Whisper is sure of the last word (>=
        ``SURE_WORD_FROM``): Smart Turn scores it again at SECOND_LOOK_MS. (A ``second`` score passed to
        ``end_silence_ms`` is one taken because this said so.)"""
        return (self.second_look and prob is not None and cue in ("can_end", "question") and not self._sure(prob, cue)
                and last_word_prob is not None and last_word_prob >= SURE_WORD_FROM)


EAGERNESS_SETTINGS: dict[str, Eagerness] = {
    "low": Eagerness(0.9, 400, 0.7, 1500, 8000, second_look=False),
    "medium": Eagerness(0.85, 200, 0.5, 1000, 4000),
    "high": Eagerness(0.7, 150, 0.3, 600, 2000),
}
EAGERNESS_SETTINGS["auto"] = EAGERNESS_SETTINGS["medium"]
assert set(EAGERNESS_SETTINGS) == set(EAGERNESS), "a rule for every eagerness the wire config accepts"


@dataclass(frozen=True)
class TurnDetection:
    """The ASR stage's view: VAD numbers, plus the turn model's rule under ``semantic_vad``.

    ``enabled=False`` means the client commits turns itself. Under ``semantic_vad`` the VAD's
    ``silence_duration_ms`` is the eagerness' max silence, so a turn the model calls incomplete still ends.
    ``silence_from_sound_end``: a pause counts from where the sound ended, not from Silero's last speech frame
    (``omni_rt.backends.vad.ENERGY_END_RATIO``). Off under ``semantic_vad`` for the verdict's silences: every one
    of them was measured from Silero's frames, and counting them from the sound instead made the labelled set's
    inner comma pauses outlast the 200 ms sure silence (auto: complete utterances cut mid-way 4/72 instead of
    1/72, hesitations 2/60 instead of 1/60; ``omni_rt.testing.turn_scores``, 2026-12-03). Its score point
    (``SCORE_AFTER_MS``: Smart Turn and the speculative decode) does count from the sound's end, ~90 ms sooner,
    so the transcript the held answer starts from comes that much sooner (live semantic V2V p50 908 -> 756 ms,
    README "Turn taking"). Auto, before -> after (``omni_rt.testing.turn_scores``; ``--score-from-silero`` gives
    before): hesitations cut 1/60 -> 0/60 (held out 2/24 -> 1/24, room noise 3/60 -> 2/60), complete cut mid-way
    1/72 -> 1/72, endings at the sure silence 72/130 + 17 at the second look -> 68/131 + 20.
    """

    enabled: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    semantic: Eagerness | None = None
    idle_timeout_ms: int | None = None
    silence_from_sound_end: bool = True

    @classmethod
    def from_config(cls, cfg: TurnDetectionConfig | None) -> "TurnDetection":
        if cfg is None:
            return cls(enabled=False)
        if cfg.semantic:
            eager = EAGERNESS_SETTINGS[cfg.eagerness]
            return cls(threshold=SEMANTIC_THRESHOLD, prefix_padding_ms=SEMANTIC_PREFIX_PADDING_MS,
                       silence_duration_ms=eager.max_silence_ms, semantic=eager, silence_from_sound_end=False)
        return cls(threshold=float(cfg.threshold), prefix_padding_ms=cfg.prefix_padding_ms,
                   silence_duration_ms=cfg.silence_duration_ms, idle_timeout_ms=cfg.idle_timeout_ms)

