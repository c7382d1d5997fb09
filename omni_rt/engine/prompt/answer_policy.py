"""The voice answer policy: fed an answer's streamed text, it says what may leave the thinker and when to stop.

Why in the thinker (not the talker): the text that leaves the thinker is what the client shows as the spoken
transcript and what the talker speaks, so the cut must happen before either sees it, and stopping there
frees the decode slot (or cancels the upstream request) at once.

Rules, engine-agnostic (the built-in AR scheduler and the async-stream/remote path both use it):
* stop at a sentence boundary once ``max_sentences`` sentences are out, or before a sentence that would take
  the answer past ``max_words`` words;
* an answer cut by any limit (these, or ``max_tokens``) ends at a sentence boundary, never mid-word: the
  first sentence streams word by word (the talker must start early), later sentences are held until they are
  complete (each is generated while the previous one plays) and an unfinished one is dropped on a cut. A
  first sentence that overruns ``max_words`` or ``max_tokens`` is ended after its last whole word with a
  period (after the space already released, e.g. "... are ."; the voice does not hear the space), so even a
  run-on answer is spoken as a finished sentence;
* everything released is final: the spoken transcript is exactly the concatenation of the released deltas.

A sentence ends at ``.``/``!``/``?``/``…`` (plus closing quotes/brackets) followed by whitespace, or at a
line break; common abbreviations ("Dr.", "e.g."), initials ("J.") and list numbers ("1.") do not end one.
Hand-written rather than a sentence segmenter library (pysbd, nltk punkt): those work on finished text, and
here the decision must be made incrementally, one token at a time, with a holdback of at most one word.
"""

from __future__ import annotations

from omni_rt.engine.prompt.request import AnswerPolicyParams

_TERMINATORS = ".!?\u2026"
_CLOSERS = "\"')]\u201d\u2019\u00bb"
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs e.g i.e approx no fig mt ft inc ltd co".split()
)


def count_words(text: str) -> int:
    """Whitespace-separated tokens holding at least one letter or digit."""
    return sum(1 for t in text.split() if any(c.isalnum() for c in t))


def _is_abbreviation(before: str) -> bool:
    words = before.split()
    if not words:
        return True  # a lone "." is no sentence
    last = words[-1].lstrip("(\"'\u201c")
    if last.lower() in _ABBREVIATIONS:
        return True
    if len(last) == 1 and last.isalpha() and last.isupper():
        return True  # an initial: "J. R. R. Tolkien"
    return len(words) == 1 and last.isdigit()  # a list number: "1. Red"


def _word_end(text: str, n: int) -> int:
    """Index just past the ``n``-th word's last letter/digit (``n >= 1``; -1 when there are fewer words)."""
    seen, i, size = 0, 0, len(text)
    while i < size:
        while i < size and text[i].isspace():
            i += 1
        j = i
        while j < size and not text[j].isspace():
            j += 1
        token = text[i:j]
        if any(c.isalnum() for c in token):
            seen += 1
            if seen == n:
                k = j
                while k > i and not text[k - 1].isalnum():
                    k -= 1
                return k
        i = j
    return -1


class AnswerPolicy:
    """One answer's policy state. ``feed(delta)`` -> (text to release now, stop now?); at the end of
    generation, ``finish(reason)`` -> the last text to release. ``spoken`` is everything released."""

    def __init__(self, params: AnswerPolicyParams | None = None) -> None:
        params = params or AnswerPolicyParams()
        self.max_sentences = params.max_sentences
        self.max_words = params.max_words
        self.spoken = ""
        self.sentences = 0  # complete sentences released
        self.words = 0  # words in them
        self.stopped = False
        self.cut = False  # True when a limit (not the model) ended the answer
        self._cur = ""  # the current sentence, from the end of the previous one
        self._cur_sent = 0  # chars of _cur already released (first sentence only)
        self._scan = 0  # chars of _cur already scanned for a boundary

    # ------------------------------------------------------------ boundaries
    def _boundary(self) -> int:
        """Index just past the first confirmed sentence end in ``_cur``, or -1."""
        s, i = self._cur, self._scan
        while i < len(s):
            c = s[i]
            if c == "\n" and s[:i].strip():
                return i
            if c in _TERMINATORS:
                j = i + 1
                while j < len(s) and (s[j] in _TERMINATORS or s[j] in _CLOSERS):
                    j += 1
                if j == len(s):
                    self._scan = i
                    return -1  # confirmed only by the next character
                if s[j].isspace() and not _is_abbreviation(s[:i]):
                    return j
                i = j
                continue
            i += 1
        self._scan = i
        return -1

    def _release(self, text: str, out: list[str]) -> None:
        if text:
            out.append(text)
            self.spoken += text

    def _stop(self, cut: bool) -> None:
        self.stopped, self.cut = True, cut

    # ------------------------------------------------------------ stream
    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self._cur += delta
        out: list[str] = []
        while (end := self._boundary()) >= 0:
            sentence, rest = self._cur[:end], self._cur[end:]
            words = count_words(sentence)
            if words and self.sentences and self.max_words is not None and self.words + words > self.max_words:
                self._stop(cut=True)  # this sentence would take the answer past max_words: end before it
                return "".join(out), True
            self._release(sentence[self._cur_sent :], out)
            self._cur, self._cur_sent, self._scan = rest, 0, 0
            if words:
                self.sentences += 1
                self.words += words
            if self.max_sentences is not None and self.sentences >= self.max_sentences:
                self._stop(cut=True)
                return "".join(out), True
        if self.sentences == 0 and self._stream_first(out):
            return "".join(out), True
        return "".join(out), False

    def _stream_first(self, out: list[str]) -> bool:
        """Release the first sentence up to its last whole word; cut it (with a period) past max_words."""
        s = self._cur
        last_space = next((i for i in range(len(s) - 1, self._cur_sent - 1, -1) if s[i].isspace()), -1)
        if last_space < 0:
            return False
        head = s[:last_space]
        if self.max_words is not None and count_words(head) > self.max_words:
            self._release(s[self._cur_sent : _word_end(s, self.max_words)] + ".", out)
            self._stop(cut=True)
            return True
        # release through the whitespace after the last whole word: the talker's clause splitter counts a word
        # only once whitespace follows it, so holding the space back would delay the first audio by a token
        k = last_space + 1
        if k > self._cur_sent:
            self._release(s[self._cur_sent : k], out)
            self._cur_sent = k
        return False

    def retract(self) -> int:
        """Drop the text fed but not released (the first sentence's unfinished word, or a later sentence held
        until complete) and return its length: an answer forked away from a copy continues from what was
        released, so the change comes as early as the listener allows (``omni_rt.engine.prompt.repetition``)."""
        if self.stopped:
            return 0
        dropped = len(self._cur) - self._cur_sent
        self._cur = self._cur[: self._cur_sent]
        self._scan = min(self._scan, len(self._cur))
        return dropped

    def finish(self, reason: str) -> str:
        """Generation ended: ``"stop"`` (the model's own end) releases what is held, unless a word limit
        forbids; any other reason (``"length"``, ...) is a cut that ends at the last boundary."""
        if self.stopped:
            return ""
        out: list[str] = []
        pending = self._cur[self._cur_sent :]
        words = count_words(self._cur)
        if reason == "stop":
            over = self.sentences and self.max_words is not None and self.words + words > self.max_words
            if not over:
                self._release(pending, out)
                self._stop(cut=False)
                return "".join(out)
        self._stop(cut=True)
        if self.sentences == 0 and self._cur_sent > 0:
            self._release(".", out)  # the first sentence was cut after its last whole word
        return "".join(out)


def response_answer_policy(max_output_tokens: int | str | None) -> dict | None:
    """What the session layer should put in a response's ``answer_policy``: ``None`` (the preset's voice
    policy) unless the client set its own ``max_output_tokens``, which then asks for that much: no sentence
    or word limit, but a cut by that limit still ends at a sentence boundary."""
    if max_output_tokens is None or max_output_tokens == "inf":
        return None
    return {"max_sentences": None, "max_words": None}
