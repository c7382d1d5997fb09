"""Turn taking: reacts to the audio-in stage (speech started/stopped, commits, partial / speculative / final
transcripts), each event matched to its turn by number (``session.turn``). A speculative transcript starts a
held answer; the final one releases it if the guess held, or starts a fresh answer. It owns the turns (and the
client commits in flight); answers go through the response lifecycle it is handed."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from omni_rt.contracts import payloads as c
from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session import commands as cmd
from omni_rt.session.conversation import Conversation, Item
from omni_rt.session.response_lifecycle import ResponseLifecycle
from omni_rt.session.turn import Turn, TurnTracker, stable_partial_words


class TurnTaking:
    def __init__(self, *, send: Callable[[dict[str, Any]], None], send_error: Callable[..., None],
                 commands: list[cmd.Command], observations: list[tuple[str, float]], conversation: Conversation,
                 responses: ResponseLifecycle, config: Callable[[], SessionConfig], speculative_responses: bool,
                 log: logging.LoggerAdapter) -> None:
        """``send_error(exc, event_id=None)``: an ``error`` event, counted; ``config``: the current config."""
        self.send, self.send_error = send, send_error
        self._commands, self._observations = commands, observations
        self.conversation, self.responses = conversation, responses
        self._config, self.speculative_responses, self.log = config, speculative_responses, log
        self.turns = TurnTracker()

    def commit(self, event_id: str | None) -> None:
        """A client's ``input_audio_buffer.commit``: an empty-buffer error from the stage names its event id."""
        self.turns.commit_event_ids.append(event_id)
        self._commands.append(cmd.CommitAudioIn())

    def discard_held(self, turn: Turn) -> None:
        held, turn.held = turn.held, None
        self.responses.discard(held)

    def discard_all_held(self) -> None:
        for turn in self.turns.held():
            self.discard_held(turn)

    def receive(self, ev: c.AsrEvent) -> None:
        td = self._config().turn_detection
        if isinstance(ev, c.SpeechStarted):
            self.discard_all_held()
            turn = self.turns.get(ev.turn)
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": int(ev.audio_start_ms), "item_id": turn.item_id})
            if ev.decision_ms is not None:  # held as a candidate: a paused playback ends with the barge-in's clear
                self._observations.append(("interruption_decision", ev.decision_ms / 1000))
            if td is None or td.interrupt_response:
                self.responses.cancel_active("turn_detected")  # drops its queued audio, also what was queued before
        elif isinstance(ev, c.InterruptionCandidate):  # speech over the answer, not yet decided: no client event
            self._commands.append(cmd.PausePlayback(True))
        elif isinstance(ev, c.BackchannelDropped):  # a backchannel: the answer goes on, no turn
            self.log.info("backchannel %r (%.0f ms of speech) kept the answer; decided %.0f ms after its onset",
                          ev.text, ev.speech_ms, ev.decision_ms)
            self._observations.append(("interruption_decision", ev.decision_ms / 1000))
            self._commands.append(cmd.PausePlayback(False))
        elif isinstance(ev, c.SpeechStopped):
            turn = self.turns.get(ev.turn)
            turn.mark_end()
            self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(ev.audio_end_ms), "item_id": turn.item_id})
        elif isinstance(ev, c.Committed):
            self._on_committed(ev)
        elif isinstance(ev, c.Cleared):
            self.discard_all_held()
            self.send({"type": "input_audio_buffer.cleared"})
        elif isinstance(ev, c.TranscriptPartial):
            self._on_partial(ev)
        elif isinstance(ev, c.SpeculationCancelled):
            turn = self.turns.peek(ev.turn)
            if turn is not None:
                self.discard_held(turn)
        elif isinstance(ev, c.TranscriptSpeculative):
            self._on_speculative(ev)
        elif isinstance(ev, c.TranscriptFinal):
            self._on_final(ev)
        elif isinstance(ev, c.TurnScored) and ev.complete:  # the verdict that ends the turn waited for this score
            self._observations.extend([("stage:smart_turn:queue", ev.queue_ms / 1000), ("stage:smart_turn:compute", ev.score_ms / 1000)])
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
        """Partials re-decode the whole turn so far: send the words two consecutive partials agree on past
        those already sent (``stable_partial_words``); the final transcript completes the turn. The words so far also go to the thinker, whose prompt for this turn's answer
        begins with them (a prefill hint)."""
        turn, cfg = self.turns.peek(ev.turn), self._config()
        if turn is not None and cfg.answers_turns and ev.text.strip():
            self.responses.hint_next_prompt(cfg, ev.text.strip())
        if turn is None or (cfg.transcription is None and cfg.session_type != "transcription"):
            return
        stable, turn.partial_last = stable_partial_words(turn.partial_last, ev.text), ev.text
        new_words = stable[len(turn.partial_sent.split()):]
        if new_words:
            delta = (" " if turn.partial_sent else "") + " ".join(new_words)
            turn.partial_sent += delta
            self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": turn.item_id,
                       "content_index": 0, "delta": delta})

    def _on_speculative(self, ev: c.TranscriptSpeculative) -> None:
        cfg = self._config()
        td = cfg.turn_detection
        text = ev.text.strip()
        turn = self.turns.get(ev.turn)
        if ((td is None or td.create_response) and text and turn.held is None and self.speculative_responses
                and cfg.session_type == "realtime"):
            turn.held = self.responses.begin(cfg, held_user_text=text)

    def _on_final(self, ev: c.TranscriptFinal) -> None:
        turn = self.turns.get(ev.turn)
        held, turn.held = turn.held, None
        self.turns.forget(ev.turn)
        text = ev.text
        try:
            item = self.conversation.get(turn.item_id)
        except ProtocolError:
            self.responses.discard(held)
            return  # the client deleted the item before it was transcribed
        item.content = [{"type": "input_audio", "transcript": text}]
        self._observations.extend([("asr_final", ev.after_end_ms / 1000), ("stage:asr_final:queue", ev.queue_ms / 1000),
                                   ("stage:asr_final:compute", ev.compute_ms / 1000)])
        cfg = self._config()
        if cfg.transcription is not None or cfg.session_type == "transcription":
            self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id, "content_index": 0,
                       "transcript": text, "usage": {"type": "duration", "seconds": round(ev.audio_ms / 1000, 3)}})
        self.send({"type": "conversation.item.done", "previous_item_id": self.conversation.previous_id(item.id), "item": item.render()})
        wants_answer = (cfg.answers_turns
                        and (text.strip() or ev.trigger == "timeout")  # an idle timeout's turn is answered though silent
                        and not self.turns.superseded(ev.turn))
        if not wants_answer:
            self.responses.discard(held)
            return
        self.responses.cancel_active("turn_detected")
        release = held is not None and ev.speculative and held.spec_text == text.strip()
        try:  # a full conversation refuses the answer before anything of it is sent
            self.conversation.check_room(items=1 + (len(held.calls) if release else 0))
        except ProtocolError as exc:
            self.responses.discard(held)
            self.send_error(exc)
            return
        if release:
            self.responses.release(held, turn)
            return
        self.responses.discard(held)
        resp = self.responses.begin(cfg)
        resp.turn_end = turn.end_at or time.perf_counter()

