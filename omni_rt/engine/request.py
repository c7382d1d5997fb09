"""The ``new_request`` payload every AR-scheduler backend accepts, parsed and validated in one place.

A bad payload raises ``ValueError`` with a message meant for the client; the scheduler turns it into an
``error`` message for that request only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omni_rt.engine.tools import check_message, parse_tool_choice, validate_tools

OutputMode = Literal["text", "tokens"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling. ``temperature <= 0`` means greedy (the default: a voice thinker wants stable answers)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


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
    tools: list[dict[str, Any]] | None = None  # Realtime flat function tools (omni_rt.engine.tools)
    tool_choice: Any = "auto"  # "auto" | "none" | "required" | {"type": "function", "name": str}
    parallel_tool_calls: bool | None = None  # a forced choice decodes one call unless True



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


def parse_request(data: Any, default_max_tokens: int) -> GenRequest:
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
    seed = data.get("seed")
    tools = data.get("tools") or None
    if tools is not None:
        validate_tools(tools)
    tool_choice = parse_tool_choice(data.get("tool_choice"), tools)
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError("'parallel_tool_calls' must be a boolean")
    return GenRequest(
        prompt_ids=prompt_ids,
        messages=messages,
        max_tokens=_num(data, "max_tokens", int, default_max_tokens, 1),
        sampling=SamplingParams(
            temperature=_num(data, "temperature", float, 0.0, 0.0, 100.0),
            top_p=_num(data, "top_p", float, 1.0, 1e-6, 1.0),
            top_k=_num(data, "top_k", int, 0, 0),
            seed=None if seed is None else _num(data, "seed", int, None),
        ),
        session_id=session_id,
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        ignore_eos=bool(data.get("ignore_eos", False)),
        output=output,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
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
