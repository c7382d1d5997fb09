"""Input processing for the AR scheduler: a ``new_request``'s data becomes a ``Sequence`` ready to prefill.

The request is parsed against the preset's defaults (sampling, max tokens, voice answer policy), its chat
messages steered to the talker's languages and fitted into the session's history budget (``HistoryWindow``,
shared with the remote and llama.cpp schedulers) as the model's chat template renders them with the tools,
and the prompt checked against the model's vocabulary and context. Kept apart from the scheduling loop so
what a request *is* can be read without the slots, and the loop without the prompt rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omni_rt.engine.tools.grammar import forces_call
from omni_rt.engine.prompt.detokenize import TextStream
from omni_rt.engine.prompt.history import HistoryWindow
from omni_rt.engine.prompt.language import check_languages, steer_messages
from omni_rt.engine.prompt.request import _num, parse_answer_policy, parse_request, parse_sampling
from omni_rt.engine.builtin.copy_ban import copy_prefixes, ending_tokens
from omni_rt.engine.builtin.sequence import Sequence
from omni_rt.engine.tools.prompt import render_prompt


class SequenceBuilder:
    """Builds one ``Sequence`` per request; raises ``ValueError`` (or ``PromptTooLong``) for one it cannot run."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        max_seq_len: int,
        slots: int,
        model_eos_ids: set[int] | frozenset[int],
        name: str,
        kv_budget_tokens: int,
        history_tokens: int | None,
        conversation_tokens: int | None,
        default_max_tokens: int,
        sampling: dict[str, Any] | None,
        answer_policy: dict[str, Any] | None,
        languages: list[str] | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.default_max_tokens = default_max_tokens
        parse_sampling({}, sampling)  # a bad preset default fails at start-up, not on every request
        self.sampling_defaults = dict(sampling or {})
        self.default_policy = parse_answer_policy(answer_policy)
        self.languages = check_languages(languages)
        eos = set(model_eos_ids)
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        # the tokens that end an answer: a spoken answer that is an earlier one's copy may not end with them
        self.ending = ending_tokens(tokenizer, vocab_size, self.eos_token_ids) if tokenizer is not None else None
        self.history = HistoryWindow(tokenizer, max_seq_len, kv_tokens=kv_budget_tokens, slots=slots,
                                     session_tokens=history_tokens, conversation_tokens=conversation_tokens,
                                     name=name) if tokenizer is not None else None

    def build(self, rid: str, data: Any) -> Sequence:
        """The request's sequence, without its tool stream (``ToolDecoding.stream_for`` adds that)."""
        req = parse_request(data, self.default_max_tokens, self.sampling_defaults, self.default_policy)
        if req.tools and forces_call(req.tool_choice):
            # a forced call is JSON under a grammar, not a spoken answer: no repetition controls (as on llama.cpp).
            # With the preset's repetition_penalty 1.2 SmolLM2 filled get_weather's city with '");' instead of
            # the 'Lisbon' a tool output had just given; a no-repeat n-gram ban fights the call's fixed framing
            req.sampling = dataclasses.replace(req.sampling, repetition_penalty=1.0, frequency_penalty=0.0,
                                               presence_penalty=0.0, no_repeat_ngram_size=0)
        tok = self.tokenizer
        if (req.messages is not None and self.ending is not None and req.output == "text"
                and req.answer_policy is not None and not (req.tools and forces_call(req.tool_choice))):
            # a spoken answer may not end as a copy of an earlier one (omni_rt.engine.builtin.copy_ban)
            req.sampling = dataclasses.replace(req.sampling, copies=copy_prefixes(tok, req.messages, self.ending))
        if req.messages is not None:
            req.messages = steer_messages(req.messages, self.languages)
            if tok is None:
                raise ValueError("'messages' need a tokenizer; this engine has none (send 'prompt_ids')")
            budget = self.history.prompt_budget(req.max_tokens, _num(data, "max_prompt_tokens", int, None, 1))
            _, prompt_ids = self.history.fit(req.session_id, req.messages, budget,
                                             render=lambda msgs: render_prompt(tok, msgs, req.tools, req.tool_choice))
        else:
            prompt_ids = req.prompt_ids
        if max(prompt_ids) >= self.vocab_size:
            raise ValueError(f"token id {max(prompt_ids)} is outside the model's vocabulary ({self.vocab_size})")
        if req.stop and tok is None:
            raise ValueError("'stop' strings need a tokenizer")
        room = self.max_seq_len - len(prompt_ids) - 1  # one position spare for the lookahead step
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit max_seq_len={self.max_seq_len}")
        req.max_tokens = min(req.max_tokens, room)
        stop_ids = frozenset(req.stop_token_ids) | (frozenset() if req.ignore_eos else self.eos_token_ids)
        text = TextStream(tok, req.stop) if tok is not None and req.output == "text" else None
        return Sequence(rid, req, prompt_ids, stop_ids, text)
