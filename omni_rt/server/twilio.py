"""Twilio Media Streams bridge: a phone call becomes a Realtime session speaking μ-law 8 kHz.

In: ``connected``, ``start``, ``media``, ``dtmf``, ``mark``, ``stop``. Out: ``media`` (20 ms μ-law frames),
``mark`` (after each audio chunk, so Twilio tells us what the caller has heard), ``clear`` (barge-in).
The bridge only translates: turns, answers and barge-in are the RealtimeSession's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omni_rt.server.protocol import ProtocolError
from omni_rt.server.realtime import RealtimeSession

log = logging.getLogger("omni_rt.twilio")

FRAME_BYTES = 160  # 20 ms of μ-law at 8 kHz
BYTES_PER_MS = 8


class TwilioCall:
    """Per-call bridge state: the stream id, what has been sent and what Twilio says was played."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
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
            self.session.handle_event({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                       "audio_end_ms": min(ms, item.audio_ms)})

    # ---- Twilio message -> session ---------------------------------------------------------------
    def handle(self, msg: dict[str, Any]) -> bool:
        """Returns False when the call ended (``stop``)."""
        event = msg.get("event")
        if event == "connected":
            return True
        if event == "start":
            start = msg.get("start") or {}
            self.stream_sid = msg.get("streamSid") or start.get("streamSid")
            self.call_sid = start.get("callSid")
            fmt = (start.get("mediaFormat") or {}).get("encoding", "audio/x-mulaw")
            if fmt != "audio/x-mulaw":
                log.warning("call %s: media encoding %s, expected audio/x-mulaw", self.call_sid, fmt)
            return True
        if event == "media":
            media = msg.get("media") or {}
            if media.get("track", "inbound") not in ("inbound", "inbound_track"):
                return True
            payload = media.get("payload")
            if self.stream_sid is None or not isinstance(payload, str):
                return True
            self.session.handle_event({"type": "input_audio_buffer.append", "audio": payload})
            return True
        if event == "mark":
            name = (msg.get("mark") or {}).get("name", "")
            item_id, _, ms = name.rpartition(":")
            if item_id and ms.isdigit():
                self.heard = (item_id, int(ms))
                self.marks_echoed += 1
            return True
        if event == "dtmf":
            digit = (msg.get("dtmf") or {}).get("digit")
            if isinstance(digit, str):
                self.dtmf.append(digit)
            return True
        if event == "stop":
            return False
        log.info("call %s: ignoring Twilio event %r", self.call_sid, event)
        return True


async def twilio_endpoint(ws: WebSocket, runtime: Any) -> None:
    from omni_rt.server.app import serve_session

    session = RealtimeSession(runtime, model="twilio", session={
        "audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}})
    call = TwilioCall(session)
    session.twilio = call  # type: ignore[attr-defined]

    async def receive(ws: WebSocket, session: RealtimeSession) -> None:
        while True:
            msg = await asyncio.wait_for(ws.receive(), timeout=runtime.settings.idle_timeout_s)
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            raw = msg.get("text") or msg.get("bytes")
            try:
                data = json.loads(raw)
            except (TypeError, ValueError):
                log.info("twilio: dropping a non-JSON message")
                continue
            if not isinstance(data, dict):
                continue
            try:
                if not call.handle(data):
                    return  # stop: the call is over
            except ProtocolError as exc:
                log.info("twilio: %s", exc.message)

    await serve_session(ws, runtime, session, receive, encode=call.encode)
