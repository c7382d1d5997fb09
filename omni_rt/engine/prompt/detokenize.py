"""Incremental detokenization with stop strings.

Two promises to the stage downstream (a talker speaking clauses): a delta never splits a multibyte
character, and never contains text that might turn out to be the start of a stop string.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    """Feed token ids one at a time; take text deltas that are safe to publish.

    Decodes a short window (vLLM's prefix/read offsets) instead of the whole output each step, so per-token
    cost stays flat and leading-space rules of SentencePiece tokenizers still see their left context.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""
        self.stopped = False
        self._prefix = 0  # window start
        self._read = 0  # ids[:_read] are already in self.text
        self._sent = 0  # chars of self.text already published

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> bool:
        """Add a token; returns True when a stop string appeared (text is then cut just before it)."""
        if self.stopped:
            return True
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False  # an incomplete UTF-8 sequence: wait for the next byte-token
        old_len = len(self.text)
        self.text += after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        if self.stop:
            # a new match must end past old_len; the earliest one wins when several stop strings match
            start = max(0, old_len - max(map(len, self.stop)) + 1)
            hits = [i for s in self.stop if (i := self.text.find(s, start)) != -1]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
        return self.stopped

    def _holdback(self) -> int:
        """Chars at the end of ``text`` that could still grow into a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def take(self, final: bool = False) -> str:
        """The publishable text since the last call (everything when ``final``)."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._holdback()
        if end <= self._sent:
            return ""
        delta, self._sent = self.text[self._sent : end], end
        return delta
