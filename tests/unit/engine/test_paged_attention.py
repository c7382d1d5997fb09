"""Paged decode (``omni_rt.engine.builtin.paged_attention``): page tables, the token-major slot cache as pages, and the
engine decoding through them. On CPU the page tables are read by ``GatherDecode`` (the reader FlashInfer is
checked against); the FlashInfer tests run only where CUDA and FlashInfer are installed."""

from __future__ import annotations

import pytest
import torch

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.builtin.kv_cache import SlotKVCache
from omni_rt.engine.builtin.paged_attention import GatherDecode, flashinfer_available, page_tables
from omni_rt.engine.prompt.request import SamplingParams
from tiny_models import build_tiny_model
from omni_rt.engine.builtin.torch_engine import TorchEngine

GREEDY = SamplingParams()
# rows cross page boundaries (16) mid-answer: 5 -> 35, 16 -> 46, 17 -> 47 tokens
PROMPTS = [list(range(10, 15)), list(range(30, 46)), list(range(60, 77))]
on_gpu_with_flashinfer = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashinfer_available()), reason="needs CUDA and FlashInfer ('omni-rt[gpu]')"
)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return build_tiny_model("qwen2", tmp_path_factory.mktemp("paged") / "qwen2")


def _engine(path, device="cpu", dtype=torch.float32, **kw) -> TorchEngine:
    kw.setdefault("max_batch_size", 3)
    kw.setdefault("max_seq_len", 64)
    kw.setdefault("cuda_graphs", False)
    return TorchEngine(weights.load_model(path, dtype, device), **kw)


def _greedy(engine: TorchEngine, steps: int = 30) -> list[list[int]]:
    engine.reset()
    outs = [[engine.prefill(i, p, 0, GREEDY)] for i, p in enumerate(PROMPTS)]
    for _ in range(steps):
        for out, tok in zip(outs, engine.decode(len(PROMPTS))):
            out.append(tok)
    return outs


def test_page_tables_list_each_rows_pages():
    t = page_tables([1, 16, 17, 0], page_size=16, pages_per_slot=4)
    assert t.indptr.tolist() == [0, 1, 2, 4, 5]
    assert t.indices.tolist() == [0, 4, 8, 9, 12]  # slot s owns pages 4s..4s+3
    assert t.last_page_len.tolist() == [1, 16, 1, 1]  # a 0-length (padding) row reads its first position
    assert t.indices.dtype == t.indptr.dtype == t.last_page_len.dtype == torch.int32
    with pytest.raises(ValueError, match="does not fit 4 pages of 16"):
        page_tables([65], page_size=16, pages_per_slot=4)


def test_token_major_cache_is_its_pages():
    """What ``update`` writes at (slot, position) is page ``slot * pages_per_slot + position // 16``, entry
    ``position % 16`` of the paged view, and still reads back through the head-major view; growing keeps it."""
    kv = SlotKVCache(num_layers=2, num_slots=3, num_kv_heads=2, head_dim=4, capacity=20, max_capacity=64,
                     page_size=16, dtype=torch.float32, device=torch.device("cpu"))
    assert kv.capacity == 32 and kv.pages_per_slot == 2  # rounded up to whole pages
    k_new = torch.randn(3, 2, 1, 4)
    pos = torch.tensor([0, 17, 31])
    kv.for_decode(3, pos, 32, paged=True)
    k_pages, v_pages = kv.update(k_new, -k_new, layer_idx=1)
    assert k_pages.shape == (6, 16, 2, 4) and k_pages.data_ptr() == kv.k[1].data_ptr()  # a view, no copy
    for slot, p in enumerate(pos.tolist()):
        page = slot * kv.pages_per_slot + p // 16
        assert torch.equal(k_pages[page, p % 16], k_new[slot, :, 0])
        assert torch.equal(v_pages[page, p % 16], -k_new[slot, :, 0])
        assert torch.equal(kv.k[1, slot, :, p], k_new[slot, :, 0])
    kv.ensure_capacity(40, 3)
    assert kv.capacity == 64 and kv.pages_per_slot == 4
    assert torch.equal(kv.paged(1)[0][2 * 4 + 1, 15], k_new[2, :, 0])  # slot 2, position 31: moved with its slot


class _CountingGather(GatherDecode):
    """The gather reader, counting its calls: proof that decode steps read the page tables."""

    plans = runs = 0

    def plan(self, tables, batch):
        self.plans += 1
        super().plan(tables, batch)

    def run(self, *args):
        self.runs += 1
        return super().run(*args)


@pytest.mark.parametrize("static_kv", [False, True], ids=["growable", "static"])
def test_paged_decode_matches_packed_gqa(qwen2, static_kv):
    """Greedy tokens through the page tables equal the packed-GQA path's, rows crossing page boundaries, on
    the growable (CPU) and the static (GPU layout, padded batch) paths."""
    ref = _greedy(_engine(qwen2, static_kv=static_kv, attention="packed_gqa"))
    eng = _engine(qwen2, static_kv=static_kv, attention="paged_sdpa")
    assert eng.attention == "paged_sdpa" and eng.kv.page_size == 16 and eng.context_buckets == [64]
    eng.paged = counting = _CountingGather(16, eng.device)
    assert _greedy(eng) == ref
    layers = eng.model.config.num_hidden_layers
    assert counting.plans == 30 and counting.runs == 30 * layers


def test_attention_choices_are_checked(qwen2):
    assert _engine(qwen2).attention == "omni_packed_gqa"  # auto on CPU
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="attention='flashinfer' needs a CUDA device"):
            _engine(qwen2, attention="flashinfer")
    with pytest.raises(ValueError, match="context_buckets do not apply to attention='paged_sdpa'"):
        _engine(qwen2, attention="paged_sdpa", context_buckets=(16,))
    with pytest.raises(ValueError, match="'flashinfer', 'paged_sdpa', got 'paged'"):
        _engine(qwen2, attention="paged")


def test_paged_decode_refuses_what_it_cannot_apply(tmp_path):
    """A sliding-window model is refused by name (the readers see whole pages), and auto keeps packed GQA."""
    windowed = build_tiny_model("qwen2", tmp_path / "sw", use_sliding_window=True, sliding_window=8,
                                max_window_layers=0)
    with pytest.raises(ValueError, match="attention='paged_sdpa' does not apply sliding-window attention"):
        _engine(windowed, attention="paged_sdpa")
    assert _engine(windowed).attention == "omni_packed_gqa"


@on_gpu_with_flashinfer
def test_flashinfer_reads_the_page_tables_as_gather_does():
    from omni_rt.engine.builtin.paged_attention import FlashInferDecode

    dev, dt = torch.device("cuda"), torch.float16
    kv_heads, dim, ps, per_slot = 2, 64, 16, 8
    g = torch.Generator(device="cpu").manual_seed(0)
    k = torch.randn(4 * per_slot, ps, kv_heads, dim, generator=g).to(dev, dt)
    v = torch.randn(4 * per_slot, ps, kv_heads, dim, generator=g).to(dev, dt)
    tables = page_tables([1, 16, 17, 100], ps, per_slot)
    module = torch.nn.Module()
    gather = GatherDecode(ps, dev)
    for graphs, heads in ((False, 8), (True, 8), (False, 14), (True, 14)):  # group 4: CUDA cores; 7: tensor cores
        q = torch.randn(4, heads, 1, dim, generator=g).to(dev, dt)
        module.num_key_value_groups = heads // kv_heads
        gather.plan(tables, 4)
        want = gather.run(module, q, k, v, dim**-0.5)
        fi = FlashInferDecode(num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=dim, page_size=ps,
                              pages_per_row=per_slot, dtype=dt, device=dev, cuda_graphs=graphs, scaling=dim**-0.5)
        assert fi.tensor_cores == (heads // kv_heads > 4)
        fi.plan(tables, 4)
        got = fi.run(module, q, k, v, dim**-0.5)
        assert got.shape == want.shape == (4, 1, heads, dim)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=2e-3)


@on_gpu_with_flashinfer
def test_flashinfer_engine_with_graphs_decodes_as_eager(tmp_path):
    """One CUDA graph per batch bucket (no context buckets) replays what eager FlashInfer decodes."""
    model = build_tiny_model("qwen2", tmp_path / "qwen2-hd64", head_dim=64)  # a head size FlashInfer builds
    graphs = _engine(model, device="cuda", dtype=torch.float16, attention="flashinfer", cuda_graphs=True)
    eager = _engine(model, device="cuda", dtype=torch.float16, attention="flashinfer", cuda_graphs=False)
    assert graphs.attention == "flashinfer" and {c for _, c in graphs.graphs} == {64}
    assert _greedy(graphs) == _greedy(eager)
