"""JSON-schema constrained decoding for forced tool choice (``required`` or a named function).

The library is ``llguidance`` (Microsoft; the grammar engine inside llama.cpp, vLLM and SGLang): a wheel with
no dependencies, a Hugging Face fast-tokenizer bridge, and JSON schemas embedded in a Lark grammar
(``%json {...}``), so one grammar covers the call's fixed framing (``<tool_call>``, the name) *and* the
arguments. Measured here: ~0.3 ms per token for the mask with SmolLM2's 49k vocabulary, 0.35 s once per
tokenizer. ``outlines-core`` compiles a whole-vocabulary index per schema up front (seconds for a new tool
list, which a realtime session may send at any ``session.update``); ``xgrammar`` is equally fast but needs
its own tokenizer-info setup and has no Lark-style framing; llguidance computes masks lazily.

A ``Grammar`` belongs to one request: ``allowed_into(bitmask, row)`` writes the row of the token bitmask for
the next step, ``consume(token)`` advances it. ``bool_mask`` turns a ``[B, ceil(V/32)]`` int32 bitmask into
the ``[B, V]`` bool mask the engine applies before sampling (rows without a grammar stay all-True).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch only where a mask is built: the llama.cpp thinker imports this for the schemas
    import torch

log = logging.getLogger(__name__)

# Compact JSON (", " / ": ", no free whitespace): a small model under a grammar that admits any whitespace
# can spend its whole budget on newlines.
_JSON_OPTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_PARALLEL_CALLS = 8


def schema_error(schema: dict) -> str:
    """'' when llguidance can compile ``schema``, else its message (unsupported keywords, bad types)."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTS)
        return llguidance.LLMatcher.validate_grammar(grammar, None)
    except Exception as exc:
        return str(exc)


def closed(schema: Any) -> Any:
    """A copy where every object schema that does not say otherwise has ``additionalProperties: false`` (and
    every required, otherwise unbounded string ``minLength: 1``).

    As OpenAI's strict mode does: JSON Schema admits any extra key by default, and a small model under the
    grammar then fills its budget with invented keys (SmolLM2 echoed the schema itself as arguments)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (closed(v) if k in _SUBSCHEMAS else v) for k, v in schema.items()}
    for k in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(out.get(k), dict):
            out[k] = {name: closed(sub) for name, sub in out[k].items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    # a required string the schema does not bound gets at least one character: under a grammar a small model
    # otherwise takes the shortest way out (SmolLM2 on llama.cpp called get_weather with city "")
    props = out.get("properties") if isinstance(out.get("properties"), dict) else {}
    for name in out.get("required") or ():
        sub = props.get(name)
        if isinstance(sub, dict) and sub.get("type") == "string" and not ({"minLength", "enum", "const", "pattern", "format"} & sub.keys()):
            props[name] = {**sub, "minLength": 1}
    return out


_SUBSCHEMAS = {"items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "additionalProperties", "contains"}


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON escapes


def forces_call(tool_choice: Any) -> bool:
    """Whether ``tool_choice`` makes the answer a call: ``required`` or a named function."""
    return tool_choice == "required" or isinstance(tool_choice, dict)


def forced_tools(tools: list[dict], tool_choice: Any) -> list[dict]:
    """The tools a forced ``tool_choice`` allows: the named one, or all of them for ``required``."""
    if isinstance(tool_choice, dict):
        tools = [t for t in tools if t["name"] == tool_choice["name"]]
    if not tools:
        raise ValueError("tool_choice forces a call but no tool is offered")
    return tools


def _call_rules(fmt: str, tools: list[dict]) -> tuple[str, list[str]]:
    """The alternatives (``call0 | call1 ...``) and rules of one call of any of ``tools``, names first so the
    parser can stream the arguments; ``fmt`` is the parser format (``hermes``/``own`` blocks, ``llama3`` bare
    JSON objects)."""
    key = "parameters" if fmt == "llama3" else "arguments"
    rules = []
    for i, t in enumerate(tools):
        schema = closed(t.get("parameters") or {"type": "object", "properties": {}})
        schema["x-guidance"] = _JSON_OPTS
        head = '{"name": ' + json.dumps(t["name"]) + f', "{key}": '
        if fmt == "llama3":
            rules.append(f"call{i}: {_lit(head)} args{i} {_lit('}')}")
        else:
            open_, close = _lit("<tool_call>\n" + head), _lit("}\n</tool_call>")
            rules.append(f"call{i}: {open_} args{i} {close}")
        rules.append(f"args{i}: %json {json.dumps(schema)}")
    return " | ".join(f"call{i}" for i in range(len(tools))), rules


def call_grammar(fmt: str, tools: list[dict], tool_choice: Any, parallel: bool = False) -> str:
    """A Lark grammar for the whole answer: one call (of the named function, or of any tool for
    ``required``), or with ``parallel`` (``required`` only) 1..8 calls. One by default: a greedy small model
    after its first call keeps repeating it until the token limit."""
    tools = forced_tools(tools, tool_choice)
    alts, rules = _call_rules(fmt, tools)
    sep = _lit(";\n" if fmt == "llama3" else "\n")
    if isinstance(tool_choice, dict):
        start = "start: call0"
    elif not parallel:
        start = f"start: {alts}"
    else:
        start = f"start: call ({sep} call){{0,{MAX_PARALLEL_CALLS - 1}}}\ncall: {alts}"
    return "\n".join([start, *rules]) + "\n"


# A spoken answer: no call markup anywhere ("<" opens a hermes block), and it starts with a word, not with
# whitespace (then end-of-sequence would leave nothing to say) or "{"/";" (how a llama3 call starts).
SPOKEN_TEXT = r"/[^\s<{;][^<]*/"


def answer_grammar(fmt: str, tools: list[dict]) -> str:
    """``auto`` once a tool's output is in (``tools.schema.callable_tools``): the answer is spoken text, or one call
    of a tool still callable. With none left this masks the call opener: the answer is what the user hears."""
    if not tools:
        return f"start: TEXT\nTEXT: {SPOKEN_TEXT}\n"
    alts, rules = _call_rules(fmt, tools)
    return "\n".join([f"start: TEXT | {alts}", *rules, f"TEXT: {SPOKEN_TEXT}"]) + "\n"


class GrammarFactory:
    """Builds per-request grammars over one tokenizer.

    The llguidance tokenizer takes ~1 s to build (and holds the GIL part of that time), so ``warm()`` builds
    it on a background thread as soon as a request offers tools; a forced call waits for it only if it
    comes first."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: set[int] | frozenset[int]) -> None:
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos = sorted(eos_token_ids)
        self._ll = None
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None

    def warm(self) -> None:
        if self._ll is None and self._warming is None:
            self._warming = threading.Thread(target=self._tokenizer, name="llguidance-tokenizer", daemon=True)
            self._warming.start()

    def _tokenizer(self):
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                tok = self.hf_tokenizer
                eos = tok.eos_token_id if tok.eos_token_id is not None else self.eos[0]
                self._ll = llguidance.hf.from_tokenizer(tok, n_vocab=self.vocab_size, eos_token=eos)
            return self._ll

    def for_tools(self, fmt: str, tools: list[dict], tool_choice: Any, parallel: bool = False) -> "Grammar":
        return Grammar(self._tokenizer(), call_grammar(fmt, tools, tool_choice, parallel), self.eos)

    def for_answer(self, fmt: str, callable_tools: list[dict]) -> "Grammar":
        return Grammar(self._tokenizer(), answer_grammar(fmt, callable_tools), self.eos)


class Grammar:
    """One request's matcher. After the grammar completes only end-of-sequence tokens are allowed."""

    def __init__(self, ll_tokenizer: Any, lark: str, eos_ids: list[int]) -> None:
        import llguidance

        self.matcher = llguidance.LLMatcher(ll_tokenizer, lark, log_level=1)
        if self.matcher.is_error():
            raise ValueError(f"tool grammar does not compile: {self.matcher.get_error()}")
        self.eos_ids = eos_ids

    def allowed_into(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bits for the next step into ``bitmask[row]`` (int32, CPU)."""
        if self.matcher.is_stopped() or self.matcher.is_error():
            bitmask[row] = 0
            for t in self.eos_ids:  # finished (or broken): end the answer
                bitmask[row, t // 32] |= _bit(t)
            return
        # what llguidance.torch.fill_next_token_bitmask does, without importing that module: its
        # @torch.compile decorator pulls in torch._dynamo, seconds on the first forced call (docs/tuning-cpu.md)
        v = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())

    def consume(self, token: int) -> None:
        if not self.matcher.is_stopped() and not self.matcher.consume_token(token):
            log.warning("grammar rejected token %d: %s", token, self.matcher.get_error())


def _bit(t: int) -> int:
    b = 1 << (t % 32)
    return b - (1 << 32) if b >= 1 << 31 else b  # as int32


def batch_mask(grammars: list[Grammar | None], vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """The ``[B, V]`` bool mask for one step (``None`` when no row is constrained: no cost at all)."""
    import torch

    if all(g is None for g in grammars):
        return None
    words = (vocab_size + 31) // 32
    bits = torch.full((len(grammars), words), -1, dtype=torch.int32)  # -1: every token allowed
    for row, g in enumerate(grammars):
        if g is not None:
            g.allowed_into(bits, row)
    return bool_mask(bits, vocab_size).to(device, non_blocking=True)


def bool_mask(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, W]`` int32 bitmask (bit ``t % 32`` of word ``t // 32``) -> ``[B, V]`` bool.

    numpy's unpackbits (little-endian bytes, little bit order = llguidance's layout): 0.6 ms for 4 x 49k
    tokens, where broadcasting shifts in torch took 50 ms on this CPU."""
    import torch

    assert bits.dtype == torch.int32 and bits.is_contiguous()
    flat = np.unpackbits(bits.numpy().view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(flat.view(np.bool_))[:, :vocab_size]
