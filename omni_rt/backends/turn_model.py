"""Smart Turn v3.2 (BSD-2-Clause, ONNX): the probability that a speaker has finished their turn.

Why a model: silence alone cannot tell "What is the capital of France?" (done) from "Can you set a timer
for, um..." (mid-thought); Smart Turn hears intonation and the cut-off word. The weights ship inside the
`pipecat-ai` wheel (installed with ``--no-deps``); we locate the file with ``importlib.util.find_spec`` and
never import pipecat, whose ``__init__`` imports loguru and patches asyncio.

Input: the last 8 s of 16 kHz mono audio, zero-padded on the left, normalised to zero mean / unit variance,
as an 80x800 Whisper log-mel (faster-whisper's numpy ``FeatureExtractor``: the same Slaney mel filters, Hann
window and log/clamp/scale steps as Whisper's extractor). Output: sigmoid probability the turn is complete.
One call costs ~40-130 ms on 2 cores, so callers run it on a worker thread and only on pauses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omni_rt.backends.onnx import cpu_session, packaged_file

SAMPLE_RATE = 16000
WINDOW_S = 8
PACKAGE = "pipecat-ai"
MODEL_FILE = "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
_NORM_EPS = 1e-7


def smart_turn_onnx_path() -> Path:
    """Path of the packaged ONNX file, found without importing ``pipecat`` (its ``__init__`` is heavy)."""
    return packaged_file(
        "pipecat", MODEL_FILE,
        f"package '{PACKAGE}' is not installed, so the Smart Turn model file pipecat/{MODEL_FILE} is missing: "
        f"pip install --no-deps {PACKAGE}==1.14.0 (scripts/install.sh does it)",
        f"Smart Turn model file pipecat/{MODEL_FILE} not found in package '{PACKAGE}' at {{path}}; "
        f"reinstall with: pip install --no-deps --force-reinstall {PACKAGE}==1.14.0",
    )


class SmartTurnModel:
    """Shared, stateless end-of-turn scorer; ``InferenceSession.run`` is thread-safe."""

    def __init__(self, path: str | Path | None = None, intra_op_threads: int = 1) -> None:
        from faster_whisper.feature_extractor import FeatureExtractor

        self.path = Path(path) if path is not None else smart_turn_onnx_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"Smart Turn model file not found at {self.path} (package '{PACKAGE}')")
        # one thread: the ASR decode worker already uses the other core; a second would only contend
        self.session = cpu_session(self.path, intra_op_threads)
        self.input_name = self.session.get_inputs()[0].name
        # faster-whisper's extractor is numpy-only and is already a dependency (the ASR backend)
        self._features = FeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE, chunk_length=WINDOW_S)

    def features(self, audio: np.ndarray) -> np.ndarray:
        """80x800 log-mel of the last 8 s (left zero-padded), waveform normalised first as Smart Turn was trained."""
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        n = SAMPLE_RATE * WINDOW_S
        x = x[-n:] if x.size >= n else np.pad(x, (n - x.size, 0))
        x = (x - x.mean()) / np.sqrt(x.var() + _NORM_EPS)
        # padding=0: 128000 samples give exactly 800 frames (the extractor drops the trailing STFT frame)
        return np.asarray(self._features(x, padding=0), dtype=np.float32)

    def predict(self, audio: np.ndarray) -> float:
        """Probability in [0, 1] that the turn in ``audio`` (16 kHz float32, ending now) is complete."""
        feats = self.features(audio)[None, :, :]
        out = self.session.run(None, {self.input_name: feats})[0]
        return float(np.asarray(out).reshape(-1)[0])
