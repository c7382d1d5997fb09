"""Model presets: which weights each stage uses. A preset is a PipelineConfig file in ``models/`` (packaged as
``omni_rt/_presets``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_rt.pipeline.config import PipelineConfig
from omni_rt.resources import preset_dir

PRESET_DIR = preset_dir()


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name_or_path: str, overrides: dict[str, dict[str, Any]] | None = None) -> PipelineConfig:
    """Load a preset by name (``cpu``, ``gpu``) or from a YAML/TOML file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"preset '{name_or_path}' not found (looked for {path}); available: {available_presets()}")
    return PipelineConfig.from_file(path, overrides)
