"""No dead air around tools, over the raw Realtime protocol against the live CPU server: a response that calls a
tool first speaks a short preamble (a ``message`` item before the ``function_call`` item), the session stays
live while the call is outstanding (a second question is answered before the tool's output arrives), a
cancelled preamble keeps its call, and several calls in one response are answered together from outputs
sent in reverse order. Every server event is validated against openai-python's GA ``RealtimeServerEvent``.

``tool_choice: required`` makes the call independent of the 135M model's judgement (its arguments are decoded
under the tool's schema); the answers after the outputs use ``tool_choice: none`` as a client that wants an
answer now would.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
import websockets
from rt_helpers import validate_event


ORDER = {"type": "function", "name": "get_order_status", "description": "The delivery status of a customer's order.",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TOOL_S = 3.0  # how long the client's tool "runs"


class Client:
    """A raw-protocol client that keeps every event with its arrival time."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[tuple[float, dict[str, Any]]] = []

    async def send(self, event: dict[str, Any]) -> float:
        await self.ws.send(json.dumps(event))
        return time.perf_counter()

    async def next(self) -> dict[str, Any]:
        event = json.loads(await self.ws.recv())
        validate_event(event)
        self.events.append((time.perf_counter(), event))
        return event

    async def until(self, etype: str, **match: Any) -> list[dict[str, Any]]:
        seen = []
        while True:
            event = await self.next()
            seen.append(event)
            if event["type"] == "error":
                raise AssertionError(f"unexpected error while waiting for {etype}: {event}")
            if event["type"] == etype and all(event.get(k) == v for k, v in match.items()):
                return seen
            if event["type"] == "response.done":  # never wait past the end of the response for one of its events
                raise AssertionError(f"response ended before {etype}: {event['response']}")

    async def say(self, text: str) -> None:
        await self.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                      "content": [{"type": "input_text", "text": text}]}})
        await self.until("conversation.item.done")

    def time_of(self, pred) -> float:
        return next(t for t, e in self.events if pred(e))


async def connect(server) -> tuple[Any, Client]:
    ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    client = Client(ws)
    assert (await client.next())["type"] == "session.created"
    return ws, client


def _busy() -> bool:
    return os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1)


def _transcript(events: list[dict[str, Any]], rid: str | None = None) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
                   and (rid is None or e["response_id"] == rid))


async def _tools_session(rt: Client, tools: list[dict], **extra: Any) -> None:
    await rt.send({"type": "session.update", "session": {"type": "realtime", "tools": tools, "tool_choice": "required",
                                                         **extra}})
    await rt.until("session.updated")


async def _answer(rt: Client) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A response.create with tool_choice none: its response.done and events."""
    await rt.send({"type": "response.create", "response": {"tool_choice": "none"}})
    events = await rt.until("response.done")
    return events[-1]["response"], events


async def test_preamble_then_a_second_question_while_the_tool_runs_then_the_late_output(live_server):
    ws, rt = await connect(live_server)
    async with asyncio.timeout(240), ws:
        await _tools_session(rt, [ORDER])
        await rt.say("Where is my order 42?")
        asked = await rt.send({"type": "response.create"})
        events = await rt.until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "completed", done
        kinds = [o["type"] for o in done["output"]]
        assert kinds == ["message", "function_call"], done["output"]  # the preamble first, then the call
        preamble = done["output"][0]["content"][0]["transcript"]
        assert preamble == "Let me look up the order status.", preamble
        added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
        assert added == ["message", "function_call"] and "get_order_status" not in _transcript(events)
        first_audio = rt.time_of(lambda e: e["type"] == "response.output_audio.delta") - asked
        # the thinker prefills the tools' ~140-token prompt first: ~0.6 s on the reference box, 1.2 s on slower 2-core
        # machines (llama.cpp at ~8 ms a token on one thread), where first audio came 1.8-1.9 s after the question;
        # 1.9-2.55 s on the 2-vCPU CI machine (four runs, 2026-12-08) and once 2.72 s in the suite: a wide margin
        assert first_audio <= (5.0 if _busy() else 3.5), f"first audio {first_audio:.2f} s after the question"
        call = done["output"][1]
        call_issued = rt.time_of(lambda e: e["type"] == "response.function_call_arguments.done")

        # the tool runs for TOOL_S; meanwhile the user asks something else and is answered
        await rt.say("While you check, what color is the sky on a clear day?")
        second, events = await _answer(rt)
        assert second["status"] == "completed" and [o["type"] for o in second["output"]] == ["message"], second
        assert _transcript(events).strip() and any(e["type"] == "response.output_audio.delta" for e in events)
        answered_after = time.perf_counter() - call_issued
        assert answered_after < (3 * TOOL_S if _busy() else TOOL_S), f"second answer {answered_after:.2f} s after the call"

        # the late output, then the answer that uses it; the history keeps the order things happened in
        await asyncio.sleep(max(0.0, TOOL_S - (time.perf_counter() - call_issued)))
        await rt.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"], "output": json.dumps({"status": "shipped, arrives on Tuesday"})}})
        await rt.until("conversation.item.done")
        final, events = await _answer(rt)
        assert final["status"] == "completed", final
        spoken = _transcript(events).lower()
        assert any(w in spoken for w in ("tuesday", "shipped")), spoken
        items = []
        for _, e in rt.events:
            if e["type"] == "conversation.item.added" and e["item"]["id"] not in items:
                items.append(e["item"]["id"])
        ids = {e["item"]["id"]: e["item"] for _, e in rt.events if e["type"] == "conversation.item.added"}
        order = [ids[i]["type"] + ":" + ids[i].get("role", "") for i in items]
        assert order == ["message:user", "message:assistant", "function_call:", "message:user", "message:assistant",
                         "function_call_output:", "message:assistant"], order
    assert live_server.wait_idle(timeout=30)["total"] == 0


async def test_cancelling_the_preamble_keeps_the_call(live_server):
    """The listener talks over (here: cancels) the preamble: a call already complete stays in the conversation
    and its late output is answered."""
    ws, rt = await connect(live_server)
    async with asyncio.timeout(180), ws:
        await _tools_session(rt, [ORDER])
        await rt.say("Where is my order 42?")
        await rt.send({"type": "response.create"})
        events = await rt.until("response.function_call_arguments.done")
        call_id = events[-1]["call_id"]
        await rt.send({"type": "response.cancel"})
        events = await rt.until("response.done")
        done = events[-1]["response"]
        assert done["status"] in ("cancelled", "completed"), done  # it may have finished just before the cancel
        calls = [o for o in done["output"] if o["type"] == "function_call"]
        assert calls and calls[0]["status"] == "completed" and calls[0]["call_id"] == call_id, done["output"]
        await rt.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call_id, "output": json.dumps({"status": "delivered yesterday"})}})
        await rt.until("conversation.item.done")
        final, events = await _answer(rt)
        assert final["status"] == "completed" and _transcript(events).strip(), final
    assert live_server.wait_idle(timeout=30)["total"] == 0


async def test_parallel_calls_answered_from_outputs_in_reverse_order(torch_server):
    """On the PyTorch thinker, whose grammar under ``required`` + ``parallel_tool_calls`` admits several calls (the
    llama.cpp engine's forced call is one JSON object; under ``auto`` both engines parse every call the model
    writes)."""
    live_server = torch_server
    ws, rt = await connect(live_server)
    async with asyncio.timeout(240), ws:
        await _tools_session(rt, [WEATHER], parallel_tool_calls=True)
        await rt.say("What is the weather in Paris and in Rome?")
        await rt.send({"type": "response.create"})
        events = await rt.until("response.done")
        done = events[-1]["response"]
        calls = [o for o in done["output"] if o["type"] == "function_call" and o["status"] == "completed"]
        assert len(calls) >= 2, done["output"]  # the greedy 135M model under `required` + parallel: several calls
        assert len({c["call_id"] for c in calls}) == len(calls)
        assert done["output"][0]["type"] == "message"  # one preamble for them all
        indexes = [e["output_index"] for e in events if e["type"] == "response.function_call_arguments.done"]
        assert indexes == sorted(indexes) and len(indexes) >= 2
        weather = ["raining and 12 degrees", "sunny and 25 degrees"]
        for n, call in reversed(list(enumerate(calls[:2]))):  # outputs in reverse order
            await rt.send({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": weather[n]}})
            await rt.until("conversation.item.done")
        for call in calls[2:]:
            await rt.send({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": "cloudy"}})
            await rt.until("conversation.item.done")
        final, events = await _answer(rt)  # one response.create answers with all of them
        assert final["status"] == "completed" and [o["type"] for o in final["output"]] == ["message"], final
        spoken = _transcript(events).lower()
        assert any(w in spoken for w in ("rain", "12", "sun", "25")), spoken
    assert live_server.wait_idle(timeout=30)["total"] == 0
