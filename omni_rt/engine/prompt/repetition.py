"""Loop and copy control for engines that stream text from elsewhere (llama-server, any OpenAI-compatible upstream).

The built-in engine applies the preset's ``sampling`` repetition controls in its own sampler, over the answer's
tokens (``omni_rt.engine.builtin.sampling``), and keeps answers from ending as copies there too
(``omni_rt.engine.builtin.copy_ban``). An upstream has other knobs, so each field is mapped to what it has, and
what it has not is enforced here on the stream, never silently dropped (issue #50: ``repetition_penalty: 1.2``
and ``no_repeat_ngram_size: 4`` were left out of every llama-server request, and a 135M thinker then said
"konkledi, konkledi, ..." until the word cap, and copied its earlier answers word for word).

* llama.cpp (``llama_cpp_fields``):
  - ``no_repeat_ngram_size: n`` -> enforced on the stream by ``RepeatGuard`` (below), not by llama-server's DRY
    sampler: DRY scans its window before every token (the first token came a decode step later), and over the
    whole prompt it also kept the model from saying the facts and tool results the prompt holds.
  - ``repetition_penalty`` -> ``repeat_penalty`` over the last ``REPEAT_LAST_N`` tokens. Unlike the built-in
    (answer tokens only) llama-server counts the prompt's tail too (with its default 64-token window and 1.2
    SmolLM2 answered "What is the capital of France?" in French; with 16 it answered a tea question with coffee);
    a 6-token window keeps the question out of it: the template's turn markers, then the answer's own tokens.
  - ``frequency_penalty`` / ``presence_penalty`` -> the same names (llama-server's penalties sampler).
  A forced tool call gets none of these: a call's JSON repeats its keys by design.
* other OpenAI-compatible upstreams: ``repetition_penalty`` is sent as is (vLLM and SGLang accept it),
  frequency/presence penalties are OpenAI's own; ``no_repeat_ngram_size`` has no equivalent in the API, so it
  is enforced on the stream (``RepeatGuard``).

``RepeatGuard`` (every streamed engine, spoken answers only) never holds an answer's first words for a check: the
first words are what the talker waits for, and a held word is first-audio time lost on every answer that
might have been a copy (most answers start "The ...", as most earlier ones did). It judges each word once
it is complete, which is exactly when the answer policy would release it, so a verdict on a word always comes
before anyone hears it:

* a word n-gram that comes a second time stops the answer before its last word; an engine that can continue an
  answer forks it there with that word banned (the built-in sampler's n-gram ban), others end it (the policy
  closes it at a sentence boundary);
* an answer whose first complete words are another language's ("Eu nao Ana, amigo") is asked again before
  anything of it is released, with the question primed for the voice's language (``copy_retry``);
* an answer that would end as a word-for-word copy of an earlier answer of the session (its words are that
  answer's, and a sentence end follows) may not end there: the guard stops at the end of its last word and the
  answer is **forked** (``RepeatGuard.fork``): the engine continues it from all its words with every token that
  would end it banned for one token (``ending_token_ids``), so "The capital of France is Paris." a second time
  becomes "The capital of France is Paris, ..." -- the same rule as the built-in engine's (``copy_ban``), with
  nothing held from its start and one short continuation in the same slot (its KV already holds the prompt and
  the answer). Why not ban the copy's last word instead: that word is most often the fact ("I live in Lisbon"
  asked again became "... in Barcelona"). An engine that cannot continue an answer (a generic OpenAI-compatible
  upstream: its API has no assistant prefix) gets ``hold_copies``: the answer is held while it still matches an
  earlier one and, once it completes the copy, asked again sampled (``copy_retry``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

from omni_rt.engine.prompt.request import SamplingParams

# llama-server's repeat_penalty window: at the answer's start it holds the template's turn markers and the question's
# "?" only, then the answer's own last tokens. With 16 the question's words were in it and single questions got
# worse ("How do I make a cup of tea?" -> "To brew your own coffee ..."; "Which ocean is the largest?" ->
# Madagascar; latency_bench.quality --limit 7)
REPEAT_LAST_N = 6


def llama_cpp_fields(s: SamplingParams) -> dict[str, Any]:
    """The request fields that carry ``s``'s repetition controls to llama-server (names as its server parses
    them: ``repeat_penalty``, ``repeat_last_n``, ``frequency_penalty``, ``presence_penalty``); the n-gram ban is the
    stream guard's."""
    out: dict[str, Any] = {}
    if s.repetition_penalty != 1.0:
        out["repeat_penalty"] = s.repetition_penalty
        out["repeat_last_n"] = REPEAT_LAST_N
    if s.frequency_penalty:
        out["frequency_penalty"] = s.frequency_penalty
    if s.presence_penalty:
        out["presence_penalty"] = s.presence_penalty
    return out


LLAMA_CPP_PENALTY_KEYS = ("repeat_penalty", "repeat_last_n", "frequency_penalty", "presence_penalty")

_WORD = re.compile(r"[A-Za-z0-9\u00c0-\uffff]+(?:'[A-Za-z]+)?")


def words_of(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text.replace("\u2019", "'"))]


def earlier_answers(messages: Iterable[dict[str, Any]] | None) -> list[list[str]]:
    """The words of every assistant answer in the chat (tool-call turns without text left out)."""
    out = []
    for m in messages or ():
        if m.get("role") == "assistant" and isinstance(m.get("content"), str):
            w = words_of(m["content"])
            if len(w) >= 3:
                out.append(w)
    return out


LANGUAGE_WORDS = 4  # words an answer's language may stay unknown before it is let through
_ENDS = ".!?\u2026\n"  # what ends an answer's sentence (after its last word)


def is_ending(piece: str) -> bool:
    """A token's text that would end an answer after a word: only sentence-ending punctuation, newlines and
    spaces, with at least one of the first two."""
    return bool(piece) and all(c in _ENDS or c == " " for c in piece) and any(c in _ENDS for c in piece)


def ending_token_ids(tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]) -> list[int]:
    """The ids of every token that ends an answer (``is_ending``) and of end of sequence: what an answer that is
    an earlier answer's copy so far may not say next (``copy_ban`` on the built-in engine, ``fork`` upstream)."""
    ids = [i for i in range(min(vocab_size, len(tokenizer))) if is_ending(tokenizer.decode([i]))]
    return ids + [i for i in eos_ids if 0 <= i < vocab_size and i not in ids]
_APOSTROPHES = ("'", "\u2019")  # a word followed by one at the stream's end is still being written


class RepeatGuard:
    """Fed an answer's raw streamed text: ``feed(delta) -> (text to pass on, stop?)``; ``finish()`` -> the text
    still held. ``n``: the word n-gram that may not come twice (0: off); ``copies``: earlier answers (word lists)
    the answer may not reproduce; ``languages``: the voice's (an answer that starts in another is stopped);
    ``hold_copies``: hold while the answer matches an earlier one (for an engine that cannot fork an answer).

    Text is passed on up to the word still being written, each word once it is complete and judged. ``reason``
    once stopped: "loop", "language" or "copy" (then ``fork()`` says where to continue and which word to ban)."""

    def __init__(self, n: int = 0, copies: list[list[str]] | None = None, languages: tuple[str, ...] = (),
                 hold_copies: bool = False, cap: int | None = None) -> None:
        self.n = n
        self.languages = tuple(languages)
        self.hold_copies = hold_copies
        # the answer policy's word cap: an answer cut there ends after its cap-th word whatever follows, so a copy
        # of an earlier answer cut there is caught at that word and forked before it (``at_cap``: the word banned)
        self.cap = cap
        self.copies = [c for c in (copies or []) if c]
        self._reset()

    def _reset(self) -> None:
        self.language_open = bool(self.languages)  # the answer's first words are not yet known to be in one of them
        self.grams: Counter = Counter()
        self.words: list[str] = []
        self.text = ""  # everything fed
        self.passed = 0  # chars of ``text`` passed on
        self.reason: str | None = None  # "loop" | "copy" | "language" once stopped
        self.at_cap = False  # a "copy" stop at the word cap: ``fork()`` goes on before its last word, banning it
        self._scanned = 0  # chars of ``text`` whose complete words are counted
        self._word_at = 0  # where the last complete word starts in ``text``
        self._copy_at: int | None = None  # where the word that made the answer's words an earlier answer's ends

    def _partial(self) -> str:
        tail = _WORD.findall(self.text[self._scanned :])
        return tail[0].lower() if tail else ""

    def _matching_copy(self) -> bool:
        """``hold_copies``: the answer so far (its words, and the start of the word being written) begins an
        earlier answer."""
        w, part = self.words, self._partial()
        return any(len(c) > len(w) and c[: len(w)] == w and c[len(w)].startswith(part) for c in self.copies) or any(
            c == w and not part for c in self.copies)

    def _ends_here(self) -> bool | None:
        """With the answer's words those of an earlier answer: True when the answer ends there too (a sentence
        end follows its last word), False when it goes on (another word, a comma...), None while only whitespace
        has followed. Why not stop at the words alone: an earlier answer that was cut ("... is not a credit .")
        would then stop every later answer that says more ("... is not a credit card.")."""
        after = self.text[self._scanned :].lstrip()
        return None if not after else after[0] in _ENDS

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.reason is not None:
            return "", True
        self.text += delta
        if self._copy_at is not None:  # the words are an earlier answer's: does the answer end there?
            ends = self._ends_here()
            if ends:
                return self._stop("copy", self.passed if self.hold_copies else self._copy_at)
            if ends is None:
                return "", False
            self._copy_at = None
        writing = len(self.text)  # where the word still being written starts (none: the text's end)
        # complete words only: a word is complete once a non-word character follows it
        for m in _WORD.finditer(self.text, self._scanned):
            if m.end() == len(self.text) or self.text[m.end():] in _APOSTROPHES:  # "L'" may go on as "L'Alma"
                writing = m.start()
                break
            self._scanned, self._word_at = m.end(), m.start()
            self.words.append(m.group(0).lower().replace("\u2019", "'"))
            if self.n and len(self.words) >= self.n:
                gram = tuple(self.words[-self.n :])
                self.grams[gram] += 1
                if self.grams[gram] >= 2:
                    return self._stop("loop", m.start())
            if self.language_open and self._language() == "off":
                return self._stop("language", m.start())
            if self.copies and any(c == self.words for c in self.copies):
                if self.cap is not None and len(self.words) >= self.cap:  # the policy ends it here, a copy
                    self.at_cap = True
                    return self._stop("copy", self.passed if self.hold_copies else m.start())
                ends = self._ends_here()
                if ends:
                    return self._stop("copy", self.passed if self.hold_copies else m.end())
                if ends is None:  # only whitespace after it: held until the answer ends or goes on
                    self._copy_at, writing = m.end(), m.start()
                    break
        if self.hold_copies and self.copies and self._matching_copy():
            return "", False  # may still become a copy: held
        # the word being written waits until it is complete: the answer policy releases no unfinished word
        # either, so this holds nothing back from the listener
        end = max(self.passed, writing)
        out, self.passed = self.text[self.passed : end], end
        return out, False

    def _language(self) -> str:
        """"ok" once the complete words are in an allowed language (an English answer's first function word:
        "The", "I", "You", ...) or after ``LANGUAGE_WORDS`` words with no verdict; "off" when they are another
        language's ("Eu nao Ana, amigo"); "open" until then. Nothing is held for it: a word is judged when it is
        complete, the moment the answer policy would release it, so an answer caught in its first word is asked
        again before any of it is heard (``copy_retry``).

        Why at all: SmolLM2-135M answered "Hi! My name is Ana and I live in Lisbon." in Portuguese, and every
        later answer copied that style."""
        from omni_rt.engine.prompt.language import guess_language

        guess = guess_language(" ".join(self.words))
        if guess is not None and guess not in self.languages:
            return "off"
        if guess is not None or len(self.words) >= LANGUAGE_WORDS:
            self.language_open = False
            return "ok"
        return "open"

    @property
    def forks_past_end(self) -> bool:
        """After a stop: the answer is to go on after all its words with its ending banned for one token (a copy
        that would end there), rather than before a banned word (a loop, another language, a copy at the cap)."""
        return self.reason == "copy" and not self.at_cap

    def _stop(self, reason: str, end: int) -> tuple[str, bool]:
        self.reason = reason
        out = self.text[self.passed : max(self.passed, end)]
        self.passed = max(self.passed, end)
        return out, True

    def fork(self, back: int = 0) -> tuple[str, list[str]]:
        """After a "copy", "loop" or "language" stop: (the answer's text to continue from; the words to ban there). That
        text is the text passed on less its last ``back`` characters (what the answer policy still held and
        dropped: ``AnswerPolicy.retract``); after a copy (``back`` 0) it is all its words, to go on from without
        ending there (but for a copy at the word cap: the text before its last word, which is banned). The words are the one that came after it (with ``back`` 0 after a loop or another language's
        stop: the word that repeated an n-gram, the other language's word) and the next word of every earlier answer that begins with that text, so the continuation
        cannot turn into another earlier answer either. The guard then goes on from that text, its counts intact."""
        cut = max(0, self.passed - back)
        said, rest = self.text[:cut], self.text[cut:]
        m = _WORD.search(rest)
        self._resume(said)
        before = words_of(said)  # its last word too, which the guard still takes for one being written
        k = len(before)
        banned = [m.group(0)] if m else []
        for c in self.copies:
            if len(c) > k and c[:k] == before and c[k] not in (b.lower() for b in banned):
                banned.append(c[k])
        return said, banned

    def _resume(self, said: str) -> None:
        language_open = self.language_open
        self._reset()
        self.language_open = language_open
        self.feed(said)
        self.passed = len(self.text)

    def finish(self) -> str:
        """The end of the stream: the word still held is released; if it completes an earlier answer ("copy":
        ``fork()`` then continues after it) the text after it is not."""
        if self.reason is not None:
            return ""
        for m in _WORD.finditer(self.text, self._scanned):
            self.words.append(m.group(0).lower())
            self._word_at = m.start()
        self._scanned = len(self.text)
        if self._copy_at is not None or (self.copies and any(c == self.words for c in self.copies)):
            self.reason = "copy"
            if self.hold_copies:
                return ""
            end = len(self.text.rstrip(_ENDS + " "))  # all its words: the answer goes on after the last
            out, self.passed = self.text[self.passed : max(self.passed, end)], max(self.passed, end)
            return out
        out, self.passed = self.text[self.passed :], len(self.text)
        return out


COPY_RETRY_TEMPERATURE = 0.7


def copy_retry(req: Any, guard: RepeatGuard, attempt: int, spoken: str) -> Any | None:
    """The request to send again when ``guard`` stopped an answer before any of it was spoken (only the first
    attempt): a word-for-word copy of an earlier answer -> the same prompt sampled at ``COPY_RETRY_TEMPERATURE``
    with a fixed seed (the second answer differs from the greedy copy and is reproducible); an answer in another
    language -> the newest user turn ends with "English answer:". None: no retry."""
    import dataclasses

    if guard.reason not in ("copy", "language") or attempt > 0 or spoken.strip():
        return None
    if guard.reason == "language" and req.messages:
        # the newest user turn primed for an answer in the voice's language, as steer_messages does for a
        # question in another language ("... English answer:")
        from omni_rt.engine.prompt.language import LANGUAGES

        name = LANGUAGES[guard.languages[0]][0]
        last = max(i for i, m in enumerate(req.messages) if m.get("role") != "assistant")
        msgs = list(req.messages)
        if msgs[last].get("role") == "user" and isinstance(msgs[last].get("content"), str):
            msgs[last] = {**msgs[last], "content": f"{msgs[last]['content']}\n{name} answer:"}
        return dataclasses.replace(req, messages=msgs)
    s = req.sampling
    sampling = dataclasses.replace(s, temperature=max(s.temperature, COPY_RETRY_TEMPERATURE),
                                   seed=s.seed if s.seed is not None else 50)
    return dataclasses.replace(req, sampling=sampling)


def as_said(text: str) -> str:
    """An answer that came out the same twice, spoken as the repeat it is: "As I said, the opposite of loud is
    soft." (a user who asks the same question again hears the answer again, never word for word the same)."""
    text = text.strip()
    if not text:
        return text
    first = text.split(maxsplit=1)[0]
    lower = first in ("I", "I'm", "I've", "I'd", "I'll") or (first.isupper() and len(first) > 1)
    return "As I said, " + (text if lower else text[0].lower() + text[1:])
