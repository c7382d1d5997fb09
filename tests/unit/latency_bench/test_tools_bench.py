"""latency_bench tools: the summary and table of tool turns (the run itself needs a server: docs/benchmarks/tools.md)."""

from latency_bench.__main__ import parse_args
from latency_bench.tools_bench import markdown, summarize


def test_summary_and_table_of_tool_turns():
    recs = [{"preamble": True, "first_audio_ms": 500.0 + i, "call_ms": 300.0, "preamble_audio_ms": 1800.0,
             "dead_air_ms": 1700.0 + i, "answer_ms": 4200.0 + i, "uses_result": i != 2} for i in range(3)]
    s = summarize(recs)
    assert s["turns"] == 3 and s["uses_result"] == 2
    assert s["first_audio_ms"] == {"p50": 501.0, "max": 502.0} and s["answer_ms"]["max"] == 4202.0
    off = summarize([{**r, "preamble": False, "first_audio_ms": None, "dead_air_ms": 4000.0} for r in recs])
    assert "first_audio_ms" not in off
    table = markdown({"preset": "cpu", "tool_s": 3.0, "load_1m_start": 1, "load_1m_end": 1,
                      "levels": {"1": {"preamble": s, "no_preamble": off}}})
    assert "| 1 | on | 501 / 502 | 1701 / 1702 | 4201 / 4202 | 2/3 |" in table and "| 1 | off | - |" in table


def test_tools_is_a_bench_command():
    _, args = parse_args(["tools", "--sessions", "1", "--tool-s", "2"])
    assert args.command == "tools" and args.tool_s == 2.0
