"""Piper's onnxruntime arenas keep the peak of every run; ``PiperTTS.release_memory`` (called when the server is
idle) gives it back, and the voice speaks the same afterwards. Real voice, real runs."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from omni_rt.backends.tts_piper import PiperTTS

LONG = ("Rivers, mountains and old towns of the north are lovely to visit in the spring, when the snow melts and "
        "the valleys turn green again, and the long evenings are warm.")


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


@pytest.mark.integration  # a real model runs for seconds
def test_release_memory_hands_back_the_arena_peak_and_the_voice_still_speaks() -> None:
    tts = PiperTTS(streaming=True, noise_scale=0.0, noise_w_scale=0.0)
    before_audio = tts.synthesize("Sure, I can help with that.")
    base = rss_mb()
    voices = [threading.Thread(target=lambda: tts.synthesize(LONG)) for _ in range(2)]  # two answers at once
    for v in voices:
        v.start()
    for v in voices:
        v.join(timeout=120)
    grown = rss_mb()
    assert grown - base > 50, (base, grown)  # the arenas kept the two runs' peak
    tts.release_memory()
    released = rss_mb()
    assert released < base + (grown - base) / 3, (base, grown, released)
    after_audio = tts.synthesize("Sure, I can help with that.")
    assert after_audio.shape == before_audio.shape and np.allclose(after_audio, before_audio, atol=1e-4)
