"""The suite's own layout: pytest imports test files by basename (rootdir-relative ``prepend`` mode), so two test
files with the same name in different folders stop the whole collection with an import-file mismatch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_a_basename_of_its_own() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
