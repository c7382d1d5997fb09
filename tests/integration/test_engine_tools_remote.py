"""Function calling through omni-rt's own OpenAI-compatible server on 127.0.0.1: ``tool_calls`` streamed in
the chat format, and the remote engine mapping, aborting and never repeating the upstream's calls. Tool
validation, prompts, parsing and grammar in the engines: tests/unit/engine/test_engine_tools.py.
"""

from __future__ import annotations

import dataclasses
import json

import httpx
import jsonschema
import pytest
from openai.types.chat import ChatCompletionChunk

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.tools.grammar import GrammarFactory, answer_grammar, call_grammar, closed
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send, wait_until
from omni_rt.engine.tools.parser import ToolCallParser
from omni_rt.engine.tools.prompt import detect_format, render_prompt
from omni_rt.engine.tools.schema import answered_tools, callable_tools, parse_tool_choice, validate_tools
from omni_rt.contracts.payloads import ToolCallDelta, ToolCallDone, text_of

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
}
BOOK = {
    "type": "function",
    "name": "book_table",
    "description": "Book a restaurant table.",
    "parameters": {"type": "object", "properties": {"people": {"type": "integer"}}, "required": ["people"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def smol():
    sched = create_ar_scheduler(str(weights.ensure_smollm2()), max_batch_size=4)
    sched.start()
    yield sched
    sched.stop()


def _run(sched, rid: str, timeout: float = 120.0) -> dict:
    out = collect(sched, [rid], timeout=timeout)[rid]
    assert out["error"] is None, out["error"]
    return out


def _calls(stream: list[dict]) -> tuple[dict[int, str], list[dict]]:
    """Concatenated argument deltas per call index, and the done payloads in order."""
    deltas: dict[int, str] = {}
    for c in stream:
        if isinstance(c, ToolCallDelta):
            deltas[c.index] = deltas.get(c.index, "") + c.arguments_delta
    return deltas, [dataclasses.asdict(c) for c in stream if isinstance(c, ToolCallDone)]


def _no_call_text(stream: list[dict]) -> None:
    spoken = "".join(text_of(c) for c in stream)
    assert "<tool_call>" not in spoken and '"arguments"' not in spoken, spoken


# ------------------------------------------------------------------ constrained decoding, real SmolLM2


def _check_call(done: dict, tool: dict) -> dict:
    assert done["name"] == tool["name"] and done["call_id"].startswith("call_")
    args = json.loads(done["arguments"])
    jsonschema.validate(args, tool["parameters"])
    return args


# ------------------------------------------------------------------ calls that end (no repeated call after its output)

CITY = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"type": "function", "name": "get_time", "description": "Current local time in a city.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ANSWERED = [
    {"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "In Paris it is raining and 12 degrees."},
]


# ------------------------------------------------------------------ remote engine <-> own OpenAI server


@pytest.fixture(scope="module")
def server():
    backend = create_ar_scheduler(str(weights.ensure_smollm2()), max_batch_size=2)
    app = create_app(backend, model_name="smollm2")
    srv = ServerThread(app).start()
    srv.backend, srv.app = backend, app
    yield srv
    srv.stop()
    backend.stop()


@pytest.fixture(scope="module")
def remote(server):
    sched = create_ar_scheduler("smollm2", backend="remote", base_url=server.base_url)
    sched.start()
    yield sched
    sched.stop()


def test_openai_server_streams_tool_calls_in_chat_format(server):
    body = {
        "model": "smollm2",
        "messages": ASK,
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 60,
        "stream": True,
    }
    chunks = []
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        with client.stream("POST", "/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(ChatCompletionChunk.model_validate(json.loads(line[6:])))
        calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
        assert calls[0].id.startswith("call_") and calls[0].type == "function"
        assert calls[0].function.name == "get_weather"
        assert all(tc.id is None and tc.function.name is None for tc in calls[1:])  # OpenAI: first delta only
        args = "".join(tc.function.arguments for tc in calls)
        _check_call({"name": "get_weather", "call_id": calls[0].id, "arguments": args}, WEATHER)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert not "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        # non-streaming: message.tool_calls; a bad schema: 400 naming the field
        r = client.post("/chat/completions", json={**body, "stream": False})
        msg = r.json()["choices"][0]["message"]
        assert msg["content"] is None and msg["tool_calls"][0]["function"]["name"] == "get_weather"
        bad_fn = {"name": "f", "parameters": {"type": "object", "required": 3}}
        bad = {**body, "tools": [{"type": "function", "function": bad_fn}]}
        r = client.post("/chat/completions", json=bad)
        assert r.status_code == 400 and "tools[0].parameters.required" in r.json()["error"]["message"]


def test_remote_engine_maps_upstream_tool_calls(remote, smol):
    named = {"type": "function", "name": "get_weather"}
    req = {"messages": ASK, "tools": [WEATHER, BOOK], "tool_choice": named, "max_tokens": 40}
    send(remote, "rt", req)
    send(smol, "lc", req)
    got, want = _run(remote, "rt"), _run(smol, "lc")
    deltas, done = _calls(got["stream"])
    _, want_done = _calls(want["stream"])
    assert len(done) == 1 and done[0]["arguments"] == want_done[0]["arguments"]  # same greedy call as in-process
    assert deltas[0] == done[0]["arguments"] and len([c for c in got["stream"] if isinstance(c, ToolCallDelta)]) > 3
    assert got["result"]["finish_reason"] == "tool_calls"
    assert got["result"]["tool_calls"] == [{k: done[0][k] for k in ("call_id", "name", "arguments")}]
    _no_call_text(got["stream"])
    assert wait_until(lambda: remote.live_state() == 0)


def test_remote_abort_during_a_tool_call(remote, server):
    send(remote, "ra", {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60})
    seen = []
    while not any(isinstance(c, ToolCallDelta) for c in seen):
        msg = remote.outbox.get(timeout=60)
        assert msg.type == "stream", msg
        seen.append(msg.data)
    remote.abort("ra")
    rest = collect(remote, ["ra"])["ra"]
    assert rest["result"]["finish_reason"] == "abort" and "tool_calls" not in rest["result"]
    assert not any(isinstance(c, ToolCallDone) for c in seen + rest["stream"])
    assert wait_until(lambda: server.backend.live_state() == 0, timeout=10)


def test_remote_auto_text_answer_passes_through(remote, smol):
    """``auto``: the model answers in words; through the remote engine the text (run through the text-side
    call parser, for upstreams that write calls into the content) arrives unchanged."""
    req = {"messages": ASK, "tools": [WEATHER], "max_tokens": 12}
    send(remote, "ra2", req)
    send(smol, "la2", req)
    got, want = _run(remote, "ra2"), _run(smol, "la2")
    assert got["result"]["text"] == want["result"]["text"] == "".join(text_of(c) for c in got["stream"])
    assert got["result"]["text"] and "tool_calls" not in got["result"]


def test_remote_engine_never_repeats_an_answered_call(remote):
    """Through an OpenAI-compatible upstream (omni-rt's own, SmolLM2 behind it): the answered tool is not
    offered to the upstream again (any upstream, not only one that applies the rule itself), and the answer is
    spoken; with a second tool only that one is offered."""
    from omni_rt.engine.streamed.remote import request_body
    from omni_rt.engine.prompt.request import parse_request

    assert "tools" not in request_body(parse_request({"messages": ANSWERED, "tools": [CITY]}, 40), "m")
    both = request_body(parse_request({"messages": ANSWERED, "tools": [CITY, CLOCK]}, 40), "m")
    assert [t["function"]["name"] for t in both["tools"]] == ["get_time"] and both["tool_choice"] == "auto"
    forced = request_body(parse_request({"messages": ANSWERED, "tools": [CITY], "tool_choice": "required"}, 40), "m")
    assert [t["function"]["name"] for t in forced["tools"]] == ["get_weather"]
    send(remote, "r-spoken", {"messages": ANSWERED, "tools": [CITY], "tool_choice": "auto", "max_tokens": 40})
    out = collect(remote, ["r-spoken"], timeout=120)["r-spoken"]
    assert out["error"] is None, out["error"]
    assert not _calls(out["stream"])[1] and "tool_calls" not in out["result"], out["result"]
    _no_call_text(out["stream"])


def test_remote_maps_parallel_calls_from_omni_rts_own_front(remote):
    """``required`` + ``parallel_tool_calls`` on the built-in engine behind omni-rt's OpenAI-compatible front:
    it streams each call under its own ``index``; the remote engine maps them to calls 0, 1, ... again."""
    req = {"messages": ASK, "tools": [BOOK, WEATHER], "tool_choice": "required", "parallel_tool_calls": True, "max_tokens": 70}
    send(remote, "par", req)
    out = _run(remote, "par")
    deltas, done = _calls(out["stream"])
    assert len(done) >= 2 and [d["index"] for d in done] == list(range(len(done)))
    assert len({d["call_id"] for d in done}) == len(done)
    for d in done:
        assert deltas[d["index"]] == d["arguments"]
        _check_call(d, WEATHER if d["name"] == "get_weather" else BOOK)
    _no_call_text(out["stream"])
    assert wait_until(lambda: remote.live_state() == 0)


class _TwoCallsUpstream:
    """A stand-in model server on 127.0.0.1 speaking the chat-completions streaming format: every request is
    answered with two tool calls (index 0, then 1, arguments in pieces), as OpenAI / vLLM stream them."""

    CHUNKS = [
        {"role": "assistant", "content": None},
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "book_table", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"people": 2}'}}]},
    ]

    def __init__(self) -> None:
        import http.server
        import threading

        chunks = self.CHUNKS

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "stand-in"}
                for i, delta in enumerate(chunks + [{}]):
                    finish = "tool_calls" if i == len(chunks) else None
                    body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    self.wfile.write(f"data: {json.dumps(body)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_remote_maps_an_upstreams_two_streamed_calls_after_a_preamble():
    upstream = _TwoCallsUpstream()
    sched = create_ar_scheduler("smollm2", backend="remote", base_url=upstream.base_url)
    sched.start()
    try:
        send(sched, "two", {"messages": ASK, "tools": [WEATHER, BOOK], "max_tokens": 40, "tool_preamble": "auto"})
        out = _run(sched, "two")
        deltas, done = _calls(out["stream"])
        assert [(d["index"], d["call_id"], d["name"], d["arguments"]) for d in done] == [
            (0, "call_a", "get_weather", '{"city": "Paris"}'), (1, "call_b", "book_table", '{"people": 2}')]
        assert deltas == {0: '{"city": "Paris"}', 1: '{"people": 2}'}
        first_call = next(i for i, c in enumerate(out["stream"]) if isinstance(c, (ToolCallDelta, ToolCallDone)))
        assert "".join(text_of(c) for c in out["stream"][:first_call]) == "Let me look up the weather."  # one preamble
        assert "".join(text_of(c) for c in out["stream"][first_call:]) == ""
        assert [c["call_id"] for c in out["result"]["tool_calls"]] == ["call_a", "call_b"]
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()
        upstream.stop()
