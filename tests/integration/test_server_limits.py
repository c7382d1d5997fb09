"""Limits and faults of the realtime server: auth (1008), a full server (1013), a configured message-size
limit (1009), and hundreds of aborted answers / vanished clients that must leave no per-request state behind.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx
import pytest
import websockets
from servers import KEYED_API_KEY, KEYED_MAX_MESSAGE_BYTES
from rt_helpers import validate_event

KEY, MAX_MESSAGE_BYTES = KEYED_API_KEY, KEYED_MAX_MESSAGE_BYTES  # conftest's keyed_server


def ws_connect(url: str, **kw: Any):
    return websockets.connect(url, max_size=None, open_timeout=60, close_timeout=10, **kw)


async def expect_session(ws: Any) -> dict[str, Any]:
    event = json.loads(await ws.recv())
    validate_event(event)
    assert event["type"] == "session.created", event
    return event


async def expect_close(ws: Any, code: int) -> str:
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await ws.recv()
    rcvd = closed.value.rcvd
    assert rcvd is not None and rcvd.code == code, closed.value
    return rcvd.reason


async def connect_retrying_full(url: str, **kw: Any):
    """Connect; while the server still counts a just-closed session (1013), retry for a while."""
    deadline = time.monotonic() + 30
    while True:
        ws = await ws_connect(url, **kw)
        try:
            await expect_session(ws)
            return ws
        except websockets.ConnectionClosed as exc:
            if exc.rcvd is None or exc.rcvd.code != 1013 or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


BEARER = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}


async def test_auth(keyed_server):
    url = f"{keyed_server.ws_url}/v1/realtime"
    async with asyncio.timeout(60):
        async with ws_connect(url) as ws:
            reason = await expect_close(ws, 1008)
            assert "key" in reason.lower(), reason
        async with ws_connect(url, additional_headers={"Authorization": "Bearer wrong"}) as ws:
            await expect_close(ws, 1008)
        async with ws_connect(f"{url}?token=wrong") as ws:
            await expect_close(ws, 1008)
        async with ws_connect(f"{keyed_server.ws_url}/v1/telephony/twilio") as ws:
            await expect_close(ws, 1008)
        async with ws_connect(url, **BEARER) as ws:
            await expect_session(ws)
        async with ws_connect(f"{url}?token={KEY}&model=gpt-realtime") as ws:
            await expect_session(ws)
    refused = await asyncio.to_thread(httpx.get, f"{keyed_server.http_url}/metrics", timeout=10)
    assert refused.status_code == 401, refused.text  # metrics are behind the key when one is set
    metrics = (await asyncio.to_thread(httpx.get, f"{keyed_server.http_url}/metrics", headers=keyed_server.auth_headers,
                                       timeout=10)).text
    assert 'omni_rt_connections_total{outcome="refused_auth",surface="realtime"} 3.0' in metrics, metrics


async def test_full_server_closes_1013_then_admits_again(keyed_server):
    url = f"{keyed_server.ws_url}/v1/realtime"
    async with asyncio.timeout(90):
        first = await connect_retrying_full(url, **BEARER)
        second = await connect_retrying_full(f"{url}?token={KEY}")
        async with ws_connect(url, **BEARER) as third:
            reason = await expect_close(third, 1013)
            assert "full" in reason.lower(), reason
        # the two admitted sessions still work
        for ws in (first, second):
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "hi"}}))
            event = json.loads(await ws.recv())
            validate_event(event)
            assert event["type"] == "session.updated", event
        await first.close()
        again = await connect_retrying_full(url, **BEARER)
        await again.close()
        await second.close()
    assert keyed_server.wait_idle(timeout=30)["total"] == 0


async def test_configured_message_limit_closes_1009(keyed_server):
    url = f"{keyed_server.ws_url}/v1/realtime"
    async with asyncio.timeout(60):
        ws = await connect_retrying_full(url, **BEARER)
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (MAX_MESSAGE_BYTES + 1024)}))
        await expect_close(ws, 1009)
        # just under the limit is an ordinary message
        ws = await connect_retrying_full(url, **BEARER)
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * (MAX_MESSAGE_BYTES // 8)}))
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "hi"}}))
        event = json.loads(await ws.recv())
        assert event["type"] == "session.updated", event
        await ws.close()
    assert keyed_server.wait_idle(timeout=30)["total"] == 0


# ---- churn: aborted answers and vanished clients ---------------------------------------------------------

ASKS = ["What is the capital of France?", "Name a color.", "Tell me a long story about a dragon.", "Count to ten."]


async def recv_until(ws: Any, etype: str) -> dict[str, Any]:
    while True:
        event = json.loads(await ws.recv())
        validate_event(event)
        if event["type"] == etype:
            return event
        assert event["type"] != "error", event


async def one_abort(url: str, mode: str, ask: str) -> str:
    """One short-lived client that never lets its answer finish; returns how it ended."""
    ws = await connect_retrying_full(url)
    audio = mode == "drop_audio"
    session = {"type": "realtime", "output_modalities": ["audio" if audio else "text"], "instructions": "Be brief."}
    await ws.send(json.dumps({"type": "session.update", "session": session}))
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]}}))
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 48}}))
    if mode == "drop_at_once":  # the client vanishes right after asking
        ws.transport.abort()
        return mode
    created = await recv_until(ws, "response.created")
    if mode == "cancel":
        await ws.send(json.dumps({"type": "response.cancel", "response_id": created["response"]["id"]}))
        done = await recv_until(ws, "response.done")
        assert done["response"]["status"] in ("cancelled", "completed"), done
        await ws.close()
        return f"cancel:{done['response']['status']}"
    await recv_until(ws, "response.output_audio.delta" if audio else "response.output_text.delta")
    if mode == "cancel_and_leave":  # cancel mid-answer and close without waiting for response.done
        await ws.send(json.dumps({"type": "response.cancel"}))
        await ws.close()
    elif mode == "close_mid_answer":
        await ws.close()
    else:  # drop_mid_answer, drop_audio: the socket dies abruptly mid-answer, no close frame
        ws.transport.abort()
    return mode


async def test_200_aborted_answers_leave_no_state(live_server):
    url = f"{live_server.ws_url}/v1/realtime"
    modes = ["cancel", "drop_mid_answer", "drop_at_once", "cancel_and_leave", "close_mid_answer"]
    rng = random.Random(5)
    plan = [("drop_audio" if i % 20 == 7 else modes[i % len(modes)], rng.choice(ASKS)) for i in range(200)]
    outcomes: dict[str, int] = {}
    t0 = time.perf_counter()

    async def worker(jobs: list[tuple[str, str]]) -> None:
        for mode, ask in jobs:
            how = await one_abort(url, mode, ask)
            outcomes[how] = outcomes.get(how, 0) + 1

    async with asyncio.timeout(240):
        await asyncio.gather(*(worker(plan[w::4]) for w in range(4)))
    print(f"\n200 aborted answers in {time.perf_counter() - t0:.1f} s: {outcomes}")
    assert sum(outcomes.values()) == 200

    state = live_server.wait_idle(timeout=60)
    assert state["total"] == 0 and state["sessions"] == 0, state
    metrics = (await asyncio.to_thread(httpx.get, f"{live_server.http_url}/metrics", timeout=10)).text
    assert "omni_rt_live_request_state 0.0" in metrics, metrics
    assert "omni_rt_active_sessions 0.0" in metrics, metrics

    # and the server still answers a whole turn
    async with asyncio.timeout(120), ws_connect(url) as ws:
        await expect_session(ws)
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 12}}))
        done = await recv_until(ws, "response.done")
        assert done["response"]["status"] == "completed", done
    assert live_server.wait_idle(timeout=30)["total"] == 0
