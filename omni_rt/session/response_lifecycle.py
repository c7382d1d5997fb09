"""The response lifecycle: starts answers, maps their stream chunks (by stage role) to GA events, and ends
them: done, cancelled (barge-in, client) or failed. It owns the active response (at most one, as the protocol
says) and the responses running in the pipeline. Held answers' keeping is ``held_answers``, tool-call output
items ``tool_call_items``; both are handed in, as are the conversation, the outgoing ``send`` and the command
and observation lists it appends to."""

from __future__ import annotations

import base64
import logging
import re
import time
from typing import Any, Callable

from omni_rt.audio import PIPELINE_OUTPUT_RATE
from omni_rt.audio.formats import OutputEncoder
from omni_rt.audio.pcm import pcm16_to_float
from omni_rt.contracts import payloads as c
from omni_rt.engine.prompt.answer_policy import response_answer_policy
from omni_rt.engine.tools.schema import applicable_tool_choice
from omni_rt.realtime.errors import ProtocolError, error_event, failure_message
from omni_rt.realtime.events import new_id
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session import commands as cmd
from omni_rt.session.conversation import Conversation, Item
from omni_rt.session.held_answers import HeldAnswers
from omni_rt.session.response_state import Response, ResponseState
from omni_rt.session.tool_call_items import ToolCallItems
from omni_rt.session.turn import Turn


NO_PREAMBLE = "no tool preamble"  # instructions holding these words turn the session's spoken preambles off


_NO_PREAMBLE_RE = re.compile(r"\bno tool preamble\b[.!;]?\s*", re.IGNORECASE)


def model_instructions(instructions: str) -> str:
    """The instructions as the thinker reads them: the "no tool preamble" switch is for the server, not the
    model (a 135M model read it as part of its task and answered worse)."""
    return _NO_PREAMBLE_RE.sub("", instructions).strip() if instructions else instructions


def preamble_mode(default: str, instructions: str) -> str:
    """Whether a spoken answer that calls a tool first says a short phrase (``omni_rt.engine.tools.preamble``):
    the server's default, turned off for a session (or one response) whose instructions say "no tool preamble"
    (the GA protocol has no field for it; OpenAI's own preambles are steered by the instructions too)."""
    return "off" if NO_PREAMBLE in (instructions or "").lower() else default


class ResponseLifecycle:
    def __init__(self, session_id: str, *, send: Callable[[dict[str, Any]], None], purge_audio: Callable[[str], None],
                 commands: list[cmd.Command], observations: list[tuple[str, float]], conversation: Conversation,
                 held: HeldAnswers, tool_calls: ToolCallItems, config: Callable[[], SessionConfig],
                 max_response_tokens: int, log: logging.LoggerAdapter, prefill_hints: bool = True,
                 tool_preamble: str = "auto", backchannel_filter: bool = True) -> None:
        """``config``: the session's current config (read at each use: ``session.update`` replaces it);
        ``purge_audio``: drops a response's queued audio deltas from the outgoing queue; ``prefill_hints``: tell
        the thinker each next prompt ahead (``hint_next_prompt``; the server's ``speculative_responses``);
        ``tool_preamble``: the server's default for spoken preambles before tool calls (``preamble_mode``);
        ``backchannel_filter``: tell the audio-in stage when an answer is heard (``AnswerStarted``), so speech over
        it is decided before it barges in (off: the stage never holds a speech start)."""
        self.session_id = session_id
        self._send, self._purge_audio = send, purge_audio
        self._commands, self._observations = commands, observations
        self._conversation, self._held, self._tool_calls = conversation, held, tool_calls
        self._config, self._max_tokens, self.log = config, max_response_tokens, log
        self.active: Response | None = None
        self.hints = prefill_hints
        self.tool_preamble = tool_preamble
        self.backchannel_filter = backchannel_filter
        self._running: dict[str, tuple[Response, OutputEncoder | None]] = {}
        self.finished = 0  # responses ended (done, cancelled or failed): the session's closing log line counts them

    def live(self) -> int:
        return len(self._running)

    # ---- starting ------------------------------------------------------------------------------------
    def start(self, cfg: SessionConfig, metadata: dict[str, str] | None = None,
              in_conversation: bool = True, input_items: list[Item] | None = None) -> Response:
        """A client's ``response.create``: refused while another response is active."""
        if self._config().session_type == "transcription":
            raise ProtocolError("invalid_request", "a transcription session creates no responses", "type")
        if self.active is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"response {self.active.id} is still in progress; cancel it first", None)
        return self.begin(cfg, metadata=metadata, in_conversation=in_conversation, input_items=input_items)

    def begin(self, cfg: SessionConfig, held_user_text: str | None = None, metadata: dict[str, str] | None = None,
              in_conversation: bool = True, input_items: list[Item] | None = None) -> Response:
        """Start an answer. With ``held_user_text`` it is prepared from a speculative transcript before the
        turn has ended: nothing reaches the client or the history until ``release``. A full conversation
        refuses an answer before anything of it is sent (``conversation_full``): no half-announced response."""
        if held_user_text is None and in_conversation:
            self._conversation.check_room()
        item = Item(id=new_id("item"), role="assistant", content=[], status="in_progress")
        resp = Response(id=new_id("resp"), item=item, modalities=list(cfg.output_modalities), output_format=cfg.output_format,
                        voice=cfg.voice, max_output_tokens=cfg.max_output_tokens, metadata=metadata,
                        in_conversation=in_conversation, single_call=cfg.parallel_tool_calls is False)
        resp.turn_end = time.perf_counter()
        source = input_items if input_items is not None else self._conversation.items
        messages = Conversation.messages_of(source, model_instructions(cfg.instructions))
        if held_user_text is not None:
            resp.state, resp.spec_text = ResponseState.HELD, held_user_text
            messages.append({"role": "user", "content": held_user_text})
        else:
            self.active = resp
        payload = self._payload(cfg, messages, in_conversation)
        self._held.emit(resp, {"type": "response.created", "response": resp.render(self.session_id)})
        encoder = OutputEncoder(resp.output_format, source_rate=PIPELINE_OUTPUT_RATE) if resp.output_format != "audio/pcm" else None
        self._running[resp.id] = (resp, encoder)
        self._commands.append(cmd.StartResponse(resp.id, payload))
        return resp

    def _payload(self, cfg: SessionConfig, messages: list[dict[str, Any]], in_conversation: bool) -> dict[str, Any]:
        """The thinker request of an answer to ``messages`` under ``cfg``."""
        cap = self._max_tokens
        max_tokens = cap if cfg.max_output_tokens == "inf" else min(int(cfg.max_output_tokens), cap)
        payload: dict[str, Any] = {"messages": messages, "session_id": self.session_id if in_conversation else None,
                                   "max_tokens": max_tokens}
        policy = response_answer_policy(cfg.max_output_tokens)
        if policy is not None:  # the client asked for this many tokens: no sentence/word limit (cut at a boundary)
            payload["answer_policy"] = policy
        choice = applicable_tool_choice(cfg.tool_choice, cfg.tools)
        if choice is not None:
            payload["tools"] = [dict(t) for t in cfg.tools]
            payload["tool_choice"] = choice
            if cfg.parallel_tool_calls is not None:
                payload["parallel_tool_calls"] = cfg.parallel_tool_calls
            if "audio" in cfg.output_modalities and preamble_mode(self.tool_preamble, cfg.instructions) == "auto":
                payload["tool_preamble"] = "auto"
        if cfg.temperature is not None:  # else the preset's sampling (greedy)
            payload["temperature"] = cfg.temperature
        return payload

    def hint_next_prompt(self, cfg: SessionConfig, heard: str) -> None:
        """Tell the thinker the prompt of the answer the user's turn will get, as far as it is known: the
        conversation plus ``heard`` (the words so far; "" before the user speaks), so it can prefill that now.

        Why: a turn's new prompt tokens (the last answer's end, the user's words, the template) cost 5-10 ms
        each on the CPU thinker and were prefilled after the turn's end, before its first token; prefilled
        while the user speaks, only the last words are left for the critical path."""
        if not self.hints:
            return
        messages = Conversation.messages_of(self._conversation.items, model_instructions(cfg.instructions))
        messages.append({"role": "user", "content": heard})
        self._commands.append(cmd.PrefillHint(self._payload(cfg, messages, True)))

    # ---- held answers --------------------------------------------------------------------------------
    def release(self, resp: Response, turn: Turn) -> None:
        """The turn ended as speculated: the held answer becomes the active one and its events go out now."""
        events = self._held.release(resp, turn)
        self.active = resp
        for ev in events:
            if ev["type"] == "response.output_audio.delta" and resp.first_audio is None:
                self._first_audio(resp)
            self._send(ev)
        if resp.pending_final is not None:  # it finished while held
            self._finish(resp, *resp.pending_final)

    def discard(self, resp: Response | None) -> None:
        """Drop a held answer (no trace on the wire) and stop it in the pipeline."""
        if self._held.discard(resp) and self._running.pop(resp.id, None) is not None:
            self._commands.append(cmd.AbortResponse(resp.id))

    # ---- stream chunks -------------------------------------------------------------------------------
    def _open_message(self, resp: Response) -> int | None:
        """Announce the assistant message item when its first text or audio arrives (or, with no tool call, when
        the response ends), so a response that only calls tools carries no empty message. Its output index, or
        None when the conversation has no room for it (a tool call took the last place): the answer then fails."""
        item = resp.item
        if not resp.message_open:
            prev = None
            if resp.state is ResponseState.ACTIVE and resp.in_conversation:
                try:
                    prev = self._conversation.add(item)
                except ProtocolError as exc:  # never an event for an item the conversation does not hold
                    resp.message_refused = True
                    self._fail_running(resp, exc)
                    return None
            resp.output.append(item)
            idx = resp.output_index(item)
            emit = self._held.emit
            emit(resp, {"type": "response.output_item.added", "response_id": resp.id, "output_index": idx, "item": item.render()})
            if resp.in_conversation:
                emit(resp, {"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})
            part = {"type": "audio", "transcript": ""} if resp.speaks else {"type": "text", "text": ""}
            emit(resp, {"type": "response.content_part.added", "response_id": resp.id, "item_id": item.id,
                        "output_index": idx, "content_index": 0, "part": part})
        return resp.output_index(item)

    def receive_output(self, response_id: str, role: str, data: Any) -> None:
        """A stream chunk of a running response, by the role of the stage that produced it."""
        entry = self._running.get(response_id)
        if entry is None:
            return  # an answer that was cancelled or discarded: its late outputs are dropped
        resp, encoder = entry
        if role == "text" and isinstance(data, c.TextDelta) and data.text:
            if not resp.text:
                self._observations.append(("thinker_first_token", time.perf_counter() - resp.started))
            idx = self._open_message(resp)
            if idx is None:
                return
            resp.text += data.text
            kind = "response.output_audio_transcript.delta" if resp.speaks else "response.output_text.delta"
            self._held.emit(resp, {"type": kind, "response_id": resp.id, "item_id": resp.item.id, "output_index": idx,
                                   "content_index": 0, "delta": data.text})
        elif role == "text" and isinstance(data, (c.ToolCallDelta, c.ToolCallDone)):
            try:
                if isinstance(data, c.ToolCallDelta):
                    self._tool_calls.on_delta(resp, data)
                else:
                    self._tool_calls.on_done(resp, data)
            except ProtocolError as exc:  # the conversation is full: the answer fails (never an unlisted item)
                self._fail_running(resp, exc)
        elif role == "clauses" and resp.speaks and isinstance(data, c.Clause):
            if not data.continued:  # a later piece of a streamed clause only lengthens it
                resp.item.clause_ms.append((int(resp.clause_start_ms), data.text))
            resp.clause_start_ms += data.duration_ms
        elif role == "audio" and resp.speaks and isinstance(data, c.PcmChunk):
            pcm = encoder.encode(pcm16_to_float(data.pcm)) if encoder is not None else data.pcm
            self._send_audio(resp, pcm, data.samples)

    def receive_result(self, response_id: str, result: Any) -> None:
        """The response's pipeline result: it completed."""
        entry = self._running.pop(response_id, None)
        if entry is None:
            return
        resp, encoder = entry
        if encoder is not None and resp.speaks:
            self._send_audio(resp, encoder.flush(), 0)
        if isinstance(result, dict):
            resp.usage = {k: result.get(k) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}
        self._finish(resp, ResponseState.DONE)

    def receive_failure(self, response_id: str, code: str, stage: str, message: str) -> None:
        """The response failed in the pipeline: the client gets the code and a short message (the stage's own
        message, which may name engine addresses or carry upstream bodies, goes to the log only)."""
        entry = self._running.pop(response_id, None)
        if entry is None:
            return
        self.log.info("response %s failed in stage %s (%s): %s", response_id, stage, code, message)
        self._fail(entry[0], code, failure_message(code, stage))

    def _send_audio(self, resp: Response, data: bytes, samples: int) -> None:
        if not data:
            return
        if resp.first_audio is None and resp.state is ResponseState.ACTIVE:
            self._first_audio(resp)
        idx = self._open_message(resp)
        if idx is None:
            return
        resp.item.audio_ms += int(samples * 1000 / PIPELINE_OUTPUT_RATE) if samples else 0
        self._held.emit(resp, {"type": "response.output_audio.delta", "response_id": resp.id, "item_id": resp.item.id,
                               "output_index": idx, "content_index": 0, "delta": base64.b64encode(data).decode("ascii")})

    def _first_audio(self, resp: Response) -> None:
        resp.first_audio = time.perf_counter()
        if self.backchannel_filter:  # heard from now: speech over it is a candidate interruption until it has played
            self._commands.append(cmd.AnswerStarted())
        ttfa = resp.ttfa_ms()
        if ttfa is not None:
            self._observations.append(("ttfa", ttfa / 1000))
            self.log.info("response %s first audio %.0f ms after end of turn", resp.id, ttfa)

    # ---- ending --------------------------------------------------------------------------------------
    def cancel(self, response_id: str | None) -> None:
        """A client's ``response.cancel``."""
        if self.active is None or (response_id is not None and response_id != self.active.id):
            raise ProtocolError("response_cancel_not_active", "there is no active response to cancel", "response_id")
        self.cancel_active("client_cancelled")

    def cancel_active(self, reason: str) -> None:
        """Stop the active answer at once: abort it in the pipeline, drop its queued audio, finish it."""
        resp = self.active
        if resp is None:
            return
        if self._running.pop(resp.id, None) is not None:
            self._commands.append(cmd.AbortResponse(resp.id))
        self._purge_audio(resp.id)
        self._finish(resp, ResponseState.CANCELLED, reason)

    def abort_running(self) -> None:
        """The session closes: stop every response still running in the pipeline."""
        for rid in list(self._running):
            self._commands.append(cmd.AbortResponse(rid))
        self._running.clear()

    def _fail(self, resp: Response, code: str, message: str) -> None:
        """End ``resp`` as failed: an ``error`` event, then its done events and ``response.done`` (status
        ``failed``); a held response keeps both until it is released or discarded."""
        self._held.emit(resp, error_event(code, message, type_="server_error"))
        self._finish(resp, ResponseState.FAILED, code)

    def _fail_running(self, resp: Response, exc: ProtocolError) -> None:
        """The session cannot go on with a running answer (its output does not fit the conversation): stop it
        in the pipeline and fail it."""
        if self._running.pop(resp.id, None) is not None:
            self._commands.append(cmd.AbortResponse(resp.id))
        self._observations.append((f"error.{exc.code}", 1))
        self._fail(resp, exc.code, exc.message)

    def _finish(self, resp: Response, state: ResponseState, reason: str | None = None) -> None:
        """Enter a final state and send the done events (a held response keeps them until release)."""
        if resp.state.final:
            return
        if resp.state is ResponseState.HELD:
            resp.pending_final = (state, reason)
            return
        if not resp.calls and not resp.message_refused:  # an answer without a call keeps its message item, even empty
            self._open_message(resp)
            if resp.state.final:
                return  # no room for it: the answer was failed instead
        if self.active is resp:
            self.active = None
        resp.transition(state, reason)
        self.finished += 1
        if state is not ResponseState.DONE:
            ttfa = resp.ttfa_ms()
            self.log.info("response %s %s (%s)%s", resp.id, state.value, reason,
                          f", first audio after {ttfa:.0f} ms" if ttfa is not None else "")
        if resp.message_open:
            self._message_done(resp, state)
        for call in resp.calls.values():
            if call.status == "in_progress":  # cut off (cancelled, or the token limit): never reported as a whole call
                call.status = "incomplete"
                self._send({"type": "response.output_item.done", "response_id": resp.id, "output_index": resp.output_index(call),
                            "item": call.render()})
        self._send({"type": "response.done", "response": resp.render(self.session_id)})
        td = self._config().turn_detection
        if state is ResponseState.DONE and resp.in_conversation and not resp.calls and self._config().answers_turns:
            self.hint_next_prompt(self._config(), "")  # the user's next turn answers this: its prefix is known now
        if resp.first_audio is not None or (td is not None and td.idle_timeout_ms):
            # the idle clock restarts after its playback; a heard answer is heard until then (or no more: cut short)
            self._commands.append(cmd.ResponseDone(resp.item.audio_ms, played=state is ResponseState.DONE))

    def _message_done(self, resp: Response, state: ResponseState) -> None:
        """The done events of the response's message item."""
        item = resp.item
        if resp.speaks:
            heard = item.content[0]["transcript"] if item.content else None  # set by truncate
            item.content = [{"type": "output_audio", "transcript": heard if heard is not None else resp.text}]
        else:
            item.content = [{"type": "output_text", "text": resp.text}]
        item.status = "completed" if state is ResponseState.DONE else "incomplete"
        base = {"response_id": resp.id, "item_id": item.id, "output_index": resp.output_index(item), "content_index": 0}
        send = self._send
        if resp.speaks:
            send({"type": "response.output_audio.done", **base})
            send({"type": "response.output_audio_transcript.done", **base, "transcript": resp.text})
            part = {"type": "audio", "transcript": resp.text}
        else:
            send({"type": "response.output_text.done", **base, "text": resp.text})
            part = {"type": "text", "text": resp.text}
        send({"type": "response.content_part.done", **base, "part": part})
        send({"type": "response.output_item.done", "response_id": resp.id, "output_index": resp.output_index(item), "item": item.render()})
        if resp.in_conversation and item in self._conversation.items:  # not for an item the client deleted meanwhile
            send({"type": "conversation.item.done", "item": item.render(), "previous_item_id": self._conversation.previous_id(item.id)})
