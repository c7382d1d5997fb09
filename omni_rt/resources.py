"""Where the preset files and the demo page are, installed or in a source checkout; where the cache is.

The repository keeps them in top-level ``models/`` and ``web/``; the wheel ships them as package data
``omni_rt/_presets`` and ``omni_rt/_web`` (``pyproject.toml`` maps the folders). Running from a checkout
(tests, ``python -m omni_rt.cli``) finds the top-level folders; an installed package finds its own copy.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(packaged: str, checkout: str) -> Path:
    inside = _PACKAGE / packaged
    if inside.is_dir():
        return inside
    beside = _PACKAGE.parent / checkout
    if beside.is_dir():
        return beside
    raise FileNotFoundError(f"omni-rt data folder not found: looked for {inside} (installed) and {beside} (checkout)")


def preset_dir() -> Path:
    return _find("_presets", "models")


def web_dir() -> Path:
    return _find("_web", "web")


def ablation_preset_dir() -> Path | None:
    """``latency_bench/presets``, the benchmark's ablation presets: in a source checkout only (not packaged)."""
    beside = _PACKAGE.parent / "latency_bench" / "presets"
    return beside if beside.is_dir() else None


def cache_root() -> Path:
    """Where omni-rt writes what it builds or converts (llama.cpp builds, served GGUFs, their logs):
    ``$OMNI_RT_CACHE``, else ``~/.cache/omni-rt``."""
    return Path(os.environ.get("OMNI_RT_CACHE") or Path.home() / ".cache" / "omni-rt")
