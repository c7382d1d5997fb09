"""What a tool request is: validation of ``tools``, ``tool_choice`` and tool-bearing chat messages, and the rule
for which tools an answer may still call. Every engine and the Realtime session config validate here, so a bad
tool is refused with the same field path (``tools[0].parameters.properties.x``) wherever it comes in.

Rendering the tools into a prompt is ``omni_rt.engine.tools.prompt``; reading calls back out of the generated
text is ``omni_rt.engine.tools.parser``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

ToolFormat = Literal["hermes", "llama3", "own"]  # the call formats (omni_rt.engine.tools.prompt)
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
    from omni_rt.engine.tools.grammar import schema_error

    err = schema_error(schema)
    if err:
        raise ValueError(f"{where} cannot be used for constrained decoding: {err}")


def parse_tool_choice(choice: Any, tools: list[dict] | None, field_name: str = "tool_choice", *,
                      required_needs_tools: bool = True) -> ToolChoice:
    """Normalise ``tool_choice``; a named function must be one of ``tools``. 'required' needs a tool unless
    ``required_needs_tools`` is False: a session's settings may arrive in pieces (LiveKit's realtime plugin sends
    its ``tool_choice`` in one ``session.update`` and its tools in the next), so a session's 'required' waits for
    its tools, and each request resolves it against the tools it then has (``applicable_tool_choice``)."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        if required_needs_tools and choice == "required" and not tools:
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


def applicable_tool_choice(choice: ToolChoice, tools: list[dict] | None) -> ToolChoice | None:
    """The choice one request runs under, from a session's ``choice`` and the tools it holds now: None (offer no
    tools: a plain answer) when there are none or the choice is 'none', else the choice itself."""
    if not tools or choice == "none":
        return None
    return choice


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
