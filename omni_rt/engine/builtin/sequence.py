"""Host-side state of one request in the AR scheduler: its tokens, text, stop checks and accounting."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from omni_rt.engine.prompt.detokenize import TextStream
from omni_rt.engine.prompt.request import GenRequest, result_payload


@dataclass(eq=False)
class Sequence:
    request_id: str
    req: GenRequest
    prompt_ids: list[int]
    stop_ids: frozenset[int]
    text: TextStream | None  # None in tokens mode (a codec talker: no detokenization at all)
    arrival: float = field(default_factory=time.perf_counter)
    generator: torch.Generator | None = None
    slot: int = -1
    sampled: list[int] = field(default_factory=list)  # every token picked, including a final EOS
    out_ids: list[int] = field(default_factory=list)  # what the client sees (no EOS)
    tokens_streamed: int = 0  # tokens mode: out_ids already sent as TokenDelta
    finish_reason: str | None = None
    first_token_at: float | None = None
    cached_tokens: int = 0
    tools: Any = None  # omni_rt.engine.tools.parser.ToolStream when the request offers tools

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def fed_tokens(self, kv_len: int) -> list[int]:
        """Token ids whose KV sits in the slot (prompt + generated tokens already fed back)."""
        return (self.prompt_ids + self.sampled)[:kv_len]

    def on_token(self, tok: int) -> tuple[str, list[int]]:
        """Account one sampled token; returns the (text delta, token ids) to publish as a ``stream`` chunk."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.sampled.append(tok)
        if tok in self.stop_ids:
            self.finish_reason = "stop"
            return (self.text.take(final=True) if self.text else ""), []
        self.out_ids.append(tok)
        if self.text is not None and self.text.push(tok):
            self.finish_reason = "stop"
        elif len(self.sampled) >= self.req.max_tokens:
            self.finish_reason = "length"
        delta = self.text.take(final=self.finished) if self.text else ""
        return delta, [tok]

    def result(self) -> dict[str, Any]:
        ttft = ((self.first_token_at or time.perf_counter()) - self.arrival) * 1000.0
        return result_payload(
            text=self.tools.preamble.text + "".join(self.tools.spoken) if self.tools is not None else (self.text.text if self.text else ""),
            token_ids=list(self.out_ids),
            finish_reason=self.finish_reason or "abort",
            prompt_tokens=len(self.prompt_ids),
            cached_tokens=self.cached_tokens,
            completion_tokens=len(self.sampled),
            ttft_ms=round(ttft, 3),
            tool_calls=self.tools.result_calls() if self.tools is not None else None,
        )
