"""Twilio Media Streams bridge: a phone call becomes a Realtime session speaking μ-law 8 kHz.

In: ``connected``, ``start``, ``media``, ``dtmf``, ``mark``, ``stop``. Out: ``media`` (20 ms μ-law frames),
``mark`` (after each audio chunk, so Twilio tells us what the caller has heard), ``clear`` (barge-in).
The bridge only translates: turns, answers and barge-in are the RealtimeSession's. Speech over the answer that
may be a backchannel (``omni_rt.stages.asr.interruption``) holds the answer: Twilio buffers what it was sent and
cannot pause, so the bridge sends ``clear`` and keeps the answer's audio from the last mark Twilio echoed; a
backchannel sends it again from there (``pause``), an interruption is the barge-in it always was. Twilio's messages are
validated field by field: a wrong-typed field is logged and the message ignored, and the call goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omni_rt.realtime.errors import ProtocolError
from omni_rt.transports.host import TransportHost, new_session
from omni_rt.transports.runner import SessionRunner
from omni_rt.transports.websocket import serve_session

log = logging.getLogger("omni_rt.twilio")

FRAME_BYTES = 160  # 20 ms of μ-law at 8 kHz
BYTES_PER_MS = 8
MAX_DTMF_DIGITS = 64  # digits kept per call (oldest dropped)
MAX_FIELD_CHARS = 128  # ids, track and mark names
MAX_MEDIA_PAYLOAD_CHARS = 1 << 16  # base64 of one media frame (Twilio sends 160 bytes)
MAX_KEPT_BYTES = BYTES_PER_MS * 1000 * 300  # the answer's audio kept for a resume: its last 5 minutes


def _str_field(obj: dict[str, Any], key: str, limit: int = MAX_FIELD_CHARS) -> str | None:
    """A string field of a Twilio message, or None when absent / not a short string."""
    value = obj.get(key)
    return value if isinstance(value, str) and len(value) <= limit else None


def _obj_field(msg: dict[str, Any], key: str) -> dict[str, Any]:
    value = msg.get(key)
    return value if isinstance(value, dict) else {}


class TwilioCall:
    """Per-call bridge state: the stream id, what has been sent and what Twilio says was played."""

    def __init__(self, runner: SessionRunner) -> None:
        self.runner = runner
        self.session = runner.session
        self.stream_sid: str | None = None
        self.call_sid: str | None = None
        self.sent_ms: dict[str, int] = {}  # assistant item id -> ms of audio sent
        self.heard: tuple[str, int] | None = None  # (item id, ms) of the last mark Twilio echoed
        self.marks_echoed = 0
        self.dtmf: list[str] = []
        # the current assistant item's audio since the last mark echoed, for a resume: its bytes and (ms, end byte)
        # of each mark in it; while held, ``held`` is (item id, ms heard) and new audio waits here
        self._item: str | None = None
        self._kept = bytearray()
        self._kept_marks: list[tuple[int, int]] = []
        self.held: tuple[str, int] | None = None
        self._resuming = False  # the kept audio is being sent again: new audio joins it, in order
        self.send: Any = None  # async callable(message): sends outside the event stream (pause, resume)
        self._tasks: set[asyncio.Task] = set()

    # ---- Realtime event -> Twilio messages (runs in the sender, in order) ------------------------
    def encode(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        if self.stream_sid is None:
            return []
        etype = event["type"]
        if etype.endswith("output_audio.delta") or etype == "response.audio.delta":
            audio = base64.b64decode(event["delta"])
            item_id = event["item_id"]
            out = [
                {"event": "media", "streamSid": self.stream_sid,
                 "media": {"payload": base64.b64encode(audio[i : i + FRAME_BYTES]).decode("ascii")}}
                for i in range(0, len(audio), FRAME_BYTES)
            ]
            end_ms = self.sent_ms.get(item_id, 0) + len(audio) // BYTES_PER_MS
            self.sent_ms[item_id] = end_ms
            self._keep(item_id, audio, end_ms)
            if self.held is not None or self._resuming:
                return []  # sent on resume, in order
            out.append({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": f"{item_id}:{end_ms}"}})
            return out
        if etype == "input_audio_buffer.speech_started":
            if self.held is not None:  # held for a candidate that was an interruption: what was heard is where it held
                self.heard, self.held = self.held, None
            self._truncate_to_heard()
            return [{"event": "clear", "streamSid": self.stream_sid}]
        if etype == "error":
            log.info("call %s: %s", self.call_sid, event["error"]["message"])
        return []

    def _keep(self, item_id: str, audio: bytes, end_ms: int) -> None:
        if item_id != self._item:
            self._item, self._kept, self._kept_marks = item_id, bytearray(), []
        self._kept += audio
        self._kept_marks.append((end_ms, len(self._kept)))
        if len(self._kept) > MAX_KEPT_BYTES:  # the oldest audio goes, with the marks inside it
            drop = len(self._kept) - MAX_KEPT_BYTES
            del self._kept[:drop]
            self._kept_marks = [(ms, end - drop) for ms, end in self._kept_marks if end - drop > 0]

    def pause(self, paused: bool) -> None:
        """Hold the answer (``clear``: Twilio drops what it buffered) or send it again from where it was heard."""
        if self.stream_sid is None or self.send is None or self._item is None:
            return
        if paused and self.held is None and not self._resuming:
            heard = self.heard[1] if self.heard is not None and self.heard[0] == self._item else 0
            self.held = (self._item, heard)
            self._spawn(self.send({"event": "clear", "streamSid": self.stream_sid}))
        elif not paused and self.held is not None:
            item_id, heard = self.held
            self.held = None
            if item_id == self._item:
                self._resuming = True
                self._spawn(self._resend(heard))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resend(self, heard_ms: int) -> None:
        """The kept audio after ``heard_ms`` as media frames, each original mark after the frame that holds it;
        audio that arrives meanwhile is kept and sent in turn, so the order holds."""
        item_id = self._item
        pos = next((end for ms, end in self._kept_marks if ms == heard_ms), 0)
        try:
            for _ in range(MAX_KEPT_BYTES // FRAME_BYTES + 1):  # bounded: at most the kept audio, frame by frame
                if item_id != self._item or pos >= len(self._kept) or self.held is not None:
                    break
                chunk = bytes(self._kept[pos:pos + FRAME_BYTES])
                marks = [ms for ms, end in self._kept_marks if pos < end <= pos + len(chunk)]
                pos += len(chunk)
                await self.send({"event": "media", "streamSid": self.stream_sid,
                                 "media": {"payload": base64.b64encode(chunk).decode("ascii")}})
                if marks:
                    await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": f"{item_id}:{marks[-1]}"}})
        finally:
            self._resuming = False

    def _truncate_to_heard(self) -> None:
        """Barge-in: the assistant's history keeps only what the caller heard (the last echoed mark)."""
        if self.heard is None:
            return
        item_id, ms = self.heard
        self.heard = None
        try:
            item = self.session.conversation.get(item_id)
        except ProtocolError:
            return
        if item.status != "completed" or ms < item.audio_ms:
            self.runner.feed_event({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                    "audio_end_ms": min(ms, item.audio_ms)})

    # ---- Twilio message -> session ---------------------------------------------------------------
    def handle(self, msg: dict[str, Any]) -> bool:
        """Returns False when the call ended (``stop``)."""
        event = msg.get("event")
        if event == "connected":
            return True
        if event == "start":
            start = _obj_field(msg, "start")
            sid = _str_field(msg, "streamSid") or _str_field(start, "streamSid")
            if sid is None:
                log.info("twilio: 'start' without a string streamSid; ignored")
                return True
            self.stream_sid = sid
            self.call_sid = _str_field(start, "callSid")
            fmt = _str_field(_obj_field(start, "mediaFormat"), "encoding") or "audio/x-mulaw"
            if fmt != "audio/x-mulaw":
                log.warning("call %s: media encoding %s, expected audio/x-mulaw", self.call_sid, fmt)
            return True
        if event == "media":
            media = _obj_field(msg, "media")
            track = media.get("track", "inbound")
            if not isinstance(track, str) or track not in ("inbound", "inbound_track"):
                return True
            payload = _str_field(media, "payload", MAX_MEDIA_PAYLOAD_CHARS)
            if self.stream_sid is None or payload is None:
                return True
            self.runner.feed_event({"type": "input_audio_buffer.append", "audio": payload})
            return True
        if event == "mark":
            name = _str_field(_obj_field(msg, "mark"), "name") or ""
            item_id, _, ms = name.rpartition(":")
            if item_id and ms.isdigit() and len(ms) <= 9 and self.held is None:  # held: where it held stays heard
                self.heard = (item_id, int(ms))
                self.marks_echoed += 1
            return True
        if event == "dtmf":
            digit = _str_field(_obj_field(msg, "dtmf"), "digit", 1)
            if digit is not None and digit in "0123456789*#ABCD":
                self.dtmf.append(digit)
                del self.dtmf[:-MAX_DTMF_DIGITS]
            return True
        if event == "stop":
            return False
        log.info("call %s: ignoring Twilio event %r", self.call_sid, event if isinstance(event, str) and len(event) < 32 else "?")
        return True


async def twilio_endpoint(ws: WebSocket, runtime: TransportHost) -> None:
    runner = SessionRunner(runtime, new_session(runtime, "twilio", session={
        "audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}}), "twilio")
    call = TwilioCall(runner)

    async def send(message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # the call may be gone: the event sender reports that
            await ws.send_text(json.dumps(message))

    call.send = send
    runner.on_playback = call.pause

    async def receive(ws: WebSocket, runner: SessionRunner) -> None:
        while True:
            msg = await asyncio.wait_for(ws.receive(), timeout=runtime.settings.idle_timeout_s)
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            raw = msg.get("text") or msg.get("bytes")
            try:
                data = json.loads(raw)
            except (TypeError, ValueError, RecursionError):
                log.info("twilio: dropping a non-JSON message")
                continue
            if not isinstance(data, dict):
                continue
            try:
                if not call.handle(data):
                    return  # stop: the call is over
            except ProtocolError as exc:
                log.info("twilio: %s", exc.message)

    await serve_session(ws, runtime, runner, receive, encode=call.encode)
