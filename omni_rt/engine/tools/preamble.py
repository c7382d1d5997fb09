"""Spoken preambles: a short line the voice says before a tool call, so the caller does not hear dead air while
the client runs the tool.

A voice answer that calls a tool has nothing to speak until the client has run the tool and asked again; a
tool that takes seconds is seconds of silence. When the model writes its own words before the call they are
the preamble (they stream to the talker as any text does). When it writes none, ``ToolPreamble`` puts a short
phrase chosen from the called function's name ("Let me look up the order status.") into the spoken text just
before the call's first chunk, so it reaches the talker as soon as the call's name is known. It is a request
option (``tool_preamble``: ``auto`` | ``off``, default ``off``): the Realtime session asks for it on spoken
answers; a plain chat-completions request never gets words its model did not write.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from omni_rt.contracts.payloads import TextDelta, ToolCallDelta, ToolCallDone

PreambleMode = Literal["auto", "off"]
PREAMBLE_MODES = ("auto", "off")

# verbs whose calls read or look something up: "Let me look up the <rest>."
_LOOKUP = {"get", "fetch", "lookup", "look", "find", "read", "check", "query", "list", "retrieve", "load", "show"}
_SEARCH = {"search", "browse"}
MAX_TOPIC_WORDS = 4  # a longer function name gets the generic phrase (a long topic is awkward to say)
DEFAULT_PHRASE = "Let me check that."


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def phrase_for(name: str) -> str:
    """A short phrase that fits a call of ``name``: ``get_order_status`` -> "Let me look up the order status.",
    ``search_flights`` -> "Let me search for flights.", anything else -> "Let me check that."."""
    words = _words(name)
    if len(words) < 2 or not all(w.isalpha() for w in words):
        return DEFAULT_PHRASE
    verb, topic = words[0], words[1:]
    if topic and topic[0] in ("up", "for"):
        topic = topic[1:]
    if not topic or len(topic) > MAX_TOPIC_WORDS:
        return DEFAULT_PHRASE
    if verb in _LOOKUP:
        return f"Let me look up the {' '.join(topic)}."
    if verb in _SEARCH:
        return f"Let me search for {' '.join(topic)}."
    return DEFAULT_PHRASE


def parse_preamble_mode(value: Any, param: str = "tool_preamble") -> PreambleMode:
    if value is None:
        return "off"
    if value not in PREAMBLE_MODES:
        raise ValueError(f"'{param}' must be one of {', '.join(PREAMBLE_MODES)}, got {str(value)[:40]!r}")
    return value


class ToolPreamble:
    """Per request: puts the phrase before the first tool-call chunk when no spoken text came before it."""

    def __init__(self, mode: PreambleMode) -> None:
        self.mode = mode
        self.spoken = False  # spoken text (the model's own, or the phrase) went out already
        self.text = ""  # the phrase put in, if any (part of what was spoken)

    def apply(self, chunks: list[Any]) -> list[Any]:
        """The chunks, with the phrase put in before the first call chunk when it is due."""
        if self.mode == "off" or self.spoken:
            return chunks
        out: list[Any] = []
        for chunk in chunks:
            if not self.spoken:
                if isinstance(chunk, TextDelta) and chunk.text.strip():
                    self.spoken = True
                elif isinstance(chunk, (ToolCallDelta, ToolCallDone)) and chunk.name:
                    self.spoken = True
                    self.text = phrase_for(chunk.name)
                    out.append(TextDelta(self.text, []))
            out.append(chunk)
        return out
