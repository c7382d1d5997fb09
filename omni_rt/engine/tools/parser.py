"""The streaming tool-call parser: the answer's text deltas split into speakable text and tool calls.

``ToolCallParser`` is fed the text deltas of the answer as they stream (formats: ``omni_rt.engine.tools.prompt``):
text that could still become a tool call (a partial ``<tool_call>`` tag, the first characters of a llama3
answer) is held back until it is clear, and a call's arguments are streamed as they are generated once its
name is known. ``ToolStream`` turns its events into the stage's stream payloads; ``UpstreamToolCalls`` does the
same for an OpenAI-compatible upstream's ``delta.tool_calls``. Hand-written: no well-kept library streams
partial tool calls out of a token stream (serving engines each carry their own parser), and the three formats
are small.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from omni_rt.contracts.payloads import TextDelta, ToolCallDelta, ToolCallDone
from omni_rt.engine.tools.preamble import PreambleMode, ToolPreamble
from omni_rt.engine.tools.schema import ToolFormat

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

    def __init__(self, fmt: ToolFormat, grammar: Any = None, preamble: PreambleMode = "off") -> None:
        self.parser = ToolCallParser(fmt)
        self.grammar = grammar
        self.preamble = ToolPreamble(preamble)  # the publisher applies it after the answer policy
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
