"""Function calling for the thinker: tool validation, tool-prompt rendering, and the streaming tool-call parser.

Three call formats, picked from the model's chat template (``detect_format``):

- ``hermes`` — ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks (Qwen2.5's template and
  the Hermes family). Its template renders ``tools=`` itself.
- ``llama3`` — a bare JSON object ``{"name": ..., "parameters": {...}}`` as the whole answer (Llama 3.1/3.2
  templates, which render ``tools=`` themselves); several calls separated by ``;`` or newlines.
- ``own`` — a template without tool support (SmolLM2's plain ChatML one). There is no tool format the model
  was trained on, so a short tool prompt of ours goes into the system message and the model is asked for the
  Hermes block format, the most widespread open one; parsing is then the ``hermes`` parser.

The parser (``ToolCallParser``) is fed the text deltas of the answer as they stream and splits them into
speakable text and tool calls: text that could still become a tool call (a partial ``<tool_call>`` tag, the
first characters of a llama3 answer) is held back until it is clear, and a call's arguments are streamed as
they are generated once its name is known. Hand-written: no well-kept library streams partial tool calls out
of a token stream (serving engines each carry their own parser), and the three formats are small.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from omni_rt.contracts.payloads import TextDelta, ToolCallDelta, ToolCallDone

ToolFormat = Literal["hermes", "llama3", "own"]
ToolChoice = str | dict[str, str]  # "auto" | "none" | "required" | {"type": "function", "name": str}

MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}

# ------------------------------------------------------------------ validation


def validate_tools(tools: Any, field_name: str = "tools") -> None:
    """Raise ``ValueError`` naming the offending field (``tools[0].parameters.properties.x``) for a bad list.

    Tools are the Realtime flat shape ``{"type": "function", "name", "description", "parameters"}``;
    ``parameters`` must be a JSON schema of an object that the constrained decoder can compile.
    """
    if not isinstance(tools, list):
        raise ValueError(f"{field_name} must be a list of function tools, got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"{field_name} holds {len(tools)} tools; at most {MAX_TOOLS} are accepted")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"{field_name}[{i}]"
        if not isinstance(tool, dict):
            raise ValueError(f"{where} must be an object, got {type(tool).__name__}")
        if tool.get("type") != "function":
            raise ValueError(f"{where}.type must be 'function', got {tool.get('type')!r}")
        extra = set(tool) - _TOOL_KEYS
        if extra:
            raise ValueError(f"{where}.{sorted(extra)[0]} is not a function tool field")
        name = tool.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}.name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
        if name in seen:
            raise ValueError(f"{where}.name {name!r} is used by an earlier tool")
        seen.add(name)
        desc = tool.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ValueError(f"{where}.description must be a string")
        if "parameters" in tool and tool["parameters"] is not None:
            _validate_schema(tool["parameters"], f"{where}.parameters")


def _validate_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise ValueError(f"{where}.type must be 'object' (function arguments are a JSON object)")
    try:
        import jsonschema

        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except ImportError:  # pragma: no cover - jsonschema is a declared dependency
        pass
    except Exception as exc:  # jsonschema.SchemaError: its path names the bad keyword
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in getattr(exc, "path", ()))
        raise ValueError(f"{where}{path} is not a valid JSON schema: {getattr(exc, 'message', exc)}") from None
    from omni_rt.engine.constrained import schema_error

    err = schema_error(schema)
    if err:
        raise ValueError(f"{where} cannot be used for constrained decoding: {err}")


def parse_tool_choice(choice: Any, tools: list[dict] | None, field_name: str = "tool_choice") -> ToolChoice:
    """Normalise ``tool_choice``; a named function must be one of ``tools``."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise ValueError(f"{field_name} 'required' needs at least one tool in 'tools'")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if name is None and isinstance(choice.get("function"), dict):  # the chat-completions shape
            name = choice["function"].get("name")
        names = [t["name"] for t in tools or ()]
        if name not in names:
            raise ValueError(f"{field_name}.name {name!r} is not one of the tools ({', '.join(names) or 'none'})")
        return {"type": "function", "name": name}
    raise ValueError(f"{field_name} must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}")


def check_message(m: Any, i: int) -> dict[str, Any]:
    """Validate one chat message (OpenAI tool-message shapes included); returns the normalised copy."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ValueError(f"{where} must be an object")
    role = m.get("role")
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: a tool message needs 'tool_call_id' and 'content' strings")
        return {"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]}
    if role not in ("system", "user", "assistant"):
        raise ValueError(f"{where}.role must be system|user|assistant|tool, got {role!r}")
    content = m.get("content")
    calls = m.get("tool_calls")
    if role == "assistant" and calls:
        if content is None:
            content = ""
        if not isinstance(calls, list):
            raise ValueError(f"{where}.tool_calls must be a list")
        norm = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"{where}.tool_calls[{j}] needs {{'id', 'function': {{'name', 'arguments'}}}}")
            args = fn.get("arguments", "{}")
            if not isinstance(args, str):
                args = json.dumps(args)
            fn = {"name": fn["name"], "arguments": args}
            norm.append({"id": str(c.get("id") or ""), "type": "function", "function": fn})
        if not isinstance(content, str):
            raise ValueError(f"{where}.content must be a string")
        return {"role": role, "content": content, "tool_calls": norm}
    if not isinstance(content, str):
        raise ValueError(f"bad message {m!r}: need {{'role': system|user|assistant, 'content': str}}")
    return {"role": role, "content": content}


# ------------------------------------------------------------------ calls that end


def answered_tools(messages: list[dict] | None) -> set[str]:
    """Names of the tools called since the last user message whose output the conversation already holds."""
    called: dict[str, str] = {}  # call id -> tool name
    answered: set[str] = set()
    for m in messages or ():
        if m.get("role") == "user":
            called.clear()
            answered.clear()
        for c in m.get("tool_calls") or ():
            called[c.get("id", "")] = c["function"]["name"]
        if m.get("role") == "tool" and m.get("tool_call_id") in called:
            answered.add(called[m["tool_call_id"]])
    return answered


def callable_tools(tools: list[dict] | None, tool_choice: ToolChoice, messages: list[dict] | None) -> list[dict] | None:
    """Under ``auto``, the tools the answer may still call: those without an answered call since the last user
    message (``[]``: the answer is spoken). ``None`` when nothing is restricted (no tools, a forced or ``none``
    choice, or no tool output yet in this turn).

    Why by name and not by (name, arguments): the rule is enforced by a grammar before the call is decoded, and
    a grammar can leave out a tool but not one argument value; an exact-match rule would also let a re-call
    with reworded arguments ("Paris, France") through. The cost: the same tool with other arguments in a later
    response of the same turn needs a forcing choice (``required`` or a named choice is always honoured); in
    one response, parallel calls of it are unaffected. The next step of a chain is another tool: callable."""
    if not tools or tool_choice != "auto":
        return None
    done = answered_tools(messages)
    if not done:
        return None
    return [t for t in tools if t["name"] not in done]


# ------------------------------------------------------------------ rendering


def _template_text(tokenizer: Any) -> str:
    tpl = getattr(tokenizer, "chat_template", None) or ""
    return " ".join(tpl.values()) if isinstance(tpl, dict) else str(tpl)


def detect_format(tokenizer: Any) -> ToolFormat:
    """Which call format this model's chat template speaks (see the module docstring)."""
    tpl = _template_text(tokenizer)
    if "tools" not in tpl:
        return "own"
    if "<tool_call>" in tpl:
        return "hermes"
    if "ipython" in tpl or '"parameters"' in tpl or "python_tag" in tpl:
        return "llama3"
    return "hermes"


def chat_tools(tools: list[dict]) -> list[dict]:
    """Realtime flat tools -> the chat-completions shape chat templates (and OpenAI upstreams) expect."""
    out = []
    for t in tools:
        fn = {"name": t["name"], "description": t.get("description") or ""}
        fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def _own_tool_prompt(tools: list[dict]) -> str:
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in chat_tools(tools))
    return (
        "You can call these functions (JSON schemas):\n"
        f"{lines}\n"
        "To call one, answer only with:\n"
        '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
        "Otherwise answer the user directly."
    )


def _args_obj(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _for_template(messages: list[dict]) -> list[dict]:
    """Tool messages for templates that render tools: arguments as objects (as HF templates expect)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["function"]["name"], "arguments": _args_obj(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": m["content"], "tool_calls": calls})
        else:
            out.append(dict(m))
    return out


def _for_own(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Tool messages for a template without tool support: calls and results as Hermes-style text."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            blocks = [
                "<tool_call>\n"
                + json.dumps({"name": c["function"]["name"], "arguments": _args_obj(c["function"]["arguments"])})
                + "\n</tool_call>"
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": "\n".join(filter(None, [m["content"], *blocks]))})
        elif m["role"] == "tool":
            # plain words, no markup: SmolLM2-135M read a <tool_response> block back as its answer, tags and all
            # (spoken aloud); and it uses a result far more often when told to (without the last sentence it
            # answered from its own knowledge)
            out.append({"role": "user", "content": f"The tool returned: {m['content']}\n"
                                                   "Answer my question using this tool result."})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        prompt = _own_tool_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def render_prompt(
    tokenizer: Any, messages: list[dict], tools: list[dict] | None = None, tool_choice: ToolChoice = "auto"
) -> str:
    """The prompt text, with the tool list rendered the model's way. ``tool_choice: none`` renders no tools,
    and a request without tools or tool messages renders exactly as before (prefix reuse is unchanged)."""
    active = list(tools or ()) if tool_choice != "none" else []
    if isinstance(tool_choice, dict):  # a named function: only that one is offered
        active = [t for t in active if t["name"] == tool_choice["name"]]
    has_tool_msgs = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if not active and not has_tool_msgs:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if detect_format(tokenizer) == "own":
        return tokenizer.apply_chat_template(_for_own(messages, active), add_generation_prompt=True, tokenize=False)
    kw = {"tools": chat_tools(active)} if active else {}
    return tokenizer.apply_chat_template(_for_template(messages), add_generation_prompt=True, tokenize=False, **kw)


# ------------------------------------------------------------------ stream payloads (one builder each)


def text_chunk(text: str, token_ids: list[int]) -> TextDelta:
    return TextDelta(text, token_ids)


def tool_call_chunk(index: int, call_id: str, name: str, arguments_delta: str, token_ids: list[int]) -> ToolCallDelta:
    return ToolCallDelta(index, call_id, name, arguments_delta, token_ids)


def tool_call_done_chunk(index: int, call_id: str, name: str, arguments: str) -> ToolCallDone:
    return ToolCallDone(index, call_id, name, arguments)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# ------------------------------------------------------------------ streaming parser

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass
class ToolCall:
    index: int
    call_id: str
    name: str = ""
    arguments: str = ""  # streamed so far
    complete: bool = False  # the arguments value is whole


class _JsonScan:
    """Where a JSON value ends, char by char (strings and escapes respected)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.started = False
        self.done = False

    def feed(self, ch: str) -> None:
        if self.done:
            return
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                self.done = self.depth == 0
            return
        if ch.isspace() and not self.started:
            return
        self.started = True
        if ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            self.done = self.depth <= 0


@dataclass
class _Block:
    """One call being generated: its raw text, and once the header is read, its streamed arguments."""

    call: ToolCall
    raw: str = ""
    args_start: int = -1  # index in raw where the arguments value starts (-2: not streamable)
    args_end: int = -1  # index in raw just past it
    scan: _JsonScan = field(default_factory=_JsonScan)
    scan_pos: int = 0  # next raw index for ``scan``
    outer: _JsonScan = field(default_factory=_JsonScan)  # the whole {...} (llama3: where the block ends)
    outer_pos: int = 0
    outer_end: int = -1


Event = tuple[str, Any]  # ("text", str) | ("delta", (ToolCall, str)) | ("done", ToolCall)


class ToolCallParser:
    """Feed text deltas; get back ``("text", str)``, ``("delta", (call, args_delta))``, ``("done", call)``.

    A call is reported ``done`` only once its arguments are a complete JSON value (a block cut off by the
    length limit or an abort is never reported as done). ``calls`` lists the complete ones.
    """

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt: ToolFormat = "hermes" if fmt == "own" else fmt
        self.calls: list[ToolCall] = []
        self._buf = ""  # text mode: held-back text
        self._block: _Block | None = None
        self._n = 0
        self._decided = self.fmt == "hermes"  # llama3: is the answer a call? decided at its first char
        self._after_call = False

    # -- public
    def push(self, text: str) -> list[Event]:
        events: list[Event] = []
        if text:
            self._buf += text
            self._run(events, final=False)
        return events

    def finish(self) -> list[Event]:
        """End of the answer: release held text; a call whose arguments are whole is reported done."""
        events: list[Event] = []
        self._run(events, final=True)
        if self._block is not None:
            self._close_block(events)
        if self._buf:
            self._emit_text(events, self._buf)
            self._buf = ""
        return events

    # -- internals
    def _emit_text(self, events: list[Event], text: str) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        if text:
            events.append(("text", text))

    def _run(self, events: list[Event], final: bool) -> None:
        while True:
            if self._block is not None:
                if not self._feed_block(events):
                    return
                continue
            if self.fmt == "llama3":
                if not self._llama_text(events, final):
                    return
                continue
            if not self._hermes_text(events, final):
                return

    def _hermes_text(self, events: list[Event], final: bool) -> bool:
        i = self._buf.find(_HERMES_OPEN)
        if i >= 0:
            self._emit_text(events, self._buf[:i])
            self._start_block(self._buf[i + len(_HERMES_OPEN) :])
            return True
        hold = 0 if final else _partial_suffix(self._buf, _HERMES_OPEN)
        out, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold :]
        self._emit_text(events, out)
        return False

    def _llama_text(self, events: list[Event], final: bool) -> bool:
        if self._decided and not self._after_call:
            self._emit_text(events, self._buf)  # plain text answer: nothing held back
            self._buf = ""
            return False
        stripped = self._buf.lstrip().lstrip(";").lstrip()
        if not stripped:
            if final:
                self._buf = ""
            return False
        self._decided = True
        if stripped[0] == "{":
            self._start_block(stripped)
            return True
        self._after_call = False
        self._emit_text(events, self._buf if not self.calls else stripped)
        self._buf = ""
        return False

    def _start_block(self, rest: str) -> None:
        self._block = _Block(ToolCall(self._n, new_call_id()))
        self._buf = rest

    def _feed_block(self, events: list[Event]) -> bool:
        """Move text from the buffer into the open block; True when the block closed (parse on)."""
        b = self._block
        assert b is not None
        b.raw += self._buf
        self._buf = ""
        if self.fmt == "llama3":  # llama3 blocks end with their outer object; hermes ones with the tag
            while b.outer_end < 0 and b.outer_pos < len(b.raw):
                b.outer.feed(b.raw[b.outer_pos])
                b.outer_pos += 1
                if b.outer.done:
                    b.outer_end = b.outer_pos
        if b.args_start == -1:
            m = _HEADER.match(b.raw)
            if m:
                b.call.name = json.loads(f'"{m.group(1)}"')
                b.args_start = b.scan_pos = m.end()
        if b.args_start >= 0 and b.args_end < 0:
            while b.scan_pos < len(b.raw) and not b.scan.done:
                b.scan.feed(b.raw[b.scan_pos])
                b.scan_pos += 1
            if b.scan.done:
                b.args_end = b.scan_pos
            value = b.raw[b.args_start : b.scan_pos].lstrip()
            if value and value[0] != "{":  # a string-encoded object or worse: parsed whole at the end
                b.args_start, b.args_end = -2, -1
            else:
                new = value[len(b.call.arguments) :]
                if new:
                    b.call.arguments += new
                    events.append(("delta", (b.call, new)))
        end = self._block_end(b)
        if end < 0:
            return False
        self._buf = b.raw[end:] + self._buf
        b.raw = b.raw[:end]
        self._close_block(events)
        return True

    def _block_end(self, b: _Block) -> int:
        if self.fmt == "llama3":
            return b.outer_end
        i = b.raw.find(_HERMES_CLOSE)
        return i + len(_HERMES_CLOSE) if i >= 0 else -1

    def _close_block(self, events: list[Event]) -> None:
        b = self._block
        self._block = None
        self._after_call = True
        call = b.call
        if b.args_end >= 0:
            call.complete = _is_json(call.arguments)
        else:
            # arguments before the name, a string-encoded object, ...: parse the whole block at its end
            body = b.raw[: -len(_HERMES_CLOSE)] if b.raw.endswith(_HERMES_CLOSE) else b.raw
            parsed = _loads(body)
            if isinstance(parsed, dict) and isinstance(parsed.get("name"), str):
                args = parsed.get("arguments", parsed.get("parameters", {}))
                if isinstance(args, str) and isinstance(_loads(args), dict):
                    args = _loads(args)
                if isinstance(args, dict) and not call.arguments:
                    call.name = parsed["name"]
                    call.arguments = json.dumps(args, ensure_ascii=False)
                    events.append(("delta", (call, call.arguments)))
                    call.complete = True
        if call.complete and call.name:
            self._n += 1
            self.calls.append(call)
            events.append(("done", call))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _is_json(text: str) -> bool:
    return _loads(text) is not None or text.strip() == "null"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolStream:
    """Per-request tool state in the AR scheduler: the parser, and the grammar when the choice is forced."""

    def __init__(self, fmt: ToolFormat, grammar: Any = None) -> None:
        self.parser = ToolCallParser(fmt)
        self.grammar = grammar
        self.spoken: list[str] = []  # the text chunks: the result's "text" (tool-call markup left out)

    def chunks(self, text: str, token_ids: list[int], final: bool) -> list[dict[str, Any]]:
        """The ``stream`` payloads for one step's text delta (token ids ride on the first payload)."""
        events = self.parser.push(text)
        if final:
            events += self.parser.finish()
        out: list[dict[str, Any]] = []
        for kind, val in events:
            ids, token_ids = token_ids, []
            if kind == "text":
                self.spoken.append(val)
                out.append(text_chunk(val, ids))
            elif kind == "delta":
                call, delta = val
                out.append(tool_call_chunk(call.index, call.call_id, call.name, delta, ids))
            else:
                out.append(tool_call_done_chunk(val.index, val.call_id, val.name, val.arguments))
                if ids:
                    out.append(text_chunk("", ids))
        if token_ids:
            out.append(text_chunk("", token_ids))
        return out

    def result_calls(self) -> list[dict[str, str]]:
        return [{"call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in self.parser.calls]


class UpstreamToolCalls:
    """Maps an OpenAI-compatible upstream's streamed ``delta.tool_calls`` into the chunk contract.

    Upstreams (SGLang, vLLM, llama-server ``--jinja``, OpenAI) send ``{"index", "id", "function": {"name",
    "arguments"}}`` with id and name on a call's first delta only. A call is complete when a later call
    starts or the upstream finishes; it is reported done only if its arguments parse as JSON, so a call cut
    off by the length limit (or an abort, which never reaches ``finish``) is never reported as done.
    """

    def __init__(self) -> None:
        self._by_index: dict[int, ToolCall] = {}
        self._pending: dict[int, str] = {}  # arguments that arrived before the call's name
        self._open: list[ToolCall] = []
        self.calls: list[ToolCall] = []

    def feed(self, deltas: list[dict], token_ids: list[int]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in deltas:
            if not isinstance(d, dict):
                continue
            up = d.get("index", 0)
            fn = d.get("function") or {}
            call = self._by_index.get(up)
            if call is None:
                out += self._close_open()
                call = ToolCall(len(self._by_index), str(d.get("id") or new_call_id()))
                self._by_index[up] = call
                self._open.append(call)
            if fn.get("name") and not call.name:
                call.name = fn["name"]
            args = self._pending.pop(up, "") + (fn.get("arguments") or "")
            if not call.name:
                self._pending[up] = args
                continue
            call.arguments += args
            if args or not call.arguments:
                out.append(tool_call_chunk(call.index, call.call_id, call.name, args, token_ids))
                token_ids = []
        if token_ids:
            out.append(text_chunk("", token_ids))
        return out

    def _close_open(self) -> list[dict[str, Any]]:
        out = []
        for call in self._open:
            if call.name and _is_json(call.arguments or "{}"):
                call.arguments = call.arguments or "{}"
                call.complete = True
                self.calls.append(call)
                out.append(tool_call_done_chunk(call.index, call.call_id, call.name, call.arguments))
        self._open = []
        return out

    def finish(self) -> list[dict[str, Any]]:
        """The upstream finished: every open call with whole arguments is done."""
        return self._close_open()

    def result_calls(self) -> list[dict[str, str]]:
        return [{"call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in self.calls]
