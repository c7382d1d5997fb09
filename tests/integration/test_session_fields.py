"""Every field of ``session.update`` (and ``response.create``) is validated against a real `omni-rt serve`: a value
the GA schema does not allow, or one out of range, gets an ``error`` naming its ``param``; a valid one is either
honoured (echoed in ``session.updated``) or refused by name (``unsupported_value``), never silently ignored.

The wrong-typed values are found by walking openai-python's GA ``RealtimeSessionCreateRequestParam`` (its
TypedDicts, recursively, a discriminated member at a time) and keeping each candidate that the schema itself
refuses (pydantic, strict), so a field added to the schema is covered without a new line here.
"""

from __future__ import annotations

import asyncio
import json
import types
import typing
from typing import Any, Iterator

import pytest
import websockets
from pydantic import ConfigDict, TypeAdapter
from rt_helpers import validate_event

pytestmark = pytest.mark.integration

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# values of several JSON types: for each field, those the schema refuses are its wrong-typed values
CANDIDATES: list[Any] = ["hot", 12345, 1.5, True, [1], {"x": 1}]
MAX_CASES_PER_FIELD = 3


def _is_typeddict(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__annotations__") and hasattr(t, "__total__")


def _strip(t: Any) -> Any:
    """Required[X] / NotRequired[X] / Annotated[X, ...] -> X."""
    while typing.get_origin(t) in (typing.Required, typing.NotRequired, typing.Annotated):
        t = typing.get_args(t)[0]
    return t


def _members(t: Any) -> list[Any]:
    t = _strip(t)
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(t)]
    return [t]


def _refuses(annotation: Any, value: Any) -> bool:
    try:
        TypeAdapter(annotation, config=ConfigDict(strict=True)).validate_python(value)
    except Exception:  # noqa: BLE001 - any validation error: the schema refuses it
        return True
    return False


# what a nested object needs besides the field under test, so that only that field is wrong
FILLERS: dict[str, dict[str, Any]] = {"RealtimeTruncationRetentionRatioParam": {"retention_ratio": 0.5}}


def walk(td: Any, path: tuple[str, ...], make: Any) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """(field path, its annotation, make(value) -> the session payload with that field set) for every field below
    ``td``; ``make`` wraps an object of ``td`` into the payload (each object with its ``type`` and fillers set)."""
    hints = typing.get_type_hints(td, include_extras=True)
    for name, ann in hints.items():
        def make_field(value: Any, name: str = name) -> dict[str, Any]:
            return make({name: value})

        yield path + (name,), ann, make_field
        for member in _members(ann):
            if _is_typeddict(member):
                sub_hints = typing.get_type_hints(member, include_extras=True)
                base = dict(FILLERS.get(member.__name__, {}))
                type_ann = _strip(sub_hints["type"]) if "type" in sub_hints else None
                if type_ann is not None and typing.get_origin(type_ann) is typing.Literal:
                    base["type"] = typing.get_args(type_ann)[0]

                def make_member(obj: dict[str, Any], base: dict[str, Any] = base, make_field: Any = make_field) -> dict[str, Any]:
                    return make_field({**base, **obj})

                yield from walk(member, path + (name,), make_member)


def schema_cases() -> list[tuple[str, dict[str, Any]]]:
    from openai.types.realtime.realtime_session_create_request_param import RealtimeSessionCreateRequestParam

    cases = []
    for path, ann, make in walk(RealtimeSessionCreateRequestParam, (), lambda obj: obj):
        if path == ("type",):
            continue  # the session type is exercised by every case (it is sent as "realtime")
        if path[:1] == ("tools",) and len(path) > 1:
            continue  # a tool's schema: tests/test_realtime_tools.py walks its validation
        bad = [v for v in CANDIDATES if _refuses(ann, v)][:MAX_CASES_PER_FIELD]
        for v in bad:
            cases.append((".".join(("session",) + path), make(v)))
    return cases


# out of range: the schema types these loosely (a float, an int); the documented ranges refuse them
OUT_OF_RANGE: list[tuple[str, dict[str, Any]]] = [
    ("session.temperature", {"temperature": v}) for v in ("hot", 99, -1, [1], 1e308)
] + [
    ("session.max_output_tokens", {"max_output_tokens": 0}),
    ("session.max_output_tokens", {"max_output_tokens": 4097}),
    ("session.max_output_tokens", {"max_output_tokens": 1e308}),
    ("session.max_response_output_tokens", {"max_response_output_tokens": True}),
    ("session.audio.output.speed", {"audio": {"output": {"speed": 99}}}),
    ("session.audio.output.speed", {"audio": {"output": {"speed": 1e308}}}),
    ("session.speed", {"speed": "fast"}),
    ("session.audio.input.turn_detection.threshold", {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 7}}}}),
    ("session.audio.input.turn_detection.silence_duration_ms",
     {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": -1}}}}),
    ("session.audio.input.turn_detection.prefix_padding_ms",
     {"audio": {"input": {"turn_detection": {"type": "server_vad", "prefix_padding_ms": 10 ** 9}}}}),
    ("session.truncation.retention_ratio", {"truncation": {"type": "retention_ratio", "retention_ratio": 2}}),
    ("session.truncation.retention_ratio", {"truncation": {"type": "retention_ratio", "retention_ratio": -0.1}}),
    ("session.truncation", {"truncation": "sometimes"}),
    ("session.audio.input.format.rate", {"audio": {"input": {"format": {"type": "audio/pcm", "rate": "fast"}}}}),
    ("session.audio.input.format", {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}),
    ("session.instructions", {"instructions": "x" * 40_000}),
    ("session.model", {"model": "m" * 200}),
    # names no schema has: refused by name, at every level
    ("session.temprature", {"temprature": 0.8}),
    ("session.audio.inptu", {"audio": {"inptu": {}}}),
    ("session.audio.input.vad", {"audio": {"input": {"vad": True}}}),
    ("session.audio.output.pitch", {"audio": {"output": {"pitch": 2}}}),
    ("session.audio.input.turn_detection.silence_ms",
     {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_ms": 300}}}}),
    ("session.audio.input.transcription.temperature", {"audio": {"input": {"transcription": {"model": "whisper-1", "temperature": 0}}}}),
]

# valid values this server honours: (payload, a check on the echoed session)
HONOURED: list[tuple[dict[str, Any], Any]] = [
    ({"instructions": "Be brief."}, lambda s: s["instructions"] == "Be brief."),
    ({"max_output_tokens": 50}, lambda s: s["max_output_tokens"] == 50),
    ({"max_output_tokens": "inf"}, lambda s: s["max_output_tokens"] == "inf"),
    ({"output_modalities": ["text"]}, lambda s: s["output_modalities"] == ["text"]),
    ({"output_modalities": ["audio"]}, lambda s: s["output_modalities"] == ["audio"]),
    ({"parallel_tool_calls": True}, lambda s: s["parallel_tool_calls"] is True),
    ({"temperature": 0.8}, lambda s: s["temperature"] == 0.8),
    ({"truncation": "disabled"}, lambda s: s["truncation"] == "disabled"),
    ({"truncation": {"type": "retention_ratio", "retention_ratio": 0.5}},
     lambda s: s["truncation"] == {"type": "retention_ratio", "retention_ratio": 0.5}),
    ({"truncation": "auto"}, lambda s: s["truncation"] == "auto"),
    ({"model": "gpt-realtime"}, lambda s: s["model"].startswith("omni-rt")),  # one model: the server's name echoed
    ({"tools": [WEATHER], "tool_choice": "none"}, lambda s: s["tools"][0]["name"] == "get_weather" and s["tool_choice"] == "none"),
    ({"tools": [], "tool_choice": "auto"}, lambda s: s["tools"] == [] and s["tool_choice"] == "auto"),
    ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, lambda s: s["audio"]["input"]["format"] == {"type": "audio/pcmu"}),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}},
     lambda s: s["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}),
    ({"audio": {"output": {"format": {"type": "audio/pcma"}}}}, lambda s: s["audio"]["output"]["format"] == {"type": "audio/pcma"}),
    ({"audio": {"output": {"format": {"type": "audio/pcm"}}}}, lambda s: s["audio"]["output"]["format"]["type"] == "audio/pcm"),
    ({"audio": {"output": {"voice": "ash"}}}, lambda s: isinstance(s["audio"]["output"]["voice"], str)),
    ({"audio": {"output": {"speed": 1.0}}}, lambda s: s["audio"]["output"]["speed"] == 1.0),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 600}}}},
     lambda s: s["audio"]["input"]["turn_detection"]["threshold"] == 0.7
     and s["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 600),
    ({"audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}},
     lambda s: s["audio"]["input"]["transcription"]["language"] == "en"),
    ({"audio": {"input": {"transcription": None, "noise_reduction": None}}}, lambda s: s["audio"]["input"]["transcription"] is None),
    ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
     lambda s: s["audio"]["input"]["noise_reduction"] == {"type": "near_field"}),
    ({"input_audio_noise_reduction": {"type": "far_field"}}, lambda s: s["audio"]["input"]["noise_reduction"] == {"type": "far_field"}),
    ({"include": [], "tracing": None, "prompt": None}, lambda s: True),
    ({"audio": {"input": {"turn_detection": None}}}, lambda s: s["audio"]["input"]["turn_detection"] is None),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
     lambda s: s["audio"]["input"]["turn_detection"]["type"] == "server_vad"),
]

# valid by the schema, not supported here: refused by name
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("session.audio.output.speed", {"audio": {"output": {"speed": 1.5}}}),
    ("session.tracing", {"tracing": "auto"}),
    ("session.include", {"include": ["item.input_audio_transcription.logprobs"]}),
    ("session.reasoning", {"reasoning": {"effort": "low"}}),
    ("session.prompt", {"prompt": {"id": "pmpt_1"}}),
    ("session.audio.input.transcription.language", {"audio": {"input": {"transcription": {"model": "whisper-1", "language": "fr"}}}}),
    ("session.audio.input.transcription.prompt", {"audio": {"input": {"transcription": {"prompt": "names"}}}}),
    ("session.truncation.token_limits", {"truncation": {"type": "retention_ratio", "retention_ratio": 0.5,
                                                        "token_limits": {"post_instructions": 1000}}}),
]

RESPONSE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("response.temperature", {"temperature": v}) for v in ("hot", 99, -1, [1], 1e308)
] + [
    ("response.max_output_tokens", {"max_output_tokens": 0}),
    ("response.output_modalities", {"output_modalities": "text"}),
    ("response.parallel_tool_calls", {"parallel_tool_calls": "yes"}),
    ("response.audio.output.voice", {"audio": {"output": {"voice": 5}}}),
    ("response.audio.input", {"audio": {"input": {}}}),
    ("response.audio.output.speed", {"audio": {"output": {"speed": 1.2}}}),
    ("response.reasoning", {"reasoning": {"effort": "low"}}),
    ("response.prompt", {"prompt": {"id": "pmpt_1"}}),
    ("response.instructions", {"instructions": 42}),
    ("response.truncation", {"truncation": "auto"}),  # a session field, not a response one
]


def names_param(err: dict[str, Any], expected: str) -> bool:
    """The error names the field, or (for a value inside an object this server refuses whole) one of its
    ancestors below the event's root."""
    param = err.get("param") or ""
    root = expected.split(".")[0]
    return param == expected or (param != root and (expected.startswith(param + ".") or param.startswith(expected)))


class Session:
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def recv(self) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
        validate_event(event)
        return event

    async def send(self, event: dict[str, Any]) -> dict[str, Any]:
        """Send, then the first error or session.updated (other events skipped)."""
        await self.ws.send(json.dumps(event))
        while True:
            ev = await self.recv()
            if ev["type"] in ("error", "session.updated"):
                return ev


async def _open(server) -> Session:
    ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    s = Session(ws)
    assert (await s.recv())["type"] == "session.created"
    return s


def test_the_walk_covers_the_schema() -> None:
    """The walk reaches nested fields of every kind (not only the top level)."""
    params = {p for p, _ in schema_cases()}
    for p in ("session.instructions", "session.max_output_tokens", "session.output_modalities", "session.parallel_tool_calls",
              "session.audio.input.turn_detection.threshold", "session.audio.input.turn_detection.eagerness",
              "session.audio.input.transcription.model", "session.audio.output.speed", "session.audio.output.voice",
              "session.truncation.retention_ratio", "session.reasoning.effort", "session.tracing", "session.include",
              "session.tool_choice", "session.tools", "session.audio.input.noise_reduction.type"):
        assert p in params, (p, sorted(params))


async def test_wrong_typed_schema_fields_are_refused_by_name(live_server):
    cases = schema_cases() + OUT_OF_RANGE
    assert len(cases) > 60, len(cases)
    s = await _open(live_server)
    async with asyncio.timeout(120):
        for param, payload in cases:
            ev = await s.send({"type": "session.update", "event_id": "evt_bad", "session": {"type": "realtime", **payload}})
            assert ev["type"] == "error", (param, payload, ev)
            err = ev["error"]
            assert names_param(err, param), (param, payload, err)
            assert err["code"] in ("invalid_type", "invalid_value", "unknown_parameter", "unsupported_value", "unsupported_format",
                                   "string_above_max_length"), (param, err)
            assert err["event_id"] == "evt_bad" and len(err["message"]) <= 300, err
        # nothing of any refused update applied
        ev = await s.send({"type": "session.update", "session": {"type": "realtime"}})
        session = ev["session"]
        assert session["truncation"] == "auto" and "temperature" not in session
        assert session["audio"]["input"]["turn_detection"]["threshold"] == 0.5
    await s.ws.close()


async def test_valid_fields_are_honoured_or_refused_by_name(live_server):
    s = await _open(live_server)
    async with asyncio.timeout(120):
        for payload, check in HONOURED:
            ev = await s.send({"type": "session.update", "session": {"type": "realtime", **payload}})
            assert ev["type"] == "session.updated", (payload, ev)
            assert check(ev["session"]), (payload, ev["session"])
        for param, payload in REFUSED:
            ev = await s.send({"type": "session.update", "session": {"type": "realtime", **payload}})
            assert ev["type"] == "error" and ev["error"]["code"] == "unsupported_value", (payload, ev)
            assert names_param(ev["error"], param), (param, ev)
    await s.ws.close()


async def test_response_create_fields_are_validated_like_the_session(live_server):
    s = await _open(live_server)
    async with asyncio.timeout(120):
        for param, response in RESPONSE_CASES:
            ev = await s.send({"type": "response.create", "response": response})
            assert ev["type"] == "error", (param, ev)
            assert names_param(ev["error"], param), (param, ev)
        # honoured per response: temperature and parallel_tool_calls reach the answer, which completes
        await s.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await s.ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}}))
        await s.ws.send(json.dumps({"type": "response.create", "response": {"temperature": 0.8, "max_output_tokens": 8,
                                                                              "parallel_tool_calls": False}}))
        while (ev := await s.recv())["type"] != "response.done":
            assert ev["type"] != "error", ev
        assert ev["response"]["status"] == "completed", ev
    await s.ws.close()
