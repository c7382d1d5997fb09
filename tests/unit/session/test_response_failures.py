"""No answer may wedge (#27), without a server: the conversation cap and answers that do not fit, driven on the
session state machine itself (orderings a live server produces only sometimes), and the PyTorch thinker
answering after assistant turns. The same against the real server: tests/integration/test_response_lifecycle.py.
"""

from __future__ import annotations

import re
from typing import Any

from rt_helpers import validate_event

from omni_rt.session.conversation import MAX_ITEMS

LEAKS = re.compile(r"https?://|127\.0\.0\.1|localhost|Traceback|File \"|\{\"|llama-server|pid \d+|/v1/", re.I)


def assert_clean(error: dict[str, Any]) -> None:
    """A client-facing error: a code and a short message with no internals in it."""
    err = error["error"]
    assert err["code"] and isinstance(err["message"], str) and 0 < len(err["message"]) <= 200, err
    assert not LEAKS.search(err["message"]), f"internals in a client-facing error: {err['message']!r}"


def check_response(events: list[dict[str, Any]], status: str, code: str | None = None) -> dict[str, Any]:
    """One response's whole event sequence: created first, exactly one done last, every event of this response,
    every item event for an item the response announced. Returns the final ``response``."""
    assert events[0]["type"] == "response.created", events[0]
    rid = events[0]["response"]["id"]
    dones = [e for e in events if e["type"] == "response.done"]
    assert len(dones) == 1 and events[-1] is dones[0], [e["type"] for e in events]
    announced: set[str] = set()
    for e in events:
        assert e.get("response_id", rid) == rid, e
        if e["type"] == "response.output_item.added":
            announced.add(e["item"]["id"])
        elif e["type"].startswith("response.") and "item_id" in e:
            assert e["item_id"] in announced, f"{e['type']} for an item never announced"
        elif e["type"] == "response.output_item.done":
            assert e["item"]["id"] in announced, e
    final = dones[0]["response"]
    assert final["status"] == status, final
    assert {o["id"] for o in final["output"]} <= announced, final
    if code is not None:
        assert final["status_details"]["error"]["code"] == code, final
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == [code], errors
    return final


# ------------------------------------------------------------------------------------------------ engine level

SYSTEM = {"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."}
TWO_ASSISTANT_TURNS = [SYSTEM, {"role": "user", "content": "What is the capital of France?"},
                       {"role": "assistant", "content": "The capital of France is Paris."},
                       {"role": "assistant", "content": "It is a big city."}]


def _ask(s, rid: str, messages: list[dict], **kw) -> dict:
    from omni_rt.testing.stage_driver import collect, send

    send(s, rid, {"messages": messages, "session_id": rid, **kw})
    return collect(s, [rid], timeout=120)[rid]


def test_torch_engine_answers_after_assistant_turns():
    from omni_rt.engine.factory import create_ar_scheduler

    s = create_ar_scheduler("smollm2", backend="torch", max_batch_size=1, default_max_tokens=8)
    s.start()
    try:
        got = _ask(s, "twice-torch", TWO_ASSISTANT_TURNS)
    finally:
        s.stop()
    assert got["error"] is None and got["result"]["text"].strip(), got


# ------------------------------------------------------------------------------------------------ sans-I/O orderings
# Orderings a live server produces only sometimes, driven on the session state machine itself.

from omni_rt.contracts import payloads as c  # noqa: E402
from omni_rt.session import commands as cmd  # noqa: E402
from omni_rt.session.core import RealtimeSession  # noqa: E402


def _filled(n: int) -> RealtimeSession:
    s = RealtimeSession()
    s.open()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                                           "truncation": "disabled"}})
    for i in range(n):
        s.receive_event({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                      "content": [{"type": "input_text", "text": f"n{i}"}]}})
    s.events_to_send(), s.commands()
    return s


def _drain(s: RealtimeSession) -> tuple[list[dict], list]:
    events, commands = s.events_to_send(), s.commands()
    for e in events:
        validate_event(e)
        if e["type"] == "error":
            assert_clean(e)
    return events, commands


def _voice_turn(s: RealtimeSession, text: str = "hello there") -> None:
    s.receive_asr(c.SpeechStarted(1, 100))
    s.receive_asr(c.SpeechStopped(1, 900))
    s.receive_asr(c.TranscriptSpeculative(1, text, 0.0))
    s.receive_asr(c.Committed(1, "vad", 800))
    s.receive_asr(c.TranscriptFinal(1, text, True, 0.0, 0.0, 800))


def test_voice_turn_at_the_cap_is_refused_not_raised() -> None:
    for room in (0, 1):  # no room at all; room for the user's item only
        s = _filled(MAX_ITEMS - room)
        _voice_turn(s)
        events, commands = _drain(s)
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["conversation_full"], events
        assert not [e for e in events if e["type"].startswith("response.")], events
        starts = {x.response_id for x in commands if isinstance(x, cmd.StartResponse)}
        assert starts <= {x.response_id for x in commands if isinstance(x, cmd.AbortResponse)}  # the held one freed
        assert s.response is None and s.live_state()["responses"] == 0


def test_tool_call_that_does_not_fit_fails_the_answer() -> None:
    s = _filled(MAX_ITEMS - 1)  # room for one output item: the first call takes it, a second call does not fit
    s.receive_event({"type": "response.create"})
    (start,) = [x for x in s.commands() if isinstance(x, cmd.StartResponse)]
    s.receive_output(start.response_id, "text", c.ToolCallDelta(0, "call_1", "get_weather", '{"city"'))
    s.receive_output(start.response_id, "text", c.ToolCallDone(0, "call_1", "get_weather", '{"city": "Paris"}'))
    s.receive_output(start.response_id, "text", c.ToolCallDelta(1, "call_2", "get_time", '{"city"'))
    events, commands = _drain(s)
    check_response(events, "failed", "conversation_full")
    calls = [e["item"]["call_id"] for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
    assert calls == ["call_1"], calls
    assert any(isinstance(x, cmd.AbortResponse) and x.response_id == start.response_id for x in commands)
    s.receive_result(start.response_id, {})  # a late result of the failed answer is dropped
    assert _drain(s)[0] == []


def test_message_that_does_not_fit_fails_the_answer() -> None:
    """A call takes the last place; the text after it has no room for its message item: the answer fails and
    no event names the message item."""
    s = _filled(MAX_ITEMS - 1)
    s.receive_event({"type": "response.create"})
    (start,) = [x for x in s.commands() if isinstance(x, cmd.StartResponse)]
    s.receive_output(start.response_id, "text", c.ToolCallDone(0, "call_1", "get_weather", '{"city": "Paris"}'))
    s.receive_output(start.response_id, "text", c.TextDelta("It is sunny."))
    events, _ = _drain(s)
    final = check_response(events, "failed", "conversation_full")
    assert [it["type"] for it in final["output"]] == ["function_call"], final["output"]
    assert not [e for e in events if e["type"] in ("response.output_audio_transcript.delta", "response.output_text.delta")]


def test_engine_failure_message_is_short_held_or_not() -> None:
    body = 'thinker: http://127.0.0.1:41825/v1/chat/completions answered HTTP 400: {"error": "secret"}'
    s = _filled(1)
    s.receive_event({"type": "response.create"})
    (start,) = [x for x in s.commands() if isinstance(x, cmd.StartResponse)]
    s.receive_failure(start.response_id, "upstream_http_error", "thinker", body)
    check_response(_drain(s)[0], "failed", "upstream_http_error")
    # a held answer that fails before the turn ends: its error and done wait for the release
    s.receive_asr(c.SpeechStarted(1, 100))
    s.receive_asr(c.SpeechStopped(1, 900))
    s.receive_asr(c.TranscriptSpeculative(1, "hi", 0.0))
    (held,) = [x for x in s.commands() if isinstance(x, cmd.StartResponse)]
    s.receive_failure(held.response_id, "engine_crashed", "thinker", body)
    assert not [e for e in _drain(s)[0] if e["type"].startswith("response.") or e["type"] == "error"]
    s.receive_asr(c.Committed(1, "vad", 800))
    s.receive_asr(c.TranscriptFinal(1, "hi", True, 0.0, 0.0, 800))
    events = _drain(s)[0]
    check_response([e for e in events if e["type"] == "error" or "response" in e["type"]], "failed", "engine_crashed")
