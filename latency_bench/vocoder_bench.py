"""SNAC vocoder throughput: stream-frames decoded per second at several stream counts, one frame per stream per
talker step (what a batched codec talker sends), through the real `SnacVocoder` with random weights.

    python -m latency_bench stages vocoder [--streams 1 8 32] [--frames 6] [--decoder-dim 1024] [--device cpu]

Each row: best of ``--repeats`` alternating runs. "before": ``max_batch_streams=1`` (each stream's window decoded alone with its own host copy, as the
scheduler did before batching); "after": the default (every stream with a new frame in one decode per step).
Closed loop: a talker step's frames go in, and the next step starts once every stream's audio for it is out.
``--decoder-dim`` narrows the decoder (same layout and receptive field) where the real width is too slow.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def measure(model: Any, streams: int, frames: int, max_batch_streams: int) -> dict[str, float]:
    """Decodes/s (one decode = one stream's frame) over talker steps 3..frames, after a warm-up stream."""
    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.contracts.payloads import CodecFrames
    from omni_rt.stages.vocoder import SnacVocoder

    voc = SnacVocoder(model, max_batch_streams=max_batch_streams)
    voc.set_stream_sources(["talker"])
    voc.start()
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 4096, (streams, frames, 7))
    try:
        def step(t: int, wait: bool) -> None:
            for s in range(streams):
                voc.inbox.put(IncomingMessage(f"s{s}", "stream_chunk", CodecFrames(codes[s, t : t + 1]), source="talker"))
            if wait:  # from the third frame on, each frame makes one frame of audio final per stream
                got = 0
                while got < streams:
                    if voc.outbox.get(timeout=600).type == "stream":
                        got += 1

        for t in range(3):
            step(t, wait=t == 2)
        t0 = time.perf_counter()
        for t in range(3, frames):
            step(t, wait=True)
        dt = time.perf_counter() - t0
        stats = voc.stats()
    finally:
        voc.stop()
    n = streams * (frames - 3)
    return {"streams": streams, "decodes": n, "seconds": round(dt, 3), "decodes_per_s": round(n / dt, 1),
            "forwards": stats["forwards"], "max_batch": stats["max_batch"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--frames", type=int, default=6, help="frames per stream (>= 4; the first 3 warm the window)")
    p.add_argument("--decoder-dim", type=int, default=None, help="default: the real SNAC 24 kHz decoder width")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: float16 on CUDA, float32 on CPU")
    p.add_argument("--repeats", type=int, default=3, help="before/after alternate this many times; best run kept "
                   "(a shared machine's other load only ever slows a run down)")
    p.add_argument("--json", default=None, help="write the rows here")


def main(argv: list[str] | None = None) -> int:
    """The ``stages vocoder`` command with its own argv (the test suite runs it at a tiny width)."""
    p = argparse.ArgumentParser(prog="python -m latency_bench stages vocoder", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return command(p.parse_args(argv))


def command(args: argparse.Namespace) -> int:
    import torch

    from omni_rt.backends.snac_codec import SNAC_24KHZ_CONFIG, build_random_snac

    if args.frames < 4:
        raise SystemExit("--frames must be >= 4")
    if args.decoder_dim is None:
        args.decoder_dim = SNAC_24KHZ_CONFIG["decoder_dim"]
    dtype = getattr(torch, args.dtype or ("float16" if args.device.startswith("cuda") else "float32"))
    model = build_random_snac(config={**SNAC_24KHZ_CONFIG, "decoder_dim": args.decoder_dim}).to(args.device, dtype)
    print(f"SNAC decoder_dim {args.decoder_dim}, {args.device} {dtype}, torch threads {torch.get_num_threads()}, "
          f"{args.frames} frames per stream")
    rows = []
    print(f"{'streams':>7} {'before dec/s':>13} {'after dec/s':>12} {'speedup':>8} {'after fwd':>10} {'max batch':>10}")
    for n in args.streams:
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            runs["before"].append(measure(model, n, args.frames, max_batch_streams=1))
            runs["after"].append(measure(model, n, args.frames, max_batch_streams=64))
        before, after = (max(runs[k], key=lambda r: r["decodes_per_s"]) for k in ("before", "after"))
        rows.append({"before": before, "after": after})
        print(f"{n:>7} {before['decodes_per_s']:>13} {after['decodes_per_s']:>12} "
              f"{after['decodes_per_s'] / before['decodes_per_s']:>7.2f}x {after['forwards']:>10} {after['max_batch']:>10}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"decoder_dim": args.decoder_dim, "device": args.device, "rows": rows}, f, indent=1)
    return 0
