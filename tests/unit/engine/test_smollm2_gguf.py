"""The GGUF llama.cpp serves for the CPU preset: a format it cannot write is refused by name. The conversions
themselves (the packaged model, every tensor) are tests/integration/test_smollm2_gguf_conversion.py."""

from __future__ import annotations

import pytest

from omni_rt.engine.weights import smollm2


def test_an_unknown_format_names_the_stage_and_field(tmp_path):
    with pytest.raises(ValueError, match=r"stage 'thinker' field 'gguf_format': 'q4_0' is not one of q8_0, f16"):
        smollm2.ensure_served_gguf("q4_0", tmp_path)
    assert not any(tmp_path.iterdir())
