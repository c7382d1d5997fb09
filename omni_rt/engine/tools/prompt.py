"""Tool-prompt rendering: the tool list and tool messages put into the prompt the way the model was trained on.

Three call formats, picked from the model's chat template (``detect_format``):

- ``hermes`` — ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks (Qwen2.5's template and
  the Hermes family). Its template renders ``tools=`` itself.
- ``llama3`` — a bare JSON object ``{"name": ..., "parameters": {...}}`` as the whole answer (Llama 3.1/3.2
  templates, which render ``tools=`` themselves); several calls separated by ``;`` or newlines.
- ``own`` — a template without tool support (SmolLM2's plain ChatML one). There is no tool format the model
  was trained on, so a short tool prompt of ours goes into the system message and the model is asked for the
  Hermes block format, the most widespread open one; parsing is then the ``hermes`` parser
  (``omni_rt.engine.tools.parser``).
"""

from __future__ import annotations

import json
from typing import Any

from omni_rt.engine.tools.schema import ToolChoice, ToolFormat

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


def speakable(output: str) -> str:
    """A tool's output as plain words a voice can say and a small model can copy: a JSON object becomes
    "city: Chicago; weather: snowing; celsius: -3" (nested objects flattened, lists joined with commas, key
    underscores as spaces); anything else is kept as it is.

    Why: given the JSON, SmolLM2-135M read it back braces and quotes included ("The tool returned: {"city":
    ...") or answered with a garbled call ("To call name get order status arguments order it 42."); given the
    same facts as words, it puts them in its sentence (latency_bench.conversations: tool results used)."""
    try:
        value = json.loads(output)
    except (TypeError, ValueError):
        return output

    def words(v: Any) -> str:
        if isinstance(v, dict):
            return "; ".join(f"{str(k).replace('_', ' ')}: {words(x)}" for k, x in v.items())
        if isinstance(v, list):
            return ", ".join(words(x) for x in v)
        if isinstance(v, bool) or v is None:
            return {True: "yes", False: "no", None: "none"}[v]
        return str(v)

    return words(value) if isinstance(value, (dict, list)) else str(value)


def speakable_tool_messages(messages: list[dict]) -> list[dict]:
    """The chat with every tool output's content made ``speakable`` (for an upstream's own chat template)."""
    return [{**m, "content": speakable(m.get("content") or "")} if m.get("role") == "tool" else m for m in messages]


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
