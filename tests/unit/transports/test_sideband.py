"""Sideband controllers (``omni_rt.transports.sideband``) over a real starlette WebSocket: events fan out in order,
client messages feed the session while it lives, its last events go out before close 1000, and a controller
that stops reading is closed 1008 while the session goes on."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_rt.transports.sideband import Sidebands


def make_app(max_events: int) -> tuple[Starlette, list[str]]:
    """A session stand-in driven by its controller's own messages: ``emit N`` fans out N events at once,
    ``end`` emits a last event and ends the session; everything fed is recorded."""
    fed: list[str] = []

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept()
        sidebands, ended = Sidebands(max_events), asyncio.Event()

        def feed(raw: str | bytes) -> None:
            fed.append(str(raw))
            word, _, arg = str(raw).partition(" ")
            if word == "emit":
                for i in range(int(arg)):
                    sidebands.fan_out({"type": "tick", "n": i})
            elif word == "end":
                sidebands.fan_out({"type": "session.closed"})
                ended.set()

        await sidebands.serve(ws, ended=ended, feed=feed, ended_reason="session ended")

    return Starlette(routes=[WebSocketRoute("/ws", endpoint)]), fed


def test_events_in_order_then_last_events_before_close_1000() -> None:
    app, fed = make_app(max_events=16)
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_text("emit 3")
        assert [ws.receive_json()["n"] for _ in range(3)] == [0, 1, 2]
        ws.send_text("end")
        assert ws.receive_json() == {"type": "session.closed"}
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert (closed.value.code, closed.value.reason) == (1000, "session ended")
    assert fed == ["emit 3", "end"]


def test_a_controller_over_its_queue_is_closed_1008() -> None:
    app, _ = make_app(max_events=4)
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_text("emit 10")  # ten events at once into a queue of four: the controller is dropped
        received = []
        with pytest.raises(WebSocketDisconnect) as closed:
            for _ in range(12):
                received.append(ws.receive_json()["n"])
    assert (closed.value.code, closed.value.reason) == (1008, "sideband not reading")
    assert received == list(range(len(received))) and len(received) <= 4
