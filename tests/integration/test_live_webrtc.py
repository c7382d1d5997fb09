"""GPT-Live over WebRTC (``POST /v1/live/sessions``) end to end: the aiortc client of omni_rt/testing/webrtc_client.py
posts ``{session, transport: {type: "webrtc", sdp}}``, gets ``{session: {id}, transport}``, and then the data
channel speaks Live (validated against openai-python's Live server events) while the answer plays on the Opus
track; a bad session object is a 400 naming the field; ``session.close`` ends the call."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
from pydantic import TypeAdapter
from rt_helpers import heard

pytest.importorskip("aiortc")
from omni_rt.testing.webrtc_client import RealtimeCall  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def validate_all(call: RealtimeCall) -> None:
    from openai.types.live.connect_server_event import ConnectServerEvent

    adapter = TypeAdapter(ConnectServerEvent)
    for event in call.events:
        adapter.validate_python({k: v for k, v in event.items() if k != "_t"})


async def test_spoken_turn_over_live_webrtc(live_server, speech_samples):
    call = RealtimeCall(live_server.http_url)
    resp = await call.connect({"model": "gpt-live-1", "audio": {"output": {"voice": "marin"}}}, body="live")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["session"]["id"].startswith("live_") and body["transport"]["type"] == "webrtc"
    assert "opus/48000" in body["transport"]["sdp"].lower()
    try:
        started = await call.next_event("session.started")
        assert started["session"]["id"] == body["session"]["id"]
        call.send({"type": "session.start", "event_id": "again", "session": {"model": "gpt-live-1"}})
        err = await call.next_event("error")
        assert err["error"]["client_event_id"] == "again"
        audio, sr, _ = speech_samples["capital"]
        call.mic.say(np.concatenate([audio, np.zeros(int(sr * 1.5), np.float32)]), sr)
        await call.next_event("session.output_transcript.delta", 60)
        asked = "".join(e["delta"] for e in call.events if e["type"] == "session.input_transcript.delta")
        assert heard("france", asked) or "capital" in asked.lower(), asked
        await asyncio.sleep(1.5)
        assert call.sound_seconds() > 0.5, "the answer was not heard on the audio track"
        assert not [e for e in call.events if e["type"] == "session.output_audio.delta"], "audio rides the track"
        call.send({"type": "session.close", "event_id": "bye"})
        closed = await call.next_event("session.closed", 20)
        assert closed["reason"] == "close_requested" and closed["usage"]["seconds"] > 1
        assert not [e for e in call.events if e["type"] == "error" and e["error"].get("client_event_id") != "again"]
        validate_all(call)
    finally:
        await call.close()
    deadline = time.monotonic() + 15
    while (state := live_server.state())["sessions"] and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    assert state["sessions"] == 0


async def test_bad_live_offer_is_a_clear_400(live_server):
    url = f"{live_server.http_url}/v1/live/sessions"
    async with httpx.AsyncClient(timeout=10) as http:
        for body, param in (({"session": {"model": "gpt-live-1"}, "transport": {"type": "websocket", "sdp": "x"}}, "transport.type"),
                            ({"session": {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm"}}},
                              "transport": {"type": "webrtc", "sdp": "v=0"}}, "session.audio.format"),
                            ({"session": {"model": "gpt-live-1", "bogus": 1}, "transport": {"type": "webrtc", "sdp": "v=0"}}, "session.bogus"),
                            ({"session": {}, "transport": {"type": "webrtc", "sdp": "v=0"}}, "session.model")):
            resp = await http.post(url, json=body)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == param


async def test_sideband_attach_to_a_live_webrtc_call(live_server):
    import json

    import websockets

    call = RealtimeCall(live_server.http_url)
    resp = await call.connect({"model": "gpt-live-1"}, body="live")
    assert resp.status_code == 200, resp.text
    sid = resp.json()["session"]["id"]
    try:
        await call.next_event("session.started")
        async with websockets.connect(f"{live_server.ws_url}/v1/live/sessions/{sid}/attach", open_timeout=30) as side:
            await asyncio.sleep(0.3)
            await side.send(json.dumps({"type": "session.instructions.append", "event_id": "si", "content": "Be brief.",
                                        "delegation_id": None}))
            ack = await call.next_event("session.instructions.appended", 10)  # the browser's channel sees it
            assert ack["client_event_id"] == "si"
            seen = []
            while not seen or seen[-1]["type"] != "session.instructions.appended":
                seen.append(json.loads(await asyncio.wait_for(side.recv(), 10)))  # and so does the controller
            call.send({"type": "session.close"})
            while seen[-1]["type"] != "session.closed":
                seen.append(json.loads(await asyncio.wait_for(side.recv(), 20)))
    finally:
        await call.close()
