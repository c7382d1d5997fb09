"""WebRTC media: the audio tracks of a call, both directions, and their Opus framing at 48 kHz.

Split from ``webrtc.py`` (the call and its registry) so each file holds one concept: here what goes on the wire
(``PacedAudioTrack`` pacing the answer, ``WireEncoder`` encoding it, ``ImmediateAudioBuffer`` decoding the microphone
on arrival); the offer is read in ``webrtc_offer.py``. aiortc is imported lazily, so this imports without it.
"""

from __future__ import annotations

import asyncio
import fractions
from collections import deque
from typing import Any, Callable

import numpy as np

from omni_rt.audio.pcm import float_to_int16

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
    otherwise waits for. The server's answer track and the bench's microphone (``omni_rt/testing/webrtc_client.py``)
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


MAX_QUEUED_FRAMES = 50 * 300  # 5 minutes of answer audio queued in the track
MAX_SILENCE_SLIP_S = 0.002  # per silent frame, while the send clock is ahead of the RTP clock


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


# ---- outgoing audio ----------------------------------------------------------------------------------------
def _track_base():
    from aiortc.mediastreams import MediaStreamTrack

    return MediaStreamTrack


class PacedAudioTrack(_track_base() if webrtc_available() else object):  # type: ignore[misc]
    """The answer's audio as an aiortc track: one 20 ms frame per 20 ms of RTP clock, silence when idle.

    aiortc's sender pulls ``recv()`` as fast as it returns, so the pacing lives here (as in aiortc's own
    ``AudioStreamTrack``). A frame counts as played when handed out; ``played_ms`` per item is what the
    listener heard (give or take their jitter buffer).

    ``pause(True)``: silence goes out and the queue waits (speech over the answer that may be a backchannel,
    ``omni_rt.stages.asr.interruption``); ``pause(False)`` goes on from the frame it stopped at, on the next 20 ms
    tick; ``clear`` (the barge-in) drops the queue and ends a pause.
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
        self.paused = False  # the queue waits, silence goes out

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

    def pause(self, paused: bool) -> None:
        """Hold the answer (silence goes out) or go on from where it was held."""
        self.paused = paused
        if not paused and self._frames and self._idle_waiter is not None and not self._idle_waiter.done():
            self._idle_waiter.set_result(None)

    def _ready(self) -> bool:
        """A frame of the answer is due to go out (queued and not held)."""
        return bool(self._frames) and not self.paused

    def clear(self) -> str | None:
        """Barge-in: drop everything queued now and end a pause; returns the response that was cut off, if any."""
        self.paused = False
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
            if not self._ready() and self._ahead > 0:  # silence: slip back toward the RTP clock, 2 ms a frame
                repay = min(self._ahead, MAX_SILENCE_SLIP_S)
                self._start += repay
                self._ahead -= repay
            wait = self._start + self._pts / WIRE_RATE - loop.time()
            if wait > 0 and not self._ready():
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
                if self._ready():
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
        if self._ready():
            response_id, item_id, pcm = self._frames.popleft()
            if self._playing != response_id:
                self._playing = response_id
                self._on_started(response_id)
            self.played[item_id] = self.played.get(item_id, 0) + FRAME_SAMPLES
            self.last_item = item_id
        if self._playing is not None and not self._frames and not self.paused and self._playing in self._ending:
            self._ending.discard(self._playing)
            self._on_stopped(self._playing)
            self._playing = None
        return self._wire.packet(pcm, self._pts)
