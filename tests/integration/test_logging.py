"""The server's log, read after a real session with a few turns and a few client mistakes: no per-request
library line (httpx) at INFO, no internal URL (the engine's loopback port) in a line below WARNING, no ERROR for
a client's mistake, and one structured line when a session opens and one when it closes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import time

import pytest
import websockets
from servers import start_server, stop_server

pytestmark = pytest.mark.integration


def invalid_utf8_text_frame(port: int) -> bytes:
    """Open /v1/realtime by hand and send a text frame that is not UTF-8 (a client library would refuse to)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        deadline = time.monotonic() + 10
        while b"\r\n\r\n" not in head and time.monotonic() < deadline:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        payload, mask = b"\xff\xfe\xfd", os.urandom(4)
        s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        data = b""
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\x88" in data:  # a close frame
                break
        return data


async def drive(server) -> str:
    """Three answered text turns and four client mistakes; the session's id."""
    async with websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60) as ws:
        session_id = json.loads(await ws.recv())["session"]["id"]
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
        for i in range(3):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Say {i}."}]}}))
            await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 5}}))
            while json.loads(await ws.recv())["type"] != "response.done":
                pass
        for bad in ("{nope", b"\xff\xfe", json.dumps({"type": "session.update", "session": {"temperature": "hot"}}),
                    json.dumps({"type": "conversation.item.frobnicate"})):
            await ws.send(bad)
            while json.loads(await ws.recv())["type"] != "error":
                pass
    return session_id


def test_log_is_quiet_and_structured(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("logs"), "--max-sessions", "4")
    try:
        own_port = int(server.http_url.rsplit(":", 1)[1])
        session_id = asyncio.run(asyncio.wait_for(drive(server), 180))
        closed = invalid_utf8_text_frame(own_port)
        assert b"\x88\x02\x03\xef" in closed, closed  # closed with 1007 (invalid frame payload data)
        time.sleep(1.0)
    finally:
        stop_server(server)
    lines = server.log_path.read_text().splitlines()
    level = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
    info = [ln for ln in lines if (m := level.search(ln)) and m.group(1) in ("DEBUG", "INFO")]
    assert not [ln for ln in lines if " httpx " in ln or " httpcore" in ln], "library per-request lines at INFO"
    internal = [ln for ln in info for port in re.findall(r"https?://(?:127\.0\.0\.1|localhost):(\d+)", ln) if int(port) != own_port]
    assert not internal, internal
    assert not [ln for ln in lines if "ERROR" in ln or "Traceback" in ln], [ln for ln in lines if "ERROR" in ln][:5]
    opened = [ln for ln in lines if f"session opened id={session_id}" in ln]
    closed_lines = [ln for ln in lines if f"session closed id={session_id}" in ln]
    assert len(opened) == 1 and "transport=websocket" in opened[0], opened
    assert len(closed_lines) == 1, closed_lines
    assert re.search(r"duration_s=\d+\.\d responses=3 errors=4 items=6", closed_lines[0]), closed_lines
    assert any("invalid UTF-8" in ln and "INFO" in ln for ln in lines)
    assert not [ln for ln in lines if ln.rstrip().endswith(("connection open", "connection closed"))]
