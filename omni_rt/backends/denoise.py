"""Streaming speech denoiser for the input audio (``audio.input.noise_reduction``): RNNoise, per session.

Why RNNoise (the ``pyrnnoise`` wheel): its weights are compiled into the shared library the wheel ships
(``pyrnnoise/librnnoise.so``, manylinux x86_64, nothing built or downloaded at install or run time), and a
10 ms frame is a small GRU network: a stream costs ~5% of one core, resampling included, next to Whisper on a
CPU server (docs/benchmarks/noise.md). DeepFilterNet (``deepfilternet`` 0.5.6), the other
packaged denoiser, downloads its weights from GitHub on first use, needs torch and pins ``numpy<2`` — neither
offline nor installable beside this project's numpy. The library is loaded with ctypes straight from the
installed package, without importing ``pyrnnoise`` (its ``__init__`` imports a file-I/O stack, audiolab and
PyAV, that a stream does not need).

The mechanism: RNNoise runs at 48 kHz on 480-sample frames; the pipeline's input is float32 at
``PIPELINE_INPUT_RATE`` (16 kHz). Each session's ``StreamingDenoiser`` upsamples with a soxr stream, cuts 10 ms
frames (the remainder waits for the next chunk), denoises them in one RNNoise state, and downsamples with a
second soxr stream; all three keep their state across chunks, so audio cut into chunks is denoised as the
whole would be. soxr's "QQ" (cubic) quality holds back ~0.1 ms where its "LQ" filter holds back up to 20 ms
each way. The input is band-limited to 8 kHz and what folds back on the way down is RNNoise's own (suppressed)
upper band; on the 12-clip set Whisper's word accuracy on RNNoise alone was 0.87 / 0.79 (pink / white noise)
with QQ and 0.93 / 0.76 with LQ, no consistent difference, so the short filter saves ~40 ms on every turn end.

What comes out is the denoised signal with ``dry_mix`` (0.2, ~-14 dB) of the original, aligned, mixed back under
it: Whisper is trained on noisy speech and hears RNNoise's artefacts (a word's soft consonants gated away with
the noise) worse than noise 14 dB down; the numbers are at ``DRY_MIX``.

One chunk in gives exactly as many samples out: the output is the denoised stream delayed by a fixed
``delay_samples`` (the frame's 10 ms plus what the resamplers hold, primed with zeros), so the stage's stream
clock (``audio_start_ms`` / ``audio_end_ms``) keeps counting the client's samples. Buffers are bounded: at most
one frame waits at 48 kHz, and ``delay_samples`` plus one chunk at 16 kHz.

``near_field`` and ``far_field`` (OpenAI's two types) run the same RNNoise model with the same settings:
RNNoise has one model and no second mode, and a gain stage for distant talkers would lift the noise floor the VAD
threshold sees as much as the voice; the session echoes the type it was sent, and docs/protocol-fields.md says
both are the same filter.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from omni_rt.backends.onnx import packaged_file

RNNOISE_RATE = 48000
FRAME = 480  # RNNoise's frame at 48 kHz (10 ms); checked against the library at load
# RNNoise works on int16-scaled floats
PCM_SCALE = 32768.0
RESAMPLE_QUALITY = "QQ"
# RNNoise's own lag (its 10 ms frame behind a 20 ms window) plus the cubic resamplers', at the 16 kHz output:
# where the speech sits in what it returns (cross-correlation, tests/unit/backends/test_denoise.py checks it)
RNNOISE_LAG_MS = 20
# How much of the original, aligned, is mixed back under the denoised signal (an attenuation limit: noise at most
# ~14 dB down). Whisper is trained on noisy speech and hears RNNoise's artefacts worse than moderate noise: on 12
# questions at 5 dB SNR, Whisper tiny.en's word accuracy on RNNoise alone was 0.87 (pink) / 0.79 (white) against
# 0.96 / 0.92 noisy; with 0.2 of the original mixed back 0.95 / 0.95 (docs/benchmarks/noise.md).
DRY_MIX = 0.2
NOISE_REDUCTION_TYPES = ("near_field", "far_field")


def rnnoise_library_path() -> Path:
    """``librnnoise.so`` inside the installed ``pyrnnoise`` package, found without importing it."""
    return packaged_file("pyrnnoise", "librnnoise.so",
                         "package 'pyrnnoise' is not installed (noise reduction needs it): pip install pyrnnoise==0.4.5",
                         "RNNoise library not found at {path}; reinstall with: pip install --force-reinstall pyrnnoise==0.4.5")


class RNNoiseLibrary:
    """The loaded RNNoise C library (shared by all sessions; each ``StreamingDenoiser`` owns one state of it).
    ctypes releases the GIL during each call, so streams on different threads do not serialise on it."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else rnnoise_library_path()
        lib = ctypes.CDLL(str(self.path))
        lib.rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.rnnoise_create.restype = ctypes.c_void_p
        lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.rnnoise_destroy.restype = None
        lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float)]
        lib.rnnoise_process_frame.restype = ctypes.c_float
        lib.rnnoise_get_frame_size.restype = ctypes.c_int
        frame = int(lib.rnnoise_get_frame_size())
        if frame != FRAME:
            raise RuntimeError(f"RNNoise at {self.path} uses {frame}-sample frames; this wrapper expects {FRAME}")
        self.lib = lib

    def create(self) -> int:
        state = self.lib.rnnoise_create(None)  # None: the model compiled into the library
        if not state:
            raise MemoryError("rnnoise_create returned NULL")
        return int(state)

    def destroy(self, state: int) -> None:
        self.lib.rnnoise_destroy(state)

    def process(self, state: int, frame: np.ndarray) -> float:
        """Denoise one 480-sample float32 frame (int16 scale) in place; returns RNNoise's speech probability."""
        ptr = frame.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        return float(self.lib.rnnoise_process_frame(state, ptr, ptr))


class StreamingDenoiser:
    """One stream's denoiser: float32 at ``sample_rate`` in, the same number of samples out, ``delay_samples``
    later (see the module docstring). One owner thread; ``close`` frees the RNNoise state."""

    def __init__(self, library: RNNoiseLibrary, sample_rate: int = 16000, quality: str = RESAMPLE_QUALITY,
                 dry_mix: float = DRY_MIX) -> None:
        import soxr

        if sample_rate <= 0 or RNNOISE_RATE % sample_rate:
            raise ValueError(f"denoiser input rate {sample_rate} Hz must divide {RNNOISE_RATE} Hz")
        if not 0.0 <= dry_mix <= 1.0:
            raise ValueError(f"denoiser dry_mix {dry_mix} must be between 0 and 1")
        self.library = library
        self.sample_rate = sample_rate
        self._up = soxr.ResampleStream(sample_rate, RNNOISE_RATE, 1, dtype="float32", quality=quality)
        self._down = soxr.ResampleStream(RNNOISE_RATE, sample_rate, 1, dtype="float32", quality=quality)
        self._state: int | None = library.create()
        self._pending = np.zeros(0, dtype=np.float32)  # 48 kHz samples short of a frame
        self._frame = np.zeros(FRAME, dtype=np.float32)
        ratio = RNNOISE_RATE // sample_rate
        # what can be held inside at any time, at the input rate: a frame short of complete, and soxr's hold-back
        # (QQ: a few samples at 48 kHz; LQ/MQ: up to ~40 ms each way), rounded up
        hold_ms = {"QQ": 1, "LQ": 21, "MQ": 39, "HQ": 39, "VHQ": 60}.get(quality, 60)
        self.delay_samples = FRAME // ratio + 2 * int(np.ceil(hold_ms * sample_rate / 1000))
        self._out = np.zeros(self.delay_samples, dtype=np.float32)  # primed: the fixed delay
        self.dry_mix = dry_mix
        # the original, delayed to where the speech sits in the output (RNNoise's lag on top of the fixed delay)
        self._dry = np.zeros(self.delay_samples + RNNOISE_LAG_MS * sample_rate // 1000, dtype=np.float32)
        self.speech_prob = 0.0  # RNNoise's last frame's speech probability
        self.frames = 0

    @property
    def delay_ms(self) -> float:
        """The fixed delay of the output stream (its priming zeros)."""
        return self.delay_samples * 1000.0 / self.sample_rate

    @property
    def lag_ms(self) -> float:
        """Where the speech sits in the output: the fixed delay plus RNNoise's own lag (the added latency)."""
        return self._dry.size * 1000.0 / self.sample_rate

    def process(self, audio: np.ndarray) -> np.ndarray:
        """Denoise ``audio`` (float32 mono, [-1, 1]); returns ``audio.size`` samples of the delayed output."""
        if self._state is None:
            raise RuntimeError("the denoiser was closed")
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        if x.size == 0:
            return x.copy()
        up = self._up.resample_chunk(x)
        buf = np.concatenate([self._pending, up]) if self._pending.size else up
        n = buf.size // FRAME
        out48 = np.empty(n * FRAME, dtype=np.float32)
        frame = self._frame
        for i in range(n):
            np.multiply(buf[i * FRAME:(i + 1) * FRAME], PCM_SCALE, out=frame)
            self.speech_prob = self.library.process(self._state, frame)
            np.multiply(frame, 1.0 / PCM_SCALE, out=out48[i * FRAME:(i + 1) * FRAME])
        self.frames += n
        self._pending = buf[n * FRAME:].copy()
        down = self._down.resample_chunk(out48) if n else np.zeros(0, dtype=np.float32)
        out = np.concatenate([self._out, down])
        if out.size < x.size:  # never with the delay above; a guard so the clock can not drift
            out = np.concatenate([np.zeros(x.size - out.size, dtype=np.float32), out])
        self._out = out[x.size:]
        y = out[:x.size]
        if self.dry_mix:
            dry = np.concatenate([self._dry, x])
            self._dry = dry[x.size:]
            y = y + self.dry_mix * dry[:x.size]
        return np.clip(y, -1.0, 1.0)

    def close(self) -> None:
        if self._state is not None:
            self.library.destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def load_library(path: Any = None) -> RNNoiseLibrary:
    """The RNNoise library; a missing package is a ``FileNotFoundError`` naming it and the pip command."""
    return RNNoiseLibrary(path)
