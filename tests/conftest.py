"""Fixtures shared by the unit and the integration tests (the server ones are in tests/integration/conftest.py).

Being the top conftest, this file also puts tests/ itself on ``sys.path`` (pytest's default "prepend" import
mode), so every test imports the helpers beside it: ``tiny_models``, ``toy_stages``, ``rt_helpers``.
"""

from __future__ import annotations

import os

import pytest
from tiny_models import SMALL_SNAC_CONFIG

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def speech_samples(tmp_path_factory):
    """Spoken questions synthesized once with the CPU preset's Piper voice: {name: (float32 audio, rate)}."""
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)  # the same audio every run (VITS noise is unseeded)
    texts = {
        "capital": "What is the capital of France?",
        "color": "What color is the sky on a clear day?",
        "long": "Tell me a long story about a dragon who lived in the mountains and loved to read books.",
    }
    return {name: (tts.synthesize(text), tts.sample_rate, text) for name, text in texts.items()}


@pytest.fixture(scope="session")
def small_snac():
    from omni_rt.backends.snac_codec import build_random_snac

    return build_random_snac(seed=0, config=SMALL_SNAC_CONFIG)
