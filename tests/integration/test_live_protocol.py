"""GPT-Live (``/v1/live/sessions``) over a raw WebSocket against the live CPU server: strict ``session.start``,
``session.started``, a spoken question heard and answered on the continuous output stream, mute, the context
appends and their acks, close / closed / usage with close 1000, and bad input (bad JSON, unknown events, an
oversized append: an ``error`` each, the session lives). Every server event is validated against
openai-python's Live ``ConnectServerEvent`` models.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any

import numpy as np
import pytest
import websockets
from pydantic import TypeAdapter
from rt_helpers import heard, pcm_chunks_b64, speech_with_silence

_ADAPTER: TypeAdapter | None = None


def validate_live(event: dict[str, Any]) -> None:
    global _ADAPTER
    if _ADAPTER is None:
        from openai.types.live.connect_server_event import ConnectServerEvent

        _ADAPTER = TypeAdapter(ConnectServerEvent)
    _ADAPTER.validate_python(event)


class Live:
    """A raw Live client: a reader task keeps every server event (validated) with its arrival time."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._new = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            event = json.loads(raw)
            validate_live(event)
            self.events.append((time.perf_counter(), event))
            self._new.set()

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    def of(self, etype: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e["type"] == etype]

    async def wait_for(self, etype: str, pred=lambda e: True, timeout: float = 30.0, after: int = 0) -> dict[str, Any]:
        deadline = time.perf_counter() + timeout
        while True:
            for _, e in self.events[after:]:
                if e["type"] == etype and pred(e):
                    return e
            left = deadline - time.perf_counter()
            if left <= 0 or self.reader.done():
                raise AssertionError(f"no {etype} within {timeout} s; got {[e['type'] for _, e in self.events[-20:]]}")
            self._new.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._new.wait(), timeout=min(left, 0.5))


async def open_live(server, session: dict[str, Any] | None = None) -> tuple[Any, Live]:
    ws = await websockets.connect(f"{server.ws_url}/v1/live/sessions", max_size=None, open_timeout=60)
    live = Live(ws)
    await live.send({"type": "session.start", "event_id": "start_1", "session": session or {"model": "gpt-live-1"}})
    started = await live.wait_for("session.started")
    assert started["client_event_id"] == "start_1"
    return ws, live


async def stream_audio(live: Live, chunks: list[str], speed: float = 1.0) -> None:
    for chunk in chunks:
        await live.send({"type": "session.input_audio.append", "audio": chunk})
        await asyncio.sleep(0.04 / speed)


def pcm_of(live: Live, after: int = 0) -> np.ndarray:
    data = b"".join(base64.b64decode(e["delta"]) for _, e in live.events[after:] if e["type"] == "session.output_audio.delta")
    return np.frombuffer(data, dtype=np.int16)


SILENCE_40MS = base64.b64encode(b"\x00" * 1920).decode()


async def test_strict_start_and_resolved_session(live_server):
    ws = await websockets.connect(f"{live_server.ws_url}/v1/live/sessions", open_timeout=60)
    live = Live(ws)
    try:
        # nothing before session.start; an unknown field refuses the start and names it
        await live.send({"type": "session.input_audio.append", "audio": SILENCE_40MS})
        err = await live.wait_for("error")
        assert err["error"]["code"] == "session_not_started"
        await live.send({"type": "session.start", "event_id": "s0", "session": {"model": "gpt-live-1", "voice": "marin"}})
        err = await live.wait_for("error", lambda e: e.get("client_event_id") == "s0")
        assert err["error"]["code"] == "unknown_parameter" and err["error"]["param"] == "session.voice"
        for bad, param in (({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}}, "session.audio.format.rate"),
                           ({"model": "gpt-live-1", "audio": {"output": {"voice": "nova2"}}}, "session.audio.output.voice"),
                           ({"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {"model": "x"}}}, "session.delegation.type"),
                           ({"model": "gpt-live-1", "input": [{"role": "system", "content": [{"text": "x"}]}]}, "session.input[0].role"),
                           ({"instructions": "hi"}, "session.model")):
            await live.send({"type": "session.start", "event_id": param, "session": bad})
            err = await live.wait_for("error", lambda e, p=param: e.get("client_event_id") == p)
            assert err["error"]["param"] == param, err
        assert not live.of("session.started") and not live.of("session.output_audio.delta")  # nothing started
        session = {"model": "gpt-live-1", "instructions": "You are a friendly voice.",
                   "audio": {"format": {"type": "audio/pcm", "rate": 16000}, "output": {"voice": "cedar"}},
                   "delegation": {"type": "client"},
                   "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                             {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]}]}
        await live.send({"type": "session.start", "event_id": "s1", "session": session})
        started = (await live.wait_for("session.started"))["session"]
        assert started["id"].startswith("live_") and started["status"] == "active"
        assert 7100 <= started["expires_at"] - time.time() <= 7300  # two hours
        assert started["model"] == "gpt-live-1" and started["instructions"] == "You are a friendly voice."
        assert started["audio"] == {"format": {"type": "audio/pcm", "rate": 16000}, "output": {"voice": "cedar"}}
        assert started["delegation"] == {"type": "client"} and len(started["input"]) == 2
        await live.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        assert (await live.wait_for("error", lambda e: e["error"]["code"] == "session_already_started"))
        # session.update: delegation only
        await live.send({"type": "session.update", "event_id": "u1", "session": {"instructions": "x"}})
        err = await live.wait_for("error", lambda e: e.get("client_event_id") == "u1")
        assert err["error"]["param"] == "session.instructions"
        await live.send({"type": "session.update", "event_id": "u2", "session": {"delegation": {"type": "client"}}})
        updated = await live.wait_for("session.updated")
        assert updated["client_event_id"] == "u2" and updated["session"]["id"] == started["id"]
        # the output stream runs in real time at 16 kHz, zeros while nobody speaks
        t0 = time.perf_counter()
        await asyncio.sleep(1.0)
        pcm = pcm_of(live)
        elapsed = time.perf_counter() - t0
        assert len(pcm) >= 16000 * 0.8 and not pcm.any()
        assert len(pcm) <= 16000 * (elapsed + 1.0)
    finally:
        await ws.close()


async def test_spoken_question_answered_on_one_stream(live_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    speech = pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)
    ws, live = await open_live(live_server, {"model": "gpt-live-1", "audio": {"output": {"voice": "marin"}}})
    try:
        await live.send({"type": "session.instructions.append", "event_id": "i1", "content": "Be brief.", "delegation_id": None})
        ack = await live.wait_for("session.instructions.appended")
        assert ack["client_event_id"] == "i1" and 0 <= ack["start_ms"] <= ack["end_ms"]
        mark = len(live.events)
        sender = asyncio.create_task(stream_audio(live, speech + [SILENCE_40MS] * 200))  # then silence, as clients do
        try:
            await live.wait_for("session.output_transcript.delta", timeout=60, after=mark)
            await asyncio.sleep(2.0)
        finally:
            sender.cancel()
        heard_text = "".join(e["delta"] for e in live.of("session.input_transcript.delta"))
        assert heard("france", heard_text) or "capital" in heard_text.lower(), heard_text
        for e in live.of("session.input_transcript.delta") + live.of("session.output_transcript.delta"):
            assert 0 <= e["start_ms"] <= e["end_ms"]
        said = "".join(e["delta"] for e in live.of("session.output_transcript.delta"))
        assert said.strip()
        pcm = pcm_of(live, mark)
        assert np.abs(pcm).max() > 1000  # the answer is in the stream
        # the user's words went out before the answer's
        t_in = min(t for t, e in live.events if e["type"] == "session.input_transcript.delta")
        t_out = min(t for t, e in live.events if e["type"] == "session.output_transcript.delta")
        assert t_in < t_out
        # one stream: deltas only, no Realtime response / speech events leak through
        assert not [e for _, e in live.events if e["type"].startswith(("response.", "input_audio_buffer.", "conversation."))]
    finally:
        await ws.close()


async def test_mute_commentary_close_closed_usage(live_server, speech_samples):
    ws, live = await open_live(live_server)
    try:
        await live.send({"type": "session.input_audio.mute", "event_id": "m1"})
        assert (await live.wait_for("session.input_audio.muted"))["client_event_id"] == "m1"
        audio, sr, _ = speech_samples["color"]
        speech = pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.2, tail_s=1.5), chunk_ms=40)
        await stream_audio(live, speech, speed=2.0)  # muted: the model hears silence
        await asyncio.sleep(1.5)
        assert not live.of("session.input_transcript.delta")
        await live.send({"type": "session.input_audio.unmute"})
        await live.wait_for("session.input_audio.unmuted")
        # commentary with no delegation is spoken now (a greeting)
        mark = len(live.events)
        await live.send({"type": "session.commentary.append", "event_id": "c1", "content": "Hello! How can I help you today?",
                         "delegation_id": None})
        ack = await live.wait_for("session.commentary.appended")
        assert ack["client_event_id"] == "c1"
        await live.wait_for("session.output_transcript.delta", timeout=60, after=mark)
        await live.send({"type": "session.thinking.append", "content": "The user likes short answers.", "delegation_id": None})
        await live.wait_for("session.thinking.appended")
        await live.send({"type": "session.commentary.append", "content": "x", "delegation_id": "del_nope"})
        err = await live.wait_for("error", lambda e: e["error"].get("param") == "delegation_id")
        assert "del_nope" in err["error"]["message"]
        await live.send({"type": "session.close", "event_id": "bye"})
        closed = await live.wait_for("session.closed", timeout=20)
        assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
        assert closed["usage"]["seconds"] > 2 and closed["session"]["status"] == "active"
        await asyncio.wait_for(live.reader, timeout=5)
        assert ws.close_code == 1000
    finally:
        await ws.close()
    state = live_server.wait_idle()
    assert state["total"] == 0 and state["sessions"] == 0


def loud_times(live: Live, after: int = 0) -> list[float]:
    return [t for t, e in live.events[after:] if e["type"] == "session.output_audio.delta"
            and np.abs(np.frombuffer(base64.b64decode(e["delta"]), np.int16)).max() > 1000]


async def test_barge_in_silences_the_stream_and_the_new_turn_is_answered(live_server, speech_samples):
    """The user talks over a long answer: the stream falls to zeros (our barge-in: the answer is cancelled and
    what was not played is dropped), and the words spoken over it are heard and answered."""
    long_audio, sr, _ = speech_samples["long"]
    color, sr2, _ = speech_samples["color"]
    ask = pcm_chunks_b64(speech_with_silence(long_audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)
    over = pcm_chunks_b64(speech_with_silence(color, sr2, lead_s=0.0, tail_s=0.2), chunk_ms=40)
    ws, live = await open_live(live_server)
    try:
        sender = asyncio.create_task(stream_audio(live, ask + [SILENCE_40MS] * 100))
        await live.wait_for("session.output_transcript.delta", timeout=60)
        await asyncio.sleep(0.6)  # the answer is playing
        sender.cancel()
        mark = len(live.events)
        t_talk = time.perf_counter()
        sender = asyncio.create_task(stream_audio(live, over + [SILENCE_40MS] * 150))
        try:
            await live.wait_for("session.input_transcript.delta", timeout=30, after=mark)
            await asyncio.sleep(1.0)
            loud = loud_times(live)
            print("loud deltas around the barge-in (s):", [round(t - t_talk, 2) for t in loud if t > t_talk - 1.0])
            assert [t for t in loud if t_talk - 0.5 < t <= t_talk]  # the answer was playing
            quiet_from = max([t for t in loud if t < time.perf_counter() - 0.5] or [t_talk])
            # the answer stopped: its last sound came soon after the user started (the speech has 0 s lead)
            print(f"barge-in: the voice's last sound {quiet_from - t_talk:.2f} s after the user started talking")
            assert quiet_from - t_talk < 2.0
            n = len(live.events)
            await live.wait_for("session.output_transcript.delta", timeout=60, after=n)  # the new turn's answer
        finally:
            sender.cancel()
        heard_text = "".join(e["delta"] for _, e in live.events[mark:] if e["type"] == "session.input_transcript.delta")
        assert heard("sky", heard_text) or "color" in heard_text.lower() or "clear" in heard_text.lower(), heard_text
    finally:
        await ws.close()


async def test_bad_input_gets_errors_and_session_lives(live_server):
    ws, live = await open_live(live_server)
    try:
        await live.send({"type": "session.output_audio.delta"})
        await ws.send("{not json")
        await live.send({"type": "session.input_audio.append", "event_id": "big",
                         "audio": base64.b64encode(b"\x00" * (1100 * 1024)).decode()})
        await live.send({"type": "session.input_audio.append", "event_id": "b64", "audio": "@@@"})
        await live.send({"type": "session.input_audio.append", "event_id": "odd", "audio": base64.b64encode(b"\x00" * 3).decode()})
        await live.send({"type": "response.create", "event_id": "rc"})
        await live.send({"type": "session.commentary.append", "event_id": "nodid", "content": "hi"})
        await live.send({"type": "session.thinking.append", "event_id": "long", "content": "x" * 5000, "delegation_id": None})
        await live.send({"type": "session.input_audio.mute", "event_id": "extra", "foo": 1})
        expect = {None: None, "big": "audio_too_large", "b64": "invalid_base64", "odd": "invalid_audio",
                  "rc": "invalid_request_error", "nodid": "missing_required_parameter", "long": "string_above_max_length",
                  "extra": "unknown_parameter"}
        deadline = time.perf_counter() + 10
        while len(live.of("error")) < len(expect) + 1 and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
        errors = live.of("error")
        codes = {e["error"].get("client_event_id"): e["error"]["code"] for e in errors}
        for eid, code in expect.items():
            if eid is not None:
                assert codes.get(eid) == code, (eid, codes)
        unknown = next(e for e in errors if e["error"]["code"] == "unknown_event")
        assert "session.commentary.append" in unknown["error"]["message"]  # names what is supported
        assert any(e["error"]["code"] == "invalid_json" for e in errors)
        # the session lives: the stream goes on and the next command is answered
        n = len(live.of("session.output_audio.delta"))
        await live.send({"type": "session.input_audio.mute", "event_id": "alive"})
        await live.wait_for("session.input_audio.muted")
        await asyncio.sleep(0.3)
        assert len(live.of("session.output_audio.delta")) > n
    finally:
        await ws.close()


async def test_sideband_attach_sees_and_drives_the_session(live_server):
    ws, live = await open_live(live_server)
    sid = live.of("session.started")[0]["session"]["id"]
    try:
        with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
            async with websockets.connect(f"{live_server.ws_url}/v1/live/sessions/live_nope/attach", open_timeout=30) as bad:
                await bad.recv()
        assert info.value.rcvd.code == 1008
        side_ws = await websockets.connect(f"{live_server.ws_url}/v1/live/sessions/{sid}/attach?graceful_close=true",
                                           max_size=None, open_timeout=30)
        side = Live(side_ws)
        await asyncio.sleep(0.3)
        await live.send({"type": "session.input_audio.mute", "event_id": "m"})
        assert (await side.wait_for("session.input_audio.muted"))["client_event_id"] == "m"  # it sees the session
        await side.send({"type": "session.input_audio.append", "event_id": "sa", "audio": SILENCE_40MS})
        err = await side.wait_for("error", lambda e: e.get("client_event_id") == "sa")
        assert err["error"]["code"] == "invalid_request_error"
        await side.send({"type": "session.commentary.append", "event_id": "sc", "content": "Welcome back!", "delegation_id": None})
        ack = await live.wait_for("session.commentary.appended")  # it drives it: the primary hears the greeting
        assert ack["client_event_id"] == "sc"
        await live.wait_for("session.output_transcript.delta", timeout=60)
        await live.send({"type": "session.close"})
        assert (await side.wait_for("session.closed", timeout=20))["reason"] == "close_requested"
        await asyncio.wait_for(side.reader, timeout=5)
        assert side_ws.close_code == 1000
    finally:
        await ws.close()


async def test_auth_like_realtime(keyed_server):
    with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
        async with websockets.connect(f"{keyed_server.ws_url}/v1/live/sessions", open_timeout=60) as ws:
            await ws.recv()
    assert info.value.rcvd.code == 1008
    async with websockets.connect(f"{keyed_server.ws_url}/v1/live/sessions", open_timeout=60,
                                  additional_headers={**keyed_server.auth_headers, "OpenAI-Alpha": "quicksilver=v3"}) as ws:
        await ws.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        assert json.loads(await ws.recv())["type"] == "session.started"
    assert keyed_server.wait_idle(timeout=30)["total"] == 0


async def test_client_delegation_preamble_then_result_spoken(delegating_server, speech_samples):
    """Every user turn delegated (``--live-delegation always``): the user's words, then the delegation; a short
    preamble is spoken at once; the backend's result, appended as commentary with the delegation id, is spoken."""
    audio, sr, _ = speech_samples["capital"]
    speech = pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)
    ws, live = await open_live(delegating_server, {"model": "gpt-live-1", "delegation": None})
    try:
        sender = asyncio.create_task(stream_audio(live, speech + [SILENCE_40MS] * 400))
        try:
            t_end = time.perf_counter() + len(speech) * 0.04 - 0.2  # about when the last word is sent
            created = await live.wait_for("session.delegation.created", timeout=60)
            t_created = next(t for t, e in live.events if e is created)
            deleg = created["delegation"]
            assert deleg["id"].startswith("del_") and deleg["type"] == "delegation" and deleg["target"] == "client"
            # the user's words went out first (a client builds the task from them)
            t_in = [t for t, e in live.events if e["type"] == "session.input_transcript.delta"]
            assert t_in and max(t_in) <= t_created
            asked = "".join(e["delta"] for e in live.of("session.input_transcript.delta"))
            assert heard("france", asked) or "capital" in asked.lower(), asked
            # the preamble is spoken while the backend works
            pre = await live.wait_for("session.output_transcript.delta", timeout=30)
            t_pre = next(t for t, e in live.events if e is pre)
            print(f"preamble transcript {t_pre - t_end:.2f} s after the last word")
            await asyncio.sleep(1.0)  # the backend "works"
            mark = len(live.events)
            await live.send({"type": "session.commentary.append", "event_id": "r1", "delegation_id": deleg["id"],
                             "content": "The capital of France is Paris."})
            ack = await live.wait_for("session.commentary.appended", after=mark)
            assert ack["client_event_id"] == "r1"
            await live.wait_for("session.output_transcript.delta", timeout=60, after=mark)
            await asyncio.sleep(3.0)
        finally:
            sender.cancel()
        said = "".join(e["delta"] for _, e in live.events[mark:] if e["type"] == "session.output_transcript.delta")
        print("answer after the result:", said)
        # a later result for the same delegation is still taken (a note, spoken)
        await live.send({"type": "session.thinking.append", "event_id": "r2", "delegation_id": deleg["id"],
                         "content": "Paris is also the largest city of France."})
        assert (await live.wait_for("session.thinking.appended", after=mark))["client_event_id"] == "r2"
        assert said.strip()
        assert np.abs(pcm_of(live, mark)).max() > 1000
        assert not live.of("error")
    finally:
        await ws.close()
