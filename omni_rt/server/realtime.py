"""One OpenAI Realtime session: client events in, server events out, a spoken answer per turn.

Transport-agnostic: the WebSocket endpoint (``app.py``) and the Twilio bridge (``twilio.py``) both feed
``handle_event`` and read the ``outgoing`` queue. Audio goes to the ASR session stage as it arrives; the
ASR stage's events (speech started/stopped, transcripts) drive turns; each answer is a request through
thinker -> talker -> vocoder that barge-in cancels on its own.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from omni_rt.audio.formats import InputDecoder, OutputEncoder
from omni_rt.audio.pcm import pcm16_to_float
from omni_rt.core.coordinator import PipelineError, ResultItem, StreamItem
from omni_rt.server.conversation import Conversation, Item, item_from_client
from omni_rt.server.protocol import (
    BETA_CLIENT_ALIASES,
    BETA_SERVER_NAMES,
    ProtocolError,
    SessionConfig,
    error_event,
    new_id,
)

if TYPE_CHECKING:
    from omni_rt.server.runtime import Runtime

log = logging.getLogger("omni_rt.session")

ASR_STAGE = "asr"
RESPONSE_ENTRY = "thinker"
MAX_APPEND_BYTES = 1 << 20  # one append event carries at most 1 MiB of decoded audio (~21 s of 24 kHz PCM16)


@dataclass
class Response:
    id: str
    item: Item
    modalities: list[str]
    output_format: str
    max_output_tokens: int | str = "inf"
    started: float = field(default_factory=time.perf_counter)
    turn_end: float | None = None  # perf_counter of the end-of-turn decision this answers
    task: asyncio.Task | None = None
    status: str = "in_progress"
    status_reason: str | None = None
    text: str = ""
    first_audio: float | None = None
    audio_bytes: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    # a held response was started from a speculative transcript during the end-of-turn silence; its events
    # wait here until the turn really ends with the same transcript (then they are released) or are dropped
    held: bool = False
    held_events: list[dict[str, Any]] = field(default_factory=list)
    spec_text: str = ""
    discarded: bool = False
    finished: bool = False


class RealtimeSession:
    def __init__(self, runtime: "Runtime", model: str | None = None, beta: bool = False,
                 session: dict[str, Any] | None = None) -> None:
        """``session``: an initial ``session.update`` payload (the Twilio bridge fixes μ-law in and out)."""
        self.runtime = runtime
        self.id = new_id("sess")
        self.config = SessionConfig(model=model or runtime.model_name, beta_events=beta)
        if session is not None:
            self.config.update(session)
        self.conversation = Conversation()
        self.outgoing: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.response: Response | None = None
        self.held: Response | None = None  # answer being prepared during the end-of-turn silence
        self.partial_sent: dict[str, str] = {}  # item id -> partial transcript already sent as deltas
        self.decoder = InputDecoder(self.config.input_format, target_rate=16000)
        self.pending_user_item: str | None = None  # item id announced at speech_started / commit
        self.turn_end_at: float | None = None
        self.commit_event_id: Any = None
        self.closed = False
        self.log = logging.LoggerAdapter(log, {"session_id": self.id})

    # ---- lifecycle -------------------------------------------------------------------------------
    def open(self) -> None:
        self.runtime.coordinator.open_session(self.id, ASR_STAGE, self.config.asr_params(), self._on_asr_event)
        self.runtime.metrics.sessions.inc()
        self.send({"type": "session.created", "session": self.config.render(self.id)})

    async def close(self, reason: str = "closed") -> None:
        """Free everything the session holds: the answer in flight, ASR state, queued events."""
        if self.closed:
            return
        self.closed = True
        self._discard_held()
        if self.response is not None:
            self._cancel_response(reason)
        self.runtime.coordinator.close_session(self.id, ASR_STAGE)
        self.runtime.metrics.sessions.dec()
        self.outgoing.put_nowait(None)

    # ---- outgoing --------------------------------------------------------------------------------
    def send(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        event.setdefault("event_id", new_id("event"))
        if self.config.beta_events:
            event["type"] = BETA_SERVER_NAMES.get(event["type"], event["type"])
        self.outgoing.put_nowait(event)

    def send_error(self, exc: ProtocolError, event_id: str | None = None) -> None:
        self.runtime.metrics.errors.labels(code=exc.code).inc()
        self.send(error_event(exc.code, exc.message, exc.param, event_id, exc.type))

    # ---- incoming --------------------------------------------------------------------------------
    def handle_text(self, raw: str | bytes) -> None:
        """Parse and dispatch one client message; every problem becomes an ``error`` event."""
        try:
            try:
                event = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ProtocolError("invalid_json", f"message is not valid JSON: {exc}") from None
            if not isinstance(event, dict):
                raise ProtocolError("invalid_json", "message must be a JSON object with a 'type'")
            self.handle_event(event)
        except ProtocolError as exc:
            event_id = None
            try:
                event_id = json.loads(raw).get("event_id")  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                pass
            self.send_error(exc, event_id if isinstance(event_id, str) else None)

    def handle_event(self, event: dict[str, Any]) -> None:
        etype = event.get("type")
        if not isinstance(etype, str):
            raise ProtocolError("missing_required_parameter", "event has no string 'type'", "type")
        etype = BETA_CLIENT_ALIASES.get(etype, etype)
        handler = self.HANDLERS.get(etype)
        if handler is None:
            raise ProtocolError("unknown_event", f"unknown event type '{etype}'", "type")
        handler(self, event)

    def _session_update(self, event: dict[str, Any]) -> None:
        if "session" not in event:
            raise ProtocolError("missing_required_parameter", "session.update needs 'session'", "session")
        old_input = self.config.input_format
        candidate = SessionConfig(**{k: v for k, v in self.config.__dict__.items()})
        candidate.update(event["session"])  # validate fully before applying anything
        self.config = candidate
        if self.config.input_format != old_input:
            self.decoder = InputDecoder(self.config.input_format, target_rate=16000)
        self.runtime.coordinator.session_control(self.id, ASR_STAGE, "update", params=self.config.asr_params())
        self.send({"type": "session.updated", "session": self.config.render(self.id)})

    def _append(self, event: dict[str, Any]) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise ProtocolError("missing_required_parameter", "input_audio_buffer.append needs base64 'audio'", "audio")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("invalid_base64", "'audio' is not valid base64", "audio") from None
        if len(raw) > MAX_APPEND_BYTES:
            raise ProtocolError("audio_too_large", f"one append carries at most {MAX_APPEND_BYTES} bytes of audio, got {len(raw)}", "audio")
        if not raw:
            return
        try:
            pcm = self.decoder.decode(raw)
        except ValueError as exc:
            raise ProtocolError("invalid_audio", f"{exc} (format {self.config.input_format})", "audio") from None
        if len(pcm):
            self.runtime.coordinator.append(self.id, ASR_STAGE, pcm)

    def _commit(self, event: dict[str, Any]) -> None:
        self.pending_user_item = self.pending_user_item or new_id("item")
        self.turn_end_at = time.perf_counter()
        self.commit_event_id = event.get("event_id")  # an empty-buffer error from the ASR stage names it
        self.runtime.coordinator.session_control(self.id, ASR_STAGE, "commit")

    def _clear(self, event: dict[str, Any]) -> None:
        self.runtime.coordinator.session_control(self.id, ASR_STAGE, "clear")

    def _item_create(self, event: dict[str, Any]) -> None:
        item = item_from_client(event.get("item"))
        prev = event.get("previous_item_id")
        if prev is not None and not isinstance(prev, str):
            raise ProtocolError("invalid_type", "previous_item_id must be a string", "previous_item_id")
        actual_prev = self.conversation.add(item, prev)
        self.send({"type": "conversation.item.added", "previous_item_id": actual_prev, "item": item.render()})
        self.send({"type": "conversation.item.done", "previous_item_id": actual_prev, "item": item.render()})

    def _item_delete(self, event: dict[str, Any]) -> None:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            raise ProtocolError("missing_required_parameter", "conversation.item.delete needs 'item_id'", "item_id")
        self.conversation.delete(item_id)
        self.send({"type": "conversation.item.deleted", "item_id": item_id})

    def _item_truncate(self, event: dict[str, Any]) -> None:
        item_id = event.get("item_id")
        audio_end_ms = event.get("audio_end_ms")
        if not isinstance(item_id, str):
            raise ProtocolError("missing_required_parameter", "conversation.item.truncate needs 'item_id'", "item_id")
        if not isinstance(audio_end_ms, int) or isinstance(audio_end_ms, bool) or audio_end_ms < 0:
            raise ProtocolError("invalid_value", "audio_end_ms must be a non-negative integer", "audio_end_ms")
        content_index = event.get("content_index", 0)
        item = self.conversation.get(item_id)
        if item.role != "assistant":
            raise ProtocolError("invalid_value", "only assistant audio items can be truncated", "item_id")
        if content_index != 0:
            raise ProtocolError("invalid_value", "content_index must be 0", "content_index")
        if audio_end_ms > item.audio_ms:
            raise ProtocolError("invalid_value", f"audio_end_ms {audio_end_ms} is past the item's audio ({item.audio_ms} ms)", "audio_end_ms")
        if self.response is not None and self.response.item is item:
            self._cancel_response("turn_detected")
        heard = truncate_text(item, audio_end_ms)
        item.content = [{"type": "output_audio", "transcript": heard}]
        item.audio_ms = audio_end_ms
        item.status = "incomplete"
        self.send({"type": "conversation.item.truncated", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms})

    def _response_create(self, event: dict[str, Any]) -> None:
        if self.response is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"response {self.response.id} is still in progress; cancel it first", None)
        params = event.get("response") or {}
        if not isinstance(params, dict):
            raise ProtocolError("invalid_type", "response must be an object", "response")
        cfg = SessionConfig(**{k: v for k, v in self.config.__dict__.items()})
        cfg.update({k: v for k, v in params.items() if k in ("instructions", "output_modalities", "modalities", "max_output_tokens")})
        self.start_response(cfg, turn_end=None)

    def _response_cancel(self, event: dict[str, Any]) -> None:
        rid = event.get("response_id")
        if self.response is None or (rid is not None and rid != self.response.id):
            raise ProtocolError("response_cancel_not_active", "there is no active response to cancel", "response_id")
        self._cancel_response("client_cancelled")

    HANDLERS: dict[str, Any] = {
        "session.update": _session_update,
        "input_audio_buffer.append": _append,
        "input_audio_buffer.commit": _commit,
        "input_audio_buffer.clear": _clear,
        "conversation.item.create": _item_create,
        "conversation.item.delete": _item_delete,
        "conversation.item.truncate": _item_truncate,
        "response.create": _response_create,
        "response.cancel": _response_cancel,
    }

    # ---- ASR events (called on the event loop by the stage shell) ----------------------------------
    def _on_asr_event(self, stage: str, ev: dict[str, Any]) -> None:
        if self.closed:
            return
        kind = ev.get("type")
        td = self.config.turn_detection or {}
        if kind in ("speech_started", "speculative.cancelled", "cleared"):
            self._discard_held()
        if kind == "speech_started":
            self.pending_user_item = new_id("item")
            if self.response is not None and td.get("interrupt_response", True):
                self._cancel_response("turn_detected")
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": int(ev["audio_start_ms"]), "item_id": self.pending_user_item})
        elif kind == "speech_stopped":
            self.turn_end_at = time.perf_counter()
            self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(ev["audio_end_ms"]),
                       "item_id": self.pending_user_item or new_id("item")})
        elif kind == "committed":
            item_id = self.pending_user_item or new_id("item")
            self.pending_user_item = item_id
            item = Item(id=item_id, role="user", content=[{"type": "input_audio", "transcript": None}], status="completed")
            prev = self.conversation.add(item)
            self.send({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": prev})
            self.send({"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})
        elif kind == "cleared":
            self.send({"type": "input_audio_buffer.cleared"})
        elif kind == "timeout_triggered":  # idle_timeout_ms: the ASR stage commits the silent buffer next
            self.pending_user_item = new_id("item")
            self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": int(ev["audio_start_ms"]),
                       "audio_end_ms": int(ev["audio_end_ms"]), "item_id": self.pending_user_item})
        elif kind == "transcript.delta":
            # partials are re-decodes of the whole turn so far: send only what extends the text already sent
            text = ev["text"]
            sent = self.partial_sent.get(self.pending_user_item or "", "")
            if self.config.transcription is not None and self.pending_user_item and text.startswith(sent) and len(text) > len(sent):
                self.partial_sent = {self.pending_user_item: text}
                self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": self.pending_user_item,
                           "content_index": 0, "delta": text[len(sent):]})
        elif kind == "transcript.speculative":
            text = ev.get("text", "").strip()
            if td.get("create_response", True) and text and self.held is None and self.runtime.speculative_responses:
                self.held = self.start_response(self.config, turn_end=None, held_user_text=text)
        elif kind == "transcript.final":
            self._on_transcript(ev)
        elif kind == "error":
            code = ev.get("code", "server_error")
            event_id = self.commit_event_id if code == "input_audio_buffer_commit_empty" else None
            self.send_error(ProtocolError(code, ev.get("message", "ASR error")), event_id if isinstance(event_id, str) else None)
        elif kind == "session.expired":
            self.send_error(ProtocolError("session_expired", "session idle for too long; audio state was reset", type_="server_error"))

    def _on_transcript(self, ev: dict[str, Any]) -> None:
        item_id = self.pending_user_item
        self.pending_user_item = None
        try:
            item = self.conversation.get(item_id)
        except ProtocolError:
            return  # the client deleted the item before it was transcribed
        text = ev.get("text", "")
        item.content = [{"type": "input_audio", "transcript": text}]
        self.runtime.metrics.stage_latency.labels(stage="asr_final").observe(ev.get("asr_ms", 0) / 1000)
        if self.config.transcription is not None:
            self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id, "content_index": 0,
                       "transcript": text, "usage": {"type": "duration", "seconds": round(ev.get("audio_ms", 0) / 1000, 3)}})
        self.send({"type": "conversation.item.done", "previous_item_id": self._prev_of(item.id), "item": item.render()})
        td = self.config.turn_detection
        held, self.held = self.held, None
        if td is not None and td.get("create_response", True) and (text.strip() or ev.get("trigger") == "timeout"):
            if self.response is not None:
                self._cancel_response("turn_detected")
            if held is not None and ev.get("speculative") and held.spec_text == text.strip():
                self._release(held)
                return
            self._discard(held)
            self.start_response(self.config, turn_end=self.turn_end_at)
        else:
            self._discard(held)

    def _prev_of(self, item_id: str) -> str | None:
        ids = [it.id for it in self.conversation.items]
        i = ids.index(item_id)
        return ids[i - 1] if i > 0 else None

    # ---- responses -------------------------------------------------------------------------------
    def start_response(self, cfg: SessionConfig, turn_end: float | None, held_user_text: str | None = None) -> Response:
        """Start an answer. With ``held_user_text`` it is prepared from a speculative transcript before the
        turn has ended: nothing reaches the client or the history until ``_release``."""
        modalities = cfg.output_modalities
        content_type = "output_audio" if "audio" in modalities else "output_text"
        item = Item(id=new_id("item"), role="assistant", content=[], status="in_progress")
        resp = Response(id=new_id("resp"), item=item, modalities=modalities, output_format=cfg.output_format,
                        max_output_tokens=cfg.max_output_tokens, turn_end=turn_end if turn_end is not None else time.perf_counter())
        messages = self.conversation.messages(cfg.instructions)
        if held_user_text is not None:
            resp.held, resp.spec_text = True, held_user_text
            messages.append({"role": "user", "content": held_user_text})
        else:
            self.response = resp
        max_tokens = self.runtime.max_response_tokens if cfg.max_output_tokens == "inf" else min(int(cfg.max_output_tokens), self.runtime.max_response_tokens)
        payload = {"messages": messages, "session_id": self.id, "max_tokens": max_tokens}
        self._emit(resp, {"type": "response.created", "response": self._render_response(resp)})
        prev = None if resp.held else self.conversation.add(item)  # a held answer joins the history on release
        self._emit(resp, {"type": "response.output_item.added", "response_id": resp.id, "output_index": 0, "item": item.render()})
        self._emit(resp, {"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})
        part = {"type": "audio", "transcript": ""} if content_type == "output_audio" else {"type": "text", "text": ""}
        self._emit(resp, {"type": "response.content_part.added", "response_id": resp.id, "item_id": item.id, "output_index": 0,
                          "content_index": 0, "part": part})
        resp.task = asyncio.create_task(self._run_response(resp, payload, content_type), name=f"response-{resp.id}")
        return resp

    async def _run_response(self, resp: Response, payload: dict[str, Any], content_type: str) -> None:
        m = self.runtime.metrics
        encoder = OutputEncoder(resp.output_format, source_rate=24000) if resp.output_format != "audio/pcm" else None
        speak = "audio" in resp.modalities
        clause_start_ms = 0.0
        try:
            async with contextlib.aclosing(self.runtime.coordinator.stream(resp.id, payload, entry=RESPONSE_ENTRY)) as stream:
                async for out in stream:
                    if resp.status != "in_progress":
                        break
                    if isinstance(out, StreamItem):
                        if out.stage == "thinker":
                            delta = out.data.get("text", "") if isinstance(out.data, dict) else str(out.data)
                            if delta:
                                if not resp.text:
                                    m.stage_latency.labels(stage="thinker_first_token").observe(time.perf_counter() - resp.started)
                                resp.text += delta
                                kind = "response.output_audio_transcript.delta" if speak else "response.output_text.delta"
                                self._emit(resp, {"type": kind, "response_id": resp.id, "item_id": resp.item.id, "output_index": 0,
                                           "content_index": 0, "delta": delta})
                        elif out.stage == "talker" and speak:
                            resp.item.clause_ms.append((int(clause_start_ms), out.data.get("text", "")))
                            clause_start_ms += 1000.0 * len(out.data["audio"]) / out.data["sample_rate"]
                        elif out.stage == "vocoder" and speak:
                            pcm = out.data["pcm"]
                            if encoder is not None:
                                pcm = encoder.encode(pcm16_to_float(pcm))
                            self._send_audio(resp, pcm, out.data["samples"])
                    elif isinstance(out, ResultItem):
                        if encoder is not None and speak:
                            tail = encoder.flush()
                            if tail:
                                self._send_audio(resp, tail, 0)
                        resp.usage = {k: out.data.get(k) for k in ("prompt_tokens", "completion_tokens", "cached_tokens") if isinstance(out.data, dict)}
                        resp.status = "completed"
        except PipelineError as exc:
            if resp.status == "in_progress":
                resp.status, resp.status_reason = "failed", exc.code
                m.errors.labels(code=exc.code).inc()
                self._emit(resp, error_event(exc.code, f"response failed in stage '{exc.stage}': {exc}", type_="server_error"))
        except asyncio.CancelledError:
            if resp.status == "in_progress":
                resp.status, resp.status_reason = "cancelled", "client_cancelled"
        finally:
            self._finish_response(resp, content_type)

    def _send_audio(self, resp: Response, data: bytes, samples: int) -> None:
        if not data:
            return
        if resp.first_audio is None and not resp.held:
            self._first_audio(resp)
        resp.audio_bytes += len(data)
        resp.item.audio_ms += int(samples * 1000 / 24000) if samples else 0
        self._emit(resp, {"type": "response.output_audio.delta", "response_id": resp.id, "item_id": resp.item.id, "output_index": 0,
                   "content_index": 0, "delta": base64.b64encode(data).decode("ascii")})

    def _first_audio(self, resp: Response) -> None:
        now = time.perf_counter()
        resp.first_audio = now
        if resp.turn_end is not None:
            ttfa = now - resp.turn_end
            self.runtime.metrics.ttfa.observe(ttfa)
            self.log.info("response %s first audio %.0f ms after end of turn", resp.id, ttfa * 1000)

    def _emit(self, resp: Response, event: dict[str, Any]) -> None:
        """Send a response's event, or keep it while the response is held."""
        if resp.discarded:
            return
        if resp.held:
            resp.held_events.append(event)
        else:
            self.send(event)

    def _release(self, resp: Response) -> None:
        """The turn ended as speculated: the held answer joins the history and its events go out now."""
        resp.held = False
        resp.turn_end = self.turn_end_at if self.turn_end_at is not None else time.perf_counter()
        prev = self.conversation.add(resp.item)
        if not resp.finished:
            self.response = resp
        for ev in resp.held_events:
            if ev["type"] in ("conversation.item.added", "conversation.item.done"):
                ev["previous_item_id"] = prev
            if ev["type"] == "response.output_audio.delta" and resp.first_audio is None:
                self._first_audio(resp)
            self.send(ev)
        resp.held_events.clear()
        self.runtime.metrics.speculative.labels(outcome="released").inc()
        if resp.finished:
            self._idle_restart(resp)

    def _discard(self, resp: Response | None) -> None:
        """Drop a held answer without a trace on the wire (the user kept talking, or said something else)."""
        if resp is None:
            return
        resp.discarded = True
        resp.held_events.clear()
        if resp.status == "in_progress":
            resp.status, resp.status_reason = "cancelled", "turn_detected"
        self.runtime.coordinator.abort(resp.id)
        self.runtime.metrics.speculative.labels(outcome="discarded").inc()

    def _discard_held(self) -> None:
        held, self.held = self.held, None
        self._discard(held)

    def _cancel_response(self, reason: str) -> None:
        resp = self.response
        if resp is None or resp.status != "in_progress":
            return
        resp.status, resp.status_reason = "cancelled", reason
        self.runtime.coordinator.abort(resp.id)
        self._purge_audio(resp.id)

    def _purge_audio(self, response_id: str) -> None:
        """Drop queued audio deltas of a cancelled answer so nothing more of it reaches the client."""
        kept: list[dict[str, Any] | None] = []
        while not self.outgoing.empty():
            ev = self.outgoing.get_nowait()
            if ev is not None and ev.get("response_id") == response_id and ev["type"].endswith("audio.delta"):
                continue
            kept.append(ev)
        for ev in kept:
            self.outgoing.put_nowait(ev)

    def _finish_response(self, resp: Response, content_type: str) -> None:
        resp.finished = True
        if self.response is resp:
            self.response = None
        if resp.discarded:
            return
        if resp.status == "in_progress":
            resp.status = "failed"
        item = resp.item
        if content_type == "output_audio":
            heard = item.content[0]["transcript"] if item.content else None  # set by truncate
            item.content = [{"type": "output_audio", "transcript": heard if heard is not None else resp.text}]
        else:
            item.content = [{"type": "output_text", "text": resp.text}]
        item.status = "completed" if resp.status == "completed" else "incomplete"
        if self.closed:
            return
        base = {"response_id": resp.id, "item_id": item.id, "output_index": 0, "content_index": 0}
        send = lambda event: self._emit(resp, event)  # noqa: E731 - held answers keep their done events too
        if content_type == "output_audio":
            send({"type": "response.output_audio.done", **base})
            send({"type": "response.output_audio_transcript.done", **base, "transcript": resp.text})
            part = {"type": "audio", "transcript": resp.text}
        else:
            send({"type": "response.output_text.done", **base, "text": resp.text})
            part = {"type": "text", "text": resp.text}
        send({"type": "response.content_part.done", **base, "part": part})
        send({"type": "response.output_item.done", "response_id": resp.id, "output_index": 0, "item": item.render()})
        send({"type": "conversation.item.done", "previous_item_id": self._prev_of(item.id) if item in self.conversation.items else None,
                   "item": item.render()})
        send({"type": "response.done", "response": self._render_response(resp)})
        if not resp.held:
            self._idle_restart(resp)

    def _idle_restart(self, resp: Response) -> None:
        """idle_timeout_ms counts from the end of the answer's playback: tell the ASR stage how long it plays."""
        if (self.config.turn_detection or {}).get("idle_timeout_ms"):
            self.runtime.coordinator.session_control(self.id, ASR_STAGE, "response_done", audio_ms=resp.item.audio_ms)

    def _render_response(self, resp: Response) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": resp.id, "object": "realtime.response", "status": resp.status, "conversation_id": self.id,
            "output_modalities": list(resp.modalities),
            "output": [resp.item.render()] if resp.status != "in_progress" else [],
            "audio": {"output": {"format": {"type": resp.output_format, **({"rate": 24000} if resp.output_format == "audio/pcm" else {})},
                                 "voice": self.config.voice}},
            "max_output_tokens": resp.max_output_tokens,
            "metadata": None,
        }
        if resp.status in ("cancelled", "failed", "incomplete"):
            reason = resp.status_reason or "error"
            if resp.status == "cancelled":
                reason = reason if reason in ("turn_detected", "client_cancelled") else "client_cancelled"
                out["status_details"] = {"type": "cancelled", "reason": reason}
            elif resp.status == "failed":
                out["status_details"] = {"type": "failed", "error": {"type": "server_error", "code": reason}}
        if resp.usage:
            inp = int(resp.usage.get("prompt_tokens") or 0)
            outp = int(resp.usage.get("completion_tokens") or 0)
            out["usage"] = {"input_tokens": inp, "output_tokens": outp, "total_tokens": inp + outp,
                            "input_token_details": {"cached_tokens": int(resp.usage.get("cached_tokens") or 0), "text_tokens": inp},
                            "output_token_details": {"text_tokens": outp}}
        if resp.first_audio is not None and resp.turn_end is not None:
            out["metadata"] = {"ttfa_ms": f"{(resp.first_audio - resp.turn_end) * 1000:.1f}"}
        return out


def truncate_text(item: Item, audio_end_ms: int) -> str:
    """The part of an assistant answer the listener heard: whole clauses before ``audio_end_ms`` plus the
    spoken fraction of the clause in progress (by time, word-aligned)."""
    if not item.clause_ms:
        full = item.text()
        if item.audio_ms <= 0:
            return ""
        words = full.split()
        return " ".join(words[: int(len(words) * min(1.0, audio_end_ms / item.audio_ms))])
    heard: list[str] = []
    bounds = item.clause_ms + [(item.audio_ms, "")]
    for (start, clause), (end, _) in zip(bounds, bounds[1:]):
        if audio_end_ms >= end:
            heard.append(clause)
        elif audio_end_ms > start:
            words = clause.split()
            frac = (audio_end_ms - start) / max(1, end - start)
            heard.append(" ".join(words[: int(len(words) * frac)]))
            break
        else:
            break
    return " ".join(w for w in heard if w).strip()
