"""One GPT-Live session, sans-I/O: the Live protocol as a layer over the Realtime session core.

The Live wire (``/v1/live/sessions``) has no commits, responses or speech events: the server's own end of turn
and barge-in decide, output audio is one continuous real-time stream, and the model *delegates* work to the
client. ``LiveSession`` translates both ways and owns only what the Live protocol adds; turns, answers,
barge-in, tools and the conversation stay the ``RealtimeSession``'s (``omni_rt.session.core``), driven by the
same ``SessionRunner`` and pipeline as ``/v1/realtime``:

* client Live events in (``receive_message``) -> Realtime client events for the core (``core_events``), or a
  Live ack / ``error`` at once;
* the core's Realtime server events in (``receive_core``) -> Live server events, the answer's audio into the
  output stream;
* ``tick(now)``: the real-time output stream (``session.output_audio.delta``: the answer's audio, digital
  zeros between answers), output transcripts released as their audio plays, periodic usage, expiry, the end
  of a requested close.

Delegation: the voice thinker is given one function, ``delegate_to_backend``; its call becomes
``session.delegation.created`` (after the user's transcript, which the core sends before it answers), the
spoken preamble before the call is the session's tool preamble (``omni_rt.engine.tools.preamble``), and the
client's ``session.commentary.append`` with that delegation id becomes the call's output, which the thinker
answers from (spoken). Barge-in cancels speech only; an open delegation stays open and a late result is spoken.
Under Responses delegation the same call becomes a backend request (``take_backend_jobs``; the transport runs it,
``omni_rt.transports.live_backend``) whose stream comes back through ``receive_backend`` as ``response.event``
envelopes; its text is spoken as the call's output, its function calls wait for the client's
``response.item.create`` outputs and ``response.create``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from omni_rt.audio.pcm import StreamResampler, float_to_pcm16, pcm16_to_float
from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.events import event_id_of, new_id, parse_client_message
from omni_rt.realtime.fields import known_keys
from omni_rt.realtime.live_config import SESSION_LIFETIME_S, LiveConfig, core_item, parse_delegation
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session.turn import transcript_extension

log = logging.getLogger("omni_rt.live")

CLIENT_EVENTS = ("session.start", "session.update", "session.input_audio.append", "session.input_audio.mute",
                 "session.input_audio.unmute", "session.instructions.append", "session.thinking.append",
                 "session.commentary.append", "response.item.create", "response.create", "session.close")
APPEND_KINDS = ("instructions", "thinking", "commentary")
DELEGATE_TOOL = "delegate_to_backend"
CORE_EVENT_PREFIX = "live:"  # core event ids carry the client's event id, so a core error names it back


MAX_NOTE_CHARS = 4000  # of one turn's transcript kept for the backend
MAX_TRANSCRIPT_TURNS = 32  # recent turns of both sides handed to a Responses backend
MAX_BACKEND_RESPONSES = 16  # Responses delegations streaming at once in one session


@dataclass
class BackendJob:
    """One chat-completions request for the Responses backend (``omni_rt.transports.live_backend``)."""

    response_id: str
    delegation_id: str
    body: dict[str, Any]


@dataclass
class _BackendResponse:
    delegation_id: str
    messages: list[dict[str, Any]]
    text: str = ""
    message_id: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0


@dataclass(frozen=True)
class LiveLimits:
    """Per-session caps of the Live layer; each refusal names its number."""

    max_append_bytes: int = 1 << 20  # one session.input_audio.append, decoded
    max_append_chars: int = 4000  # one instructions / thinking / commentary append (the protocol: 500 tokens)
    max_appended_instructions_chars: int = 16 * 1024  # all session.instructions.append together
    max_pending_speech: int = 8  # commentary waiting for the voice to finish its current answer
    max_open_delegations: int = 32
    max_buffered_output_s: float = 120.0  # answer audio queued ahead of the real-time stream
    usage_interval_s: float = 10.0  # session.usage.updated while the session runs
    drain_timeout_s: float = 10.0  # session.close waits at most this long for speech to finish
    output_lead_s: float = 0.1  # the stream runs this far ahead of the wall clock (client jitter buffer)
    tick_s: float = 0.04  # the output stream's pace: one delta per tick
    max_queued_events: int = 4096  # Live events not yet taken by the transport (a client that stops reading)
    lifetime_s: float = SESSION_LIFETIME_S


class LiveSession:
    def __init__(self, *, voices: tuple[str, ...], delegation_policy: str = "auto", limits: LiveLimits | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 media_track: bool = False, responses_backend: bool = False) -> None:
        """``voices``: the preset's (the Live voice name is echoed, the preset's first voice speaks);
        ``delegation_policy``: "auto" (the thinker decides when to delegate), "always" (every user turn is
        delegated), "off" (never); ``clock``: monotonic seconds (tests pass a fake one); ``media_track``: audio
        rides a media track (WebRTC): the session is started by its creation request (``start``), the answer's
        audio goes to the track (``receive_core`` leaves it to the transport), no audio events, and the
        timeline is the clock's; ``responses_backend``: the operator named a delegation backend (``--delegate``),
        so Responses delegation may be asked for (its requests come out of ``take_backend_jobs``)."""
        self.id = new_id("live")
        self.limits = limits or LiveLimits()
        self.voices = voices or ("default",)
        self.delegation_policy = delegation_policy
        self.clock, self.wall = clock, wall
        self.media_track = media_track
        self.responses_backend = responses_backend
        self._transcript: deque[list[str]] = deque(maxlen=MAX_TRANSCRIPT_TURNS)  # [role, text] turns, for the backend
        self._jobs: list[BackendJob] = []  # backend requests for the transport to run
        self._backend: dict[str, _BackendResponse] = {}  # response id -> its stream state
        self._calls_waiting: dict[str, dict[str, Any]] = {}  # delegation id -> backend function calls awaiting outputs
        self.state = "new"  # new -> active -> closing -> closed
        self.config: LiveConfig | None = None
        self.core_session: dict[str, Any] | None = None  # the Realtime session payload the core starts with
        self.close_reason: str | None = None
        self.finished = False  # session.closed is queued: the transport closes the socket (1000) after it
        self.muted = False
        self.overflow = False  # over max_queued_events: the client is not reading; the transport closes
        self._out: list[dict[str, Any]] = []
        self._core: list[dict[str, Any]] = []
        self._t0 = 0.0
        self._expires_at = 0
        self._base_instructions = ""
        self._appended_instructions: list[str] = []
        self._in_samples = 0  # input timeline (client-rate samples received)
        self._in_rate = 24000
        self._out_rate = 24000
        self._out_sent = 0  # output timeline: samples of the stream sent
        self._out_buf = bytearray()  # answer audio (client format) not yet sent
        self._out_text: deque[tuple[int, str]] = deque()  # (stream sample where it starts, transcript delta)
        self._last_usage = 0.0
        self._close_started = 0.0
        self._close_event_id: str | None = None
        self._core_active: str | None = None  # the core's response in progress
        self._speech_queue: deque[list[dict[str, Any]]] = deque()  # core events that start an answer, waiting
        self._inflight: list[dict[str, Any]] | None = None  # the batch sent, until a response.done (or its refusal)
        self._delegations: dict[str, str | None] = {}  # delegation id -> call id while the call has no output
        self._input_end_ms = 0
        self._in_sent = ""  # the current turn's transcript sent so far
        self._turn_start_ms = 0
        self._in_resampler: StreamResampler | None = None
        self._out_resampler: StreamResampler | None = None

    # ---- outputs -------------------------------------------------------------------------------------
    def events_to_send(self) -> list[dict[str, Any]]:
        out, self._out = self._out, []
        return out

    def core_events(self) -> list[dict[str, Any]]:
        out, self._core = self._core, []
        return out

    def _send(self, event: dict[str, Any], client_event_id: str | None = None) -> None:
        if len(self._out) >= self.limits.max_queued_events:  # the transport closes the connection (overflow)
            self.overflow = True
            return
        event = {"type": event.pop("type"), "event_id": new_id("event"), **event}
        if client_event_id is not None:
            event["client_event_id"] = client_event_id
        self._out.append(event)

    def send_error(self, exc: ProtocolError, client_event_id: str | None = None) -> None:
        err: dict[str, Any] = {"type": exc.type, "code": exc.code, "message": exc.message}
        if exc.param:
            err["param"] = exc.param
        if client_event_id is not None:
            err["client_event_id"] = client_event_id
        self._send({"type": "error", "error": err}, client_event_id)

    def _to_core(self, event: dict[str, Any], client_event_id: str | None) -> None:
        if client_event_id is not None:
            event["event_id"] = CORE_EVENT_PREFIX + client_event_id
        self._core.append(event)

    # ---- timeline ------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        """The session timeline: milliseconds since ``session.started`` (the output stream's clock)."""
        if self.media_track:
            return int(max(0.0, self.clock() - self._t0) * 1000) if self.state != "new" else 0
        return int(self._out_sent * 1000 / self._out_rate)

    def _in_ms(self) -> int:
        if self.media_track:
            return self.now_ms()
        return int(self._in_samples * 1000 / self._in_rate)

    def usage_seconds(self) -> float:
        return round(max(0.0, self.clock() - self._t0), 3) if self.state != "new" else 0.0

    # ---- client events -------------------------------------------------------------------------------
    def receive_message(self, raw: str | bytes, sideband: bool = False) -> None:
        """``sideband``: from a ``/attach`` controller, which may send every client event but ``session.start``
        and ``session.input_audio.append``."""
        try:
            event = parse_client_message(raw)
        except ProtocolError as exc:
            self.send_error(exc, event_id_of(raw))
            return
        self.receive_event(event, sideband)

    def receive_event(self, event: dict[str, Any], sideband: bool = False) -> None:
        eid = event.get("event_id")
        eid = eid if isinstance(eid, str) and len(eid) <= 128 else None
        try:
            etype = event["type"]
            if self.state == "closed":
                return
            if etype not in CLIENT_EVENTS:
                raise ProtocolError("unknown_event", f"unknown event type '{etype[:64]}'; supported: {', '.join(CLIENT_EVENTS)}", "type")
            if sideband and etype in ("session.start", "session.input_audio.append"):
                raise ProtocolError("invalid_request_error", f"a sideband connection cannot send {etype}", "type")
            if etype == "session.start":
                if self.media_track:
                    raise ProtocolError("invalid_request_error", "this session was started by its creation request; "
                                        "session.start is for WebSocket sessions", "type")
                self._start(event, eid)
                return
            if self.state == "new":
                raise ProtocolError("session_not_started", f"send session.start first; '{etype}' came before it", "type")
            if self.state == "closing":
                raise ProtocolError("session_closing", f"the session is closing; '{etype}' is refused", "type")
            if etype == "session.input_audio.append":
                if self.media_track:
                    raise ProtocolError("invalid_request_error", "audio rides the media track in this session, not "
                                        "session.input_audio.append", "type")
                self._append_audio(event, eid)
            elif etype in ("session.input_audio.mute", "session.input_audio.unmute"):
                known_keys(event, ("type", "event_id"), etype)
                self.muted = etype.endswith(".mute")
                self._send({"type": etype.replace(".mute", ".muted").replace(".unmute", ".unmuted")}, eid)
            elif etype.startswith("session.") and etype.endswith(".append"):
                self._append_context(etype.split(".")[1], event, eid)
            elif etype == "session.update":
                self._update(event, eid)
            elif etype in ("response.item.create", "response.create"):
                assert self.config is not None
                if self.config.delegation["type"] != "responses":
                    raise ProtocolError("invalid_request_error", f"{etype} requires Responses delegation; this session uses "
                                        "client delegation", "type")
                if etype == "response.item.create":
                    self._item_create(event, eid)
                else:
                    self._continue(event, eid)
            elif etype == "session.close":
                known_keys(event, ("type", "event_id"), "session.close")
                self.state, self._close_started, self._close_event_id = "closing", self.clock(), eid
        except ProtocolError as exc:
            self.send_error(exc, eid)

    def start(self, session: Any) -> None:
        """Start from a creation request's session object (WebRTC); raises ``ProtocolError`` naming the field."""
        if isinstance(session, dict) and isinstance(session.get("audio"), dict) and "format" in session["audio"]:
            raise ProtocolError("unknown_parameter", "session.audio.format is negotiated in the SDP for WebRTC sessions",
                                "session.audio.format")
        self._start({"type": "session.start", "session": session}, None)

    def _start(self, event: dict[str, Any], eid: str | None) -> None:
        if self.state != "new":
            raise ProtocolError("session_already_started", "session.start may be sent once per connection", "type")
        known_keys(event, ("type", "event_id", "session"), "session.start")
        cfg = LiveConfig.parse(event.get("session"))
        if cfg.delegation["type"] == "responses" and not self.responses_backend:
            raise ProtocolError("unsupported_value", "responses delegation needs a backend: this server was started "
                                "without --delegate URL", "session.delegation.type")
        self.config = cfg
        self._base_instructions = cfg.instructions or SessionConfig().instructions
        self._in_rate = self._out_rate = cfg.rate
        if cfg.format_type == "audio/pcm" and cfg.rate != 24000:
            self._in_resampler = StreamResampler(cfg.rate, 24000, "QQ")
            self._out_resampler = StreamResampler(24000, cfg.rate, "HQ")
        fmt = {"type": cfg.core_format}
        tools, choice = [], "none"
        if self.delegation_policy != "off":
            tools = [{"type": "function", "name": DELEGATE_TOOL, "parameters": {"type": "object", "properties": {}},
                      "description": "Hand the user's request to the backend, which has the knowledge, tools and actions "
                                     "this voice does not; its answer comes back later."}]
            choice = "required" if self.delegation_policy == "always" else "auto"
        self.core_session = {
            "type": "realtime", "instructions": self._instructions(), "tools": tools, "tool_choice": choice,
            "audio": {"input": {"format": fmt, "transcription": {"model": "whisper"}, "turn_detection": {"type": "semantic_vad"}},
                      "output": {"format": fmt, "voice": self.voices[0]}}}
        for item in cfg.input:
            self._to_core({"type": "conversation.item.create", "item": core_item(item)}, None)
        self.state = "active"
        self._t0 = self._last_usage = self.clock()
        self._expires_at = int(self.wall() + self.limits.lifetime_s)
        self._send({"type": "session.started", "session": self.resource()}, eid)

    def resource(self) -> dict[str, Any]:
        assert self.config is not None
        return self.config.resource(self.id, self._expires_at)

    def _instructions(self) -> str:
        return "\n\n".join([self._base_instructions, *self._appended_instructions])

    def _update(self, event: dict[str, Any], eid: str | None) -> None:
        known_keys(event, ("type", "event_id", "session"), "session.update")
        session = event.get("session")
        if not isinstance(session, dict):
            raise ProtocolError("missing_required_parameter", "session.update needs a 'session' object", "session")
        for key in session:
            if key != "delegation":
                raise ProtocolError("unknown_parameter" if key not in ("model", "instructions", "audio", "input") else "immutable_parameter",
                                    f"session.{str(key)[:40]} cannot change after session.start; session.update changes "
                                    "'delegation' only", f"session.{str(key)[:40]}")
        assert self.config is not None
        current = self.config.delegation
        self.config.delegation = parse_delegation(session.get("delegation"), "session.delegation", current=current["type"],
                                                  current_responses=current.get("responses"))
        self._send({"type": "session.updated", "session": self.resource()}, eid)

    def _append_audio(self, event: dict[str, Any], eid: str | None) -> None:
        known_keys(event, ("type", "event_id", "audio"), "session.input_audio.append")
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise ProtocolError("missing_required_parameter", "session.input_audio.append needs base64 'audio'", "audio")
        if len(audio) > (self.limits.max_append_bytes * 4) // 3 + 4:
            raise ProtocolError("audio_too_large", f"one append carries at most {self.limits.max_append_bytes} bytes of audio", "audio")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("invalid_base64", "'audio' is not valid base64", "audio") from None
        assert self.config is not None
        bps = self.config.bytes_per_sample
        if len(raw) % bps:
            raise ProtocolError("invalid_audio", f"{self.config.format_type} audio comes in whole {bps}-byte samples", "audio")
        if not raw:
            return
        self._in_samples += len(raw) // bps
        if self.muted:  # the model hears silence: the timelines stay aligned and a turn in progress can end
            raw = (b"\xff" if self.config.format_type == "audio/pcmu" else b"\xd5" if self.config.format_type == "audio/pcma"
                   else b"\x00") * len(raw)
        if self._in_resampler is not None:
            pcm = self._in_resampler.process(pcm16_to_float(raw))
            if not len(pcm):
                return
            audio = base64.b64encode(float_to_pcm16(pcm)).decode("ascii")
        elif self.muted:
            audio = base64.b64encode(raw).decode("ascii")
        self._to_core({"type": "input_audio_buffer.append", "audio": audio}, eid)

    def _append_context(self, kind: str, event: dict[str, Any], eid: str | None) -> None:
        etype = f"session.{kind}.append"
        known_keys(event, ("type", "event_id", "content", "delegation_id"), etype)
        content = event.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ProtocolError("missing_required_parameter", f"{etype} needs a non-empty string 'content'", "content")
        if len(content) > self.limits.max_append_chars:
            raise ProtocolError("string_above_max_length", f"'content' holds {len(content)} characters; at most "
                                f"{self.limits.max_append_chars} per append (about 500 tokens)", "content")
        if "delegation_id" not in event:
            raise ProtocolError("missing_required_parameter", f"{etype} needs 'delegation_id' (null when it answers no "
                                "delegation)", "delegation_id")
        did = event["delegation_id"]
        if did is not None and (not isinstance(did, str) or did not in self._delegations):
            raise ProtocolError("invalid_value", f"no delegation {str(did)[:64]!r} in this session", "delegation_id")
        if kind == "instructions":
            total = sum(map(len, self._appended_instructions)) + len(content)
            if total > self.limits.max_appended_instructions_chars:
                raise ProtocolError("string_above_max_length", f"appended instructions would hold {total} characters; at most "
                                    f"{self.limits.max_appended_instructions_chars}", "content")
            self._appended_instructions.append(content)
            self._to_core({"type": "session.update", "session": {"type": "realtime", "instructions": self._instructions()}}, eid)
        elif kind == "thinking":
            self._add_result(did, content, eid, background=True)
        else:
            if did is None:
                if len(self._speech_queue) >= self.limits.max_pending_speech:
                    raise ProtocolError("too_many_pending", f"at most {self.limits.max_pending_speech} commentaries may wait for "
                                        "the voice", "content")
                self._speak([{"type": "response.create", "response": {
                    "tool_choice": "none",
                    "instructions": f"{self._instructions()}\n\nSay this to the user now, faithfully and briefly: {content}"}}], eid)
            else:
                self._add_result(did, content, eid, background=False)
        now = self.now_ms()
        self._send({"type": f"session.{kind}.appended", "start_ms": now, "end_ms": now}, eid)

    def _add_result(self, did: str | None, content: str, eid: str | None, *, background: bool) -> None:
        """A delegation's result (or background text): the open call's output when it has none yet, else a
        system note; commentary is then answered aloud."""
        call_id = self._delegations.get(did) if did is not None else None
        if call_id is not None:
            self._delegations[did] = None  # type: ignore[index]  # answered: later appends are notes
            item = {"type": "function_call_output", "call_id": call_id, "output": content}
        else:
            note = "Background for later answers (do not read it out): " if background else "Result of the user's earlier request: "
            item = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": note + content}]}
        events = [{"type": "conversation.item.create", "item": item}]
        if background:
            self._to_core(events[0], eid)
            return
        if len(self._speech_queue) >= self.limits.max_pending_speech:
            raise ProtocolError("too_many_pending", f"at most {self.limits.max_pending_speech} commentaries may wait for the voice",
                                "content")
        events.append({"type": "response.create", "response": {"tool_choice": "none"}})
        self._speak(events, eid)

    def _speak(self, events: list[dict[str, Any]], eid: str | None) -> None:
        """Events that end in an answer: now if the voice is not answering, else after its answer."""
        if eid is not None:
            for e in events:
                e["event_id"] = CORE_EVENT_PREFIX + eid
        self._speech_queue.append(events)
        self._flush_speech()

    def _flush_speech(self) -> None:
        if self._core_active is None and self._speech_queue and self.state != "closed":
            self._inflight = self._speech_queue.popleft()
            self._core.extend(self._inflight)
            self._core_active = "pending"  # until the core's response.created names it

    # ---- core events ---------------------------------------------------------------------------------
    def receive_core(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            self._from_core(ev)

    def _from_core(self, ev: dict[str, Any]) -> None:
        et = ev.get("type")
        if et == "response.output_audio.delta":
            if not self.media_track:
                self._queue_audio(base64.b64decode(ev["delta"]))
        elif et == "response.output_audio_transcript.delta":
            if self.media_track:  # the track plays it about now
                now = self.now_ms()
                self._note("assistant", ev["delta"])
                self._send({"type": "session.output_transcript.delta", "delta": ev["delta"], "start_ms": now, "end_ms": now})
                return
            pos = self._out_sent + len(self._out_buf) // self._bps
            self._out_text.append((pos, ev["delta"]))
        elif et == "response.created":
            self._core_active = ev["response"]["id"]
        elif et == "response.done":
            self._core_active, self._inflight = None, None
            self._flush_out_resampler()
            for item in ev["response"].get("output", []):
                if item.get("type") == "function_call" and item.get("name") == DELEGATE_TOOL:
                    self._delegate(item["call_id"])
            self._flush_speech()
        elif et == "input_audio_buffer.speech_started":
            self._turn_start_ms = min(int(ev.get("audio_start_ms", 0)), self._in_ms())
            self._input_end_ms = self._turn_start_ms
            self._in_sent = ""
            self._barge_in()
        elif et == "conversation.item.input_audio_transcription.delta":
            self._input_text(ev["delta"])
        elif et == "conversation.item.input_audio_transcription.completed":
            self._input_final(ev.get("transcript") or "")
        elif et == "error":
            self._core_error(ev["error"])

    def _input_final(self, text: str) -> None:
        """The turn's final transcript: what the partials did not send yet. A final that re-decoded the start
        differently cannot take back what was sent: its words past those sent follow."""
        rest, self._in_sent = transcript_extension(self._in_sent, text), ""
        if rest.strip():
            self._input_text(rest)
        self._in_sent = ""

    def _note(self, role: str, text: str) -> None:
        """The conversation as both sides' transcripts, for a Responses backend (consecutive deltas join)."""
        if self._transcript and self._transcript[-1][0] == role:
            self._transcript[-1][1] = (self._transcript[-1][1] + text)[-MAX_NOTE_CHARS:]
        elif text.strip():
            self._transcript.append([role, text.lstrip()[-MAX_NOTE_CHARS:]])

    def _input_text(self, delta: str) -> None:
        if not delta:
            return
        self._note("user", delta)
        self._in_sent += delta
        start = self._input_end_ms if self._input_end_ms else self._turn_start_ms
        end = max(start, self._in_ms())
        self._input_end_ms = end
        self._send({"type": "session.input_transcript.delta", "delta": delta, "start_ms": start, "end_ms": end})

    def _delegate(self, call_id: str) -> None:
        if len(self._delegations) >= self.limits.max_open_delegations:  # the oldest answered ones go first
            for did in [d for d, c in self._delegations.items() if c is None][: len(self._delegations) // 2 or 1]:
                del self._delegations[did]
        did = new_id("del")
        self._delegations[did] = call_id
        assert self.config is not None
        if self.config.delegation["type"] != "responses":
            self._send({"type": "session.delegation.created", "offset_ms": self.now_ms(),
                        "delegation": {"id": did, "type": "delegation", "target": "client"}})
            return
        settings = self.config.delegation["responses"]
        messages: list[dict[str, Any]] = []
        if settings.get("instructions"):
            messages.append({"role": "system", "content": settings["instructions"]})
        turns = [(role, text.strip()) for role, text in self._transcript if text.strip()]
        while turns and turns[-1][0] == "assistant":  # the voice's preamble for this very request, played before
            turns.pop()  # its response.done: the request ends with the user's words, as a chat backend expects
        messages += [{"role": role, "content": text} for role, text in turns]
        if not messages or messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": "(the user's request, as heard above)"})
        try:
            rid = self._backend_request(did, messages)
        except ProtocolError as exc:
            log.info("live session %s: delegation not started: %s", self.id, exc.message)
            self._speak_result(did, "I cannot take on another request right now.")
            return
        self._send({"type": "session.delegation.created", "offset_ms": self.now_ms(),
                    "delegation": {"id": did, "type": "delegation", "target": "responses", "response_id": rid}})
        self._response_event(rid, {"type": "response.created", "response": self._snapshot(rid, "in_progress")})

    # ---- Responses delegation ------------------------------------------------------------------------
    def take_backend_jobs(self) -> list[BackendJob]:
        out, self._jobs = self._jobs, []
        return out

    def _backend_request(self, did: str, messages: list[dict[str, Any]]) -> str:
        assert self.config is not None
        settings = self.config.delegation["responses"]
        if len(self._backend) >= MAX_BACKEND_RESPONSES:
            raise ProtocolError("too_many_pending", f"at most {MAX_BACKEND_RESPONSES} delegated responses may run at once")
        rid = new_id("resp")
        body: dict[str, Any] = {"model": settings["model"], "messages": messages}
        if settings["tools"]:
            body["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
                             for t in settings["tools"]]
            choice = settings["tool_choice"]
            body["tool_choice"] = ({"type": "function", "function": {"name": choice["name"]}} if isinstance(choice, dict) else choice)
            if settings.get("parallel_tool_calls") is not None:
                body["parallel_tool_calls"] = settings["parallel_tool_calls"]
        if settings.get("max_output_tokens"):
            body["max_tokens"] = settings["max_output_tokens"]
        self._backend[rid] = _BackendResponse(did, messages)
        self._jobs.append(BackendJob(rid, did, body))
        return rid

    def _snapshot(self, rid: str, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """A reduced response object, as Live sends its lifecycle events (output, tools, input left out)."""
        assert self.config is not None
        snap: dict[str, Any] = {"id": rid, "object": "response", "status": status, "model": self.config.delegation["responses"]["model"],
                                "output": [], "created_at": int(self.wall())}
        if error is not None:
            snap["error"] = error
        return snap

    def _response_event(self, rid: str, event: dict[str, Any]) -> None:
        state = self._backend.get(rid)
        if state is None:
            return
        state.seq += 1
        self._send({"type": "response.event", "delegation_id": state.delegation_id,
                    "event": {**event, "sequence_number": state.seq}})

    def receive_backend(self, rid: str, kind: str, data: Any) -> None:
        """The backend's stream for response ``rid``: ``text`` deltas, finished ``tool_call``s, ``done``, ``error``."""
        state = self._backend.get(rid)
        if state is None or self.state == "closed":
            return
        if kind == "text":
            if state.message_id is None:
                state.message_id = new_id("msg")
                self._response_event(rid, {"type": "response.output_item.added", "output_index": 0, "item": {
                    "id": state.message_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}})
            state.text += data
            self._response_event(rid, {"type": "response.output_text.delta", "item_id": state.message_id, "output_index": 0,
                                       "content_index": 0, "delta": data})
        elif kind == "tool_call":
            item = {"id": new_id("fc"), "type": "function_call", "status": "completed", "call_id": data["id"] or new_id("call"),
                    "name": data["name"], "arguments": data["arguments"]}
            state.calls.append(item)
            self._response_event(rid, {"type": "response.output_item.done", "output_index": len(state.calls), "item": item})
        elif kind == "done":
            if state.message_id is not None:
                self._response_event(rid, {"type": "response.output_text.done", "item_id": state.message_id, "output_index": 0,
                                           "content_index": 0, "text": state.text})
                self._response_event(rid, {"type": "response.output_item.done", "output_index": 0, "item": {
                    "id": state.message_id, "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": state.text, "annotations": []}]}})
            self._response_event(rid, {"type": "response.completed", "response": self._snapshot(rid, "completed")})
            self._backend.pop(rid, None)
            if state.calls:  # the client runs them: response.item.create (outputs) then response.create
                self._calls_waiting[state.delegation_id] = {
                    "messages": state.messages + [{"role": "assistant", "content": state.text or None, "tool_calls": [
                        {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in state.calls]}],
                    "outputs": {c["call_id"]: None for c in state.calls}}
            elif state.text.strip():
                self._speak_result(state.delegation_id, state.text.strip())
        elif kind == "error":
            self._response_event(rid, {"type": "response.failed", "response": self._snapshot(
                rid, "failed", {"code": "server_error", "message": str(data)})})
            self._backend.pop(rid, None)
            self._speak_result(state.delegation_id, "The request could not be completed.")

    def _speak_result(self, did: str, text: str) -> None:
        if len(text) > self.limits.max_append_chars:
            text = text[: self.limits.max_append_chars]
        try:
            self._add_result(did, text, None, background=False)
        except ProtocolError as exc:  # too many waiting to be spoken: said later is better than lost, but capped
            log.info("live session %s: backend result not spoken: %s", self.id, exc.message)

    def _item_create(self, event: dict[str, Any], eid: str | None) -> None:
        known_keys(event, ("type", "event_id", "item"), "response.item.create")
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call_output":
            raise ProtocolError("unsupported_value", "response.item.create takes a function_call_output item here", "item.type")
        known_keys(item, ("type", "call_id", "output", "id", "status"), "item")
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(output, str) or len(output) > self.limits.max_append_chars * 4:
            raise ProtocolError("invalid_value", f"item.output must be a string of at most {self.limits.max_append_chars * 4} "
                                "characters", "item.output")
        for waiting in self._calls_waiting.values():
            if call_id in waiting["outputs"]:
                if waiting["outputs"][call_id] is not None:
                    raise ProtocolError("invalid_value", f"call {str(call_id)[:64]!r} already has its output", "item.call_id")
                waiting["outputs"][call_id] = output
                return
        raise ProtocolError("invalid_value", f"no open function call {str(call_id)[:64]!r}", "item.call_id")

    def _continue(self, event: dict[str, Any], eid: str | None) -> None:
        known_keys(event, ("type", "event_id", "response"), "response.create")
        ready = [did for did, w in self._calls_waiting.items() if all(o is not None for o in w["outputs"].values())]
        if not ready:
            if self._calls_waiting:
                raise ProtocolError("function_call_outputs_required", "every open function call needs its "
                                    "function_call_output before response.create", "type")
            raise ProtocolError("invalid_request_error", "no delegated response is waiting for function call outputs", "type")
        did = ready[0]
        waiting = self._calls_waiting.pop(did)
        messages = waiting["messages"] + [{"role": "tool", "tool_call_id": cid, "content": out}
                                          for cid, out in waiting["outputs"].items()]
        rid = self._backend_request(did, messages)
        self._response_event(rid, {"type": "response.created", "response": self._snapshot(rid, "in_progress")})

    def _core_error(self, err: dict[str, Any]) -> None:
        eid = err.get("event_id")
        client_eid = eid[len(CORE_EVENT_PREFIX):] if isinstance(eid, str) and eid.startswith(CORE_EVENT_PREFIX) else None
        if err.get("code") == "conversation_already_has_active_response" and self._inflight is not None:
            self._speech_queue.appendleft(self._inflight)  # a turn's answer started first: this one waits for it
            self._inflight = None
            return
        if client_eid is not None and self._core_active == "pending":  # our answer was refused: the next may go
            self._core_active, self._inflight = None, None
            self._flush_speech()
        self.send_error(ProtocolError(err.get("code") or "server_error", err.get("message") or "error", err.get("param"),
                                      err.get("type") or "invalid_request_error"), client_eid)

    # ---- output stream -------------------------------------------------------------------------------
    @property
    def _bps(self) -> int:
        return self.config.bytes_per_sample if self.config is not None else 2

    def _queue_audio(self, data: bytes) -> None:
        if self._out_resampler is not None:
            data = float_to_pcm16(self._out_resampler.process(pcm16_to_float(data)))
        cap = int(self.limits.max_buffered_output_s * self._out_rate) * self._bps
        if len(self._out_buf) + len(data) > cap:
            log.warning("live session %s: output audio over %.0f s ahead of real time; dropped", self.id, self.limits.max_buffered_output_s)
            return
        self._out_buf.extend(data)

    def _flush_out_resampler(self) -> None:
        if self._out_resampler is not None:
            tail = self._out_resampler.flush()
            if len(tail):
                self._out_buf.extend(float_to_pcm16(tail))

    def _barge_in(self) -> None:
        """The user started speaking: what the voice has not played yet is dropped (the core cancels its answer);
        open delegations stay open."""
        self._out_buf.clear()
        self._out_text.clear()
        if self._out_resampler is not None:
            self._out_resampler.reset()

    def _silence(self, n: int) -> bytes:
        assert self.config is not None
        fill = b"\xff" if self.config.format_type == "audio/pcmu" else b"\xd5" if self.config.format_type == "audio/pcma" else b"\x00"
        return fill * (n * self._bps)

    def tick(self) -> None:
        """Advance the real-time stream to the clock (plus the lead), release transcripts whose audio has
        started, send usage, and end a close or an expired session."""
        if self.state in ("new", "closed"):
            return
        now = self.clock()
        due = int((now - self._t0 + self.limits.output_lead_s) * self._out_rate) - self._out_sent
        if not self.media_track and due >= int(self._out_rate * self.limits.tick_s / 2):
            nbytes = due * self._bps
            chunk = bytes(self._out_buf[:nbytes])
            del self._out_buf[:nbytes]
            if len(chunk) < nbytes:
                chunk += self._silence((nbytes - len(chunk)) // self._bps)
            self._out_sent += due
            self._send({"type": "session.output_audio.delta", "delta": base64.b64encode(chunk).decode("ascii")})
        while self._out_text and self._out_text[0][0] <= self._out_sent:
            pos, text = self._out_text.popleft()
            self._note("assistant", text)
            end = self._out_text[0][0] if self._out_text else self._out_sent + len(self._out_buf) // self._bps
            start_ms = int(pos * 1000 / self._out_rate)
            self._send({"type": "session.output_transcript.delta", "delta": text, "start_ms": start_ms,
                        "end_ms": max(start_ms, int(end * 1000 / self._out_rate))})
        if now - self._last_usage >= self.limits.usage_interval_s:
            self._last_usage = now
            self._send({"type": "session.usage.updated", "usage": {"seconds": self.usage_seconds()}})
        if self.state == "closing":
            speaking = self._core_active is not None or self._speech_queue or self._out_buf
            if not speaking or now - self._close_started >= self.limits.drain_timeout_s:
                self._finish("close_requested", self._close_event_id)
        elif self.wall() >= self._expires_at:
            self._finish("expired", None)

    def _finish(self, reason: str, eid: str | None) -> None:
        self.close_reason = reason
        self._send({"type": "session.closed", "reason": reason, "session": self.resource(),
                    "usage": {"seconds": self.usage_seconds()}}, eid)
        self.state = "closed"
        self.finished = True

    def live_state(self) -> dict[str, int]:
        return {"open_delegations": sum(1 for c in self._delegations.values() if c is not None),
                "pending_speech": len(self._speech_queue), "buffered_output_bytes": len(self._out_buf)}
