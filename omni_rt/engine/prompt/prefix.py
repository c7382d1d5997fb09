"""Token prefix arithmetic: how much of a new prompt an engine already holds from its last one.

Pure list arithmetic, torch-free, so every engine shares it: the built-in one's prefix cache
(``omni_rt.engine.builtin.prefix_cache``) and the history budget (``omni_rt.engine.prompt.history``) that the
llama.cpp and remote thinkers use too.
"""

from __future__ import annotations


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reusable_len(cached: list[int], prompt: list[int], min_chunk: int) -> int:
    """Tokens of ``prompt`` an engine holding ``cached`` need not evaluate when it also shifts cached chunks
    of at least ``min_chunk`` tokens into place past the first difference (llama-server's ``--cache-reuse``:
    the same greedy walk over the cache, so a history trimmed at its front counts as cached, not new)."""
    head_c = head_p = common_prefix_len(cached, prompt)
    reused = head_p
    if min_chunk <= 0:
        return reused
    while head_c < len(cached) and head_p < len(prompt):
        n = 0
        while head_c + n < len(cached) and head_p + n < len(prompt) and cached[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= min_chunk:
            reused += n
            head_c += n
            head_p += n
        else:
            head_c += 1
    return reused
