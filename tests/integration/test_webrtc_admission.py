"""WebRTC signalling cannot starve the server (issue #51): offers that never connect wait in a bounded pool of
pending calls, capped per client address and freed by the connect deadline, and hold no session.

Against a real server on 127.0.0.1 with ``--max-sessions 2``: a burst of 50 real aiortc offers whose peers are
closed before they could answer (ICE never completes) is answered 201 up to the per-client cap and 429 beyond;
meanwhile a WebSocket client connects and gets a real answer; the pool empties by the deadline; an honest WebRTC
call then connects and answers; and a call that connects when the sessions are full is told so and closed.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
import websockets
from rt_helpers import validate_event
from servers import start_server, stop_server

pytest.importorskip("aiortc")
from omni_rt.testing.webrtc_client import MicTrack, RealtimeCall, ice_for  # noqa: E402
from omni_rt.transports.webrtc_ice import restrict_gathering  # noqa: E402

pytestmark = pytest.mark.timeout(300)

CONNECT_TIMEOUT_S = 4.0
PER_CLIENT = 40
BURST = 50


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("webrtc-admission"), "--max-sessions", "2",
                          "--webrtc-connect-timeout-s", str(CONNECT_TIMEOUT_S),
                          "--webrtc-max-pending-calls", "64", "--webrtc-max-pending-per-client", str(PER_CLIENT))
    yield server
    stop_server(server)


async def state(server) -> dict:
    return await asyncio.to_thread(server.state)


async def wait_state(server, pred, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    current = await state(server)
    while not pred(current) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        current = await state(server)
    return current


async def dead_offer(base_url: str) -> str:
    """A real offer (data channel, microphone, loopback candidates) from a peer closed before any answer."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    pc.addTrack(MicTrack())
    restrict_gathering(pc, ice_for(base_url))
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def text_turn(ws_url: str) -> dict:
    """One real WebSocket turn: session.created, a text item and response.create, the answer's response.done."""
    async with websockets.connect(f"{ws_url}/v1/realtime", max_size=None, open_timeout=30) as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert created["type"] == "session.created", created
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 16}}))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            event = json.loads(await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic())))
            validate_event(event)
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                return event
        raise AssertionError("no response.done within 120 s")


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def test_never_connected_offers_do_not_starve_sessions(server):
    offers = [await dead_offer(server.http_url) for _ in range(BURST)]
    url = f"{server.http_url}/v1/realtime/calls"
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=BURST)) as http:
        t0 = time.monotonic()
        replies = await asyncio.gather(*(http.post(url, content=sdp, headers={"Content-Type": "application/sdp"})
                                         for sdp in offers))
        burst_s = time.monotonic() - t0
    statuses = [r.status_code for r in replies]
    assert set(statuses) <= {201, 429} and statuses.count(201) + statuses.count(429) == BURST, statuses
    assert statuses.count(429) >= BURST - PER_CLIENT, (statuses, burst_s)  # the per-client cap, while they pend
    refused = next(r for r in replies if r.status_code == 429)
    err = refused.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and f"at most {PER_CLIENT}" in err["message"], err
    assert refused.headers["retry-after"] == str(int(CONNECT_TIMEOUT_S))
    assert all(r.headers["content-type"].startswith("application/sdp") for r in replies if r.status_code == 201)

    during = await state(server)
    assert during["sessions"] == 0, during  # pending calls hold no session slot
    assert during["webrtc"]["pending"] > 0 or burst_s > CONNECT_TIMEOUT_S, (during, burst_s)

    done = await text_turn(server.ws_url)  # --max-sessions 2, with up to 40 calls pending
    assert done["response"]["status"] == "completed", done

    after = await wait_state(server, lambda s: s["webrtc"]["pending"] == 0 and s["webrtc"]["calls"] == 0,
                             CONNECT_TIMEOUT_S + 20)
    assert after["webrtc"] == {"pending": 0, "calls": 0}, after
    metrics = (await asyncio.to_thread(httpx.get, f"{server.http_url}/metrics", timeout=10)).text
    assert metric(metrics, "omni_rt_webrtc_pending_calls") == 0.0
    assert metric(metrics, "omni_rt_connections_total", '{outcome="not_connected",surface="webrtc"}') >= 1
    assert metric(metrics, "omni_rt_connections_total", '{outcome="refused_pending",surface="webrtc"}') >= BURST - PER_CLIENT

    # an honest call afterwards connects and answers as before
    call = RealtimeCall(server.http_url)
    try:
        resp = await call.connect()
        assert resp.status_code == 201, resp.text
        await call.next_event("session.created")
        call.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                "content": [{"type": "input_text", "text": "Say hi."}]}})
        call.send({"type": "response.create", "response": {"max_output_tokens": 16}})
        done = await call.next_event("response.done", 120)
        assert done["response"]["status"] == "completed", done
        assert (await state(server))["sessions"] == 1
        assert await call.hangup() == 200
    finally:
        await call.close()
    final = await wait_state(server, lambda s: s["sessions"] == 0 and s["webrtc"]["calls"] == 0, 20)
    assert final["sessions"] == 0 and final["webrtc"] == {"pending": 0, "calls": 0}, final


async def test_a_call_that_connects_when_the_server_is_full_is_told_and_closed(server):
    await wait_state(server, lambda s: s["sessions"] == 0, 20)
    call = RealtimeCall(server.http_url)
    holders = []
    try:
        # the offer is answered while there is room, then the sessions fill before the peer connects
        from aiortc import RTCSessionDescription

        from aiortc import RTCConfiguration, RTCPeerConnection

        call.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        call.dc = call.pc.createDataChannel("oai-events")
        call.dc.on("open", call.opened.set)
        call.dc.on("message", call._on_message)
        call.pc.addTrack(call.mic)
        restrict_gathering(call.pc, ice_for(server.http_url))
        await call.pc.setLocalDescription(await call.pc.createOffer())
        async with httpx.AsyncClient(timeout=30) as http:
            resp = await http.post(f"{server.http_url}/v1/realtime/calls", content=call.pc.localDescription.sdp,
                                   headers={"Content-Type": "application/sdp"})
        assert resp.status_code == 201, resp.text
        for _ in range(2):
            ws = await websockets.connect(f"{server.ws_url}/v1/realtime", open_timeout=30)
            holders.append(ws)
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.created"
        await call.pc.setRemoteDescription(RTCSessionDescription(sdp=resp.text, type="answer"))
        error = await call.next_event("error", 20)
        assert error["error"]["code"] == "server_full" and "2 sessions" in error["error"]["message"], error
        after = await wait_state(server, lambda s: s["webrtc"]["calls"] == 0, 15)
        assert after["sessions"] == 2 and after["webrtc"] == {"pending": 0, "calls": 0}, after
        assert not any(e["type"] == "session.created" for e in call.events), call.events
    finally:
        await call.close()
        for ws in holders:
            await ws.close()
