"""Stage roles in the pipeline config are validated: a role naming no stage fails naming the field. The CPU
preset with every stage renamed, served end to end: tests/integration/test_stage_roles.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
import yaml

from omni_rt.pipeline.config import ConfigError, PipelineConfig

ROOT = Path(__file__).resolve().parents[3]

RENAMES = {"asr": "ears", "thinker": "brain", "talker": "mouth", "vocoder": "voice"}


def renamed_preset() -> dict:
    data = yaml.safe_load((ROOT / "models" / "cpu.yaml").read_text())
    data["name"] = "cpu-renamed"
    data["entry"] = RENAMES[data["entry"]]
    data["roles"] = {role: RENAMES[stage] for role, stage in data["roles"].items()}
    for st in data["stages"]:
        st["name"] = RENAMES[st["name"]]
        for key in ("next", "stream_to"):
            if key in st:
                st[key] = RENAMES[st[key]] if isinstance(st[key], str) else [RENAMES[t] for t in st[key]]
    return data


def test_roles_are_validated() -> None:
    data = renamed_preset()
    data["roles"]["clauses"] = "nowhere"
    with pytest.raises((ConfigError, ValidationError), match="roles.clauses"):
        PipelineConfig.model_validate(data)
