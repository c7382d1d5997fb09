"""The Realtime session configuration: what ``session.update`` may set, validated, and how it renders.

Field names and shapes follow the GA models in openai-python's ``openai/types/realtime/`` (beta spellings
accepted on input). Every refusal names its ``param``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from omni_rt.audio.formats import FORMAT_RATES, parse_audio_format
from omni_rt.realtime.errors import ProtocolError
from omni_rt.contracts import turn_detection
from omni_rt.contracts.audio_in import AudioInSettings
from omni_rt.contracts.turn_detection import TurnDetectionConfig


MAX_INSTRUCTIONS_CHARS = 32 * 1024
# voices of OpenAI's hosted models, which SDKs send by default
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                           "marin", "cedar"})


def _field_path(message: str, root: str) -> str:
    """``tools[0].parameters.x must ...`` -> ``tools[0].parameters.x`` (the path a validator named)."""
    m = re.match(rf"({re.escape(root)}(?:\[\d+\]|\.[A-Za-z_][\w-]*)*)", message)
    return m.group(1) if m else root


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
    turn_detection: TurnDetectionConfig | None = turn_detection.SERVER_VAD
    transcription: dict[str, Any] | None = None
    voice: str = "default"
    voices: tuple[str, ...] = ("default",)  # what the preset's talker can speak
    max_output_tokens: int | str = "inf"
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    session_type: str = "realtime"  # or "transcription": input transcription only, no responses
    beta_events: bool = False

    def copy(self) -> "SessionConfig":
        """An independent copy: validate a ``session.update`` on it, apply only if all of it is valid."""
        return copy.deepcopy(self)

    def render(self, session_id: str) -> dict[str, Any]:
        audio_in = {
            "format": format_object(self.input_format),
            "turn_detection": self.turn_detection.to_wire() if self.turn_detection else None,
            "transcription": dict(self.transcription) if self.transcription else None,
            "noise_reduction": None,
        }
        if self.session_type == "transcription":
            return {"type": "transcription", "id": session_id, "object": "realtime.transcription_session",
                    "audio": {"input": audio_in}}
        return {
            "type": "realtime",
            "id": session_id,
            "object": "realtime.session",
            "model": self.model,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "max_output_tokens": self.max_output_tokens,
            "audio": {"input": audio_in, "output": {"format": format_object(self.output_format), "voice": self.voice, "speed": 1.0}},
            "tools": [dict(t) for t in self.tools],
            "tool_choice": self.tool_choice,
            "truncation": "auto",
        }

    def update(self, session: Any) -> None:
        """Apply a ``session.update`` payload (GA or beta field names); raises ProtocolError on bad values."""
        if not isinstance(session, dict):
            raise ProtocolError("invalid_value", "session must be an object", "session")
        self._refuse_unsupported(session)
        if "type" in session:
            if session["type"] not in ("realtime", "transcription"):
                raise ProtocolError("invalid_value", "session.type must be 'realtime' or 'transcription'", "session.type")
            self.session_type = session["type"]
        if "instructions" in session:
            if not isinstance(session["instructions"], str):
                raise ProtocolError("invalid_type", "session.instructions must be a string", "session.instructions")
            if len(session["instructions"]) > MAX_INSTRUCTIONS_CHARS:
                raise ProtocolError("string_above_max_length", f"session.instructions holds {len(session['instructions'])} "
                                    f"characters; at most {MAX_INSTRUCTIONS_CHARS}", "session.instructions")
            self.instructions = session["instructions"]
        if "tools" in session or "tool_choice" in session:
            self._set_tools(session.get("tools", self.tools), session.get("tool_choice", self.tool_choice))
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
            self.voice = self._parse_voice(out.get("voice", session.get("voice")))
        td_key = "turn_detection"
        if td_key in inp or td_key in session:
            td = inp.get(td_key, session.get(td_key))
            self.turn_detection = self._parse_turn_detection(td)
        tr = inp.get("transcription", session.get("input_audio_transcription", "__absent__"))
        if tr != "__absent__":
            if tr is not None and not isinstance(tr, dict):
                raise ProtocolError("invalid_type", "transcription must be an object or null", "session.audio.input.transcription")
            if tr is not None:
                if tr.get("language") not in (None, "", "en"):
                    raise ProtocolError("unsupported_value", "transcription.language: this preset's ASR hears English only ('en')",
                                        "session.audio.input.transcription.language")
                if tr.get("prompt"):
                    raise ProtocolError("unsupported_value", "transcription.prompt is not supported by this server",
                                        "session.audio.input.transcription.prompt")
            self.transcription = tr

    def _refuse_unsupported(self, session: dict[str, Any]) -> None:
        """Fields this server cannot honour are refused by name, never silently ignored."""
        audio = session.get("audio") if isinstance(session.get("audio"), dict) else {}
        inp = audio.get("input") if isinstance(audio.get("input"), dict) else {}
        out = audio.get("output") if isinstance(audio.get("output"), dict) else {}
        nr = inp.get("noise_reduction", session.get("input_audio_noise_reduction"))
        if nr is not None:
            raise ProtocolError("unsupported_value", "noise_reduction is not supported by this server (send null)",
                                "session.audio.input.noise_reduction")
        speed = out.get("speed", session.get("speed"))
        if speed is not None and speed != 1.0:
            raise ProtocolError("unsupported_value", "speed: this preset's talker speaks at 1.0 only", "session.audio.output.speed")
        truncation = session.get("truncation")
        if truncation not in (None, "auto"):
            raise ProtocolError("unsupported_value", "truncation: only 'auto' (the oldest turns are dropped to fit the "
                                "thinker's context) is supported", "session.truncation")
        if session.get("tracing") not in (None, {}):  # the Agents SDK sends "auto" unless its tracing is disabled
            raise ProtocolError("unsupported_value", "session.tracing is not supported by this server (no trace "
                                "dashboard); the OpenAI Agents SDK stops sending it with tracing_disabled in its run "
                                "config", "session.tracing")
        for key in ("prompt", "include"):
            if session.get(key) not in (None, [], {}):
                raise ProtocolError("unsupported_value", f"session.{key} is not supported by this server", f"session.{key}")

    def _set_tools(self, tools: Any, tool_choice: Any, prefix: str = "session") -> None:
        from omni_rt.engine.tool_schema import parse_tool_choice, validate_tools

        tools = [] if tools is None else tools
        try:
            validate_tools(tools)
        except ValueError as exc:
            raise ProtocolError("invalid_value", str(exc), f"{prefix}.{_field_path(str(exc), 'tools')}") from None
        try:
            choice = parse_tool_choice(tool_choice, tools)
        except ValueError as exc:
            raise ProtocolError("invalid_value", str(exc), f"{prefix}.tool_choice") from None
        self.tools = [dict(t) for t in tools]
        self.tool_choice = choice if choice is not None else "auto"

    def _parse_voice(self, voice: Any) -> str:
        """One of the preset's voices. OpenAI's built-in names (the SDKs' defaults) select the preset's default
        voice, and the session echoes the voice actually used, so nothing claims a voice it does not have."""
        if isinstance(voice, dict):
            voice = voice.get("id")
        if not isinstance(voice, str) or (voice not in self.voices and voice not in OPENAI_VOICES):
            raise ProtocolError("invalid_value", f"voice {str(voice)[:40]!r} is not available; this preset has {list(self.voices)}",
                                "session.audio.output.voice")
        return voice if voice in self.voices else self.voices[0]

    @staticmethod
    def _parse_turn_detection(td: Any) -> TurnDetectionConfig | None:
        try:  # omni_rt.contracts.turn_detection owns the fields, defaults and eagerness
            return turn_detection.parse_turn_detection(td)
        except turn_detection.TurnDetectionError as exc:
            raise ProtocolError(exc.code, exc.message, exc.param) from exc

    @property
    def answers_turns(self) -> bool:
        """A realtime session whose turn detection answers each turn it ends (``create_response``)."""
        return self.session_type == "realtime" and self.turn_detection is not None and self.turn_detection.create_response

    def audio_in_settings(self) -> AudioInSettings:
        """What the audio-in stage needs to know of this config. Partial transcripts are decoded for the
        client's transcription deltas, and for a session whose turns get answers: the words heard so far are
        the answer's prompt, which the thinker prefills while the user speaks (a prefill hint)."""
        return AudioInSettings(turn_detection=self.turn_detection, partials=self.transcription is not None or self.answers_turns)
