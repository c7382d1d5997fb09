"""The WebRTC transport end to end: an aiortc client written from OpenAI's WebRTC guide (omni_rt/testing/webrtc_client.py:
data channel ``oai-events``, a microphone track, the offer POSTed to /v1/realtime/calls) against the live CPU
server. Piper speaks the questions into the mic track; the answers come back on the Opus track.

Every event on the data channel is validated against openai-python's GA server event models.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from rt_helpers import heard, validate_event

pytest.importorskip("aiortc")
from omni_rt.testing.webrtc_client import RealtimeCall  # noqa: E402
from omni_rt.server.settings import ServerSettings  # noqa: E402
from omni_rt.transports.webrtc_ice import LOOPBACK, GatherError, IceConfig, restrict_gathering  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def speech(samples, name: str, tail_s: float = 1.5) -> tuple[np.ndarray, int]:
    audio, sr, _ = samples[name]
    return np.concatenate([audio, np.zeros(int(sr * tail_s), np.float32)]), sr


def validate_all(call: RealtimeCall) -> None:
    for event in call.events:
        validate_event({k: v for k, v in event.items() if k != "_t"})


async def wait_state(server, pred, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = await asyncio.to_thread(server.state)
        if pred(state) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.25)


async def test_spoken_turn_over_webrtc(live_server, speech_samples):
    call = RealtimeCall(live_server.http_url)
    resp = await call.connect()
    assert resp.status_code == 201, resp.text
    assert resp.headers["content-type"].startswith("application/sdp")
    assert resp.headers["location"] == f"/v1/realtime/calls/{call.call_id}" and call.call_id.startswith("rtc_")
    assert "opus/48000" in resp.text.lower()
    try:
        created = await call.next_event("session.created")
        assert created["session"]["type"] == "realtime"
        call.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})
        await call.next_event("session.updated")
        call.mic.say(*speech(speech_samples, "capital"))
        transcript = await call.next_event("conversation.item.input_audio_transcription.completed", 60)
        assert heard("france", transcript["transcript"]) or "capital" in transcript["transcript"].lower(), transcript
        got = await call.next_each(("output_audio_buffer.started", "response.done"), 60)
        started, done = got["output_audio_buffer.started"], got["response.done"]
        assert done["response"]["status"] == "completed", done
        assert started["response_id"] == done["response"]["id"]
        stopped = await call.next_event("output_audio_buffer.stopped", 30)
        assert stopped["response_id"] == done["response"]["id"]
        await asyncio.sleep(0.3)
        assert call.sound_seconds() > 0.5, "the answer was not heard on the audio track"
        types = {e["type"] for e in call.events}
        assert "response.output_audio.delta" not in types, "audio travels on the track, not the data channel"
        assert "error" not in types, [e for e in call.events if e["type"] == "error"]
        validate_all(call)
        assert await call.hangup() == 200
    finally:
        await call.close()
    state = await wait_state(live_server, lambda s: s["sessions"] == 0 and s["total"] == 0, 15)
    assert state["sessions"] == 0 and state["total"] == 0, state


CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ (\S+) \d+ (\S+) (\d+) typ (\S+)", re.M)


def candidates(sdp: str) -> list[tuple[str, str, int, str]]:
    """(transport, address, port, type) of every ``a=candidate:`` line."""
    return [(t.lower(), a, int(p), kind) for t, a, p, kind in CANDIDATE.findall(sdp)]


async def test_every_ice_candidate_is_on_the_loopback(live_server):
    """The server runs with ``--webrtc-host 127.0.0.1`` (conftest), the client gathers on 127.0.0.1 only: both SDPs
    offer 127.0.0.1 and nothing else, so no test call sends a packet to another address of this machine."""
    call = RealtimeCall(live_server.http_url)
    resp = await call.connect()
    try:
        assert resp.status_code == 201, resp.text
        offer, answer = call.pc.localDescription.sdp, resp.text
        for name, sdp in (("offer", offer), ("answer", answer)):
            found = candidates(sdp)
            assert found and len(found) == sdp.count("a=candidate:"), (name, sdp)
            assert {address for _, address, _, _ in found} == {"127.0.0.1"}, (name, found)
        await call.next_event("session.created")
    finally:
        await call.close()


async def connect_pair(offerer: IceConfig, answerer: IceConfig, timeout: float = 8.0) -> tuple[str, str, bool]:
    """Two in-process aiortc peers with a data channel: (offer SDP, answer SDP, whether the channel opened)."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    a, b = RTCPeerConnection(RTCConfiguration(iceServers=[])), RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        channel = a.createDataChannel("oai-events")
        opened = asyncio.Event()
        channel.on("open", opened.set)
        restrict_gathering(a, offerer)
        await a.setLocalDescription(await a.createOffer())
        await b.setRemoteDescription(a.localDescription)
        restrict_gathering(b, answerer)
        await b.setLocalDescription(await b.createAnswer())
        await a.setRemoteDescription(b.localDescription)
        try:
            await asyncio.wait_for(opened.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return a.localDescription.sdp, b.localDescription.sdp, opened.is_set()
    finally:
        await a.close()
        await b.close()


async def test_ice_port_range_and_advertised_address():
    low = free_udp_range(4)
    offer, answer, ok = await connect_pair(LOOPBACK, IceConfig(hosts=("127.0.0.1",), ports=(low, low + 3)))
    assert ok and [a for _, a, _, _ in candidates(offer)] == ["127.0.0.1"]
    assert [(a, low <= p <= low + 3) for _, a, p, _ in candidates(answer)] == [("127.0.0.1", True)], answer
    _, answer, ok = await connect_pair(LOOPBACK, IceConfig(hosts=("127.0.0.1",), advertise="203.0.113.7"))
    assert [a for _, a, _, _ in candidates(answer)] == ["203.0.113.7"], answer  # bound to 127.0.0.1, offered as the NAT's
    assert ok  # the server's own checks reach the client: it learns the real address as peer-reflexive
    with pytest.raises(GatherError):  # an address that is not this machine's: no candidate, a clear error
        await connect_pair(LOOPBACK, IceConfig(hosts=("192.0.2.250",)))


async def test_a_loopback_server_ignores_peers_on_other_addresses():
    """A browser pairs every local address with the server's 127.0.0.1 candidate and Linux delivers those packets:
    a server on ``--webrtc-host 127.0.0.1`` drops them, so only a loopback pair can connect."""
    from aioice.ice import get_host_addresses

    other = next((a for a in get_host_addresses(use_ipv4=True, use_ipv6=False)), None)
    if other is None:
        pytest.skip("this machine has no IPv4 address but the loopback")
    server = IceConfig(hosts=("127.0.0.1",), loopback_peers_only=True)
    assert IceConfig.from_settings(ServerSettings(webrtc_hosts=["127.0.0.1"])) == server
    assert (await connect_pair(LOOPBACK, server))[2]
    assert not (await connect_pair(IceConfig(hosts=(other,)), server, timeout=5.0))[2]


def free_udp_range(n: int) -> int:
    """The first of ``n`` consecutive UDP ports free on 127.0.0.1 now."""
    import socket

    for low in range(42000, 60000, n):
        socks = []
        try:
            for port in range(low, low + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return low
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free UDP port range")


def test_webrtc_settings_are_checked():
    ok = ServerSettings(webrtc_hosts=["127.0.0.1", "::1"], webrtc_advertise_address="203.0.113.7",
                        webrtc_port_min=40000, webrtc_port_max=40099)
    assert IceConfig.from_settings(ok) == IceConfig(("127.0.0.1", "::1"), "203.0.113.7", (40000, 40099), True)
    assert IceConfig.from_settings(ServerSettings()).default  # no setting: aioice gathers as it always did
    for bad in ({"webrtc_hosts": ["0.0.0.0"]}, {"webrtc_hosts": ["localhost"]}, {"webrtc_port_min": 40000},
                {"webrtc_port_min": 40100, "webrtc_port_max": 40000}, {"webrtc_advertise_address": "::"}):
        with pytest.raises(ValueError):
            ServerSettings(**bad)


@pytest.mark.parametrize("body", ["multipart", "json"])
async def test_session_config_in_the_offer(live_server, body):
    call = RealtimeCall(live_server.http_url)
    session = {"type": "realtime", "model": "gpt-realtime", "instructions": "Answer in five words.",
               "audio": {"output": {"voice": "marin"}}}
    resp = await call.connect(session=session, body=body)
    try:
        assert resp.status_code == 201, resp.text
        created = await call.next_event("session.created")
        assert created["session"]["instructions"] == "Answer in five words."
        assert created["session"]["model"] == "gpt-realtime"
        validate_all(call)
    finally:
        await call.close()


async def test_openai_sdk_calls_create_and_hangup(live_server):
    """openai-python's own ``realtime.calls.create`` (multipart sdp + session) and ``calls.hangup``, unchanged."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="unused", base_url=f"{live_server.http_url}/v1")
    call = RealtimeCall(live_server.http_url)

    call.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    call.dc = call.pc.createDataChannel("oai-events")
    call.dc.on("open", call.opened.set)
    call.dc.on("message", call._on_message)
    call.pc.addTrack(call.mic)
    restrict_gathering(call.pc, LOOPBACK)
    try:
        await call.pc.setLocalDescription(await call.pc.createOffer())
        raw = await client.realtime.calls.with_raw_response.create(
            sdp=call.pc.localDescription.sdp, session={"type": "realtime", "instructions": "SDK call."})
        assert raw.status_code == 201 and raw.headers["location"].startswith("/v1/realtime/calls/rtc_")
        await call.pc.setRemoteDescription(RTCSessionDescription(sdp=raw.content.decode(), type="answer"))
        await asyncio.wait_for(call.opened.wait(), 20)
        created = await call.next_event("session.created")
        assert created["session"]["instructions"] == "SDK call."
        await client.realtime.calls.hangup(raw.headers["location"].rsplit("/", 1)[-1])
        state = await wait_state(live_server, lambda s: s["sessions"] == 0, 15)
        assert state["sessions"] == 0, state
    finally:
        await call.close()
        await client.close()


async def test_bad_session_config_is_a_clear_400(live_server):
    call = RealtimeCall(live_server.http_url)
    resp = await call.connect(session={"type": "realtime", "audio": {"output": {"format": {"type": "audio/flac"}}}}, body="json")
    await call.close()
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] and err["param"].startswith("session.audio.output.format") and "flac" in err["message"], err


async def test_tool_call_over_the_data_channel(live_server):
    weather = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    call = RealtimeCall(live_server.http_url)
    assert (await call.connect(session={"type": "realtime", "tools": [weather],
                                        "tool_choice": {"type": "function", "name": "get_weather"}}, body="json")).status_code == 201
    try:
        call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                "content": [{"type": "input_text", "text": "Weather in Paris?"}]}})
        call.send({"type": "response.create"})
        done = await call.next_event("response.done", 90)
        fc = [o for o in done["response"]["output"] if o["type"] == "function_call"]
        assert done["response"]["status"] == "completed" and len(fc) == 1 and fc[0]["name"] == "get_weather", done
        assert isinstance(json.loads(fc[0]["arguments"]).get("city"), str)
        call.send({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": fc[0]["call_id"],
                                                                "output": json.dumps({"sky": "sunny", "celsius": 21})}})
        call.send({"type": "response.create", "response": {"tool_choice": "none"}})
        done = (await call.next_each(("response.done", "output_audio_buffer.stopped"), 90))["response.done"]
        assert done["response"]["status"] == "completed", done
        assert call.sound_seconds() > 0.3
        validate_all(call)
    finally:
        await call.close()


async def test_barge_in_clears_the_track_and_truncates_to_what_was_played(live_server, speech_samples):
    call = RealtimeCall(live_server.http_url)
    assert (await call.connect()).status_code == 201
    try:
        await call.next_event("session.created")
        call.mic.say(*speech(speech_samples, "long"))
        started = await call.next_event("output_audio_buffer.started", 90)
        await asyncio.sleep(1.0)  # let some of the answer play
        call.mic.say(*speech(speech_samples, "color"))
        await call.next_event("input_audio_buffer.speech_started", 30)
        cleared = await call.next_event("output_audio_buffer.cleared", 10)
        assert cleared["response_id"] == started["response_id"]
        truncated = await call.next_event("conversation.item.truncated", 10)
        # the answer may have been all generated (completed) before the user cut in; its sound is cut either way
        done = next((e for e in call.events if e["type"] == "response.done"), None) or await call.next_event("response.done", 10)
        assert done["response"]["id"] == started["response_id"] and done["response"]["status"] in ("cancelled", "completed"), done
        played_client = call.sound_seconds(since=started["_t"]) * 1000
        assert 300 <= truncated["audio_end_ms"], truncated
        # what the server says was played covers what the client heard (pauses between words are not "sound")
        assert played_client <= truncated["audio_end_ms"] + 400, (played_client, truncated)
        item = next(o for o in done["response"]["output"] if o["type"] == "message")
        assert item["id"] == truncated["item_id"]
        # the cut is immediate: nothing of the old answer sounds once the jitter buffer has drained
        await asyncio.sleep(1.2)
        nxt = [e["_t"] for e in call.events if e["type"] == "output_audio_buffer.started" and e["_t"] > cleared["_t"]]
        end = min([cleared["_t"] + 1.2, *nxt])
        late = sum(1 for t, rms in call.heard if cleared["_t"] + 0.3 <= t < end and rms > 0.01)
        assert late == 0, f"{late} frames of sound after the clear"
        validate_all(call)
    finally:
        await call.close()


async def test_junk_on_the_data_channel_gets_errors_and_the_call_lives(live_server):
    call = RealtimeCall(live_server.http_url)
    assert (await call.connect()).status_code == 201
    try:
        await call.next_event("session.created")
        call.send("this is not json")
        first = await call.next_event("error", 10)
        call.send({"type": "no.such.event"})
        second = await call.next_event("error", 10)
        call.send({"type": "input_audio_buffer.append", "audio": "***"})
        third = await call.next_event("error", 10)
        call.send("[" * 200_000)  # near SCTP's max-message-size (256 KiB): deep nesting, not parsed recursively
        fourth = await call.next_event("error", 10)
        codes = [e["error"]["code"] for e in (first, second, third, fourth)]
        assert all(codes), codes
        assert third["error"]["param"] == "audio"
        call.send({"type": "session.update", "session": {"type": "realtime", "instructions": "still here"}})
        updated = await call.next_event("session.updated", 10)
        assert updated["session"]["instructions"] == "still here"
        call.send({"type": "output_audio_buffer.clear"})  # nothing playing: nothing to clear, no error
        call.send({"type": "session.update", "session": {"type": "realtime"}})
        await call.next_event("session.updated", 10)
        assert len([e for e in call.events if e["type"] == "error"]) == 4
        validate_all(call)
    finally:
        await call.close()


def offer_without(kind: str) -> str:
    async def make() -> str:
        call = RealtimeCall("http://unused")
        from aiortc import RTCConfiguration, RTCPeerConnection

        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        if kind != "data":
            pc.createDataChannel("oai-events")
        if kind != "audio":
            pc.addTrack(call.mic)
        restrict_gathering(pc, LOOPBACK)
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return asyncio.run(make())


@pytest.mark.parametrize("case", ["no_audio", "no_data_channel", "not_sdp", "broken_sdp", "empty", "bad_json"])
def test_bad_offers_get_clear_400s(live_server, case):
    url = f"{live_server.http_url}/v1/realtime/calls"
    sdp_headers = {"Content-Type": "application/sdp"}
    if case == "no_audio":
        resp = httpx.post(url, content=offer_without("audio"), headers=sdp_headers)
        expect = "no audio"
    elif case == "no_data_channel":
        resp = httpx.post(url, content=offer_without("data"), headers=sdp_headers)
        expect = "no data channel"
    elif case == "not_sdp":
        resp = httpx.post(url, content="hello", headers=sdp_headers)
        expect = "not an SDP offer"
    elif case == "broken_sdp":  # looks like SDP, has the sections, lacks ICE credentials and a fingerprint
        sdp = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\n"
               "a=rtpmap:111 opus/48000/2\r\na=mid:0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:1\r\n")
        resp = httpx.post(url, content=sdp, headers=sdp_headers)
        expect = "could not be negotiated"
    elif case == "empty":
        resp = httpx.post(url, content="", headers=sdp_headers)
        expect = "needs an SDP offer"
    else:
        resp = httpx.post(url, content="{not json", headers={"Content-Type": "application/json"})
        expect = "not valid JSON"
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert expect in err["message"] and err["code"], err
    assert "Traceback" not in resp.text and "127.0.0.1" not in resp.text
    assert live_server.state()["sessions"] == 0


async def test_sideband_websocket_drives_the_same_session(live_server):
    import websockets

    call = RealtimeCall(live_server.http_url)
    assert (await call.connect()).status_code == 201
    try:
        await call.next_event("session.created")
        async with websockets.connect(f"{live_server.ws_url}/v1/realtime?call_id={call.call_id}", open_timeout=30) as side:
            await side.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "From the controller."}}))
            seen = json.loads(await asyncio.wait_for(side.recv(), 10))
            assert seen["type"] == "session.updated" and seen["session"]["instructions"] == "From the controller."
            updated = await call.next_event("session.updated", 10)  # the browser side sees it too
            assert updated["event_id"] == seen["event_id"]
            await side.send("junk")
            err = json.loads(await asyncio.wait_for(side.recv(), 10))
            assert err["type"] == "error"
            validate_event(seen)
            validate_event(err)
        async with websockets.connect(f"{live_server.ws_url}/v1/realtime?call_id=rtc_nope", open_timeout=30) as bad:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(bad.recv(), 10)
            assert closed.value.rcvd.code == 1008
        assert await call.hangup() == 200
    finally:
        await call.close()


def test_hangup_of_an_unknown_call_is_404(live_server):
    resp = httpx.post(f"{live_server.http_url}/v1/realtime/calls/rtc_nope/hangup")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "call_not_found"


VANISHING_PEER = """
import asyncio, sys
from omni_rt.testing.webrtc_client import RealtimeCall
async def main():
    call = RealtimeCall(sys.argv[1])
    resp = await call.connect()
    assert resp.status_code == 201, resp.text
    await call.next_event("session.created")
    print(call.call_id, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


async def test_a_peer_that_vanishes_is_freed_and_others_are_unaffected(live_server, speech_samples):
    proc = subprocess.Popen([sys.executable, "-c", VANISHING_PEER, live_server.http_url], cwd=ROOT, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    bystander = RealtimeCall(live_server.http_url)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line.startswith("rtc_"), line
        assert (await bystander.connect()).status_code == 201
        state = await wait_state(live_server, lambda s: s["sessions"] == 2, 10)
        assert state["sessions"] == 2, state
        os.kill(proc.pid, signal.SIGKILL)  # no hangup, no DTLS close: the peer is simply gone
        proc.wait(10)
        t0 = time.monotonic()
        state = await wait_state(live_server, lambda s: s["sessions"] == 1, 60)  # --webrtc-media-timeout-s 15 by default
        assert state["sessions"] == 1, state
        print(f"\nvanished peer freed after {time.monotonic() - t0:.1f} s")
        bystander.mic.say(*speech(speech_samples, "capital"))  # the other call still talks
        done = await bystander.next_event("response.done", 90)
        assert done["response"]["status"] == "completed"
    finally:
        if proc.poll() is None:
            proc.kill()
        await bystander.close()
    state = await wait_state(live_server, lambda s: s["sessions"] == 0 and s["total"] == 0, 20)
    assert state["sessions"] == 0 and state["total"] == 0, state


async def test_calls_count_against_max_sessions(live_server):
    await wait_state(live_server, lambda s: s["sessions"] == 0, 20)
    calls = [RealtimeCall(live_server.http_url) for _ in range(8)]  # live_server runs with --max-sessions 8
    try:
        for c in calls:
            assert (await c.connect()).status_code == 201
        extra = RealtimeCall(live_server.http_url)
        resp = await extra.connect()
        await extra.close()
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "server_full", resp.text
        assert "8 sessions" in resp.json()["error"]["message"]
    finally:
        for c in calls:
            if c.call_id:
                await c.hangup()
            await c.close()
    state = await wait_state(live_server, lambda s: s["sessions"] == 0 and s["total"] == 0, 20)
    assert state["sessions"] == 0 and state["total"] == 0, state
