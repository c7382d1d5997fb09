"""Engine attention: context-length buckets on the static-KV (GPU layout) path, packed-GQA attention against
transformers' stock SDPA, and batched prefill. All on CPU, tiny random-init Qwen2 (4 query / 2 KV heads)."""

from __future__ import annotations

import pytest
import torch

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.builtin.attention import PACKED_GQA, packed_gqa_attention
from omni_rt.engine.prompt.request import SamplingParams
from tiny_models import build_tiny_model
from omni_rt.engine.builtin.torch_engine import TorchEngine

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return build_tiny_model("qwen2", tmp_path_factory.mktemp("attn") / "qwen2")


def _engine(path, **kw) -> TorchEngine:
    kw.setdefault("max_batch_size", 3)
    kw.setdefault("max_seq_len", 64)
    return TorchEngine(weights.load_model(path), cuda_graphs=False, **kw)


def _generate(engine: TorchEngine, prompts: list[list[int]], steps: int, batched: bool):
    """Greedy tokens per prompt: all prompts decoding together, or each alone in slot 0."""
    shapes: set[tuple[int, int]] = set()
    if not batched:
        outs = []
        for p in prompts:
            engine.reset()
            out, shp = _generate(engine, [p], steps, batched=True)
            outs += out
            shapes |= shp
        return outs, shapes
    engine.reset()
    outs = [[engine.prefill(i, p, 0, GREEDY)] for i, p in enumerate(prompts)]
    for _ in range(steps):
        if engine.static_kv:
            shapes.add(engine._static_shape(len(prompts)))
        for out, tok in zip(outs, engine.decode(len(prompts))):
            out.append(tok)
    return outs, shapes


def test_static_kv_context_buckets_match_growable_and_one_at_a_time(qwen2):
    """Rows of 5, 12 and 20 prompt tokens decode 24 steps: the static step's context bucket goes 16 -> 32 ->
    64 (crossing two boundaries mid-answer); tokens equal one-at-a-time greedy and the growable path."""
    prompts = [list(range(10, 15)), list(range(30, 42)), list(range(60, 80))]
    static = _engine(qwen2, static_kv=True, context_buckets=(16, 32))
    assert static.context_buckets == [16, 32, 64]
    batched, shapes = _generate(static, prompts, 24, batched=True)
    assert {c for _, c in shapes} == {32, 64}  # the longest row starts past 16 and ends past 32
    alone, alone_shapes = _generate(static, prompts, 24, batched=False)
    assert {c for _, c in alone_shapes} == {16, 32, 64}
    growable, _ = _generate(_engine(qwen2, static_kv=False), prompts, 24, batched=True)
    assert batched == alone == growable
    # default buckets: powers of two from 256, then max_seq_len (the tiny model's positions cap it at 512)
    assert _engine(qwen2, max_seq_len=None).context_buckets == [256, 512]
    assert _engine(qwen2, max_seq_len=300).context_buckets == [256, 300]


def test_packed_gqa_is_default_and_sdpa_selectable(qwen2):
    assert _engine(qwen2).attention == PACKED_GQA
    assert _engine(qwen2, attention="sdpa").attention == "sdpa"
    with pytest.raises(ValueError, match="packed_gqa"):
        _engine(qwen2, attention="flash")


class _Heads(torch.nn.Module):
    num_key_value_groups = 3


@pytest.mark.parametrize("q_len", [1, 5])
def test_packed_gqa_function_matches_stock_sdpa(q_len):
    """The function alone against transformers' stock sdpa (which repeats K/V), decode and prefill shapes,
    with a bool mask that differs per row."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    b, kvh, length, d = 2, 2, 11, 8
    q = torch.randn(b, kvh * 3, q_len, d)
    k, v = torch.randn(b, kvh, length, d), torch.randn(b, kvh, length, d)
    start = torch.tensor([length - q_len, 3])  # row 1 is shorter: its tail is masked
    pos = start[:, None] + torch.arange(q_len)[None]
    mask = (torch.arange(length)[None, None, :] <= pos[:, :, None])[:, None]
    want, _ = sdpa_attention_forward(_Heads(), q, k, v, mask, scaling=0.3)
    got, _ = packed_gqa_attention(_Heads(), q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (b, q_len, kvh * 3, d)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_packed_gqa_logits_equal_stock_sdpa(qwen2):
    """Whole model through the engine's own forward: a prefill chunk on top of cached KV, then a batched decode
    step of rows of different lengths — packed-GQA logits equal the stock sdpa path's."""
    logits = {}
    for attention in ("packed_gqa", "sdpa"):
        eng = _engine(qwen2, attention=attention, static_kv=True)
        eng.prefill(0, list(range(3, 10)), 0, GREEDY, sample_next=False)
        eng.kv.for_prefill(0, 7)
        ids = torch.tensor([[20, 21, 22, 23]])
        pos = torch.arange(7, 11)
        allowed = (torch.arange(11)[None, :] <= pos[:, None])[None, None]
        pre = eng._forward(ids, pos[None], allowed)
        eng.prefill(1, [40, 41, 42], 0, GREEDY)
        eng.prefill(0, [24], 11, GREEDY)
        dec = eng._decode_forward(2, 16)
        logits[attention] = (pre, dec)
    for got, want in zip(logits["packed_gqa"], logits["sdpa"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static_kv", [False, True], ids=["growable", "static"])
def test_batched_prefill_matches_one_at_a_time(qwen2, static_kv):
    """3 prompts of different lengths prefilled in one forward (in non-consecutive slots, one of them on top of
    a cached first chunk) then decoded together: the same tokens as each prompt prefilled and decoded alone."""
    from omni_rt.engine.builtin.torch_engine import PrefillItem

    prompts = [list(range(10, 17)), [5, 6, 7], list(range(60, 79))]
    alone, _ = _generate(_engine(qwen2, static_kv=static_kv), prompts, 10, batched=False)
    eng = _engine(qwen2, static_kv=static_kv)
    eng.prefill(0, prompts[2][:6], 0, GREEDY, sample_next=False)  # slot 0's first chunk is already there
    items = [PrefillItem(2, prompts[0], 0, GREEDY), PrefillItem(1, prompts[1], 0, GREEDY),
             PrefillItem(0, prompts[2][6:], 6, GREEDY)]
    first = eng.prefill_batch(items)
    eng.swap(0, 2)  # decode rows in prompt order: slot 0 <- prompts[0], 2 <- prompts[2]
    outs = [[first[0]], [first[1]], [first[2]]]
    for _ in range(10):
        for out, tok in zip(outs, eng.decode(3)):
            out.append(tok)
    assert outs == alone
    chunks = eng.prefill_batch([PrefillItem(0, [3, 4], 30, GREEDY, sample_next=False),
                                PrefillItem(1, [3], 30, GREEDY, sample_next=False)])
    assert chunks == [-1, -1]
    with pytest.raises(ValueError, match="twice"):
        eng.prefill_batch([PrefillItem(0, [3], 0, GREEDY), PrefillItem(0, [4], 0, GREEDY)])


def test_scheduler_batches_concurrent_prefills(qwen2):
    """Three sessions arriving together are prefilled in one forward (budget permitting) and answer exactly
    what each answers alone (``model.generate``); a later short one joining running answers is prefilled
    whole in one forward of its own (at most a chunk), not in while-decoding shares."""
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.testing.stage_driver import collect, send

    prompts = [list(range(10, 15)), list(range(30, 42)), list(range(60, 80)), list(range(90, 99))]
    model = weights.load_model(qwen2)
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
        toks = out[0, len(p):].tolist()
        refs.append(toks[: toks.index(0)] if 0 in toks else toks)
    sched = create_ar_scheduler(str(qwen2), max_batch_size=4, async_decode=False)
    sched.prefill_chunk_tokens, sched.prefill_tokens_while_decoding = 64, 8
    calls: list[tuple[int, int]] = []  # (rows, width) of every prefill forward
    real = sched.engine.prefill_batch

    def recording(items):
        calls.append((len(items), max(len(it.token_ids) for it in items)))
        return real(items)

    sched.engine.prefill_batch = recording
    for i, p in enumerate(prompts[:3]):
        send(sched, f"r{i}", {"prompt_ids": p, "max_tokens": 10})
    sched.start()
    try:
        first = collect(sched, ["r0", "r1", "r2"])
        assert calls[0] == (3, 20)  # all three in one forward, padded to the longest
        send(sched, "long", {"prompt_ids": prompts[0], "max_tokens": 200, "ignore_eos": True})
        while sched.outbox.get(timeout=30).request_id != "long":
            pass  # "long" is decoding now
        n = len(calls)
        send(sched, "r3", {"prompt_ids": prompts[3], "max_tokens": 10})
        send(sched, "r1b", {"prompt_ids": prompts[1], "max_tokens": 10})
        last = collect(sched, ["r3", "r1b", "long"])
        for i in range(3):
            assert first[f"r{i}"]["result"]["token_ids"] == refs[i], i
        assert last["r3"]["result"]["token_ids"] == refs[3]
        assert last["r1b"]["result"]["token_ids"] == refs[1]
        # joining running answers: a short prompt (<= a chunk) goes whole, alone, in one forward (its first
        # token does not wait several decode steps); anything else stays within the while-decoding budget
        assert (1, 9) in calls[n:] and (1, 12) in calls[n:], calls[n:]
        assert all(rows * width <= 8 or (rows == 1 and width <= 64) for rows, width in calls[n:]), calls[n:]
    finally:
        sched.stop()


def test_switched_model_keeps_padding_masks(qwen2):
    """The engine switches the model object itself, so an ordinary call (2D padding mask, no slot cache) must
    still mean what it means with stock sdpa."""
    stock = weights.load_model(qwen2)
    packed = _engine(qwen2).model
    assert packed.config._attn_implementation == PACKED_GQA
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    with torch.inference_mode():
        want = stock(input_ids=ids, attention_mask=mask).logits[:, 3:]
        got = packed(input_ids=ids, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
