"""Function calling in the thinker engines: tool validation, tool prompts from the model's own chat template
(Qwen2.5 / Llama 3.1 shapes) or ours (SmolLM2), the streaming tool-call parser, constrained decoding for a
forced ``tool_choice`` (the real SmolLM2-135M and random-init tiny models must emit valid calls), batching a
constrained row with a free one, abort mid-call, and the remote engine against omni-rt's own
OpenAI-compatible server streaming ``tool_calls`` on 127.0.0.1."""

from __future__ import annotations

import dataclasses

import json

import jsonschema
import pytest

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.tools.grammar import GrammarFactory, answer_grammar, call_grammar, closed
from omni_rt.engine.factory import create_ar_scheduler
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send, wait_until
from omni_rt.engine.tools.parser import ToolCallParser
from omni_rt.engine.tools.prompt import detect_format, render_prompt
from omni_rt.engine.tools.schema import answered_tools, applicable_tool_choice, callable_tools, parse_tool_choice, validate_tools
from omni_rt.contracts.payloads import TextDelta, ToolCallDelta, ToolCallDone, text_of
from omni_rt.engine.tools.preamble import ToolPreamble, parse_preamble_mode, phrase_for

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
# bounded arguments (enum + boolean): even a random-init model finishes them within a few tokens
SWITCH = {
    "type": "function",
    "name": "set_light",
    "parameters": {
        "type": "object",
        "properties": {"room": {"enum": ["kitchen", "hall"]}, "on": {"type": "boolean"}},
        "required": ["room", "on"],
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# The shape of Qwen2.5-Instruct's published chat template (tool parts), written here as data: transformers
# ships no templates and nothing may be downloaded.
QWEN25_TEMPLATE = """{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for message in messages %}{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- elif message.role == "assistant" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif message.role == "tool" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

# The shape of Llama-3.1-Instruct's published template (JSON tool calls, tools in the first user turn).
LLAMA31_TEMPLATE = """{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}{%- else %}{%- set system_message = "" %}{%- endif %}{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}{{- system_message }}{{- "<|eot_id|>" }}{%- if tools is not none %}{%- set first_user_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}{{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\n" }}{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}{{- "Do not use variables.\\n\\n" }}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}{{- first_user_message + "<|eot_id|>"}}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}{%- elif 'tool_calls' in message %}{%- set tool_call = message.tool_calls[0].function %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{{- '{"name": "' + tool_call.name + '", "parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}{%- elif message.role == "tool" or message.role == "ipython" %}{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}{{- message.content }}{{- "<|eot_id|>" }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def smol():
    sched = create_ar_scheduler(str(weights.ensure_smollm2()), max_batch_size=4)
    sched.start()
    yield sched
    sched.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """Tiny random-init Qwen2 / Llama with the SmolLM2 tokenizer and the Qwen2.5 / Llama 3.1 template shapes."""
    root = tmp_path_factory.mktemp("tools")
    out = {}
    for arch, tpl in (("qwen2", QWEN25_TEMPLATE), ("llama", LLAMA31_TEMPLATE)):
        tok = weights.load_tokenizer(weights.ensure_smollm2())
        tok.chat_template = tpl
        path = build_tiny_model(arch, root / arch, vocab_size=len(tok), tokenizer=tok)
        sched = create_ar_scheduler(str(path), max_batch_size=2)
        sched.start()
        out[arch] = sched
    yield out
    for sched in out.values():
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


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "tools, where",
    [
        ("nope", "tools must be a list"),
        ([{"type": "code_interpreter"}], "tools[0].type"),
        ([WEATHER, {"type": "function", "name": "bad name"}], "tools[1].name"),
        ([WEATHER, dict(WEATHER)], "tools[1].name"),
        ([{"type": "function", "name": "f", "parameters": "x"}], "tools[0].parameters"),
        ([{"type": "function", "name": "f", "parameters": {"type": "array"}}], "tools[0].parameters.type"),
        (
            [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "x"}}}}],
            "tools[0].parameters.properties.a.type",
        ),
        ([{"type": "function", "name": "f", "paramters": {}}], "tools[0].paramters"),
    ],
)
def test_validate_tools_names_the_field(tools, where):
    with pytest.raises(ValueError) as exc:
        validate_tools(tools)
    assert where in str(exc.value), str(exc.value)


def test_validate_tools_accepts_good_tools_and_tool_choice():
    validate_tools([WEATHER, BOOK, SWITCH, {"type": "function", "name": "no_args"}])
    assert parse_tool_choice({"type": "function", "name": "book_table"}, [WEATHER, BOOK]) == {
        "type": "function",
        "name": "book_table",
    }
    with pytest.raises(ValueError, match=r"tool_choice\.name 'nope'"):
        parse_tool_choice({"type": "function", "name": "nope"}, [WEATHER])
    with pytest.raises(ValueError, match="required"):
        parse_tool_choice("required", None)
    # a session's settings come in pieces: its 'required' may precede its tools, each request resolves it
    assert parse_tool_choice("required", None, required_needs_tools=False) == "required"
    with pytest.raises(ValueError, match=r"tool_choice\.name 'later'"):
        parse_tool_choice({"type": "function", "name": "later"}, [], required_needs_tools=False)
    assert applicable_tool_choice("required", []) is None and applicable_tool_choice("none", [WEATHER]) is None
    assert applicable_tool_choice("required", [WEATHER]) == "required"

def test_bad_tools_fail_only_that_request(smol):
    send(smol, "bad", {"messages": ASK, "tools": [{"type": "function", "name": "f", "parameters": {"type": "x"}}]})
    message, code = collect(smol, ["bad"])["bad"]["error"]
    assert code == "bad_request" and "tools[0].parameters" in message
    send(smol, "bad2", {"messages": [{"role": "tool", "content": "1"}]})
    message, code = collect(smol, ["bad2"])["bad2"]["error"]
    assert code == "bad_request" and "messages[0]" in message and "tool_call_id" in message


# ------------------------------------------------------------------ parser


HERMES_TWO = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}r\\"is", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "book_table", "arguments": {"people": 2}}\n</tool_call>'
)


def _parse(fmt: str, text: str, step: int):
    p = ToolCallParser(fmt)
    events = []
    for i in range(0, len(text), step):
        events += p.push(text[i : i + step])
    events += p.finish()
    spoken = "".join(v for k, v in events if k == "text")
    deltas: dict[int, str] = {}
    for k, v in events:
        if k == "delta":
            deltas[v[0].index] = deltas.get(v[0].index, "") + v[1]
    done = [(c.index, c.name, c.arguments) for k, c in events if k == "done"]
    return spoken, deltas, done, events


@pytest.mark.parametrize("step", [1, 2, 5, 13, 1000])
def test_parser_splits_parallel_hermes_calls_at_any_chunking(step):
    spoken, deltas, done, events = _parse("hermes", HERMES_TWO, step)
    assert spoken == "Let me check. "
    assert [d[:2] for d in done] == [(0, "get_weather"), (1, "book_table")]
    assert json.loads(done[0][2]) == {"city": 'Pa}r"is', "unit": "celsius"} and json.loads(done[1][2]) == {"people": 2}
    assert deltas == {0: done[0][2], 1: done[1][2]}  # the streamed deltas add up to the final arguments
    if step == 1:  # arguments stream while generated, not in one piece at the end
        assert sum(1 for k, _ in events if k == "delta") > 10


def test_parser_holds_back_only_what_could_become_a_call():
    p = ToolCallParser("own")
    assert p.push("It is 3 < 4 <tool") == [("text", "It is 3 < 4 ")]  # '<tool' might open a call
    assert p.push("s are great.") == [("text", "<tools are great.")]
    assert p.finish() == []
    # an answer cut off inside a call: its arguments streamed, but it is never reported done
    spoken, deltas, done, _ = _parse("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": 1', 3)
    assert spoken == "" and deltas == {0: '{"x": 1'} and done == []
    # arguments before the name: parsed whole at the end of the block
    spoken, deltas, done, _ = _parse("hermes", '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call> ok', 4)
    assert spoken == "ok" and done == [(0, "f", '{"x": 1}')]


def test_parser_llama3_json_calls():
    text = '{"name": "get_weather", "parameters": {"city": "}"}}; {"name": "book_table", "parameters": {}}'
    for step in (1, 3, 100):
        spoken, deltas, done, _ = _parse("llama3", text, step)
        assert spoken == "" and [d[:2] for d in done] == [(0, "get_weather"), (1, "book_table")]
        assert json.loads(done[0][2]) == {"city": "}"} and deltas[1] == "{}"
    spoken, _, done, _ = _parse("llama3", "  Paris is sunny {today}.", 2)
    assert spoken == "  Paris is sunny {today}." and done == []


# ------------------------------------------------------------------ prompts


def test_prompts_use_the_models_template_or_ours(smol, tiny):
    history = ASK + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]
    tok = smol.tokenizer
    assert detect_format(tok) == "own"
    plain = render_prompt(tok, ASK)
    assert plain == tok.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    assert render_prompt(tok, ASK, [WEATHER], "none") == plain  # none: no tool prompt at all
    own = render_prompt(tok, history, [WEATHER])
    assert '"name": "get_weather"' in own and "<tool_call>" in own and 'The tool returned: {"temp_c": 21}' in own
    assert own.startswith("<|im_start|>system\nYou can call these functions")
    named = render_prompt(tok, ASK, [WEATHER, BOOK], {"type": "function", "name": "book_table"})
    assert "book_table" in named and "get_weather" not in named  # a named choice offers only that function

    qwen = tiny["qwen2"].tokenizer
    assert detect_format(qwen) == "hermes"
    q = render_prompt(qwen, history, [WEATHER])
    assert "# Tools" in q and '"name": "get_weather"' in q
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in q
    assert "<|im_start|>user\n<tool_response>\n" in q

    llama = tiny["llama"].tokenizer
    assert detect_format(llama) == "llama3"
    ll = render_prompt(llama, history, [WEATHER])
    assert "Environment: ipython" in ll and '"parameters": {"city": "Paris"' in ll
    assert "<|start_header_id|>ipython<|end_header_id|>" in ll


def test_grammar_closes_objects_and_frames_the_call():
    g = call_grammar("own", [WEATHER], {"type": "function", "name": "get_weather"})
    assert '"additionalProperties": false' in g and "<tool_call>" in g
    assert closed({"type": "object", "additionalProperties": {"type": "integer"}})["additionalProperties"] == {
        "type": "integer"
    }


# ------------------------------------------------------------------ constrained decoding, real SmolLM2


def _check_call(done: dict, tool: dict) -> dict:
    assert done["name"] == tool["name"] and done["call_id"].startswith("call_")
    args = json.loads(done["arguments"])
    jsonschema.validate(args, tool["parameters"])
    return args


@pytest.mark.integration  # a real model runs for seconds
def test_smollm2_forced_named_call_is_valid(smol):
    named = {"type": "function", "name": "get_weather"}
    send(smol, "named", {"messages": ASK, "tools": [WEATHER, BOOK], "tool_choice": named, "max_tokens": 40})
    out = _run(smol, "named")
    deltas, done = _calls(out["stream"])
    assert len(done) == 1
    args = _check_call(done[0], WEATHER)
    assert args["unit"] in ("celsius", "fahrenheit")
    assert deltas[0] == done[0]["arguments"]
    _no_call_text(out["stream"])
    res = out["result"]
    assert res["text"] == "" and res["finish_reason"] == "tool_calls"
    assert res["tool_calls"] == [{k: done[0][k] for k in ("call_id", "name", "arguments")}]
    # every token is accounted in the chunks even though no text was spoken
    assert sum(len(c.token_ids) for c in out["stream"] if not isinstance(c, ToolCallDone)) == len(res["token_ids"])
    assert wait_until(lambda: smol.live_state() == 0)


@pytest.mark.integration  # a real model runs for seconds
def test_smollm2_required_parallel_calls_get_indices(smol):
    """``required`` with ``parallel_tool_calls``: the greedy 135M model repeats its call; each gets its index,
    and one cut off by the token limit is never reported done."""
    req = {"messages": ASK, "tools": [BOOK, WEATHER], "tool_choice": "required", "parallel_tool_calls": True}
    send(smol, "par", {**req, "max_tokens": 70})
    out = _run(smol, "par")
    deltas, done = _calls(out["stream"])
    assert [d["index"] for d in done] == list(range(len(done))) and len(done) >= 2
    assert len({d["call_id"] for d in done}) == len(done)
    for d in done:
        _check_call(d, WEATHER if d["name"] == "get_weather" else BOOK)
    assert out["result"]["finish_reason"] == "length"  # the model kept calling until the limit
    assert len(out["result"]["tool_calls"]) == len(done)
    _no_call_text(out["stream"])


def test_tool_choice_none_and_auto(smol):
    send(smol, "plain", {"messages": ASK, "max_tokens": 6})
    send(smol, "none", {"messages": ASK, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 6})
    out = collect(smol, ["plain", "none"])
    assert out["none"]["result"]["prompt_tokens"] == out["plain"]["result"]["prompt_tokens"]  # no tool prompt
    assert out["none"]["result"]["text"] == out["plain"]["result"]["text"]
    assert not any(isinstance(c, ToolCallDelta) for c in out["none"]["stream"]) and "tool_calls" not in out["none"]["result"]
    send(smol, "auto", {"messages": ASK, "tools": [WEATHER], "max_tokens": 6})
    res = _run(smol, "auto")["result"]
    assert res["prompt_tokens"] > out["plain"]["result"]["prompt_tokens"]  # the tool prompt is in


@pytest.mark.integration  # a real model runs for seconds
def test_constrained_row_batched_with_a_free_row(smol):
    """The grammar mask touches only its own row: a free request batched with a forced one decodes the same."""
    free = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 10}
    send(smol, "alone", free)
    alone = _run(smol, "alone")["result"]
    send(smol, "forced", {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 32})
    send(smol, "beside", free)
    out = collect(smol, ["forced", "beside"])
    assert out["beside"]["result"]["token_ids"] == alone["token_ids"]
    _check_call(_calls(out["forced"]["stream"])[1][0], WEATHER)


def test_abort_during_a_streaming_call(smol):
    send(smol, "cut", {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60})
    seen = []
    while not any(isinstance(c, ToolCallDelta) for c in seen):
        msg = smol.outbox.get(timeout=60)
        assert msg.type == "stream", msg
        seen.append(msg.data)
    smol.abort("cut")
    rest = collect(smol, ["cut"])["cut"]
    assert rest["result"]["finish_reason"] == "abort"
    assert "tool_calls" not in rest["result"]
    assert not any(isinstance(c, ToolCallDone) for c in seen + rest["stream"])  # no half call reported as done
    assert wait_until(lambda: smol.live_state() == 0)


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


def test_callable_tools_counts_answered_calls_since_the_last_user_message():
    assert answered_tools(ANSWERED) == {"get_weather"}
    assert callable_tools([CITY, CLOCK], "auto", ANSWERED) == [CLOCK]
    assert callable_tools([CITY], "auto", ANSWERED) == []
    for forced in ("required", {"type": "function", "name": "get_weather"}, "none"):
        assert callable_tools([CITY], forced, ANSWERED) is None  # the client's choice is honoured
    assert callable_tools([CITY], "auto", ANSWERED[:3]) is None  # called, no output yet
    new_turn = ANSWERED + [{"role": "assistant", "content": "It rains."}, {"role": "user", "content": "And in Rome?"}]
    assert callable_tools([CITY], "auto", new_turn) is None  # a new user message: every tool is callable again
    stray = ANSWERED[:2] + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    assert answered_tools(stray) == set()  # an output of no call in this turn


@pytest.mark.parametrize("fmt", ["own", "llama3"])
def test_answer_grammar_speaks_or_calls_only_a_tool_still_callable(smol, fmt):
    tok = smol.tokenizer
    factory = GrammarFactory(tok, smol.engine.vocab_size, smol.eos_token_ids)
    call = ('<tool_call>\n{{"name": "{}", "arguments": {{"city": "Paris"}}}}\n</tool_call>' if fmt == "own"
            else '{{"name": "{}", "parameters": {{"city": "Paris"}}}}')

    def accepts(callable_: list[dict], text: str) -> bool:
        g = factory.for_answer(fmt, callable_)
        ok = all(g.matcher.consume_token(t) for t in tok(text, add_special_tokens=False)["input_ids"])
        return ok and g.matcher.is_accepting()

    assert accepts([CLOCK], "In Paris it is raining.") and accepts([], "It is 12 degrees.")
    assert accepts([CLOCK], call.format("get_time"))
    assert not accepts([CLOCK], call.format("get_weather"))  # the answered tool is not called again
    assert not accepts([], call.format("get_time")) and not accepts([], " <tool_call>")
    assert not accepts([], "") and not accepts([], " ")  # an answer, not silence
    assert "TEXT" in answer_grammar(fmt, []) and "call0" not in answer_grammar(fmt, [])


@pytest.mark.integration  # a real model runs for seconds
def test_smollm2_answers_from_the_output_instead_of_calling_again(smol):
    """The issue's flow on the built-in engine: the tool's output is in, tool_choice is auto. Before, SmolLM2
    called get_weather(Paris) again on every response; now it speaks, using the output; with a second tool
    offered the answered one is still not called (the other may be: the chain's next step)."""
    send(smol, "spoken", {"messages": ANSWERED, "tools": [CITY], "tool_choice": "auto", "max_tokens": 40})
    send(smol, "chain", {"messages": ANSWERED, "tools": [CITY, CLOCK], "tool_choice": "auto", "max_tokens": 40})
    send(smol, "forced", {"messages": ANSWERED, "tools": [CITY], "tool_choice": "required", "max_tokens": 40})
    out = collect(smol, ["spoken", "chain", "forced"], timeout=180)
    spoken = out["spoken"]
    assert spoken["error"] is None and not _calls(spoken["stream"])[1], spoken["result"]
    said = "".join(text_of(c) for c in spoken["stream"]).lower()
    assert any(w in said for w in ("rain", "12")), said  # the answer uses the tool's output
    _no_call_text(spoken["stream"])
    assert all(d["name"] != "get_weather" for d in _calls(out["chain"]["stream"])[1]), out["chain"]["result"]
    assert [d["name"] for d in _calls(out["forced"]["stream"])[1]] == ["get_weather"]  # required is honoured


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_random_tiny_models_never_repeat_an_answered_call(tiny, arch):
    """Hermes (Qwen2.5 template) and llama3 (Llama 3.1 template) formats: a random model under auto with the
    only tool answered produces text, never a call."""
    sched = tiny[arch]
    send(sched, arch, {"messages": ANSWERED, "tools": [CITY], "tool_choice": "auto", "max_tokens": 12})
    out = _run(sched, arch)
    assert not _calls(out["stream"])[1] and "tool_calls" not in out["result"]
    assert not any(isinstance(c, ToolCallDelta) for c in out["stream"])
    text = sched.tokenizer.decode(out["result"]["token_ids"], skip_special_tokens=True)
    assert text.strip() and "<" not in text and not text.lstrip().startswith("{"), text


# ------------------------------------------------------------------ other templates, random weights


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_random_tiny_models_emit_valid_calls_under_the_grammar(tiny, arch):
    sched = tiny[arch]
    named = {"type": "function", "name": "set_light"}
    send(sched, arch, {"messages": ASK, "tools": [SWITCH, WEATHER], "tool_choice": named, "max_tokens": 40})
    out = _run(sched, arch)
    deltas, done = _calls(out["stream"])
    assert len(done) == 1, out["result"]
    _check_call(done[0], SWITCH)
    assert out["result"]["finish_reason"] == "tool_calls"
    _no_call_text(out["stream"])
    assert out["result"]["text"] == ""  # the result's text is what is spoken: no call markup
    text = sched.tokenizer.decode(out["result"]["token_ids"])
    assert text.startswith("<tool_call>" if arch == "qwen2" else '{"name": "set_light", "parameters": ')


def test_grammar_mask_on_the_static_kv_path(tiny, tmp_path):
    """The GPU decode path (preallocated KV, batch padded to a bucket; eager here) applies the row masks too:
    a forced row and a free row batched together, the free row decoding as it does alone."""
    tok = tiny["qwen2"].tokenizer
    path = build_tiny_model("qwen2", tmp_path / "static", vocab_size=len(tok), tokenizer=tok)
    sched = create_ar_scheduler(str(path), max_batch_size=4, static_kv=True)
    sched.start()
    try:
        free = {"messages": ASK, "max_tokens": 8, "ignore_eos": True}
        send(sched, "alone", free)
        alone = _run(sched, "alone")["result"]
        forced = {"messages": ASK, "tools": [SWITCH], "tool_choice": "required", "max_tokens": 40}
        send(sched, "forced", forced)
        send(sched, "free", free)
        out = collect(sched, ["forced", "free"])
        assert out["free"]["result"]["token_ids"] == alone["token_ids"]
        _check_call(_calls(out["forced"]["stream"])[1][0], SWITCH)
    finally:
        sched.stop()


# ------------------------------------------------------------------ spoken preambles


@pytest.mark.parametrize("name, phrase", [
    ("get_order_status", "Let me look up the order status."),
    ("lookupFlightTimes", "Let me look up the flight times."),
    ("search_flights", "Let me search for flights."),
    ("book_table", "Let me check that."),
    ("weather", "Let me check that."),
    ("get_a_very_long_list_of_things_here", "Let me check that."),
])
def test_preamble_phrase_fits_the_function_name(name, phrase):
    assert phrase_for(name) == phrase


def test_preamble_goes_before_the_first_call_only_when_no_words_came_first():
    call = ToolCallDelta(0, "call_1", "get_weather", "{")
    out = ToolPreamble("auto").apply([TextDelta("", [1]), call, ToolCallDone(0, "call_1", "get_weather", "{}")])
    assert [type(c).__name__ for c in out] == ["TextDelta", "TextDelta", "ToolCallDelta", "ToolCallDone"]
    assert out[1].text == "Let me look up the weather."
    own = ToolPreamble("auto")
    assert own.apply([TextDelta("Sure, one moment.", [2]), call]) == [TextDelta("Sure, one moment.", [2]), call]
    assert own.text == "" and ToolPreamble("off").apply([call]) == [call]
    with pytest.raises(ValueError, match="tool_preamble"):
        parse_preamble_mode("always")


@pytest.mark.integration  # a real model runs for seconds
def test_smollm2_forced_call_is_preceded_by_a_spoken_preamble(smol):
    """``tool_preamble: auto``: the phrase streams as text before the call's first chunk, and is the result's
    text; without it the forced call carries no text at all."""
    req = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 40}
    send(smol, "pre", {**req, "tool_preamble": "auto"})
    send(smol, "nopre", req)
    out = collect(smol, ["pre", "nopre"], timeout=120)
    stream = out["pre"]["stream"]
    first_call = next(i for i, c in enumerate(stream) if isinstance(c, (ToolCallDelta, ToolCallDone)))
    assert "".join(text_of(c) for c in stream[:first_call]) == "Let me look up the weather."
    assert out["pre"]["result"]["text"].startswith("Let me look up the weather.")
    assert _calls(stream)[1] and _calls(stream)[1][0]["name"] == "get_weather"
    assert not "".join(text_of(c) for c in out["nopre"]["stream"]).strip()
