"""The tail every client-level bench command shares: run it, write its JSON, print its table and the load."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable


def run_bench(args: argparse.Namespace, run: Callable[[Any], Awaitable[dict[str, Any]]],
              markdown: Callable[[dict[str, Any]], str]) -> int:
    """``--sessions 1,4`` parsed, hub downloads off, ``run(args)`` awaited, its result written to ``--out`` and
    printed as ``markdown(result)``, with the load average around the run (what makes its numbers noisy)."""
    args.sessions = [int(x) for x in args.sessions.split(",")]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown(result))
    print(f"\nload average {result['load_1m_start']} -> {result['load_1m_end']}; results in {args.out}", file=sys.stderr)
    return 0
