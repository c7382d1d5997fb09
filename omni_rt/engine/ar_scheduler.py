"""The AR scheduler: continuous batching over the built-in engine, with async decode lookahead and
per-session prefix reuse. Speaks the stage protocol (inbox/outbox/start/stop/abort/live_state).

One loop iteration, between two decode steps:
  1. drain the inbox (blocking only when idle, so a lone request is admitted at once: idle-immediate);
  2. reap: free the slots of finished/aborted requests (keeping a session's KV for its next turn) and
     compact live requests into slots ``0..B-1``;
  3. admit: prefill waiting requests into free slots (reusing a session's cached prefix), publish their
     first token;
  4. decode one step for all live rows.
With ``async_decode`` step 4 runs in a worker thread and the host work of the *previous* step (token
accounting, detokenization, stop checks, publishing ``stream`` chunks) overlaps it — torch releases the GIL
inside ops. A request found finished during that host work already took part in the step in flight; its
lookahead token is simply discarded and its slot freed at the next reap. Greedy outputs are identical with
or without lookahead: the step inputs are the same tokens either way.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from omni_rt.core.messages import IncomingMessage
from omni_rt.core.scheduler import ThreadedScheduler
from omni_rt.engine.answer_policy import AnswerPolicy
from omni_rt.engine.detokenize import TextStream
from omni_rt.engine.language import check_languages, steer_messages, vocab_bias
from omni_rt.engine.prefix_cache import PrefixStore, common_prefix_len
from omni_rt.engine.request import parse_answer_policy, parse_request, parse_sampling
from omni_rt.engine.sequence import Sequence
from omni_rt.engine.tools import ToolStream, detect_format, render_prompt
from omni_rt.engine.torch_engine import TorchEngine
from omni_rt.stages.contracts import TextDelta

log = logging.getLogger(__name__)


class ARScheduler(ThreadedScheduler):
    def __init__(
        self,
        engine: TorchEngine,
        tokenizer: Any = None,
        *,
        name: str = "ar",
        async_decode: bool = True,
        prefix_reuse: bool = True,
        kv_budget_tokens: int = 32768,
        default_max_tokens: int = 256,
        batch_wait_ms: float = 0.0,
        batch_wait_when_idle: bool = False,
        sampling: dict[str, Any] | None = None,
        answer_policy: dict[str, Any] | None = None,
        languages: list[str] | None = None,
    ) -> None:
        """``sampling``: the preset's default sampling keys (a request's own keys win); ``answer_policy``: the
        preset's default voice answer policy for text requests; ``languages``: what the talker can speak
        (prompt + vocabulary steering, see ``omni_rt.engine.language``)."""
        super().__init__()
        # Admission window for an idle engine, as in SimpleScheduler: idle-immediate by default (a lone
        # request prefills at once); the window arms only once a second request is waiting, or always with
        # batch_wait_when_idle=True (the classic batcher, kept for comparisons).
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.batch_wait_when_idle = batch_wait_when_idle
        self.name = name
        self.engine = engine
        engine.reset()
        self.tokenizer = tokenizer
        self.async_decode = async_decode
        self.prefix_reuse = prefix_reuse
        self.prefix_store = PrefixStore(kv_budget_tokens)
        self.default_max_tokens = default_max_tokens
        parse_sampling({}, sampling)  # a bad preset default fails at start-up, not on every request
        self.sampling_defaults = dict(sampling or {})
        self.default_policy = parse_answer_policy(answer_policy)
        self.languages = check_languages(languages)
        bias = vocab_bias(tokenizer, self.languages, engine.vocab_size)
        engine.sampler.vocab_bias = None if bias is None else bias.to(engine.device)
        self._policies: dict[str, AnswerPolicy] = {}
        eos = set(engine.eos_token_ids)
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.metrics = {"decode_steps": 0, "decode_s": 0.0, "decode_rows": 0, "prefill_tokens": 0, "prefill_s": 0.0}
        self._waiting: deque[Sequence] = deque()
        self._rows: list[Sequence] = []  # invariant: self._rows[i].slot == i
        self._live: dict[str, Sequence] = {}
        self._grammars = None  # constrained.GrammarFactory, built on the first forced tool choice

    def live_state(self) -> int:
        return len(self._live)

    # ------------------------------------------------------------------ loop
    def run_loop(self) -> None:
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-decode") if self.async_decode else None
        pending: tuple[list[Sequence], list[int]] | None = None  # a step whose host work has not run yet
        try:
            while self.running:
                try:
                    pending = self._iteration(pool, pending)
                except Exception as exc:  # a bug must not wedge the stage: fail what is in hand, keep serving
                    log.exception("%s: scheduler iteration failed", self.name)
                    pending = None
                    self._fail_all(exc)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
            self._fail_all("scheduler stopped before the request finished", code="shutdown")

    def _iteration(self, pool: ThreadPoolExecutor | None, pending):
        self._drain_inbox(block=not self._rows and not self._waiting)
        if not self.running:
            return None
        self._reap()
        self._admit()
        self._reap()  # requests that finished on their first token
        if not self._rows:
            return None  # every row of a pending step has finished: nothing left to publish
        rows = list(self._rows)
        if pool is None:
            tokens = self._run_step(rows)
            if tokens is not None:
                self._host_work(rows, tokens)
            return None
        future = pool.submit(self._decode, rows)  # step N+1 runs while ...
        if pending is not None:
            self._host_work(*pending)  # ... the host work of step N happens here
        tokens = self._run_step(rows, future)
        return (rows, tokens) if tokens is not None else None

    def _fail_all(self, exc: BaseException | str, code: str = "internal_error") -> None:
        for rid, seq in list(self._live.items()):
            if not seq.finished:
                self.emit_error(rid, exc, code=code)
        self._live.clear()
        self._policies.clear()
        self._waiting.clear()
        self._rows = []
        self.engine.reset()

    def _decode(self, rows: list[Sequence]) -> list[int]:
        t0 = time.perf_counter()
        mask = self._grammar_mask(rows)
        kw = {"mask": mask} if mask is not None else {}
        tokens = self.engine.decode(len(rows), None, None, **kw)  # sampling state lives per slot in the engine
        m = self.metrics
        m["decode_steps"] += 1
        m["decode_rows"] += len(rows)
        m["decode_s"] += time.perf_counter() - t0
        return tokens

    def _run_step(self, rows: list[Sequence], future: Future | None = None) -> list[int] | None:
        """Finish a decode step; a failing step fails the requests in it (it cannot be attributed to one)."""
        try:
            tokens = future.result() if future is not None else self._decode(rows)
            for seq, tok in zip(rows, tokens):  # grammars advance before the next step's mask is built
                if seq.tools is not None and seq.tools.grammar is not None and not seq.finished:
                    seq.tools.grammar.consume(tok)
            return tokens
        except Exception as exc:
            for seq in rows:
                if not seq.finished:
                    seq.finish_reason = "error"
                    self.emit_error(seq.request_id, exc, code="decode_error")
            return None

    # ------------------------------------------------------------------ inbox
    def _drain_inbox(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
        if block and self.batch_wait_s > 0 and self._waiting:
            self._wait_for_company()

    def _wait_for_company(self) -> None:
        """The engine was idle and work arrived: wait out the window (see ``batch_wait_ms``) for more."""
        deadline: float | None = None
        while self.running and len(self._waiting) < self.engine.max_batch_size:
            if deadline is None and (self.batch_wait_when_idle or len(self._waiting) >= 2):
                deadline = time.monotonic() + self.batch_wait_s
            if deadline is None:
                return  # a lone request on an idle engine: prefill now
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                self._handle(self.inbox.get(timeout=remaining))
            except queue.Empty:
                return

    def _handle(self, msg: IncomingMessage) -> None:
        rid = msg.request_id
        if msg.type == "new_request":
            if rid in self._live:
                self.emit_error(rid, f"request id {rid!r} is already running", code="duplicate_request")
                return
            try:
                seq = self._make_sequence(rid, msg.data)
            except Exception as exc:
                self.emit_error(rid, exc, code="bad_request")
                return
            self._live[rid] = seq
            self._waiting.append(seq)
        elif msg.type == "abort":
            seq = self._live.get(rid)
            if seq is None:
                # a closed session is aborted by its id: forget the KV kept for its next turn
                self.prefix_store.drop(rid)
                return
            if seq.finished:
                return
            seq.finish_reason = "abort"
            if seq in self._waiting:
                self._waiting.remove(seq)
                del self._live[rid]
            self.emit(rid, "result", self._result(seq))  # a running one frees its slot at the next reap
            if rid not in self._live:
                self._policies.pop(rid, None)
        else:
            self.emit_error(
                rid, f"{msg.type} is not accepted: send the whole prompt as new_request", code="unsupported"
            )

    def _make_sequence(self, rid: str, data: Any) -> Sequence:
        req = parse_request(data, self.default_max_tokens, self.sampling_defaults, self.default_policy)
        tok = self.tokenizer
        if req.messages is not None:
            req.messages = steer_messages(req.messages, self.languages)
            if tok is None:
                raise ValueError("'messages' need a tokenizer; this engine has none (send 'prompt_ids')")
            text = render_prompt(tok, req.messages, req.tools, req.tool_choice)
            prompt_ids = list(tok(text, add_special_tokens=False)["input_ids"])
        else:
            prompt_ids = req.prompt_ids
        if max(prompt_ids) >= self.engine.vocab_size:
            raise ValueError(f"token id {max(prompt_ids)} is outside the model's vocabulary ({self.engine.vocab_size})")
        if req.stop and tok is None:
            raise ValueError("'stop' strings need a tokenizer")
        room = self.engine.max_seq_len - len(prompt_ids) - 1  # one position spare for the lookahead step
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit max_seq_len={self.engine.max_seq_len}")
        req.max_tokens = min(req.max_tokens, room)
        stop_ids = frozenset(req.stop_token_ids) | (frozenset() if req.ignore_eos else self.eos_token_ids)
        text = TextStream(tok, req.stop) if tok is not None and req.output == "text" else None
        if text is not None and req.answer_policy is not None:
            self._policies[rid] = AnswerPolicy(req.answer_policy)
        seq = Sequence(rid, req, prompt_ids, stop_ids, text)
        seq.tools = self._tool_stream(req)
        return seq

    def _tool_stream(self, req) -> ToolStream | None:
        """Parser (and, for a forced ``tool_choice``, grammar) of a request that offers tools."""
        if not req.tools or req.tool_choice == "none":
            return None
        if req.messages is None or req.output != "text":
            raise ValueError("'tools' need a 'messages' request with text output")
        fmt = detect_format(self.tokenizer)
        if self._grammars is None:  # a session offering tools may force a call next: get the grammar ready
            from omni_rt.engine.constrained import GrammarFactory

            self._grammars = GrammarFactory(self.tokenizer, self.engine.vocab_size, self.eos_token_ids)
            self._grammars.warm()
        grammar = None
        if req.tool_choice == "required" or isinstance(req.tool_choice, dict):
            grammar = self._grammars.for_tools(fmt, req.tools, req.tool_choice, bool(req.parallel_tool_calls))
        return ToolStream(fmt, grammar)

    def _grammar_mask(self, rows: list[Sequence]):
        """[B, V] bool mask of the rows' grammars, or None when no row is constrained."""
        if not any(s.tools is not None and s.tools.grammar is not None for s in rows):
            return None
        from omni_rt.engine.constrained import batch_mask

        grammars = [s.tools.grammar if s.tools is not None else None for s in rows]
        return batch_mask(grammars, self.engine.vocab_size, self.engine.device)

    # ------------------------------------------------------------------ slots
    def _admit(self) -> None:
        while self._waiting and len(self._rows) < self.engine.max_batch_size:
            seq = self._waiting.popleft()
            slot = len(self._rows)
            try:
                t0 = time.perf_counter()
                start = self._restore_prefix(seq, slot)
                mask = self._grammar_mask([seq])
                kw = {"mask": mask} if mask is not None else {}
                tok = self.engine.prefill(slot, seq.prompt_ids[start:], start, seq.req.sampling, None, **kw)
                if mask is not None:
                    seq.tools.grammar.consume(tok)
                self.metrics["prefill_tokens"] += len(seq.prompt_ids) - start
                self.metrics["prefill_s"] += time.perf_counter() - t0
            except Exception as exc:
                self.engine.release(slot)
                del self._live[seq.request_id]
                self._policies.pop(seq.request_id, None)
                self.emit_error(seq.request_id, exc, code="prefill_error")
                continue
            seq.slot = slot
            self._rows.append(seq)
            self._publish(seq, tok)

    def _restore_prefix(self, seq: Sequence, slot: int) -> int:
        """Load the longest still-matching prefix of the session's cached KV; returns its length."""
        sid = seq.req.session_id
        if not (self.prefix_reuse and sid):
            return 0
        entry = self.prefix_store.take(sid)
        if entry is None:
            return 0
        n = min(common_prefix_len(entry.token_ids, seq.prompt_ids), len(seq.prompt_ids) - 1)
        if n > 0:  # anything past n (an edited/truncated history) is simply not copied: the cache is cropped
            self.engine.load_kv(slot, entry.kv, n)
            seq.cached_tokens = n
        return max(n, 0)

    def _reap(self) -> None:
        if not any(s.finished for s in self._rows):
            return
        alive: list[Sequence] = []
        for seq in self._rows:
            if not seq.finished:
                alive.append(seq)
                continue
            sid = seq.req.session_id
            if self.prefix_reuse and sid and seq.finish_reason != "error":
                fed = seq.fed_tokens(self.engine.lengths[seq.slot])
                self.prefix_store.put(sid, fed, self.engine.export_kv(seq.slot, len(fed)))
            self.engine.release(seq.slot)
            self._live.pop(seq.request_id, None)
            self._policies.pop(seq.request_id, None)
        holes = sorted(set(range(len(alive))) - {s.slot for s in alive})
        movers = [s for s in alive if s.slot >= len(alive)]
        for hole, seq in zip(holes, movers):
            self.engine.move(seq.slot, hole)
            seq.slot = hole
        self._rows = sorted(alive, key=lambda s: s.slot)

    # ------------------------------------------------------------------ host work
    def _host_work(self, rows: list[Sequence], tokens: list[int]) -> None:
        for seq, tok in zip(rows, tokens):
            if not seq.finished:  # a finished row's lookahead token is discarded
                self._publish(seq, tok)

    def _publish(self, seq: Sequence, tok: int) -> None:
        try:
            text, ids = seq.on_token(tok)
        except Exception as exc:
            seq.finish_reason = "error"
            self.emit_error(seq.request_id, exc, code="detokenize_error")
            return
        # tool calls are split out of the text first (the talker only sees TextDelta); the voice answer policy
        # then decides what of the spoken text leaves the thinker, and when the answer stops
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
        for chunk in chunks:
            if not isinstance(chunk, TextDelta) or chunk.text or chunk.token_ids:
                self.emit(seq.request_id, "stream", chunk)
        if seq.finished:
            self.emit(seq.request_id, "result", self._result(seq))

    def _result(self, seq: Sequence) -> dict[str, Any]:
        """The result payload; its text is what the policy released (exactly what was streamed)."""
        out = seq.result()
        policy = self._policies.get(seq.request_id)
        if policy is not None:
            out["text"] = policy.spoken
        return out
