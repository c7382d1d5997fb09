"""One OpenAI Realtime session, sans-I/O: client events, audio-in events and response outputs in; server
events and pipeline commands out.

Inputs: ``receive_message`` (a raw client message), ``receive_event`` (an already parsed one, e.g. from the
Twilio bridge), ``receive_asr`` (audio-in stage events, ``omni_rt.stages.contracts``), ``receive_output`` /
``receive_failure`` (a response's stream chunks by role, its end). Outputs: ``events_to_send()`` (server
events, in order) and ``commands()`` (``omni_rt.session.commands``). Client-event handlers live in
``handlers``; this class keeps the state and the response lifecycle.
"""

from __future__ import annotations

import base64
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from omni_rt.audio import PIPELINE_INPUT_RATE, PIPELINE_OUTPUT_RATE
from omni_rt.audio.formats import InputDecoder, OutputEncoder
from omni_rt.audio.pcm import pcm16_to_float
from omni_rt.realtime.errors import ProtocolError, error_event
from omni_rt.realtime.events import BETA_SERVER_NAMES, event_id_of, new_id, parse_client_message
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session import commands as cmd
from omni_rt.session.conversation import Conversation, Item
from omni_rt.session.response import Response, ResponseState
from omni_rt.session.turn import Turn, TurnTracker
from omni_rt.stages import contracts as c

log = logging.getLogger("omni_rt.session")


@dataclass(frozen=True)
class SessionLimits:
    """Per-session caps; each refusal names its number."""

    max_append_bytes: int = 1 << 20  # one append: ~21 s of 24 kHz PCM16
    max_outgoing_bytes: int = 16 << 20  # queued for a client that does not read: then the session is closed
    max_response_tokens: int = 96


@dataclass(frozen=True)
class SessionOptions:
    model_name: str = "omni-rt"
    speculative_responses: bool = True
    beta_events: bool = False
    voices: tuple[str, ...] = ("default",)  # the preset's voices; the first is the default


class RealtimeSession:
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

    # ---- outputs -------------------------------------------------------------------------------------
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

    def send_error(self, exc: ProtocolError, event_id: str | None = None) -> None:
        self.stats["errors"] += 1
        self._observations.append((f"error.{exc.code}", 1))
        self.send(error_event(exc.code, exc.message, exc.param, event_id, exc.type))

    def _overflow(self) -> None:
        """The client stopped reading: free its answer now and close rather than buffer without bound."""
        self._cancel_active("client_cancelled")
        self._commands.append(cmd.CloseConnection(
            1008, f"client is not reading: over {self.limits.max_outgoing_bytes} bytes of events queued"))
        self.close()

    # ---- lifecycle -----------------------------------------------------------------------------------
    def open(self) -> None:
        self._commands.append(cmd.OpenAudioIn(self.config.asr_params()))
        self.send({"type": "session.created", "session": self.config.render(self.id)})

    def close(self) -> None:
        """Free everything the session holds: held and active answers, audio-in state."""
        if self.closed:
            return
        for turn in self.turns.held():
            self._discard_held(turn)
        self._cancel_active("client_cancelled")
        for rid in list(self._responses):
            self._commands.append(cmd.AbortResponse(rid))
        self._responses.clear()
        self._commands.append(cmd.CloseAudioIn())
        self.closed = True

    # ---- client events -------------------------------------------------------------------------------
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

    # ---- audio-in stage events -----------------------------------------------------------------------
    def receive_asr(self, ev: c.AsrEvent) -> None:
        if self.closed:
            return
        td = self.config.turn_detection or {}
        if isinstance(ev, c.SpeechStarted):
            for turn in self.turns.held():
                self._discard_held(turn)
            turn = self.turns.get(ev.turn)
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": int(ev.audio_start_ms), "item_id": turn.item_id})
            if td.get("interrupt_response", True):
                self._cancel_active("turn_detected")  # drops its queued audio, also what was queued before
        elif isinstance(ev, c.SpeechStopped):
            turn = self.turns.get(ev.turn)
            turn.mark_end()
            self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(ev.audio_end_ms), "item_id": turn.item_id})
        elif isinstance(ev, c.Committed):
            self._on_committed(ev)
        elif isinstance(ev, c.Cleared):
            for turn in self.turns.held():
                self._discard_held(turn)
            self.send({"type": "input_audio_buffer.cleared"})
        elif isinstance(ev, c.TranscriptPartial):
            self._on_partial(ev)
        elif isinstance(ev, c.SpeculationCancelled):
            turn = self.turns.peek(ev.turn)
            if turn is not None:
                self._discard_held(turn)
        elif isinstance(ev, c.TranscriptSpeculative):
            self._on_speculative(ev)
        elif isinstance(ev, c.TranscriptFinal):
            self._on_final(ev)
        elif isinstance(ev, c.TimeoutTriggered):
            turn = self.turns.get(ev.turn)
            self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": ev.audio_start_ms,
                       "audio_end_ms": ev.audio_end_ms, "item_id": turn.item_id})
        elif isinstance(ev, c.AsrError):
            event_id = None
            if ev.code == "input_audio_buffer_commit_empty" and self.turns.commit_event_ids:
                event_id = self.turns.commit_event_ids.popleft()
            self.send_error(ProtocolError(ev.code, ev.message), event_id)
        elif isinstance(ev, c.SessionExpired):
            self.send_error(ProtocolError("session_expired", "session idle for too long; audio state was reset", type_="server_error"))

    def _on_committed(self, ev: c.Committed) -> None:
        if ev.trigger == "commit" and self.turns.commit_event_ids:
            self.turns.commit_event_ids.popleft()
        turn = self.turns.get(ev.turn)
        turn.mark_end()
        turn.committed = True
        item = Item(id=turn.item_id, role="user", content=[{"type": "input_audio", "transcript": None}], status="completed")
        prev = self.conversation.add(item)
        self.send({"type": "input_audio_buffer.committed", "item_id": item.id, "previous_item_id": prev})
        self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})

    def _on_partial(self, ev: c.TranscriptPartial) -> None:
        """Partials re-decode the whole turn so far: send only what extends the text already sent."""
        turn = self.turns.peek(ev.turn)
        if turn is None or (self.config.transcription is None and self.config.session_type != "transcription"):
            return
        if ev.text.startswith(turn.partial_sent) and len(ev.text) > len(turn.partial_sent):
            delta, turn.partial_sent = ev.text[len(turn.partial_sent):], ev.text
            self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": turn.item_id,
                       "content_index": 0, "delta": delta})

    def _on_speculative(self, ev: c.TranscriptSpeculative) -> None:
        td = self.config.turn_detection or {}
        text = ev.text.strip()
        turn = self.turns.get(ev.turn)
        if (td.get("create_response", True) and text and turn.held is None and self.options.speculative_responses
                and self.config.session_type == "realtime"):
            turn.held = self._start_response(self.config, held_user_text=text)

    def _on_final(self, ev: c.TranscriptFinal) -> None:
        turn = self.turns.get(ev.turn)
        held, turn.held = turn.held, None
        self.turns.forget(ev.turn)
        text = ev.text
        try:
            item = self.conversation.get(turn.item_id)
        except ProtocolError:
            self._discard(held)
            return  # the client deleted the item before it was transcribed
        item.content = [{"type": "input_audio", "transcript": text}]
        self._observations.append(("asr_final", ev.after_end_ms / 1000))
        if self.config.transcription is not None or self.config.session_type == "transcription":
            self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id, "content_index": 0,
                       "transcript": text, "usage": {"type": "duration", "seconds": round(ev.audio_ms / 1000, 3)}})
        self.send({"type": "conversation.item.done", "previous_item_id": self.conversation.previous_id(item.id), "item": item.render()})
        td = self.config.turn_detection
        wants_answer = (td is not None and td.get("create_response", True) and self.config.session_type == "realtime"
                        and (text.strip() or ev.trigger == "timeout")  # an idle timeout's turn is answered though silent
                        and not self.turns.superseded(ev.turn))
        if not wants_answer:
            self._discard(held)
            return
        self._cancel_active("turn_detected")
        if held is not None and ev.speculative and held.spec_text == text.strip():
            self._release(held, turn)
            return
        self._discard(held)
        resp = self._start_response(self.config)
        resp.turn_end = turn.end_at or time.perf_counter()

    # ---- responses -----------------------------------------------------------------------------------
    def start_response(self, cfg: SessionConfig, metadata: dict[str, str] | None = None,
                       in_conversation: bool = True, input_items: list[Item] | None = None) -> Response:
        """A client's ``response.create``: refused while another response is active."""
        if self.config.session_type == "transcription":
            raise ProtocolError("invalid_request", "a transcription session creates no responses", "type")
        if self.response is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"response {self.response.id} is still in progress; cancel it first", None)
        return self._start_response(cfg, metadata=metadata, in_conversation=in_conversation, input_items=input_items)

    def _start_response(self, cfg: SessionConfig, held_user_text: str | None = None, metadata: dict[str, str] | None = None,
                        in_conversation: bool = True, input_items: list[Item] | None = None) -> Response:
        """Start an answer. With ``held_user_text`` it is prepared from a speculative transcript before the
        turn has ended: nothing reaches the client or the history until ``_release``."""
        item = Item(id=new_id("item"), role="assistant", content=[], status="in_progress")
        resp = Response(id=new_id("resp"), item=item, modalities=list(cfg.output_modalities), output_format=cfg.output_format,
                        voice=cfg.voice, max_output_tokens=cfg.max_output_tokens, metadata=metadata,
                        in_conversation=in_conversation)
        resp.turn_end = time.perf_counter()
        source = input_items if input_items is not None else self.conversation.items
        messages = Conversation.messages_of(source, cfg.instructions)
        if held_user_text is not None:
            resp.state, resp.spec_text = ResponseState.HELD, held_user_text
            messages.append({"role": "user", "content": held_user_text})
        else:
            self.response = resp
        cap = self.limits.max_response_tokens
        max_tokens = cap if cfg.max_output_tokens == "inf" else min(int(cfg.max_output_tokens), cap)
        payload: dict[str, Any] = {"messages": messages, "session_id": self.id if in_conversation else None, "max_tokens": max_tokens}
        if cfg.tools and cfg.tool_choice != "none":
            payload["tools"] = [dict(t) for t in cfg.tools]
            payload["tool_choice"] = cfg.tool_choice
        self._emit(resp, {"type": "response.created", "response": resp.render(self.id)})
        prev = self.conversation.add(item) if resp.state is ResponseState.ACTIVE and in_conversation else None
        self._emit(resp, {"type": "response.output_item.added", "response_id": resp.id, "output_index": 0, "item": item.render()})
        if in_conversation:
            self._emit(resp, {"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})
        part = {"type": "audio", "transcript": ""} if resp.speaks else {"type": "text", "text": ""}
        self._emit(resp, {"type": "response.content_part.added", "response_id": resp.id, "item_id": item.id, "output_index": 0,
                          "content_index": 0, "part": part})
        encoder = OutputEncoder(resp.output_format, source_rate=PIPELINE_OUTPUT_RATE) if resp.output_format != "audio/pcm" else None
        self._responses[resp.id] = (resp, encoder)
        self._commands.append(cmd.StartResponse(resp.id, payload))
        return resp

    def receive_output(self, response_id: str, role: str, data: Any) -> None:
        """A stream chunk of a running response, by the role of the stage that produced it."""
        entry = self._responses.get(response_id)
        if entry is None or self.closed:
            return  # an answer that was cancelled or discarded: its late outputs are dropped
        resp, encoder = entry
        if role == "text" and isinstance(data, c.TextDelta) and data.text:
            if not resp.text:
                self._observations.append(("thinker_first_token", time.perf_counter() - resp.started))
            resp.text += data.text
            kind = "response.output_audio_transcript.delta" if resp.speaks else "response.output_text.delta"
            self._emit(resp, {"type": kind, "response_id": resp.id, "item_id": resp.item.id, "output_index": 0,
                              "content_index": 0, "delta": data.text})
        elif role == "text" and isinstance(data, c.ToolCallDelta):
            self._on_call_delta(resp, data)
        elif role == "text" and isinstance(data, c.ToolCallDone):
            self._on_call_done(resp, data)
        elif role == "clauses" and resp.speaks and isinstance(data, c.Clause):
            resp.item.clause_ms.append((int(resp.clause_start_ms), data.text))
            resp.clause_start_ms += data.duration_ms
        elif role == "audio" and resp.speaks and isinstance(data, c.PcmChunk):
            pcm = encoder.encode(pcm16_to_float(data.pcm)) if encoder is not None else data.pcm
            self._send_audio(resp, pcm, data.samples)

    def _on_call_delta(self, resp: Response, d: c.ToolCallDelta) -> None:
        """The model is calling a tool: a ``function_call`` output item whose arguments stream."""
        item = resp.calls.get(d.index)
        if item is None:
            item = Item(id=new_id("item"), role="assistant", content=[], status="in_progress", type="function_call",
                        call_id=d.call_id, name=d.name)
            resp.calls[d.index] = item
            resp.output.append(item)
            prev = self.conversation.add(item) if resp.in_conversation and resp.state is ResponseState.ACTIVE else None
            self._emit(resp, {"type": "response.output_item.added", "response_id": resp.id, "output_index": resp.output_index(item),
                              "item": item.render()})
            if resp.in_conversation:
                self._emit(resp, {"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})
        if d.arguments_delta:
            item.arguments += d.arguments_delta
            self._emit(resp, {"type": "response.function_call_arguments.delta", "response_id": resp.id, "item_id": item.id,
                              "output_index": resp.output_index(item), "call_id": item.call_id, "delta": d.arguments_delta})

    def _on_call_done(self, resp: Response, d: c.ToolCallDone) -> None:
        item = resp.calls.get(d.index)
        if item is None:
            self._on_call_delta(resp, c.ToolCallDelta(d.index, d.call_id, d.name, ""))
            item = resp.calls[d.index]
        item.arguments, item.status = d.arguments, "completed"
        self._emit(resp, {"type": "response.function_call_arguments.done", "response_id": resp.id, "item_id": item.id,
                          "output_index": resp.output_index(item), "call_id": item.call_id, "name": item.name,
                          "arguments": item.arguments})
        self._emit(resp, {"type": "response.output_item.done", "response_id": resp.id, "output_index": resp.output_index(item),
                          "item": item.render()})
        if resp.in_conversation:
            self._emit(resp, {"type": "conversation.item.done", "previous_item_id": self.conversation.previous_id(item.id)
                              if item in self.conversation.items else None, "item": item.render()})

    def receive_result(self, response_id: str, result: Any) -> None:
        """The response's pipeline result: it completed."""
        entry = self._responses.pop(response_id, None)
        if entry is None:
            return
        resp, encoder = entry
        if encoder is not None and resp.speaks:
            self._send_audio(resp, encoder.flush(), 0)
        if isinstance(result, dict):
            resp.usage = {k: result.get(k) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}
        self._finish(resp, ResponseState.DONE)

    def receive_failure(self, response_id: str, code: str, stage: str, message: str) -> None:
        entry = self._responses.pop(response_id, None)
        if entry is None:
            return
        resp = entry[0]
        if resp.state is ResponseState.ACTIVE:
            self._emit(resp, error_event(code, f"response failed in stage '{stage}': {message}", type_="server_error"))
        self._finish(resp, ResponseState.FAILED, code)

    def _send_audio(self, resp: Response, data: bytes, samples: int) -> None:
        if not data:
            return
        if resp.first_audio is None and resp.state is ResponseState.ACTIVE:
            self._first_audio(resp)
        resp.item.audio_ms += int(samples * 1000 / PIPELINE_OUTPUT_RATE) if samples else 0
        self._emit(resp, {"type": "response.output_audio.delta", "response_id": resp.id, "item_id": resp.item.id, "output_index": 0,
                          "content_index": 0, "delta": base64.b64encode(data).decode("ascii")})

    def _first_audio(self, resp: Response) -> None:
        resp.first_audio = time.perf_counter()
        ttfa = resp.ttfa_ms()
        if ttfa is not None:
            self._observations.append(("ttfa", ttfa / 1000))
            self.log.info("response %s first audio %.0f ms after end of turn", resp.id, ttfa)

    def _emit(self, resp: Response, event: dict[str, Any]) -> None:
        """Send a response's event, or keep it while the response is held."""
        if resp.state is ResponseState.DISCARDED:
            return
        if resp.state is ResponseState.HELD:
            resp.held_events.append(event)
        else:
            self.send(event)

    def _release(self, resp: Response, turn: Turn) -> None:
        """The turn ended as speculated: the held answer joins the history and its events go out now."""
        resp.state = ResponseState.ACTIVE
        resp.turn_end = turn.end_at or time.perf_counter()
        prev = self.conversation.add(resp.item)
        for call in resp.calls.values():
            self.conversation.add(call)
        self.response = resp
        for ev in resp.held_events:
            if ev["type"] in ("conversation.item.added", "conversation.item.done"):
                ev["previous_item_id"] = prev
            if ev["type"] == "response.output_audio.delta" and resp.first_audio is None:
                self._first_audio(resp)
            self.send(ev)
        resp.held_events.clear()
        self.stats["speculative_released"] += 1
        self._observations.append(("speculative_released", 1))
        if resp.pending_final is not None:  # it finished while held
            self._finish(resp, *resp.pending_final)

    def _discard(self, resp: Response | None) -> None:
        """Drop a held answer without a trace on the wire (the user kept talking, or said something else)."""
        if resp is None or resp.state is not ResponseState.HELD:
            return
        resp.state = ResponseState.DISCARDED
        resp.held_events.clear()
        if self._responses.pop(resp.id, None) is not None:
            self._commands.append(cmd.AbortResponse(resp.id))
        self.stats["speculative_discarded"] += 1
        self._observations.append(("speculative_discarded", 1))

    def _discard_held(self, turn: Turn) -> None:
        held, turn.held = turn.held, None
        self._discard(held)

    def cancel_response(self, response_id: str | None) -> None:
        """A client's ``response.cancel``."""
        if self.response is None or (response_id is not None and response_id != self.response.id):
            raise ProtocolError("response_cancel_not_active", "there is no active response to cancel", "response_id")
        self._cancel_active("client_cancelled")

    def _cancel_active(self, reason: str) -> None:
        """Stop the active answer at once: abort it in the pipeline, drop its queued audio, finish it."""
        resp = self.response
        if resp is None:
            return
        if self._responses.pop(resp.id, None) is not None:
            self._commands.append(cmd.AbortResponse(resp.id))
        kept = [ev for ev in self._events if not (ev.get("response_id") == resp.id and ev["type"].endswith("audio.delta"))]
        self._events = deque(kept)
        self._queued_bytes = sum(len(ev["delta"]) for ev in kept if isinstance(ev.get("delta"), str))
        self._finish(resp, ResponseState.CANCELLED, reason)

    def _finish(self, resp: Response, state: ResponseState, reason: str | None = None) -> None:
        """Enter a final state and send the done events (a held response keeps them until release)."""
        if resp.state.final:
            return
        if resp.state is ResponseState.HELD:
            resp.pending_final = (state, reason)
            return
        if self.response is resp:
            self.response = None
        resp.transition(state, reason)
        if state is not ResponseState.DONE:
            ttfa = resp.ttfa_ms()
            self.log.info("response %s %s (%s)%s", resp.id, state.value, reason,
                          f", first audio after {ttfa:.0f} ms" if ttfa is not None else "")
        item = resp.item
        if resp.speaks:
            heard = item.content[0]["transcript"] if item.content else None  # set by truncate
            item.content = [{"type": "output_audio", "transcript": heard if heard is not None else resp.text}]
        else:
            item.content = [{"type": "output_text", "text": resp.text}]
        item.status = "completed" if state is ResponseState.DONE else "incomplete"
        base = {"response_id": resp.id, "item_id": item.id, "output_index": 0, "content_index": 0}
        if resp.speaks:
            self.send({"type": "response.output_audio.done", **base})
            self.send({"type": "response.output_audio_transcript.done", **base, "transcript": resp.text})
            part = {"type": "audio", "transcript": resp.text}
        else:
            self.send({"type": "response.output_text.done", **base, "text": resp.text})
            part = {"type": "text", "text": resp.text}
        self.send({"type": "response.content_part.done", **base, "part": part})
        self.send({"type": "response.output_item.done", "response_id": resp.id, "output_index": 0, "item": item.render()})
        if resp.in_conversation:
            self.send({"type": "conversation.item.done", "item": item.render(),
                       "previous_item_id": self.conversation.previous_id(item.id) if item in self.conversation.items else None})
        for call in resp.calls.values():
            if call.status == "in_progress":  # cut off (cancelled, or the token limit): never reported as a whole call
                call.status = "incomplete"
                self.send({"type": "response.output_item.done", "response_id": resp.id, "output_index": resp.output_index(call),
                           "item": call.render()})
        self.send({"type": "response.done", "response": resp.render(self.id)})
        if (self.config.turn_detection or {}).get("idle_timeout_ms"):  # the idle clock restarts after its playback
            self._commands.append(cmd.ControlAudioIn("response_done", {"audio_ms": resp.item.audio_ms}))

    def live_state(self) -> dict[str, int]:
        """Per-session entries still held (tests assert they return to zero)."""
        return {"responses": len(self._responses), "turns": self.turns.live(), "queued_events": len(self._events)}
