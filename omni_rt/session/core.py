"""One OpenAI Realtime session, sans-I/O: client events, audio-in events and response outputs in; server
events and pipeline commands out.

Inputs: ``receive_message`` (a raw client message), ``receive_event`` (an already parsed one, e.g. from the
Twilio bridge), ``receive_asr`` (audio-in stage events, ``omni_rt.contracts.payloads``; in ``turn_taking``),
``receive_output`` / ``receive_result`` / ``receive_failure`` (a response's stream chunks by role, its end; in
``responses``). Outputs: ``events_to_send()`` (server events, in order), ``commands()``
(``omni_rt.session.commands``) and ``observations()`` (timings for metrics). Client-event handlers live in
``handlers``; this class keeps the state and the outgoing queue.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from omni_rt.audio import PIPELINE_INPUT_RATE
from omni_rt.audio.formats import InputDecoder, OutputEncoder
from omni_rt.realtime.errors import ProtocolError, error_event
from omni_rt.realtime.events import BETA_SERVER_NAMES, event_id_of, new_id, parse_client_message
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session import commands as cmd
from omni_rt.session.conversation import Conversation
from omni_rt.session.response import Response
from omni_rt.session.responses import ResponseLifecycle
from omni_rt.session.turn import TurnTracker
from omni_rt.session.turn_taking import TurnTaking

log = logging.getLogger("omni_rt.session")


@dataclass(frozen=True)
class SessionLimits:
    """Per-session caps; each refusal names its number."""

    max_append_bytes: int = 1 << 20  # one append: ~21 s of 24 kHz PCM16
    max_outgoing_bytes: int = 16 << 20  # queued for a client that does not read: then the session is closed
    max_response_tokens: int = 96
    # the thinker's budget for one item (omni_rt.engine.history): tokens of a text, and the most one item may
    # hold; an item above it could never be part of a prompt and is refused at conversation.item.create
    item_tokens: Callable[[str], int] | None = None
    max_item_tokens: int = 0
    item_budget_note: str = ""


@dataclass(frozen=True)
class SessionOptions:
    model_name: str = "omni-rt"
    speculative_responses: bool = True
    beta_events: bool = False
    voices: tuple[str, ...] = ("default",)  # the preset's voices; the first is the default


class RealtimeSession(TurnTaking, ResponseLifecycle):
    def __init__(self, options: SessionOptions | None = None, limits: SessionLimits | None = None,
                 session: dict[str, Any] | None = None) -> None:
        """``session``: an initial ``session.update`` payload (the Twilio bridge fixes μ-law in and out)."""
        self.options = options or SessionOptions()
        self.limits = limits or SessionLimits()
        self.id = new_id("sess")
        voices = tuple(self.options.voices) or ("default",)
        self.config = SessionConfig(model=self.options.model_name, beta_events=self.options.beta_events, voices=voices, voice=voices[0])
        if session is not None:
            self.config.update(session)
        self.conversation = Conversation()
        self.turns = TurnTracker()
        self.response: Response | None = None  # the active response (at most one, as the protocol says)
        self.decoder = InputDecoder(self.config.input_format, target_rate=PIPELINE_INPUT_RATE)
        self.closed = False
        self._events: deque[dict[str, Any]] = deque()
        self._queued_bytes = 0
        self._commands: list[cmd.Command] = []
        self._responses: dict[str, tuple[Response, OutputEncoder | None]] = {}  # running in the pipeline
        self.stats = {"errors": 0, "speculative_released": 0, "speculative_discarded": 0}
        self._observations: list[tuple[str, float]] = []  # (metric, seconds) for the driver's /metrics
        self.log = logging.LoggerAdapter(log, {"session_id": self.id})

    def events_to_send(self) -> list[dict[str, Any]]:
        out = list(self._events)
        self._events.clear()
        self._queued_bytes = 0
        return out

    def observations(self) -> list[tuple[str, float]]:
        """Timings since the last call: ``ttfa``, ``thinker_first_token``, ``asr_final`` (seconds), and
        ``speculative_released`` / ``speculative_discarded`` (count 1 each)."""
        out, self._observations = self._observations, []
        return out

    def commands(self) -> list[cmd.Command]:
        out, self._commands = self._commands, []
        return out

    def requeue_unsent(self, events: list[dict[str, Any]]) -> None:
        """The driver could not send these yet: keep them first in line (caps still count them)."""
        for ev in reversed(events):
            self._events.appendleft(ev)
            self._queued_bytes += len(ev.get("delta", "")) if isinstance(ev.get("delta"), str) else 0

    def send(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        event.setdefault("event_id", new_id("event"))
        if self.config.beta_events:
            event["type"] = BETA_SERVER_NAMES.get(event["type"], event["type"])
        self._events.append(event)
        delta = event.get("delta")
        self._queued_bytes += len(delta) if isinstance(delta, str) else 0
        if self._queued_bytes > self.limits.max_outgoing_bytes:
            self._overflow()

    def purge_audio(self, response_id: str) -> None:
        """Drop a cancelled answer's queued audio: nothing more of it reaches the listener."""
        kept = [ev for ev in self._events if not (ev.get("response_id") == response_id and ev["type"].endswith("audio.delta"))]
        self._events = deque(kept)
        self._queued_bytes = sum(len(ev["delta"]) for ev in kept if isinstance(ev.get("delta"), str))

    def send_error(self, exc: ProtocolError, event_id: str | None = None) -> None:
        self.stats["errors"] += 1
        self._observations.append((f"error.{exc.code}", 1))
        self.send(error_event(exc.code, exc.message, exc.param, event_id, exc.type))

    def _overflow(self) -> None:
        """The client stopped reading: free its answer now and close rather than buffer without bound."""
        self.cancel_active("client_cancelled")
        self._commands.append(cmd.CloseConnection(
            1008, f"client is not reading: over {self.limits.max_outgoing_bytes} bytes of events queued"))
        self.close()

    def open(self) -> None:
        self._commands.append(cmd.OpenAudioIn(self.config.asr_params()))
        self.send({"type": "session.created", "session": self.config.render(self.id)})

    def close(self) -> None:
        """Free everything the session holds: held and active answers, audio-in state."""
        if self.closed:
            return
        for turn in self.turns.held():
            self._discard_held(turn)
        self.cancel_active("client_cancelled")
        for rid in list(self._responses):
            self._commands.append(cmd.AbortResponse(rid))
        self._responses.clear()
        self._commands.append(cmd.CloseAudioIn())
        self.closed = True

    def receive_message(self, raw: str | bytes) -> None:
        """Parse and dispatch one client message; every problem becomes an ``error`` event."""
        try:
            event = parse_client_message(raw)
        except ProtocolError as exc:
            self.send_error(exc, event_id_of(raw))
            return
        self.receive_event(event)

    def receive_event(self, event: dict[str, Any]) -> None:
        from omni_rt.session.handlers import dispatch

        try:
            dispatch(self, event)
        except ProtocolError as exc:
            eid = event.get("event_id")
            self.send_error(exc, eid if isinstance(eid, str) and len(eid) <= 128 else None)

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

    def apply_config(self, config: SessionConfig) -> None:
        old_input = self.config.input_format
        self.config = config
        if config.input_format != old_input:
            self.decoder = InputDecoder(config.input_format, target_rate=PIPELINE_INPUT_RATE)
        self._commands.append(cmd.UpdateAudioIn(config.asr_params()))
        self.send({"type": "session.updated", "session": config.render(self.id)})

    def commit(self, event_id: str | None) -> None:
        self.turns.commit_event_ids.append(event_id)
        self._commands.append(cmd.ControlAudioIn("commit"))

    def clear_audio(self) -> None:
        self._commands.append(cmd.ControlAudioIn("clear"))

    def live_state(self) -> dict[str, int]:
        """Per-session entries still held (tests assert they return to zero)."""
        return {"responses": len(self._responses), "turns": self.turns.live(), "queued_events": len(self._events)}
