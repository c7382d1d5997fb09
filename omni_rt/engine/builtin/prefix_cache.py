"""Per-session prefix reuse: the KV of a session's last finished request, kept for its next turn.

A voice session's next turn re-sends system prompt + history + one new user message; keeping the previous
request's KV (keyed by session id, with the exact token ids it covers) lets the next turn prefill only what
is new. Matching is by longest common token prefix, so an edited or truncated history (barge-in truncating
the assistant's answer) keeps what still matches and drops the rest. Memory is bounded by a token budget
with least-recently-used eviction; a closed session's entry is dropped at once (``drop``), and the
scheduler never stores one for a session it knows is closed. Counters make leaks visible in tests and
``/debug/state``. The token arithmetic (``common_prefix_len``, ``reusable_len``) is in
``omni_rt.engine.prompt.prefix``, torch-free, so the other engines share it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from omni_rt.engine.builtin.kv_cache import KVBlob


@dataclass(slots=True)
class SessionPrefix:
    token_ids: list[int]
    kv: KVBlob


class PrefixStore:
    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self._entries: OrderedDict[str, SessionPrefix] = OrderedDict()
        self.total_tokens = 0
        self.total_bytes = 0
        self.counters = {"stores": 0, "hits": 0, "misses": 0, "evictions": 0, "drops": 0}

    def session_ids(self) -> list[str]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def peek(self, session_id: str) -> SessionPrefix | None:
        """The entry, left in place (the scheduler estimates a waiting request's work with it)."""
        return self._entries.get(session_id)

    def take(self, session_id: str) -> SessionPrefix | None:
        """Remove and return a session's entry: the request that takes it owns the KV until it finishes."""
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self.total_tokens -= len(entry.token_ids)
            self.total_bytes -= _blob_bytes(entry.kv)
        return entry

    def put(self, session_id: str, token_ids: list[int], kv: KVBlob) -> None:
        self.take(session_id)
        if not token_ids or len(token_ids) > self.budget_tokens:
            return
        while self._entries and self.total_tokens + len(token_ids) > self.budget_tokens:
            old_id = next(iter(self._entries))
            self.take(old_id)
            self.counters["evictions"] += 1
        self._entries[session_id] = SessionPrefix(list(token_ids), kv)
        self.total_tokens += len(token_ids)
        self.total_bytes += _blob_bytes(kv)
        self.counters["stores"] += 1

    def drop(self, session_id: str) -> None:
        if self.take(session_id) is not None:
            self.counters["drops"] += 1

    def clear(self) -> None:
        self._entries.clear()
        self.total_tokens = 0
        self.total_bytes = 0


def _blob_bytes(kv: KVBlob) -> int:
    return kv.k.numel() * kv.k.element_size() + kv.v.numel() * kv.v.element_size()
