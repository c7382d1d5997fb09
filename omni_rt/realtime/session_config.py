"""The Realtime session configuration: what ``session.update`` may set, validated, and how it renders.

Field names and shapes follow the GA models in openai-python's ``openai/types/realtime/`` (beta spellings
accepted on input). Every refusal names its ``param``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from omni_rt.audio.formats import FORMAT_RATES, parse_audio_format
from omni_rt.realtime.errors import ProtocolError


def parse_format(value: Any, param: str) -> str:
    """Accept GA ``{"type": "audio/pcm", "rate": 24000}`` and beta strings (``pcm16``, ``g711_ulaw``...)."""
    if not isinstance(value, (str, dict)):
        raise ProtocolError("invalid_value", f"{param} must be an object like {{'type': 'audio/pcm', 'rate': 24000}}", param)
    if isinstance(value, dict) and "type" not in value:
        value = {**value, "type": "audio/pcm"}
    try:
        return parse_audio_format(value)
    except (ValueError, TypeError) as exc:
        raise ProtocolError("unsupported_format", str(exc), param) from None


def format_object(fmt: str) -> dict[str, Any]:
    return {"type": fmt, "rate": FORMAT_RATES[fmt]} if fmt == "audio/pcm" else {"type": fmt}


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

    def copy(self) -> "SessionConfig":
        """An independent copy: validate a ``session.update`` on it, apply only if all of it is valid."""
        return copy.deepcopy(self)

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
        if td is None:
            return None
        if not isinstance(td, dict):
            raise ProtocolError("invalid_type", "turn_detection must be an object or null", "session.audio.input.turn_detection")
        kind = td.get("type", "server_vad")
        if kind not in ("server_vad", "semantic_vad"):
            raise ProtocolError("invalid_value", f"turn_detection.type '{kind}' is not supported (server_vad, semantic_vad or null)",
                                "session.audio.input.turn_detection.type")
        out = {"type": kind, "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
               "create_response": True, "interrupt_response": True}
        for key, typ, lo, hi in (("threshold", (int, float), 0.0, 1.0), ("prefix_padding_ms", int, 0, 5000),
                                 ("silence_duration_ms", int, 100, 10000)):
            if key in td and td[key] is not None:
                v = td[key]
                if not isinstance(v, typ) or isinstance(v, bool) or not (lo <= v <= hi):
                    raise ProtocolError("invalid_value", f"turn_detection.{key} must be a number in [{lo}, {hi}]",
                                        f"session.audio.input.turn_detection.{key}")
                out[key] = v
        for key in ("create_response", "interrupt_response"):
            if key in td and td[key] is not None:
                if not isinstance(td[key], bool):
                    raise ProtocolError("invalid_type", f"turn_detection.{key} must be a boolean",
                                        f"session.audio.input.turn_detection.{key}")
                out[key] = td[key]
        if kind == "semantic_vad":
            out = {k: out[k] for k in ("type", "create_response", "interrupt_response")} | {"eagerness": td.get("eagerness", "auto")}
        return out

    def asr_params(self) -> dict[str, Any]:
        """What the ASR stage needs to know of this config."""
        td = self.turn_detection
        if td is None:
            return {"turn_detection": None, "partials": self.transcription is not None}
        return {
            "turn_detection": {
                "type": "server_vad",
                "threshold": td.get("threshold", 0.5),
                "prefix_padding_ms": td.get("prefix_padding_ms", 300),
                "silence_duration_ms": td.get("silence_duration_ms", 500),
            },
            "partials": self.transcription is not None,
        }
