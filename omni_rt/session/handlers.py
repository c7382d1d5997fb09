"""Client event handlers: one function per GA client event, each validating its fields and acting on the
session. A refusal raises ``ProtocolError`` naming the ``param``; the session turns it into an ``error``."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any, Callable

from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.events import BETA_CLIENT_ALIASES
from omni_rt.session.conversation import Item, check_item_tokens, item_from_client
from omni_rt.session.response import truncate_text

if TYPE_CHECKING:
    from omni_rt.session.core import RealtimeSession

Handler = Callable[["RealtimeSession", dict[str, Any]], None]


def session_update(s: "RealtimeSession", event: dict[str, Any]) -> None:
    if "session" not in event:
        raise ProtocolError("missing_required_parameter", "session.update needs 'session'", "session")
    candidate = s.config.copy()
    candidate.update(event["session"])  # validate fully before applying anything
    if candidate.instructions != s.config.instructions:
        _check_instructions(s, candidate.instructions, "session.instructions")
    s.apply_config(candidate)


def _check_instructions(s: "RealtimeSession", text: str, param: str) -> None:
    """Instructions open every prompt: larger than any prompt can hold, every answer would fail."""
    lim = s.limits
    if text and lim.item_tokens is not None and lim.max_item_tokens > 0 and (n := lim.item_tokens(text)) > lim.max_item_tokens:
        raise ProtocolError("context_length_exceeded", f"{param} is about {n} tokens; at most {lim.max_item_tokens} fit a "
                            f"prompt of this thinker{lim.item_budget_note}", param)


def input_audio_append(s: "RealtimeSession", event: dict[str, Any]) -> None:
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise ProtocolError("missing_required_parameter", "input_audio_buffer.append needs base64 'audio'", "audio")
    try:
        raw = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_base64", "'audio' is not valid base64", "audio") from None
    s.append_audio(raw)


def input_audio_commit(s: "RealtimeSession", event: dict[str, Any]) -> None:
    eid = event.get("event_id")
    s.commit(eid if isinstance(eid, str) else None)  # an empty-buffer error from the audio-in stage names it


def input_audio_clear(s: "RealtimeSession", event: dict[str, Any]) -> None:
    s.clear_audio()


def _check_size(s: "RealtimeSession", item: Item, prefix: str = "item") -> Item:
    lim = s.limits
    if lim.item_tokens is not None and lim.max_item_tokens > 0:
        check_item_tokens(item, lim.max_item_tokens, lim.item_tokens, lim.item_budget_note, prefix)
    return item


def item_create(s: "RealtimeSession", event: dict[str, Any]) -> None:
    item = _check_size(s, item_from_client(event.get("item")))
    if item.type == "function_call_output" and s.conversation.call(item.call_id) is None:
        raise ProtocolError("invalid_value", f"no function_call with call_id '{item.call_id}' in the conversation",
                            "item.call_id")
    prev = event.get("previous_item_id")
    if prev is not None and not isinstance(prev, str):
        raise ProtocolError("invalid_type", "previous_item_id must be a string", "previous_item_id")
    actual_prev = s.conversation.add(item, prev)
    s.send({"type": "conversation.item.added", "previous_item_id": actual_prev, "item": item.render()})
    s.send({"type": "conversation.item.done", "previous_item_id": actual_prev, "item": item.render()})


def item_delete(s: "RealtimeSession", event: dict[str, Any]) -> None:
    item_id = event.get("item_id")
    if not isinstance(item_id, str):
        raise ProtocolError("missing_required_parameter", "conversation.item.delete needs 'item_id'", "item_id")
    s.conversation.delete(item_id)
    s.send({"type": "conversation.item.deleted", "item_id": item_id})


def item_retrieve(s: "RealtimeSession", event: dict[str, Any]) -> None:
    item_id = event.get("item_id")
    if not isinstance(item_id, str):
        raise ProtocolError("missing_required_parameter", "conversation.item.retrieve needs 'item_id'", "item_id")
    s.send({"type": "conversation.item.retrieved", "item": s.conversation.get(item_id).render()})


def item_truncate(s: "RealtimeSession", event: dict[str, Any]) -> None:
    item_id = event.get("item_id")
    audio_end_ms = event.get("audio_end_ms")
    if not isinstance(item_id, str):
        raise ProtocolError("missing_required_parameter", "conversation.item.truncate needs 'item_id'", "item_id")
    if not isinstance(audio_end_ms, int) or isinstance(audio_end_ms, bool) or audio_end_ms < 0:
        raise ProtocolError("invalid_value", "audio_end_ms must be a non-negative integer", "audio_end_ms")
    content_index = event.get("content_index", 0)
    item = s.conversation.get(item_id)
    if item.role != "assistant":
        raise ProtocolError("invalid_value", "only assistant audio items can be truncated", "item_id")
    if content_index != 0:
        raise ProtocolError("invalid_value", "content_index must be 0", "content_index")
    if audio_end_ms > item.audio_ms:
        raise ProtocolError("invalid_value", f"audio_end_ms {audio_end_ms} is past the item's audio ({item.audio_ms} ms)", "audio_end_ms")
    item.content = [{"type": "output_audio", "transcript": truncate_text(item, audio_end_ms)}]
    item.audio_ms = audio_end_ms
    item.status = "incomplete"
    s.send({"type": "conversation.item.truncated", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms})
    if s.response is not None and s.response.item is item:  # the listener stopped it: the answer ends here
        s.cancel_active("turn_detected")


RESPONSE_FIELDS = {"instructions", "output_modalities", "modalities", "max_output_tokens", "max_response_output_tokens",
                   "audio", "voice", "output_audio_format", "tools", "tool_choice", "metadata", "conversation", "input",
                   "temperature", "prompt"}
MAX_METADATA_KEYS = 16


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items()):
        raise ProtocolError("invalid_value", f"metadata must map at most {MAX_METADATA_KEYS} string keys (<= 64 chars) to "
                            "strings (<= 512 chars)", "response.metadata")
    return dict(value)


def _input_items(s: "RealtimeSession", value: Any) -> list:
    if not isinstance(value, list):
        raise ProtocolError("invalid_type", "response.input must be a list of items", "response.input")
    items = []
    for i, raw in enumerate(value):
        if isinstance(raw, dict) and raw.get("type") == "item_reference":
            try:
                items.append(s.conversation.get(raw.get("id")))
            except ProtocolError:
                raise ProtocolError("item_not_found", f"response.input[{i}] references no item '{str(raw.get('id'))[:64]}'",
                                    f"response.input[{i}].id") from None
            continue
        try:
            items.append(_check_size(s, item_from_client(raw)))
        except ProtocolError as exc:
            raise ProtocolError(exc.code, exc.message, f"response.input[{i}]" + (exc.param or "")[4:]) from None
    return items


def response_create(s: "RealtimeSession", event: dict[str, Any]) -> None:
    """Absent or null fields inherit from the session; the others apply to this response only."""
    params = event.get("response")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError("invalid_type", "response must be an object", "response")
    params = {k: v for k, v in params.items() if v is not None}
    for key in params:
        if key not in RESPONSE_FIELDS:
            raise ProtocolError("unknown_parameter", f"response.{key[:40]} is not a response.create field", f"response.{key[:40]}")
    if params.get("temperature") is not None or params.get("prompt") is not None:
        key = "temperature" if "temperature" in params else "prompt"
        raise ProtocolError("unsupported_value", f"response.{key} is not supported by this server", f"response.{key}")
    cfg = s.config.copy()
    try:
        cfg.update({k: v for k, v in params.items() if k in ("instructions", "output_modalities", "modalities", "max_output_tokens",
                                                              "max_response_output_tokens", "audio", "voice", "output_audio_format")})
        if "tools" in params or "tool_choice" in params:
            cfg._set_tools(params.get("tools", cfg.tools), params.get("tool_choice", cfg.tool_choice), prefix="response")
    except ProtocolError as exc:
        param = exc.param or ""
        raise ProtocolError(exc.code, exc.message, "response." + param.removeprefix("session.").removeprefix("response.")) from None
    if "instructions" in params:
        _check_instructions(s, cfg.instructions, "response.instructions")
    conversation = params.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ProtocolError("invalid_value", "response.conversation must be 'auto' or 'none'", "response.conversation")
    input_items = _input_items(s, params["input"]) if "input" in params else None
    s.start_response(cfg, metadata=_metadata(params.get("metadata")), in_conversation=conversation == "auto", input_items=input_items)


def response_cancel(s: "RealtimeSession", event: dict[str, Any]) -> None:
    rid = event.get("response_id")
    s.cancel_response(rid if isinstance(rid, str) else None)


HANDLERS: dict[str, Handler] = {
    "session.update": session_update,
    "input_audio_buffer.append": input_audio_append,
    "input_audio_buffer.commit": input_audio_commit,
    "input_audio_buffer.clear": input_audio_clear,
    "conversation.item.create": item_create,
    "conversation.item.delete": item_delete,
    "conversation.item.retrieve": item_retrieve,
    "conversation.item.truncate": item_truncate,
    "response.create": response_create,
    "response.cancel": response_cancel,
}


def dispatch(s: "RealtimeSession", event: dict[str, Any]) -> None:
    etype = event.get("type")
    if not isinstance(etype, str):
        raise ProtocolError("missing_required_parameter", "event has no string 'type'", "type")
    handler = HANDLERS.get(BETA_CLIENT_ALIASES.get(etype, etype))
    if handler is None:
        raise ProtocolError("unknown_event", f"unknown event type '{etype[:64]}'", "type")
    handler(s, event)
