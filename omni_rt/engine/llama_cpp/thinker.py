"""llama.cpp as the CPU thinker, part 3: the scheduler, a ``RemoteThinker`` over a managed ``llama-server``.

Over 400 lines on purpose: the slot picker, the prefill hints, pacing's continuations and the request stream all
read and write one per-slot state (which session's prefix each slot holds); what stands alone (the server
process, the prefill pieces, the pacing rule) is already its own module.

It owns the server process (``omni_rt.engine.llama_cpp.server``) through start/stop, picks each request's slot so
a short new part goes first in every batch, sends the talker's language bias as ``logit_bias``, and renders
tool prompts exactly as the built-in engine does for a model whose chat template has no tool support (with
llama-server's ``json_schema``/GBNF grammars for forced and ``auto`` choices).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import time
from collections import OrderedDict
from contextlib import aclosing
from typing import Any, AsyncIterator, Callable

import httpx

from omni_rt.engine.streamed.async_stream import HINT_PREFIX, Delta, UpstreamError
from omni_rt.engine.tools.grammar import closed, forced_tools, forces_call
from omni_rt.engine.llama_cpp.decode_pacing import AnswerPace
from omni_rt.engine.prompt.history import HistoryWindow
from omni_rt.engine.prompt.language import steer_messages
from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
from omni_rt.engine.llama_cpp.prefill_pieces import ShortPrefills, prefill_in_pieces, prefill_only_body
from omni_rt.engine.streamed.remote import RemoteThinker, request_body
from omni_rt.engine.prompt.request import GenRequest
from omni_rt.engine.tools.prompt import detect_format, render_prompt
from omni_rt.engine.tools.schema import callable_tools

log = logging.getLogger(__name__)

TOOL_OPEN, TOOL_CLOSE = "<tool_call>\n", "\n</tool_call>"  # the own tool format (omni_rt.engine.tools.prompt)
FORCED_CALL_MAX_TOKENS = 384
# a prefill hint is speculative work: taken only while at most this many answers are in flight. On one llama.cpp
# thread its pieces share every decode step with the answers playing, so under load hints slow the others'
# first clauses (docs/benchmarks/concurrency.md, "Prefill hints under load"); a lone session and light load keep them
HINT_MAX_ANSWERS_IN_FLIGHT = 1


def forced_schema(req: GenRequest) -> dict[str, Any] | None:
    """For ``required`` / a named ``tool_choice``: the JSON schema of one call object, else None."""
    if not req.tools or not forces_call(req.tool_choice):
        return None
    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": t["name"]},
                               "arguments": closed(t.get("parameters") or {"type": "object"})}}
               for t in forced_tools(req.tools, req.tool_choice)]
    return options[0] if len(options) == 1 else {"anyOf": options}


def language_logit_bias(tokenizer: Any, languages: tuple[str, ...]) -> list[list[Any]]:
    """The built-in engine's language bias (``omni_rt.engine.prompt.language.vocab_bias``) as llama-server's
    ``logit_bias``: ``[id, false]`` bans a token, ``[id, bias]`` adds to its logit. Sent with every request
    (925 entries, ~10 KB, for English on SmolLM2): the server runs the GGUF of the very tokenizer the ids
    come from, which a generic OpenAI-compatible upstream does not promise, so only this dialect gets it."""
    if tokenizer is None or not languages:
        return []
    from omni_rt.engine.prompt.language import vocab_bias

    bias = vocab_bias(tokenizer, languages, len(tokenizer))
    if bias is None:
        return []
    ids = bias.nonzero().flatten().tolist()
    return [[i, False if bias[i] == float("-inf") else round(float(bias[i]), 3)] for i in ids]


def answer_gbnf(still: list[dict]) -> str:
    """``auto`` once a tool's output is in (``tools.schema.callable_tools``), as llama.cpp GBNF: the built-in
    engine's ``tools.grammar.answer_grammar`` — spoken text without call markup, or one call (own format)
    of a tool still callable, its arguments any JSON object — so the same answered call is not made again."""
    text = r'text ::= [^<{; \t\n\r] [^<]*'
    if not still:
        return f"root ::= text\n{text}\n"
    names = " | ".join(json.dumps(t["name"]) for t in still)
    return "\n".join([
        "root ::= text | call", text,
        r'call ::= "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " object "}\n</tool_call>"',
        f"name ::= {names}",
        r'object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}"',
        r'value ::= object | array | string | number | "true" | "false" | "null"',
        r'array ::= "[" ws ( value ( "," ws value )* )? "]"',
        r'string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] ) )* "\""',
        r'number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
        'ws ::= " "?',
    ]) + "\n"


class LlamaCppThinker(RemoteThinker):
    """``RemoteThinker`` over a managed ``llama-server``: start/stop own the process, and an answer
    broken by a crash fails with an error that says so (the supervisor restarts the server)."""

    def __init__(self, server: LlamaServer, history_tokens: int | None = None, heavy_prefill_tokens: int = 64,
                 prefill_piece_tokens: int | None = None, short_priority_tokens: int = 1,
                 pace_ahead_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(server.base_url + "/v1", **kwargs)
        self.server = server
        self.history_tokens = history_tokens
        self._slot_of: dict[str, tuple[int, bool]] = {}  # request in flight -> (its llama-server slot, heavy)
        self._last_slot: OrderedDict[str, int] = OrderedDict()  # session -> the slot its last request used
        self._used_slots: set[int] = set()  # slots that hold a prompt (a closed session's starts like a new one's)
        self.heavy_prefill_tokens = heavy_prefill_tokens
        # a heavy prompt's new tokens go in pieces of one batch (omni_rt.engine.llama_cpp.prefill_pieces); 0: off
        self.prefill_piece_tokens = (server.batch_tokens or 0) if prefill_piece_tokens is None else prefill_piece_tokens
        # a short request holds heavy pieces back until it has this many tokens (prefill_pieces.ShortPrefills)
        if short_priority_tokens < 1:
            raise ValueError(f"short_priority_tokens must be >= 1, got {short_priority_tokens}")
        self.short_priority_tokens = short_priority_tokens
        self.shorts = ShortPrefills()
        # an answer this many seconds of text ahead of its playback steps out while another starts
        # (omni_rt.engine.llama_cpp.decode_pacing); None: never
        if pace_ahead_s is not None and pace_ahead_s <= 0:
            raise ValueError(f"stage '{self.name}' field 'pace_ahead_s' must be > 0 (or unset), got {pace_ahead_s}")
        self.pace_ahead_s = pace_ahead_s
        self.pacing = {"pauses": 0, "resumed_prompt_tokens": 0}  # /debug/state: what the continuations cost
        self._hints: dict[str, asyncio.Task] = {}  # session -> its prefill hint in flight (warm_prompt)
        # /debug/state: hints taken and the prompt tokens they prefilled off the critical path; skipped ones
        self.hinting = {"hints": 0, "prefilled_tokens": 0, "cancelled": 0, "skipped_busy_slot": 0, "skipped_busy_server": 0}
        self.logit_bias = language_logit_bias(self.tokenizer, self.languages)
        self._bans: dict[str, list[int]] = {}  # a forked answer -> the tokens its continuation may not say

    @property  # type: ignore[override]
    def base_url(self) -> str:  # follows the server if a restart had to move it to another port
        return self.server.base_url + "/v1" if hasattr(self, "server") else self._base_url

    @base_url.setter
    def base_url(self, value: str) -> None:
        self._base_url = value

    def start(self) -> None:
        self.server.start()
        if self.tokenizer is not None:  # the server's real slot context and its KV shared by all slots
            self.history = HistoryWindow(self.tokenizer, self.server.slot_context, kv_tokens=self.server.ctx_size,
                                         slots=self.server.parallel, session_tokens=self.history_tokens,
                                         conversation_tokens=self.conversation_tokens, name=self.name)
            log.info("%s: llama-server slot context %d tokens, %d slots over %d KV tokens: history budget %s, "
                     "conversation kept %s tokens", self.name, self.server.slot_context, self.server.parallel,
                     self.server.ctx_size, self.history.describe(), self.conversation_tokens or "all")
        super().start()

    def stop(self) -> None:
        super().stop()
        self.server.stop()

    def _own_tool_prompt(self, req: GenRequest) -> bool:
        """Tools, or tool messages in the history, for a model whose chat template has no tool support
        (SmolLM2's): llama-server's generic tool format would differ from the built-in engine's, so the
        prompt is rendered here exactly as the built-in engine renders it and sent as a completion."""
        if self.tokenizer is None or req.messages is None or detect_format(self.tokenizer) != "own":
            return False
        has_tool_msgs = any(m.get("role") == "tool" or m.get("tool_calls") for m in req.messages)
        return bool(req.tools and req.tool_choice != "none") or has_tool_msgs

    def request(self, req: GenRequest, request_id: str | None = None) -> tuple[str, dict[str, Any]]:
        path, body = self._request(req)
        bias = self.logit_bias + [[t, False] for t in self._bans.get(request_id or "", ())]
        if bias:
            body["logit_bias"] = bias
        if request_id in self._slot_of:
            body["id_slot"] = self._slot_of[request_id][0]
        # its prefill/decode times on every chunk (~150 bytes each): the first token's split of
        # waiting vs computing (async_stream.first_token_timing) is read from the first one
        body["timings_per_token"] = True
        return path, body

    def _continued(self, d: Delta, prompt_tokens: int, before: int, cached: int, leg_start: bool) -> None:
        """A resumed leg's chunk, told as part of the one answer: its usage counts the original prompt and
        every leg's tokens; what the continuation re-evaluated (its first chunk's timings) goes to ``pacing``."""
        if leg_start and d.timings:
            self.pacing["resumed_prompt_tokens"] += int(d.timings.get("prompt_n") or 0)
        if d.usage:
            d.usage = {"prompt_tokens": prompt_tokens, "cached_tokens": cached,
                       "completion_tokens": before + int(d.usage.get("completion_tokens") or 0)}

    def _take_slot(self, request_id: str, req: GenRequest) -> tuple[list[int], int] | None:
        """Pick the request's llama-server slot so a short new part goes first in every batch: llama-server
        fills each batch of ``-b`` tokens slot by slot in slot order, so a bystander below a heavy prefill
        gets its prompt and decode tokens into each batch and the prefill takes what is left. A session
        keeps its last slot (its prefix is there) whenever it is free; otherwise a short request takes the
        lowest free slot, a long one (more than ``heavy_prefill_tokens`` new) the highest, among the slots that
        hold no other session's prefix (``_free_slots_by_cost``). Returns the prompt and how many of its tokens
        are new when a slot was taken, else None.

        Why a session keeps its slot even out of that order: moved, it re-prefills its whole conversation
        and evicts the prefix of the session whose slot it took, which then moves in turn; under load that
        cascade made every moved prompt a heavy one and first tokens seconds late (docs/benchmarks/concurrency.md,
        "Long sessions")."""
        ids = self.prompt_ids.pop(request_id, None)
        if ids is None or self.history is None:
            return None
        sid = req.session_id
        new = self.history.new_tokens(sid, ids, reuse_chunk=self.server.cache_reuse_tokens)
        heavy = new > self.heavy_prefill_tokens
        busy = self._slot_of.values()
        free = sorted(set(range(self.server.parallel)) - set(s for s, _ in busy))
        if not free:
            return None  # llama-server queues it for the first slot to free up
        holders = self._holders()
        busy_now = list(busy)

        def out_of_order(slot: int) -> bool:
            """A short request above a busy heavy one (a heavy one below a busy short one)."""
            return any(s > slot for s, h in busy_now if not h) if heavy else any(s < slot for s, h in busy_now if h)

        last = self._last_slot.get(sid) if sid else None
        if last is not None and holders[last][0] != sid:
            last = None  # another session has used that slot since: its prefix is there now
        keep = last in free
        slot = last if keep else self._free_slots_by_cost(free[::-1] if heavy else free, sid, holders, out_of_order)[0]
        self._slot_of[request_id] = (slot, heavy)
        self._used_slots.add(slot)
        if sid:
            self._last_slot[sid] = slot
            self._last_slot.move_to_end(sid)
            if len(self._last_slot) > 1024:
                self._last_slot.popitem(last=False)
        return ids, new

    def _holders(self) -> dict[int, tuple[str, int]]:
        """slot -> (the session whose prefix it holds: the last one served there, how recently: a rank)."""
        holders: dict[int, tuple[str, int]] = {}
        for rank, (owner, slot) in enumerate(self._last_slot.items()):  # oldest first: the latest one wins
            holders[slot] = (owner, rank)
        return holders

    def _free_slots_by_cost(self, free: list[int], sid: str | None, holders: dict[int, tuple[str, int]],
                            out_of_order: Callable[[int], bool]) -> list[int]:
        """``free`` (in the order the batch rule prefers) sorted by what taking each slot costs: first the
        slots that keep a short request below every busy heavy one (a heavy one above every busy short one),
        among them those that hold no other session's prefix — a closed session's before a never used one (its
        system prompt is likely this session's too) — then those of the sessions least recently served.

        Why: with ``--cache-ram 0`` a slot holds one prefix; taking the lowest free slot whatever it held
        made a session's first turn evict another's conversation, which then re-prefilled its whole history
        (80-190 tokens, 0.5-1 s on one thread) on its next turn's critical path — in every 4-session bench
        run (llama-server's log)."""
        def cost(slot: int) -> tuple[bool, int, int]:
            owner, rank = holders.get(slot, (None, -1))
            if owner is None or owner == sid:
                return (out_of_order(slot), -1, 0 if slot in self._used_slots else 1)
            return (out_of_order(slot), rank, 0)

        return sorted(free, key=cost)  # stable: ties keep the batch order

    def warm_system_prompt(self, instructions: str) -> int:
        """Prefill ``instructions`` as a session's first turn renders its system prompt into every slot no
        request has used yet (``n_predict: 0``); returns how many slots took it. Blocking HTTP: the server calls
        it once after start, in a thread.

        Why: a new session takes a slot that holds no other session's conversation (``_free_slots_by_cost``),
        on a fresh server an empty one, where its first turn used to prefill the system prompt itself (~55
        tokens, ~300 ms on one thread) on its critical path. It stops at the first request in flight: llama-server
        batches every busy slot together, so each further warm-up would slow that request's every token (~8 slots
        of 0.2-0.6 s each on a 2-core box), while a later session's first turn only prefills its own ~55 tokens."""
        if self.tokenizer is None or not instructions:
            return 0
        # the empty user turn only closes the template: a real first turn shares everything up to its words
        msgs = steer_messages([{"role": "system", "content": instructions}, {"role": "user", "content": ""}], self.languages)
        ids = list(self.tokenizer(render_prompt(self.tokenizer, msgs, None, "auto"), add_special_tokens=False)["input_ids"])
        warmed = 0
        with httpx.Client(timeout=self._timeout, headers=self._headers) as client:
            for slot in range(self.server.parallel):
                if self._slot_of:  # traffic has come: warm no more
                    break
                if slot in self._used_slots:  # a request got there first: its own prompt is there
                    continue
                self._used_slots.add(slot)  # before the request: a new session may now pick it, queued behind this
                try:
                    resp = client.post(self.server.base_url + "/completions", json=prefill_only_body(ids, slot))
                except httpx.HTTPError as exc:
                    log.info("%s: warming slot %d failed (%s); its first turn prefills the system prompt", self.name, slot, exc)
                    break
                warmed += resp.status_code == 200
        return warmed

    def close_session(self, session_id: str) -> None:
        super().close_session(session_id)
        self._last_slot.pop(session_id, None)
        hint = self._hints.get(session_id)
        if hint is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(hint.cancel)

    def cache_state(self) -> dict[str, Any]:
        return {**super().cache_state(), "pacing": dict(self.pacing), "prefill_hints": dict(self.hinting)}

    warms_prompts = True

    async def warm_prompt(self, hint_id: str, req: GenRequest) -> None:
        """Prefill a session's likely next prompt (``Scheduler.prefill_hint``) into the slot that holds its
        conversation, as heavy pieces that wait while any short request starts (``prefill_in_pieces``): the
        hint never slows another session's first words. It yields to this session's real request, which
        cancels it and finds whatever it had prefilled in the slot.

        Only the session's own free slot is used (or, for a session that has none yet, the slot a request
        would take): moving it elsewhere would re-prefill its whole conversation and evict another's."""
        sid = req.session_id
        if not sid or sid in self._hints or self._own_tool_prompt(req):
            return  # one at a time (the next one covers more words); own tool prompts render differently
        if sum(1 for rid in self._slot_of if not rid.startswith(HINT_PREFIX)) > HINT_MAX_ANSWERS_IN_FLIGHT:
            self.hinting["skipped_busy_server"] += 1
            return
        last = self._last_slot.get(sid)
        if last is not None and (self._holders()[last][0] != sid or last in {s for s, _ in self._slot_of.values()}):
            self.hinting["skipped_busy_slot"] += 1
            return
        task = asyncio.current_task()
        assert task is not None
        self._hints[sid] = task
        try:
            taken = self._take_slot(hint_id, req)
            if taken is None:
                return
            ids, new = taken
            slot = self._slot_of[hint_id][0]
            self._slot_of[hint_id] = (slot, True)  # in the batch order a hint is the heaviest of prefills
            self.hinting["hints"] += 1
            if new >= 2:  # one new token is the real request's own first forward anyway
                done = await prefill_in_pieces(self.http_client(), self.server.base_url + "/completions", ids,
                                               cached=len(ids) - new, piece=self.prefill_piece_tokens or new,
                                               slot=slot, shorts=self.shorts, whole=True)
                self.hinting["prefilled_tokens"] += new if done["complete"] else 0
                log.debug("%s: session %s prefilled %d of %d prompt tokens ahead (%s)", self.name, sid, new, len(ids), done)
        except asyncio.CancelledError:
            self.hinting["cancelled"] += 1
            raise
        finally:
            self._slot_of.pop(hint_id, None)
            if self._hints.get(sid) is task:
                del self._hints[sid]

    async def _yield_hint(self, session_id: str | None) -> None:
        """A real request of a session whose hint is still prefilling: stop the hint (its pieces so far stay
        cached in the slot) so the request takes the slot now."""
        hint = self._hints.get(session_id) if session_id else None
        if hint is not None and not hint.done():
            hint.cancel()
            await asyncio.wait([hint])

    def _pace(self, req: GenRequest, taken: tuple[list[int], int] | None, own_prompt: bool) -> AnswerPace | None:
        """A pace for a spoken answer whose prompt ids and slot are known (a continuation needs both: the
        ids to send, the slot whose cache holds them); tool turns and token output are never paused."""
        if (self.pace_ahead_s is None or taken is None or own_prompt or req.tools or req.output != "text"
                or self.tokenizer is None):
            return None
        return AnswerPace(self.pace_ahead_s)

    def _continuation(self, req: GenRequest, prompt: list[int], pace: AnswerPace) -> GenRequest | None:
        """The rest of a paused answer: its prompt plus its text so far, as a completion in the same slot
        (``request`` adds the slot); None when its token budget is spent."""
        left = req.max_tokens - pace.tokens
        if left < 1:
            return None
        said = list(self.tokenizer("".join(pace.text), add_special_tokens=False)["input_ids"])
        return dataclasses.replace(req, messages=None, prompt_ids=[*prompt, *said], max_tokens=left, tools=None)

    forks_answers = True

    def fork_request(self, rid: str, req: GenRequest, prompt: list[int] | None, said: str, banned: list[str],
                     used_tokens: int, no_end: bool = False) -> GenRequest | None:
        """Answer ``rid`` continued after ``said`` (``RepeatGuard.fork``): a completion of its fitted prompt plus
        its text so far (the same slot: its KV holds both, so little is prefilled), with the first token of each
        ``banned`` word after that text banned by ``logit_bias``; ``no_end`` (an answer that would end as an
        earlier one's copy): one token only, with every token that would end the answer there banned
        (``ending_token_ids``), after which the answer goes on unbanned (the next call, without ``no_end``).

        Why steer at the end rather than ask again from the start: a retry needs the whole answer held until it is
        known not to be a copy, which costs first-audio time on every answer that starts like an earlier one;
        forked, the answer is spoken as it comes."""
        left = req.max_tokens - used_tokens
        if self.tokenizer is None or not prompt or left < 1:
            return None
        head = said.rstrip()

        def encode(text: str) -> list[int]:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

        said_ids = encode(head)
        bans: list[int] = []
        # each word as the answer would go on with it, lower case or capitalised (the earlier answers' words are
        # known in lower case)
        for word in sorted({v for w in banned for v in (w, w.lower(), w[:1].upper() + w[1:])}):
            with_word = encode(f"{head} {word}" if head else word)
            k = next((i for i, (a, b) in enumerate(zip(said_ids, with_word)) if a != b), len(said_ids))
            if k < len(with_word) and with_word[k] not in bans:
                bans.append(with_word[k])
        if banned and not bans and not no_end:
            return None  # nothing to steer it by: it would say the same again
        if no_end:
            bans += [t for t in self._ending_ids if t not in bans]
        ids = [*prompt, *said_ids]
        self._bans[rid] = bans
        self.prompt_ids[rid] = ids  # the slot picker finds the session's slot by it
        return dataclasses.replace(req, messages=None, prompt_ids=ids, max_tokens=1 if no_end else left, tools=None)

    @functools.cached_property
    def _ending_ids(self) -> list[int]:
        """The tokens that end an answer, once per thinker (a scan of the vocabulary): ending punctuation and every
        special token (end of text and the chat template's end of turn, whatever the model calls them)."""
        from omni_rt.engine.prompt.repetition import ending_token_ids

        return ending_token_ids(self.tokenizer, len(self.tokenizer), self.tokenizer.all_special_ids)

    def _request(self, req: GenRequest) -> tuple[str, dict[str, Any]]:
        if not self._own_tool_prompt(req):
            return super().request(req)
        text = render_prompt(self.tokenizer, req.messages, req.tools, req.tool_choice)
        forced = forced_schema(req)
        if forced is not None:
            text += TOOL_OPEN  # the answer is a call: its framing is given, its JSON constrained
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        body = request_body(dataclasses.replace(req, messages=None, prompt_ids=ids, tools=None), self.model, self.dialect)
        if forced is not None:
            from omni_rt.engine.prompt.repetition import LLAMA_CPP_PENALTY_KEYS

            for key in LLAMA_CPP_PENALTY_KEYS:  # a call's JSON repeats its keys and the schema's names by design
                body.pop(key, None)
            body["json_schema"] = forced  # llama-server decodes under the grammar it compiles from this
            # a call's JSON is not a spoken answer: give it room (a cut call is no call at all)
            body["max_tokens"] = max(body["max_tokens"], FORCED_CALL_MAX_TOKENS)
        elif (still := callable_tools(req.tools, req.tool_choice, req.messages)) is not None:
            body["grammar"] = answer_gbnf(still)
        return "/completions", body

    async def generate(self, request_id: str, req: GenRequest) -> AsyncIterator[Delta]:
        if not self.server.alive:  # restarting after a crash: the next answer waits for it, rather than fail
            await asyncio.to_thread(self.server.wait_ready, self.server.ready_timeout_s)
        restarts, pid = self.server.restarts, self.server.proc.pid if self.server.proc else None
        started = time.perf_counter()
        own_prompt = self._own_tool_prompt(req)
        framed = bool(req.tools) and forces_call(req.tool_choice) and own_prompt
        await self._yield_hint(req.session_id)
        taken = self._take_slot(request_id, req)
        slot, heavy = self._slot_of.get(request_id, (None, False))
        short = slot is not None and not heavy  # holds back heavy pieces until its first tokens
        if short:
            self.shorts.enter()
        try:
            if heavy and taken is not None and self.prefill_piece_tokens and not own_prompt:
                ids, new = taken  # (an own tool prompt is rendered differently from these ids)
                self.shorts.begin_heavy(request_id, started)
                await prefill_in_pieces(self.http_client(), self.server.base_url + "/completions", ids,
                                        cached=len(ids) - new, piece=self.prefill_piece_tokens, slot=slot,
                                        shorts=self.shorts, key=request_id, since=started)
            if framed:  # the call's opening was part of the prompt: the parser sees the whole block
                yield Delta(text=TOOL_OPEN)
            pace = self._pace(req, taken, own_prompt)
            leg: GenRequest | None = req
            tokens, before, cached = 0, 0, 0
            while leg is not None:
                stepped_out, leg_start = False, True
                async with aclosing(super().generate(request_id, leg)) as stream:
                    async for d in stream:
                        tokens += bool(d.text or d.token_ids)
                        if tokens or d.finish_reason:
                            self.shorts.end_heavy(request_id)  # its first token: younger heavy pieces go on
                        if short and (tokens >= self.short_priority_tokens or d.finish_reason):
                            short = False
                            self.shorts.leave()
                        if pace is not None:
                            pace.feed(d.text)
                            if leg is req and d.timings and not cached:
                                cached = int(d.timings.get("cache_n") or 0)
                            if leg is not req:
                                self._continued(d, len(taken[0]), before, cached, leg_start and d.timings is not None)
                                leg_start = leg_start and d.timings is None
                        yield d
                        if (pace is not None and not short and not d.finish_reason
                                and pace.may_step_out(self.shorts.count > 0)):
                            stepped_out = True
                            break
                if not stepped_out:
                    break
                await self.shorts.wait_idle(pace.pause_cap_s())
                before = pace.tokens
                leg = self._continuation(req, taken[0], pace)
                pace.resumed()
                self.pacing["pauses"] += 1
                if leg is None:
                    yield Delta(finish_reason="length")
            if framed:
                yield Delta(text=TOOL_CLOSE)
        except UpstreamError as exc:
            # a killed process closes its sockets a moment before it can be reaped: look for up to 0.5 s
            for _ in range(10):
                if self.server.restarts != restarts or not self.server.alive:
                    break
                await asyncio.sleep(0.05)
            if self.server.restarts != restarts or not self.server.alive:
                raise UpstreamError(
                    f"the llama.cpp thinker (llama-server pid {pid}) exited mid-answer and is being "
                    f"restarted; this answer is lost, the next one will be served ({exc})",
                    code="engine_crashed",
                ) from exc
            raise
        finally:
            if short:
                self.shorts.leave()
            self.shorts.end_heavy(request_id)
            self._slot_of.pop(request_id, None)
            self._bans.pop(request_id, None)


def create_llama_cpp_thinker(
    server_args: LlamaServerArgs,
    binary: str | os.PathLike,
    *,
    name: str = "thinker",
    tokenizer_loader: Callable[[], Any] | None = None,
    default_max_tokens: int = 256,
    history_tokens: int | None = None,
    **remote_kwargs: Any,
):
    """A not-yet-started scheduler whose server is already launched: the model loads in its own process while
    this one builds the rest (``tokenizer_loader``, called after the launch, and the pipeline's other stages);
    ``start()`` waits for its health, ``stop()`` ends it."""
    server = LlamaServer(binary, server_args)
    server.launch()
    try:
        tokenizer = tokenizer_loader() if tokenizer_loader is not None else None
        return LlamaCppThinker(server, history_tokens=history_tokens, model="omni-rt-thinker", tokenizer=tokenizer,
                               name=name, default_max_tokens=default_max_tokens, dialect="llama.cpp", **remote_kwargs)
    except BaseException:
        server.stop()
        raise
