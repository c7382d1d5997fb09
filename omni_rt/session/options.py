"""What a session is created with: the server's options and its per-session caps (re-exported by ``core``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class SessionLimits:
    """Per-session caps; each refusal names its number."""

    max_append_bytes: int = 1 << 20  # one append: ~21 s of 24 kHz PCM16
    max_outgoing_bytes: int = 16 << 20  # queued for a client that does not read: then the session is closed
    max_response_tokens: int = 96
    # the thinker's budget for one item (omni_rt.engine.prompt.history): tokens of a text, and the most one item may
    # hold; an item above it could never be part of a prompt and is refused at conversation.item.create
    item_tokens: Callable[[str], int] | None = None
    max_item_tokens: int = 0
    item_budget_note: str = ""


@dataclass(frozen=True)
class SessionOptions:
    model_name: str = "omni-rt"
    speculative_responses: bool = True
    beta_events: bool = False
    voices: tuple[str, ...] = ("default",)  # the preset's voices; the first is the default
    tool_preamble: str = "auto"  # "auto": a spoken phrase before a tool call without words of its own; "off"
    # tell the audio-in stage when an answer is heard, so speech over it is decided before it barges in
    backchannel_filter: bool = True
