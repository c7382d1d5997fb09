"""``session.truncation`` at the conversation's caps (512 items), against a real `omni-rt serve`: by default
(``auto``) the oldest items leave the conversation, each announced with a schema-valid
``conversation.item.deleted``, and answers go on; a ``retention_ratio`` drops down to that share of the cap at
once; ``disabled`` keeps the clear ``conversation_full`` refusal."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import websockets
from rt_helpers import validate_event

from omni_rt.session.conversation import MAX_ITEMS

pytestmark = pytest.mark.integration


class Client:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, **event: Any) -> None:
        await self.ws.send(json.dumps(event))

    async def recv(self) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), 60))
        validate_event(event)
        self.events.append(event)
        return event

    async def until(self, etype: str) -> dict[str, Any]:
        while (event := await self.recv())["type"] != etype:
            assert event["type"] != "error" or etype == "error", event
        return event

    async def say(self, text: str) -> None:
        await self.send(type="conversation.item.create",
                        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})

    def of_type(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == etype]


async def _open(server, session: dict[str, Any]) -> Client:
    ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    c = Client(ws)
    await c.until("session.created")
    await c.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"], **session})
    updated = await c.until("session.updated")
    assert updated["session"]["truncation"] == session.get("truncation", "auto")
    return c


async def test_600_turns_keep_answering_by_default(live_server):
    """600 user turns, an answer every 30th (20 answers, 620 items): past 512 items the oldest leave, oldest
    first, and every answer completes."""
    turns, every = 600, 30
    t0 = time.monotonic()
    c = await _open(live_server, {"instructions": "Answer in three words."})
    async with asyncio.timeout(240):
        added: list[str] = []
        for block in range(turns // every):
            for i in range(every):
                await c.say(f"note {block * every + i}")
            await c.send(type="response.create", response={"max_output_tokens": 4})
            done = await c.until("response.done")
            assert done["response"]["status"] == "completed", done
            assert not c.of_type("error"), c.of_type("error")
        added = [e["item"]["id"] for e in c.of_type("conversation.item.added")]
        deleted = [e["item_id"] for e in c.of_type("conversation.item.deleted")]
        assert len(added) == turns + turns // every
        assert len(deleted) == len(added) - MAX_ITEMS, (len(added), len(deleted))
        assert deleted == added[:len(deleted)], "the oldest items leave first, each once"
        # a deleted item is gone; the newest are kept
        await c.send(type="conversation.item.retrieve", item_id=deleted[0])
        assert (await c.until("error"))["error"]["code"] == "item_not_found"
        await c.send(type="conversation.item.retrieve", item_id=added[-1])
        assert (await c.until("conversation.item.retrieved"))["item"]["id"] == added[-1]
    await c.ws.close()
    assert time.monotonic() - t0 < 240


async def test_disabled_refuses_clearly_at_the_cap(live_server):
    c = await _open(live_server, {"truncation": "disabled"})
    async with asyncio.timeout(120):
        for i in range(MAX_ITEMS):
            await c.say(f"n{i}")
        for _ in range(MAX_ITEMS):
            await c.until("conversation.item.done")
        await c.say("one too many")
        err = (await c.until("error"))["error"]
        assert err["code"] == "conversation_full" and "disabled" in err["message"], err
        await c.send(type="response.create", event_id="evt_full")
        err = (await c.until("error"))["error"]
        assert err["code"] == "conversation_full" and err["event_id"] == "evt_full", err
        assert not c.of_type("conversation.item.deleted")
        # switching truncation back on makes room at the next item
        await c.send(type="session.update", session={"type": "realtime", "truncation": "auto"})
        await c.until("session.updated")
        await c.say("room now")
        assert (await c.until("conversation.item.deleted"))["item_id"] == c.of_type("conversation.item.added")[0]["item"]["id"]
        await c.until("conversation.item.added")
    await c.ws.close()


async def test_retention_ratio_drops_to_its_share_at_once(live_server):
    c = await _open(live_server, {"truncation": {"type": "retention_ratio", "retention_ratio": 0.5}})
    async with asyncio.timeout(120):
        for i in range(MAX_ITEMS + 8):
            await c.say(f"n{i}")
        for _ in range(MAX_ITEMS + 8):
            await c.until("conversation.item.done")
        deleted = c.of_type("conversation.item.deleted")
        keep = int(MAX_ITEMS * 0.5)
        assert len(deleted) == MAX_ITEMS - keep, len(deleted)  # one drop, down to half the cap, then room for 8 more
        added = [e["item"]["id"] for e in c.of_type("conversation.item.added")]
        assert [e["item_id"] for e in deleted] == added[:len(deleted)]
    await c.ws.close()
