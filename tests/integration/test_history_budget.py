"""A session's history has a token budget (issues #26, #27): long sessions of big turns stay answered on the
llama.cpp thinker and the built-in engine, what was trimmed shows in /debug/state, and an item too large for
any prompt is refused when it is created, naming its field.

Before the budget, 28 turns of ~400 words on the llama.cpp thinker failed from turn 19 on ("8335 tokens exceeds
context 8192"), and every turn after that too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import websockets
from rt_helpers import validate_event

from omni_rt.engine.prompt.history import HistoryWindow, PromptTooLong
from omni_rt.engine.llama_cpp.build import locate_binary

_WORDS = ("I have been thinking about my garden this spring and the tomatoes the beans the roses and the small "
          "apple tree near the fence that my grandmother planted many years ago when she first moved here").split()


def big_turn(turn: int, words: int = 400) -> str:
    body = " ".join(_WORDS[(i + turn) % len(_WORDS)] for i in range(words))
    return f"{body}. In one sentence: what should I plant next to the apple tree? (turn {turn})"


@pytest.fixture(scope="module")
def tokenizer():
    from omni_rt.engine.weights.loader import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2"))


# ---------------------------------------------------------------------------------------------- live servers
async def _recv(ws: Any, want: set[str], errors: list[dict[str, Any]]) -> dict[str, Any]:
    while True:
        event = json.loads(await ws.recv())
        validate_event(event)
        if event["type"] == "error":
            errors.append(event["error"])
        if event["type"] in want:
            return event


async def _open(url: str):
    ws = await websockets.connect(f"{url}/v1/realtime", max_size=None, open_timeout=60, close_timeout=10)
    assert json.loads(await ws.recv())["type"] == "session.created"
    await ws.send(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["text"], "instructions": "Answer in one short sentence."}}))
    await _recv(ws, {"session.updated"}, [])
    return ws


async def _long_session(server, turns: int) -> None:
    ws = await _open(server.ws_url)
    try:
        errors: list[dict[str, Any]] = []
        done = []
        for turn in range(turns):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": big_turn(turn)}]}}))
            await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 24}}))
            event = await asyncio.wait_for(_recv(ws, {"response.done"}, errors), 120)
            done.append(event["response"])
        assert not errors, errors
        assert [r["status"] for r in done] == ["completed"] * turns, [r.get("status_details") for r in done]
        assert all(r["output"] and r["output"][0]["content"][0]["text"].strip() for r in done)
        prompts = [r["usage"]["input_tokens"] for r in done]
        state = (await asyncio.to_thread(httpx.get, f"{server.http_url}/debug/state", timeout=10)).json()
        history = state["cache"]["thinker"]["history"]
        assert history["session_tokens"] == 1024, history  # 8192 KV tokens over 8 slots on both engines
        assert max(prompts) <= history["session_tokens"], (prompts, history)
        assert history["trims"] >= 1 and history["trimmed_messages"] >= 2, history
        assert len(history["sessions"]) >= 1, history  # this open session's last trim
        # the session lives on: the oversized item is refused at creation, naming its field, and nothing breaks
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "hello"}, {"type": "input_text", "text": big_turn(0, 4000)}]}}))
        refused = await asyncio.wait_for(_recv(ws, {"error", "conversation.item.added"}, []), 30)
        assert refused["type"] == "error", refused
        err = refused["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == "item.content[1].text", err
        assert str(history["max_item_tokens"]) in err["message"] and "127.0.0.1" not in err["message"], err
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "And a short one?"}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 16}}))
        last = await asyncio.wait_for(_recv(ws, {"response.done"}, []), 120)
        assert last["response"]["status"] == "completed", last["response"].get("status_details")
    finally:
        await ws.close()


@pytest.mark.skipif(locate_binary() is None, reason="llama-server not built (python -m omni_rt.engine.llama_cpp build)")
async def test_long_session_of_big_turns_stays_answered_on_llama_cpp(live_server):
    await _long_session(live_server, turns=4)
    history = httpx.get(f"{live_server.http_url}/debug/state", timeout=10).json()["cache"]["thinker"]["history"]
    assert history["context_tokens"] == 1024, history  # llama-server's own slot n_ctx (/props): per-slot KV


def test_short_requests_take_lower_llama_slots_than_heavy_prefills(tokenizer):
    """llama-server fills each batch slot by slot in slot order: a short new part must sit below a heavy one."""
    from omni_rt.engine.llama_cpp.thinker import LlamaCppThinker
    from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
    from omni_rt.engine.prompt.request import parse_request

    server = LlamaServer("/bin/true", LlamaServerArgs("unused.gguf", parallel=4))  # never started: slot choice is host-side
    assert server.args[server.args.index("-b") + 1] == "16" and "--no-kv-unified" in server.args
    sched = LlamaCppThinker(server, tokenizer=tokenizer, model="m", name="t", dialect="llama.cpp")
    sched.history = HistoryWindow(tokenizer, 1024)

    def take(rid: str, sid: str, n_new: int, prefix: list[int] | None = None) -> int:
        req = parse_request({"messages": [{"role": "user", "content": "x"}], "session_id": sid}, 8, {}, None)
        sched.prompt_ids[rid] = (prefix or []) + list(range(100, 100 + n_new))
        sched._take_slot(rid, req)
        return sched.request(req, rid)[1]["id_slot"]

    assert take("h1", "heavy", 500) == 3  # a long prefill: the highest slot
    assert take("s1", "short", 20) == 0  # a bystander: the lowest, ahead of it in every batch
    sched._slot_of.pop("s1")
    assert take("s2", "short", 10, prefix=list(range(100, 120))) == 0  # keeps its slot (its prefix is there)
    assert take("h2", "other", 400) == 2  # a second heavy one: the highest free
    assert set(sched._slot_of) == {"h1", "s2", "h2"}


def test_a_session_keeps_its_slot_even_above_a_busy_heavy_prefill(tokenizer):
    """Moved below a heavy prefill for the batch order, a session would re-prefill its whole conversation in
    another session's slot and evict that one's (which then moves in turn: at 8 sessions x 10 turns that
    cascade made TTFA p50 3.2 s); its own free slot always wins."""
    from omni_rt.engine.llama_cpp.thinker import LlamaCppThinker
    from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
    from omni_rt.engine.prompt.request import parse_request

    sched = LlamaCppThinker(LlamaServer("/bin/true", LlamaServerArgs("unused.gguf", parallel=4)), tokenizer=tokenizer, model="m",
                            name="t", dialect="llama.cpp")
    sched.history = HistoryWindow(tokenizer, 1024)

    def take(rid: str, sid: str, ids: list[int]) -> int:
        req = parse_request({"messages": [{"role": "user", "content": "x"}], "session_id": sid}, 8, {}, None)
        sched.prompt_ids[rid] = ids
        sched._take_slot(rid, req)
        return sched.request(req, rid)[1]["id_slot"]

    conversation = list(range(100, 300))
    assert take("a-1", "a", list(range(1000, 1010))) == 0
    assert take("b-1", "b", conversation) == 3  # heavy: the highest slot
    sched._slot_of.pop("a-1"), sched._slot_of.pop("b-1")
    assert take("h-1", "h", list(range(2000, 2300))) == 2  # a new heavy prompt, busy from now on
    sched._slot_of["h-1"] = (0, True)  # ... and say it sits below everything
    assert take("b-2", "b", conversation + list(range(300, 320))) == 3  # b's 20 new tokens: its own slot
    assert sched._slot_of["b-2"] == (3, False)


def test_a_new_session_takes_a_slot_no_other_session_holds_its_prefix_in(tokenizer):
    """With one prefix per slot (``--cache-ram 0``) a session's first turn must not evict another session's
    conversation while a slot nobody holds is free; once every slot holds one, the least recently served
    session's goes first, and a closed session's slot is free for anyone."""
    from omni_rt.engine.llama_cpp.thinker import LlamaCppThinker
    from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
    from omni_rt.engine.prompt.request import parse_request

    sched = LlamaCppThinker(LlamaServer("/bin/true", LlamaServerArgs("unused.gguf", parallel=4)), tokenizer=tokenizer, model="m",
                            name="t", dialect="llama.cpp")
    sched.history = HistoryWindow(tokenizer, 1024)
    turns: dict[str, int] = {}

    def turn(sid: str) -> int:
        """One short request of session ``sid``, finished at once; returns its slot."""
        turns[sid] = turns.get(sid, 0) + 1
        rid = f"{sid}-{turns[sid]}"
        req = parse_request({"messages": [{"role": "user", "content": "x"}], "session_id": sid}, 8, {}, None)
        sched.prompt_ids[rid] = list(range(100, 110 + turns[sid]))
        sched._take_slot(rid, req)
        slot = sched.request(req, rid)[1]["id_slot"]
        sched._slot_of.pop(rid)
        return slot

    assert [turn("a"), turn("b"), turn("c")] == [0, 1, 2]  # before: "b" and "c" both took slot 0, "a"'s
    assert [turn("a"), turn("b"), turn("c")] == [0, 1, 2]  # each keeps its own
    assert turn("d") == 3
    assert turn("e") == 0  # every slot holds a prefix: the least recently served session's ("a")
    assert [turn("b"), turn("c"), turn("d"), turn("e")] == [1, 2, 3, 0]
    assert turn("a") == 1  # "a" comes back: now "b" is the least recently served
    sched.close_session("c")
    assert turn("f") == 2  # a closed session's slot before any live one's

    fresh = LlamaCppThinker(LlamaServer("/bin/true", LlamaServerArgs("unused.gguf", parallel=4)), tokenizer=tokenizer, model="m",
                            name="t2", dialect="llama.cpp")
    fresh.history = HistoryWindow(tokenizer, 1024)
    sched = fresh
    req = parse_request({"messages": [{"role": "user", "content": "x"}], "session_id": "h"}, 8, {}, None)
    sched.prompt_ids["h-1"] = list(range(100, 400))
    sched._take_slot("h-1", req)
    assert sched._slot_of.pop("h-1")[0] == 3  # a heavy prompt: the highest slot
    sched.close_session("h")
    assert turn("g") == 3  # a closed session's slot (its system prompt is there) before the never used 0-2
    sched.prompt_ids["h2-1"] = list(range(100, 400))
    sched._take_slot("h2-1", parse_request({"messages": [{"role": "user", "content": "x"}], "session_id": "h2"}, 8, {}, None))
    assert sched._slot_of["h2-1"][0] == 2  # busy heavy: the highest free
    assert turn("k") == 0  # a short one below the busy heavy one, not in "g"'s slot 3 (nor above 2)


def test_a_front_trimmed_prompt_counts_its_kept_turns_as_cached_with_cache_reuse(tokenizer):
    """What llama-server's ``--cache-reuse`` keeps (chunks shifted into place past the first difference) is not
    new: a trimmed history stays a light request (no heavy pieces, its own slot) instead of looking like a
    whole new prompt. Short coincidental matches (< the chunk) are not counted."""
    from omni_rt.engine.prompt.prefix import reusable_len

    system, old_turns, kept, new = list(range(20)), list(range(100, 300)), list(range(300, 700)), list(range(900, 930))
    before, after = system + old_turns + kept, system + kept + new
    assert reusable_len(before, after, 0) == 20  # the prefix only
    assert reusable_len(before, after, 64) == 20 + 400  # + the kept turns, shifted
    assert reusable_len(before, system + [5, 6, 7] + new, 3) == 20  # no chunk of 3 in the cache past the prefix
    assert reusable_len(system + list(range(100, 160)) + list(range(400, 410)), system + list(range(400, 410)), 64) == 20
    window = HistoryWindow(tokenizer, 1024)
    window.new_tokens("s", before)
    assert window.new_tokens("s", after, reuse_chunk=64) == 30
    assert window.new_tokens("s", after + new, reuse_chunk=0) == 30  # prefix-only: what was after it


async def test_long_session_of_big_turns_stays_answered_on_the_builtin_engine(torch_server):
    await _long_session(torch_server, turns=4)
