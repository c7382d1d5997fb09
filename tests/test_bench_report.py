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
