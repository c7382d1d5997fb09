"""A simulated Twilio Media Streams peer against `WS /v1/telephony/twilio` of a real `omni-rt serve` (CPU preset).

The peer behaves like Twilio: ``connected`` and ``start``, then a steady stream of 20 ms μ-law 8 kHz ``media``
frames (the caller's speech, silence in between), a playback buffer that plays the server's ``media`` (twice
real time) and echoes each ``mark`` once the audio before it has played, and honours ``clear`` by dropping what
is still buffered. The answer it plays is transcribed with faster-whisper to prove it is audible speech.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import websockets
from rt_helpers import ulaw_frames_b64

from omni_rt.audio.g711 import ulaw_decode
from omni_rt.audio.pcm import resample

STREAM_SID = "MZ0123456789abcdef0123456789abcdef"
CALL_SID = "CA0123456789abcdef0123456789abcdef"
FRAME_BYTES = 160  # 20 ms of μ-law at 8 kHz
SPEED = 2.0  # the simulated phone sends and plays audio at twice real time
SILENCE = base64.b64encode(b"\xff" * FRAME_BYTES).decode()  # μ-law zero


@dataclass
class FakeTwilio:
    ws: Any
    caller: list[str] = field(default_factory=list)  # speech frames still to send
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (arrival, message)
    buffer: bytearray = field(default_factory=bytearray)  # audio waiting to be played
    pending_marks: list[tuple[int, str]] = field(default_factory=list)  # (buffer offset, mark name)
    audio_by_item: dict[str, bytearray] = field(default_factory=dict)
    unmarked: bytearray = field(default_factory=bytearray)  # media not yet followed by its mark
    marks_echoed: list[str] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)
    seq: int = 0
    chunk: int = 0

    async def send(self, msg: dict[str, Any]) -> None:
        self.seq += 1
        await self.ws.send(json.dumps({"sequenceNumber": str(self.seq), **msg}))

    async def call(self) -> None:
        """The caller's side: one inbound frame per tick, speech when queued, else silence."""
        t0 = time.perf_counter()
        while True:
            payload = self.caller.pop(0) if self.caller else SILENCE
            self.chunk += 1
            await self.send({"event": "media", "streamSid": STREAM_SID, "media": {
                "track": "inbound", "chunk": str(self.chunk), "timestamp": str(self.chunk * 20), "payload": payload}})
            next_at = t0 + self.chunk * 0.020 / SPEED
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    async def listen(self) -> None:
        """The server's side: buffer media, queue marks behind it, drop everything on clear."""
        async for raw in self.ws:
            msg = json.loads(raw)
            self.received.append((time.perf_counter(), msg))
            assert msg.get("streamSid") == STREAM_SID, msg
            if msg["event"] == "media":
                audio = base64.b64decode(msg["media"]["payload"])
                assert 0 < len(audio) <= FRAME_BYTES, len(audio)
                self.buffer += audio
                self.unmarked += audio
            elif msg["event"] == "mark":
                name = msg["mark"]["name"]
                self.pending_marks.append((len(self.buffer), name))
                self.audio_by_item.setdefault(name.rpartition(":")[0], bytearray()).extend(self.unmarked)
                self.unmarked.clear()
            elif msg["event"] == "clear":
                self.clears.append(time.perf_counter())
                self.buffer.clear()
                self.pending_marks.clear()
            else:
                raise AssertionError(f"unexpected message from the server: {msg}")

    async def play(self) -> None:
        """Playback: consume the buffer in real time (times SPEED); echo each mark when reached."""
        step = int(FRAME_BYTES * SPEED)
        while True:
            await asyncio.sleep(0.020)
            played = min(step, len(self.buffer))
            del self.buffer[:played]
            self.pending_marks = [(off - played, name) for off, name in self.pending_marks]
            while self.pending_marks and self.pending_marks[0][0] <= 0:
                name = self.pending_marks.pop(0)[1]
                self.marks_echoed.append(name)
                await self.send({"event": "mark", "streamSid": STREAM_SID, "mark": {"name": name}})

    def items(self) -> list[str]:
        """Assistant item ids in the order their audio arrived."""
        return list(self.audio_by_item)

    def media_count(self) -> int:
        return sum(1 for _, m in self.received if m["event"] == "media")


async def wait_for(cond, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def answer_finished(server: Any, peer: FakeTwilio, quiet_s: float = 1.5) -> None:
    """No response in flight at the server, and no media for ``quiet_s``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = await asyncio.to_thread(server.state)
        last = peer.received[-1][0] if peer.received else 0.0
        if state["live"]["requests"] == 0 and time.perf_counter() - last > quiet_s:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the answer did not finish")


@pytest.fixture(scope="module")
def whisper():
    from omni_rt.backends.whisper import FasterWhisperASR

    return FasterWhisperASR()


async def test_twilio_call(live_server, speech_samples, whisper):
    frames = {name: ulaw_frames_b64(audio, sr) for name, (audio, sr, _) in speech_samples.items()}
    ws = await websockets.connect(f"{live_server.ws_url}/v1/telephony/twilio", max_size=None, open_timeout=60)
    peer = FakeTwilio(ws)
    tasks: list[asyncio.Task] = []
    try:
        async with asyncio.timeout(240):
            await peer.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
            await peer.send({"event": "start", "streamSid": STREAM_SID, "start": {
                "accountSid": "AC0123", "streamSid": STREAM_SID, "callSid": CALL_SID, "tracks": ["inbound"],
                "customParameters": {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}})
            await peer.send({"event": "dtmf", "streamSid": STREAM_SID, "dtmf": {"track": "inbound_track", "digit": "5"}})
            # what the bridge does not understand it skips; the call goes on
            await ws.send("not json")
            await peer.send({"event": "someday-new", "streamSid": STREAM_SID})
            await peer.send({"event": "media", "streamSid": STREAM_SID, "media": {"track": "outbound", "payload": SILENCE}})
            listener = asyncio.create_task(peer.listen())
            tasks = [listener, asyncio.create_task(peer.call()), asyncio.create_task(peer.play())]

            # 1. a question, then silence: an audible spoken answer comes back
            peer.caller.extend(frames["capital"])
            await wait_for(lambda: peer.media_count() > 0 or listener.done(), "the first answer's audio")
            await answer_finished(live_server, peer)
            assert not listener.done(), listener
            assert len(peer.items()) == 1, peer.items()
            first = peer.items()[0]
            answer = bytes(peer.audio_by_item[first])
            assert len(answer) > 8000 * 0.5, f"only {len(answer) / 8000:.2f} s of answer audio"
            text = whisper.transcribe(resample(ulaw_decode(answer), 8000, 16000))
            print(f"\nTwilio answer ({len(answer) / 8000:.2f} s of μ-law): {text!r}")
            assert len([w for w in text.split() if any(c.isalpha() for c in w)]) >= 2, text
            # every chunk was followed by a mark, and played marks were echoed in order
            await wait_for(lambda: any(m.startswith(first) for m in peer.marks_echoed), "a mark echoed")
            assert all(name.rpartition(":")[2].isdigit() for name in peer.marks_echoed)

            # 2. a question with a long answer; talking over it makes the server send `clear`
            peer.caller.extend(frames["long"])
            await wait_for(lambda: len(peer.items()) >= 2 and len(peer.audio_by_item[peer.items()[1]]) >= 8000,
                           "a second of the long answer", timeout=150)
            long_item = peer.items()[1]
            # (the server also sends a harmless `clear` at the start of every caller turn)
            clears_before = len(peer.clears)
            peer.caller.extend(frames["color"])
            await wait_for(lambda: len(peer.clears) > clears_before, "clear on barge-in", timeout=60)
            i_clear = [i for i, (_, m) in enumerate(peer.received) if m["event"] == "clear"][clears_before]
            # nothing more of the interrupted answer after the clear
            await wait_for(lambda: len(peer.items()) >= 3 or listener.done(), "the answer to the interruption", timeout=150)
            later = [m for _, m in peer.received[i_clear + 1:] if m["event"] == "mark"]
            assert later and not [m for m in later if m["mark"]["name"].startswith(long_item + ":")], later

            # 3. `stop` ends the call (mid-answer): the server closes, and frees everything
            for task in tasks[1:]:
                task.cancel()
            await peer.send({"event": "stop", "streamSid": STREAM_SID, "stop": {"accountSid": "AC0123", "callSid": CALL_SID}})
            await listener
            assert ws.close_code == 1000, (ws.close_code, ws.close_reason)
    finally:
        for task in tasks:
            task.cancel()
        await ws.close()
    state = live_server.wait_idle(timeout=30)
    assert state["total"] == 0 and state["sessions"] == 0, state


async def test_twilio_backchannel_holds_and_resumes_the_answer(live_server, speech_samples):
    """"Yeah." over a long answer: the bridge holds it (``clear``) while it is decided, then sends the rest of the
    answer again from the last mark the caller heard; no barge-in, the answer plays on."""
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    yeah = ulaw_frames_b64(tts.synthesize("Yeah."), tts.sample_rate)
    long_q = ulaw_frames_b64(*speech_samples["long"][:2])
    ws = await websockets.connect(f"{live_server.ws_url}/v1/telephony/twilio", max_size=None, open_timeout=60)
    peer = FakeTwilio(ws)
    tasks: list[asyncio.Task] = []
    try:
        async with asyncio.timeout(180):
            await peer.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
            await peer.send({"event": "start", "streamSid": STREAM_SID, "start": {
                "accountSid": "AC0123", "streamSid": STREAM_SID, "callSid": CALL_SID, "tracks": ["inbound"],
                "customParameters": {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}})
            listener = asyncio.create_task(peer.listen())
            tasks = [listener, asyncio.create_task(peer.call()), asyncio.create_task(peer.play())]
            peer.caller.extend(long_q)
            await wait_for(lambda: peer.items() and any(m.startswith(peer.items()[0] + ":") for m in peer.marks_echoed),
                           "the long answer playing", timeout=150)
            item = peer.items()[0]
            await asyncio.sleep(0.5)
            clears_before = len(peer.clears)
            peer.caller.extend(yeah)
            await wait_for(lambda: len(peer.clears) > clears_before, "the answer held (clear)", timeout=20)
            i_clear = [i for i, (_, m) in enumerate(peer.received) if m["event"] == "clear"][clears_before]
            heard_ms = max(int(m.rpartition(":")[2]) for m in peer.marks_echoed if m.startswith(item + ":"))
            await wait_for(lambda: any(m["event"] == "media" for _, m in peer.received[i_clear + 1:]), "the answer resumed", timeout=10)
            t_resume = next(t for t, m in peer.received[i_clear + 1:] if m["event"] == "media")
            resumed = [int(m["mark"]["name"].rpartition(":")[2]) for _, m in peer.received[i_clear + 1:]
                       if m["event"] == "mark" and m["mark"]["name"].startswith(item + ":")]
            await wait_for(lambda: len(peer.marks_echoed) > 0 and peer.marks_echoed[-1].startswith(item + ":")
                           and int(peer.marks_echoed[-1].rpartition(":")[2]) > heard_ms + 1000, "the answer playing on", timeout=30)
            print(f"\nheld at {heard_ms} ms of the answer, resumed {1000 * (t_resume - peer.received[i_clear][0]):.0f} ms "
                  f"after the clear; first resumed mark {resumed[:1]}")
            assert resumed and resumed[0] > heard_ms, (heard_ms, resumed[:3])
            assert len(peer.clears) == clears_before + 1, "a second clear: the backchannel barged in"
    finally:
        for task in tasks:
            task.cancel()
        await ws.close()
    state = live_server.wait_idle(timeout=30)
    assert state["total"] == 0 and state["sessions"] == 0, state
