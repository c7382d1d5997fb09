"""Noise reduction (``audio.input.noise_reduction``, RNNoise): what it costs and what Whisper hears with it.

Spoken questions (the CPU preset's Piper voice, two speaking rates) mixed with four noises
(``omni_rt.testing.noise``): pink and white noise and dish clatter over pink noise at ``--snr`` (5 dB), and a
babble of six talkers at ``--babble-snr`` (10 dB); 16 kHz as the ASR stage gets them, each heard by Whisper
tiny.en three ways: clean, noisy, and noisy through the session's denoiser
(``omni_rt.backends.denoise.StreamingDenoiser``, fed in 20 ms chunks as a client streams). Also: the denoiser's
CPU cost per stream (real-time factor: seconds of compute per second of audio, one thread), its added latency
(the fixed delay of its output stream, and where the speech sits in it: ``lag_ms``, which a unit test checks by
cross-correlation), and the false turn starts per minute of each noise alone, at the level it had under the
questions (Silero VAD, ``server_vad`` defaults), with and without it. Writes ``latency_bench/results/noise.json``;
the table is in docs/benchmarks/noise.md.
"""

from __future__ import annotations

import argparse
import difflib
import json
import platform
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

SR = 16000
QUESTIONS = (
    "What is the capital of France?",
    "Could you tell me what the tallest mountain in the world is?",
    "How many days are there in a leap year?",
    "Please set a timer for ten minutes.",
    "What time does the train to Boston leave tomorrow morning?",
    "Can you recommend a good book about the history of Rome?",
)
LENGTH_SCALES = (1.0, 0.85)  # Piper's speaking rate: 1.0 and ~18% faster
OUT = Path(__file__).parent / "results" / "noise.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snr", type=float, default=5.0, help="speech-to-noise ratio of pink, white and clatter, dB (default 5)")
    p.add_argument("--babble-snr", type=float, default=10.0, help="speech-to-babble ratio in dB (default 10)")
    p.add_argument("--noise-s", type=float, default=60.0, help="seconds of each noise alone for the false-start count")
    p.add_argument("--out", type=Path, default=OUT)


def _norm(s: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", s.lower().replace("10", "ten")).split()


def word_accuracy(ref: str, hyp: str) -> float:
    """Reference words matched in order (difflib), over the reference's words."""
    r, h = _norm(ref), _norm(hyp)
    return sum(b.size for b in difflib.SequenceMatcher(a=r, b=h).get_matching_blocks()) / max(len(r), 1)


def denoise(lib: Any, x: np.ndarray, chunk: int = SR // 50, **kw: Any) -> tuple[np.ndarray, float, int]:
    """(output, compute seconds, the denoiser's fixed delay in samples)."""
    from omni_rt.backends.denoise import StreamingDenoiser

    d = StreamingDenoiser(lib, SR, **kw)
    t = time.perf_counter()
    out = np.concatenate([d.process(x[i:i + chunk]) for i in range(0, x.size, chunk)])
    el = time.perf_counter() - t
    d.close()
    return out, el, d.delay_samples


def vad_starts(vad_model: Any, x: np.ndarray) -> int:
    from omni_rt.backends.vad import StreamingVAD

    vad = StreamingVAD(vad_model, threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500, sample_rate=SR)
    return sum(ev.kind == "speech_started" for i in range(0, x.size, 320) for ev in vad.feed(x[i:i + 320]))


def command(args: argparse.Namespace) -> int:
    from omni_rt.audio.pcm import resample
    from omni_rt.backends.denoise import StreamingDenoiser, load_library
    from omni_rt.backends.tts_piper import PiperTTS
    from omni_rt.backends.vad import SileroVadModel
    from omni_rt.backends.whisper import FasterWhisperASR
    from omni_rt.testing import noise as N

    lib, asr, vad_model = load_library(), FasterWhisperASR(), SileroVadModel()
    rng = np.random.default_rng(0)
    kinds = {"pink": (N.pink_noise, args.snr), "white": (N.white_noise, args.snr),
             "clatter": (N.clatter, args.snr), "babble": (N.babble, args.babble_snr)}
    # One long take of each noise; each clip hears a stretch of it from a random place.
    bank = {name: gen(int(max(args.noise_s, 30.0) * SR), rng) for name, (gen, _) in kinds.items()}
    rows: list[dict[str, Any]] = []
    speech_power: list[float] = []
    compute_s = audio_s = 0.0
    delay, lag_ms = 0, StreamingDenoiser(lib, SR).lag_ms
    for scale in LENGTH_SCALES:
        tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0, length_scale=scale)
        for q in QUESTIONS:
            s = resample(tts.synthesize(q), tts.sample_rate, SR).astype(np.float32)
            speech_power.append(float(np.mean(s ** 2)))
            s = np.concatenate([np.zeros(SR // 2, np.float32), s, np.zeros(SR // 2, np.float32)])
            row: dict[str, Any] = {"question": q, "length_scale": scale, "clean": word_accuracy(q, asr.transcribe(s))}
            for name, (_, snr) in kinds.items():
                off = int(rng.integers(0, bank[name].size - s.size))
                noisy = s + N.at_snr(s, bank[name][off:off + s.size], snr)
                out, el, delay = denoise(lib, noisy)
                compute_s, audio_s = compute_s + el, audio_s + noisy.size / SR
                hyp_noisy, hyp_den = asr.transcribe(noisy), asr.transcribe(out)
                hyp_wet = asr.transcribe(denoise(lib, noisy, dry_mix=0.0)[0])
                row[name] = {"snr_db": snr, "noisy": word_accuracy(q, hyp_noisy), "denoised": word_accuracy(q, hyp_den),
                             "denoised_no_mix": word_accuracy(q, hyp_wet),
                             "noisy_text": hyp_noisy, "denoised_text": hyp_den, "denoised_no_mix_text": hyp_wet}
            rows.append(row)
            print(json.dumps(row), flush=True)
    # Each noise alone at the level it had under the questions (their mean speech power over its SNR).
    noise_alone = {}
    n, minutes = int(args.noise_s * SR), args.noise_s / 60
    for name, (_, snr) in kinds.items():
        level = float(np.sqrt(np.mean(speech_power) / 10 ** (snr / 10)))
        x = (level * bank[name][:n]).astype(np.float32)
        on = denoise(lib, x)[0]
        off_starts, on_starts = vad_starts(vad_model, x), vad_starts(vad_model, on)
        noise_alone[name] = {"snr_db": snr, "rms": round(level, 4), "seconds": args.noise_s,
                             "starts_off": off_starts, "starts_on": on_starts,
                             "starts_per_min_off": round(off_starts / minutes, 1),
                             "starts_per_min_on": round(on_starts / minutes, 1),
                             "rms_on": round(float(np.sqrt(np.mean(on[SR // 2:] ** 2))), 5)}
        print(name, noise_alone[name], flush=True)

    def mean(key: str, sub: str | None = None) -> float:
        vals = [r[key] if sub is None else r[key][sub] for r in rows]
        return round(float(np.mean(vals)), 3)

    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "snr_db": {name: snr for name, (_, snr) in kinds.items()},
        "clips": len(rows),
        "word_accuracy": {"clean": mean("clean"),
                          **{f"{n}_{k}": mean(n, k) for n in kinds for k in ("noisy", "denoised", "denoised_no_mix")}},
        "rtf_per_stream": round(compute_s / audio_s, 4),
        "delay_ms_fixed": round(delay * 1000 / SR, 1),
        "speech_lag_ms": lag_ms,
        "noise_alone": noise_alone,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return 0
