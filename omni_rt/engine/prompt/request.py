"""The ``new_request`` payload every AR-scheduler backend accepts, parsed and validated in one place.

A bad payload raises ``ValueError`` with a message meant for the client; the scheduler turns it into an
``error`` message for that request only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omni_rt.engine.tools.preamble import parse_preamble_mode
from omni_rt.engine.tools.schema import check_message, parse_tool_choice, validate_tools

OutputMode = Literal["text", "tokens"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling. ``temperature <= 0`` means greedy (the default: a voice thinker wants stable answers)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1 discourages any token already generated (CTRL / HF semantics)
    frequency_penalty: float = 0.0  # OpenAI semantics: logit -= f * count(token in the answer so far)
    presence_penalty: float = 0.0  # logit -= p if the token is in the answer so far
    no_repeat_ngram_size: int = 0  # > 0: never generate the same n-gram twice in one answer
    seed: int | None = None
    # earlier answers of the session as token ids up to their last word: an answer that is exactly one of them may
    # not end there (the built-in engine, omni_rt.engine.builtin.copy_ban); set by the engine, not by a client
    copies: tuple[tuple[int, ...], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty",
    "no_repeat_ngram_size", "seed",
)


@dataclass(frozen=True, slots=True)
class AnswerPolicyParams:
    """Voice answer limits (``None`` = no limit on that axis); see ``omni_rt.engine.prompt.answer_policy``."""

    max_sentences: int | None = None
    max_words: int | None = None

    @property
    def active(self) -> bool:
        return self.max_sentences is not None or self.max_words is not None


@dataclass(slots=True)
class GenRequest:
    prompt_ids: list[int] | None
    messages: list[dict[str, str]] | None
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    output: OutputMode = "text"
    token_chunk: int = 1  # tokens mode: stream ids in chunks of this many (a codec LM's 7-code frame: 1 message, not 7)
    tools: list[dict[str, Any]] | None = None  # Realtime flat function tools (omni_rt.engine.tools.schema)
    tool_choice: Any = "auto"  # "auto" | "none" | "required" | {"type": "function", "name": str}
    parallel_tool_calls: bool | None = None  # a forced choice decodes one call unless True
    tool_preamble: str = "off"  # "auto": a spoken phrase before a call the model wrote no words for (tools.preamble)
    answer_policy: AnswerPolicyParams | None = None  # None: raw text, no voice policy (a plain LM request)



def _num(data: dict, key: str, kind: type, default: Any, lo: float | None = None, hi: float | None = None) -> Any:
    value = data.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise ValueError(f"'{key}' must be a {kind.__name__}, got {value!r}")
    value = kind(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"'{key}' must be in [{lo}, {hi}], got {value}")
    return value


def parse_sampling(data: dict, defaults: dict | None = None) -> SamplingParams:
    """Sampling keys of a payload; a key that is absent or ``None`` takes the preset's default (``defaults``,
    itself validated the same way), then the dataclass default."""
    d = {**(defaults or {}), **{k: v for k, v in data.items() if k in SAMPLING_KEYS and v is not None}}
    seed = d.get("seed")
    return SamplingParams(
        temperature=_num(d, "temperature", float, 0.0, 0.0, 100.0),
        top_p=_num(d, "top_p", float, 1.0, 1e-6, 1.0),
        top_k=_num(d, "top_k", int, 0, 0),
        min_p=_num(d, "min_p", float, 0.0, 0.0, 1.0),
        repetition_penalty=_num(d, "repetition_penalty", float, 1.0, 0.01, 100.0),
        frequency_penalty=_num(d, "frequency_penalty", float, 0.0, -2.0, 2.0),
        presence_penalty=_num(d, "presence_penalty", float, 0.0, -2.0, 2.0),
        no_repeat_ngram_size=_num(d, "no_repeat_ngram_size", int, 0, 0, 64),
        seed=None if seed is None else _num(d, "seed", int, None, 0, 2**62),
    )


def parse_answer_policy(value: Any, default: AnswerPolicyParams | None = None) -> AnswerPolicyParams | None:
    """``answer_policy``: absent/``None`` -> ``default`` (the preset's; ``None`` = no policy, raw text); a dict
    -> exactly its limits, where a missing or ``None`` limit means no limit on that axis (``{}`` keeps only
    the rule that a ``max_tokens`` cut ends at a sentence boundary)."""
    if value is None:
        return default
    if isinstance(value, AnswerPolicyParams):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"'answer_policy' must be an object {{max_sentences, max_words}}, got {value!r}")
    unknown = set(value) - {"max_sentences", "max_words"}
    if unknown:
        raise ValueError(f"'answer_policy' has unknown keys {sorted(unknown)}; use max_sentences, max_words")
    return AnswerPolicyParams(
        max_sentences=_num(value, "max_sentences", int, None, 1, 1000),
        max_words=_num(value, "max_words", int, None, 1, 100000),
    )


def parse_request(
    data: Any,
    default_max_tokens: int,
    sampling_defaults: dict | None = None,
    default_policy: AnswerPolicyParams | None = None,
) -> GenRequest:
    """Validate a ``new_request`` payload (see the message contract in ``omni_rt.engine``)."""
    if not isinstance(data, dict):
        raise ValueError(f"new_request data must be a dict, got {type(data).__name__}")
    messages = data.get("messages")
    prompt_ids = data.get("prompt_ids")
    if (messages is None) == (prompt_ids is None):
        raise ValueError("new_request needs exactly one of 'messages' or 'prompt_ids'")
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        messages = [check_message(m, i) for i, m in enumerate(messages)]
    else:
        if not isinstance(prompt_ids, list) or not prompt_ids:
            raise ValueError("'prompt_ids' must be a non-empty list of ints")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt_ids):
            raise ValueError("'prompt_ids' must hold non-negative ints")
        prompt_ids = list(prompt_ids)
    stop = data.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError("'stop' must be a list of non-empty strings")
    stop_ids = data.get("stop_token_ids") or ()
    if not all(isinstance(t, int) for t in stop_ids):
        raise ValueError("'stop_token_ids' must be a list of ints")
    output = data.get("output", "text")
    if output not in ("text", "tokens"):
        raise ValueError(f"'output' must be 'text' or 'tokens', got {output!r}")
    session_id = data.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise ValueError("'session_id' must be a string")
    tools = data.get("tools") or None
    if tools is not None:
        validate_tools(tools)
    tool_choice = parse_tool_choice(data.get("tool_choice"), tools)
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError("'parallel_tool_calls' must be a boolean")
    preamble = parse_preamble_mode(data.get("tool_preamble"))
    return GenRequest(
        prompt_ids=prompt_ids,
        messages=messages,
        max_tokens=_num(data, "max_tokens", int, default_max_tokens, 1),
        sampling=parse_sampling(data, sampling_defaults),
        session_id=session_id,
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        ignore_eos=bool(data.get("ignore_eos", False)),
        output=output,
        token_chunk=_num(data, "token_chunk", int, 1, 1, 4096),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        tool_preamble=preamble,
        answer_policy=parse_answer_policy(data.get("answer_policy"), default_policy),
    )


def result_payload(
    *,
    text: str,
    token_ids: list[int],
    finish_reason: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    ttft_ms: float,
    tool_calls: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The ``result`` data every backend emits (one shape, so stages never branch on the backend).

    ``tool_calls`` (``[{"call_id", "name", "arguments"}]``, complete calls only) turns a natural end into
    ``finish_reason: "tool_calls"``; an aborted or cut-off answer keeps its own reason."""
    out = {
        "text": text,
        "token_ids": token_ids,
        "finish_reason": "tool_calls" if tool_calls and finish_reason == "stop" else finish_reason,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "prefilled_tokens": prompt_tokens - cached_tokens,
        "completion_tokens": completion_tokens,
        "ttft_ms": ttft_ms,
    }
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out
