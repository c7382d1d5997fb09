"""An aiortc client of OpenAI's Realtime WebRTC flow, written the way OpenAI's WebRTC guide writes a client:

    pc = RTCPeerConnection(); dc = pc.createDataChannel("oai-events"); pc.addTrack(microphone)
    offer -> POST {base}/v1/realtime/calls (Content-Type: application/sdp, Authorization: Bearer KEY)
    201 answer SDP -> setRemoteDescription; events as JSON on the data channel; the answer plays on the remote track

Used by the tests (tests/integration/test_webrtc.py) and the latency bench. Against a server on the loopback the client's ICE
binds 127.0.0.1 only (``omni_rt.transports.webrtc_ice.LOOPBACK``; such servers run with ``--webrtc-host
127.0.0.1``), so no packet of a test or bench call leaves the loopback. ``MicTrack`` plays given audio in real time
(then silence); the remote track is read frame by frame, with the arrival time of each frame, so a caller can
find the first sound of an answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from omni_rt.audio.pcm import float_to_int16, resample
from omni_rt.transports.webrtc_ice import LOOPBACK, IceConfig, restrict_gathering
from omni_rt.transports.webrtc_media import FRAME_SAMPLES, WIRE_RATE, WireEncoder

RATE = WIRE_RATE
FRAME = FRAME_SAMPLES  # 20 ms
SOUND_RMS = 0.01  # a received frame louder than this is sound (Opus codes silence as near-zero)
ONSET = RATE // 200  # 5 ms: the first sound is the first 5 ms window above SOUND_RMS (a 20 ms grid put Opus's
# 6.5 ms codec delay into the next frame more often than not, reading +20 ms for +6.5 ms)


def first_loud(x: np.ndarray, window: int) -> int | None:
    """Index of the first ``window``-sample window of ``x`` louder than ``SOUND_RMS``, or None."""
    n = len(x) // window
    if n == 0:
        return None
    rms = np.sqrt(np.mean(x[: n * window].reshape(n, window) ** 2, axis=1))
    loud = np.flatnonzero(rms > SOUND_RMS)
    return int(loud[0]) * window if len(loud) else None


def ice_for(base_url: str) -> IceConfig:
    """For a server on this machine's loopback (localhost, 127.0.0.1, ::1): ICE on that loopback address only;
    else aioice's gathering."""
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return LOOPBACK
    try:
        return IceConfig(hosts=(host,)) if ipaddress.ip_address(host).is_loopback else IceConfig()
    except ValueError:
        return IceConfig()


def _track_base():
    from aiortc.mediastreams import MediaStreamTrack

    return MediaStreamTrack


class MicTrack(_track_base()):  # type: ignore[misc]
    """A microphone that says what it is given, in real time, and is silent otherwise; its 20 ms Opus packets
    are encoded as the server's answer track encodes them (``WireEncoder``: the same Opus payloads, less CPU
    taken from the server sharing this machine)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pcm = np.zeros(0, np.int16)
        self._start: float | None = None
        self._pts = 0
        self._queued = 0  # samples ever queued
        self._sent = 0  # samples ever handed to the sender
        self._mark: int | None = None  # sample index whose sending sets speech_end
        self.speech_end: float | None = None  # time.perf_counter() when the marked sample went out
        self._wire = WireEncoder()

    def say(self, audio: np.ndarray, rate: int, speech_end: int | None = None) -> None:
        """Queue audio; ``speech_end`` (an index into ``audio``, default its end) marks its last speech sample:
        ``self.speech_end`` is set when the frame holding it goes out."""
        pcm = float_to_int16(resample(audio.astype(np.float32), rate, RATE))
        end = len(pcm) if speech_end is None else min(len(pcm), round(speech_end * RATE / rate))
        self._mark = self._queued + max(1, end)
        self._queued += len(pcm)
        self._pcm = np.concatenate([self._pcm, pcm])
        self.speech_end = None

    def seconds_left(self) -> float:
        return len(self._pcm) / RATE

    async def recv(self):
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        chunk, self._pcm = self._pcm[:FRAME], self._pcm[FRAME:]
        self._sent += len(chunk)
        if len(chunk) < FRAME:
            chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), np.int16)])
        if self._mark is not None and self._sent >= self._mark:
            self._mark = None
            self.speech_end = time.perf_counter()
        return self._wire.packet(chunk, self._pts)


class RealtimeCall:
    """One call to ``POST /v1/realtime/calls``: events in ``events`` (and a queue), heard audio in ``heard``."""

    def __init__(self, base_url: str, api_key: str | None = None, decode_on_arrival: bool = False) -> None:
        """``decode_on_arrival``: no playout buffer (the bench's transport latency); else aiortc's own (80 ms)."""
        self.base_url = base_url.rstrip("/")
        self.decode_on_arrival = decode_on_arrival
        self.api_key = api_key
        self.pc: Any = None
        self.dc: Any = None
        self.mic = MicTrack()
        self.call_id: str | None = None
        self.events: list[dict[str, Any]] = []
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.heard: list[tuple[float, float]] = []  # (perf_counter at arrival, frame RMS) per received frame
        self.onsets: list[float] = []  # per received frame with sound: when its first loud 5 ms starts to play
        self.samples: list[np.ndarray] = []  # received audio, 48 kHz mono float32
        self._reader: asyncio.Task | None = None
        self.opened = asyncio.Event()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def connect(self, session: dict[str, Any] | None = None, body: str = "sdp", audio: bool = True,
                      data_channel: bool = True, timeout: float = 20.0) -> httpx.Response:
        """Offer, post, answer. ``body``: 'sdp' (raw application/sdp), 'multipart' or 'json' (with ``session``), or
        'live' (GPT-Live's ``POST /v1/live/sessions``, 200 with JSON).
        Returns the HTTP response; on 201 the connection is being set up (``opened`` once the channel is)."""
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        if data_channel:
            self.dc = self.pc.createDataChannel("oai-events")
            self.dc.on("open", self.opened.set)
            self.dc.on("message", self._on_message)
        if audio:
            sender = self.pc.addTrack(self.mic)
            if self.decode_on_arrival:
                from omni_rt.transports.webrtc_media import decode_on_arrival

                decode_on_arrival(next(t.receiver for t in self.pc.getTransceivers() if t.sender is sender))
        self.pc.on("track", lambda track: setattr(self, "_reader", asyncio.create_task(self._read(track))))
        restrict_gathering(self.pc, ice_for(self.base_url))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        url = f"{self.base_url}/v1/realtime/calls"
        async with httpx.AsyncClient(timeout=timeout) as http:
            if body == "multipart":
                files = {"sdp": (None, sdp, "application/sdp")}
                if session is not None:
                    files["session"] = (None, json.dumps(session), "application/json")
                resp = await http.post(url, files=files, headers=self.headers)
            elif body == "live":  # GPT-Live: POST /v1/live/sessions {session, transport}, 200 {session, transport}
                resp = await http.post(f"{self.base_url}/v1/live/sessions", headers=self.headers,
                                       json={"session": session, "transport": {"type": "webrtc", "sdp": sdp}})
                if resp.status_code == 200:
                    answer = resp.json()
                    self.call_id = answer["session"]["id"]
                    await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["transport"]["sdp"], type="answer"))
                    await asyncio.wait_for(self.opened.wait(), timeout)
                return resp
            elif body == "json":
                resp = await http.post(url, json={"sdp": sdp, "session": session}, headers=self.headers)
            else:
                resp = await http.post(url, content=sdp, headers={**self.headers, "Content-Type": "application/sdp"})
        if resp.status_code == 201:
            self.call_id = resp.headers["location"].rsplit("/", 1)[-1]
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=resp.text, type="answer"))
            await asyncio.wait_for(self.opened.wait(), timeout)
        return resp

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        event["_t"] = time.perf_counter()
        self.events.append(event)
        self._queue.put_nowait(event)

    async def _read(self, track: Any) -> None:
        from aiortc.mediastreams import MediaStreamError

        with_channels = None
        try:
            while True:
                frame = await track.recv()
                with_channels = with_channels or len(frame.layout.channels)
                x = frame.to_ndarray().astype(np.float32).reshape(-1, with_channels).mean(axis=1) / 32768.0
                self.samples.append(x)
                t = time.perf_counter()
                self.heard.append((t, float(np.sqrt(np.mean(x * x))) if len(x) else 0.0))
                i = first_loud(x, ONSET)
                if i is not None:  # decoded on arrival: the frame starts to play now
                    self.onsets.append(t + i / RATE)
        except MediaStreamError:
            return

    def send(self, event: dict[str, Any] | str) -> None:
        self.dc.send(event if isinstance(event, str) else json.dumps(event))

    async def next_event(self, etype: str | tuple[str, ...], timeout: float = 30.0) -> dict[str, Any]:
        """The next event of this type (earlier events of other types are skipped but kept in ``events``)."""
        types = (etype,) if isinstance(etype, str) else etype
        deadline = time.monotonic() + timeout
        while True:
            event = await asyncio.wait_for(self._queue.get(), max(0.01, deadline - time.monotonic()))
            if event["type"] in types:
                return event

    async def next_each(self, types: tuple[str, ...], timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """The next event of each of these types, in whatever order they arrive: the data channel carries
        ``response.done`` as soon as the answer is generated, and ``output_audio_buffer.started`` when the
        track hands out its first frame, so a short answer on a busy server may finish before it starts playing."""
        deadline = time.monotonic() + timeout
        found: dict[str, dict[str, Any]] = {}
        while len(found) < len(types):
            event = await asyncio.wait_for(self._queue.get(), max(0.01, deadline - time.monotonic()))
            if event["type"] in types:
                found.setdefault(event["type"], event)
        return found

    def first_sound_after(self, t0: float) -> float | None:
        """perf_counter when the first loud 5 ms received at or after ``t0`` starts to play."""
        return next((t for t in self.onsets if t >= t0), None)

    def sound_seconds(self, since: float = 0.0) -> float:
        return sum(FRAME / RATE for t, rms in self.heard if t >= since and rms > SOUND_RMS)

    async def hangup(self) -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            resp = await http.post(f"{self.base_url}/v1/realtime/calls/{self.call_id}/hangup", headers=self.headers)
        return resp.status_code

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.pc is not None:
            await self.pc.close()
