"""One response as a record: an explicit state machine, its output items, and what the listener has heard.
``response_lifecycle`` drives it; this module holds no session state.

States::

    HELD ──release──▶ ACTIVE ──▶ DONE | CANCELLED | FAILED
      └──discard──▶ DISCARDED (never seen by the client)

A HELD response was started from a speculative transcript during the end-of-turn silence: it computes, but
its events wait in ``held_events`` until the turn ends as guessed (release) or are dropped (discard).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from omni_rt.audio.formats import FORMAT_RATES
from omni_rt.session.conversation import Item


class ResponseState(enum.Enum):
    HELD = "held"
    ACTIVE = "active"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"
    DISCARDED = "discarded"

    @property
    def final(self) -> bool:
        return self in (ResponseState.DONE, ResponseState.CANCELLED, ResponseState.FAILED, ResponseState.DISCARDED)


# the GA protocol's response.status for each final state
_WIRE_STATUS = {ResponseState.DONE: "completed", ResponseState.CANCELLED: "cancelled", ResponseState.FAILED: "failed"}


@dataclass
class Response:
    id: str
    item: Item
    modalities: list[str]
    output_format: str
    voice: str
    max_output_tokens: int | str = "inf"
    metadata: dict[str, str] | None = None
    in_conversation: bool = True  # False for out-of-band responses (conversation: "none")
    state: ResponseState = ResponseState.ACTIVE
    reason: str | None = None  # why it was cancelled / how it failed
    started: float = field(default_factory=time.perf_counter)
    turn_end: float | None = None  # perf_counter of the end-of-turn decision it answers
    first_audio: float | None = None
    text: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    clause_start_ms: float = 0.0
    held_events: list[dict[str, Any]] = field(default_factory=list)
    spec_text: str = ""  # the speculative transcript a held response answers
    pending_final: tuple[ResponseState, str | None] | None = None  # finished while still held
    calls: dict[int, Item] = field(default_factory=dict)  # function_call items by the engine's call index
    output: list[Item] = field(default_factory=list)  # output items in the order they were announced
    single_call: bool = False  # parallel_tool_calls false: calls after the first are left out
    message_refused: bool = False  # the conversation had no room for the message item: the answer failed without it

    def output_index(self, item: Item) -> int:
        return self.output.index(item)

    @property
    def message_open(self) -> bool:
        """Whether the assistant message item was announced (a response that only calls tools has none)."""
        return self.item in self.output

    @property
    def speaks(self) -> bool:
        return "audio" in self.modalities

    @property
    def content_type(self) -> str:
        return "output_audio" if self.speaks else "output_text"

    def transition(self, new: ResponseState, reason: str | None = None) -> bool:
        """Move to ``new``; a final state is never left. Returns False (and changes nothing) when it was."""
        if self.state.final:
            return False
        self.state, self.reason = new, reason
        return True

    @property
    def wire_status(self) -> str:
        return _WIRE_STATUS.get(self.state, "in_progress")

    def render(self, conversation_id: str) -> dict[str, Any]:
        """The ``response`` object of response.created / response.done."""
        status = self.wire_status
        out: dict[str, Any] = {
            "id": self.id, "object": "realtime.response", "status": status,
            "conversation_id": conversation_id if self.in_conversation else None,
            "output_modalities": list(self.modalities),
            "output": [it.render() for it in self.output] if status != "in_progress" else [],
            "audio": {"output": {"format": {"type": self.output_format,
                                            **({"rate": FORMAT_RATES[self.output_format]} if self.output_format == "audio/pcm" else {})},
                                 "voice": self.voice}},
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata,
        }
        if self.state is ResponseState.CANCELLED:
            reason = self.reason if self.reason in ("turn_detected", "client_cancelled") else "client_cancelled"
            out["status_details"] = {"type": "cancelled", "reason": reason}
        elif self.state is ResponseState.FAILED:
            out["status_details"] = {"type": "failed", "error": {"type": "server_error", "code": self.reason or "error"}}
        if self.usage:
            inp = int(self.usage.get("prompt_tokens") or 0)
            outp = int(self.usage.get("completion_tokens") or 0)
            out["usage"] = {"input_tokens": inp, "output_tokens": outp, "total_tokens": inp + outp,
                            "input_token_details": {"cached_tokens": int(self.usage.get("cached_tokens") or 0), "text_tokens": inp},
                            "output_token_details": {"text_tokens": outp}}
        return out

    def ttfa_ms(self) -> float | None:
        if self.first_audio is None or self.turn_end is None:
            return None
        return (self.first_audio - self.turn_end) * 1000.0


def truncate_text(item: Item, audio_end_ms: int) -> str:
    """The part of an assistant answer the listener heard: whole clauses before ``audio_end_ms`` plus the
    spoken fraction of the clause in progress (by time, word-aligned)."""
    if not item.clause_ms:
        full = item.text()
        if item.audio_ms <= 0:
            return ""
        words = full.split()
        return " ".join(words[: int(len(words) * min(1.0, audio_end_ms / item.audio_ms))])
    heard: list[str] = []
    bounds = item.clause_ms + [(item.audio_ms, "")]
    for (start, clause), (end, _) in zip(bounds, bounds[1:]):
        if audio_end_ms >= end:
            heard.append(clause)
        elif audio_end_ms > start:
            words = clause.split()
            frac = (audio_end_ms - start) / max(1, end - start)
            heard.append(" ".join(words[: int(len(words) * frac)]))
            break
        else:
            break
    return " ".join(w for w in heard if w).strip()
