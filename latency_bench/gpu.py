"""GPU preset benchmark on random weights of the real shapes: no hub weights, no network, one command.

    python -m latency_bench gpu            # one GPU (target: <= 8 minutes on one H200)
    python -m latency_bench gpu --smoke    # the same code on CPU at tiny sizes (< 1 minute; the test suite runs it)

Sections (all in one JSON, ``latency_bench/results/gpu.json`` or ``gpu-smoke.json``):

* ``bandwidth`` — device memory bandwidth from a big device-to-device copy (read + write bytes / time);
* ``decode`` — thinker (Qwen2.5-7B shape) and codec LM (Orpheus 3B shape) decode ms/step at batch 1/8/32 and
  context 512/2048/4096, against the weight-read floor (bytes a step must read / measured bandwidth; the
  ``+KV`` floor adds the live K/V of every row). A step is ``TorchEngine.decode``: forward (a CUDA graph when
  captured), sampling and the host read of the tokens, as the scheduler pays it. KV is filled by real prefills;
* ``equality`` — greedy tokens of the graph path vs the eager path on a small shape (on CPU: the static-KV
  eager path vs the growable one), same prompts: must be identical;
* ``paged`` — the same for paged decode (``omni_rt.engine.builtin.paged_attention``) vs packed-GQA SDPA: FlashInfer
  where it is installed on CUDA, else the gather reader of the same page tables. Where FlashInfer runs, the
  ``decode`` rows are measured twice, ``auto`` (FlashInfer) and ``packed_gqa``, side by side;
* ``preset`` — the gpu preset through the Coordinator (every stage on random weights via the factories'
  ``random_init``): time from the end of a text turn to the first vocoder PCM (TTFA), and playback
  underruns (a 24 kHz player started at the first chunk runs dry before the next arrives), at 1/8/16
  concurrent sessions. Each answer is followed for ``audio_s`` seconds of audio, then aborted (a random
  codec LM never ends a clause early, so a whole answer would only measure the clause budget).

Random weights time the same kernels as trained ones, but not the same answers: answer lengths are fixed
(``ignore_eos`` + ``max_tokens``), and the text is SmolLM2's tokenizer decoding random ids.

Over 400 lines on purpose: its sections share one ``Plan`` and one result and run as one job on a GPU machine;
split a section out when it grows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from latency_bench import report

log = logging.getLogger("latency_bench.gpu")

THINKER = "Qwen/Qwen2.5-7B-Instruct"
CODEC_LM = "canopylabs/orpheus-3b-0.1-ft"
SR = 24000
# the targets (one H200, random weights of the real shapes)
TARGETS = {
    "ttfa_p50_1": 150.0,  # ms, 1 session
    "ttfa_p95_16": 300.0,  # ms, 16 sessions
    "underruns_16": 0,
    "talker_ms_b32": 12.0,  # codec LM ms/step at batch 32
    "thinker_floor_ratio_b1": 2.0,  # thinker ms/step at batch 1 / weight-read floor
}


@dataclass(frozen=True)
class Plan:
    """What one run measures; ``FULL`` on a GPU, ``SMOKE`` on CPU at tiny sizes."""

    device: str
    dtype: str
    size: str  # random_init size: "full" | "tiny"
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    steps: int  # timed decode steps per (batch, context)
    copy_mib: int  # bandwidth probe size
    sessions: tuple[int, ...]
    turns: int  # answers per session per level
    answer_tokens: int  # thinker tokens per answer (ignore_eos)
    audio_s: float  # seconds of audio followed per answer
    max_batch_size: int | None  # preset engines' slots (None: the preset's own)
    turn_timeout_s: float


FULL = Plan(device="cuda", dtype="bfloat16", size="full", batches=(1, 8, 32), contexts=(512, 2048, 4096), steps=32,
            copy_mib=4096, sessions=(1, 8, 16), turns=3, answer_tokens=48, audio_s=4.0, max_batch_size=None,
            turn_timeout_s=60.0)
SMOKE = Plan(device="cpu", dtype="float32", size="tiny", batches=(1, 2), contexts=(64, 128), steps=3, copy_mib=64,
             sessions=(1, 2), turns=1, answer_tokens=12, audio_s=0.3, max_batch_size=4, turn_timeout_s=60.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- bandwidth
@torch.inference_mode()
def measure_bandwidth(device: str, mib: int, iters: int = 10) -> dict[str, Any]:
    """GB/s of a device copy of ``mib`` MiB (bytes read + written per second), best of ``iters``."""
    dev = torch.device(device)
    n = mib * 1024 * 1024
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = float("inf")
    for _ in range(iters):
        _sync(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return {"copy_mib": mib, "gb_per_s": round(2 * n / best / 1e9, 1)}


# ---------------------------------------------------------------------------------------------- decode
def _fill(engine, upto: int, vocab: int, chunk: int = 2048) -> None:
    """Extend every slot's KV from its length (``engine.lengths``) to ``upto`` tokens with real prefills
    (chunked: bounded activations)."""
    from omni_rt.engine.prompt.request import SamplingParams

    g = torch.Generator().manual_seed(upto)
    for slot in range(engine.max_batch_size):
        cur = engine.lengths[slot]
        while cur < upto:
            n = min(chunk, upto - cur)
            ids = torch.randint(10, vocab, (n,), generator=g).tolist()
            engine.prefill(slot, ids, cur, SamplingParams(), sample_next=cur + n >= upto)
            cur += n


def decode_rows(model_id: str, plan: Plan, gb_per_s: float, attention: str = "auto") -> list[dict[str, Any]]:
    """ms per decode step of ``model_id``'s shape for every (context, batch), with the read floors;
    ``attention`` as ``TorchEngine`` takes it (the row says what it resolved to)."""
    from omni_rt.engine.weights.random_init import build_causal_lm, decode_weight_bytes
    from omni_rt.engine.builtin.torch_engine import TorchEngine
    from omni_rt.engine.weights.loader import torch_dtype

    t0 = time.perf_counter()
    model = build_causal_lm(model_id, dtype=torch_dtype(plan.dtype), device=plan.device, size=plan.size)
    cfg = model.config
    max_b = max(plan.batches)
    # room for every timed step after the largest context (each batch level advances rows by warm-up + steps)
    engine = TorchEngine(model, max_batch_size=max_b, attention=attention,
                         max_seq_len=max(plan.contexts) + (plan.steps + 2) * len(plan.batches) + 8)
    weight_bytes = decode_weight_bytes(model)
    kv_per_token = engine.kv.bytes_per_token()
    setup_s = time.perf_counter() - t0
    rows = []
    vocab = min(cfg.vocab_size, 49152)
    for ctx in plan.contexts:
        _fill(engine, ctx, vocab)
        for b in plan.batches:
            for _ in range(2):  # warm-up (first use of a shape / graph)
                engine.decode(b)
            _sync(engine.device)
            t1 = time.perf_counter()
            for _ in range(plan.steps):
                engine.decode(b)  # returns host token ids: each step ends synchronised
            ms = (time.perf_counter() - t1) * 1000 / plan.steps
            live_kv = kv_per_token * sum(engine.lengths[:b])
            floor = weight_bytes / (gb_per_s * 1e9) * 1000
            rows.append({
                "model": model_id, "variant": attention, "attention": engine.attention,
                "batch": b, "context": ctx, "ms_per_step": round(ms, 3),
                "floor_ms": round(floor, 3), "floor_kv_ms": round((weight_bytes + live_kv) / (gb_per_s * 1e9) * 1000, 3),
                "x_floor": round(ms / floor, 2), "tokens_per_s": round(b * 1000 / ms, 1),
            })
    params = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied head is one parameter
    info = {"model": model_id, "param_gb": round(params / 1e9, 3),  # all parameters (the embedding table too)
            "weight_gb": round(weight_bytes / 1e9, 3),  # what a step reads: the floor's numerator
            "kv_bytes_per_token": kv_per_token,
            "cuda_graphs": sorted(getattr(engine, "graphs", {})), "static_kv": getattr(engine, "static_kv", None),
            "kv_capacity": getattr(engine.kv, "capacity", None),
            "setup_s": round(setup_s, 1)}
    del engine, model
    _free()
    return [{**r, **{"info": info}} for r in rows]


# ---------------------------------------------------------------------------------------------- equality
def greedy_tokens(engine, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Greedy continuation of every prompt, decoded as one batch (rows in slots 0..n-1)."""
    from omni_rt.engine.prompt.request import SamplingParams

    out = []
    for slot, p in enumerate(prompts):
        out.append([engine.prefill(slot, p, 0, SamplingParams())])
    for _ in range(steps):
        for row, tok in zip(out, engine.decode(len(prompts))):
            row.append(tok)
    engine.reset()
    return out


def _tiny_thinker(plan: Plan, prompt_lengths: tuple[int, ...], seed: int, **overrides: Any):
    """A tiny random thinker on the plan's device and seeded random prompts of ``prompt_lengths`` tokens."""
    from omni_rt.engine.weights.random_init import build_causal_lm
    from omni_rt.engine.weights.loader import torch_dtype

    model = build_causal_lm(THINKER, dtype=torch_dtype(plan.dtype), device=plan.device, size="tiny",
                            overrides=overrides)
    g = torch.Generator().manual_seed(seed)
    return model, [torch.randint(10, 49152, (n,), generator=g).tolist() for n in prompt_lengths]


def graph_equality(plan: Plan, steps: int = 24) -> dict[str, Any]:
    """Same model, same prompts, greedy: CUDA graphs vs eager on a GPU; static-KV eager vs growable on CPU."""
    from omni_rt.engine.builtin.torch_engine import TorchEngine

    model, prompts = _tiny_thinker(plan, (5, 17, 33, 9), seed=7)
    kw = dict(max_batch_size=len(prompts), max_seq_len=128)
    if torch.device(plan.device).type == "cuda":
        fast = TorchEngine(model, cuda_graphs=True, **kw)
        ref = TorchEngine(model, cuda_graphs=False, **kw)
        compared = "cuda graphs vs eager" if fast.graphs else "eager vs eager (graph capture failed)"
    else:
        fast = TorchEngine(model, static_kv=True, **kw)
        ref = TorchEngine(model, static_kv=False, **kw)
        compared = "static-KV eager vs growable"
    a, b = greedy_tokens(fast, prompts, steps), greedy_tokens(ref, prompts, steps)
    mismatch = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    del fast, ref, model
    _free()
    return {"compared": compared, "rows": len(prompts), "steps": steps, "tokens_equal": not mismatch and bool(a),
            "mismatched_rows": mismatch, "distinct_tokens": len({t for row in a for t in row})}


def paged_equality(plan: Plan, steps: int = 24) -> dict[str, Any]:
    """Greedy tokens of paged decode vs packed-GQA SDPA, static KV (graphs where CUDA has them), same prompts.
    The two engines run one after the other: each switches the shared model's attention function."""
    from omni_rt.engine.builtin.paged_attention import flashinfer_available
    from omni_rt.engine.builtin.torch_engine import TorchEngine

    cuda = torch.device(plan.device).type == "cuda"
    paged = "flashinfer" if cuda and flashinfer_available() else "paged_sdpa"
    # head_dim 64 (tiny is 16): the smallest FlashInfer builds kernels for
    model, prompts = _tiny_thinker(plan, (5, 16, 17, 40), seed=11, head_dim=64)
    kw = dict(max_batch_size=len(prompts), max_seq_len=128, static_kv=True, cuda_graphs=cuda)
    ref = greedy_tokens(TorchEngine(model, attention="packed_gqa", **kw), prompts, steps)
    _free()
    engine = TorchEngine(model, attention=paged, **kw)
    got = greedy_tokens(engine, prompts, steps)
    same = sum(x == y for a, b in zip(ref, got) for x, y in zip(a, b))
    out = {"compared": f"{engine.attention} vs packed_gqa", "graphs": len(engine.graphs), "rows": len(prompts),
           "steps": steps, "tokens_equal": ref == got and bool(got), "token_agreement": round(same / sum(map(len, ref)), 3)}
    del engine, model
    _free()
    return out


# ---------------------------------------------------------------------------------------------- preset
def preset_config(plan: Plan):
    """The gpu preset with random weights on every stage that supports them and this plan's device/dtype.
    Args are set by what each factory accepts (never by stage name), so a restructured preset still runs."""
    from omni_rt.engine.weights.random_init import apply_random_weights, explicit_params
    from omni_rt.presets import load_preset

    config = load_preset("gpu")
    changed = apply_random_weights(config, plan.size)
    for st in config.stages:
        params = explicit_params(st.factory)
        want = {"device": plan.device, "dtype": plan.dtype, "ignore_eos": True}
        if plan.max_batch_size is not None:
            want["max_batch_size"] = plan.max_batch_size
        st.args.update({k: v for k, v in want.items() if k in params})
    return config, changed


def playback(deltas: list[tuple[float, int]]) -> tuple[int, float]:
    """Underruns of a 24 kHz player started at the first chunk: (count, total gap ms)."""
    from omni_rt.testing.playback import simulate_playback

    return simulate_playback(deltas)


async def one_answer(coord, rid: str, plan: Plan, seed: int) -> dict[str, Any]:
    """One text turn: TTFA (submit -> first PCM of the audio role's stage) and underruns over ``audio_s``."""
    from omni_rt.pipeline.coordinator import ResultItem, StreamItem

    from omni_rt.contracts.payloads import text_of

    audio_stage, text_stage = coord.config.roles.audio, coord.config.roles.text
    first_text: float | None = None  # the thinker's first text: TTFA splits into it and what speaks it
    text_before_audio = ""
    payload = {"messages": [{"role": "user", "content": "Tell me about the weather today."}],
               "max_tokens": plan.answer_tokens, "ignore_eos": True, "temperature": 1.0, "seed": seed}
    deltas: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    want = int(plan.audio_s * SR)
    got = 0
    ended = "audio_s reached"
    async with asyncio.timeout(plan.turn_timeout_s):
        async with contextlib.aclosing(coord.stream(rid, payload, entry=coord.roles.response)) as items:
            async for item in items:
                if isinstance(item, StreamItem) and item.stage == text_stage and not deltas:
                    if first_text is None:
                        first_text = item.t
                    text_before_audio += text_of(item.data)
                if isinstance(item, StreamItem) and item.stage == audio_stage:
                    deltas.append((item.t, item.data.samples))  # stamped when the vocoder's chunk left the stage
                    got += item.data.samples
                    if got >= want:
                        break  # aclosing -> the coordinator aborts the rest of the answer everywhere
                elif isinstance(item, ResultItem):
                    ended = "answer ended"
    if not deltas:
        raise RuntimeError(f"answer {rid} produced no audio ({ended})")
    count, gap = playback(deltas)
    return {"ttfa_ms": round((deltas[0][0] - t0) * 1000, 1), "underruns": count, "underrun_ms": round(gap, 1),
            "audio_s": round(got / SR, 2), "chunks": len(deltas), "ended": ended,
            "first_text_ms": None if first_text is None else round((first_text - t0) * 1000, 1),
            "text_words_before_audio": len(text_before_audio.split())}


async def preset_latency(plan: Plan, on_level: Any = None) -> dict[str, Any]:
    """``on_level(partial)``: called after each concurrency level with the result so far (a run cut short by
    its time limit keeps the levels it finished)."""
    from omni_rt.pipeline.coordinator import Coordinator

    t0 = time.perf_counter()
    config, changed = preset_config(plan)
    coord = Coordinator(config)
    await coord.start()
    start_s = time.perf_counter() - t0
    levels: dict[str, Any] = {}

    def summary(levels: dict[str, Any]) -> dict[str, Any]:
        return {"stages_random": changed, "start_s": round(start_s, 1), "audio_s_per_answer": plan.audio_s,
                "answer_tokens": plan.answer_tokens, "levels": dict(levels)}
    try:
        await one_answer(coord, "warmup", plan, 0)  # not recorded: lazy inits, allocator, first graphs
        await asyncio.sleep(0.1)
        for n in plan.sessions:

            async def session(i: int, n: int = n) -> list[dict[str, Any]]:
                turns = []
                for k in range(plan.turns):
                    try:
                        turns.append(await one_answer(coord, f"s{n}-{i}-t{k}", plan, 100 * i + k))
                    except Exception as exc:  # noqa: BLE001 - one failed answer is a result, not the end of the run
                        turns.append({"failure": f"{type(exc).__name__}: {exc}"})
                return turns

            t1 = time.perf_counter()
            per = await asyncio.gather(*(session(i) for i in range(n)))
            turns = [t for s in per for t in s]
            ok = [t for t in turns if "failure" not in t]
            levels[str(n)] = {
                "sessions": n, "answers": len(turns), "failures": len(turns) - len(ok),
                "wall_s": round(time.perf_counter() - t1, 1),
                "ttfa_ms": report.summarize(t["ttfa_ms"] for t in ok),
                "first_text_ms": report.summarize(t["first_text_ms"] for t in ok if t["first_text_ms"] is not None),
                "underruns_total": sum(t["underruns"] for t in ok),
                "underrun_ms_total": round(sum(t["underrun_ms"] for t in ok), 1),
                "audio_s_mean": round(statistics.mean(t["audio_s"] for t in ok), 2) if ok else None,
                "turns": turns,
            }
            print(f"  preset, {n} sessions: TTFA {levels[str(n)]['ttfa_ms']}, underruns {levels[str(n)]['underruns_total']}, "
                  f"failures {levels[str(n)]['failures']}", flush=True)
            if on_level is not None:
                on_level(summary(levels))
            await asyncio.sleep(0.2)  # aborted answers finish unwinding before the next level
    finally:
        await coord.stop()
        _free()
    return summary(levels)


# ---------------------------------------------------------------------------------------------- run + report
SECTIONS = ("bandwidth", "decode", "equality", "paged", "preset")


def run(plan: Plan, smoke: bool, out: Path | None = None, sections: tuple[str, ...] = SECTIONS) -> dict[str, Any]:
    """Every section, in order. A failing section is recorded as ``{"error": ...}`` and the next one runs; the
    JSON is rewritten after each section (a GPU run cut short by its time limit keeps what it measured)."""
    t0 = time.perf_counter()
    import transformers

    result: dict[str, Any] = {"kind": "gpu-smoke" if smoke else "gpu", "plan": asdict(plan),
                              "machine": report.machine_info(), "torch": torch.__version__,
                              "transformers": transformers.__version__}

    def section(name: str, fn) -> Any:
        if name not in sections and name != "targets":
            result[name] = {"error": "not run (--sections)"}
            return result[name]
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, and the other sections still run
            log.exception("section %s failed", name)
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"[{result['wall_s']:.0f} s] {name}: {'error ' + result[name]['error'] if _failed(result[name]) else 'done'}",
              flush=True)
        if out is not None:
            report.write_json(result, out)
        return result[name]

    bw = section("bandwidth", lambda: measure_bandwidth(plan.device, plan.copy_mib))
    gb_per_s = bw.get("gb_per_s") or math.nan

    def decode() -> list[dict[str, Any]]:
        from omni_rt.engine.builtin.paged_attention import flashinfer_available

        rows, errors = [], {}
        # "auto" is FlashInfer where it runs: then packed-GQA SDPA is measured too, for the comparison
        variants = ["auto"] + (["packed_gqa"] if torch.device(plan.device).type == "cuda" and flashinfer_available() else [])
        for mid in (THINKER, CODEC_LM):
            for variant in variants:
                try:
                    rows += decode_rows(mid, plan, gb_per_s, variant)
                except Exception as exc:  # noqa: BLE001 - the other model's rows are still worth having
                    log.exception("decode %s (%s) failed", mid, variant)
                    errors[f"{mid} {variant}"] = f"{type(exc).__name__}: {exc}"
                    _free()
        if errors:
            result["decode_errors"] = errors
            print(f"decode errors: {errors}", flush=True)
        result["decode_models"] = {f"{r['info']['model']} {r['variant']}": r["info"] for r in rows}
        return [{k: v for k, v in r.items() if k != "info"} for r in rows]

    section("decode", decode)
    section("equality", lambda: graph_equality(plan))
    section("paged", lambda: paged_equality(plan))
    def level_done(partial: dict[str, Any]) -> None:
        result["preset"] = partial
        if out is not None:
            report.write_json(result, out)

    section("preset", lambda: asyncio.run(preset_latency(plan, on_level=level_done)))
    section("targets", lambda: check_targets(result))
    return result


def _failed(value: Any) -> bool:
    return isinstance(value, dict) and "error" in value


def _step_ms(rows: list[dict[str, Any]], model: str, batch: int) -> dict[str, Any] | None:
    """The decode row of ``model`` at ``batch`` and the smallest measured context (the target's case)."""
    rows = [r for r in rows if r["model"] == model and r["batch"] == batch and r.get("variant", "auto") == "auto"]
    return min(rows, key=lambda r: r["context"]) if rows else None


def check_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets against this run (only meaningful for the full run on one H200); a section that
    failed leaves its targets unmet with no value."""
    out: list[dict[str, Any]] = []

    def add(what: str, value: Any, target: str, ok: bool) -> None:
        out.append({"what": what, "value": value, "target": target, "ok": bool(ok) and value is not None})

    levels = {} if _failed(result.get("preset")) else (result.get("preset") or {}).get("levels", {})
    if levels:
        lo, hi = min(levels, key=int), max(levels, key=int)
        p50, p95 = levels[lo]["ttfa_ms"]["p50"], levels[hi]["ttfa_ms"]["p95"]
        clean = lambda lv: lv["failures"] == 0  # noqa: E731 - a failed answer fails its level's targets
        add(f"TTFA p50 at {lo} session(s)", p50, "<= 150 ms", clean(levels[lo]) and p50 is not None and p50 <= TARGETS["ttfa_p50_1"])
        add(f"TTFA p95 at {hi} sessions", p95, "<= 300 ms", clean(levels[hi]) and p95 is not None and p95 <= TARGETS["ttfa_p95_16"])
        under = levels[hi]["underruns_total"]
        add(f"playback underruns at {hi} sessions", under, "0", clean(levels[hi]) and under <= TARGETS["underruns_16"])
    else:
        for what, target in (("TTFA p50 at 1 session", "<= 150 ms"), ("TTFA p95 at 16 sessions", "<= 300 ms"),
                             ("playback underruns at 16 sessions", "0")):
            add(what, None, target, False)
    rows = [] if _failed(result.get("decode")) else (result.get("decode") or [])
    b_max = max((r["batch"] for r in rows), default=32)
    talker, thinker = _step_ms(rows, CODEC_LM, b_max), _step_ms(rows, THINKER, 1)
    add(f"talker ms/step at batch {b_max}" + (f" (ctx {talker['context']})" if talker else ""),
        talker and talker["ms_per_step"], "<= 12 ms", talker and talker["ms_per_step"] <= TARGETS["talker_ms_b32"])
    add("thinker batch 1 / weight-read floor" + (f" (ctx {thinker['context']})" if thinker else ""),
        thinker and thinker["x_floor"], "<= 2.0x", thinker and thinker["x_floor"] <= TARGETS["thinker_floor_ratio_b1"])
    return out


def table(result: dict[str, Any]) -> str:
    """The printed report (markdown tables: docs/benchmarks/gpu.md pastes it)."""
    err = lambda name: result[name]["error"] if _failed(result.get(name)) else None  # noqa: E731
    bw, eq, pg = result.get("bandwidth", {}), result.get("equality", {}), result.get("paged", {})
    out = [f"# GPU benchmark ({result['kind']}): {result['machine']['gpu']}, torch {result['torch']}, "
           f"transformers {result['transformers']}, {result.get('wall_s')} s",
           f"bandwidth {bw.get('gb_per_s')} GB/s; graph vs eager: {eq.get('compared')}, "
           f"tokens equal: {eq.get('tokens_equal')}" + (f" (equality failed: {err('equality')})" if err("equality") else ""),
           f"paged decode: {pg.get('compared')}, tokens equal: {pg.get('tokens_equal')} "
           f"(agreement {pg.get('token_agreement')})" + (f" (failed: {err('paged')})" if err("paged") else ""),
           ""]
    if err("decode"):
        out.append(f"decode failed: {err('decode')}")
    else:
        out += ["| model | attention | batch | context | ms/step | weight floor ms | +KV floor ms | x floor | tok/s |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in result["decode"]:
            out.append(f"| {r['model']} | {r.get('attention')} | {r['batch']} | {r['context']} | {r['ms_per_step']:.2f} | "
                       f"{r['floor_ms']:.2f} | "
                       f"{r['floor_kv_ms']:.2f} | {r['x_floor']:.1f} | {r['tokens_per_s']:.0f} |")
    out.append("")
    if err("preset"):
        out.append(f"preset failed: {err('preset')}")
    else:
        out += ["| sessions | answers | failed | thinker 1st text p50 ms | TTFA p50 ms | TTFA p95 ms | TTFA max ms | underruns | underrun ms |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for lv in result["preset"]["levels"].values():
            t, first = lv["ttfa_ms"], (lv.get("first_text_ms") or {}).get("p50", "-")
            out.append(f"| {lv['sessions']} | {lv['answers']} | {lv['failures']} | {first} | {t['p50']} | {t['p95']} | {t['max']} | "
                       f"{lv['underruns_total']} | {lv['underrun_ms_total']} |")
    out += ["", "| target | measured | target | met |", "|---|---:|---:|---|"]
    for t in result.get("targets") if not _failed(result.get("targets")) else []:
        out.append(f"| {t['what']} | {t['value']} | {t['target']} | {'yes' if t['ok'] else 'no'} |")
    return "\n".join(out)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, batch 1/2, context 64/128, 1-2 sessions")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    ap.add_argument("--out", default=None, help="JSON path (default latency_bench/results/gpu[-smoke].json)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)} (a rerun of what a cut run missed)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The ``gpu`` command with its own argv; returns the result (the test suite runs ``--smoke``)."""
    ap = argparse.ArgumentParser(prog="python -m latency_bench gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run_command(ap.parse_args(argv))


def command(args: argparse.Namespace) -> int:
    run_command(args)
    return 0


def run_command(args: argparse.Namespace) -> dict[str, Any]:
    sections = tuple(x.strip() for x in args.sections.split(",") if x.strip())
    if unknown := set(sections) - set(SECTIONS):
        raise SystemExit(f"--sections: unknown {', '.join(sorted(unknown))} (choose from {', '.join(SECTIONS)})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # the engines' own INFO lines (CUDA graphs captured or not, attention chosen) belong in the run's log
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("omni_rt.engine").setLevel(logging.INFO)
    plan = SMOKE if args.smoke else FULL
    if args.device:
        plan = Plan(**{**asdict(plan), "device": args.device})
    if torch.device(plan.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run `python -m latency_bench gpu --smoke` on CPU")
    out = Path(args.out) if args.out else report.RESULTS_DIR / ("gpu-smoke.json" if args.smoke else "gpu.json")
    result = run(plan, args.smoke, out, sections)
    print(table(result))
    print(f"wrote {out}")
    return result
