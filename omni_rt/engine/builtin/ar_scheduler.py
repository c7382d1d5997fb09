"""The AR scheduler: continuous batching over the built-in engine, with async decode lookahead and
per-session prefix reuse. Speaks the stage protocol (inbox/outbox/start/stop/abort/live_state).

One loop iteration, between two decode steps:
  1. drain the inbox (blocking only when idle, so a lone request is admitted at once: idle-immediate);
  2. reap: free the slots of finished/aborted requests (keeping a session's KV for its next turn) and
     compact live requests into slots ``0..B-1``;
  3. admit: prefill waiting requests into free slots (reusing a session's cached prefix), publish their
     first token. A short prompt (new tokens that fit one chunk) prefills whole, ahead of long ones; a long
     one is *chunked*: at most ``prefill_chunk_tokens`` per iteration (fewer while answers are decoding, none
     while a short request is still getting its first tokens), the request with the fewest tokens left first,
     so a 3000-token prompt costs the running decodes (and a short request arriving meanwhile) one chunk per
     step instead of a multi-second stall; what arrived during that prefill is admitted too, before the
     decode step. A request being prefilled holds a slot above the decode rows and joins them when its last
     chunk is done. Concurrent prefills (several new sessions) share one forward, rows x longest chunk within
     the same bound;
  4. decode one step for all live rows.
With ``async_decode`` step 4 runs in a worker thread and the host work of the *previous* step (token
accounting, detokenization, stop checks, publishing ``stream`` chunks) overlaps it — torch releases the GIL
inside ops. A request found finished during that host work already took part in the step in flight; its
lookahead token is simply discarded and its slot freed at the next reap. Greedy outputs are identical with
or without lookahead: the step inputs are the same tokens either way.

History is trimmed by tokens, not by item count (``omni_rt.engine.prompt.history.HistoryWindow``, shared with the
remote and llama.cpp schedulers): a session keeps at most its share of the KV (``kv_budget_tokens`` over the
slots, or ``history_tokens``), the oldest turns dropped in big steps so the kept prefix — and its cached KV —
stays the same for several turns.

As a ``stream_to`` target (the codec LM after ``omni_rt.stages.talker.speech_prompts``) each stream chunk is a
``SpeechPrompt``: a request of its own, run in order per response and batched with everything else
(``omni_rt.engine.builtin.segments``); the tokens of ``output: tokens`` requests leave as ``TokenDelta``.

The scheduler is the policy (admission, prefill chunking, reaping, prefix restore); what a request becomes
is ``sequence_builder.SequenceBuilder`` (prompt fitting, budgets, limits), how a tool request decodes is
``tool_decoding.ToolDecoding`` (parser, grammar, the step's mask), and what leaves for each sampled token is
``token_publisher.TokenPublisher`` (tool-call split, answer policy, stream/result messages). Why this module
is still ~640 lines: what is left is one concept, the slot policy, whose steps (admit, chunk, join, reap,
restore, free) all read and write the same row/slot/prefill-position state; cut apart they would share it
through a wide interface again.

``session_close`` (a closed WebSocket) drops the session's stored prefix and makes any request of that
session still in flight skip storing its KV when it ends, so a dead session never holds cache.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.pipeline.schedulers.base import ThreadedScheduler
from omni_rt.engine.builtin.heap import give_back_heap
from omni_rt.engine.prompt.history import request_error_code
from omni_rt.engine.prompt.language import vocab_bias
from omni_rt.engine.builtin.prefix_cache import PrefixStore
from omni_rt.engine.prompt.prefix import common_prefix_len
from omni_rt.engine.builtin.segments import SegmentedRequests
from omni_rt.engine.builtin.sequence import Sequence
from omni_rt.engine.builtin.sequence_builder import SequenceBuilder
from omni_rt.engine.builtin.token_publisher import TokenPublisher
from omni_rt.engine.builtin.tool_decoding import ToolDecoding
from omni_rt.engine.builtin.torch_engine import PrefillItem, TorchEngine
from omni_rt.contracts.payloads import SpeechPrompt, TokenDelta

log = logging.getLogger(__name__)

_REMEMBER_CLOSED = 4096  # closed session ids remembered, so a late request of one never stores KV
HOLD_CAP_S = 0.5  # a short request holds long prefills back at most this long after it arrives (and in a row)


class ARScheduler(ThreadedScheduler):
    accepts_streams = True  # stream chunks are SpeechPrompts, each generated as a segment (engine/segments.py)

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
        prefill_chunk_tokens: int | None = None,
        prefill_tokens_while_decoding: int | None = None,
        history_tokens: int | None = None,
        conversation_tokens: int | None = None,
        short_priority_tokens: int = 1,
    ) -> None:
        """``sampling``: the preset's default sampling keys (a request's own keys win); ``answer_policy``: the
        preset's default voice answer policy for text requests; ``languages``: what the talker can speak
        (prompt + vocabulary steering, see ``omni_rt.engine.prompt.language``).

        ``prefill_chunk_tokens`` bounds the prompt tokens prefilled in one iteration (default: 64 on CPU,
        where 64 tokens cost about one short prompt's prefill, so a request arriving mid-chunk waits at most
        ~2x its own prefill; 512 on GPU); a prompt with more new tokens than that is long, a shorter one (a
        turn of a running conversation, a new session's first question) prefills whole in one forward.
        ``prefill_tokens_while_decoding`` (default a quarter of it) is the bound while requests are decoding:
        on CPU 16 prefill tokens cost about one decode step, so a long prefill and the running answers share
        the thinker about evenly instead of every answer's next token waiting behind a full chunk (smaller
        bounds gave the bystander nothing more beside the hold below and slowed the heavy session's turns:
        docs/tuning-cpu.md, "PyTorch fallback chunks"). ``history_tokens`` overrides a session's share of
        the KV, ``conversation_tokens`` bounds the conversation kept after the instructions (see
        ``omni_rt.engine.prompt.history``). ``short_priority_tokens``: while a short request is waiting, prefilling
        or has sampled fewer than this many tokens, long prompts wait (``_held_back``); 1 = only until its
        first token."""
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
        # input processing (request -> prompt -> Sequence), tool grammars, output processing (token -> messages)
        self.inputs = SequenceBuilder(
            tokenizer, vocab_size=engine.vocab_size, max_seq_len=engine.max_seq_len, slots=engine.max_batch_size,
            model_eos_ids=engine.eos_token_ids, name=name, kv_budget_tokens=kv_budget_tokens,
            history_tokens=history_tokens, conversation_tokens=conversation_tokens,
            default_max_tokens=default_max_tokens, sampling=sampling,
            answer_policy=answer_policy, languages=languages,
        )
        self.history = self.inputs.history  # the session token budget (read by cache_state, tests, the session)
        self.eos_token_ids = self.inputs.eos_token_ids
        bias = vocab_bias(tokenizer, self.inputs.languages, engine.vocab_size)
        engine.sampler.vocab_bias = None if bias is None else bias.to(engine.device)
        engine.sampler.ending = None if self.inputs.ending is None else self.inputs.ending.to(engine.device)
        self.tools = ToolDecoding(tokenizer, engine.vocab_size, self.eos_token_ids, engine.device)
        self.output = TokenPublisher(self.emit, self.emit_error)
        self.metrics = {"decode_steps": 0, "decode_s": 0.0, "decode_rows": 0, "prefill_tokens": 0, "prefill_s": 0.0,
                        "heap_trims": 0, "heap_trim_s": 0.0}
        self._freed = False  # something was released since the heap was last trimmed
        self._waiting: deque[Sequence] = deque()
        self._rows: list[Sequence] = []  # invariant: self._rows[i].slot == i
        self._live: dict[str, Sequence] = {}
        if prefill_chunk_tokens is None:
            prefill_chunk_tokens = 64 if engine.device.type == "cpu" else 512
        if prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.prefill_tokens_while_decoding = max(1, prefill_tokens_while_decoding or prefill_chunk_tokens // 4)
        if short_priority_tokens < 1:
            raise ValueError(f"stage '{name}' field 'short_priority_tokens' must be >= 1, got {short_priority_tokens}")
        self.short_priority_tokens = short_priority_tokens
        self._hold_since: float | None = None  # when long prefills began waiting for a short request's first words
        self._prefilling: list[Sequence] = []  # hold slots above the decode rows until their last chunk
        self._prefill_pos: dict[str, int] = {}  # request id -> prompt tokens already in its slot's KV
        self._closed: OrderedDict[str, None] = OrderedDict()
        self.stream_sources: list[str] = []
        self._segments = SegmentedRequests()

    def live_state(self) -> int:
        return len(self._live) + len(self._segments)

    def cache_state(self) -> dict[str, Any]:
        """Cache accounting for ``/debug/state`` and ``/metrics``; ``closed_session_prefixes`` must stay 0;
        ``history``: the session token budget and what was trimmed.

        Read from another thread: plain attribute reads of containers the loop replaces or mutates, so a
        figure may be one step stale but never raises."""
        ids = self.prefix_store.session_ids()
        closed = set(self._closed)
        return {
            "cached_prefixes": len(ids),
            "cached_tokens": self.prefix_store.total_tokens,
            "closed_session_prefixes": sum(1 for sid in ids if sid in closed),
            "prefix_bytes": self.prefix_store.total_bytes,
            "kv_bytes": self.engine.kv_bytes() + self.prefix_store.total_bytes,
            "prefilling": len(self._prefilling),
            **{f"prefix_{k}": v for k, v in self.prefix_store.counters.items()},
            **({"history": self.history.state()} if self.history is not None else {}),
        }

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
        idle = not self._rows and not self._waiting and not self._prefilling
        if idle and self._freed:
            self._freed = False
            self.metrics["heap_trims"] += 1  # about to sleep: hand freed pages back (engine/heap.py)
            self.metrics["heap_trim_s"] += give_back_heap()
        self._drain_inbox(block=idle)
        if not self.running:
            return None
        self._reap()
        self._admit()
        if self._rows and self._drain_inbox(block=False):
            self._admit()  # a turn that arrived during that prefill starts now, not after the next decode step
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
        for owner in list(self._segments.open):  # streamed requests with no segment running
            self._segments.drop(owner)
            self.emit_error(owner, exc, code=code)
        self._segments.owner.clear()
        self._live.clear()
        self.output.clear()
        self._waiting.clear()
        self._rows = []
        self._prefilling = []
        self._prefill_pos.clear()
        self.engine.reset()

    def _decode(self, rows: list[Sequence]) -> list[int]:
        t0 = time.perf_counter()
        mask = self.tools.mask(rows)
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
            self.tools.advance(rows, tokens)  # grammars advance before the next step's mask is built
            return tokens
        except Exception as exc:
            for seq in rows:
                if not seq.finished:
                    seq.finish_reason = "error"
                    self.emit_error(seq.request_id, exc, code="decode_error")
            return None

    # ------------------------------------------------------------------ inbox
    def _drain_inbox(self, block: bool) -> bool:
        """Handle every message in the inbox (waiting up to 0.5 s for one when ``block``); True if there was any."""
        try:
            msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
        if block and self.batch_wait_s > 0 and self._waiting:
            self._wait_for_company()
        return True

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
        if msg.type == "new_request" and msg.source in self.stream_sources:
            st = self._segments.state(rid)  # the payload of a request fed by a stream: it generates nothing itself
            st.payload, st.has_payload = msg.data, True
            self._complete_streamed(rid)
        elif msg.type == "new_request":
            self._new_request(rid, msg.data)
        elif msg.type == "stream_chunk":
            if not isinstance(msg.data, SpeechPrompt):
                self.emit_error(rid, f"stream chunks into an AR stage must be SpeechPrompt, got {type(msg.data).__name__}",
                                code="bad_request")
                return
            try:
                self._segments.add(rid, msg.data.request)
            except ValueError as exc:
                self._segments.drop(rid)
                self.emit_error(rid, exc, code="bad_request")
                return
            self._start_segment(rid)
        elif msg.type == "stream_done":
            self._segments.state(rid).done_sources.add(msg.source or "")
            self._complete_streamed(rid)
        elif msg.type == "session_close":
            self._close_session(rid)
        elif msg.type == "abort":
            self._abort(self._segments.drop(rid) or rid)
        else:
            self.emit_error(rid, f"{msg.type} is not accepted by an AR stage", code="unsupported")

    def _new_request(self, rid: str, data: Any) -> None:
        if rid in self._live:
            self.emit_error(rid, f"request id {rid!r} is already running", code="duplicate_request")
            return
        try:
            seq = self.inputs.build(rid, data)
            seq.tools = self.tools.stream_for(seq.req)
        except Exception as exc:
            self.emit_error(rid, exc, code=request_error_code(exc))
            return
        self.output.open(seq)
        self._live[rid] = seq
        self._waiting.append(seq)

    def _abort(self, rid: str) -> None:
        seq = self._live.get(rid)
        if seq is None or seq.finished:
            return
        seq.finish_reason = "abort"
        if seq in self._waiting:
            self._waiting.remove(seq)
            del self._live[rid]
        self.emit(rid, "result", self.output.result(seq))  # a running one frees its slot at the next reap
        if rid not in self._live:
            self.output.forget(rid)

    # ------------------------------------------------------------------ streamed requests (segments)
    def _start_segment(self, owner: str) -> None:
        nxt = self._segments.next_segment(owner)
        if nxt is not None:
            self._new_request(*nxt)

    def _complete_streamed(self, owner: str) -> None:
        result = self._segments.complete(owner, set(self.stream_sources))
        if result is not None:
            super().emit(owner, "result", result)

    def emit(self, request_id: str, type_: str, data=None, **metadata) -> None:
        """A segment's outputs leave under its owner's id; its result starts the owner's next segment instead."""
        owner = self._segments.owner.get(request_id)
        if owner is None:
            super().emit(request_id, type_, data, **metadata)
        elif self._segments.orphan(request_id):  # the running segment of an aborted or failed response
            if type_ != "stream":  # its last word: a result or an error
                del self._segments.owner[request_id]
        elif type_ == "stream":
            if isinstance(data, TokenDelta):
                data.segment = self._segments.open[owner].count - 1  # the running one is the latest started
            super().emit(owner, type_, data, **metadata)
        elif type_ == "result":
            self._segments.segment_done(request_id, int(data.get("completion_tokens", 0)))
            self._start_segment(owner)
            self._complete_streamed(owner)
        else:  # an error of one segment fails the whole response
            self._segments.drop(owner)
            del self._segments.owner[request_id]
            super().emit(owner, type_, data, **metadata)

    def close_session(self, session_id: str) -> None:
        self.inbox.put(IncomingMessage(session_id, "session_close"))

    # ------------------------------------------------------------------ slots
    def _admit(self) -> None:
        """Spend a bounded number of prefill tokens this iteration, fewest tokens left first; concurrent
        prefills share one forward (``TorchEngine.prefill_batch``), whose cost — rows x longest chunk — is
        what the budget bounds, so running answers wait at most one chunk's worth for new sessions."""
        cands = self._prefill_candidates()
        held = self._held_back(cands)
        budget = self._prefill_budget(self._unheld(cands, held))
        while budget > 0:
            group, width = self._next_prefills(budget, held)
            if not group:
                return
            t0 = time.perf_counter()
            items, seqs = [], []
            for seq in group:
                rid = seq.request_id
                try:
                    if rid not in self._prefill_pos:
                        self._waiting.remove(seq)
                        seq.slot = self._free_slot()
                        self._prefilling.append(seq)
                        self._prefill_pos[rid] = self._restore_prefix(seq, seq.slot)
                    start = self._prefill_pos[rid]
                    end = min(len(seq.prompt_ids), start + width)
                    last = end == len(seq.prompt_ids)
                    mask = self.tools.mask([seq]) if last else None
                except Exception as exc:
                    self._prefill_failed(seq, exc)
                    continue
                items.append(PrefillItem(seq.slot, seq.prompt_ids[start:end], start, seq.req.sampling, mask, last))
                seqs.append(seq)
            if not items:
                continue
            budget -= len(items) * max(len(it.token_ids) for it in items)
            for seq, it, tok in self._prefill_items(seqs, items):
                self._prefill_pos[seq.request_id] = it.start + len(it.token_ids)
                self.metrics["prefill_tokens"] += len(it.token_ids)
                if it.sample_next:
                    if it.mask is not None:
                        seq.tools.grammar.consume(tok)
                    self._join_rows(seq)
                    self.output.publish(seq, tok)
            self.metrics["prefill_s"] += time.perf_counter() - t0

    def _prefill_items(self, seqs: list[Sequence], items: list[PrefillItem]):
        """Run a batched prefill; yields (seq, item, next token) for each that succeeded. A failed batch is
        retried one request at a time, so a failure fails only the request that causes it."""
        try:
            return list(zip(seqs, items, self.engine.prefill_batch(items)))
        except Exception as exc:
            if len(items) == 1:
                self._prefill_failed(seqs[0], exc)
                return []
        done = []
        for seq, it in zip(seqs, items):
            try:
                done.append((seq, it, self.engine.prefill_batch([it])[0]))
            except Exception as exc:
                self._prefill_failed(seq, exc)
        return done

    def _prefill_failed(self, seq: Sequence, exc: BaseException) -> None:
        rid = seq.request_id
        if seq in self._prefilling:
            self._prefilling.remove(seq)
            self.engine.release(seq.slot)
        self._prefill_pos.pop(rid, None)
        self._live.pop(rid, None)
        self.output.forget(rid)
        self.emit_error(rid, exc, code="prefill_error")

    def _held_back(self, cands: list[tuple[int, int, Sequence]]) -> bool:
        """Whether long prompts wait this iteration: while a short one is waiting for a slot, prefilling,
        or decoding with fewer than ``short_priority_tokens`` tokens. Its first words are what the listener
        waits for; a long prefill sharing the forward would make its prefill a wider batch and each of
        those tokens a decode step plus a prefill share (the bystander of issue #26 took several times its solo
        time for its first words beside one heavy session). The llama.cpp thinker holds its heavy pieces back the same way
        (``prefill_pieces.ShortPrefills``). Two caps keep a long prompt slowed, never starved: a short
        request holds only within ``HOLD_CAP_S`` of its arrival, and a hold lasts at most ``HOLD_CAP_S``
        in a row (then one iteration of long prefill) however many short requests keep arriving.
        ``cands``: ``_prefill_candidates()``."""
        if not any(left > self.prefill_chunk_tokens for left, _, _ in cands):
            self._hold_since = None
            return False
        now = time.perf_counter()

        def short(seq: Sequence, cached: int) -> bool:
            return now - seq.arrival < HOLD_CAP_S and len(seq.prompt_ids) - cached <= self.prefill_chunk_tokens

        young = any(len(s.sampled) < self.short_priority_tokens and short(s, s.cached_tokens)
                    for s in self._rows if not s.finished)
        # a waiting candidate's tokens left are all new (its cached prefix estimated); one mid-prefill restored its own
        arriving = any(short(s, s.cached_tokens if s.request_id in self._prefill_pos else len(s.prompt_ids) - left)
                       for left, _, s in cands)
        if not (young or arriving):
            self._hold_since = None
            return False
        if self._hold_since is None:
            self._hold_since = now
        if now - self._hold_since >= HOLD_CAP_S:
            self._hold_since = now  # one iteration of long prefill, then the hold starts over
            return False
        return True

    def _prefill_budget(self, cands: list[tuple[int, int, Sequence]]) -> int:
        """Prompt tokens this iteration may prefill: a full chunk on an idle engine; while answers decode, the
        smaller share — unless the shortest candidate fits a full chunk, which then gets all it needs and
        finishes in this one forward. A short turn arriving among long prefills would otherwise take
        several iterations of (its share + everyone's decode step) for its first token (the bystander of
        issue #26); a whole short prompt costs the decoding answers one forward
        of at most a chunk, once per request — the bound the chunk size already promises them. ``cands``:
        the candidates that may prefill now (``_prefill_candidates``)."""
        shortest = cands[0][0] if cands else 0
        floor = self.prefill_chunk_tokens if not self._rows else self.prefill_tokens_while_decoding
        return shortest if floor < shortest <= self.prefill_chunk_tokens else floor

    def _prefill_candidates(self, held: bool = False) -> list[tuple[int, int, Sequence]]:
        """(tokens left, order, request) of the requests that could prefill now, fewest tokens left first:
        those mid-prefill, and waiting ones only while a slot is free for them; ``held``: only those with at
        most a chunk left (``_held_back``)."""
        cands = [(len(s.prompt_ids) - self._prefill_pos[s.request_id], i, s) for i, s in enumerate(self._prefilling)]
        free = self.engine.max_batch_size - len(self._rows) - len(self._prefilling)
        waiting = sorted(  # (estimating a cached prefix per waiting request only when one could start)
            ((max(1, len(s.prompt_ids) - self._cached_estimate(s)), len(cands) + i, s)
             for i, s in enumerate(self._waiting)),
            key=lambda c: (c[0], c[1]),
        )[:free] if free > 0 else []
        return self._unheld(sorted(cands + waiting, key=lambda c: (c[0], c[1])), held)

    def _unheld(self, cands: list[tuple[int, int, Sequence]], held: bool) -> list[tuple[int, int, Sequence]]:
        """The candidates allowed to prefill: while ``held``, those with at most a chunk left."""
        return [c for c in cands if c[0] <= self.prefill_chunk_tokens] if held else cands

    def _next_prefills(self, budget: int, held: bool = False) -> tuple[list[Sequence], int]:
        """The requests to prefill together and the chunk width: shortest remaining prompt first (a short
        bystander overtakes a long prefill between chunks, and finishes in this forward when it fits the
        budget). Of the widths that let the shortest take its whole chunk, the one moving the most real
        tokens within ``rows x width <= budget`` (ties: more rows)."""
        cands = self._prefill_candidates(held)
        if not cands:
            return [], 0
        lefts = [c[0] for c in cands]
        floor = min(lefts[0], budget)
        widths = {min(x, budget) for x in lefts} | {budget // k for k in range(1, len(cands) + 1)}
        best = None
        for w in sorted(x for x in widths if x >= floor):
            k = min(len(cands), budget // w)
            key = (sum(min(x, w) for x in lefts[:k]), k)
            if best is None or key > best[0]:
                best = (key, w, k)
        _, width, k = best
        return [c[2] for c in cands[:k]], width

    def _cached_estimate(self, seq: Sequence) -> int:
        sid = seq.req.session_id
        entry = self.prefix_store.peek(sid) if (self.prefix_reuse and sid) else None
        return common_prefix_len(entry.token_ids, seq.prompt_ids) if entry is not None else 0

    def _free_slot(self) -> int:
        used = {s.slot for s in self._rows} | {s.slot for s in self._prefilling}
        return min(set(range(self.engine.max_batch_size)) - used)

    def _join_rows(self, seq: Sequence) -> None:
        """A fully prefilled request takes the next decode row (slot ``len(rows)``)."""
        self._prefilling.remove(seq)
        self._prefill_pos.pop(seq.request_id, None)
        row = len(self._rows)
        if seq.slot != row:
            occupant = next((s for s in self._prefilling if s.slot == row), None)
            if occupant is not None:
                self.engine.swap(seq.slot, row)
                occupant.slot = seq.slot
            else:
                self.engine.move(seq.slot, row)
            seq.slot = row
        self._rows.append(seq)

    def _restore_prefix(self, seq: Sequence, slot: int) -> int:
        """Load the longest still-matching prefix of the session's cached KV; returns its length."""
        sid = seq.req.session_id
        if not (self.prefix_reuse and sid):
            return 0
        entry = self.prefix_store.take(sid)
        if entry is None:
            self.prefix_store.counters["misses"] += 1
            return 0
        self.prefix_store.counters["hits"] += 1
        n = min(common_prefix_len(entry.token_ids, seq.prompt_ids), len(seq.prompt_ids) - 1)
        if n > 0:  # anything past n (an edited/truncated history) is simply not copied: the cache is cropped
            self.engine.load_kv(slot, entry.kv, n)
            seq.cached_tokens = n
        return max(n, 0)

    def _reap(self) -> None:
        for seq in [s for s in self._prefilling if s.finished]:  # aborted mid-prefill
            self._prefilling.remove(seq)
            self._free(seq)
        if not any(s.finished for s in self._rows):
            return
        alive: list[Sequence] = []
        for seq in self._rows:
            if not seq.finished:
                alive.append(seq)
                continue
            self._free(seq)
        holes = sorted(set(range(len(alive))) - {s.slot for s in alive})
        movers = [s for s in alive if s.slot >= len(alive)]
        for hole, seq in zip(holes, movers):
            self.engine.move(seq.slot, hole)
            seq.slot = hole
        self._rows = sorted(alive, key=lambda s: s.slot)

    def _free(self, seq: Sequence) -> None:
        """Release a finished request's slot, keeping its KV for the session's next turn unless the session
        is closed (a dead session must not hold cache) or the request failed."""
        sid = seq.req.session_id
        kv_len = self.engine.lengths[seq.slot]
        if self.prefix_reuse and sid and seq.finish_reason != "error" and sid not in self._closed and kv_len > 0:
            fed = seq.fed_tokens(kv_len)
            self.prefix_store.put(sid, fed, self.engine.export_kv(seq.slot, len(fed)))
        self.engine.release(seq.slot)
        self._freed = True
        self._live.pop(seq.request_id, None)
        self.output.forget(seq.request_id)
        self._prefill_pos.pop(seq.request_id, None)

    def _close_session(self, sid: str) -> None:
        self._closed[sid] = None
        self._closed.move_to_end(sid)
        while len(self._closed) > _REMEMBER_CLOSED:
            self._closed.popitem(last=False)
        self.prefix_store.drop(sid)
        self._freed = True
        if self.history is not None:
            self.history.forget(sid)

    # ------------------------------------------------------------------ host work
    def _host_work(self, rows: list[Sequence], tokens: list[int]) -> None:
        for seq, tok in zip(rows, tokens):
            if not seq.finished:  # a finished row's lookahead token is discarded
                self.output.publish(seq, tok)
