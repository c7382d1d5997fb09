"""``--thinker MODEL`` on the benchmarks: ``python -m latency_bench report`` and ``python -m latency_bench quality``
hand it to every ``omni-rt serve`` they would start, and their reports name the thinker measured. No benchmark and
no server runs here: the arguments are parsed by the benches' own parsers (``integration/test_bench_thinker_cli.py``
starts one for real).
"""

from __future__ import annotations

from tiny_models import metadata_gguf

from latency_bench import __main__ as bench_cli
from latency_bench import quality, report, server_proc

CHAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _args(command: str, argv: list[str]):
    return bench_cli.parse_args([command, *argv])[1]


def _thinker_of(cmd: list[str]) -> str | None:
    return cmd[cmd.index("--thinker") + 1] if "--thinker" in cmd else None


def test_quality_bench_servers_get_the_thinker(tmp_path):
    model = metadata_gguf(tmp_path / "bigger.gguf", CHAT)
    args = _args("quality", ["--thinker", str(model)])
    servers = quality.plan_servers(args, tmp_path)
    assert [name for name, *_ in servers] == ["preset", "greedy"]
    assert all(_thinker_of(srv.command()) == str(model) for *_, srv in servers)
    only = quality.plan_servers(_args("quality", ["--thinker", str(model), "--no-greedy"]), tmp_path)
    assert [name for name, *_ in only] == ["preset"]
    plain = quality.plan_servers(_args("quality", []), tmp_path)
    assert all(_thinker_of(srv.command()) is None for *_, srv in plain)


def test_reports_name_the_thinker(tmp_path):
    model = metadata_gguf(tmp_path / "bigger.gguf", CHAT)
    args = _args("report", ["--thinker", str(model)])
    line = server_proc.measured_thinker(args)
    assert line == f"bigger.gguf (llama.cpp; --thinker {model})"
    assert server_proc.measured_thinker(_args("report", [])) == "smollm2 (llama.cpp; preset cpu)"
    machine = {"cpu_model": "x", "cpus_usable": 2, "cpu_count": 2, "gpu": "none", "python": "3"}
    result = {"config": {"preset": "cpu", "mode": "quick", "thinker": line}, "started_at": "now", "machine": machine}
    assert f"thinker: {line}" in report.text_report(result).splitlines()
    assert f"thinker {line})" in report.markdown_report(result)
