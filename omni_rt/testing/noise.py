"""Background noises the noise-reduction tests and bench mix under speech: stationary (pink, white), impulsive
(dish clatter over pink noise) and other speakers (babble).

Each generator returns ``n`` samples of unit-RMS float32 noise at ``sr``, seeded by ``rng`` so a run hears the same
noise every time; ``at_snr`` scales it under a speech clip. Babble is the CPU preset's Piper voice speaking other
sentences at several rates and pitches at once: a room of talkers, which no speech denoiser can remove and which
a VAD rightly hears as speech.
"""

from __future__ import annotations

import numpy as np

SR = 16000

# What the babble's talkers say: everyday sentences unrelated to the questions the bench asks.
BABBLE_LINES = (
    "I told her the meeting moved to Thursday afternoon.",
    "The kids wanted pizza again, so we ordered two.",
    "Have you seen the new place that opened on the corner?",
    "He said the train was late by almost an hour.",
    "We should book the tickets before the prices go up.",
    "My sister is visiting next weekend with her dog.",
    "The soup was a little too salty for me.",
    "They finally fixed the heating in the office.",
)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / max(float(np.std(x)), 1e-9)).astype(np.float32)


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """1/f power: white noise shaped by 1/sqrt(f) in the frequency domain."""
    spec = np.fft.rfft(rng.standard_normal(n))
    k = np.arange(spec.size, dtype=np.float64)
    k[0] = 1.0
    return _unit(np.fft.irfft(spec / np.sqrt(k), n))


def white_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    return _unit(rng.standard_normal(n))


def clatter(n: int, rng: np.random.Generator, sr: int = SR, per_s: float = 3.0) -> np.ndarray:
    """Dishes and cutlery: impacts at random times (``per_s`` a second on average), each a click and a few damped
    high resonances (1.5-7 kHz, 15-80 ms), at levels up to 20 dB apart, over pink noise 10 dB under the impacts'
    RMS, so that the noise never falls silent between them (a kitchen, a café)."""
    out = np.zeros(n, np.float64)
    t = np.arange(int(0.12 * sr)) / sr
    for start in np.flatnonzero(rng.random(n) < per_s / sr):
        hit = np.zeros(t.size)
        for _ in range(int(rng.integers(2, 6))):
            f = rng.uniform(1500, min(7000, 0.45 * sr))
            hit += rng.uniform(0.3, 1.0) * np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) * np.exp(-t / rng.uniform(0.015, 0.08))
        hit[: int(0.002 * sr)] += rng.standard_normal(int(0.002 * sr)) * 2.0
        hit *= 10 ** (rng.uniform(-20, 0) / 20)
        m = min(hit.size, n - start)
        out[start:start + m] += hit[:m]
    peak_rms = float(np.sqrt(np.mean(out ** 2))) or 1.0
    return _unit(out + 10 ** (-10 / 20) * peak_rms * pink_noise(n, rng))


def babble(n: int, rng: np.random.Generator, sr: int = SR, talkers: int = 6) -> np.ndarray:
    """``talkers`` voices at once, each looping other sentences from a random offset: the Piper voice at three
    speaking rates, each resampled +-12% (pitch and tempo) so they do not sound like one speaker."""
    from omni_rt.audio.pcm import resample
    from omni_rt.backends.tts_piper import PiperTTS

    out = np.zeros(n, np.float64)
    for k in range(talkers):
        tts = PiperTTS(length_scale=(0.9, 1.0, 1.15)[k % 3])
        lines = [BABBLE_LINES[(k + j) % len(BABBLE_LINES)] for j in range(3)]
        voice = np.concatenate([resample(tts.synthesize(s), tts.sample_rate, sr) for s in lines]).astype(np.float64)
        voice = resample(voice, sr, int(sr * rng.uniform(0.88, 1.12))).astype(np.float64)
        voice = voice / max(float(np.std(voice)), 1e-9)
        loop = np.tile(voice, n // voice.size + 2)
        off = int(rng.integers(0, voice.size))
        out += loop[off:off + n]
    return _unit(out)


def at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """``noise`` scaled so that speech power / noise power over the clip is ``snr_db``."""
    return (noise * np.sqrt(np.mean(speech ** 2) / 10 ** (snr_db / 10) / np.mean(noise ** 2))).astype(np.float32)
