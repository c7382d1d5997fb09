"""GPT-Live over WebRTC (``POST /v1/live/sessions``): a WebRTC call (``omni_rt.transports.webrtc``) whose data
channel speaks the Live protocol through a ``LiveSession`` in media-track mode.

The creation request carries the session (``{session, transport: {type: "webrtc", sdp}}``, no ``audio.format``:
the media is Opus) and starts it; the answer is ``{session: {id}, transport: {type: "webrtc", sdp}}``.
``session.started`` is the first event on ``oai-events``. Audio rides the tracks exactly as in a Realtime call
(the microphone to the session, the answer paced onto the outgoing track, barge-in clearing it); the data
channel carries the Live events, translated by the same ``LiveSession`` as the WebSocket, minus
``session.start`` and ``session.input_audio.append`` and without ``session.output_audio.delta``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from omni_rt.realtime.errors import ProtocolError
from omni_rt.session.live import LiveSession
from omni_rt.transports.live_backend import BackendTasks
from omni_rt.transports.webrtc import Call
from omni_rt.transports.webrtc_offer import MAX_SDP_BYTES, MAX_SESSION_BYTES, CallError


async def read_live_offer(request: Any) -> tuple[str, Any]:
    """The SDP offer and the session object of a ``POST /v1/live/sessions`` JSON body."""
    raw = await request.body()
    if len(raw) > MAX_SDP_BYTES + MAX_SESSION_BYTES:
        raise CallError(413, "request_too_large", f"the body is over {MAX_SDP_BYTES + MAX_SESSION_BYTES} bytes")
    try:
        body = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        raise CallError(400, "invalid_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise CallError(400, "invalid_json", "the body must be an object {session, transport}")
    for key in body:
        if key not in ("session", "transport"):
            raise CallError(400, "unknown_parameter", f"unknown parameter '{str(key)[:40]}'", str(key)[:40])
    transport = body.get("transport")
    if not isinstance(transport, dict) or transport.get("type") != "webrtc":
        raise CallError(400, "invalid_value", "transport must be {type: 'webrtc', sdp: <offer>}", "transport.type")
    for key in transport:
        if key not in ("type", "sdp"):
            raise CallError(400, "unknown_parameter", f"unknown parameter 'transport.{str(key)[:40]}'", f"transport.{str(key)[:40]}")
    sdp = transport.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip():
        raise CallError(400, "missing_required_parameter", "transport.sdp needs the SDP offer", "transport.sdp")
    if len(sdp) > MAX_SDP_BYTES:
        raise CallError(413, "request_too_large", f"the SDP offer is over {MAX_SDP_BYTES} bytes", "transport.sdp")
    return sdp, body.get("session")


def start_live(session: Any, voices: tuple[str, ...], delegation_policy: str, responses_backend: bool = False) -> LiveSession:
    """The Live session of a creation request, started; a bad session object is a 400 naming the field."""
    live = LiveSession(voices=voices, delegation_policy=delegation_policy, media_track=True, responses_backend=responses_backend)
    try:
        live.start(session)
    except ProtocolError as exc:
        raise CallError(400, exc.code, exc.message, exc.param) from None
    return live


class LiveCall(Call):
    """A WebRTC call whose data channel speaks GPT-Live."""

    def __init__(self, host: Any, runner: Any, registry: Any, client: str, *, live: LiveSession,
                 live_registry: Any = None) -> None:
        """``live_registry``: the server's ``LiveRegistry`` (``omni_rt.transports.live``), for ``/attach``."""
        super().__init__(host, runner, registry, client)
        self.live = live
        if live_registry is not None:
            live_registry.sessions[live.id] = self
            self._live_registry = live_registry
        settings = host.settings
        self.backend = BackendTasks(getattr(settings, "delegate", None), getattr(settings, "delegate_api_key", None),
                                    self._deliver)

    def _deliver(self, response_id: str, kind: str, data: Any) -> None:
        self.live.receive_backend(response_id, kind, data)
        self._flush_live()

    def _flush_live(self) -> None:
        for event in self.live.core_events():
            self.runner.feed_event(event)
        for event in self.live.events_to_send():
            self._send(event)
        if not self.ended.is_set():
            self.backend.start(self.live.take_backend_jobs())
        if self.live.overflow:
            self.finish(f"client is not reading: over {self.live.limits.max_queued_events} events queued")

    def _on_message(self, message: str | bytes) -> None:
        if self.ended.is_set() or not self.admitted.is_set():
            return
        limit = self.host.settings.max_message_bytes
        if len(message) > limit:
            self.live.send_error(ProtocolError("message_too_large", f"a data channel message carries at most {limit} bytes, "
                                               f"got {len(message)}"))
        else:
            self.live.receive_message(message)
        self._flush_live()

    def _feed_audio(self, wire: bytes) -> None:
        super()._feed_audio(b"\x00" * len(wire) if self.live.muted else wire)  # muted: the model hears silence

    def _send(self, event: dict[str, Any]) -> None:
        if not event.get("type", "").startswith("output_audio_buffer."):  # Realtime-only: Live has no such events
            super()._send(event)

    def _route(self, event: dict[str, Any]) -> None:
        etype = event.get("type", "")
        if etype == "response.output_audio.delta":
            self._queue_audio(event)
        elif etype == "response.output_audio.done":
            if self._out_resampler is not None and self._out_key is not None and self._out_key[0] == event.get("item_id"):
                self.track.push(event["response_id"], event["item_id"], self._out_resampler.flush())
            self._out_resampler = None
            self.track.end(event["response_id"], event["item_id"])
        self.live.receive_core([event])
        if etype == "input_audio_buffer.speech_started":
            self._clear_audio()  # barge-in: the Live session always interrupts
        elif etype == "response.done" and event.get("response", {}).get("status") == "cancelled":
            self._clear_audio()

    def finish(self, reason: str) -> None:
        self.backend.close()
        registry = getattr(self, "_live_registry", None)
        if registry is not None:
            registry.sessions.pop(self.live.id, None)
        super().finish(reason)

    def sideband_message(self, raw: str | bytes) -> None:
        if self.admitted.is_set():
            self.live.receive_message(raw, sideband=True)
            self._flush_live()

    async def _pump(self) -> None:
        await self.channel_open.wait()
        self._flush_live()  # session.started first
        limit = self.host.settings.max_outgoing_bytes
        tick = self.live.limits.tick_s
        while True:
            try:
                events = await asyncio.wait_for(self.runner.next_events(), timeout=tick)
            except asyncio.TimeoutError:
                events = []
            if events is None:
                return
            for event in events:
                self._route(event)
            self.live.tick()
            self._flush_live()
            if self.live.finished:
                await asyncio.sleep(0.2)  # session.closed on its way before the peer connection closes
                self.finish(self.live.close_reason or "session closed")
                return
            if self.channel is not None and self.channel.bufferedAmount > limit:
                self.finish(f"client is not reading: over {limit} bytes queued on the data channel")
                return
