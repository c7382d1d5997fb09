"""Barge-in while an answer is heard: is overlapping speech a backchannel or a real interruption?

Where barge-in is decided: the ASR stage's VAD finds a speech start and the stage emits ``SpeechStarted``; the
session cancels the answer on it (``omni_rt.session.turn_taking``). While an answer is being heard
(``AnswerPlayback``: from its first audio until its audio has played, on the input stream's clock) that start is
held instead as a *candidate* (``Candidate``): the stage emits ``InterruptionCandidate`` (a transport that paces
playback pauses it; no client event), keeps the speech's audio and transcribes it with the session's own Whisper
(the stage's decode queue) once ``FIRST_LOOK_MS`` of it is in, and again at a pause. ``decide`` then says:

* ``interruption``: a word outside the listener's words and phrases (``BACKCHANNEL_WORDS``,
  ``BACKCHANNEL_PHRASES``: "wait", "stop", "no", "Enough." without "fair"), or speech longer than
  ``MAX_BACKCHANNEL_MS``. The stage emits the held ``SpeechStarted`` with its original onset and the turn goes
  on exactly as a barge-in always did (cancel, truncate to what was heard, the new turn answered).
* ``backchannel``: the sound paused after at most ``MAX_BACKCHANNEL_MS`` and every word heard is a listener word
  or part of a listener phrase ("mm-hm", "uh-huh", "yeah", "okay", "right", "I see", "makes sense", ...) or there
  are none (a cough, a laugh, a breath: Whisper writes no words, or a bracketed sound tag). The stage drops the
  speech (no turn, no event to the client) and emits ``BackchannelDropped``: a paused playback resumes.
* ``undecided``: only lexicon words so far and the speech goes on: wait for a pause or more words.

Why words from the ASR the preset already runs rather than an audio classifier: the difference between "yeah"
and "wait" is lexical, not acoustic (both are short, voiced, at the same loudness), and the session's Whisper
already hears every turn, so the decision costs one or two extra decodes of under a second of audio (~100-200 ms
each on the CPU preset's tiny.en) and no new model, weights or dependency; a classifier would need a labelled
corpus of real listener responses we do not have, and would still have to tell "no" from "mm". Its known
weakness is the closed-mouth hum ("mm-hm"): Whisper tiny.en often writes it as a word ("MMM" is in the lexicon,
"amendment" is not), so a hummed backchannel is sometimes taken for an interruption: the safe side, since a missed
interruption costs more than an interruption too many. Numbers: docs/benchmarks/turn-taking.md.

A look that heard a word outside the lexicon is also weighed against what a listener says (``listener_readings``:
the listener words it heard first, then "Yeah.", "Sure.", "True.", "Uh-huh." ...): the decode worker scores the
likeliest few of them on the same encoder output (``transcribe_brief``'s ``readings``), and a reading at most
``READING_MARGIN`` less likely than the text is what the look heard (``heard``). Why: tiny.en writes a short word
or a cough wrongly and with confidence ("Church" for "Sure", "Bye." for a cough), but the listener's word is
often close behind it by Whisper's own scores, while "Wait" or "Excuse me" are far from every listener reading;
asking Whisper costs ~25 ms of decoder passes and no new model.

Each look is a brief decode (``transcribe_brief``: at most 16 tokens, so a Whisper loop on a cut-off word stops
early) of the candidate's audio so far, queued on the stage's decode worker like any other decode.

An interruption is recognised at the first look that hears a word outside the lexicon with a word after it
("Can you", "go back"): ``FIRST_LOOK_MS`` of speech (from Silero's onset) plus one decode. A word outside the
lexicon that is the look's last ("Wait", or "Church" for a cut "Sure, sure"), or that only hums come before ("M in
that." for "Mmm."), is believed once two looks in a row heard it (``CONFIRM_LOOKS``, ``confirmed``): tiny.en
reads a short word cut at a look's end wrongly far more often than twice the same way, and such one-look
misreadings were most of the backchannels that barged in. Looks come
every ``NEXT_LOOK_MS`` of further speech; a backchannel is decided at its pause (``PAUSE_MS`` after its sound
ends) plus one decode. Each candidate decodes at most ``MAX_DECODES`` times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["AnswerPlayback", "BACKCHANNEL_PHRASES", "BACKCHANNEL_WORDS", "CONFIRM_LOOKS", "Candidate", "FIRST_LOOK_MS",
           "LISTENER_READINGS", "MAX_BACKCHANNEL_MS", "MAX_DECODES", "NEXT_LOOK_MS", "PAUSE_MS", "READING_MARGIN",
           "Verdict", "decide", "heard", "is_backchannel_word", "listener_readings", "words_of"]

# what a listener says without taking the turn, as Whisper writes it (hyphenated forms are split, so "uh-huh" is
# "uh" + "huh"), drawn from two lists nobody here tuned: the most frequent backchannel, acknowledgement and
# appreciation forms of the Switchboard dialogue-act corpus (SWBD-DAMSL) and the starter list of LiveKit Agents'
# phrase filter (taken from production telephony agents). Single words are listener words anywhere in a run
# ("yeah, okay, sure"); "no" is not one: "no, I meant..." is the commonest correction
BACKCHANNEL_WORDS = frozenset({
    "mm", "mmm", "mhm", "mmhm", "mmhmm", "hm", "hmm", "m", "uh", "huh", "uhhuh", "um", "ah", "oh", "ooh", "aha",
    "yeah", "yes", "yep", "yup", "ya", "ok", "okay", "alright", "right", "sure", "gotcha", "thanks", "i",
    "cool", "nice", "wow", "great", "good", "perfect", "exactly", "indeed", "true", "totally", "really",
    "absolutely", "definitely", "interesting",
})
# ("i": tiny.en writes a cut "uh" as "I"; "I, uh, have a question" has other words) ... and phrases whose words are
# a listener's only together: "Enough." and "Course." alone are not ("fair enough", "of course"). Not "that's
# right" / "that's true": tiny.en reads "That's wrong." as "That's right." at a look
BACKCHANNEL_PHRASES = frozenset({
    ("i", "see"), ("i", "know"), ("i", "agree"), ("got", "it"), ("of", "course"), ("all", "right"),
    ("makes", "sense"), ("sounds", "good"), ("thank", "you"), ("fair", "enough"),
})
_LONGEST_PHRASE = max(len(p) for p in BACKCHANNEL_PHRASES)
_UNITS = tuple((w,) for w in BACKCHANNEL_WORDS) + tuple(BACKCHANNEL_PHRASES)  # every listener unit, as word tuples
_PHRASE_OPENERS = frozenset(p[0] for p in BACKCHANNEL_PHRASES)
# the longest speech a backchannel is ("oh okay", "yeah, right" spoken slowly last ~1.1 s); longer is a turn
MAX_BACKCHANNEL_MS = 1200
# speech heard before the first decode: the start of "wait" / "stop" / "no" is in by then, and the look that
# confirms it comes ``NEXT_LOOK_MS`` later (300 before looks were confirmed: docs/benchmarks/turn-taking.md)
FIRST_LOOK_MS = 200
# while undecided and the speech goes on, the next decode once this much more has been heard since the last one
# began: with a look taking ~100 ms, 100 starts the next one about when the last returns (150 waited ~50 ms more
# for every interruption whose first look heard nothing yet, "Actually, ..."; 50 looked more often and heard a
# hum as a word: docs/benchmarks/turn-taking.md)
NEXT_LOOK_MS = 100
# a pause this long after a short run of lexicon words ends the backchannel (the turn's own end is far later)
PAUSE_MS = 160
# the most decodes one candidate takes: the first look, later looks while it goes on, one at its pause
MAX_DECODES = 5
# a lone word outside the lexicon at a look's end decides only once two looks in a row heard it (``confirmed``)
CONFIRM_LOOKS = True
# ... and so does one that only hums come before ("M in that.", "Em in.": tiny.en goes on from a cut hum into
# invented words); with ``CONFIRM_LOOKS``
DOUBT_AFTER_HUMS = True
# at most this many (distinct-in-a-row) words: "yeah yeah I see okay" is still a backchannel, more is a turn
MAX_BACKCHANNEL_WORDS = 4

# what a listener says, as whole responses Whisper could have written: a look that heard a word outside the lexicon
# is weighed against these (after the lexicon words it heard before that word) by Whisper's own scores
LISTENER_READINGS = ("Yeah", "Yes", "Yep", "Okay", "Right", "Sure", "I see", "Uh-huh", "Mm-hmm", "Hmm", "Mmm", "Oh",
                     "Ah", "Oh, okay", "Got it", "Wow", "Nice", "Exactly", "True", "I know", "Of course", "Cool",
                     "Alright", "Great", "Totally", "Um", "Uh", "Gotcha", "Thanks", "Thank you", "Makes sense",
                     "Sounds good", "Fair enough", "Really", "Absolutely", "Interesting")
# a listener reading at most this much less likely than the text heard (natural log: ~7x) is believed instead
READING_MARGIN = 2.0

# the closed-mouth sounds, which tiny.en misreads as words: "mmm", "hmm", "mm", "n", "em"
_HUMS = re.compile(r"[mhn]+|e+m+")
# hums, fillers and laughter however many letters Whisper gives them: "mmmm", "hmmm", "mhm", "uhh", "ahh", "haha"
_SOUNDS = re.compile(_HUMS.pattern + r"|u+h+|u+m+|a+h+|o+h+|e+h+|(ha)+h?|(he)+h?")
_TAGS = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's sound tags: [coughs], (laughing), *sigh*
_WORD = re.compile(r"[a-z']+")

Verdict = Literal["interruption", "backchannel", "undecided"]


def words_of(text: str) -> list[str]:
    """Whisper's text as lower-case words, sound tags dropped, hyphenated words split, and repeats in a row merged:
    a word's (tiny.en writes a hum as "M. M. M. ...") and a phrase's of up to three words (a decode looping on a
    short response: "Fair enough. Fair enough. Fair enough.")."""
    out: list[str] = []
    for w in _WORD.findall(_TAGS.sub(" ", text).lower().replace("-", " ")):
        w = w.strip("'")
        if not w or (out and out[-1] == w):
            continue
        out.append(w)
        for n in (2, 3):
            if len(out) >= 2 * n and out[-n:] == out[-2 * n:-n]:
                del out[-n:]
                break
    return out


def is_backchannel_word(word: str) -> bool:
    """A word of ``words_of`` that a listener says without taking the turn, alone or in a run of them."""
    return word in BACKCHANNEL_WORDS or _SOUNDS.fullmatch(word) is not None


def _phrase_at(words: list[str], i: int) -> int:
    """How many words from ``i`` on make one listener unit (a listener word, or the longest listener phrase that
    starts there); 0 when none does."""
    for n in range(min(_LONGEST_PHRASE, len(words) - i), 1, -1):
        if tuple(words[i:i + n]) in BACKCHANNEL_PHRASES:
            return n
    return 1 if is_backchannel_word(words[i]) else 0


def _begins_unit(rest: list[str]) -> bool:
    """``rest`` (the text's last words, the very last perhaps cut mid-way by the decode) is the start of a listener
    unit still being said: "Exact" of "Exactly", "Fair en" or "Fair" of "Fair enough"."""
    k = len(rest) - 1
    return any(len(u) > k and tuple(rest[:k]) == u[:k] and u[k].startswith(rest[k]) and tuple(rest) != u for u in _UNITS)


def _first_other(words: list[str], going_on: bool = False) -> int | None:
    """The index of the first word outside every listener unit, reading left to right. ``going_on`` (the speech
    has not paused): the decode cut the last word, so it says nothing after a listener unit ("Oh, oak" of "Oh,
    okay"), and a unit being said at the end is not yet outside ("Exact", "Fair en"); a started phrase the cut
    word does not go on ("Fair in") is."""
    i = 0
    while i < len(words):
        n = _phrase_at(words, i)
        if n:
            i += n
            continue
        rest = words[i:]
        if going_on and ((len(rest) == 1 and i > 0) or _begins_unit(rest)):
            return None
        return i
    return None


def _deciding(words: list[str], other: int) -> int:
    """Where the word that makes the text an interruption is: the word outside the units at ``other``, or, when
    that word only opens a phrase the text did not go on with ("Fair in"), the word after it."""
    return other + 1 if words[other] in _PHRASE_OPENERS and other + 1 < len(words) else other


def _in_doubt(words: list[str], other: int | None) -> bool:
    """The word that makes the text an interruption (``_deciding``) is one a single look may have misread: nothing
    after it says it was heard right (the look's last word), or nothing but hums comes before it
    (``DOUBT_AFTER_HUMS``)."""
    if other is None:
        return False
    if _deciding(words, other) == len(words) - 1:
        return True
    return DOUBT_AFTER_HUMS and other > 0 and all(_HUMS.fullmatch(w) for w in words[:other])


def listener_readings(text: str) -> list[str]:
    """Listener responses the look's ``text`` may have been, for ``transcribe_brief`` to weigh: the words before
    its first word outside the lexicon, then each of ``LISTENER_READINGS`` ("Oh, write" -> "Oh, right.", "Oh,
    okay.", ...), and each alone ("I have" may be "Uh-huh."). None when every word is a listener word (nothing
    to weigh) or the text is long (a turn)."""
    words = words_of(text)
    other = _first_other(words)
    if other is None or len(words) > 2 * MAX_BACKCHANNEL_WORDS:
        return []
    # the text up to the word at ``other``, as Whisper wrote it (its spelling and punctuation)
    head, n = "", 0
    for m in re.finditer(r"\S+", text):
        if n == other:
            break
        head = text[: m.end()]
        n = len(words_of(head))
    alone = [r + "." for r in LISTENER_READINGS]
    head = head.strip()
    if not head:
        return alone
    sep = " " if head[-1] in ".!?," else ", "
    lower = head[-1] not in ".!?"
    after = [head + sep + (r[0].lower() + r[1:] if lower and not r.startswith("I ") else r) + "."
             for r in LISTENER_READINGS]
    return after + alone


def confirmed(words: list[str], earlier: list[str]) -> bool:
    """The earlier look heard the same word that makes the text an interruption (``_deciding``) at the same place
    (or its start: the earlier decode cut it): two looks of the same speech agree on it."""
    other = _first_other(words)
    if other is None:
        return False
    i = _deciding(words, other)
    if i >= len(earlier):
        return False
    return earlier[i] == words[i] or (len(earlier[i]) >= 2 and words[i].startswith(earlier[i]))


def heard(text: str, reading: tuple[str, float] | None, margin: float | None = None) -> str:
    """What a look heard, for ``decide``: the listener reading ``transcribe_brief`` weighed against its ``text``
    when Whisper finds it at most ``margin`` (``READING_MARGIN``) less likely, else the text."""
    limit = READING_MARGIN if margin is None else margin
    return reading[0] if reading is not None and reading[1] <= limit else text


def decide(text: str | None, speech_ms: float, paused: bool, earlier: str | None = None,
           confirm: bool = False) -> Verdict:
    """The verdict on a candidate from Whisper's ``text`` of its audio so far (None: no decode back yet), how
    long its sound has lasted, and whether it has paused for ``PAUSE_MS`` with all of it decoded.

    While the speech goes on, the last word of the text is a word cut off by the decode, and Whisper often invents
    one there ("Oh, okay" cut after 300 ms is heard "Oh, oak"): after a backchannel word, or alone when it begins
    one ("Exact" of "Exactly"), it decides nothing until more is heard. Any other word decides: at once with a
    word after it ("can you"), and with ``confirm`` as the look's last word or after nothing but hums ("M in
    that.") only when ``earlier`` (the look before) heard it too."""
    if speech_ms > MAX_BACKCHANNEL_MS:
        return "interruption"
    if text is None:
        return "undecided"
    words = words_of(text)
    if len(words) > MAX_BACKCHANNEL_WORDS:
        return "interruption"
    other = _first_other(words, going_on=not paused)
    if other is None:
        return "backchannel" if paused else "undecided"
    if confirm and not paused and _in_doubt(words, other) and not confirmed(words, words_of(earlier or "")):
        return "undecided"
    return "interruption"


@dataclass
class AnswerPlayback:
    """When the session's answer is being heard, on the input stream's clock (samples): from ``start`` (the op
    saying its first audio went out arrived) until ``end`` (its start plus its audio's length once it is done,
    or the moment it was cancelled); ``None`` while the answer still streams."""

    start: int | None = None
    end: int | None = None

    def started(self, now: int) -> None:
        self.start, self.end = now, None

    def done(self, now: int, audio_samples: int, played: bool) -> None:
        """The answer ended: ``played`` (completed) it is heard until all its audio has played; cut short
        (cancelled, failed) the listener stops hearing it now."""
        if self.start is None:
            return
        self.end = max(now, self.start + audio_samples) if played else now

    def audible(self, now: int) -> bool:
        return self.start is not None and (self.end is None or now < self.end)


@dataclass
class Candidate:
    """Speech that began while an answer was heard, not yet decided. Stream clock in samples."""

    onset: int  # Silero's raw onset (no prefix padding)
    audio_start_ms: int  # the held SpeechStarted's audio_start_ms (onset minus prefix padding)
    text: str | None = None  # Whisper's words for the audio up to ``decoded_to``
    decoded_to: int = 0  # the stream sample the last decode's audio ended at
    decodes: int = 0
    pending: bool = False  # a decode is in flight
    epoch: int = 0  # the stage's epoch when it began: a decode of another candidate is ignored
    stopped_ms: int | None = None  # the VAD ended the speech (audio_end_ms) before the verdict
    sound_end: int = 0  # where its sound ended, once the VAD ended it
    history: list[str] = field(default_factory=list)  # every look's text as decided on (``heard``)
    raw: list[str] = field(default_factory=list)  # ... and as Whisper wrote it, for the log

    def speech_ms(self, now: int, rate: int) -> float:
        return (now - self.onset) * 1000 / rate
