"""Tool calls on the built-in engine: each tool request's call parser and grammar, the decode step's grammar
mask, and the grammars advanced by what was sampled.

A forced ``tool_choice`` decodes under a JSON-schema grammar; under ``auto`` once a tool's output is in, a
grammar leaves out the tools already answered (``tools.schema.callable_tools``). The grammar library
(``omni_rt.engine.tools.grammar``) is loaded on the first request that offers tools.
"""

from __future__ import annotations

from typing import Any

from omni_rt.engine.tools.grammar import forces_call
from omni_rt.engine.prompt.request import GenRequest
from omni_rt.engine.builtin.sequence import Sequence
from omni_rt.engine.tools.parser import ToolStream
from omni_rt.engine.tools.prompt import detect_format
from omni_rt.engine.tools.schema import callable_tools


class ToolDecoding:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int], device: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.device = device
        self._grammars = None  # constrained.GrammarFactory, built on the first request that offers tools

    def stream_for(self, req: GenRequest) -> ToolStream | None:
        """Parser (and, for a forced ``tool_choice``, grammar) of a request that offers tools."""
        if not req.tools or req.tool_choice == "none":
            return None
        if req.messages is None or req.output != "text":
            raise ValueError("'tools' need a 'messages' request with text output")
        fmt = detect_format(self.tokenizer)
        if self._grammars is None:  # a session offering tools may force a call next: get the grammar ready
            from omni_rt.engine.tools.grammar import GrammarFactory

            self._grammars = GrammarFactory(self.tokenizer, self.vocab_size, self.eos_token_ids)
            self._grammars.warm()
        grammar = None
        if forces_call(req.tool_choice):
            grammar = self._grammars.for_tools(fmt, req.tools, req.tool_choice, bool(req.parallel_tool_calls))
        elif (still := callable_tools(req.tools, req.tool_choice, req.messages)) is not None:
            grammar = self._grammars.for_answer(fmt, still)  # an answered call is not made again
        return ToolStream(fmt, grammar, req.tool_preamble)

    def mask(self, rows: list[Sequence]):
        """[B, V] bool mask of the rows' grammars, or None when no row is constrained."""
        if not any(s.tools is not None and s.tools.grammar is not None for s in rows):
            return None
        from omni_rt.engine.tools.grammar import batch_mask

        grammars = [s.tools.grammar if s.tools is not None else None for s in rows]
        return batch_mask(grammars, self.vocab_size, self.device)

    @staticmethod
    def advance(rows: list[Sequence], tokens: list[int]) -> None:
        """Each unfinished row's grammar takes its sampled token (before the next step's mask is built)."""
        for seq, tok in zip(rows, tokens):
            if seq.tools is not None and seq.tools.grammar is not None and not seq.finished:
                seq.tools.grammar.consume(tok)
