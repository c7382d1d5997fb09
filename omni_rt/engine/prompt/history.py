"""The token budget of a session's history, and the trimming that keeps every prompt inside it.

One ``HistoryWindow`` per thinker, shared by every engine (the built-in ``ARScheduler``, the remote and
llama.cpp schedulers), so a conversation is trimmed the same way whichever engine answers it.

The budget per session is the smaller of the engine's real context for one request and the session's share
of the KV the engine holds for all of them (``kv_tokens // slots``): llama-server runs ``--parallel 8`` slots
over one unified 8192-token KV, so eight sessions answering at once must each stay within 1024 tokens or the
server runs out of cells mid-batch ("Context size has been exceeded") and evicts the others' cached prefixes.
``session_tokens`` overrides the share (a single-user deployment may give its one session the whole context).
``conversation_tokens`` bounds the conversation kept after the instructions (never the instructions and tools, nor
the newest message): on llama.cpp's CPU kernels a prompt token's cost grows with the context before it (SmolLM2
F16, one thread: 4.8 ms a new token with 34 tokens cached, 13.7 with 424, 22.8 with 844; decode 24, 32, 42 ms),
so a voice conversation's turns slow down as it grows unless its history is bounded.

Trimming (``fit``): the leading system message(s) are kept, the oldest turns dropped, in big steps remembered
per session, so the kept prefix — and the KV cached for it — stays the same for several turns: the cut moves
only when the prompt no longer fits, and then far enough (to ``TRIM_KEEP`` of the room the instructions leave)
that the next turns fit untrimmed. Each message is priced (length first, then tokens, newest first) before the
whole prompt is tokenised, so a huge item never costs more than a length check. Every move of the cut is logged and counted
(``state()``, shown in ``/debug/state``).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any, Callable

from omni_rt.engine.prompt.prefix import reusable_len

log = logging.getLogger(__name__)

MSG_OVERHEAD_TOKENS = 8  # chat-template tokens around one message (ChatML: <|im_start|>role\n ... <|im_end|>\n)
TRIM_KEEP = 0.6  # a trim keeps at most this share of the room the instructions leave, so turns to come fit untrimmed
_REMEMBER = 4096  # sessions whose cut is remembered
_REPORTED = 64  # sessions listed in state() (the most recently trimmed)

Render = Callable[[list[dict[str, Any]]], str]


def request_error_code(exc: BaseException) -> str:
    """The error code of a request the engine refuses: its prompt is over the token budget, or it is malformed."""
    return "context_length_exceeded" if isinstance(exc, PromptTooLong) else "bad_request"


class PromptTooLong(ValueError):
    """The newest message (plus the instructions) cannot fit the budget even with all history dropped."""


class HistoryWindow:
    def __init__(self, tokenizer: Any, context_tokens: int, *, kv_tokens: int | None = None, slots: int = 1,
                 session_tokens: int | None = None, conversation_tokens: int | None = None,
                 name: str = "thinker") -> None:
        """``context_tokens``: what one request may hold (the engine's ``max_seq_len``, llama-server's slot
        ``n_ctx``); ``kv_tokens`` / ``slots``: the KV all sessions share and how many answer at once;
        ``conversation_tokens``: the most conversation (after the instructions) a prompt keeps."""
        if conversation_tokens is not None and conversation_tokens < 8:
            raise ValueError(f"conversation_tokens must be >= 8, got {conversation_tokens}")
        self.conversation_tokens = conversation_tokens
        if context_tokens < 8:
            raise ValueError(f"context_tokens must be >= 8, got {context_tokens}")
        self.tokenizer = tokenizer
        self.name = name
        self.context_tokens = int(context_tokens)
        share = int(kv_tokens) // max(1, int(slots)) if kv_tokens else self.context_tokens
        self.share_source = (f"its share of {kv_tokens} KV tokens over {slots} slots" if kv_tokens and share < self.context_tokens
                             else f"the thinker's context of {self.context_tokens} tokens")
        if session_tokens:
            share, self.share_source = int(session_tokens), f"history_tokens={session_tokens}"
        self.session_tokens = max(8, min(self.context_tokens, share))
        self._max_token_chars = _max_token_chars(tokenizer)
        self._costs: OrderedDict[int, int] = OrderedDict()  # message key -> its token cost (bounded memo)
        self._cut: OrderedDict[str, tuple[int, int]] = OrderedDict()  # session -> (messages dropped, key of first kept)
        self._trimmed: OrderedDict[str, dict[str, int]] = OrderedDict()  # session -> its last trim, for state()
        self._last_ids: OrderedDict[str, list[int]] = OrderedDict()  # session -> its last prompt (see ``new_tokens``)
        self.counters = {"trims": 0, "trimmed_messages": 0, "refused_prompts": 0}

    # ------------------------------------------------------------------ budgets
    def prompt_budget(self, max_tokens: int, asked: int | None = None) -> int:
        """Prompt tokens a request may use: the session's tokens minus room for the answer (capped at a quarter,
        so a huge ``max_tokens`` shortens the answer rather than refusing every prompt), minus one position
        for the built-in engine's lookahead step; ``asked`` (a payload's ``max_prompt_tokens``) when smaller."""
        ctx = self.session_tokens - 1
        budget = ctx - min(max(0, int(max_tokens)), ctx // 4)
        return budget if asked is None else min(budget, asked)

    @property
    def max_item_tokens(self) -> int:
        """The largest single message that fits a prompt at every answer length: items above it are refused
        when they are created (``conversation.item.create``), not when an answer is due."""
        return self.prompt_budget(self.session_tokens) - MSG_OVERHEAD_TOKENS

    def count(self, text: str) -> int:
        """Tokens of ``text``; a text too long for any prompt is priced from its length alone."""
        if len(text) > (self.max_item_tokens + 1) * self._max_token_chars:
            return len(text) // self._max_token_chars
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def describe(self) -> str:
        return f"{self.session_tokens} tokens per session ({self.share_source})"  # in client errors: kept short

    # ------------------------------------------------------------------ trimming
    def cost(self, m: dict[str, Any], budget: int) -> int:
        """Tokens one message adds to the prompt; ``budget + 1`` (never fits) for text so long it cannot fit,
        decided from its length alone: a token covers at most ``_max_token_chars`` characters."""
        content = _content(m)
        if len(content) > (budget + 1) * self._max_token_chars:
            return budget + 1
        key = _msg_key(m)
        cost = self._costs.get(key)
        if cost is None:
            cost = len(self.tokenizer(content, add_special_tokens=False)["input_ids"]) + MSG_OVERHEAD_TOKENS
            self._costs[key] = cost
            if len(self._costs) > 4096:
                self._costs.popitem(last=False)
        return cost

    def fit(self, sid: str | None, messages: list[dict[str, Any]], budget: int,
            render: Render | None = None) -> tuple[list[dict[str, Any]], list[int]]:
        """The kept messages and the token ids of their chat prompt, oldest history dropped to fit ``budget``."""
        messages = recall_hints(messages, self.pin_tokens(budget), self.count)
        n_sys = 0
        while n_sys < len(messages) - 1 and messages[n_sys].get("role") == "system":
            n_sys += 1
        head, rest = messages[:n_sys], messages[n_sys:]
        fixed = sum(self.cost(m, budget) for m in head)
        newest = self.cost(rest[-1], budget)
        if fixed + newest > budget:
            self.counters["refused_prompts"] += 1
            raise PromptTooLong(
                f"the newest message and the instructions need about {fixed + newest} tokens; the thinker leaves "
                f"{budget} for the prompt ({self.describe()}, minus the answer)")
        # the conversation bound trims like the budget, but never refuses: the newest message always fits
        hard, budget = budget, min(budget, fixed + max(self.conversation_tokens or budget, newest))
        drop = 0
        remembered = self._cut.get(sid) if sid else None
        if remembered is not None and remembered[0] < len(rest) and _msg_key(rest[remembered[0]]) == remembered[1]:
            drop = remembered[0]
        # price the history newest first, stopping once it is over budget (old items are never tokenised)
        total, keep_from = fixed, len(rest)
        for i in range(len(rest) - 1, drop - 1, -1):
            total += self.cost(rest[i], budget)
            if total > budget:
                break
            keep_from = i
        if keep_from > drop:  # does not fit from the remembered point: trim in one big step
            total, keep_from, target = fixed + newest, len(rest) - 1, fixed + int((budget - fixed) * TRIM_KEEP)
            for i in range(len(rest) - 2, -1, -1):
                total += self.cost(rest[i], budget)
                if total > max(target, fixed + newest):
                    break
                keep_from = i
        tok = self.tokenizer
        while True:
            keep_from = _turn_start(rest, keep_from)
            kept = head + rest[keep_from:]
            text = render(kept) if render is not None else tok.apply_chat_template(kept, add_generation_prompt=True, tokenize=False)
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if len(ids) <= budget or keep_from >= len(rest) - 1:
                break
            keep_from += 1  # the estimate was short (template overhead): drop one more
        if len(ids) > hard:
            self.counters["refused_prompts"] += 1
            raise PromptTooLong(f"prompt of {len(ids)} tokens does not fit the budget of {hard} tokens "
                                f"({self.describe()})")
        if sid:
            self._remember(sid, keep_from, rest, len(ids), budget)
        return kept, ids

    def pin_tokens(self, room: int) -> int:
        """The most tokens the user's pinned facts may take: a quarter of the conversation's room (at least 32)."""
        return max(32, min(room, self.conversation_tokens or room) // 4)

    def _remember(self, sid: str, keep_from: int, rest: list[dict[str, Any]], prompt_tokens: int, budget: int) -> None:
        before = self._cut.get(sid)
        self._cut[sid] = (keep_from, _msg_key(rest[keep_from]))
        self._cut.move_to_end(sid)
        if len(self._cut) > _REMEMBER:
            self._cut.popitem(last=False)
        if keep_from == 0 or (before is not None and before[0] == keep_from):
            return  # nothing dropped, or the same cut as last turn (its prefix is reused)
        self.counters["trims"] += 1
        self.counters["trimmed_messages"] += keep_from - (before[0] if before is not None and before[0] < keep_from else 0)
        prev = self._trimmed.pop(sid, {"trims": 0})
        self._trimmed[sid] = {"trims": prev["trims"] + 1, "dropped_messages": keep_from, "kept_messages": len(rest) - keep_from,
                              "prompt_tokens": prompt_tokens, "budget_tokens": budget}
        if len(self._trimmed) > _REPORTED:
            self._trimmed.popitem(last=False)
        log.info("%s: session %s history trimmed to fit %s: oldest %d messages dropped, %d kept (%d of %d prompt tokens)",
                 self.name, sid, self.describe(), keep_from, len(rest) - keep_from, prompt_tokens, budget)

    def new_tokens(self, sid: str | None, ids: list[int], reuse_chunk: int = 0) -> int:
        """Tokens of ``ids`` an engine that cached the session's previous prompt must prefill now: past their
        common prefix, less the chunks of >= ``reuse_chunk`` tokens it shifts into place (0: prefix only;
        remembered for the most recent ``_REPORTED * 4`` sessions)."""
        if not sid:
            return len(ids)
        last = self._last_ids.pop(sid, [])
        self._last_ids[sid] = ids
        if len(self._last_ids) > _REPORTED * 4:
            self._last_ids.popitem(last=False)
        return len(ids) - reusable_len(last, ids, reuse_chunk)

    def forget(self, sid: str) -> None:
        """A closed session: its cut, trim record and last prompt go (thread-safe: single dict operations)."""
        self._cut.pop(sid, None)
        self._trimmed.pop(sid, None)
        self._last_ids.pop(sid, None)

    def state(self) -> dict[str, Any]:
        """For ``/debug/state``: the budget, trim counters, and the last trim of recently trimmed sessions."""
        return {"session_tokens": self.session_tokens, "context_tokens": self.context_tokens,
                "conversation_tokens": self.conversation_tokens,
                "max_item_tokens": self.max_item_tokens, **self.counters,
                "sessions": {sid: dict(rec) for sid, rec in list(self._trimmed.items())}}


# what a user says about themselves or asks to be remembered: "my name is", "I'm a nurse", "I live in", "remember"
_SELF = re.compile(r"\b(my|i'm|i am|i live|i work|i have|i love|i like|call me|remember)\b", re.IGNORECASE)


def user_facts(messages: list[dict[str, Any]], cap: int, count: Callable[[str], int]) -> list[str]:
    """The earliest user statements about themselves in ``messages`` ("Hi! My name is Ana and I live in Lisbon.";
    not questions), verbatim, within ``cap`` tokens."""
    said, used = [], 0
    for m in messages:
        text = _content(m).strip()
        if m.get("role") != "user" or not text or text.endswith("?") or not _SELF.search(text):
            continue
        cost = count(text) + 1
        if used + cost > cap:
            break
        said.append(text)
        used += cost
    return said


# a question about the user themselves: "What is my name?", "Which city do I live in?", "How old am I?" -- told by
# its words, not by a closing "?": a prefill hint carries the words heard so far ("What is my name"), and it must
# get the same hint as the final question for the prompt it warms to be that question's prefix
_ABOUT_ME = re.compile(r"^\W*(?:(?:and|so|now|ok|okay|hey|then),?\s+)?(?:(?:what|which|where|who)\b[^?]*\b(?:my|am i|do i)\b"
                       r"|how old am i\b)|\bfor me\?", re.IGNORECASE)


def recall_hints(messages: list[dict[str, Any]], cap: int, count: Callable[[str], int]) -> list[dict[str, Any]]:
    """The chat with every user question about the user ("What is my name?", "Which city do I live in?", "How old
    am I?") led by what they said about themselves before it: 'Earlier I said: "Hi! My name is Ana and I live in
    Lisbon."' + a line break + the question (``user_facts``, at most ``cap`` tokens).

    Why: ``conversation_tokens`` keeps the last ~4-6 exchanges, so the name and city of the first turn were gone
    when the user asked for them (issue #50: 0 of 2 recalled in a twelve-turn chat); and put back at the front
    (a system note, or the first exchange pinned) SmolLM2-135M still did not use them (1 of 11 recall questions
    answered, five conversations, on llama.cpp), where next to the question it did (7 of 11; of five phrasings
    tried on the issue's conversation this one recalled both the name and the city). Each question is
    rewritten from the turns before it only, the same way every time, so the prompt's prefix, and the KV cached
    for it, is unchanged from turn to turn; the hint counts against the token budget like any text."""
    out = list(messages)
    for i, m in enumerate(messages):
        text = _content(m).strip()
        if m.get("role") != "user" or not _ABOUT_ME.search(text):
            continue
        facts = user_facts(messages[:i], cap, count)
        if facts:
            out[i] = {**m, "content": f'Earlier I said: "{" ".join(facts)}"\n{text}'}
    return out


def _content(m: dict[str, Any]) -> str:
    content = m.get("content") or ""
    return content if isinstance(content, str) else str(content)


def _msg_key(m: dict[str, Any]) -> int:
    return hash((m.get("role"), _content(m), str(m.get("tool_calls") or "")))


def _turn_start(rest: list[dict[str, Any]], i: int) -> int:
    """Move a cut forward to a user message, so kept history never opens with an orphan answer or tool
    result (the newest message is always kept)."""
    while i < len(rest) - 1 and rest[i].get("role") != "user":
        i += 1
    return i


def _max_token_chars(tokenizer: Any) -> int:
    """Longest vocabulary entry, in characters of its stored form (>= the text characters it covers), so
    ``len(text) / this`` is a lower bound on the token count computed without tokenising."""
    try:
        return max(1, max(len(t) for t in tokenizer.get_vocab()))
    except Exception:  # no tokenizer, or one without a vocabulary listing: a generous fixed bound
        return 64
