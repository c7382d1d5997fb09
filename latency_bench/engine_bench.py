"""AR engine benchmark: tokens/s, time to first token and ms per decode step at 1/4/8 concurrent requests,
async lookahead on vs off and per-session prefix reuse on vs off, side by side from one run.

Each request is the *second turn* of a session: a first turn (history) warms the session, then the measured
turn re-sends history + a few new tokens — what a voice conversation does every turn. With prefix reuse the
measured turn prefills only the new tokens.

    python -m latency_bench engine                          # SmolLM2-135M (the CPU preset's thinker) on CPU
    python -m latency_bench engine --shape qwen2.5-7b --device cuda --dtype bfloat16   # random-init shape, GPU
    python -m latency_bench engine --engine both            # + the llama.cpp thinker (Q8_0, F16 and Q4_1 GGUF), same requests
    python -m latency_bench engine --engine llama.cpp --llama-threads 1 --llama-repeats 2   # the three, alternating

llama.cpp rows run each ``--llama-gguf`` (default: the preset's Q8_0, F16 and the packaged Q4_1) on a managed
``llama-server`` (1 and 2 threads; with ``--llama-reuse-off`` also prefix reuse off = ``--no-cache-prompt``); there the decode ms/step is measured client-side as (time to last token - TTFT) /
(tokens - 1), and the prefilled tokens are prompt - ``cached_tokens`` as llama-server reports them.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from omni_rt.engine.builtin.ar_scheduler import ARScheduler
from omni_rt.testing.stage_driver import collect, send
from omni_rt.engine.builtin.torch_engine import TorchEngine
from omni_rt.engine.weights.loader import load_model, load_tokenizer, resolve_model, torch_dtype

SHAPES = {  # random-init shapes (no weights needed): model class + config kwargs
    "qwen2-0.5b": (
        "qwen2",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
        ),
    ),
    "qwen2.5-7b": (
        "qwen2",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
        ),
    ),
    "llama-3.2-3b": (
        "llama",
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
        ),
    ),
    "tiny": (
        "llama",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
        ),
    ),
}


def build_engine(args) -> tuple[TorchEngine, int]:
    if args.shape:
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

        arch, kw = SHAPES[args.shape]
        cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[arch]
        cfg = cfg_cls(max_position_embeddings=4096, eos_token_id=0, attn_implementation="sdpa", **kw)
        torch.manual_seed(0)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch_dtype(args.dtype))  # build directly in the target dtype (7B: 15 GB, not 30)
        try:
            with torch.device(args.device):
                model = cls(cfg).eval()
        finally:
            torch.set_default_dtype(prev)
        vocab = kw["vocab_size"]
    else:
        path = resolve_model(args.model)
        model = load_model(path, args.dtype, args.device)
        vocab = len(load_tokenizer(path))
    return TorchEngine(model, max_batch_size=max(args.concurrency), max_seq_len=args.max_seq_len), vocab


def run_case(engine: TorchEngine, vocab: int, conc: int, lookahead: bool, reuse: bool, args) -> dict:
    sched = ARScheduler(engine, None, async_decode=lookahead, prefix_reuse=reuse, kv_budget_tokens=1 << 20)
    sched.start()
    try:
        g = torch.Generator().manual_seed(conc)
        histories = [torch.randint(10, vocab - 1, (args.history_tokens,), generator=g).tolist() for _ in range(conc)]
        warm = [f"w{i}" for i in range(conc)]
        for i, rid in enumerate(warm):  # turn 1 (not measured): the session's history, answered briefly
            send(sched, rid, {"prompt_ids": histories[i], "max_tokens": 4, "session_id": f"s{i}", "ignore_eos": True})
        first = collect(sched, warm, timeout=600)
        while sched.live_state():
            time.sleep(0.001)
        prompts = [
            histories[i] + first[rid]["result"]["token_ids"] + list(range(20, 20 + args.new_tokens))
            for i, rid in enumerate(warm)
        ]
        for k in sched.metrics:
            sched.metrics[k] = 0 if isinstance(sched.metrics[k], int) else 0.0
        ids = [f"m{i}" for i in range(conc)]
        t0 = time.perf_counter()
        for i, rid in enumerate(ids):  # turn 2 (measured), all sessions at once
            send(
                sched,
                rid,
                {"prompt_ids": prompts[i], "max_tokens": args.max_tokens, "session_id": f"s{i}", "ignore_eos": True},
            )
        out = collect(sched, ids, timeout=600)
        wall = time.perf_counter() - t0
    finally:
        sched.stop()
    res = [out[r]["result"] for r in ids]
    ttft = [r["ttft_ms"] for r in res]
    m = sched.metrics
    return {
        "concurrency": conc,
        "lookahead": lookahead,
        "prefix_reuse": reuse,
        "prompt_tokens": res[0]["prompt_tokens"],
        "prefilled_tokens": statistics.mean(r["prefilled_tokens"] for r in res),
        "ttft_ms_p50": statistics.median(ttft),
        "ttft_ms_max": max(ttft),
        "tokens_per_s": sum(r["completion_tokens"] for r in res) / wall,
        "ms_per_decode_step": 1000 * m["decode_s"] / max(1, m["decode_steps"]),
        "wall_s": wall,
    }


def run_llama_case(sched, vocab: int, conc: int, args) -> dict:
    """One measured second turn per session against a started llama.cpp scheduler (fresh session ids)."""
    g = torch.Generator().manual_seed(conc)
    tag = f"{conc}-{time.monotonic_ns()}"
    histories = [torch.randint(10, vocab - 1, (args.history_tokens,), generator=g).tolist() for _ in range(conc)]
    warm = [f"w{tag}-{i}" for i in range(conc)]
    for i, rid in enumerate(warm):  # turn 1: the session's history (llama.cpp keeps it in the slot's KV)
        send(sched, rid, {"prompt_ids": histories[i], "max_tokens": 4, "session_id": f"s{i}", "ignore_eos": True})
    collect(sched, warm, timeout=600)
    # turn 2: history + new tokens (the tokens of turn 1's answer are not returned by llama-server's OpenAI
    # API, so the new turn follows the history directly: the reusable prefix is the same history)
    prompts = [histories[i] + list(range(20, 20 + args.new_tokens)) for i in range(conc)]
    ids = [f"m{tag}-{i}" for i in range(conc)]
    t0 = time.perf_counter()
    last: dict[str, float] = {}
    for i, rid in enumerate(ids):
        send(sched, rid, {"prompt_ids": prompts[i], "max_tokens": args.max_tokens, "session_id": f"s{i}",
                          "ignore_eos": True})
    out = {rid: {"n": 0, "result": None} for rid in ids}
    while any(v["result"] is None for v in out.values()):
        msg = sched.outbox.get(timeout=600)
        if msg.request_id not in out:
            continue
        if msg.type == "stream":
            last[msg.request_id] = time.perf_counter()
        elif msg.type == "result":
            out[msg.request_id]["result"] = msg.data
        elif msg.type == "error":
            raise RuntimeError(f"llama.cpp request failed: {msg.data}")
    wall = time.perf_counter() - t0
    res = [out[r]["result"] for r in ids]
    ttft = [r["ttft_ms"] for r in res]
    step = [
        ((last[r] - t0) * 1000 - out[r]["result"]["ttft_ms"]) / max(1, out[r]["result"]["completion_tokens"] - 1)
        for r in ids
    ]
    return {
        "engine": "llama.cpp",
        "concurrency": conc,
        "prompt_tokens": res[0]["prompt_tokens"],
        "prefilled_tokens": statistics.mean(r["prompt_tokens"] - r["cached_tokens"] for r in res),
        "ttft_ms_p50": statistics.median(ttft),
        "ttft_ms_max": max(ttft),
        "tokens_per_s": sum(r["completion_tokens"] for r in res) / wall,
        "ms_per_decode_step": statistics.median(step),
        "wall_s": wall,
    }


def llama_rows(vocab: int, args) -> list[dict]:
    """llama.cpp rows: threads 1 and 2, prefix reuse on/off, each concurrency; one server per config."""
    from omni_rt.engine.llama_cpp import build as llama_cpp
    from omni_rt.engine.weights import smollm2
    from omni_rt.engine.llama_cpp.server import LlamaServerArgs
    from omni_rt.engine.llama_cpp.thinker import create_llama_cpp_thinker

    binary = llama_cpp.locate_binary()
    if binary is None:
        print(f"llama.cpp: no llama-server built ({llama_cpp.build_failed() or 'run python -m omni_rt.engine.llama_cpp build'})")
        return []
    files = {**{fmt: functools.partial(smollm2.ensure_served_gguf, fmt) for fmt in smollm2.SERVED_FORMATS},
             "q4_1": smollm2.packaged_gguf_path}
    rows = []
    for rep in range(args.llama_repeats):  # alternating files, so a noisy stretch of the machine hits both
        for name in args.llama_gguf:
            gguf = files[name]() if name in files else Path(name)
            for threads in args.llama_threads:
                for reuse in (True, False) if args.llama_reuse_off else (True,):
                    sched = create_llama_cpp_thinker(
                        LlamaServerArgs(gguf, threads=threads, parallel=max(args.concurrency),
                                        ctx_size=max(args.concurrency) * args.max_seq_len,
                                        extra_args=() if reuse else ("--no-cache-prompt",)),
                        binary,
                    )
                    sched.start()
                    try:
                        run_llama_case(sched, vocab, 1, args)  # warm-up
                        for c in args.concurrency:
                            rows.append({**run_llama_case(sched, vocab, c, args), "gguf": gguf.name, "repeat": rep,
                                         "threads": threads, "prefix_reuse": reuse})
                    finally:
                        sched.stop()
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="smollm2", help="'smollm2' or a local model directory")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="random-init model shape instead of --model")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--history-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--json", default="latency_bench/results/engine.json", help="where to write the results")
    ap.add_argument("--engine", choices=["torch", "llama.cpp", "both"], default="torch")
    ap.add_argument("--llama-threads", default="1,2", help="llama.cpp thread counts to measure")
    ap.add_argument("--llama-gguf", default="q8_0,f16,q4_1",
                    help="GGUFs for the llama.cpp rows: q8_0 (the CPU preset's), f16, q4_1 (the packaged file) or paths")
    ap.add_argument("--llama-repeats", type=int, default=1, help="measure the GGUFs this many times, alternating")
    ap.add_argument("--llama-reuse-off", action="store_true", help="also measure llama.cpp with prefix reuse off")


def command(args: argparse.Namespace) -> int:
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.llama_threads = [int(t) for t in args.llama_threads.split(",")]
    args.llama_gguf = args.llama_gguf.split(",")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")

    label = args.shape or args.model
    rows = []
    if args.engine in ("torch", "both"):
        t0 = time.perf_counter()
        engine, vocab = build_engine(args)
        print(
            f"{label} on {args.device} ({args.dtype}), loaded in {time.perf_counter() - t0:.1f} s; "
            f"cuda graphs: {sorted(engine.graphs) or 'none'}; torch threads: {torch.get_num_threads()}"
        )
        run_case(engine, vocab, 1, True, True, args)  # warm-up (allocator, kernels)
        rows = [
            {"engine": "torch", **run_case(engine, vocab, c, la, pr, args)}
            for c in args.concurrency
            for la in (True, False)
            for pr in (True, False)
        ]
    else:
        vocab = len(load_tokenizer(resolve_model("smollm2")))
    if args.engine in ("llama.cpp", "both"):
        rows += llama_rows(vocab, args)
    print("torch rows: fp32 PyTorch; llama.cpp rows: the GGUF named, 'lookahead' column = llama-server threads")
    head = f"{'engine':>9} {'gguf':>36} {'conc':>4} {'lookahead':>9} {'reuse':>5} {'prompt':>6} {'prefill':>7} {'TTFT p50 ms':>11} {'TTFT max ms':>11} {'tok/s':>7} {'ms/step':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['engine']:>9} {r.get('gguf', '-'):>36} {r['concurrency']:>4} "
            f"{(('on' if r['lookahead'] else 'off') if 'lookahead' in r else str(r['threads']) + ' thr'):>9} {'on' if r['prefix_reuse'] else 'off':>5} "
            f"{r['prompt_tokens']:>6} {r['prefilled_tokens']:>7.0f} {r['ttft_ms_p50']:>11.1f} {r['ttft_ms_max']:>11.1f} "
            f"{r['tokens_per_s']:>7.1f} {r['ms_per_decode_step']:>8.1f}"
        )
    Path(args.json).write_text(
        json.dumps(
            {"model": label, "device": args.device, "dtype": args.dtype, "args": vars(args), "results": rows}, indent=2
        )
    )
    print(f"wrote {args.json}")
    return 0
