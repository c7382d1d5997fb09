"""The GPT-Live session object (``session.start.session``), validated strictly, and its resolved resource.

GPT-Live's session object is strict: an unknown field is refused with ``unknown_parameter`` naming it, and a
field this server cannot honour (Responses or Decisions delegation, recordings, WebRTC-only fields on the
WebSocket) is refused by name, never silently ignored. ``LiveConfig.parse`` returns the config in force, and
``realtime_session()`` the Realtime ``session.update`` payload the session core runs with: the Live protocol
is a layer over the same ``RealtimeSession`` (``omni_rt.session.live``), not a second implementation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.fields import json_object, known_keys
from omni_rt.realtime.session_config import MAX_INSTRUCTIONS_CHARS

# openai-python's BuiltInVoice (types/live/built_in_voice.py): accepted by name, spoken by the preset's voice
LIVE_VOICES = frozenset({
    "alloy", "ash", "aube", "ballad", "beacon", "bossa", "brise", "cedar", "cinder", "coral", "delta", "echo", "flitz",
    "gleam", "harema", "juni", "marin", "meridian", "nira", "noeul", "nuri", "quartz", "ripple", "sage", "shimmer",
    "shitan", "sillage", "stone", "tempo", "verse", "vesper", "willow"})
DEFAULT_VOICE = "marin"
SESSION_FIELDS = ("model", "instructions", "input", "audio", "delegation", "store", "client", "safety_identifier",
                  "triggers", "wake_policy", "idle_timeout_s")
MAX_MODEL_CHARS = 128
MAX_SAFETY_ID_CHARS = 64
MAX_INPUT_ITEMS = 128  # the protocol's cap on startup history
MAX_INPUT_TEXT_CHARS = 32 * 1024  # all startup history together (the protocol's 8,192 tokens at ~4 chars a token)
SESSION_LIFETIME_S = 2 * 3600  # a Live session expires two hours after it starts (session.closed reason "expired")
# the Live wire formats: (type, rate) -> the Realtime format the session core runs with (16 kHz PCM is resampled
# to 24 kHz at the Live edge; G.711 passes through)
LIVE_FORMATS = {("audio/pcm", 24000): "audio/pcm", ("audio/pcm", 16000): "audio/pcm",
                ("audio/pcmu", 8000): "audio/pcmu", ("audio/pcma", 8000): "audio/pcma"}
ROLE_CONTENT = {"developer": ("input_text",), "user": ("input_text",), "assistant": ("output_text", "text")}
CORE_ROLE = {"developer": "system", "user": "user", "assistant": "assistant"}


@dataclass
class LiveConfig:
    model: str
    instructions: str | None = None
    input: list[dict[str, Any]] = field(default_factory=list)
    format_type: str = "audio/pcm"
    rate: int = 24000
    voice: str | dict[str, str] = DEFAULT_VOICE
    delegation: dict[str, Any] = field(default_factory=lambda: {"type": "client"})
    store: bool | None = None
    safety_identifier: str | None = None

    @property
    def core_format(self) -> str:
        return LIVE_FORMATS[(self.format_type, self.rate)]

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.format_type == "audio/pcm" else 1

    @classmethod
    def parse(cls, session: Any) -> "LiveConfig":
        """A ``session.start`` session object -> the config; raises ``ProtocolError`` naming the first bad field."""
        if not isinstance(session, dict):
            raise ProtocolError("missing_required_parameter" if session is None else "invalid_type",
                                "session.start needs a 'session' object", "session")
        known_keys(session, SESSION_FIELDS, "session")
        model = session.get("model")
        if model is None:
            raise ProtocolError("missing_required_parameter", "session.model is required (e.g. 'gpt-live-1')", "session.model")
        if not isinstance(model, str) or not model or len(model) > MAX_MODEL_CHARS:
            raise ProtocolError("invalid_value", f"session.model must be a string of 1..{MAX_MODEL_CHARS} characters", "session.model")
        cfg = cls(model=model)
        instructions = session.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise ProtocolError("invalid_type", "session.instructions must be a string or null", "session.instructions")
            if len(instructions) > MAX_INSTRUCTIONS_CHARS:
                raise ProtocolError("string_above_max_length", f"session.instructions holds {len(instructions)} characters; "
                                    f"at most {MAX_INSTRUCTIONS_CHARS}", "session.instructions")
            cfg.instructions = instructions
        cfg.input = parse_input(session.get("input"))
        audio = json_object(session.get("audio"), "session.audio")
        known_keys(audio, ("format", "output"), "session.audio")
        if audio.get("format") is not None:
            cfg.format_type, cfg.rate = parse_live_format(audio["format"])
        out = json_object(audio.get("output"), "session.audio.output")
        known_keys(out, ("voice",), "session.audio.output")
        if out.get("voice") is not None:
            cfg.voice = parse_voice(out["voice"])
        cfg.delegation = parse_delegation(session.get("delegation"), "session.delegation")
        store = session.get("store")
        if store is not None:
            if not isinstance(store, bool):
                raise ProtocolError("invalid_type", "session.store must be a boolean", "session.store")
            if store:
                raise ProtocolError("unsupported_value", "session.store: this server keeps no recordings", "session.store")
            cfg.store = store
        sid = session.get("safety_identifier")
        if sid is not None:
            if not isinstance(sid, str) or len(sid) > MAX_SAFETY_ID_CHARS:
                raise ProtocolError("invalid_value", f"session.safety_identifier must be a string of at most {MAX_SAFETY_ID_CHARS} "
                                    "characters", "session.safety_identifier")
            cfg.safety_identifier = sid
        for key, why in (("client", "session.client (data-channel permissions) applies to WebRTC sessions only"),
                         ("wake_policy", "session.wake_policy (standby) applies to WebRTC sessions only"),
                         ("idle_timeout_s", "session.idle_timeout_s (standby) applies to WebRTC sessions only"),
                         ("triggers", "session.triggers belongs to Decisions delegation, which this server does not run")):
            if session.get(key) is not None:
                raise ProtocolError("unsupported_value", why, f"session.{key}")
        return cfg

    def resource(self, session_id: str, expires_at: int) -> dict[str, Any]:
        """The resolved session as ``session.started`` / ``.updated`` / ``.closed`` carry it."""
        out: dict[str, Any] = {
            "id": session_id, "expires_at": expires_at, "status": "active", "model": self.model,
            "instructions": self.instructions,
            "audio": {"format": {"type": self.format_type, "rate": self.rate}, "output": {"voice": copy.deepcopy(self.voice)}},
            "delegation": copy.deepcopy(self.delegation), "input": copy.deepcopy(self.input)}
        if self.store is not None:
            out["store"] = self.store
        if self.safety_identifier is not None:
            out["safety_identifier"] = self.safety_identifier
        return out


def parse_live_format(value: Any) -> tuple[str, int]:
    param = "session.audio.format"
    fmt = json_object(value, param)
    known_keys(fmt, ("type", "rate"), param)
    ftype, rate = fmt.get("type"), fmt.get("rate")
    if ftype not in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        raise ProtocolError("invalid_value", "session.audio.format.type must be 'audio/pcm', 'audio/pcmu' or 'audio/pcma'",
                            f"{param}.type")
    if rate is None:
        rate = 24000 if ftype == "audio/pcm" else 8000
    if isinstance(rate, bool) or not isinstance(rate, int) or (ftype, rate) not in LIVE_FORMATS:
        allowed = "16000 or 24000" if ftype == "audio/pcm" else "8000"
        raise ProtocolError("invalid_value", f"session.audio.format.rate for {ftype} must be {allowed}", f"{param}.rate")
    return ftype, rate


def parse_voice(voice: Any) -> str | dict[str, str]:
    param = "session.audio.output.voice"
    if isinstance(voice, dict):
        known_keys(voice, ("id",), param)
        raise ProtocolError("unsupported_value", "custom voices ({'id': ...}) are not available on this server; use a "
                            "built-in voice name", f"{param}.id")
    if not isinstance(voice, str) or voice not in LIVE_VOICES:
        raise ProtocolError("invalid_value", f"voice {str(voice)[:40]!r} is not a GPT-Live built-in voice", param)
    return voice


def parse_delegation(value: Any, param: str, current: str | None = None,
                     current_responses: dict[str, Any] | None = None) -> dict[str, Any]:
    """``null`` / ``{type: "client"}`` / ``{type: "responses", responses: {...}}``. ``current``: the type in force
    (``session.update`` may omit the type, and may not change it)."""
    if value is None:
        return {"type": "client"}
    deleg = json_object(value, param)
    dtype = deleg.get("type", current)
    if current is not None and dtype != current:
        raise ProtocolError("invalid_value", f"{param}.type cannot change after session.start (it is '{current}')", f"{param}.type")
    if dtype == "client":
        known_keys(deleg, ("type", "acknowledgement_delay_ms"), param)
        if deleg.get("acknowledgement_delay_ms") is not None:
            raise ProtocolError("unsupported_value", "acknowledgement_delay_ms is not supported: the voice speaks its own "
                                "preamble when it delegates", f"{param}.acknowledgement_delay_ms")
        return {"type": "client"}
    if dtype == "responses":
        known_keys(deleg, ("type", "responses", "acknowledgement_delay_ms"), param)
        if deleg.get("acknowledgement_delay_ms") is not None:
            raise ProtocolError("unsupported_value", "acknowledgement_delay_ms is not supported: the voice speaks its own "
                                "preamble when it delegates", f"{param}.acknowledgement_delay_ms")
        return {"type": "responses", "responses": parse_responses(deleg.get("responses"), f"{param}.responses",
                                                                  current_responses)}
    if dtype == "decisions":
        raise ProtocolError("unsupported_value", "decisions delegation is not supported by this server; use "
                            "{'type': 'client'} or {'type': 'responses'}", f"{param}.type")
    raise ProtocolError("invalid_value", f"{param}.type must be 'client' or 'responses'", f"{param}.type")


RESPONSES_SUPPORTED = ("model", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens")
# Responses fields this server does not run: refused by name when given a value
RESPONSES_REFUSED = ("reasoning", "service_tier", "text", "metadata", "prompt_cache_key", "safety_identifier", "store",
                     "truncation", "temperature", "top_p", "include", "prompt", "background", "max_tool_calls",
                     "previous_response_id", "conversation", "user", "top_logprobs", "stream_options")


def parse_responses(value: Any, param: str, current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Responses backend's settings (``delegation.responses``); ``current``: those in force, which a sparse
    ``session.update`` changes field by field (a start must name the ``model``)."""
    from omni_rt.engine.tools.schema import parse_tool_choice, validate_tools

    given = json_object(value, param)
    known_keys(given, RESPONSES_SUPPORTED + RESPONSES_REFUSED, param)
    for key in RESPONSES_REFUSED:
        if given.get(key) is not None:
            raise ProtocolError("unsupported_value", f"{param}.{key} is not supported by this server's delegation backend",
                                f"{param}.{key}")
    out = dict(current or {"instructions": None, "tools": [], "tool_choice": "auto", "parallel_tool_calls": None,
                           "max_output_tokens": None})
    for key in RESPONSES_SUPPORTED:
        if key in given and given[key] is not None:
            out[key] = copy.deepcopy(given[key])
    if not isinstance(out.get("model"), str) or not out["model"] or len(out["model"]) > MAX_MODEL_CHARS:
        raise ProtocolError("missing_required_parameter" if out.get("model") is None else "invalid_value",
                            f"{param}.model must name the backend model (1..{MAX_MODEL_CHARS} characters)", f"{param}.model")
    if out["instructions"] is not None and (not isinstance(out["instructions"], str) or len(out["instructions"]) > MAX_INSTRUCTIONS_CHARS):
        raise ProtocolError("invalid_value", f"{param}.instructions must be a string of at most {MAX_INSTRUCTIONS_CHARS} characters",
                            f"{param}.instructions")
    tools = out["tools"]
    if not isinstance(tools, list) or any(not isinstance(t, dict) or t.get("type") != "function" for t in tools):
        raise ProtocolError("unsupported_value", f"{param}.tools: only function tools are supported (no hosted tools)",
                            f"{param}.tools")
    try:
        validate_tools(tools)
        out["tool_choice"] = parse_tool_choice(out["tool_choice"], tools)
    except ValueError as exc:
        raise ProtocolError("invalid_value", str(exc), f"{param}.tools") from None
    ptc = out["parallel_tool_calls"]
    if ptc is not None and not isinstance(ptc, bool):
        raise ProtocolError("invalid_type", f"{param}.parallel_tool_calls must be a boolean", f"{param}.parallel_tool_calls")
    mot = out["max_output_tokens"]
    if mot is not None and (isinstance(mot, bool) or not isinstance(mot, int) or not 16 <= mot <= 4096):
        raise ProtocolError("invalid_value", f"{param}.max_output_tokens must be an integer 16..4096", f"{param}.max_output_tokens")
    return out


def parse_input(items: Any) -> list[dict[str, Any]]:
    """Startup history: messages of the developer, the user and the assistant, one text part each."""
    param = "session.input"
    if items is None:
        return []
    if not isinstance(items, list):
        raise ProtocolError("invalid_type", "session.input must be a list of messages", param)
    if len(items) > MAX_INPUT_ITEMS:
        raise ProtocolError("array_above_max_length", f"session.input holds {len(items)} messages; at most {MAX_INPUT_ITEMS}", param)
    out, total = [], 0
    for i, item in enumerate(items):
        p = f"{param}[{i}]"
        item = json_object(item, p)
        known_keys(item, ("type", "role", "content", "id", "status"), p)
        if item.get("type", "message") != "message":
            raise ProtocolError("invalid_value", f"{p}.type must be 'message'", f"{p}.type")
        role = item.get("role")
        if role not in ROLE_CONTENT:
            raise ProtocolError("invalid_value", f"{p}.role must be 'developer', 'user' or 'assistant'", f"{p}.role")
        content = item.get("content")
        if not isinstance(content, list) or len(content) != 1:
            raise ProtocolError("invalid_value", f"{p}.content must hold exactly one text part", f"{p}.content")
        part = json_object(content[0], f"{p}.content[0]")
        known_keys(part, ("type", "text"), f"{p}.content[0]")
        ptype = part.get("type", ROLE_CONTENT[role][0])
        if ptype not in ROLE_CONTENT[role]:
            raise ProtocolError("invalid_value", f"{p}.content[0].type must be one of {list(ROLE_CONTENT[role])} for role "
                                f"'{role}'", f"{p}.content[0].type")
        text = part.get("text")
        if not isinstance(text, str):
            raise ProtocolError("invalid_type", f"{p}.content[0].text must be a string", f"{p}.content[0].text")
        total += len(text)
        if total > MAX_INPUT_TEXT_CHARS:
            raise ProtocolError("string_above_max_length", f"session.input holds over {MAX_INPUT_TEXT_CHARS} characters of text",
                                param)
        for key in ("id", "status"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise ProtocolError("invalid_type", f"{p}.{key} must be a string", f"{p}.{key}")
        if item.get("status") not in (None, "incomplete", "completed"):
            raise ProtocolError("invalid_value", f"{p}.status must be 'incomplete' or 'completed'", f"{p}.status")
        out.append(copy.deepcopy(item))
    return out


def core_item(item: dict[str, Any]) -> dict[str, Any]:
    """A startup history message as the Realtime conversation item the session core holds."""
    role = CORE_ROLE[item["role"]]
    ctype = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": ctype, "text": item["content"][0]["text"]}]}
