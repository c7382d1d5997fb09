"""Client event handlers: one function per GA client event, each validating its fields and acting on the part
that owns the behaviour (the conversation, the response lifecycle), which it is handed, never the whole session.
A refusal raises ``ProtocolError`` naming the ``param``; the session turns it into an ``error``. The dispatch
table (event type -> handler, with the parts each gets) is ``RealtimeSession``'s, in ``core``."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Callable

from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session.conversation import Conversation, Item, check_item_tokens, item_from_client
from omni_rt.session.options import SessionLimits
from omni_rt.session.response_lifecycle import ResponseLifecycle
from omni_rt.session.response_state import truncate_text

Send = Callable[[dict[str, Any]], None]


def session_update(event: dict[str, Any], config: SessionConfig, limits: SessionLimits) -> SessionConfig:
    """The new config, validated fully before anything of it applies (the caller applies it)."""
    if "session" not in event:
        raise ProtocolError("missing_required_parameter", "session.update needs 'session'", "session")
    candidate = config.copy()
    candidate.update(event["session"])
    if candidate.instructions != config.instructions:
        _check_instructions(limits, candidate.instructions, "session.instructions")
    return candidate


def _check_instructions(lim: SessionLimits, text: str, param: str) -> None:
    """Instructions open every prompt: larger than any prompt can hold, every answer would fail."""
    if text and lim.item_tokens is not None and lim.max_item_tokens > 0 and (n := lim.item_tokens(text)) > lim.max_item_tokens:
        raise ProtocolError("context_length_exceeded", f"{param} is about {n} tokens; at most {lim.max_item_tokens} fit a "
                            f"prompt of this thinker{lim.item_budget_note}", param)


def input_audio_append(event: dict[str, Any]) -> bytes:
    """The appended audio, still in the session's input format."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise ProtocolError("missing_required_parameter", "input_audio_buffer.append needs base64 'audio'", "audio")
    try:
        return base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_base64", "'audio' is not valid base64", "audio") from None


def input_audio_commit(event: dict[str, Any]) -> str | None:
    """The commit's event id (an empty-buffer error from the audio-in stage names it)."""
    eid = event.get("event_id")
    return eid if isinstance(eid, str) else None


def _check_size(lim: SessionLimits, item: Item, prefix: str = "item") -> Item:
    if lim.item_tokens is not None and lim.max_item_tokens > 0:
        check_item_tokens(item, lim.max_item_tokens, lim.item_tokens, lim.item_budget_note, prefix)
    return item


def item_create(event: dict[str, Any], conversation: Conversation, limits: SessionLimits, send: Send) -> None:
    item = _check_size(limits, item_from_client(event.get("item")))
    if item.type == "function_call_output" and conversation.call(item.call_id) is None:
        raise ProtocolError("invalid_value", f"no function_call with call_id '{item.call_id}' in the conversation",
                            "item.call_id")
    prev = event.get("previous_item_id")
    if prev is not None and not isinstance(prev, str):
        raise ProtocolError("invalid_type", "previous_item_id must be a string", "previous_item_id")
    actual_prev = conversation.add(item, prev)
    send({"type": "conversation.item.added", "previous_item_id": actual_prev, "item": item.render()})
    send({"type": "conversation.item.done", "previous_item_id": actual_prev, "item": item.render()})


def item_delete(event: dict[str, Any], conversation: Conversation, send: Send) -> None:
    item_id = event.get("item_id")
    if not isinstance(item_id, str):
        raise ProtocolError("missing_required_parameter", "conversation.item.delete needs 'item_id'", "item_id")
    conversation.delete(item_id)
    send({"type": "conversation.item.deleted", "item_id": item_id})


def item_retrieve(event: dict[str, Any], conversation: Conversation, send: Send) -> None:
    item_id = event.get("item_id")
    if not isinstance(item_id, str):
        raise ProtocolError("missing_required_parameter", "conversation.item.retrieve needs 'item_id'", "item_id")
    send({"type": "conversation.item.retrieved", "item": conversation.get(item_id).render()})


def item_truncate(event: dict[str, Any], conversation: Conversation, responses: ResponseLifecycle, send: Send) -> None:
    item_id = event.get("item_id")
    audio_end_ms = event.get("audio_end_ms")
    if not isinstance(item_id, str):
        raise ProtocolError("missing_required_parameter", "conversation.item.truncate needs 'item_id'", "item_id")
    if not isinstance(audio_end_ms, int) or isinstance(audio_end_ms, bool) or audio_end_ms < 0:
        raise ProtocolError("invalid_value", "audio_end_ms must be a non-negative integer", "audio_end_ms")
    content_index = event.get("content_index", 0)
    item = conversation.get(item_id)
    if item.role != "assistant":
        raise ProtocolError("invalid_value", "only assistant audio items can be truncated", "item_id")
    if content_index != 0:
        raise ProtocolError("invalid_value", "content_index must be 0", "content_index")
    if audio_end_ms > item.audio_ms:
        raise ProtocolError("invalid_value", f"audio_end_ms {audio_end_ms} is past the item's audio ({item.audio_ms} ms)", "audio_end_ms")
    item.content = [{"type": "output_audio", "transcript": truncate_text(item, audio_end_ms)}]
    item.audio_ms = audio_end_ms
    item.status = "incomplete"
    send({"type": "conversation.item.truncated", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms})
    if responses.active is not None and responses.active.item is item:  # the listener stopped it: the answer ends here
        responses.cancel_active("turn_detected")


RESPONSE_FIELDS = {"instructions", "output_modalities", "modalities", "max_output_tokens", "max_response_output_tokens",
                   "audio", "voice", "output_audio_format", "tools", "tool_choice", "metadata", "conversation", "input",
                   "temperature", "prompt", "parallel_tool_calls", "reasoning"}
MAX_METADATA_KEYS = 16


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items()):
        raise ProtocolError("invalid_value", f"metadata must map at most {MAX_METADATA_KEYS} string keys (<= 64 chars) to "
                            "strings (<= 512 chars)", "response.metadata")
    return dict(value)


def _input_items(value: Any, conversation: Conversation, limits: SessionLimits) -> list[Item]:
    if not isinstance(value, list):
        raise ProtocolError("invalid_type", "response.input must be a list of items", "response.input")
    items = []
    for i, raw in enumerate(value):
        if isinstance(raw, dict) and raw.get("type") == "item_reference":
            try:
                items.append(conversation.get(raw.get("id")))
            except ProtocolError:
                raise ProtocolError("item_not_found", f"response.input[{i}] references no item '{str(raw.get('id'))[:64]}'",
                                    f"response.input[{i}].id") from None
            continue
        try:
            items.append(_check_size(limits, item_from_client(raw)))
        except ProtocolError as exc:
            raise ProtocolError(exc.code, exc.message, f"response.input[{i}]" + (exc.param or "")[4:]) from None
    return items


def response_create(event: dict[str, Any], config: SessionConfig, limits: SessionLimits, conversation: Conversation,
                    responses: ResponseLifecycle) -> None:
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
    if isinstance(params.get("audio"), dict):  # a response has output audio only
        for key in params["audio"]:
            if key != "output":
                raise ProtocolError("unknown_parameter", f"unknown parameter 'response.audio.{str(key)[:40]}'",
                                    f"response.audio.{str(key)[:40]}")
    cfg = config.copy()
    try:
        cfg.update({k: v for k, v in params.items() if k in ("instructions", "output_modalities", "modalities", "max_output_tokens",
                                                              "max_response_output_tokens", "audio", "voice", "output_audio_format",
                                                              "temperature", "prompt", "parallel_tool_calls", "reasoning")})
        if "tools" in params or "tool_choice" in params:
            cfg._set_tools(params.get("tools", cfg.tools), params.get("tool_choice", cfg.tool_choice), prefix="response")
    except ProtocolError as exc:
        param = exc.param or ""
        raise ProtocolError(exc.code, exc.message, "response." + param.removeprefix("session.").removeprefix("response.")) from None
    if "instructions" in params:
        _check_instructions(limits, cfg.instructions, "response.instructions")
    target = params.get("conversation", "auto")
    if target not in ("auto", "none"):
        raise ProtocolError("invalid_value", "response.conversation must be 'auto' or 'none'", "response.conversation")
    input_items = _input_items(params["input"], conversation, limits) if "input" in params else None
    responses.start(cfg, metadata=_metadata(params.get("metadata")), in_conversation=target == "auto", input_items=input_items)


def response_cancel(event: dict[str, Any], responses: ResponseLifecycle) -> None:
    rid = event.get("response_id")
    responses.cancel(rid if isinstance(rid, str) else None)
