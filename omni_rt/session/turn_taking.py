"""Turn-taking, the part of ``RealtimeSession`` that reacts to the audio-in stage: speech started/stopped,
commits, partial / speculative / final transcripts, each matched to its turn by number (``session.turn``).
A speculative transcript starts a held answer; the final one releases it if the guess held, or starts a fresh
answer. Mixed into ``RealtimeSession`` (it uses that class's state and its response lifecycle)."""

from __future__ import annotations

import time

from omni_rt.realtime.errors import ProtocolError
from omni_rt.session.conversation import Item
from omni_rt.contracts import payloads as c


class TurnTaking:
    def receive_asr(self, ev: c.AsrEvent) -> None:
        if self.closed:
            return
        td = self.config.turn_detection
        if isinstance(ev, c.SpeechStarted):
            for turn in self.turns.held():
                self._discard_held(turn)
            turn = self.turns.get(ev.turn)
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": int(ev.audio_start_ms), "item_id": turn.item_id})
            if td is None or td.interrupt_response:
                self.cancel_active("turn_detected")  # drops its queued audio, also what was queued before
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
        elif isinstance(ev, c.TurnScored) and ev.complete:  # the verdict that ends the turn waited for this score
            self._observations += [("stage:smart_turn:queue", ev.queue_ms / 1000), ("stage:smart_turn:compute", ev.score_ms / 1000)]
        elif isinstance(ev, c.TimeoutTriggered):
            turn = self.turns.get(ev.turn)
            self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": ev.audio_start_ms,
                       "audio_end_ms": ev.audio_end_ms, "item_id": turn.item_id})
        elif isinstance(ev, c.AsrError):
            event_id = None
            if ev.code in ("input_audio_buffer_commit_empty", "input_audio_buffer_commit_busy") and self.turns.commit_event_ids:
                event_id = self.turns.commit_event_ids.popleft()
            message, type_ = ev.message, "invalid_request_error"
            if ev.code == "stage_error":  # an unexpected failure in the stage: its text (an exception) is for the log
                self.log.warning("audio input failed: %s", ev.message)
                message, type_ = "the audio input could not be processed", "server_error"
            self.send_error(ProtocolError(ev.code, message, type_=type_), event_id)
        elif isinstance(ev, c.SessionExpired):
            self.send_error(ProtocolError("session_expired", "session idle for too long; audio state was reset", type_="server_error"))

    def _on_committed(self, ev: c.Committed) -> None:
        if ev.trigger == "commit" and self.turns.commit_event_ids:
            self.turns.commit_event_ids.popleft()
        turn = self.turns.get(ev.turn)
        turn.mark_end()
        turn.committed = True
        item = Item(id=turn.item_id, role="user", content=[{"type": "input_audio", "transcript": None}], status="completed")
        try:
            prev = self.conversation.add(item)
        except ProtocolError as exc:  # the conversation is full: this turn gets no item, hence no answer
            self.send_error(exc)
            return
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
        td = self.config.turn_detection
        text = ev.text.strip()
        turn = self.turns.get(ev.turn)
        if ((td is None or td.create_response) and text and turn.held is None and self.options.speculative_responses
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
        self._observations += [("asr_final", ev.after_end_ms / 1000), ("stage:asr_final:queue", ev.queue_ms / 1000),
                               ("stage:asr_final:compute", ev.compute_ms / 1000)]
        if self.config.transcription is not None or self.config.session_type == "transcription":
            self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id, "content_index": 0,
                       "transcript": text, "usage": {"type": "duration", "seconds": round(ev.audio_ms / 1000, 3)}})
        self.send({"type": "conversation.item.done", "previous_item_id": self.conversation.previous_id(item.id), "item": item.render()})
        td = self.config.turn_detection
        wants_answer = (td is not None and td.create_response and self.config.session_type == "realtime"
                        and (text.strip() or ev.trigger == "timeout")  # an idle timeout's turn is answered though silent
                        and not self.turns.superseded(ev.turn))
        if not wants_answer:
            self._discard(held)
            return
        self.cancel_active("turn_detected")
        release = held is not None and ev.speculative and held.spec_text == text.strip()
        try:  # a full conversation refuses the answer before anything of it is sent
            self.conversation.check_room(items=1 + (len(held.calls) if release else 0))
        except ProtocolError as exc:
            self._discard(held)
            self.send_error(exc)
            return
        if release:
            self._release(held, turn)
            return
        self._discard(held)
        resp = self._start_response(self.config)
        resp.turn_end = turn.end_at or time.perf_counter()

