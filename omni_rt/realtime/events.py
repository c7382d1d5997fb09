"""Event names, ids and the parsing of one client message.

Parsing is where hostile input is stopped: the JSON decoder is the standard library's, but a 100 000-deep
array would hit Python's recursion limit inside it (and then anywhere the value is walked), and a lone UTF-16
surrogate (``"\\ud800"``) decodes to a ``str`` that cannot be encoded again, failing later when an event
carrying it is sent. Both are refused here with an ``error`` event, before anything else sees the message.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from omni_rt.realtime.errors import ProtocolError

MAX_JSON_DEPTH = 32  # Realtime events nest ~6 levels (session.audio.input.turn_detection, tool schemas deeper)

# GA name -> beta name, for clients that ask for beta events (OpenAI-Beta: realtime=v1 or ?beta=1)
BETA_SERVER_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
# beta client event names accepted on input
BETA_CLIENT_ALIASES = {"transcription_session.update": "session.update"}

_SURROGATE = re.compile("[\ud800-\udfff]")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def json_depth_exceeds(raw: str, limit: int) -> bool:
    """True when brackets outside strings nest deeper than ``limit`` (a linear scan, no recursion). Fewer
    brackets in all than ``limit`` cannot nest deeper: ``str.count`` runs in C, so the per-character scan runs
    only for a message with enough brackets to be deep (an audio append, the most frequent, has two)."""
    if raw.count("[") + raw.count("{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _check_strings(value: Any, path: str) -> None:
    """Refuse lone surrogates anywhere in the value (iterative walk: depth is already bounded)."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise ProtocolError("invalid_string", f"{p or 'message'} contains a lone UTF-16 surrogate", p or None)
        elif isinstance(v, dict):
            for k, item in v.items():
                if _SURROGATE.search(k):
                    raise ProtocolError("invalid_string", f"a key in {p or 'message'} contains a lone UTF-16 surrogate", p or None)
                stack.append((item, f"{p}.{k}" if p else k))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))


def parse_client_message(raw: str | bytes) -> dict[str, Any]:
    """One WebSocket message -> a client event dict with a string ``type``; raises ProtocolError."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("invalid_json", f"message is not valid UTF-8 (byte {exc.start})") from None
    if json_depth_exceeds(raw, MAX_JSON_DEPTH):
        raise ProtocolError("invalid_json", f"message nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        event = json.loads(raw)
    except json.JSONDecodeError as exc:  # where, not the decoder's own words
        raise ProtocolError("invalid_json", f"message is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ProtocolError("invalid_json", f"message nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(event, dict):
        raise ProtocolError("invalid_json", "message must be a JSON object with a 'type'")
    _check_strings(event, "")
    if not isinstance(event.get("type"), str):
        raise ProtocolError("missing_required_parameter", "event has no string 'type'", "type")
    return event


def event_id_of(raw: str | bytes) -> str | None:
    """Best effort: the ``event_id`` of a message we refused, to name it in the error."""
    try:
        value = json.loads(raw) if not json_depth_exceeds(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"), MAX_JSON_DEPTH) else None
    except Exception:  # noqa: BLE001 - a message that does not parse has no event id
        return None
    eid = value.get("event_id") if isinstance(value, dict) else None
    return eid if isinstance(eid, str) and len(eid) <= 128 and not _SURROGATE.search(eid) else None
