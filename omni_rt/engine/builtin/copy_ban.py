"""No verbatim copies of earlier answers on the built-in engine: an answer whose tokens so far are exactly an
earlier answer of the session may not end there.

The streamed engines (llama.cpp, remote) catch a copy on the text stream and fork the answer after its last
word with the same tokens banned (``omni_rt.engine.prompt.repetition``). The built-in engine samples its own tokens, so it can steer inside
the sampler instead, with nothing held and no second request: each spoken request carries its session's
earlier answers as token ids up to the end of their last word (``copy_prefixes``), and while a slot's
generated tokens equal one of them, the tokens that would end the answer there (sentence-ending punctuation,
a newline, end of sequence: ``ending_tokens``) are banned (``sampling.copy_end_ban``). The answer then goes on
("The capital of France is Paris, ..."), so a repeated question keeps its right answer rather than having the
answer's last word (here the fact) banned.

Bounded: the ``MAX_COPIES`` most recent answers of at most ``MAX_COPY_TOKENS`` tokens each (a longer answer is
not guarded: a copy that long is rare and the voice policy caps answers far below it).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from omni_rt.engine.prompt.repetition import ending_token_ids, words_of

MAX_COPIES = 8  # earlier answers guarded per request (the most recent)
MAX_COPY_TOKENS = 64  # tokens of one earlier answer (up to its last word)
MIN_COPY_WORDS = 3  # shorter answers ("Yes.", "Sure thing.") may come again


def ending_tokens(tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]) -> torch.Tensor:
    """[V] bool: the tokens that end an answer (``repetition.ending_token_ids``)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ending_token_ids(tokenizer, vocab_size, eos_ids)] = True
    return mask


def copy_prefixes(tokenizer: Any, messages: list[dict[str, Any]] | None,
                  ending: torch.Tensor) -> tuple[tuple[int, ...], ...]:
    """The session's earlier spoken answers (assistant messages with text) as token ids without their ending
    tokens, the most recent ``MAX_COPIES`` that have ``MIN_COPY_WORDS`` words and fit ``MAX_COPY_TOKENS``."""
    out: list[tuple[int, ...]] = []
    for m in reversed(messages or ()):
        content = m.get("content") if m.get("role") == "assistant" else None
        if not isinstance(content, str) or len(words_of(content)) < MIN_COPY_WORDS:
            continue
        ids = tokenizer.encode(content.strip(), add_special_tokens=False)
        while ids and 0 <= ids[-1] < len(ending) and bool(ending[ids[-1]]):
            ids.pop()
        if 0 < len(ids) <= MAX_COPY_TOKENS and tuple(ids) not in out:
            out.append(tuple(ids))
        if len(out) == MAX_COPIES:
            break
    return tuple(out)
