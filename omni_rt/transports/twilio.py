"""Twilio Media Streams bridge: a phone call becomes a Realtime session speaking μ-law 8 kHz.

In: ``connected``, ``start``, ``media``, ``dtmf``, ``mark``, ``stop``. Out: ``media`` (20 ms μ-law frames),
``mark`` (after each audio chunk, so Twilio tells us what the caller has heard), ``clear`` (barge-in).
The bridge only translates: turns, answers and barge-in are the RealtimeSession's. Twilio's messages are
validated field by field: a wrong-typed field is logged and the message ignored, and the call goes on.
"""

from __future__ import annotations

import asyncio
import base64
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
            out.append({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": f"{item_id}:{end_ms}"}})
            return out
        if etype == "input_audio_buffer.speech_started":
            self._truncate_to_heard()
            return [{"event": "clear", "streamSid": self.stream_sid}]
        if etype == "error":
            log.info("call %s: %s", self.call_sid, event["error"]["message"])
        return []

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
            if item_id and ms.isdigit() and len(ms) <= 9:
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
