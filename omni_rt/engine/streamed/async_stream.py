"""Base for AR schedulers whose engine is an async token stream (a remote server, an in-process sglang.Engine).

The scheduler thread only reads the inbox; each request runs as one asyncio task in a private event-loop
thread. Abort cancels the task, which closes whatever stream it holds (an HTTP response, an sglang
generator) — the upstream engine then frees the request's KV itself. Results carry the same payload as the
built-in engine's (``request.result_payload``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from omni_rt.pipeline.messages import IncomingMessage, StageTiming
from omni_rt.pipeline.schedulers.base import ThreadedScheduler
from omni_rt.engine.prompt.answer_policy import AnswerPolicy
from omni_rt.engine.prompt.history import HistoryWindow, request_error_code
from omni_rt.engine.prompt.language import check_languages, steer_messages
from omni_rt.engine.prompt.request import GenRequest, _num, parse_answer_policy, parse_request, parse_sampling, result_payload
from omni_rt.engine.tools.parser import ToolStream, UpstreamToolCalls
from omni_rt.engine.tools.preamble import ToolPreamble
from omni_rt.engine.tools.prompt import detect_format, render_prompt
from omni_rt.contracts.payloads import TextDelta
from omni_rt.engine.prompt.repetition import RepeatGuard, as_said, copy_retry, earlier_answers, words_of

# request ids of prefill hints (``_prefill_hinted``): an engine tells a hint from an answer by it
HINT_PREFIX = "hint:"
# how many times one answer may be forked away from a copy, a loop or another language (``RepeatGuard.fork``);
# twice that while a cut would leave it word for word an earlier answer
MAX_FORKS = 3


@dataclass(slots=True)
class Delta:
    """One chunk from the upstream engine. ``usage`` keys: prompt_tokens, cached_tokens, completion_tokens."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    tool_calls: list[dict] = field(default_factory=list)  # raw OpenAI ``delta.tool_calls`` entries
    timings: dict[str, float] | None = None  # llama-server's own ``timings`` (prompt_ms, predicted_per_token_ms)


def first_token_timing(arrived: float, first: float, timings: dict[str, float] | None) -> StageTiming:
    """Inbox arrival -> first token, split by the upstream's own timings where it reports them (llama-server:
    prefill ``prompt_ms`` + one token's ``predicted_per_token_ms`` computed; the rest waited, in our inbox, on
    the wire, in its slot queue). Without them the whole time counts as compute (an upper bound)."""
    total = max(0.0, first - arrived)
    if not timings or timings.get("prompt_ms") is None:
        return StageTiming(0.0, total)
    compute = (float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_per_token_ms") or 0.0)) / 1000.0
    compute = min(max(0.0, compute), total)
    return StageTiming(total - compute, compute)


def usage_from_timings(timings: dict[str, float] | None) -> dict[str, int]:
    """The prompt's size and cached part from llama-server's per-chunk ``timings`` (``cache_n`` reused +
    ``prompt_n`` evaluated); {} without them.

    Why: the usage chunk comes only at the end of a stream, and a voice answer's stream is usually closed
    before that (the answer policy's sentence limit): the response then reported 0 cached tokens for a prompt
    that llama-server had found almost whole in its cache."""
    if not timings or timings.get("prompt_n") is None or timings.get("cache_n") is None:
        return {}
    cached = int(timings["cache_n"])
    return {"prompt_tokens": cached + int(timings["prompt_n"]), "cached_tokens": cached}


class UpstreamError(RuntimeError):
    """A failure with a client-facing message and an error code."""

    def __init__(self, message: str, code: str = "upstream_error") -> None:
        super().__init__(message)
        self.code = code


class AsyncStreamScheduler(ThreadedScheduler):
    def __init__(
        self,
        *,
        name: str,
        default_max_tokens: int,
        tokenizer: Any = None,
        sampling: dict[str, Any] | None = None,
        answer_policy: dict[str, Any] | None = None,
        languages: list[str] | None = None,
    ) -> None:
        """``sampling``/``answer_policy``/``languages``: preset defaults, as for the built-in ``ARScheduler``
        (languages steer the prompt only: a generic upstream's token ids are not known here; the llama.cpp
        thinker, whose vocabulary is the tokenizer's, adds the vocabulary bias as ``logit_bias``)."""
        super().__init__()
        self.name = name
        self.default_max_tokens = default_max_tokens
        self.tokenizer = tokenizer
        parse_sampling({}, sampling)  # a bad preset default fails at start-up
        self.sampling_defaults = dict(sampling or {})
        self.default_policy = parse_answer_policy(answer_policy)
        self.languages = check_languages(languages)
        self._tasks: dict[str, Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # the session token budget, once the upstream's context is known (set by a subclass, or not at all)
        self.history: HistoryWindow | None = None
        self.prompt_ids: dict[str, list[int]] = {}  # request id -> its fitted prompt, until generate() starts
        self.forks = 0  # answers continued away from a copy of an earlier answer (``fork_request``)

    def close_session(self, session_id: str) -> None:
        if self.history is not None:
            self.history.forget(session_id)

    warms_prompts = False  # a subclass that can prefill a session's prompt ahead (``warm_prompt``) sets this
    forks_answers = False  # a subclass that can continue an answer from its text with a token banned (``fork_request``)

    def fork_request(self, rid: str, req: GenRequest, prompt: list[int] | None, said: str, banned: list[str],
                     used_tokens: int, no_end: bool = False) -> GenRequest | None:  # pragma: no cover - only if forks_answers
        """The rest of answer ``rid`` after ``said`` (its text so far), with the first token of each of ``banned``
        (words) not allowed; ``no_end``: its next token only, which may not end the answer. ``prompt``: its fitted
        prompt ids. None: it cannot be continued."""
        return None

    def prefill_hint(self, session_id: str, payload: Any) -> None:
        """Queue the hint behind the requests already in the inbox (the loop fits it as a request's prompt)."""
        if self.warms_prompts and self.history is not None and self.tokenizer is not None:
            self.inbox.put(IncomingMessage(session_id, "prefill_hint", payload))

    def cache_state(self) -> dict[str, Any]:
        return {**({"history": self.history.state()} if self.history is not None else {}), "copy_forks": self.forks}

    def live_state(self) -> int:
        return len(self._tasks)

    # -- subclass API
    def generate(self, request_id: str, req: GenRequest) -> AsyncIterator[Delta]:  # pragma: no cover - abstract
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release async resources (HTTP clients) inside the loop before it stops."""

    async def warm_prompt(self, hint_id: str, req: GenRequest) -> None:  # pragma: no cover - only if warms_prompts
        """Prefill ``self.prompt_ids[hint_id]`` (``req``'s fitted prompt) into the session's cache, answering nothing."""
        raise NotImplementedError

    async def _prefill_hinted(self, session_id: str, data: Any) -> None:
        """A prefill hint, fitted exactly as the request it foretells will be (same steering, same history
        trim), so the prompt it warms is that request's prefix. A hint that does not parse or fit is dropped."""
        hint_id = HINT_PREFIX + session_id
        try:
            req = parse_request(data, self.default_max_tokens, self.sampling_defaults, self.default_policy)
            if req.messages is None or req.session_id != session_id:
                return
            req.messages = steer_messages(req.messages, self.languages)
            self._fit_history(hint_id, req, data)
            await self.warm_prompt(hint_id, req)
        except ValueError:
            return
        finally:
            self.prompt_ids.pop(hint_id, None)

    # -- loop
    def run_loop(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        thread = threading.Thread(target=loop.run_forever, name=f"{self.name}-aio", daemon=True)
        thread.start()
        try:
            while self.running:
                msg = self.inbox.get()
                rid = msg.request_id
                if msg.type == "new_request":
                    if rid in self._tasks:
                        self.emit_error(rid, f"request id {rid!r} is already running", code="duplicate_request")
                        continue
                    fut = asyncio.run_coroutine_threadsafe(self._serve(rid, msg.data, msg.t), loop)
                    self._tasks[rid] = fut
                    fut.add_done_callback(
                        lambda f, rid=rid: self._tasks.pop(rid, None) if self._tasks.get(rid) is f else None
                    )
                elif msg.type == "prefill_hint":
                    asyncio.run_coroutine_threadsafe(self._prefill_hinted(rid, msg.data), loop)
                elif msg.type == "abort":
                    fut = self._tasks.get(rid)
                    if fut is not None:
                        fut.cancel()  # cancels the task inside the loop, closing its stream
                else:
                    self.emit_error(
                        rid, f"{msg.type} is not accepted: send the whole prompt as new_request", code="unsupported"
                    )
        finally:
            for fut in list(self._tasks.values()):
                fut.cancel()
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()

    async def _serve(self, rid: str, data: Any, arrived: float | None = None) -> None:
        t0 = time.perf_counter()
        arrived = t0 if arrived is None else arrived
        text: list[str] = []
        ids: list[int] = []
        first: float | None = None
        upstream_timings: dict[str, float] | None = None  # the first the upstream reported (at the first token)
        finish, usage, chunks = None, None, 0
        try:
            req = parse_request(data, self.default_max_tokens, self.sampling_defaults, self.default_policy)
        except ValueError as exc:
            self.emit_error(rid, exc, code="bad_request")
            return
        whole = req.messages  # the session's whole chat: an answer trimmed out of the window is still not copied
        if req.messages is not None:
            req.messages = steer_messages(req.messages, self.languages)
            try:
                self._fit_history(rid, req, data)
            except ValueError as exc:  # PromptTooLong among them
                self.emit_error(rid, exc, code=request_error_code(exc))
                return
        policy = AnswerPolicy(req.answer_policy) if req.output == "text" and req.answer_policy is not None else None
        calls = UpstreamToolCalls()  # structured ``tool_calls`` deltas (an upstream with a tool-call parser)
        texts = self._text_tools(req)  # calls written into the text (an upstream without one; in-process sglang)
        stopped = False
        preamble = ToolPreamble(req.tool_preamble if req.tools and req.tool_choice != "none" else "off")

        def publish(out: list) -> bool:
            """Emit chunks; the policy filters the spoken text (never tool calls), then a spoken phrase goes before
            a call the model wrote no words for (``tools.preamble``). True once the policy stopped."""
            nonlocal stopped
            for chunk in out:
                if isinstance(chunk, TextDelta) and policy is not None:
                    chunk.text, stop = ("", True) if stopped else policy.feed(chunk.text)
                    stopped = stopped or stop
            for chunk in preamble.apply(out):
                if not isinstance(chunk, TextDelta) or chunk.text or chunk.token_ids:
                    if isinstance(chunk, TextDelta):
                        text.append(chunk.text)
                    self.emit(rid, "stream", chunk)
            return stopped

        # loops and copies (omni_rt.engine.prompt.repetition): an n-gram the upstream cannot ban, an earlier answer of
        # the session reproduced, an answer that starts in another language; spoken text only (a tool call's JSON
        # repeats its keys by design). Nothing is held for them but the word being written, which the answer policy
        # holds anyway; a copy or a foreign word is forked away (fork_request) where the engine can continue an answer
        guarded = req.output == "text" and texts is None
        copies = earlier_answers(whole) if guarded else []
        guard = RepeatGuard(req.sampling.no_repeat_ngram_size if guarded else 0, copies,
                            self.languages if guarded else (), hold_copies=not self.forks_answers,
                            cap=policy.max_words if policy is not None else None)
        prompt = self.prompt_ids.get(rid)  # the fitted prompt: a forked answer continues it
        leg, retried, bans, strip, forks, no_end_leg = req, False, [], False, 0, False
        try:
            for _ in range(2 + 4 * MAX_FORKS):  # the answer, one retry, its forks (a copy's: two legs): bounded
                # aclosing: leaving the loop early (the policy stopped) closes the upstream stream at once
                async with aclosing(self.generate(rid, leg)) as stream:
                    async for d in stream:
                        if d.timings and upstream_timings is None:
                            upstream_timings = d.timings
                        if d.text or d.token_ids or d.tool_calls:
                            first = first or time.perf_counter()
                            chunks += 1
                            ids.extend(d.token_ids)
                            out = calls.feed(d.tool_calls, list(d.token_ids)) if d.tool_calls else []
                            tok_ids = [] if d.tool_calls else list(d.token_ids)
                            fed = d.text.lstrip() if strip else d.text  # a fork's first space: the text had it
                            strip = strip and not fed
                            said, repeated = guard.feed(fed) if guarded else (fed, False)
                            if texts is not None:  # tool calls never reach "text" (the talker speaks it)
                                out += texts.chunks(d.text, tok_ids, final=False)
                            elif said or tok_ids:
                                out.append(TextDelta(said, tok_ids))
                            if publish(out):
                                finish = "policy"
                                break
                            if repeated:
                                finish = "repeat"
                                break
                        finish = d.finish_reason or finish
                        usage = d.usage or usage
                        if d.finish_reason:
                            publish(calls.finish())
                if no_end_leg and finish == "length" and guarded and guard.reason is None:
                    # the one token after a copy's last word (not an ending) is in: the answer goes on unbanned
                    no_end_leg = False
                    then = self.fork_request(rid, req, prompt, guard.text, bans, chunks)
                    if then is not None:
                        leg, finish, strip = then, None, guard.text[-1:].isspace()
                        continue
                if guarded and finish not in ("policy", "repeat"):
                    held = guard.finish()
                    if held:
                        publish([TextDelta(held, [])])
                if finish == "policy" or not guarded or guard.reason is None:
                    break
                spoken = "".join(text).strip()
                # a retry that opens in another language again is forked too: banning its first word beats both
                # silence and an answer the voice garbles ("L'capital d'Allemagne" asked again said the same)
                if self.forks_answers and (guard.reason in ("copy", "loop")
                                           or (guard.reason == "language" and (spoken or retried))):
                    # a copy may not end: it goes on after its last word, the tokens that would end it banned for
                    # one token. A loop: it goes on without the word that would repeat an n-gram (the built-in
                    # sampler's n-gram ban; stopping there instead left a cut answer that later turns then
                    # reproduced). A word of another language once the answer is being spoken: the answer goes on
                    # without it (an answer not yet spoken is asked again), from the start of what the listener
                    # has not got yet (a later sentence the policy still holds is dropped)
                    no_end_leg = guard.forks_past_end
                    back = policy.retract() if guard.reason == "language" and policy is not None else 0
                    head, words = guard.fork(back)
                    bans += [w for w in words if w not in bans]
                    forks += 1
                    # past the budget only when a cut here would say an earlier (cut) answer word for word again
                    budget = MAX_FORKS if words_of(head) not in copies else 2 * MAX_FORKS
                    fork = (self.fork_request(rid, req, prompt, head, bans, chunks, no_end=no_end_leg)
                            if forks <= budget else None)
                    if fork is None:  # cannot fork (or the budget is spent): cut where the listener has it
                        if guard.reason == "language" and not spoken:  # nothing said yet: the answer as it came
                            publish([TextDelta(guard.text, [])])
                        finish = "repeat"
                        break
                    self.forks += 1
                    leg, finish, strip = fork, None, head[-1:].isspace()
                    continue
                retry = None if retried else copy_retry(req, guard, 0, "".join(text))
                if retry is None:
                    if guard.reason == "copy" and not "".join(text).strip():  # asked again, the same answer again:
                        publish([TextDelta(as_said(guard.text), [])])  # said as a repeat, not silence
                        finish = "stop"
                    break
                # nothing of it was released: the retry starts from a clean policy
                policy = AnswerPolicy(req.answer_policy) if policy is not None else None
                stopped, retried = False, True
                if prompt is not None and retry.messages is not None and self.tokenizer is not None:
                    # its prompt ids: the slot picker keeps it in the slot whose KV holds all but its last words
                    primed = render_prompt(self.tokenizer, retry.messages, retry.tools, retry.tool_choice)
                    self.prompt_ids[rid] = list(self.tokenizer(primed, add_special_tokens=False)["input_ids"])
                    prompt = self.prompt_ids[rid]  # a fork of the retry continues its primed prompt
                # where the engine can fork, the retry is judged for its language as well (a fork then bans the
                # foreign word); elsewhere it goes through as it comes: one in the wrong language beats silence,
                # and an empty turn in the history is copied by later ones
                languages = guard.languages if self.forks_answers else ()
                leg, finish = retry, None
                guard = RepeatGuard(guard.n, copies, languages, hold_copies=guard.hold_copies, cap=guard.cap)
            # the upstream finished (with or without a finish_reason): close what is open, release held text
            publish(calls.finish() + (texts.chunks("", [], final=True) if texts is not None else []))
        except asyncio.CancelledError:
            finish = "abort"
        except UpstreamError as exc:
            self.emit_error(rid, str(exc), code=exc.code)
            return
        except Exception as exc:
            self.emit_error(rid, exc, code="upstream_error")
            return
        finally:
            self.prompt_ids.pop(rid, None)
        if finish == "repeat":  # the guard ended a loop or a copy: closed as a cut, at a sentence boundary
            finish = "policy" if policy is not None else "stop"
            tail = policy.finish("length") if policy is not None else ""
            if tail:
                text.append(tail)
                self.emit(rid, "stream", TextDelta(tail, []))
        if policy is not None and finish not in ("policy", "abort"):
            tail = policy.finish(finish or "stop")  # a cut ("length") ends at the last sentence boundary
            if tail:
                text.append(tail)
                self.emit(rid, "stream", TextDelta(tail, []))
        if forks:  # one answer over several requests: its prompt is the first's, its tokens are all of them
            usage = {**usage_from_timings(upstream_timings), "completion_tokens": chunks}
        usage = usage or usage_from_timings(upstream_timings)
        prompt_tokens = usage.get("prompt_tokens") or self._count_prompt(req)
        timing = first_token_timing(arrived, first, upstream_timings) if first is not None else None
        self.emit(
            rid,
            "result",
            result_payload(
                text="".join(text),  # what was streamed as speakable text (after the tool split and the policy)
                token_ids=ids,
                finish_reason=finish or "stop",
                prompt_tokens=prompt_tokens,
                cached_tokens=usage.get("cached_tokens", 0),
                completion_tokens=usage.get("completion_tokens", len(ids) or chunks),
                ttft_ms=round(((first or time.perf_counter()) - t0) * 1000.0, 3),
                tool_calls=calls.result_calls() + (texts.result_calls() if texts is not None else []),
            ),
            **({"timing": timing} if timing is not None else {}),
        )

    def _fit_history(self, rid: str, req: GenRequest, data: Any) -> None:
        """Trim ``req.messages`` to the session's token budget (``omni_rt.engine.prompt.history``), as the built-in
        engine does, so the upstream never sees a prompt beyond its context or the session's share of its KV."""
        if self.history is None or self.tokenizer is None:
            return
        budget = self.history.prompt_budget(req.max_tokens, _num(data, "max_prompt_tokens", int, None, 1))
        req.messages, self.prompt_ids[rid] = self.history.fit(
            req.session_id, req.messages, budget,
            render=lambda msgs: render_prompt(self.tokenizer, msgs, req.tools, req.tool_choice))

    def _text_tools(self, req: GenRequest) -> ToolStream | None:
        """A parser for tool calls written into the streamed text, when the request offers tools."""
        if not req.tools or req.tool_choice == "none":
            return None
        return ToolStream(detect_format(self.tokenizer) if self.tokenizer is not None else "hermes")

    def _count_prompt(self, req: GenRequest) -> int:
        if req.prompt_ids is not None:
            return len(req.prompt_ids)
        if self.tokenizer is None:
            return 0
        text = render_prompt(self.tokenizer, req.messages, req.tools, req.tool_choice)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
