"""OpenAI Realtime protocol pieces that are pure data: ids, session config parsing, beta aliases, errors.

Event shapes follow the GA models in openai-python's ``openai/types/realtime/`` (the test suite validates
every event the server sends against ``RealtimeServerEvent``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from omni_rt.session import turn_detection

SUPPORTED_FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}

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


class ProtocolError(Exception):
    """A client event we refuse; becomes an ``error`` event, the session lives on."""

    def __init__(self, code: str, message: str, param: str | None = None, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.type = type_


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def error_event(code: str, message: str, param: str | None = None, event_id: str | None = None,
                type_: str = "invalid_request_error") -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": type_, "code": code, "message": message, "param": param, "event_id": event_id},
    }


def parse_format(value: Any, param: str) -> str:
    """Accept GA ``{"type": "audio/pcm", "rate": 24000}`` and beta strings (``pcm16``, ``g711_ulaw``...)."""
    if isinstance(value, str):
        fmt = BETA_FORMATS.get(value, value)
        rate = 24000 if fmt == "audio/pcm" else None
    elif isinstance(value, dict):
        fmt = value.get("type", "audio/pcm")
        rate = value.get("rate")
    else:
        raise ProtocolError("invalid_value", f"{param} must be an object like {{'type': 'audio/pcm', 'rate': 24000}}", param)
    if fmt not in SUPPORTED_FORMATS:
        raise ProtocolError("unsupported_format", f"audio format '{fmt}' is not supported; use one of {list(SUPPORTED_FORMATS)}", param)
    if fmt == "audio/pcm" and rate not in (None, 24000):
        raise ProtocolError("unsupported_format", f"audio/pcm is only supported at 24000 Hz, not {rate}", param)
    return fmt


def format_object(fmt: str) -> dict[str, Any]:
    return {"type": fmt, "rate": 24000} if fmt == "audio/pcm" else {"type": fmt}


@dataclass
class SessionConfig:
    """What ``session.update`` can change; rendered back in ``session.created/updated``."""

    model: str = "omni-rt"
    instructions: str = (
        "You are a helpful voice assistant. Answer in one or two short spoken sentences, without lists or markup."
    )
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: str = "audio/pcm"
    output_format: str = "audio/pcm"
    turn_detection: dict[str, Any] | None = field(
        default_factory=lambda: {
            "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
            "create_response": True, "interrupt_response": True,
        }
    )
    transcription: dict[str, Any] | None = None
    voice: str = "alloy"
    max_output_tokens: int | str = "inf"
    beta_events: bool = False

    def render(self, session_id: str) -> dict[str, Any]:
        return {
            "type": "realtime",
            "id": session_id,
            "object": "realtime.session",
            "model": self.model,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "max_output_tokens": self.max_output_tokens,
            "audio": {
                "input": {
                    "format": format_object(self.input_format),
                    "turn_detection": dict(self.turn_detection) if self.turn_detection else None,
                    "transcription": dict(self.transcription) if self.transcription else None,
                    "noise_reduction": None,
                },
                "output": {"format": format_object(self.output_format), "voice": self.voice, "speed": 1.0},
            },
            "tools": [],
            "tool_choice": "auto",
        }

    def update(self, session: Any) -> None:
        """Apply a ``session.update`` payload (GA or beta field names); raises ProtocolError on bad values."""
        if not isinstance(session, dict):
            raise ProtocolError("invalid_value", "session must be an object", "session")
        if "instructions" in session:
            if not isinstance(session["instructions"], str):
                raise ProtocolError("invalid_type", "session.instructions must be a string", "session.instructions")
            self.instructions = session["instructions"]
        modalities = session.get("output_modalities", session.get("modalities"))
        if modalities is not None:
            if not isinstance(modalities, list) or not modalities or any(m not in ("text", "audio") for m in modalities):
                raise ProtocolError("invalid_value", "output_modalities must be ['audio'] or ['text']", "session.output_modalities")
            self.output_modalities = ["audio"] if "audio" in modalities else ["text"]
        if "max_output_tokens" in session or "max_response_output_tokens" in session:
            mot = session.get("max_output_tokens", session.get("max_response_output_tokens"))
            if not (mot == "inf" or (isinstance(mot, int) and not isinstance(mot, bool) and 1 <= mot <= 4096)):
                raise ProtocolError("invalid_value", "max_output_tokens must be an integer 1..4096 or 'inf'", "session.max_output_tokens")
            self.max_output_tokens = mot
        audio = session.get("audio") or {}
        if not isinstance(audio, dict):
            raise ProtocolError("invalid_type", "session.audio must be an object", "session.audio")
        inp = audio.get("input") or {}
        out = audio.get("output") or {}
        if "input_audio_format" in session:
            self.input_format = parse_format(session["input_audio_format"], "session.input_audio_format")
        if "format" in inp:
            self.input_format = parse_format(inp["format"], "session.audio.input.format")
        if "output_audio_format" in session:
            self.output_format = parse_format(session["output_audio_format"], "session.output_audio_format")
        if "format" in out:
            self.output_format = parse_format(out["format"], "session.audio.output.format")
        if "voice" in out or "voice" in session:
            self.voice = str(out.get("voice", session.get("voice")))
        td_key = "turn_detection"
        if td_key in inp or td_key in session:
            td = inp.get(td_key, session.get(td_key))
            self.turn_detection = self._parse_turn_detection(td)
        tr = inp.get("transcription", session.get("input_audio_transcription", "__absent__"))
        if tr != "__absent__":
            if tr is not None and not isinstance(tr, dict):
                raise ProtocolError("invalid_type", "transcription must be an object or null", "session.audio.input.transcription")
            self.transcription = tr

    @staticmethod
    def _parse_turn_detection(td: Any) -> dict[str, Any] | None:
        try:  # omni_rt.session.turn_detection owns the fields, defaults and eagerness
            return turn_detection.parse_turn_detection(td)
        except turn_detection.TurnDetectionError as exc:
            raise ProtocolError(exc.code, exc.message, exc.param) from exc

    def asr_params(self) -> dict[str, Any]:
        """What the ASR stage needs to know of this config."""
        return {"turn_detection": turn_detection.asr_turn_params(self.turn_detection), "partials": self.transcription is not None}
