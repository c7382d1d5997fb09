"""Function calling and response.create semantics over the raw Realtime protocol, against the live CPU server.

Forced ``tool_choice`` makes the check independent of the small model's judgement: its arguments are decoded
under the tool's JSON schema. Every server event is validated against openai-python's GA models.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import websockets
from rt_helpers import validate_event

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "description": "Current local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class Client:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def next(self) -> dict[str, Any]:
        event = json.loads(await self.ws.recv())
        validate_event(event)
        self.events.append(event)
        return event

    async def until(self, etype: str, allow_errors: bool = False) -> list[dict[str, Any]]:
        seen = []
        while True:
            event = await self.next()
            seen.append(event)
            if event["type"] == "error" and not allow_errors and etype != "error":
                raise AssertionError(f"unexpected error while waiting for {etype}: {event}")
            if event["type"] == etype:
                return seen

    async def say(self, text: str) -> None:
        await self.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                      "content": [{"type": "input_text", "text": text}]}})
        await self.until("conversation.item.done")


async def connect(server) -> tuple[Any, Client]:
    ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    client = Client(ws)
    assert (await client.next())["type"] == "session.created"
    return ws, client


async def test_forced_tool_call_then_spoken_answer_from_its_result(live_server):
    ws, rt = await connect(live_server)
    async with asyncio.timeout(180), ws:
        await rt.send({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER, TIME],
                                                             "tool_choice": {"type": "function", "name": "get_weather"}}})
        updated = (await rt.until("session.updated"))[-1]["session"]
        assert [t["name"] for t in updated["tools"]] == ["get_weather", "get_time"]
        assert updated["tool_choice"] == {"type": "function", "name": "get_weather"}
        await rt.say("What is the weather like in Paris today?")
        await rt.send({"type": "response.create", "response": {"metadata": {"turn": "1"}}})
        events = await rt.until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "completed" and done["metadata"] == {"turn": "1"}, done
        created = next(e for e in events if e["type"] == "response.created")["response"]
        assert created["metadata"] == {"turn": "1"}
        calls = [o for o in done["output"] if o["type"] == "function_call"]
        assert len(calls) == 1 and calls[0]["name"] == "get_weather", done["output"]
        args = json.loads(calls[0]["arguments"])
        assert isinstance(args.get("city"), str) and args["city"], args
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        fdone = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert deltas == fdone["arguments"] == calls[0]["arguments"] and fdone["call_id"] == calls[0]["call_id"]
        spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert "<tool_call>" not in spoken and "get_weather" not in spoken, spoken  # call text never spoken

        # the tool's result, then an answer that uses it (tool_choice back to auto for that response only)
        await rt.send({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": calls[0]["call_id"],
                                                                   "output": json.dumps({"city": args["city"], "weather": "raining", "celsius": 12})}})
        await rt.until("conversation.item.done")
        await rt.send({"type": "response.create", "response": {"tool_choice": "none", "instructions": None}})
        events = await rt.until("response.done")
        answer = events[-1]["response"]
        assert answer["status"] == "completed" and not [o for o in answer["output"] if o["type"] == "function_call"], answer
        transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta").lower()
        assert any(w in transcript for w in ("rain", "12", "twelve")), transcript
        assert any(e["type"] == "response.output_audio.delta" for e in events)
    assert live_server.wait_idle(timeout=30)["total"] == 0


async def test_tool_errors_and_refused_fields(live_server):
    ws, rt = await connect(live_server)
    async with asyncio.timeout(120), ws:
        bad_schema = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": "strng"}}}}
        cases = [
            ({"type": "session.update", "session": {"type": "realtime", "tools": [bad_schema]}}, "session.tools[0].parameters"),
            ({"type": "session.update", "session": {"type": "realtime", "tool_choice": {"type": "function", "name": "nope"}}},
             "session.tool_choice"),
            ({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_unknown", "output": "{}"}},
             "item.call_id"),
            ({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "nobody"}}}}, "session.audio.output.voice"),
            ({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"speed": 1.5}}}}, "session.audio.output.speed"),
            ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"noise_reduction": {"type": "loud_room"}}}}},
             "session.audio.input.noise_reduction.type"),
            ({"type": "session.update", "session": {"type": "realtime", "truncation": {"type": "retention_ratio", "retention_ratio": 2}}},
             "session.truncation"),
            ({"type": "session.update", "session": {"type": "realtime", "tracing": "auto"}}, "session.tracing"),
            ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1", "language": "fr"}}}}},
             "session.audio.input.transcription.language"),
            ({"type": "response.create", "response": {"temperature": 7}}, "response.temperature"),
            ({"type": "response.create", "response": {"metadata": {"k": 1}}}, "response.metadata"),
            ({"type": "response.create", "response": {"tools": [bad_schema]}}, "response.tools[0].parameters"),
            ({"type": "response.create", "response": {"conversation": "elsewhere"}}, "response.conversation"),
        ]
        for event, param in cases:
            await rt.send(event)
            err = (await rt.until("error"))[-1]["error"]
            assert err["param"] is not None and err["param"].startswith(param), (event, err)
            if param == "session.tracing":  # what the Agents SDK sends by default: the message says how to stop it
                assert "tracing_disabled" in err["message"] and len(err["message"]) <= 200, err
        # nothing of a refused update was applied; the session still works and echoes what it really uses
        await rt.send({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "ash"}}}})
        session = (await rt.until("session.updated"))[-1]["session"]
        assert session["tools"] == [] and session["audio"]["output"]["voice"] == "joe"


async def test_out_of_band_response_and_item_retrieve(live_server):
    ws, rt = await connect(live_server)
    async with asyncio.timeout(120), ws:
        await rt.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await rt.until("session.updated")
        await rt.say("My name is Ada.")
        item_id = rt.events[-1]["item"]["id"]
        await rt.send({"type": "response.create", "response": {
            "conversation": "none", "metadata": {"purpose": "classify"}, "output_modalities": ["text"], "instructions": None,
            "input": [{"type": "item_reference", "id": item_id},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Reply with one word: hello."}]}]}})
        events = await rt.until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "completed" and done["conversation_id"] is None and done["metadata"] == {"purpose": "classify"}
        assert not [e for e in events if e["type"] in ("conversation.item.added", "conversation.item.done")], events
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        got = (await rt.until("conversation.item.retrieved"))[-1]["item"]
        assert got["id"] == item_id and got["content"][0]["text"] == "My name is Ada."
        # the out-of-band answer did not join the conversation: retrieving it fails
        out_id = done["output"][0]["id"]
        await rt.send({"type": "conversation.item.retrieve", "item_id": out_id})
        assert (await rt.until("error"))[-1]["error"]["code"] == "item_not_found"


async def test_cancel_during_a_streaming_tool_call(live_server):
    ws, rt = await connect(live_server)
    async with asyncio.timeout(120), ws:
        await rt.send({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER], "tool_choice": "required"}})
        await rt.until("session.updated")
        await rt.say("Weather in Rome?")
        await rt.send({"type": "response.create"})
        await rt.until("response.function_call_arguments.delta")
        await rt.send({"type": "response.cancel"})
        events = await rt.until("response.done")
        done = events[-1]["response"]
        assert done["status"] in ("cancelled", "completed"), done  # it may have finished just before the cancel
        if done["status"] == "cancelled":
            assert not [e for e in events if e["type"] == "response.function_call_arguments.done"]
            calls = [o for o in done["output"] if o["type"] == "function_call"]
            assert calls and calls[0]["status"] == "incomplete", done["output"]
    assert live_server.wait_idle(timeout=30)["total"] == 0
