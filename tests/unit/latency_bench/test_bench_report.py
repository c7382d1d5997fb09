"""latency_bench's report: the generated ``docs/benchmarks/index.md`` (the latest table only, linked to the topic
pages), ratios that can show something (V2V against the right baseline) and no check that fails by construction."""

import json

from latency_bench.ablations import checks, ratios
from latency_bench.report import RESULTS_DIR, TOPIC_PAGES, ablation_table, update_docs


def test_update_docs_writes_the_index_page_linking_every_topic(tmp_path):
    page = tmp_path / "docs" / "benchmarks" / "index.md"
    page.parent.mkdir(parents=True)
    page.write_text("old table\n")
    update_docs("new table", page)
    text = page.read_text()
    assert "new table" in text and "old table" not in text
    first = text.split("\n\n")[1]  # the line under the title links the topic pages
    for _, name in TOPIC_PAGES:
        assert f"]({name})" in first
    assert [n for _, n in TOPIC_PAGES] == ["concurrency.md", "turn-taking.md", "soak.md", "webrtc.md", "quality.md",
                                           "engine.md", "gpu.md", "tools.md", "gpt-live.md"]


def test_ratios_compare_v2v_and_nothing_fails_by_construction():
    """On the saved latest run (held answer on: TTFA ~0 ms), ratios are V2V against a baseline with V2V in the
    hundreds of ms; the ablations that could not show (batching window and decode lookahead served with the held
    answer, the talker order at 1 session) get no ratio and no check; the naive cascade is no target."""
    result = json.loads((RESULTS_DIR / "latest.json").read_text())
    found = ratios(result)
    by = {r["variant"]: r for r in found}
    shown = [r for r in found if r["shown"]]
    assert shown and all(r["baseline_v2v_p50_ms"] > 100 and 0.5 < r["ratio"] < 5 for r in shown)
    assert {n for n, r in by.items() if not r["shown"]} == {"windowed", "no_async", "arrival_talker"}
    assert by["naive"]["baseline"] == "streaming" and by["naive"]["ratio"] > 1.5
    names = [c["name"] for c in checks(result, "cpu", found)]
    assert not any("naive" in n or "windowed" in n for n in names)
    assert all(c["status"] in ("PASS", "n/a") for c in checks(result, "cpu", found))
    table = ablation_table({**result, "ratios": found}, markdown=True)
    assert "4695" not in table and "TTFA / streaming" not in table


def test_a_windowed_run_without_the_held_answer_is_compared_with_no_held():
    def var(v2v, first, flags=None):
        return {"turns_ok": 3, "summary": {"v2v_ms": {"p50": v2v}, "first_token_ms": {"p50": first}}, "turns": []}

    result = {"ablation": {"streaming": var(520, 0), "no_held": var(780, 140), "windowed": var(830, 190)},
              "servers": {"windowed": {"serve_flags": ["--no-speculative"]}, "no_held": {"serve_flags": ["--no-speculative"]}},
              "sweep": {}}
    found = ratios(result)
    win = next(r for r in found if r["variant"] == "windowed")
    assert win["shown"] and win["baseline"] == "no_held" and win["diff_ms"] == 50 and win["first_token_diff_ms"] == 50
    check = next(c for c in checks(result, "cpu", found) if c["name"].startswith("windowed"))
    assert check["status"] == "PASS"


def test_quality_bench_derives_its_two_presets(tmp_path):
    """latency_bench.quality serves the packaged preset as is and a greedy copy of it (its thinker without
    sampling, answer policy and languages); the copy still loads as a preset."""
    import yaml

    from latency_bench.quality import derive
    from omni_rt.presets import PRESET_DIR, load_preset

    assert derive("cpu", False, tmp_path) == str(PRESET_DIR / "cpu.yaml")
    greedy = derive("cpu", True, tmp_path)
    data = yaml.safe_load(open(greedy))
    thinker = next(st for st in data["stages"] if st["name"] == data["entry"])
    assert not {"sampling", "answer_policy", "languages"} & set(thinker["args"])
    assert load_preset(greedy).name == "cpu-greedy"


def test_quality_update_docs_rewrites_only_the_marked_table(tmp_path):
    """``quality --update-docs`` replaces what lies between the page's markers and keeps the prose and history
    around them; a page without the markers is refused with an error naming them (no guessing where to write)."""
    import pytest

    from latency_bench.quality import BEGIN, DOCS_PAGE, END, update_docs

    assert BEGIN in DOCS_PAGE.read_text() and END in DOCS_PAGE.read_text(), "docs/benchmarks/quality.md keeps its markers"
    page = tmp_path / "quality.md"
    page.write_text(f"# Answer quality\n\nprose\n\n{BEGIN}\nold header\n\n| old |\n{END}\n\n## History\nkept\n")
    update_docs("| metric | preset |\n|---|---|\n", "new header", page)
    text = page.read_text()
    assert text == f"# Answer quality\n\nprose\n\n{BEGIN}\nnew header\n\n| metric | preset |\n|---|---|\n{END}\n\n## History\nkept\n"
    update_docs("| again |", "h2", page)
    assert text.replace("new header", "h2").replace("| metric | preset |\n|---|---|", "| again |") == page.read_text()
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    with pytest.raises(ValueError, match="quality:begin"):
        update_docs("| x |", "h", bare)
    assert bare.read_text() == "# no markers\n"


def test_a_listener_speaks_again_once_the_answer_has_played():
    """``--pace playback``: the bench's simulated 24 kHz player, given the audio deltas as they arrived, says when
    the answer has played (gaps included), which is when a listener who hears it out starts the pause."""
    from omni_rt.testing.playback import SR, simulate_playback
    from omni_rt.testing.playback import playback as _playback

    # 1 s at t=10, 1 s at t=10.5 (buffered), then 0.5 s at t=13 after the buffer ran dry at 12
    deltas = [(10.0, SR), (10.5, SR), (13.0, SR // 2)]
    count, gap_ms, end = _playback(deltas)
    assert (count, round(gap_ms), round(end, 3)) == (1, 1000, 13.5)
    assert simulate_playback(deltas) == (count, gap_ms)
    assert _playback([])[2] is None
