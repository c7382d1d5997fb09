"""``--thinker MODEL`` on the benchmarks, for real: a started ``omni-rt serve`` refuses a GGUF with no chat
template (written by the ``gguf`` package), which only happens when the flag reached it, and ``python -m
latency_bench`` / ``python -m latency_bench.quality`` stop with one line on a missing file. The argument
plumbing and the reports: tests/unit/latency_bench/test_bench_thinker.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from servers import ROOT
from tiny_models import metadata_gguf

from latency_bench import __main__ as bench_cli
from latency_bench import realtime_bench


def test_the_started_server_gets_the_thinker(tmp_path):
    """A GGUF with no chat template: the started ``omni-rt serve`` refuses it with its one-line error."""
    model = metadata_gguf(tmp_path / "base.gguf", None)
    args = bench_cli.build_parser().parse_args(["--thinker", str(model)])
    server = realtime_bench.bench_server(args, "cpu", "streaming", tmp_path)
    with pytest.raises(RuntimeError) as err:
        server.start(timeout=120)
    assert "exited with 2" in str(err.value)
    assert f"omni-rt: error: --thinker {model}: the model has no chat template" in server.log_path.read_text()


def test_a_wrong_thinker_stops_the_benches_with_one_line(tmp_path):
    missing = tmp_path / "missing.gguf"
    for module in ("latency_bench", "latency_bench.quality"):
        proc = subprocess.run([sys.executable, "-m", module, "--thinker", str(missing)], cwd=ROOT,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 2, proc
        assert proc.stderr.strip().splitlines() == [f"python -m {module}: error: --thinker {missing}: no such file"]
