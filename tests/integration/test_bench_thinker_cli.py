"""``--thinker MODEL`` reaches the servers the benches start: one is started for real with a GGUF (written by the
``gguf`` package) that the server must refuse at start-up, which only happens when the flag reached it; and a
wrong model stops ``python -m latency_bench`` with one line.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from servers import ROOT
from tiny_models import metadata_gguf

from latency_bench import __main__ as bench_cli
from latency_bench import server_proc

CHAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _args(command: str, argv: list[str]):
    return bench_cli.parse_args([command, *argv])[1]


def test_the_started_server_gets_the_thinker(tmp_path):
    """A GGUF with no chat template: the started ``omni-rt serve`` refuses it with its one-line error."""
    model = metadata_gguf(tmp_path / "base.gguf", None)
    args = _args("report", ["--thinker", str(model)])
    server = server_proc.bench_server(args, "cpu", "streaming", tmp_path)
    with pytest.raises(RuntimeError) as err:
        server.start(timeout=120)
    assert "exited with 2" in str(err.value)
    assert f"omni-rt: error: --thinker {model}: the model has no chat template" in server.log_path.read_text()


def test_a_wrong_thinker_stops_the_benches_with_one_line(tmp_path):
    missing = tmp_path / "missing.gguf"
    for command, shown in (([], "report"), (["report"], "report"), (["quality"], "quality")):
        proc = subprocess.run([sys.executable, "-m", "latency_bench", *command, "--thinker", str(missing)], cwd=ROOT,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 2, proc
        assert proc.stderr.strip().splitlines() == [f"python -m latency_bench {shown}: error: --thinker {missing}: no such file"]
