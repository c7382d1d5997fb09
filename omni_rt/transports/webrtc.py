"""WebRTC transport: OpenAI's GA WebRTC flow (``POST /v1/realtime/calls``) on aiortc.

A call is one ``RealtimeSession`` driven by a ``SessionRunner``, exactly as a WebSocket connection is. What
differs is only the carriage:

- Client and server events travel as JSON text on the data channel ``oai-events`` (the client opens it before
  its offer). The same parser, validation and error events as ``/v1/realtime``.
- Microphone audio arrives on an Opus track (48 kHz); each decoded frame is resampled at the edge
  (``omni_rt.audio``) to the session's input format and fed as ``input_audio_buffer.append``.
- Answer audio (``response.output_audio.delta``) never goes on the data channel: it is resampled to 48 kHz
  and queued in ``PacedAudioTrack``, which hands aiortc one 20 ms Opus packet (``WireEncoder``) per 20 ms of
  RTP clock. What the track has handed out is what was played: barge-in clears the queue at once and truncates
  the assistant item to that, and ``output_audio_buffer.started/stopped/cleared`` follow the track, as
  OpenAI's WebRTC sessions send them. ``output_audio_buffer.clear`` (a WebRTC-only client event) is handled here.
- Admission (``webrtc_admission.py``): an answered call is *pending* until ICE and DTLS connect or the data
  channel opens; only then does it take a session slot (counted against ``max_sessions`` like a WebSocket
  session; when the server is full at that moment the call gets an ``error`` event ``server_full`` and is closed).
  A pending call holds a place in a bounded pool, capped per client address, and is freed when ICE fails or
  ``webrtc_connect_timeout_s`` passes: offers that never connect cannot hold the server's sessions.
- A call ends on hangup (``POST /v1/realtime/calls/{id}/hangup``), the peer closing or failing ICE, the data
  channel or mic track ending, no inbound audio for ``webrtc_media_timeout_s`` (a peer that vanished), or
  server shutdown; then its session and everything it held are freed.
- A sideband WebSocket ``/v1/realtime?call_id=ID`` (a server-side controller: tools, instructions) feeds the
  same session and receives the same server events as the data channel.

aiortc is an optional dependency (the ``webrtc`` extra); without it the route answers 501. This module is the call
and its registry; the audio tracks are in ``webrtc_media.py``, the offer's parsing and checks in ``webrtc_offer.py``,
where the ICE sockets bind (``--webrtc-host``, advertised address, port range) in ``webrtc_ice.py``.
Why ~500 lines: a call's life (answer, admit, run, hang up, free) is one state machine whose steps share the
call's fields and its cleanup path; split across modules, each exit would have to re-learn what to free.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from omni_rt.audio.formats import decode_bytes, encode_float, format_rate, parse_audio_format
from omni_rt.audio.pcm import StreamResampler
from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.events import new_id
from omni_rt.transports.host import new_session
from omni_rt.transports.runner import SessionRunner
from omni_rt.transports.sideband import Sidebands
from omni_rt.transports.webrtc_admission import PendingCalls
from omni_rt.transports.webrtc_ice import GatherError, IceConfig, restrict_gathering
from omni_rt.transports.webrtc_media import WIRE_RATE, PacedAudioTrack, decode_on_arrival, webrtc_available
from omni_rt.transports.webrtc_offer import DATA_CHANNEL, CallError, check_offer, read_offer

if TYPE_CHECKING:
    from omni_rt.transports.host import TransportHost

log = logging.getLogger("omni_rt.webrtc")
logging.getLogger("aioice").setLevel(logging.WARNING)  # one INFO line per candidate pair check, per call


__all__ = ["Call", "CallError", "CallRegistry", "read_offer", "webrtc_available"]


# ---- one call ----------------------------------------------------------------------------------------------
class Call:
    """One WebRTC call: the peer connection, the data channel, both audio directions, and its end."""

    def __init__(self, host: "TransportHost", runner: SessionRunner, registry: "CallRegistry", client: str) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection

        self.id = new_id("rtc")
        self.client = client  # the offer's source address: its place in the pending pool is counted per client
        self.pending = True  # holds a place in registry.pending (not a session) until connected or freed
        self.admitted = asyncio.Event()  # set once the call holds a session slot and its session is open
        self.host = host
        self.runner = runner
        self.session = runner.session
        self.registry = registry
        # No STUN/TURN: aiortc's default would reach stun.l.google.com. The answer carries host candidates.
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = PacedAudioTrack(self._audio_started, self._audio_stopped)
        runner.on_playback = self.track.pause  # held while speech over it may be a backchannel, resumed if it was
        self.channel: Any = None
        self.channel_open = asyncio.Event()
        self.ended = asyncio.Event()
        self.end_reason = ""
        self.last_media = time.monotonic()
        self._out_resampler: StreamResampler | None = None
        self._out_key: tuple[str, str] | None = None  # (item id, format) the resampler is streaming
        self._tasks: list[asyncio.Task] = []
        self.sidebands = Sidebands()  # server-side controllers (serve_sideband)
        self._main: asyncio.Task | None = None
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    # ---- signalling ------------------------------------------------------------------------------------
    async def answer(self, offer_sdp: str) -> str:
        from aiortc import RTCRtpSender, RTCSessionDescription

        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:  # aiortc raises ValueError, KeyError, ... on offers it cannot use
            log.info("call %s: offer refused: %r", self.id, exc)
            raise CallError(400, "invalid_offer", "the SDP offer could not be negotiated (it needs ICE "
                            "credentials, a DTLS fingerprint and an Opus audio section)", "sdp") from None
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        audio = [t for t in self.pc.getTransceivers() if t.kind == "audio"]
        if len(audio) != 1:
            raise CallError(400, "invalid_offer", f"the offer must have exactly one audio section, it has {len(audio)}", "sdp")
        audio[0].setCodecPreferences(opus)
        decode_on_arrival(audio[0].receiver)
        self.pc.addTrack(self.track)
        restrict_gathering(self.pc, self.registry.ice)  # --webrtc-host, advertised address, port range
        try:
            await self.pc.setLocalDescription(await self.pc.createAnswer())  # gathers host candidates (no trickle)
        except GatherError as exc:
            log.warning("call %s: %s", self.id, exc.strerror)
            raise CallError(503, "server_full", "the server could not open a WebRTC port") from None
        return self.pc.localDescription.sdp

    def start(self) -> None:
        self._main = asyncio.create_task(self._serve(), name=f"call-{self.id}")

    # ---- peer events -----------------------------------------------------------------------------------
    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self._admit()
        elif state in ("failed", "closed"):
            self.finish(f"peer connection {state}")

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != DATA_CHANNEL or self.channel is not None:
            log.info("call %s: ignoring data channel %r", self.id, channel.label[:64])
            return
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self.finish("data channel closed"))
        if channel.readyState == "open":
            self._channel_opened()
        else:
            channel.on("open", self._channel_opened)

    def _channel_opened(self) -> None:
        self._admit()
        self.channel_open.set()

    def _admit(self) -> None:
        """Media or the data channel is up: give back the pending place and take a session slot (the same count
        as a WebSocket session), or end the call when the server is full or shutting down."""
        if self.admitted.is_set() or self.ended.is_set():
            return
        self.registry.release(self)
        host = self.host
        limit = host.settings.max_sessions
        if getattr(host, "draining", False):
            self.finish("server shutting down")
        elif len(host.sessions) >= limit:
            self.finish(f"server full: {limit} sessions")
        if self.ended.is_set():
            host.metrics.connections.labels(surface="webrtc", outcome="refused_full_at_connect").inc()
            return
        host.sessions.add(self.runner)
        host.metrics.sessions.inc()
        host.metrics.connections.labels(surface="webrtc", outcome="connected").inc()
        self.last_media = time.monotonic()
        self.runner.open()  # session.created goes out first on the data channel
        self.admitted.set()

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._read_mic(track), name=f"mic-{self.id}"))

    def _on_message(self, message: str | bytes) -> None:
        if self.ended.is_set():
            return
        limit = self.host.settings.max_message_bytes
        if len(message) > limit:
            self.runner.report(ProtocolError("message_too_large", f"a data channel message carries at most {limit} bytes, got {len(message)}"))
            return
        if isinstance(message, str) and "output_audio_buffer.clear" in message[:256]:
            with contextlib.suppress(ValueError, RecursionError):
                event = json.loads(message)
                if isinstance(event, dict) and event.get("type") == "output_audio_buffer.clear":
                    self._clear_audio()
                    return
        self.runner.feed_message(message)

    async def _read_mic(self, track: Any) -> None:
        """Opus frames (48 kHz, decoded by aiortc) -> the session's input format -> input_audio_buffer.append."""
        from aiortc.mediastreams import MediaStreamError

        resampler: StreamResampler | None = None
        fmt = ""
        parsed = None  # fmt parsed, once per change (not per 20 ms frame)
        try:
            while True:
                frame = await track.recv()
                if not self.admitted.is_set():  # media racing the admission (or refused by it): no session yet
                    continue
                self.last_media = time.monotonic()
                pcm = frame.to_ndarray().astype(np.float32).reshape(-1, len(frame.layout.channels)).mean(axis=1) / 32768.0
                if fmt != self.session.config.input_format or resampler is None or resampler.sr_in != frame.sample_rate:
                    fmt = self.session.config.input_format
                    parsed = parse_audio_format(fmt)
                    resampler = StreamResampler(frame.sample_rate, format_rate(parsed), quality="QQ")
                out = resampler.process(pcm)
                if len(out):
                    self._feed_audio(encode_float(out, parsed))
        except MediaStreamError:
            self.finish("microphone track ended")

    def _feed_audio(self, wire: bytes) -> None:
        """Microphone audio, in the session's input format, to the session."""
        self.runner.feed_event({"type": "input_audio_buffer.append", "audio": base64.b64encode(wire).decode("ascii")})

    # ---- outgoing events and audio ---------------------------------------------------------------------
    def _send(self, event: dict[str, Any]) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps(event))
        self.sidebands.fan_out(event)

    def _audio_started(self, response_id: str) -> None:
        self._send({"type": "output_audio_buffer.started", "event_id": new_id("event"), "response_id": response_id})

    def _audio_stopped(self, response_id: str) -> None:
        self._send({"type": "output_audio_buffer.stopped", "event_id": new_id("event"), "response_id": response_id})

    def _clear_audio(self) -> None:
        """Stop the answer's sound now and keep in the conversation only what was played."""
        cut = self.track.clear()
        self._out_resampler = None
        heard = self.track.heard()
        if heard is not None:
            item_id, ms = heard
            with contextlib.suppress(ProtocolError):
                item = self.session.conversation.get(item_id)
                if item.status != "completed" or ms < item.audio_ms:
                    self.runner.feed_event({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                            "audio_end_ms": min(ms, item.audio_ms)})
            self.track.last_item = None
        if cut is not None:
            self._send({"type": "output_audio_buffer.cleared", "event_id": new_id("event"), "response_id": cut})

    def _route(self, event: dict[str, Any]) -> None:
        """One server event from the session: audio to the track, everything else to the data channel."""
        etype = event.get("type", "")
        if etype in ("response.output_audio.delta", "response.audio.delta"):
            self._queue_audio(event)
            return
        if etype in ("response.output_audio.done", "response.audio.done"):
            if self._out_resampler is not None and self._out_key is not None and self._out_key[0] == event.get("item_id"):
                self.track.push(event["response_id"], event["item_id"], self._out_resampler.flush())
            self._out_resampler = None
            self.track.end(event["response_id"], event["item_id"])
        self._send(event)
        if etype == "input_audio_buffer.speech_started":  # barge-in: after the event, as OpenAI orders them
            td = self.session.config.turn_detection
            if td is None or td.interrupt_response:
                self._clear_audio()
            else:  # the client keeps the answer playing through speech: a pause for a candidate ends here
                self.track.pause(False)
        elif etype == "response.done" and event.get("response", {}).get("status") == "cancelled":
            self._clear_audio()

    def _queue_audio(self, event: dict[str, Any]) -> None:
        fmt = parse_audio_format(self.session.config.output_format)
        key = (event["item_id"], fmt)
        if self._out_resampler is None or self._out_key != key:
            self._out_resampler = StreamResampler(format_rate(fmt), WIRE_RATE, quality="HQ")
            self._out_key = key
        samples = decode_bytes(base64.b64decode(event["delta"]), fmt)
        self.track.push(event["response_id"], event["item_id"], self._out_resampler.process(samples))

    async def _pump(self) -> None:
        await self.channel_open.wait()
        limit = self.host.settings.max_outgoing_bytes
        while True:
            events = await self.runner.next_events()
            if events is None:
                return
            for event in events:
                self._route(event)
            if self.channel is not None and self.channel.bufferedAmount > limit:
                self.finish(f"client is not reading: over {limit} bytes queued on the data channel")
                return

    async def _watch_media(self) -> None:
        """A peer that vanished sends nothing: no inbound audio for the timeout ends the call."""
        timeout = float(getattr(self.host.settings, "webrtc_media_timeout_s", 15.0))
        while not self.ended.is_set():
            await asyncio.sleep(min(1.0, timeout / 4))
            if time.monotonic() - self.last_media > timeout:
                self.finish(f"no audio from the peer for {timeout:g} s")

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self, reason: str) -> None:
        if not self.ended.is_set():
            self.end_reason = reason
            self.ended.set()

    async def _await_admission(self) -> bool:
        """Wait until the call is admitted; False when it ended first or its connect deadline passed."""
        timeout = self.registry.pending.connect_timeout_s
        waits = {asyncio.create_task(self.admitted.wait()), asyncio.create_task(self.ended.wait())}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        if self.admitted.is_set():
            return True
        self.finish(f"not connected within {timeout:g} s")  # else ICE failed, hung up, or refused at connect
        if not self.end_reason.startswith("server"):
            self.host.metrics.connections.labels(surface="webrtc", outcome="not_connected").inc()
        return False

    async def _refuse(self) -> None:
        """A call that never got its session: say why on the data channel if it opened, then close the peer."""
        try:
            if self.end_reason.startswith("server") and self.pc.connectionState == "connected":
                # refused at ICE/DTLS connect: the client's data channel opens just after; tell it there
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.channel_open.wait(), timeout=2.0)
            if self.channel is not None and self.channel.readyState == "open" and self.end_reason.startswith("server"):
                self.channel.send(json.dumps({"type": "error", "event_id": new_id("event"), "error": {
                    "type": "invalid_request_error", "code": "server_full", "message": self.end_reason,
                    "param": None, "event_id": None}}))
                await asyncio.sleep(0.2)  # the SCTP sender's turn before the transport closes
            # offers that never connect are counted (omni_rt_connections_total), not logged one line each
            (log.info if self.end_reason.startswith("server") else log.debug)("call %s not admitted: %s", self.id, self.end_reason)
        finally:
            self.track.stop()
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pc.close(), timeout=5.0)
            self.registry.release(self)
            self.registry.calls.pop(self.id, None)

    async def _serve(self) -> None:
        try:
            admitted = await self._await_admission()
        except asyncio.CancelledError:
            self.finish("server shutting down")
            await self._refuse()
            raise
        if not admitted:
            await self._refuse()
            return
        host = self.host
        pump = asyncio.create_task(self._pump(), name=f"call-send-{self.id}")
        pump.add_done_callback(lambda t: t.cancelled() or t.exception() is None or self.finish("internal error while sending"))
        self._tasks.append(asyncio.create_task(self._watch_media(), name=f"call-watch-{self.id}"))
        ended = asyncio.create_task(self.ended.wait())
        try:
            await asyncio.wait({pump, ended}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done() and not self.ended.is_set():
                exc = pump.exception()
                if exc is not None:
                    log.warning("call %s send failed: %r", self.id, exc)
                close = self.runner.close_request
                self.finish(close.reason if close is not None else "session closed")
            log.info("call %s ended: %s", self.id, self.end_reason)
        except asyncio.CancelledError:
            self.finish("server shutting down")
            raise
        finally:
            ended.cancel()
            for task in self._tasks:  # the mic first: no append may follow the close
                task.cancel()
            await self.runner.close()
            with contextlib.suppress(BaseException):  # the last events (response.done) go out first
                await asyncio.wait_for(pump, timeout=1.0)
            pump.cancel()
            self.track.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pc.close(), timeout=5.0)
            host.sessions.discard(self.runner)
            host.metrics.sessions.dec()
            self.registry.calls.pop(self.id, None)

    async def serve_sideband(self, ws: Any) -> None:
        """A server-side controller on ``/v1/realtime?call_id=``: its client events drive this call's session (same
        validation), and it receives every server event the data channel gets, until either side leaves."""
        if not self.admitted.is_set():  # a controller of a call still connecting waits for its session
            waits = {asyncio.create_task(self.admitted.wait()), asyncio.create_task(self.ended.wait())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)  # ends by the connect deadline
            for task in waits:
                task.cancel()
            if not self.admitted.is_set():
                with contextlib.suppress(Exception):
                    await ws.close(code=1000, reason="call ended")
                return
        await self.sidebands.serve(ws, ended=self.ended, feed=self.runner.feed_message, ended_reason="call ended")


class CallRegistry:
    """The server's calls, by id (for hangup and sidebands), and the pool of those still connecting."""

    def __init__(self, host: "TransportHost") -> None:
        self.host = host
        self.calls: dict[str, Call] = {}
        self.ice = IceConfig.from_settings(host.settings)  # where calls' ICE sockets bind (omni_rt.transports.webrtc_ice)
        settings = host.settings
        self.pending = PendingCalls(settings.webrtc_max_pending_calls, settings.webrtc_max_pending_per_client,
                                    settings.webrtc_connect_timeout_s)

    def release(self, call: Call) -> None:
        """The call's pending place is free again (it connected, failed, expired or was hung up); once only."""
        if call.pending:
            call.pending = False
            self.pending.release(call.client)
            self.host.metrics.pending_calls.set(len(self.pending))

    async def create(self, offer_sdp: str, session_config: dict[str, Any] | None, model: str | None,
                     client: str = "unknown", call_type: Any = None) -> Call:
        """Answer an offer from ``client`` (its IP address): a new session (its config applied like
        ``session.update``), not yet open nor counted as a session: the call waits in the pending pool until
        it connects (``Call._admit``). ``call_type``: ``Call`` or a subclass taking the same arguments (a GPT-Live
        call, ``omni_rt.transports.live_webrtc``)."""
        if not webrtc_available():
            raise CallError(501, "not_implemented", "WebRTC needs the 'webrtc' extra: pip install 'omni-rt[webrtc]'")
        check_offer(offer_sdp)
        host = self.host
        if model is None and session_config is not None and isinstance(session_config.get("model"), str):
            model = session_config["model"]
        config = {k: v for k, v in (session_config or {}).items() if k != "model"}
        try:
            session = new_session(host, model, session=config or None)
        except ProtocolError as exc:
            raise CallError(400, exc.code, exc.message, exc.param) from None
        self.pending.reserve(client)  # raises 429 / 503 when this client's share or the pool is full
        try:
            call = (call_type or Call)(host, SessionRunner(host, session, "webrtc"), self, client)
        except BaseException:
            self.pending.release(client)
            raise
        host.metrics.pending_calls.set(len(self.pending))
        try:
            await call.answer(offer_sdp)  # the answer SDP stays on call.pc.localDescription
        except BaseException:
            self.release(call)
            with contextlib.suppress(Exception):
                await call.pc.close()
            raise
        self.calls[call.id] = call
        call.start()
        log.debug("call %s: session %s, waiting to connect", call.id, session.id)
        return call

    def close_pending(self, reason: str) -> None:
        """Shutdown: calls still connecting end now (connected ones are drained with the sessions)."""
        for call in list(self.calls.values()):
            if not call.admitted.is_set():
                call.finish(reason)

    def state(self) -> dict[str, int]:
        return {"pending": len(self.pending), "calls": len(self.calls)}

    async def sideband(self, call_id: str, ws: Any) -> None:
        call = self.calls.get(call_id)
        if call is None:
            await ws.close(code=1008, reason="unknown call_id")
            return
        await call.serve_sideband(ws)

    def hangup(self, call_id: str) -> bool:
        call = self.calls.get(call_id)
        if call is None:
            return False
        call.finish("hung up")
        return True
