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
- A call ends on hangup (``POST /v1/realtime/calls/{id}/hangup``), the peer closing or failing ICE, the data
  channel or mic track ending, no inbound audio for ``webrtc_media_timeout_s`` (a peer that vanished), or
  server shutdown; then its session and everything it held are freed.
- A sideband WebSocket ``/v1/realtime?call_id=ID`` (a server-side controller: tools, instructions) feeds the
  same session and receives the same server events as the data channel.

aiortc is an optional dependency (the ``webrtc`` extra); without it the route answers 501.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fractions
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from omni_rt.audio.formats import decode_bytes, encode_float, format_rate, parse_audio_format
from omni_rt.audio.pcm import StreamResampler, float_to_int16
from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.events import new_id
from omni_rt.session.core import RealtimeSession, SessionOptions
from omni_rt.transports.runner import SessionRunner

if TYPE_CHECKING:
    from omni_rt.transports.host import TransportHost

log = logging.getLogger("omni_rt.webrtc")
logging.getLogger("aioice").setLevel(logging.WARNING)  # one INFO line per candidate pair check, per call

WIRE_RATE = 48000  # Opus in WebRTC always runs at 48 kHz
FRAME_SAMPLES = 960  # 20 ms at 48 kHz: one Opus packet
FRAME_S = FRAME_SAMPLES / WIRE_RATE
TIME_BASE = fractions.Fraction(1, WIRE_RATE)  # pts count samples


def wire_frame(pcm: np.ndarray, pts: int) -> Any:
    """One 20 ms ``av.AudioFrame`` of int16 mono at the wire rate, stamped ``pts`` (in samples)."""
    from av import AudioFrame

    frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
    frame.planes[0].update(pcm.tobytes())
    frame.sample_rate = WIRE_RATE
    frame.pts = pts
    frame.time_base = TIME_BASE
    return frame


class WireEncoder:
    """Opus-encodes a track's 20 ms frames in its own ``recv()``, which hands aiortc the packet.

    Given a frame, aiortc's sender scans it for the audio-level header (44-112 us) and encodes it on the loop's
    thread pool: a thread hop and two wake-ups per 20 ms. Encoding here, with aiortc's own encoder (the same
    payload bytes), costs a call 1.5-2.5% of a core less on each end, CPU that the pipeline on the same cores
    otherwise waits for. The server's answer track and the bench's microphone (``latency_bench/webrtc_client.py``)
    both send this way; the packets carry no audio-level header extension (nothing here reads it).
    """

    def __init__(self) -> None:
        from aiortc.codecs.opus import OpusEncoder
        from av import Packet

        self._encoder = OpusEncoder()
        self._packet = Packet  # imported once, not per 20 ms

    def packet(self, pcm: np.ndarray, pts: int) -> Any:
        """One ``av.Packet`` for 960 int16 samples, stamped ``pts`` (in samples) for the RTP timestamp."""
        payloads, _ = self._encoder.encode(wire_frame(pcm, pts))
        packet = self._packet(payloads[0] if payloads else b"\xfc\xff\xfe")  # always one (aiortc frames its input in 20 ms); else silence
        packet.pts = pts
        packet.time_base = TIME_BASE
        return packet


DATA_CHANNEL = "oai-events"
MAX_SDP_BYTES = 64 * 1024
MAX_SESSION_BYTES = 256 * 1024
MAX_QUEUED_FRAMES = 50 * 300  # 5 minutes of answer audio queued in the track
MAX_SILENCE_SLIP_S = 0.002  # per silent frame, while the send clock is ahead of the RTP clock
MAX_SIDEBAND_EVENTS = 4096  # server events queued for a sideband controller that does not read


class ImmediateAudioBuffer:
    """The microphone's jitter buffer: each in-order RTP packet is one whole Opus frame, decoded on arrival.

    aiortc's audio receiver holds 4 frames (80 ms) before it decodes the first, and even holding 1 releases a
    frame only when the next arrives (20 ms): all of that is added to the end of every user turn. VAD and Whisper
    need no smooth playout, so a frame goes to the decoder at once; a packet that arrives after a later one
    (reordered) is dropped, a 20 ms gap the recognizer shrugs off. Same ``add`` contract as aiortc's JitterBuffer.
    """

    def __init__(self) -> None:
        self._next: int | None = None

    def add(self, packet: Any) -> tuple[bool, Any]:
        from aiortc.jitterbuffer import JitterFrame

        seq = packet.sequence_number
        if self._next is not None and (seq - self._next) & 0xFFFF >= 0x8000:
            return False, None  # older than one already decoded
        self._next = (seq + 1) & 0xFFFF
        data = getattr(packet, "_data", b"")
        return False, (JitterFrame(data=data, timestamp=packet.timestamp) if data else None)


def decode_on_arrival(receiver: Any) -> None:
    """Give an aiortc audio receiver the ``ImmediateAudioBuffer`` (its jitter buffer is private in aiortc 1.16.0,
    the pinned version) before media flows; a receiver that has none is left alone."""
    from aiortc.jitterbuffer import JitterBuffer

    name = "_RTCRtpReceiver__jitter_buffer"
    if isinstance(getattr(receiver, name, None), JitterBuffer):
        setattr(receiver, name, ImmediateAudioBuffer())


def webrtc_available() -> bool:
    try:
        import aiortc  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class CallError(Exception):
    """A refused call: the HTTP status and an OpenAI-style error body."""

    status: int
    code: str
    message: str
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"type": "invalid_request_error", "code": self.code, "message": self.message, "param": self.param}}


# ---- the offer ---------------------------------------------------------------------------------------------
async def read_offer(request: Any) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and optional session config of a ``POST /v1/realtime/calls`` body: raw ``application/sdp``,
    multipart ``sdp`` + ``session`` (openai-python's ``calls.create``), or JSON ``{sdp, session}``."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    session: Any = None
    if ctype == "multipart/form-data":
        try:
            form = await request.form(max_files=4, max_fields=8)
        except Exception:  # starlette raises several kinds on a broken multipart body
            raise CallError(400, "invalid_request", "could not parse the multipart body") from None
        sdp, session = await _form_text(form.get("sdp")), await _form_text(form.get("session"))
    else:
        raw = await request.body()
        if len(raw) > MAX_SDP_BYTES + MAX_SESSION_BYTES:
            raise CallError(413, "request_too_large", f"the body is over {MAX_SDP_BYTES + MAX_SESSION_BYTES} bytes")
        text = raw.decode("utf-8", errors="replace")
        if ctype == "application/json":
            try:
                body = json.loads(text)
            except (ValueError, RecursionError):
                raise CallError(400, "invalid_json", "the body is not valid JSON") from None
            if not isinstance(body, dict):
                raise CallError(400, "invalid_json", "the JSON body must be an object with 'sdp' (and 'session')")
            sdp, session = body.get("sdp"), body.get("session")
        else:  # application/sdp, and what browsers send when the type is left out
            sdp = text
    if not isinstance(sdp, str) or not sdp.strip():
        raise CallError(400, "missing_required_parameter", "the body needs an SDP offer", "sdp")
    if len(sdp) > MAX_SDP_BYTES:
        raise CallError(413, "request_too_large", f"the SDP offer is over {MAX_SDP_BYTES} bytes", "sdp")
    if isinstance(session, str):
        if len(session) > MAX_SESSION_BYTES:
            raise CallError(413, "request_too_large", f"the session is over {MAX_SESSION_BYTES} bytes", "session")
        try:
            session = json.loads(session) if session.strip() else None
        except (ValueError, RecursionError):
            raise CallError(400, "invalid_json", "'session' is not valid JSON", "session") from None
    if session is not None and not isinstance(session, dict):
        raise CallError(400, "invalid_type", "'session' must be a JSON object", "session")
    return sdp, session


async def _form_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    data = await value.read(MAX_SDP_BYTES + MAX_SESSION_BYTES + 1)  # an UploadFile (a part with a filename)
    if len(data) > MAX_SDP_BYTES + MAX_SESSION_BYTES:
        raise CallError(413, "request_too_large", "a multipart part is too large")
    return data.decode("utf-8", errors="replace")


def check_offer(sdp: str) -> None:
    """Refuse, with a clear reason, an offer this server cannot answer: not SDP, no audio, no data channel."""
    from aiortc.sdp import SessionDescription

    if not sdp.lstrip().startswith("v=0"):
        raise CallError(400, "invalid_offer", "the body is not an SDP offer (it must start with 'v=0')", "sdp")
    try:
        desc = SessionDescription.parse(sdp)
    except Exception:
        raise CallError(400, "invalid_offer", "the SDP offer could not be parsed", "sdp") from None
    kinds = [m.kind for m in desc.media]
    if "audio" not in kinds:
        raise CallError(400, "invalid_offer", "the offer has no audio section (m=audio): add a microphone track "
                        "or an audio transceiver", "sdp")
    if "application" not in kinds:
        raise CallError(400, "invalid_offer", f"the offer has no data channel (m=application): create the "
                        f"'{DATA_CHANNEL}' data channel before createOffer()", "sdp")
    if not any(c.mimeType.lower() == "audio/opus" for m in desc.media if m.kind == "audio" for c in m.rtp.codecs):
        raise CallError(400, "invalid_offer", "the offer's audio does not include Opus", "sdp")


# ---- outgoing audio ----------------------------------------------------------------------------------------
def _track_base():
    from aiortc.mediastreams import MediaStreamTrack

    return MediaStreamTrack


class PacedAudioTrack(_track_base() if webrtc_available() else object):  # type: ignore[misc]
    """The answer's audio as an aiortc track: one 20 ms frame per 20 ms of RTP clock, silence when idle.

    aiortc's sender pulls ``recv()`` as fast as it returns, so the pacing lives here (as in aiortc's own
    ``AudioStreamTrack``). A frame counts as played when handed out; ``played_ms`` per item is what the
    listener heard (give or take their jitter buffer).
    """

    kind = "audio"

    def __init__(self, on_started: Callable[[str], None], on_stopped: Callable[[str], None]) -> None:
        super().__init__()
        self._frames: deque[tuple[str, str, np.ndarray]] = deque()  # (response id, item id, 960 int16)
        self._partial: tuple[str, str, np.ndarray] | None = None  # the tail shorter than a frame
        self._ending: set[str] = set()  # responses whose audio is all queued
        self._playing: str | None = None  # response id whose audio is going out
        self.played: dict[str, int] = {}  # item id -> samples handed out
        self.last_item: str | None = None
        self._on_started, self._on_stopped = on_started, on_stopped
        self._start: float | None = None
        self._pts = 0
        self._silence = np.zeros(FRAME_SAMPLES, np.int16)
        self._wire = WireEncoder()
        self._idle_waiter: asyncio.Future | None = None  # set while recv() sleeps with nothing queued
        self._ahead = 0.0  # seconds the send clock runs ahead of the RTP clock (early first frames), repaid in silence

    def push(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        """Queue float32 48 kHz audio of one response (whole frames; a short tail waits for more)."""
        pcm = float_to_int16(samples)
        if self._partial is not None and self._partial[1] == item_id:
            pcm = np.concatenate([self._partial[2], pcm])
        self._partial = None
        whole = len(pcm) - len(pcm) % FRAME_SAMPLES
        for i in range(0, whole, FRAME_SAMPLES):
            self._frames.append((response_id, item_id, pcm[i : i + FRAME_SAMPLES]))
        if whole < len(pcm):
            self._partial = (response_id, item_id, pcm[whole:])
        while len(self._frames) > MAX_QUEUED_FRAMES:
            self._frames.popleft()
        if self._frames and self._idle_waiter is not None and not self._idle_waiter.done():
            self._idle_waiter.set_result(None)

    def end(self, response_id: str, item_id: str) -> None:
        """All of this response's audio is queued: pad its tail to a frame; ``stopped`` once it has played."""
        if self._partial is not None and self._partial[1] == item_id:
            tail = self._partial[2]
            self._frames.append((response_id, item_id, np.concatenate([tail, self._silence[len(tail):]])))
            self._partial = None
        self._ending.add(response_id)

    def clear(self) -> str | None:
        """Barge-in: drop everything queued now; returns the response that was cut off, if any."""
        cut = self._playing or (self._frames[0][0] if self._frames else None) or (self._partial[0] if self._partial else None)
        self._frames.clear()
        self._partial = None
        self._ending.clear()
        self._playing = None
        return cut

    def heard(self) -> tuple[str, int] | None:
        """(item id, ms) of the item whose audio went out last."""
        if self.last_item is None:
            return None
        return self.last_item, self.played.get(self.last_item, 0) * 1000 // WIRE_RATE

    def queued_frames(self) -> int:
        return len(self._frames)

    async def recv(self):
        from aiortc.mediastreams import MediaStreamError

        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += FRAME_SAMPLES
            if not self._frames and self._ahead > 0:  # silence: slip back toward the RTP clock, 2 ms a frame
                repay = min(self._ahead, MAX_SILENCE_SLIP_S)
                self._start += repay
                self._ahead -= repay
            wait = self._start + self._pts / WIRE_RATE - loop.time()
            if wait > 0 and not self._frames:
                # idle (silence going out): an answer's first frame goes out when it arrives, not at the next
                # tick (up to 20 ms sooner); the receiver takes that frame early in its stride, and the silence
                # after the answer gives the time back
                self._idle_waiter = loop.create_future()
                timer = loop.call_later(wait, lambda f=self._idle_waiter: f.done() or f.set_result(None))
                try:
                    await self._idle_waiter
                finally:
                    timer.cancel()
                    self._idle_waiter = None
                if self._frames:
                    early = self._start + self._pts / WIRE_RATE - loop.time()
                    if early > 0:
                        self._start -= early
                        self._ahead += early
            elif wait > 0:
                await asyncio.sleep(wait)
            elif wait < -0.2:  # the loop stalled: restart the clock rather than burst to catch up
                self._start = loop.time() - self._pts / WIRE_RATE
                self._ahead = 0.0
        pcm = self._silence
        if self._frames:
            response_id, item_id, pcm = self._frames.popleft()
            if self._playing != response_id:
                self._playing = response_id
                self._on_started(response_id)
            self.played[item_id] = self.played.get(item_id, 0) + FRAME_SAMPLES
            self.last_item = item_id
        if self._playing is not None and not self._frames and self._playing in self._ending:
            self._ending.discard(self._playing)
            self._on_stopped(self._playing)
            self._playing = None
        return self._wire.packet(pcm, self._pts)


# ---- one call ----------------------------------------------------------------------------------------------
class Call:
    """One WebRTC call: the peer connection, the data channel, both audio directions, and its end."""

    def __init__(self, host: "TransportHost", runner: SessionRunner, registry: "CallRegistry") -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection

        self.id = new_id("rtc")
        self.host = host
        self.runner = runner
        self.session = runner.session
        self.registry = registry
        # No STUN/TURN: aiortc's default would reach stun.l.google.com. The answer carries host candidates.
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = PacedAudioTrack(self._audio_started, self._audio_stopped)
        self.channel: Any = None
        self.channel_open = asyncio.Event()
        self.ended = asyncio.Event()
        self.end_reason = ""
        self.last_media = time.monotonic()
        self._out_resampler: StreamResampler | None = None
        self._out_key: tuple[str, str] | None = None  # (item id, format) the resampler is streaming
        self._tasks: list[asyncio.Task] = []
        self._sidebands: set[asyncio.Queue] = set()  # server-side controllers (serve_sideband)
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
        await self.pc.setLocalDescription(await self.pc.createAnswer())  # gathers host candidates (no trickle)
        return self.pc.localDescription.sdp

    def start(self) -> None:
        self._main = asyncio.create_task(self._serve(), name=f"call-{self.id}")

    # ---- peer events -----------------------------------------------------------------------------------
    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state in ("failed", "closed"):
            self.finish(f"peer connection {state}")

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != DATA_CHANNEL or self.channel is not None:
            log.info("call %s: ignoring data channel %r", self.id, channel.label[:64])
            return
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self.finish("data channel closed"))
        if channel.readyState == "open":
            self.channel_open.set()
        else:
            channel.on("open", self.channel_open.set)

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
                self.last_media = time.monotonic()
                pcm = frame.to_ndarray().astype(np.float32).reshape(-1, len(frame.layout.channels)).mean(axis=1) / 32768.0
                if fmt != self.session.config.input_format or resampler is None or resampler.sr_in != frame.sample_rate:
                    fmt = self.session.config.input_format
                    parsed = parse_audio_format(fmt)
                    resampler = StreamResampler(frame.sample_rate, format_rate(parsed), quality="QQ")
                out = resampler.process(pcm)
                if len(out):
                    audio = base64.b64encode(encode_float(out, parsed)).decode("ascii")
                    self.runner.feed_event({"type": "input_audio_buffer.append", "audio": audio})
        except MediaStreamError:
            self.finish("microphone track ended")

    # ---- outgoing events and audio ---------------------------------------------------------------------
    def _send(self, event: dict[str, Any]) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps(event))
        for queue in list(self._sidebands):
            if queue.full():  # a controller that stopped reading is dropped, the call goes on
                self._sidebands.discard(queue)
            else:
                queue.put_nowait(event)

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

    async def _serve(self) -> None:
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
        from starlette.websockets import WebSocketDisconnect

        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=MAX_SIDEBAND_EVENTS)
        self._sidebands.add(queue)

        async def send() -> None:
            while True:
                await ws.send_json(await queue.get())

        async def receive() -> None:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(msg.get("code", 1000))
                data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                if data is not None and not self.ended.is_set():
                    self.runner.feed_message(data)

        tasks = [asyncio.create_task(send()), asyncio.create_task(receive()), asyncio.create_task(self.ended.wait())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._sidebands.discard(queue)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                reason = "call ended" if self.ended.is_set() else ("sideband not reading" if queue.full() else "")
                await ws.close(code=1000 if not queue.full() else 1008, reason=reason)


class CallRegistry:
    """The server's live calls, by id (for hangup); creating one admits it as a session."""

    def __init__(self, host: "TransportHost") -> None:
        self.host = host
        self.calls: dict[str, Call] = {}

    async def create(self, offer_sdp: str, session_config: dict[str, Any] | None, model: str | None,
                     default_model: str) -> Call:
        """Answer an offer: a new session (its config applied like ``session.update``), counted as a session
        from the first moment so concurrent offers cannot exceed ``max_sessions``."""
        if not webrtc_available():
            raise CallError(501, "not_implemented", "WebRTC needs the 'webrtc' extra: pip install 'omni-rt[webrtc]'")
        check_offer(offer_sdp)
        host = self.host
        if model is None and session_config is not None and isinstance(session_config.get("model"), str):
            model = session_config["model"]
        options = SessionOptions(model_name=model[:64] if model else default_model,
                                 speculative_responses=host.settings.speculative_responses, voices=tuple(host.config.voices))
        config = {k: v for k, v in (session_config or {}).items() if k != "model"}
        try:
            session = RealtimeSession(options, host.session_limits(), session=config or None)
        except ProtocolError as exc:
            raise CallError(400, exc.code, exc.message, exc.param) from None
        runner = SessionRunner(host, session)
        call = Call(host, runner, self)
        host.sessions.add(runner)
        host.metrics.sessions.inc()
        try:
            await call.answer(offer_sdp)  # the answer SDP stays on call.pc.localDescription
        except BaseException:
            host.sessions.discard(runner)
            host.metrics.sessions.dec()
            with contextlib.suppress(Exception):
                await call.pc.close()
            raise
        self.calls[call.id] = call
        runner.open()
        call.start()
        log.info("call %s: session %s", call.id, session.id)
        return call

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
