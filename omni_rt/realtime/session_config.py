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
from omni_rt.realtime.fields import is_number, json_object, known_keys
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
    if isinstance(value, dict):
        known_keys(value, ("type", "rate"), param)
        if value.get("rate") is not None and not is_number(value["rate"]):
            raise ProtocolError("invalid_type", f"{param}.rate must be a number", f"{param}.rate")
    if isinstance(value, dict) and "type" not in value:
        value = {**value, "type": "audio/pcm"}
    try:
        return parse_audio_format(value)
    except (ValueError, TypeError) as exc:
        raise ProtocolError("unsupported_format", str(exc), param) from None


# The session fields a client may send: GA names (openai-python ``types/realtime/realtime_session_create_request_param``)
# and the beta spellings (``types/beta/realtime/session_update_event_param``). Anything else is refused by name.
GA_SESSION_FIELDS = frozenset({"type", "audio", "include", "instructions", "max_output_tokens", "model", "output_modalities",
                               "parallel_tool_calls", "prompt", "reasoning", "tool_choice", "tools", "tracing", "truncation"})
BETA_SESSION_FIELDS = frozenset({"modalities", "voice", "input_audio_format", "output_audio_format", "input_audio_transcription",
                                 "turn_detection", "temperature", "max_response_output_tokens", "speed",
                                 "input_audio_noise_reduction"})
# fields whose null means something (off / none); for the others null means "unchanged", like an absent field
NULLABLE_FIELDS = frozenset({"turn_detection", "input_audio_transcription", "input_audio_noise_reduction", "tracing", "prompt"})
AUDIO_INPUT_FIELDS = ("format", "noise_reduction", "transcription", "turn_detection")
NOISE_REDUCTION_TYPES = ("near_field", "far_field")
AUDIO_OUTPUT_FIELDS = ("format", "speed", "voice")
TRANSCRIPTION_FIELDS = ("model", "language", "prompt", "delay", "keywords", "languages")
TURN_DETECTION_FIELDS = ("type", "create_response", "interrupt_response", "threshold", "prefix_padding_ms",
                         "silence_duration_ms", "idle_timeout_ms", "eagerness")
REASONING_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")
TEMPERATURE_RANGE = (0.6, 1.2)  # the beta field's documented range (GA sessions have no temperature)


def parse_truncation(value: Any, param: str = "session.truncation") -> str | dict[str, Any]:
    """GA ``truncation``: ``"auto"``, ``"disabled"`` or ``{"type": "retention_ratio", "retention_ratio": r}``."""
    if isinstance(value, str):
        if value not in ("auto", "disabled"):
            raise ProtocolError("invalid_value", "truncation must be 'auto', 'disabled' or {'type': 'retention_ratio', "
                                "'retention_ratio': 0..1}", param)
        return value
    if not isinstance(value, dict):
        raise ProtocolError("invalid_type", "truncation must be 'auto', 'disabled' or an object", param)
    known_keys(value, ("type", "retention_ratio", "token_limits"), param)
    if value.get("type") != "retention_ratio":
        raise ProtocolError("invalid_value", "truncation.type must be 'retention_ratio'", f"{param}.type")
    ratio = value.get("retention_ratio")
    if not is_number(ratio):
        raise ProtocolError("invalid_type", "truncation.retention_ratio must be a number", f"{param}.retention_ratio")
    if not 0.0 <= ratio <= 1.0:
        raise ProtocolError("invalid_value", "truncation.retention_ratio must be between 0 and 1", f"{param}.retention_ratio")
    if value.get("token_limits") is not None:
        limits = json_object(value["token_limits"], f"{param}.token_limits")
        known_keys(limits, ("post_instructions",), f"{param}.token_limits")
        n = limits.get("post_instructions")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ProtocolError("invalid_value", "truncation.token_limits.post_instructions must be a positive integer",
                                f"{param}.token_limits.post_instructions")
        if n is not None:
            raise ProtocolError("unsupported_value", "truncation.token_limits is not supported: the thinker keeps the newest "
                                "turns that fit its own context", f"{param}.token_limits")
    return {"type": "retention_ratio", "retention_ratio": float(ratio)}


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
    noise_reduction: str | None = None  # "near_field" / "far_field" (the input is denoised), None: off
    voice: str = "default"
    voices: tuple[str, ...] = ("default",)  # what the preset's talker can speak
    max_output_tokens: int | str = "inf"
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    session_type: str = "realtime"  # or "transcription": input transcription only, no responses
    truncation: str | dict[str, Any] = "auto"  # the conversation at its caps (omni_rt.session.conversation)
    parallel_tool_calls: bool | None = None  # passed to the thinker (a forced tool_choice decodes one call unless True)
    temperature: float | None = None  # beta field; None: the preset's sampling (greedy)
    beta_events: bool = False

    def copy(self) -> "SessionConfig":
        """An independent copy: validate a ``session.update`` on it, apply only if all of it is valid."""
        return copy.deepcopy(self)

    def render(self, session_id: str) -> dict[str, Any]:
        audio_in = {
            "format": format_object(self.input_format),
            "turn_detection": self.turn_detection.to_wire() if self.turn_detection else None,
            "transcription": dict(self.transcription) if self.transcription else None,
            "noise_reduction": {"type": self.noise_reduction} if self.noise_reduction else None,
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
            "truncation": copy.deepcopy(self.truncation),
            **({"parallel_tool_calls": self.parallel_tool_calls} if self.parallel_tool_calls is not None else {}),
            **({"temperature": self.temperature} if self.temperature is not None else {}),
        }

    def update(self, session: Any) -> None:
        """Apply a ``session.update`` payload (GA or beta field names); raises ProtocolError naming the ``param`` of
        the first field that is unknown, of the wrong type, out of range, or not supported by this server. The
        caller validates on a copy (``copy``) and applies it only when all of it is valid."""
        if not isinstance(session, dict):
            raise ProtocolError("invalid_type", "session must be an object", "session")
        known_keys(session, GA_SESSION_FIELDS | BETA_SESSION_FIELDS, "session")
        session = {k: v for k, v in session.items() if v is not None or k in NULLABLE_FIELDS}
        self._refuse_unsupported(session)
        if "type" in session:
            if session["type"] not in ("realtime", "transcription"):
                raise ProtocolError("invalid_value", "session.type must be 'realtime' or 'transcription'", "session.type")
            self.session_type = session["type"]
        if "model" in session:  # one model answers whatever the name: the session echoes the server's
            if not isinstance(session["model"], str):
                raise ProtocolError("invalid_type", "session.model must be a string", "session.model")
            if len(session["model"]) > 128:
                raise ProtocolError("invalid_value", "session.model is longer than 128 characters", "session.model")
        if "instructions" in session:
            if not isinstance(session["instructions"], str):
                raise ProtocolError("invalid_type", "session.instructions must be a string", "session.instructions")
            if len(session["instructions"]) > MAX_INSTRUCTIONS_CHARS:
                raise ProtocolError("string_above_max_length", f"session.instructions holds {len(session['instructions'])} "
                                    f"characters; at most {MAX_INSTRUCTIONS_CHARS}", "session.instructions")
            self.instructions = session["instructions"]
        if "tools" in session or "tool_choice" in session:
            self._set_tools(session.get("tools", self.tools), session.get("tool_choice", self.tool_choice))
        if "parallel_tool_calls" in session:
            if not isinstance(session["parallel_tool_calls"], bool):
                raise ProtocolError("invalid_type", "session.parallel_tool_calls must be a boolean", "session.parallel_tool_calls")
            self.parallel_tool_calls = session["parallel_tool_calls"]
        if "temperature" in session:
            t = session["temperature"]
            if not is_number(t):
                raise ProtocolError("invalid_type", "session.temperature must be a number", "session.temperature")
            lo, hi = TEMPERATURE_RANGE
            if not lo <= t <= hi:
                raise ProtocolError("invalid_value", f"session.temperature must be between {lo} and {hi}", "session.temperature")
            self.temperature = float(t)
        if "truncation" in session:
            self.truncation = parse_truncation(session["truncation"])
        mkey = "output_modalities" if "output_modalities" in session else "modalities"
        if mkey in session:
            modalities = session[mkey]
            if not isinstance(modalities, list):
                raise ProtocolError("invalid_type", f"session.{mkey} must be a list", f"session.{mkey}")
            if not modalities or any(m not in ("text", "audio") for m in modalities):
                raise ProtocolError("invalid_value", "output_modalities must be ['audio'] or ['text']", "session.output_modalities")
            self.output_modalities = ["audio"] if "audio" in modalities else ["text"]
        tkey = "max_output_tokens" if "max_output_tokens" in session else "max_response_output_tokens"
        if tkey in session:
            mot = session[tkey]
            if not (mot == "inf" or (isinstance(mot, int) and not isinstance(mot, bool) and 1 <= mot <= 4096)):
                raise ProtocolError("invalid_value", "max_output_tokens must be an integer 1..4096 or 'inf'", f"session.{tkey}")
            self.max_output_tokens = mot
        audio = json_object(session.get("audio"), "session.audio")
        known_keys(audio, ("input", "output"), "session.audio")
        inp = json_object(audio.get("input"), "session.audio.input")
        out = json_object(audio.get("output"), "session.audio.output")
        known_keys(inp, AUDIO_INPUT_FIELDS, "session.audio.input")
        known_keys(out, AUDIO_OUTPUT_FIELDS, "session.audio.output")
        if "input_audio_format" in session:
            self.input_format = parse_format(session["input_audio_format"], "session.input_audio_format")
        if inp.get("format") is not None:
            self.input_format = parse_format(inp["format"], "session.audio.input.format")
        if "output_audio_format" in session:
            self.output_format = parse_format(session["output_audio_format"], "session.output_audio_format")
        if out.get("format") is not None:
            self.output_format = parse_format(out["format"], "session.audio.output.format")
        if out.get("voice") is not None or "voice" in session:
            self.voice = self._parse_voice(out["voice"] if out.get("voice") is not None else session["voice"])
        td_key = "turn_detection"
        if td_key in inp or td_key in session:
            td = inp[td_key] if td_key in inp else session[td_key]
            if isinstance(td, dict):
                known_keys(td, TURN_DETECTION_FIELDS, "session.audio.input.turn_detection")
            self.turn_detection = self._parse_turn_detection(td)
        if "noise_reduction" in inp or "input_audio_noise_reduction" in session:
            in_audio = "noise_reduction" in inp
            self.noise_reduction = self._parse_noise_reduction(
                inp["noise_reduction"] if in_audio else session["input_audio_noise_reduction"],
                "session.audio.input.noise_reduction" if in_audio else "session.input_audio_noise_reduction")
        tr = inp["transcription"] if "transcription" in inp else session.get("input_audio_transcription", "__absent__")
        if tr != "__absent__":
            self.transcription = self._parse_transcription(tr)

    @staticmethod
    def _parse_transcription(tr: Any) -> dict[str, Any] | None:
        param = "session.audio.input.transcription"
        if tr is None:
            return None
        if not isinstance(tr, dict):
            raise ProtocolError("invalid_type", "transcription must be an object or null", param)
        known_keys(tr, TRANSCRIPTION_FIELDS, param)
        for key in ("model", "language", "prompt"):
            if tr.get(key) is not None and not isinstance(tr[key], str):
                raise ProtocolError("invalid_type", f"transcription.{key} must be a string", f"{param}.{key}")
        if tr.get("language") not in (None, "", "en"):
            raise ProtocolError("unsupported_value", "transcription.language: this preset's ASR hears English only ('en')",
                                f"{param}.language")
        if tr.get("prompt"):
            raise ProtocolError("unsupported_value", "transcription.prompt is not supported by this server", f"{param}.prompt")
        for key in ("delay", "keywords", "languages"):
            if tr.get(key) is not None:
                raise ProtocolError("unsupported_value", f"transcription.{key} is not supported by this server", f"{param}.{key}")
        return dict(tr)

    @staticmethod
    def _parse_noise_reduction(nr: Any, param: str) -> str | None:
        """``null`` (off) or ``{"type": "near_field" | "far_field"}``: the type, which the audio-in stage's denoiser
        applies (``omni_rt.backends.denoise``: both types run the same RNNoise filter) and the session echoes."""
        if nr is None:
            return None
        if not isinstance(nr, dict):
            raise ProtocolError("invalid_type", "noise_reduction must be null or an object like {'type': 'near_field'}", param)
        known_keys(nr, ("type",), param)
        if nr.get("type") not in NOISE_REDUCTION_TYPES:
            raise ProtocolError("invalid_value", "noise_reduction.type must be 'near_field' or 'far_field'", f"{param}.type")
        return str(nr["type"])

    def _refuse_unsupported(self, session: dict[str, Any]) -> None:
        """Fields this server cannot honour are refused by name, never silently ignored; a value of the wrong
        type or out of the schema's range is refused as such first."""
        audio = session.get("audio") if isinstance(session.get("audio"), dict) else {}
        out = audio.get("output") if isinstance(audio.get("output"), dict) else {}
        speed_param = "session.audio.output.speed" if "speed" in out else "session.speed"
        speed = out.get("speed", session.get("speed"))
        if speed is not None:
            if not is_number(speed):
                raise ProtocolError("invalid_type", "speed must be a number", speed_param)
            if not 0.25 <= speed <= 1.5:
                raise ProtocolError("invalid_value", "speed must be between 0.25 and 1.5", speed_param)
            if speed != 1.0:
                raise ProtocolError("unsupported_value", "speed: this preset's talker speaks at 1.0 only", speed_param)
        tracing = session.get("tracing")
        if tracing not in (None, {}):  # the Agents SDK sends "auto" unless its tracing is disabled
            if not (tracing == "auto" or isinstance(tracing, dict)):
                raise ProtocolError("invalid_value", "session.tracing must be null, 'auto' or an object", "session.tracing")
            if isinstance(tracing, dict):
                known_keys(tracing, ("group_id", "metadata", "workflow_name"), "session.tracing")
            raise ProtocolError("unsupported_value", "session.tracing is not supported by this server (no trace "
                                "dashboard); the OpenAI Agents SDK stops sending it with tracing_disabled in its run "
                                "config", "session.tracing")
        prompt = session.get("prompt")
        if prompt is not None:
            if not isinstance(prompt, dict):
                raise ProtocolError("invalid_type", "session.prompt must be an object or null", "session.prompt")
            raise ProtocolError("unsupported_value", "session.prompt (stored prompt templates) is not supported by this server",
                                "session.prompt")
        include = session.get("include")
        if include is not None:
            if not isinstance(include, list):
                raise ProtocolError("invalid_type", "session.include must be a list", "session.include")
            if any(x != "item.input_audio_transcription.logprobs" for x in include):
                raise ProtocolError("invalid_value", "session.include may only hold 'item.input_audio_transcription.logprobs'",
                                    "session.include")
            if include:
                raise ProtocolError("unsupported_value", "session.include: this server's ASR gives no logprobs", "session.include")
        reasoning = session.get("reasoning")
        if reasoning is not None:
            reasoning = json_object(reasoning, "session.reasoning")
            known_keys(reasoning, ("effort",), "session.reasoning")
            if reasoning.get("effort") is not None and reasoning["effort"] not in REASONING_EFFORTS:
                raise ProtocolError("invalid_value", f"session.reasoning.effort must be one of {list(REASONING_EFFORTS)}",
                                    "session.reasoning.effort")
            if reasoning:
                raise ProtocolError("unsupported_value", "session.reasoning is not supported: this server's thinker does not "
                                    "reason", "session.reasoning")

    def _set_tools(self, tools: Any, tool_choice: Any, prefix: str = "session") -> None:
        from omni_rt.engine.tools.schema import parse_tool_choice, validate_tools

        tools = [] if tools is None else tools
        try:
            validate_tools(tools)
        except ValueError as exc:
            raise ProtocolError("invalid_value", str(exc), f"{prefix}.{_field_path(str(exc), 'tools')}") from None
        try:  # a session's 'required' may come before its tools; each response resolves it (applicable_tool_choice)
            choice = parse_tool_choice(tool_choice, tools, required_needs_tools=prefix != "session")
        except ValueError as exc:
            raise ProtocolError("invalid_value", str(exc), f"{prefix}.tool_choice") from None
        self.tools = [dict(t) for t in tools]
        self.tool_choice = choice if choice is not None else "auto"

    def _parse_voice(self, voice: Any) -> str:
        """One of the preset's voices. OpenAI's built-in names (the SDKs' defaults) select the preset's default
        voice, and the session echoes the voice actually used, so nothing claims a voice it does not have."""
        if isinstance(voice, dict):
            known_keys(voice, ("id",), "session.audio.output.voice")
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
        the answer's prompt, which the thinker prefills while the user speaks (a prefill hint). Noise reduction
        is the stage's: it denoises the input before its VAD, turn model and Whisper."""
        return AudioInSettings(turn_detection=self.turn_detection, partials=self.transcription is not None or self.answers_turns,
                               noise_reduction=self.noise_reduction)
