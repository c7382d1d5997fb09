"""Memory that returns (issue #51): against a real `omni-rt serve`, when the last session closes the server
gives malloc's free pages back to the OS (``omni_rt.server.memory``), and not while any session is open."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
import websockets

pytestmark = pytest.mark.integration

LONG_TURN = " ".join(["Tell me about the rivers, the mountains and the old towns of the north."] * 20)


def _memory(server) -> dict[str, Any]:
    state = httpx.get(f"{server.http_url}/debug/state", timeout=10).json()
    return {**state["memory"], "sessions": state["sessions"]}


async def _open(server) -> Any:
    ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "session.created":
        pass
    return ws


async def _long_turn(ws: Any) -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_TURN}]}}))
    await ws.send(json.dumps({"type": "response.create"}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        assert event["type"] != "error", event
        if event["type"] == "response.done":
            assert event["response"]["status"] == "completed", event
            return
    raise AssertionError("no response.done within 120 s")


async def _wait_for(pred, timeout_s: float, server) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred(mem := _memory(server)):
            return mem
        await asyncio.sleep(0.2)
    return _memory(server)


async def test_free_memory_is_returned_when_the_last_session_closes(live_server):
    first = await _wait_for(lambda m: m["sessions"] == 0, 30, live_server)
    assert first["available"] is True  # glibc: malloc_trim exists (CI and the images we ship)
    a, b = await _open(live_server), await _open(live_server)
    await asyncio.gather(_long_turn(a), _long_turn(b))
    before = _memory(live_server)["releases"]
    await b.close()
    # b's close leaves a open: nothing is trimmed while a session could be mid-answer (min interval is 2 s)
    still = await _wait_for(lambda m: m["releases"] != before, 3.0, live_server)
    assert still["releases"] == before and still["sessions"] == 1, still
    await a.close()
    after = await _wait_for(lambda m: m["releases"] > before, 15, live_server)
    assert after["releases"] == before + 1 and after["sessions"] == 0, after
    last = after["last"]
    assert last["rss_after_mb"] <= last["rss_before_mb"] + 1.0, last  # a trim never grows the process
    assert last["took_ms"] < 2000, last
