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
  auxiliary ("um", "and", "the", "for", "is"), or in "..." / "," / "-": the sentence cannot end here. Unless
  the clause can end on that auxiliary or preposition (``completes_clause``): an earlier wh-word supplies its
  complement ("tell me what the capital of Italy is", "who is this gift for"), it is a short answer ("Yes, I
  can.") or a verb's particle ("go on"); then the cue is what the rest of the rule makes of any other word;
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
lead_in     any                                            the unsure end (below)
asked_open  any                                            ``unsure_silence_ms``, at least ``ASKED_OPEN_SILENCE_MS``
guess       any                                            the unsure end
question    >= ``complete_threshold`` / below              ``complete_silence_ms`` / as can_end below
can_end     >= ``sure_threshold``                          ``complete_silence_ms`` (the "sure" end)
can_end     below; a second look >= sure / below           ``SECOND_LOOK_MS`` (300 ms; at least the sure
                                                           silence) / the unsure end
empty       >= sure / >= ``complete_threshold`` / below    complete / unsure / max silence
==========  =============================================  ===========================================

The unsure end is ``unsure_silence_ms``, or at least ``DOUBTED_SILENCE_MS`` (1 s, longer than the set's
hesitation pauses) when Smart Turn's latest score (the second look's, if taken) is under ``complete_threshold``:
the words could end there but the sound says the speaker goes on (it only lengthens ``high``'s 600 ms).

=========  ====  ========  ========  =======  ====  ===========================================================
eagerness  sure  complete  audio-    unsure   max   why
           >=    silence   only >=   silence
=========  ====  ========  ========  =======  ====  ===========================================================
``low``    0.9   400 ms    0.7       1000 ms  8 s   GA max 8 s; surest and slowest to call a turn sure; an unsure
                                                    finished-looking turn still ends within ~1.1 s
``medium`` 0.85  300 ms    0.5       1000 ms  4 s   GA 4 s; 300 ms outlasts a comma pause ("tea, | or coffee?":
                                                    up to ~320 ms); 1 s outlasts the set's hesitations (400-900 ms)
``high``   0.7   250 ms    0.3       600 ms   2 s   GA 2 s; ends on a lukewarm "complete", risks some comma pauses
``auto``   = medium                                 the GA default, "equivalent to medium"
=========  ====  ========  ========  =======  ====  ===========================================================

Why this shape (the full record, with the labelled set's numbers: docs/benchmarks/turn-taking.md, "Why the
semantic_vad rule has its shape"; the summary: docs/tuning-cpu.md, "Turn detection"):

* Smart Turn alone cannot tell a finished turn from a hesitation: both score across its whole range, and a
  comma pause inside a sentence can score as sure as an end.
* The words alone cannot either: Whisper drops most fillers and writes a full stop after a fragment. What the
  words tell reliably is the *open* end (a last word that cannot end a sentence), and a greeting alone is a
  lead-in.
* So the words hold a turn open or cap how long a finished-looking one can wait (``unsure_silence_ms``, longer
  than hesitation pauses, so a dropped filler costs latency, not a cut), and the audio decides between the sure
  and the unsure end.
* Whisper's probability of its last word (``guess``) catches the fragments Whisper closed with an invented word.
* A confident "?" (``question``) is a finished question far more often than Smart Turn says, but a fragment can
  come out as a confident question too, so it is sure only when Smart Turn is at least at its audio-only level.
* The second look: Smart Turn is much surer of a finished sentence a little later, while a dropped filler stays
  low; gated on a last word Whisper is sure of, because without the gate room noise made it cut hesitations.
* Not used: the thinker's own end-of-turn probability (it overlaps completely where the cues above leave
  doubt) and re-decoding with Whisper later in the pause (the invented word stays, so it cannot undo a cut).

The audio is scored at ``SCORE_AFTER_MS`` = 120 ms of silence (about four 32 ms Silero frames: shorter gaps are
the stops inside words; counted from the sound's end, ``TurnDetection.silence_from_sound_end``); with Smart Turn's ~30 ms and Whisper's ~100 ms (idle, 2 cores) the verdict is in by
~230 ms of silence, before the sure silence.
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
AUXILIARIES = frozenset("is are was were am be does do did can could would will should shall must".split())
PREPOSITIONS = frozenset("for to of in on at with from about by into like as".split())
# a wh-word earlier in the clause can supply what a final auxiliary or preposition lacks ("tell me what X is",
# "who is this for"); which wh-words can be the object a preposition was stranded by (not "how", "why", "when")
WH_WORDS = frozenset("what where who whom whose which when why how".split())
WH_OBJECTS = {"what": PREPOSITIONS, "who": PREPOSITIONS, "whom": PREPOSITIONS, "which": PREPOSITIONS,
              "where": frozenset(("from", "to"))}
SUBJECT_PRONOUNS = frozenset("i you he she it we they this that".split())
OBJECT_PRONOUNS = frozenset("it them me him her us".split())
PARTICLES = frozenset(("on", "in"))  # prepositions that are also a verb's particle ("go on", "log me in")
LEAD_IN_WORDS = frozenset("hi hello hey there good morning afternoon evening so well okay ok oh".split())
OPEN_ENDINGS = ("...", "\u2026", ",", "-")
GUESSED_WORD_BELOW = 0.5  # Whisper's probability of the last word under which it is a guess (cue ``guess``)
SURE_WORD_FROM = 0.8  # ... from which Whisper is sure of it: a "?" is a question (cue), an unsure verdict gets a second look
# a sure "?" on an auxiliary or a preposition waits at least this: with high's 600 ms it cut 22/60 noisy
# hesitations (the set's pauses last 500-900 ms) against 12/60 before the cue existed
ASKED_OPEN_SILENCE_MS = 1000
# an unsure end whose sound says "not finished" (Smart Turn under ``complete_threshold``) waits at least this: with
# high's 600 ms such endings cut 39/141 hesitations of the set (their pauses last 400-900 ms), with this 1 s N/141
DOUBTED_SILENCE_MS = 1000
WORDS_CUES = ("open", "lead_in", "asked_open", "guess", "question", "can_end", "empty")
_WORD = re.compile(r"[a-z0-9']+")  # numbers are words: Whisper writes "555-1234", "9.15", and a number can end a sentence


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
    if words[-1] in OPEN_WORDS and not completes_clause(t):
        return "asked_open" if asked else "open"
    if all(w in LEAD_IN_WORDS for w in words):
        return "lead_in"
    if last_word_prob is not None and last_word_prob < GUESSED_WORD_BELOW:
        return "guess"
    if asked:
        return "question"
    return "can_end"


def completes_clause(text: str) -> bool:
    """The last word is an auxiliary or a preposition, but the clause can end on it: an earlier wh-word supplies
    its complement, or it is a verb's particle. Why: "what X is", "who this is for" end on such a word and are
    finished, while a hesitation stops on one because the rest is still to come ("the capital of", "I want to").

    The clause is the text after the last sentence mark or comma. Licensed:

    * an auxiliary after an embedded wh-clause: a wh-word that is not the clause's first word (an initial one
      starts a question, "Where is", or a subject clause, "What I want is", both unfinished at the auxiliary),
      not followed by an auxiliary ("tell me what is"), with words of its own before the last ("what time it is",
      "where the station is", "how old I am");
    * a preposition stranded by a wh-word that can be its object (``WH_OBJECTS``: "who ... for", "where ...
      from"), with a subject pronoun between ("who is this gift for", "what are you talking about"): without
      one, "What is the capital of" and "what the capital of" are fragments;
    * a clause of a subject pronoun and an auxiliary alone, the short answer ("Yes, I can.", "No, it is.");
    * "on" / "in" as a particle: after an object pronoun ("log me in", "turn it on") or as the second word of a
      two-word clause ("go on", "come in").
    """
    clause = _WORD.findall(re.split(r"[.!?,;:]\s", text.strip().lower())[-1])
    if not clause:
        return False
    last, before = clause[-1], clause[:-1]
    if last in AUXILIARIES and len(before) == 1 and before[0] in SUBJECT_PRONOUNS:  # a short reply: "Yes, I can."
        return True
    if last in PARTICLES and (len(clause) == 2 or before and before[-1] in OBJECT_PRONOUNS):
        return True
    for i, w in enumerate(before):
        rest = before[i + 1 :]
        if w not in WH_WORDS or not rest:
            continue
        if last in AUXILIARIES and i > 0 and rest[0] not in AUXILIARIES and (len(rest) > 1 or w not in ("how", "which", "whose")):
            return True
        if last in WH_OBJECTS.get(w, ()) and any(x in SUBJECT_PRONOUNS for x in rest):
            return True
    return False


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
            return self._unsure(prob)
        if self._sure(prob, cue):
            return self.complete_silence_ms
        if cue != "empty":  # can_end or question, unsure: the second look may still make it sure
            if self.second_look and second is not None and second >= self.sure_threshold:
                return self.second_look_end_ms
            return self._unsure(prob if second is None else second)
        return self.unsure_silence_ms if prob >= self.complete_threshold else self.max_silence_ms

    def _unsure(self, prob: float) -> int:
        """The unsure end; when Smart Turn's latest score is under ``complete_threshold`` (the sound says the
        speaker goes on), at least ``DOUBTED_SILENCE_MS``: longer than a hesitation's pause."""
        return self.unsure_silence_ms if prob >= self.complete_threshold else max(self.unsure_silence_ms, DOUBTED_SILENCE_MS)

    @property
    def second_look_end_ms(self) -> int:
        """A sure second look ends the turn at ``SECOND_LOOK_MS``, never before the sure silence."""
        return max(SECOND_LOOK_MS, self.complete_silence_ms)

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
    "low": Eagerness(0.9, 400, 0.7, 1000, 8000),
    "medium": Eagerness(0.85, 300, 0.5, 1000, 4000),
    "high": Eagerness(0.7, 300, 0.3, 600, 2000),
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
    of them was chosen on silences counted from Silero's frames, and counting them from the sound instead made
    inner comma pauses outlast the sure silence and cut sentences mid-way. Its score point (``SCORE_AFTER_MS``:
    Smart Turn and the speculative decode) does count from the sound's end, so the transcript the held answer
    starts from comes sooner (numbers: docs/benchmarks/turn-taking.md, "Why the semantic_vad rule has its shape").
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

