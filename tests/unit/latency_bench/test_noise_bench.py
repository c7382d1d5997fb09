"""The noise bench's noises are what its table calls them: steady noise and clatter that Silero hears as no speech,
clatter that is impulsive, and a babble that is speech; each the same for the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from latency_bench.noise_bench import vad_starts, word_accuracy
from omni_rt.testing import noise as N

SR = 16000


def _crest(x: np.ndarray) -> float:
    return float(np.abs(x).max() / np.sqrt(np.mean(x ** 2)))


@pytest.mark.parametrize("gen", [N.pink_noise, N.white_noise, N.clatter])
def test_noises_are_unit_rms_and_seeded(gen) -> None:
    a, b = gen(3 * SR, np.random.default_rng(5)), gen(3 * SR, np.random.default_rng(5))
    assert a.dtype == np.float32 and a.size == 3 * SR
    assert abs(float(np.std(a)) - 1.0) < 1e-3
    assert np.array_equal(a, b)


def test_clatter_is_impulsive_and_never_silent() -> None:
    rng = np.random.default_rng(1)
    clatter, pink = N.clatter(5 * SR, rng), N.pink_noise(5 * SR, rng)
    assert _crest(clatter) > 2 * _crest(pink), (_crest(clatter), _crest(pink))
    frames = clatter[: clatter.size // 320 * 320].reshape(-1, 320)
    assert np.sqrt((frames ** 2).mean(axis=1)).min() > 0.01  # the pink floor between impacts


def test_at_snr_sets_the_power_ratio() -> None:
    rng = np.random.default_rng(2)
    speech, noise = 0.3 * rng.standard_normal(SR), N.pink_noise(SR, rng)
    scaled = N.at_snr(speech, noise, 5.0)
    assert abs(10 * np.log10(np.mean(speech ** 2) / np.mean(scaled ** 2)) - 5.0) < 0.01


@pytest.mark.integration  # Piper and Silero run for a few seconds
def test_silero_hears_babble_as_speech_and_clatter_as_none() -> None:
    from omni_rt.backends.vad import SileroVadModel

    model, rng = SileroVadModel(), np.random.default_rng(3)
    assert vad_starts(model, 0.1 * N.babble(6 * SR, rng, talkers=2)) >= 1
    assert vad_starts(model, 0.03 * N.clatter(6 * SR, rng)) == 0


def test_word_accuracy_counts_reference_words_in_order() -> None:
    assert word_accuracy("Please set a timer for ten minutes.", "Please set a timer for 10 minutes.") == 1.0
    assert word_accuracy("What is the capital of France?", "is the capital of branch") == pytest.approx(4 / 6)
