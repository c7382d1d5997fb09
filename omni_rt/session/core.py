"""One OpenAI Realtime session, sans-I/O: client events, audio-in events and response outputs in; server
events and pipeline commands out.

Inputs: ``receive_message`` (a raw client message), ``receive_event`` (an already parsed one, e.g. from the
Twilio bridge), ``receive_asr`` (audio-in stage events, ``omni_rt.contracts.payloads``), ``receive_output`` /
``receive_result`` / ``receive_failure`` (a response's stream chunks by role, its end). Outputs:
``events_to_send()`` (server events, in order), ``commands()`` (``omni_rt.session.commands``) and
``observations()`` (timings for metrics).

``RealtimeSession`` is a small coordinator of explicit parts, each a plain class with its own state, handed
what it needs: ``Outbox`` (the outgoing events), ``Conversation`` (the items), ``HeldAnswers`` (speculative
answers kept until the turn ends), ``ToolCallItems`` (function-call output items), ``ResponseLifecycle`` (the
active and running responses), ``TurnTaking`` (audio-in events, by turn) and ``ConfigUpdates`` (the config,
``session.update`` applied and confirmed). It keeps the input decoder and the client-event dispatch table;
``handlers`` validates each client event's fields.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from omni_rt.audio import PIPELINE_INPUT_RATE
from omni_rt.audio.formats import InputDecoder
from omni_rt.contracts import payloads as c
from omni_rt.realtime.errors import ProtocolError, error_event
from omni_rt.realtime.events import BETA_CLIENT_ALIASES, event_id_of, new_id, parse_client_message
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session import commands as cmd
from omni_rt.session import handlers as h
from omni_rt.session.config_updates import ConfigUpdates
from omni_rt.session.conversation import Conversation
from omni_rt.session.held_answers import HeldAnswers
from omni_rt.session.options import SessionLimits, SessionOptions
from omni_rt.session.outbox import Outbox
from omni_rt.session.response_lifecycle import ResponseLifecycle
from omni_rt.session.response_state import Response
from omni_rt.session.tool_call_items import ToolCallItems
from omni_rt.session.turn_taking import TurnTaking

__all__ = ["RealtimeSession", "SessionLimits", "SessionOptions"]

log = logging.getLogger("omni_rt.session")


class RealtimeSession:
    def __init__(self, options: SessionOptions | None = None, limits: SessionLimits | None = None,
                 session: dict[str, Any] | None = None) -> None:
        """``session``: an initial ``session.update`` payload (the Twilio bridge fixes μ-law in and out)."""
        self.options = options or SessionOptions()
        self.limits = limits or SessionLimits()
        self.id = new_id("sess")
        voices = tuple(self.options.voices) or ("default",)
        config = SessionConfig(model=self.options.model_name, beta_events=self.options.beta_events, voices=voices, voice=voices[0])
        if session is not None:
            config.update(session)
        self.decoder = InputDecoder(config.input_format, target_rate=PIPELINE_INPUT_RATE)
        self.closed = False
        self._unheard_audio = False  # input audio the stage holds uncommitted: an expiry would drop it
        self.log = logging.LoggerAdapter(log, {"session_id": self.id})
        self._errors = 0
        self._commands: list[cmd.Command] = []
        self._observations: list[tuple[str, float]] = []  # (metric, seconds) for the driver's /metrics
        current: Callable[[], SessionConfig] = lambda: self.config  # noqa: E731 - session.update replaces it
        self.outbox = Outbox(self.limits.max_outgoing_bytes, config.beta_events, self._overflow)
        send = self.outbox.send
        self.config_updates = ConfigUpdates(self.id, config, send=send, send_error=self.send_error, commands=self._commands)
        self.conversation = Conversation()
        self.conversation.truncation = lambda: self.config.truncation
        self.conversation.on_evict = lambda it: send({"type": "conversation.item.deleted", "item_id": it.id})
        self.held = HeldAnswers(send, self.conversation, self._observations)
        self.tool_calls = ToolCallItems(self.conversation, self.held.emit)
        self.responses = ResponseLifecycle(
            self.id, send=send, purge_audio=self.outbox.purge_audio, commands=self._commands, observations=self._observations,
            conversation=self.conversation, held=self.held, tool_calls=self.tool_calls, config=current,
            max_response_tokens=self.limits.max_response_tokens, log=self.log,
            prefill_hints=self.options.speculative_responses, tool_preamble=self.options.tool_preamble,
            backchannel_filter=self.options.backchannel_filter)
        self.turn_taking = TurnTaking(
            send=send, send_error=self.send_error, commands=self._commands, observations=self._observations,
            conversation=self.conversation, responses=self.responses, config=current,
            speculative_responses=self.options.speculative_responses, log=self.log)
        self._handlers = self._client_handlers()

    def _client_handlers(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        """The dispatch table: each GA client event to its handler, with the parts it acts on."""
        conv, responses, send, limits = self.conversation, self.responses, self.send, self.limits
        return {
            "session.update": lambda e: self.apply_config(h.session_update(e, self.config, limits)),
            "input_audio_buffer.append": lambda e: self.append_audio(h.input_audio_append(e)),
            "input_audio_buffer.commit": lambda e: self.turn_taking.commit(h.input_audio_commit(e)),
            "input_audio_buffer.clear": lambda e: self._commands.append(cmd.ClearAudioIn()),
            "conversation.item.create": lambda e: h.item_create(e, conv, limits, send),
            "conversation.item.delete": lambda e: h.item_delete(e, conv, send),
            "conversation.item.retrieve": lambda e: h.item_retrieve(e, conv, send),
            "conversation.item.truncate": lambda e: h.item_truncate(e, conv, responses, send),
            "response.create": lambda e: h.response_create(e, self.config, limits, conv, responses),
            "response.cancel": lambda e: h.response_cancel(e, responses),
        }

    # ---- outputs -------------------------------------------------------------------------------------
    def events_to_send(self) -> list[dict[str, Any]]:
        return self.outbox.drain()

    def observations(self) -> list[tuple[str, float]]:
        """Timings since the last call: ``ttfa``, ``thinker_first_token``, ``asr_final`` (seconds), and
        ``speculative_released`` / ``speculative_discarded`` (count 1 each)."""
        out = list(self._observations)
        self._observations.clear()  # the parts hold this list: emptied, never replaced
        return out

    def commands(self) -> list[cmd.Command]:
        out = list(self._commands)
        self._commands.clear()
        return out

    def requeue_unsent(self, events: list[dict[str, Any]]) -> None:
        """The driver could not send these yet: keep them first in line (caps still count them)."""
        self.outbox.requeue(events)

    def send(self, event: dict[str, Any]) -> None:
        self.outbox.send(event)

    def send_error(self, exc: ProtocolError, event_id: str | None = None) -> None:
        self._errors += 1
        self._observations.append((f"error.{exc.code}", 1))
        self.send(error_event(exc.code, exc.message, exc.param, event_id, exc.type))

    @property
    def config(self) -> SessionConfig:
        """The config in force (``session.update`` replaces it: read it at each use)."""
        return self.config_updates.config

    @property
    def response(self) -> Response | None:
        """The active response (at most one, as the protocol says)."""
        return self.responses.active

    @property
    def stats(self) -> dict[str, int]:
        return {"errors": self._errors, "speculative_released": self.held.released, "speculative_discarded": self.held.discarded,
                "responses": self.responses.finished, "items": len(self.conversation.items)}

    def live_state(self) -> dict[str, int]:
        """Per-session entries still held (tests assert they return to zero)."""
        return {"responses": self.responses.live(), "turns": self.turn_taking.turns.live(), "queued_events": len(self.outbox)}

    # ---- lifecycle -----------------------------------------------------------------------------------
    def open(self) -> None:
        self._commands.append(self.config_updates.open_op())
        self.send({"type": "session.created", "session": self.config.render(self.id)})

    def _overflow(self) -> None:
        """The client stopped reading: free its answer now and close rather than buffer without bound."""
        self.responses.cancel_active("client_cancelled")
        self._commands.append(cmd.CloseConnection(
            1008, f"client is not reading: over {self.limits.max_outgoing_bytes} bytes of events queued"))
        self.close()

    def close(self) -> None:
        """Free everything the session holds: held and active answers, audio-in state."""
        if self.closed:
            return
        self.turn_taking.discard_all_held()
        self.responses.cancel_active("client_cancelled")
        self.responses.abort_running()
        self._commands.append(cmd.CloseAudioIn())
        self.closed = self.outbox.closed = True

    # ---- inputs --------------------------------------------------------------------------------------
    def receive_message(self, raw: str | bytes) -> None:
        """Parse and dispatch one client message; every problem becomes an ``error`` event."""
        try:
            event = parse_client_message(raw)
        except ProtocolError as exc:
            self.send_error(exc, event_id_of(raw))
            return
        self.receive_event(event)

    def receive_event(self, event: dict[str, Any]) -> None:
        try:
            etype = event.get("type")
            if not isinstance(etype, str):
                raise ProtocolError("missing_required_parameter", "event has no string 'type'", "type")
            handler = self._handlers.get(BETA_CLIENT_ALIASES.get(etype, etype))
            if handler is None:
                raise ProtocolError("unknown_event", f"unknown event type '{etype[:64]}'", "type")
            handler(event)
        except ProtocolError as exc:
            eid = event.get("event_id")
            self.send_error(exc, eid if isinstance(eid, str) and len(eid) <= 128 else None)

    def receive_asr(self, ev: c.AsrEvent) -> None:
        if self.closed:
            return
        if isinstance(ev, (c.AudioInUpdated, c.AudioInUpdateRefused)):
            self.config_updates.receive(ev)
        elif isinstance(ev, c.SessionExpired):
            self._audio_in_expired(ev)
        else:
            if isinstance(ev, c.SpeechStarted):
                self._unheard_audio = True
            elif isinstance(ev, (c.Committed, c.Cleared)):
                self._unheard_audio = False
            self.turn_taking.receive(ev)

    def _audio_in_expired(self, ev: c.SessionExpired) -> None:
        """The audio-in stage freed this session's state after ``idle_s`` with no audio or op (its guard against
        sessions nobody closes). This session is still open (text turns, a muted mic), so the state is opened
        again with the current config and the next append is heard as before; the client hears of it only
        when audio it had sent and not had committed was dropped (a turn in progress, or a manual buffer)."""
        self._commands.append(self.config_updates.open_op())
        if self._unheard_audio:
            self.send_error(ProtocolError("session_expired", f"no input audio for {ev.idle_s:.0f} s: the uncommitted "
                                          "input audio buffer was dropped", type_="server_error"))
        self._unheard_audio = False

    def receive_output(self, response_id: str, role: str, data: Any) -> None:
        """A stream chunk of a running response, by the role of the stage that produced it."""
        if not self.closed:
            self.responses.receive_output(response_id, role, data)

    def receive_result(self, response_id: str, result: Any) -> None:
        self.responses.receive_result(response_id, result)

    def receive_failure(self, response_id: str, code: str, stage: str, message: str) -> None:
        self.responses.receive_failure(response_id, code, stage, message)

    def append_audio(self, raw: bytes) -> None:
        if len(raw) > self.limits.max_append_bytes:
            raise ProtocolError("audio_too_large", f"one append carries at most {self.limits.max_append_bytes} bytes of audio, got {len(raw)}", "audio")
        if not raw:
            return
        try:
            pcm = self.decoder.decode(raw)
        except ValueError as exc:
            raise ProtocolError("invalid_audio", f"{exc} (format {self.config.input_format})", "audio") from None
        if len(pcm):
            self._commands.append(cmd.AppendAudio(pcm))
            if self.config.turn_detection is None:  # a manual buffer: held until the client commits it
                self._unheard_audio = True

    def apply_config(self, config: SessionConfig) -> None:
        """A validated ``session.update`` (``config_updates`` confirms it)."""
        if config.input_format != self.config.input_format:
            self.decoder = InputDecoder(config.input_format, target_rate=PIPELINE_INPUT_RATE)
        self.config_updates.apply(config)
