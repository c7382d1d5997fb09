"""Output processing for the AR scheduler: each sampled token becomes the stage's ``stream`` and ``result``
messages.

Text requests: the detokenized delta is split into speakable text and tool calls first (the talker only sees
``TextDelta``; ``tools.parser.ToolStream``), then the voice answer policy (``omni_rt.engine.prompt.answer_policy``)
decides what of the spoken text leaves the thinker, and when the answer stops. ``output: tokens`` requests (a
codec talker) leave as ``TokenDelta`` chunks of ``token_chunk`` tokens.
"""

from __future__ import annotations

from typing import Any, Callable

from omni_rt.contracts.payloads import TextDelta, TokenDelta
from omni_rt.engine.prompt.answer_policy import AnswerPolicy
from omni_rt.engine.builtin.sequence import Sequence

Emit = Callable[..., None]  # (request_id, type, data) -> None, as ThreadedScheduler.emit


class TokenPublisher:
    """Publishes tokens through the scheduler's ``emit``/``emit_error``; holds each text request's policy."""

    def __init__(self, emit: Emit, emit_error: Emit) -> None:
        self._emit = emit
        self._emit_error = emit_error
        self._policies: dict[str, AnswerPolicy] = {}

    def open(self, seq: Sequence) -> None:
        """A new request: a text answer with an answer policy gets its own policy state."""
        if seq.text is not None and seq.req.answer_policy is not None:
            self._policies[seq.request_id] = AnswerPolicy(seq.req.answer_policy)

    def forget(self, request_id: str) -> None:
        self._policies.pop(request_id, None)

    def clear(self) -> None:
        self._policies.clear()

    def publish(self, seq: Sequence, tok: int) -> None:
        try:
            text, ids = seq.on_token(tok)
        except Exception as exc:
            seq.finish_reason = "error"
            self._emit_error(seq.request_id, exc, code="detokenize_error")
            return
        # tool calls are split out of the text first (the talker only sees TextDelta); the voice answer policy
        # then decides what of the spoken text leaves the thinker, and when the answer stops
        if seq.req.output == "tokens":
            pending = len(seq.out_ids) - seq.tokens_streamed
            if pending and (pending >= seq.req.token_chunk or seq.finished):
                self._emit(seq.request_id, "stream", TokenDelta(seq.out_ids[seq.tokens_streamed:]))
                seq.tokens_streamed = len(seq.out_ids)
            if seq.finished:
                self._emit(seq.request_id, "result", self.result(seq))
            return
        chunks = seq.tools.chunks(text, ids, final=seq.finished) if seq.tools is not None else [TextDelta(text, ids)]
        policy = self._policies.get(seq.request_id)
        if policy is not None:
            stop = False
            for chunk in chunks:
                if isinstance(chunk, TextDelta):
                    chunk.text, stop = ("", stop) if stop else policy.feed(chunk.text)
            if stop and not seq.finished:
                seq.finish_reason = "policy"
            elif seq.finished and not stop:
                chunks.append(TextDelta(policy.finish(seq.finish_reason), []))
        if seq.tools is not None:  # a spoken phrase before a call the model wrote no words for (tools.preamble)
            chunks = seq.tools.preamble.apply(chunks)
        for chunk in chunks:
            if not isinstance(chunk, TextDelta) or chunk.text or chunk.token_ids:
                self._emit(seq.request_id, "stream", chunk)
        if seq.finished:
            self._emit(seq.request_id, "result", self.result(seq))

    def result(self, seq: Sequence) -> dict[str, Any]:
        """The result payload; its text is what the policy released (exactly what was streamed)."""
        out = seq.result()
        policy = self._policies.get(seq.request_id)
        if policy is not None:
            out["text"] = (seq.tools.preamble.text if seq.tools is not None else "") + policy.spoken
        return out
