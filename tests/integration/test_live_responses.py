"""GPT-Live Responses delegation against a real server and a real backend: the server runs each delegated
request on the operator's OpenAI-compatible backend (``--delegate``: here SmolLM2 behind omni-rt's own chat
completions server), streams it as ``response.event`` envelopes, speaks the answer, and handles client function
calls (``response.item.create`` outputs, then ``response.create``) as the Responses API does."""

from __future__ import annotations

import asyncio
import json

import websockets
from rt_helpers import pcm_chunks_b64, speech_with_silence
from test_live_protocol import SILENCE_40MS, Live, open_live, stream_audio

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def nested(live: Live, did: str) -> list[dict]:
    return [e["event"] for e in live.of("response.event") if e["delegation_id"] == did]


async def ask(live: Live, speech_samples, name: str = "capital") -> asyncio.Task:
    audio, sr, _ = speech_samples[name]
    chunks = pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.3, tail_s=0.2), chunk_ms=40)
    return asyncio.create_task(stream_audio(live, chunks + [SILENCE_40MS] * 600))


async def test_responses_delegation_streams_and_speaks(responses_server, speech_samples):
    ws, live = await open_live(responses_server, {"model": "gpt-live-1", "delegation": {
        "type": "responses", "responses": {"model": "smollm2", "instructions": "Answer in one short sentence."}}})
    try:
        assert (live.of("session.started")[0]["session"]["delegation"]["responses"]["model"]) == "smollm2"
        sender = await ask(live, speech_samples)
        try:
            created = await live.wait_for("session.delegation.created", timeout=60)
            deleg = created["delegation"]
            assert deleg["target"] == "responses" and deleg["response_id"].startswith("resp_")
            done = await live.wait_for("response.event", lambda e: e["event"]["type"] == "response.completed", timeout=90)
            mark = live.events.index(next((t, e) for t, e in live.events if e is done))
            await live.wait_for("session.output_transcript.delta", timeout=60, after=mark)  # the answer, spoken
        finally:
            sender.cancel()
        types = [e["type"] for e in nested(live, deleg["id"])]
        assert types[0] == "response.created" and types[-1] == "response.completed", types
        assert "response.output_text.delta" in types
        text = "".join(e["delta"] for e in nested(live, deleg["id"]) if e["type"] == "response.output_text.delta")
        assert text.strip()
        assert [e["sequence_number"] for e in nested(live, deleg["id"])] == list(range(1, len(types) + 1))
        assert not live.of("error"), live.of("error")
    finally:
        await ws.close()


async def test_responses_function_call_round_trip(responses_server, speech_samples):
    ws, live = await open_live(responses_server, {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {
        "model": "smollm2", "tools": [WEATHER], "tool_choice": "required"}}})
    try:
        sender = await ask(live, speech_samples, "color")
        try:
            call_done = await live.wait_for("response.event", lambda e: e["event"]["type"] == "response.output_item.done"
                                            and e["event"]["item"]["type"] == "function_call", timeout=90)
            did, item = call_done["delegation_id"], call_done["event"]["item"]
            assert item["name"] == "get_weather" and json.loads(item["arguments"]).get("city") is not None
            await live.wait_for("response.event", lambda e: e["event"]["type"] == "response.completed", timeout=60)
            await live.send({"type": "response.create", "event_id": "early"})
            err = await live.wait_for("error", lambda e: e.get("client_event_id") == "early")
            assert err["error"]["code"] == "function_call_outputs_required"
            await live.send({"type": "response.item.create", "event_id": "out", "item": {
                "type": "function_call_output", "call_id": item["call_id"], "output": "Sunny, 21 degrees."}})
            # the answer from the output may not call again: tool_choice back to none (sparse update, as Pipecat does)
            await live.send({"type": "session.update", "event_id": "tc", "session": {"delegation": {"responses": {"tool_choice": "none"}}}})
            updated = await live.wait_for("session.updated")
            assert updated["session"]["delegation"]["responses"]["tool_choice"] == "none"
            assert updated["session"]["delegation"]["responses"]["tools"][0]["name"] == "get_weather"
            await live.send({"type": "response.create", "event_id": "go"})
            n = len(live.events)
            cont = await live.wait_for("response.event", lambda e: e["event"]["type"] == "response.created", after=n, timeout=30)
            assert cont["delegation_id"] == did and cont["event"]["response"]["id"] != call_done["event"].get("response_id")
            n = len(live.events)
            await live.wait_for("response.event", lambda e: e["event"]["type"] == "response.completed", after=n, timeout=90)
            n = len(live.events)
            await live.wait_for("session.output_transcript.delta", timeout=60, after=n)  # the continuation, spoken
        finally:
            sender.cancel()
        errors = [e for e in live.of("error") if e["error"].get("client_event_id") != "early"]
        assert not errors, errors
    finally:
        await ws.close()


async def test_responses_delegation_needs_a_backend_and_valid_settings(live_server):
    ws = await websockets.connect(f"{live_server.ws_url}/v1/live/sessions", open_timeout=60)
    live = Live(ws)
    try:
        for deleg, param in (({"type": "responses", "responses": {"model": "m"}}, "session.delegation.type"),
                             ({"type": "responses", "responses": {"model": "m", "foo": 1}}, "session.delegation.responses.foo"),
                             ({"type": "responses", "responses": {"model": "m", "reasoning": {"effort": "low"}}},
                              "session.delegation.responses.reasoning"),
                             ({"type": "responses", "responses": {"model": "m", "tools": [{"type": "web_search"}]}},
                              "session.delegation.responses.tools"),
                             ({"type": "decisions"}, "session.delegation.type")):
            await live.send({"type": "session.start", "event_id": param, "session": {"model": "gpt-live-1", "delegation": deleg}})
            err = await live.wait_for("error", lambda e, p=param: e.get("client_event_id") == p)
            assert err["error"]["param"] == param, err
        assert not live.of("session.started")
    finally:
        await ws.close()
