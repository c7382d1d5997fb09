"""Issue #12, thinker side: chunked prefill keeps a bystander's first token near its solo value while a
3000-token prompt prefills; long-turn sessions are trimmed by tokens and keep answering; huge items cost a
length check, not a tokenisation; closed sessions keep no KV; the KV buffer shrinks when slots free.

The bystander test uses the CPU preset's real thinker (SmolLM2); the others a tiny random-init Llama saved
with SmolLM2's real tokenizer (real chat template, real token counts, instant forward passes).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.testing.stage_driver import collect, send, wait_until

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}
WORDS = "the quick brown fox jumps over the lazy dog near a river bank".split()


def words(n: int, salt: int) -> str:
    return " ".join(f"{WORDS[(i + salt) % len(WORDS)]}" for i in range(n)) + f" turn {salt}."


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory) -> Path:
    """A 2-layer Llama with SmolLM2's vocabulary and tokenizer, 4096 positions (like the real thinker)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = weights.load_tokenizer(weights.ensure_smollm2())
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_chat")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _sched(path, **kw):
    kw.setdefault("max_batch_size", 4)
    sched = create_ar_scheduler(str(path), cpu_threads=1, **kw)
    sched.start()
    return sched


def _first_token_s(sched, rid: str, msgs: list[dict], max_tokens: int = 1) -> tuple[float, dict]:
    """Wall time from submit to the first stream chunk; returns it with the request's result."""
    t0 = time.perf_counter()
    send(sched, rid, {"messages": msgs, "max_tokens": max_tokens})
    first = None
    while True:
        msg = sched.outbox.get(timeout=120)
        if msg.request_id != rid:
            continue
        if msg.type == "stream" and first is None:
            first = time.perf_counter() - t0
        if msg.type == "error":
            raise AssertionError(msg.data)
        if msg.type == "result":
            return first, msg.data


@pytest.mark.integration  # a real model runs for seconds
def test_bystander_first_token_while_a_long_prompt_prefills():
    sched = _sched("smollm2")
    try:
        q = [SYSTEM, QUESTION]
        _first_token_s(sched, "warm", q)
        solo = statistics.median(_first_token_s(sched, f"solo{i}", q)[0] for i in range(3))
        heavy = [SYSTEM, {"role": "user", "content": words(2400, 0)}]
        loaded, still_prefilling = [], []
        for i in range(3):
            heavy[1]["content"] = words(2400, i + 1)  # no prefix shared with the previous heavy prompt
            send(sched, f"heavy{i}", {"messages": heavy, "max_tokens": 4})
            # wait until the long prompt is well into its prefill
            assert wait_until(lambda: sched.cache_state()["prefilling"] == 1, timeout=30)
            t, res = _first_token_s(sched, f"by{i}", q, max_tokens=6)
            loaded.append(t)
            # the bystander overtook it and decoded its whole answer between the long prompt's chunks
            still_prefilling.append(sched.cache_state()["prefilling"] == 1 and res["completion_tokens"] >= 1)
            sched.abort(f"heavy{i}")
            assert res["finish_reason"] in ("length", "stop")
            assert collect(sched, [f"heavy{i}"], timeout=60)[f"heavy{i}"]["result"]["finish_reason"] == "abort"
        # the scheduling property, independent of machine speed: the short request overtook the long prefill
        assert all(still_prefilling), still_prefilling
        # the figure is 2x solo (measured in latency_bench.soak); here only a bound no shared 2-core machine
        # should cross (a run at load 4-5 saw 0.79 s against 0.18 s solo, with the property above holding)
        assert statistics.median(loaded) <= 4 * solo + 0.8, (solo, loaded)
        assert wait_until(lambda: sched.live_state() == 0, timeout=30)
    finally:
        sched.stop()


def test_long_turn_session_all_answered_with_token_trim_and_prefix_reuse(tiny_chat):
    sched = _sched(tiny_chat)
    try:
        msgs, results = [SYSTEM], []
        for turn in range(15):
            msgs.append({"role": "user", "content": words(300, turn)})
            rid = f"t{turn}"
            send(sched, rid, {"messages": msgs, "max_tokens": 16, "session_id": "heavy", "max_prompt_tokens": 2000,
                              "ignore_eos": True})
            out = collect(sched, [rid], timeout=60)[rid]
            assert out["error"] is None, (turn, out["error"])
            res = out["result"]
            results.append(res)
            msgs.append({"role": "assistant", "content": res["text"] or "ok"})
            assert wait_until(lambda: "heavy" in sched.prefix_store)
        prompts = [r["prompt_tokens"] for r in results]
        assert max(prompts) <= 2000
        trims = [i for i in range(1, 15) if prompts[i] < prompts[i - 1]]
        assert trims, prompts  # history was trimmed by tokens (no 'does not fit max_seq_len' failure)
        # a trim moves the cut far enough that the following turns reuse the kept prefix again
        reused = [i for i in range(1, 15) if results[i]["cached_tokens"] > 100]
        assert len(reused) >= 9, [(r["prompt_tokens"], r["cached_tokens"]) for r in results]
        assert len(trims) <= 4, prompts
        # instructions kept, newest turn kept, oldest turn gone
        _, ids = sched.history.fit("probe", msgs + [{"role": "user", "content": "last question"}], 2000)
        text = sched.tokenizer.decode(ids)
        assert text.count(SYSTEM["content"]) == 1 and "last question" in text and "turn 0." not in text
    finally:
        sched.stop()


def test_huge_items_cost_a_length_check_not_a_tokenisation(tiny_chat):
    sched = _sched(tiny_chat)
    try:
        huge = "word " * 300_000  # 1.5 MB
        msgs = [SYSTEM] + [m for _ in range(8) for m in ({"role": "user", "content": huge},
                                                         {"role": "assistant", "content": "ok"})]
        t0 = time.perf_counter()
        send(sched, "old-huge", {"messages": msgs + [QUESTION], "max_tokens": 4, "session_id": "s"})
        send(sched, "new-huge", {"messages": [SYSTEM, {"role": "user", "content": huge}], "max_tokens": 4})
        out = collect(sched, ["old-huge", "new-huge"], timeout=60)
        elapsed = time.perf_counter() - t0
        assert out["old-huge"]["error"] is None and out["old-huge"]["result"]["prompt_tokens"] < 100
        msg, code = out["new-huge"]["error"]
        assert code == "context_length_exceeded" and "newest message" in msg
        assert elapsed < 10, elapsed  # 12 MB of text never reached the tokenizer (that alone takes longer)
    finally:
        sched.stop()


def test_dropped_answers_leave_no_kv_for_closed_sessions(tiny_chat):
    sched = _sched(tiny_chat)
    try:
        for i in range(100):
            sid, rid = f"sess{i}", f"ans{i}"
            send(sched, rid, {"messages": [SYSTEM, QUESTION], "max_tokens": 200, "session_id": sid,
                              "ignore_eos": True})
            while True:  # mid-answer: the first tokens are out
                msg = sched.outbox.get(timeout=30)
                if msg.request_id == rid and msg.type == "stream":
                    break
            if i % 2:  # both orders the session layer may produce
                sched.close_session(sid)
                sched.abort(rid)
            else:
                sched.abort(rid)
                sched.close_session(sid)
        send(sched, "alive", {"messages": [SYSTEM, QUESTION], "max_tokens": 2, "session_id": "alive"})
        collect(sched, ["alive"], timeout=30)
        assert wait_until(lambda: sched.live_state() == 0, timeout=30)
        assert wait_until(lambda: "alive" in sched.prefix_store)
        state = sched.cache_state()
        assert state["closed_session_prefixes"] == 0, state
        assert state["cached_prefixes"] == 1, state  # only the open session keeps its prefix
        sched.close_session("alive")
        assert wait_until(lambda: sched.cache_state()["cached_prefixes"] == 0)
        assert sched.cache_state()["cached_tokens"] == 0 and sched.cache_state()["prefix_bytes"] == 0
    finally:
        sched.stop()


def test_kv_buffer_returns_when_slots_free(tiny_chat):
    sched = _sched(tiny_chat, prefix_reuse=False)
    try:
        idle = sched.engine.kv_bytes()
        per_token = sched.engine.kv.bytes_per_token()
        send(sched, "long", {"prompt_ids": [100 + i % 50 for i in range(3000)], "max_tokens": 300, "ignore_eos": True})
        for i in range(3):
            send(sched, f"short{i}", {"prompt_ids": [7, 8, 9], "max_tokens": 30, "ignore_eos": True})
        peak = idle
        assert wait_until(lambda: sched.live_state() > 0, timeout=10)
        deadline = time.monotonic() + 60
        while sched.live_state() and time.monotonic() < deadline:
            peak = max(peak, sched.engine.kv_bytes())
            time.sleep(0.005)
        assert sched.live_state() == 0
        assert peak >= 3000 * per_token  # it grew for the long prompt ...
        assert peak <= 4 * 4096 * per_token
        assert wait_until(lambda: sched.engine.kv_bytes() == idle)  # ... and gave it all back
    finally:
        sched.stop()


@pytest.mark.parametrize("static_kv,short_priority_tokens", [(False, 1), (True, 1), (False, 6)])
def test_chunked_interleaved_prefill_matches_one_at_a_time_greedy(tmp_path, static_kv, short_priority_tokens):
    """Tiny chunks force every prompt through several chunks, overtaking, slot moves and swaps while others
    decode; greedy outputs must equal ``model.generate`` one request at a time (static_kv: the GPU layout,
    where a decode step also writes the bucket's free rows; short_priority_tokens: long prefills held back
    while short requests get their first tokens)."""
    import torch

    from tiny_models import build_tiny_model

    path = build_tiny_model("llama", tmp_path / "m")
    model = weights.load_model(path)
    prompts = [list(range(10, 40)), [5, 6, 7], list(range(60, 83)), [9] * 17, list(range(100, 111))]
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)[0, len(p):]
        toks = out.tolist()
        refs.append(toks[: toks.index(0)] if 0 in toks else toks)
    sched = create_ar_scheduler(str(path), max_batch_size=4, static_kv=static_kv,
                                short_priority_tokens=short_priority_tokens)
    sched.prefill_chunk_tokens, sched.prefill_tokens_while_decoding = 8, 3
    sched.start()
    try:
        for i, p in enumerate(prompts[:2]):
            send(sched, f"r{i}", {"prompt_ids": p, "max_tokens": 12})
        time.sleep(0.05)
        for i, p in enumerate(prompts[2:], start=2):
            send(sched, f"r{i}", {"prompt_ids": p, "max_tokens": 12})
        out = collect(sched, [f"r{i}" for i in range(len(prompts))])
        for i, ref in enumerate(refs):
            assert out[f"r{i}"]["result"]["token_ids"] == ref, i
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()


def _hold_trace(path: Path, short_priority_tokens: int, iterations: int = 10) -> list[tuple[int, int, int]]:
    """A 60-token prompt prefilling in chunks of 8 (3 while others decode), then a 3-token one arrives; the
    scheduler is driven one iteration at a time. Per iteration: (the short one's tokens before it, the long
    one's prefill position before, after)."""
    sched = create_ar_scheduler(str(path), max_batch_size=4, short_priority_tokens=short_priority_tokens)
    sched.prefill_chunk_tokens, sched.prefill_tokens_while_decoding = 8, 3
    sched._running.set()  # driven here instead of by its thread, so each step can be read
    send(sched, "long", {"prompt_ids": list(range(10, 70)), "max_tokens": 4})
    sched._iteration(None, None)
    assert sched._prefill_pos["long"] == 8
    send(sched, "short", {"prompt_ids": [5, 6, 7], "max_tokens": 12})
    sched._drain_inbox(block=False)
    short = sched._live["short"]
    trace = []
    for _ in range(iterations):
        n, before = len(short.sampled), sched._prefill_pos["long"]
        sched._iteration(None, None)
        trace.append((n, before, sched._prefill_pos["long"]))
    return trace


def test_long_prefill_waits_for_a_short_requests_first_tokens(tmp_path, monkeypatch):
    """``short_priority_tokens`` (issue #26): while a short request has fewer than N tokens, a long prompt's
    prefill does not advance, so each of those tokens is one decode step rather than a decode step plus a
    prefill share; then the long prefill goes on. Without it (N=1) the long one advances in the same steps;
    with the hold capped at 0 s it is never held."""
    from omni_rt.engine.builtin import ar_scheduler
    from tiny_models import build_tiny_model

    path = build_tiny_model("llama", tmp_path / "m")
    young = lambda trace: [(b, a) for n, b, a in trace if 1 <= n < 4]  # noqa: E731
    held = _hold_trace(path, short_priority_tokens=4)
    assert young(held) and all(b == a for b, a in young(held)), held
    assert any(a > b for n, b, a in held if n >= 4), held  # ... and it goes on after them
    unheld = _hold_trace(path, short_priority_tokens=1)
    assert young(unheld) and all(a > b for b, a in young(unheld)), unheld
    monkeypatch.setattr(ar_scheduler, "HOLD_CAP_S", 0.0)
    capped = _hold_trace(path, short_priority_tokens=4)
    assert young(capped) and all(a > b for b, a in young(capped)), capped


def test_idle_thinker_hands_freed_heap_back_once(tiny_chat):
    """Freed KV copies and activations go back to the OS when the thinker goes idle (engine/heap.py): once per
    idle period after something was freed, not on every idle wake-up, and never while requests run."""
    sched = _sched(tiny_chat)
    try:
        send(sched, "a", {"messages": [SYSTEM, QUESTION], "max_tokens": 5, "session_id": "s"})
        collect(sched, ["a"], timeout=30)
        assert wait_until(lambda: sched.metrics["heap_trims"] == 1, timeout=10)
        time.sleep(1.2)  # two more idle wake-ups of the inbox wait (0.5 s each): nothing new freed
        assert sched.metrics["heap_trims"] == 1
        sched.close_session("s")  # dropping the session's cached prefix frees memory again
        assert wait_until(lambda: sched.metrics["heap_trims"] == 2, timeout=10)
        assert sched.metrics["heap_trim_s"] < 1.0
    finally:
        sched.stop()
