"""Codec talker (GPU preset): an Orpheus-style Llama that speaks SNAC codes, clause by clause.

The stage is a StreamingSimpleScheduler on the outside (it takes the thinker's text stream before its
payload) and drives an inner AR scheduler on the inside, so codec-LM requests of every session share one
continuously batched engine. Each finished clause becomes one codec request (``prompt_ids``, ``output:
tokens``); its tokens are regrouped into 7-code SNAC frames and streamed to the vocoder as they arrive.
Clauses of one answer are generated in order; the answer's result leaves after its last clause.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_rt.backends.snac_codec import CODEBOOK_SIZE, CODES_PER_FRAME, ORPHEUS_CODE_OFFSET
from omni_rt.core.messages import IncomingMessage
from omni_rt.core.streaming_scheduler import StreamingSimpleScheduler, StreamState
from omni_rt.stages.clauses import ClauseSplitter
from omni_rt.stages.contracts import CodecFrames, text_of

# Orpheus special tokens (Llama-3 tokenizer + 10 added specials, then audio codes at ORPHEUS_CODE_OFFSET)
START_OF_HUMAN, END_OF_TEXT, END_OF_HUMAN = 128259, 128009, 128260
END_OF_SPEECH = 128258
ENGINE_WAKE = "__engine__"


@dataclass
class Answer:
    """Per-response codec state: clauses waiting, the one being generated, tokens not yet a whole frame."""

    queue: deque[str] = field(default_factory=deque)
    running: str | None = None  # inner request id
    clause_index: int = 0
    pending_tokens: list[int] = field(default_factory=list)
    frames_sent: int = 0
    complete: StreamState | None = None  # set once payload + stream_done arrived


class CodecTalkerScheduler(StreamingSimpleScheduler):
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        voice: str = "tara",
        code_offset: int = ORPHEUS_CODE_OFFSET,
        max_tokens_per_clause: int = 7 * 48,
        sampling: dict[str, Any] | None = None,
        ignore_eos: bool = False,
        first_max_words: int = 4,
    ) -> None:
        super().__init__(name="talker")
        self.engine = engine  # an AR scheduler (same protocol as every scheduler)
        self.tokenizer = tokenizer
        self.voice = voice
        self.code_offset = code_offset
        self.max_tokens_per_clause = max_tokens_per_clause
        self.sampling = sampling or {"temperature": 0.6, "top_p": 0.95, "seed": 0}
        self.ignore_eos = ignore_eos
        self.first_max_words = first_max_words
        self.answers: dict[str, Answer] = {}
        self.inner_owner: dict[str, str] = {}

    # ---- lifecycle: the inner engine wakes this thread through our own inbox ----------------------
    def start(self) -> None:
        self.engine.outbox.set_waker(lambda: self.inbox.put(IncomingMessage("", "stream_chunk", None, ENGINE_WAKE)))
        self.engine.start()
        super().start()

    def stop(self) -> None:
        self.engine.stop()
        super().stop()

    def live_state(self) -> int:
        return len(self.states) + len(self.answers) + self.engine.live_state()

    def prompt_ids(self, clause: str) -> list[int]:
        ids = self.tokenizer.encode(f"{self.voice}: {clause}", add_special_tokens=True)
        return [START_OF_HUMAN, *ids, END_OF_TEXT, END_OF_HUMAN]

    # ---- machinery ---------------------------------------------------------------------------------
    def _handle(self, msg: IncomingMessage) -> None:
        if msg.source == ENGINE_WAKE:
            self._drain_engine()
            return
        if msg.type == "abort" and msg.data != "__stop__":
            ans = self.answers.pop(msg.request_id, None)
            if ans is not None and ans.running is not None:
                self.inner_owner.pop(ans.running, None)
                self.engine.abort(ans.running)
        super()._handle(msg)

    def _answer(self, request_id: str) -> Answer:
        ans = self.answers.get(request_id)
        if ans is None:
            ans = self.answers[request_id] = Answer()
        return ans

    def _splitter(self, state: StreamState) -> ClauseSplitter:
        sp = state.user.get("splitter")
        if sp is None:
            sp = state.user["splitter"] = ClauseSplitter(first_max_words=self.first_max_words)
        return sp

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        text = text_of(data)
        self._enqueue(request_id, self._splitter(state).push(text))

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        self._enqueue(request_id, self._splitter(state).flush())

    def on_complete(self, request_id: str, state: StreamState) -> None:
        ans = self._answer(request_id)
        ans.complete = state
        self._maybe_finish(request_id, ans)

    def _enqueue(self, request_id: str, clauses: list[str]) -> None:
        ans = self._answer(request_id)
        ans.queue.extend(clauses)
        self._launch(request_id, ans)

    def _launch(self, request_id: str, ans: Answer) -> None:
        if ans.running is not None or not ans.queue:
            return
        clause = ans.queue.popleft()
        inner_id = f"{request_id}#{ans.clause_index}"
        ans.clause_index += 1
        ans.running = inner_id
        ans.pending_tokens = []
        self.inner_owner[inner_id] = request_id
        self.engine.inbox.put(IncomingMessage(inner_id, "new_request", {
            "prompt_ids": self.prompt_ids(clause), "output": "tokens", "max_tokens": self.max_tokens_per_clause,
            "stop_token_ids": [END_OF_SPEECH], "ignore_eos": self.ignore_eos, **self.sampling,
        }))

    def _drain_engine(self) -> None:
        while True:
            try:
                out = self.engine.outbox.get_nowait()
            except Exception:  # queue.Empty
                return
            rid = self.inner_owner.get(out.request_id)
            ans = self.answers.get(rid) if rid is not None else None
            if ans is None:
                continue  # output of an aborted answer
            if out.type == "stream":
                self._emit_frames(rid, ans, out.data.token_ids)
            elif out.type == "result":
                self.inner_owner.pop(out.request_id, None)
                ans.running = None
                self._launch(rid, ans)
                self._maybe_finish(rid, ans)
            elif out.type == "error":
                self.answers.pop(rid, None)
                self.states.pop(rid, None)
                self.emit_error(rid, f"codec LM: {out.data}")

    def _emit_frames(self, request_id: str, ans: Answer, token_ids: list[int]) -> None:
        for tok in token_ids:
            code = tok - self.code_offset
            if 0 <= code < CODES_PER_FRAME * CODEBOOK_SIZE:  # skip specials (start/end of speech...)
                ans.pending_tokens.append(tok)
        whole = len(ans.pending_tokens) // CODES_PER_FRAME * CODES_PER_FRAME
        if not whole:
            return
        toks = np.asarray(ans.pending_tokens[:whole], dtype=np.int64).reshape(-1, CODES_PER_FRAME)
        ans.pending_tokens = ans.pending_tokens[whole:]
        position = np.arange(CODES_PER_FRAME) * CODEBOOK_SIZE
        frames = np.clip(toks - self.code_offset - position, 0, CODEBOOK_SIZE - 1)  # a code in the wrong slot is clamped
        ans.frames_sent += len(frames)
        self.emit(request_id, "stream", CodecFrames(frames))

    def _maybe_finish(self, request_id: str, ans: Answer) -> None:
        if ans.complete is None or ans.running is not None or ans.queue:
            return
        del self.answers[request_id]
        payload = ans.complete.payload if isinstance(ans.complete.payload, dict) else {"text": str(ans.complete.payload)}
        self.emit(request_id, "result", {**{k: v for k, v in payload.items() if k != "token_ids"}, "frames": ans.frames_sent})


def create_codec_talker(
    model: str,
    tokenizer: str | None = None,
    device: str = "cuda",
    dtype: str = "bfloat16",
    max_batch_size: int = 32,
    voice: str = "tara",
    max_tokens_per_clause: int = 7 * 48,
    ignore_eos: bool = False,
    temperature: float = 0.6,
    **engine_kwargs: Any,
) -> CodecTalkerScheduler:
    from omni_rt.engine.factory import create_ar_scheduler

    engine = create_ar_scheduler(model, device=device, dtype=dtype, max_batch_size=max_batch_size, name="codec_lm",
                                 prefix_reuse=False, tokenizer=tokenizer, **engine_kwargs)
    tok = getattr(engine, "tokenizer", None)
    if tok is None:
        raise ValueError(f"stage 'talker' field 'tokenizer': no tokenizer found for codec model '{model}'")
    return CodecTalkerScheduler(engine, tok, voice=voice, max_tokens_per_clause=max_tokens_per_clause,
                                ignore_eos=ignore_eos, sampling={"temperature": temperature, "top_p": 0.95, "seed": 0,
                                          "repetition_penalty": 1.1})  # Orpheus loops on codes below 1.1
