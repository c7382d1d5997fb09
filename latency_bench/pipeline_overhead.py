"""Pipeline overhead: what the runtime core itself costs, with no model in the way.

1. Per-hop overhead: a chain of 1, 2, 4, 8 no-op stages (SimpleScheduler, identity), requests submitted one at
   a time; a hop is shell -> scheduler thread -> outbox -> shell -> next stage (or the coordinator).
2. Lone-request wait at an idle batching stage: idle-immediate batching vs a windowed batch (window 50 ms)
   that starts its window with the first request.

Run: ``python -m latency_bench stages overhead [--requests 2000] [--lone 40]``. Prints a table and writes
``latency_bench/results/pipeline_overhead.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from omni_rt.pipeline.config import PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator
from omni_rt.pipeline.schedulers.simple import SimpleScheduler

HERE = "latency_bench.pipeline_overhead"
RESULTS = Path(__file__).resolve().parent / "results" / "pipeline_overhead.json"
CHAIN_LENGTHS = (1, 2, 4, 8)
WINDOW_MS = 50.0


# ---- toy factories (referenced by import path from the configs below) --------------------------------
def _identity(payload: Any) -> Any:
    return payload


def create_identity() -> SimpleScheduler:
    return SimpleScheduler(_identity, name="noop")


def create_batcher(max_batch_wait_ms: float = WINDOW_MS, batch_wait_when_idle: bool = False) -> SimpleScheduler:
    return SimpleScheduler(_identity, batch_compute_fn=lambda xs: list(xs), max_batch_size=8,
                           max_batch_wait_ms=max_batch_wait_ms, batch_wait_when_idle=batch_wait_when_idle,
                           name="batcher")


def chain_config(n: int) -> PipelineConfig:
    stages = []
    for i in range(n):
        st: dict[str, Any] = {"name": f"s{i}", "factory": f"{HERE}:create_identity"}
        if i == n - 1:
            st["terminal"] = True
        else:
            st["next"] = f"s{i + 1}"
        stages.append(st)
    return PipelineConfig.model_validate({"name": f"chain{n}", "entry": "s0", "stages": stages})


def batcher_config(batch_wait_when_idle: bool) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "lone",
        "entry": "enc",
        "stages": [{"name": "enc", "factory": f"{HERE}:create_batcher", "terminal": True,
                    "args": {"max_batch_wait_ms": WINDOW_MS, "batch_wait_when_idle": batch_wait_when_idle}}],
    })


# ---- measurement -----------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


async def sequential_latencies(cfg: PipelineConfig, n: int, warmup: int) -> list[float]:
    coord = Coordinator(cfg)
    await coord.start()
    try:
        lat = []
        for i in range(warmup + n):
            t0 = time.perf_counter()
            await coord.submit(f"r{i}", i)
            if i >= warmup:
                lat.append(time.perf_counter() - t0)
        assert coord.live_total() == 0, coord.live_state()
        return lat
    finally:
        await coord.stop()


async def run(requests: int, lone: int) -> dict[str, Any]:
    chain = []
    for n in CHAIN_LENGTHS:
        lat = await sequential_latencies(chain_config(n), requests, warmup=min(200, requests))
        per_hop = [x / n for x in lat]
        chain.append({
            "stages": n,
            "requests": requests,
            "e2e_us_p50": pct(lat, 50) * 1e6,
            "e2e_us_p99": pct(lat, 99) * 1e6,
            "per_hop_us_p50": pct(per_hop, 50) * 1e6,
            "per_hop_us_p99": pct(per_hop, 99) * 1e6,
        })
    first, last = chain[0], chain[-1]
    marginal = (last["e2e_us_p50"] - first["e2e_us_p50"]) / (last["stages"] - first["stages"])

    lone_rows = []
    for mode, wait_when_idle in (("idle-immediate", False), ("windowed", True)):
        lat = await sequential_latencies(batcher_config(wait_when_idle), lone, warmup=3)
        lone_rows.append({
            "mode": mode,
            "batch_wait_when_idle": wait_when_idle,
            "window_ms": WINDOW_MS,
            "requests": lone,
            "ms_p50": pct(lat, 50) * 1e3,
            "ms_p99": pct(lat, 99) * 1e3,
            "ms_mean": statistics.fmean(lat) * 1e3,
        })
    return {
        "benchmark": "pipeline_overhead",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        "chain": chain,
        "marginal_hop_us_p50": marginal,
        "lone_request": lone_rows,
        "lone_saving_ms_p50": lone_rows[1]["ms_p50"] - lone_rows[0]["ms_p50"],
    }


def print_table(res: dict[str, Any]) -> None:
    print("Per-hop overhead, chain of no-op SimpleScheduler stages, sequential requests")
    print(f"{'stages':>6} {'requests':>8} {'e2e p50 us':>11} {'e2e p99 us':>11} {'hop p50 us':>11} {'hop p99 us':>11}")
    for r in res["chain"]:
        print(f"{r['stages']:>6} {r['requests']:>8} {r['e2e_us_p50']:>11.1f} {r['e2e_us_p99']:>11.1f} "
              f"{r['per_hop_us_p50']:>11.1f} {r['per_hop_us_p99']:>11.1f}")
    print(f"marginal cost of one more hop (p50, from 1 to 8 stages): {res['marginal_hop_us_p50']:.1f} us")
    print()
    print(f"Lone request at an idle batching stage (window {WINDOW_MS:.0f} ms)")
    print(f"{'mode':>15} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for r in res["lone_request"]:
        print(f"{r['mode']:>15} {r['requests']:>8} {r['ms_p50']:>8.2f} {r['ms_p99']:>8.2f} {r['ms_mean']:>8.2f}")
    print(f"idle-immediate saves {res['lone_saving_ms_p50']:.1f} ms per lone request (p50)")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests per chain length")
    ap.add_argument("--lone", type=int, default=40, help="lone requests per batching mode")
    ap.add_argument("--out", type=Path, default=RESULTS)


def command(args: argparse.Namespace) -> int:
    res = asyncio.run(run(args.requests, args.lone))
    print_table(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0
