"""Cut a streaming LLM answer into speakable clauses: the first one short (latency), later ones longer
(prosody). Also strips what a TTS voice should not read out (markdown, emoji)."""

from __future__ import annotations

import re

_MARKUP = re.compile(r"[*_#`~>|\[\]{}<>\\]|[\U0001F000-\U0001FAFF\u2600-\u27BF]")
_SENTENCE_END = ".!?\n"
_SOFT_BREAK = ",;:\u2014"


def clean_for_speech(text: str) -> str:
    return _MARKUP.sub("", text)


class ClauseSplitter:
    """``push(delta)`` returns the clauses completed by this delta; ``flush()`` returns the rest.

    A boundary is sentence punctuation followed by whitespace, a soft break (comma, colon...) once the clause
    has ``min_words``, or ``max_words`` words with no punctuation at all. The first clause uses
    ``first_min_words`` / ``first_max_words`` so audio can start after a few tokens.
    """

    def __init__(self, first_min_words: int = 2, first_max_words: int = 4, min_words: int = 5, max_words: int = 24) -> None:
        self.first_min_words = first_min_words
        self.first_max_words = first_max_words
        self.min_words = min_words
        self.max_words = max_words
        self.buffer = ""
        self.emitted = 0

    def _limits(self) -> tuple[int, int]:
        """Clause k may hold up to first_max_words * 2**k words (capped at max_words): each clause is then
        generated while the previous one plays (decode runs ~2x faster than speech), so playback never starves
        waiting for a long second clause."""
        if self.emitted == 0:
            return self.first_min_words, self.first_max_words
        max_words = min(self.max_words, self.first_max_words * 2**self.emitted)
        return min(self.min_words, max_words), max_words

    def push(self, delta: str) -> list[str]:
        self.buffer += clean_for_speech(delta)
        out: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                break
            clause, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:]
            if clause:
                out.append(clause)
                self.emitted += 1
        return out

    def flush(self) -> list[str]:
        rest, self.buffer = self.buffer.strip(), ""
        if rest and any(ch.isalnum() for ch in rest):
            self.emitted += 1
            return [rest]
        return []

    def _find_cut(self) -> int | None:
        min_words, max_words = self._limits()
        text = self.buffer
        words = 0
        in_word = False
        for i, ch in enumerate(text):
            nxt = text[i + 1] if i + 1 < len(text) else None
            if ch.isspace():
                if in_word:
                    words += 1
                    in_word = False
                    if words >= max_words:
                        return i
                continue
            in_word = True
            if nxt is None or not nxt.isspace():
                continue  # punctuation counts only once the next character shows it ended the word
            if ch in _SENTENCE_END and words + 1 >= 1:
                return i + 1
            if ch in _SOFT_BREAK and words + 1 >= min_words:
                return i + 1
        return None
