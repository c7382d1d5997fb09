"""latency_bench's README writer: it replaces only the generated top of '## Benchmarks'; the subsections other
benches write (turn taking, ...) and the sections after it stay."""

from latency_bench.report import update_readme


def test_update_readme_keeps_subsections_and_later_sections(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Benchmarks\n\nold table\n\n### Turn taking\n\nkept\n\n## Answer quality\n\nalso kept\n")
    update_readme("new table", readme)
    text = readme.read_text()
    assert "new table" in text and "old table" not in text
    assert "### Turn taking\n\nkept" in text and "## Answer quality\n\nalso kept" in text
    assert text.index("new table") < text.index("### Turn taking")


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


def test_a_listener_speaks_again_once_the_answer_has_played():
    """``--pace playback``: the bench's simulated 24 kHz player, given the audio deltas as they arrived, says when
    the answer has played (gaps included), which is when a listener who hears it out starts the pause."""
    from latency_bench.realtime_bench import SR, _playback, simulate_playback

    # 1 s at t=10, 1 s at t=10.5 (buffered), then 0.5 s at t=13 after the buffer ran dry at 12
    deltas = [(10.0, SR), (10.5, SR), (13.0, SR // 2)]
    count, gap_ms, end = _playback(deltas)
    assert (count, round(gap_ms), round(end, 3)) == (1, 1000, 13.5)
    assert simulate_playback(deltas) == (count, gap_ms)
    assert _playback([])[2] is None
