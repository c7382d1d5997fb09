"""Sideband controllers: server-side WebSockets that watch and drive a session another client holds.

A WebRTC call (``/v1/realtime?call_id=``) and a GPT-Live session (``/v1/live/sessions/{id}/attach``) each keep
one ``Sidebands``. Every server event the session's own client gets is copied to each controller's bounded
queue; a controller that stops reading is dropped and the session goes on. ``serve`` runs one controller's
socket: its client events feed the same session (same validation), until the controller leaves or the session
ends, when the events still queued (the session's last ones) go out first.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable

from omni_rt.transports.websocket import CLOSE_NORMAL, CLOSE_POLICY

MAX_SIDEBAND_EVENTS = 4096  # server events queued for a controller that does not read (then it is dropped)
DRAIN_S = 2.0  # at the session's end, how long its last queued events may take to go out


class Sidebands:
    """The controllers of one session: a bounded queue each, fed by ``fan_out``."""

    def __init__(self, max_events: int = MAX_SIDEBAND_EVENTS) -> None:
        self.max_events = max_events
        self._queues: dict[asyncio.Queue[dict[str, Any]], asyncio.Event] = {}  # queue -> set when dropped

    def __len__(self) -> int:
        return len(self._queues)

    def fan_out(self, event: dict[str, Any]) -> None:
        """Copy one server event to every controller; drop (and so close) a controller whose queue is full."""
        for queue, dropped in list(self._queues.items()):
            if queue.full():
                del self._queues[queue]
                dropped.set()
            else:
                queue.put_nowait(event)

    async def serve(self, ws: Any, *, ended: asyncio.Event, feed: Callable[[str | bytes], None],
                    ended_reason: str) -> None:
        """Run one controller's socket (a starlette ``WebSocket``) until it leaves or ``ended`` is set; ``feed``
        takes each client message while the session lives. Closes 1008 if the controller stopped reading, else
        1000 (with ``ended_reason`` when the session ended)."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=self.max_events)
        dropped = asyncio.Event()
        self._queues[queue] = dropped

        async def send() -> None:
            while True:
                await ws.send_json(await queue.get())
                queue.task_done()

        async def receive() -> None:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                if data is not None and not ended.is_set():
                    feed(data)

        tasks = [asyncio.create_task(send()), asyncio.create_task(receive()), asyncio.create_task(ended.wait()),
                 asyncio.create_task(dropped.wait())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if ended.is_set() and not dropped.is_set() and not tasks[0].done():  # the sender empties the queue
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(queue.join(), timeout=DRAIN_S)
        finally:
            self._queues.pop(queue, None)
            for task in tasks:
                task.cancel()
            if dropped.is_set():
                code, reason = CLOSE_POLICY, "sideband not reading"
            else:
                code, reason = CLOSE_NORMAL, ended_reason if ended.is_set() else ""
            with contextlib.suppress(Exception):
                await ws.close(code=code, reason=reason)

