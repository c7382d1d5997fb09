"""Silero VAD (ONNX, onnxruntime) with OpenAI `server_vad` turn semantics.

One `SileroVadModel` (an onnxruntime session, 1 intra-op thread: a 32 ms frame costs ~0.3 ms, so
more threads only add contention) is shared by all sessions; `InferenceSession.run` is thread-safe.
Each stream owns a `StreamingVAD` holding the model's recurrent state, the 64-sample context and the
turn state machine. Weights ship inside the `silero-vad` PyPI package; no torch is needed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from omni_rt.backends.onnx import cpu_session, packaged_file

_STATE_SHAPE = (2, 1, 128)
# Where the sound ended, not where Silero let go: its recurrent state keeps p >= threshold for a few frames
# after the last audible sample (~90 ms typically; docs/tuning-cpu.md, "pause from the sound's end"), so a silence counted from the last
# speech frame is that much longer than the one the speaker left. When a silence run starts, the end of speech
# moves back to the last 8 ms window of the trailing speech frames louder than ENERGY_END_RATIO of the turn's
# loudest window (-26 dB: soft final consonants stay inside), at most ENERGY_END_FRAMES frames back and never
# before the run of frames Silero called speech; where the tail never gets that quiet (noise) nothing moves.
ENERGY_END_RATIO = 0.05
ENERGY_END_FRAMES = 8
ENERGY_WINDOW_MS = 8


def silero_onnx_path(name: str = "silero_vad.onnx") -> Path:
    """Locate the ONNX file inside the installed `silero-vad` package without importing it (no torch)."""
    return packaged_file("silero_vad", f"data/{name}", "package 'silero-vad' is not installed: pip install silero-vad",
                         "Silero VAD model not found at {path}; reinstall with: pip install -U silero-vad")


class SileroVadModel:
    """Shared, stateless wrapper around the Silero VAD ONNX session (16 kHz or 8 kHz)."""

    def __init__(self, path: str | Path | None = None, intra_op_threads: int = 1) -> None:
        self.path = Path(path) if path is not None else silero_onnx_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"Silero VAD model not found at {self.path}")
        self.session = cpu_session(self.path, intra_op_threads)

    @staticmethod
    def frame_size(sample_rate: int) -> int:
        """Samples per model call: 512 at 16 kHz (32 ms), 256 at 8 kHz."""
        return {16000: 512, 8000: 256}[sample_rate]

    @staticmethod
    def context_size(sample_rate: int) -> int:
        """Samples of the previous frame the model sees in front of each frame."""
        return {16000: 64, 8000: 32}[sample_rate]

    def infer(self, x: np.ndarray, state: np.ndarray, sample_rate: int = 16000) -> tuple[np.ndarray, np.ndarray]:
        """Speech probabilities for a batch of frames.

        x: float32 [B, context + frame] (context samples prepended); state: float32 [2, B, 128].
        Returns (probs [B], new_state [2, B, 128]). Batching many streams in one call is allowed.
        """
        out, new_state = self.session.run(
            None,
            {
                "input": np.ascontiguousarray(x, dtype=np.float32),
                "state": np.ascontiguousarray(state, dtype=np.float32),
                "sr": np.array(sample_rate, dtype=np.int64),
            },
        )
        return out[:, 0].astype(np.float32), new_state


@dataclass(frozen=True)
class VadEvent:
    """A turn boundary, in milliseconds since the start of the stream.

    speech_started: `audio_ms` = onset minus prefix padding (OpenAI `audio_start_ms`), clamped at 0.
    speech_stopped: `audio_ms` = end of the last speech frame plus the silence that confirmed the stop
    (OpenAI `audio_end_ms`, which includes the silence duration). `speech_ms` is the raw onset / the raw
    end of the last speech frame, without padding or silence (useful for trimming and V2V measurements).
    """

    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: int
    speech_ms: int


class StreamingVAD:
    """Per-stream turn detector: feed float32 audio at `sample_rate`, get speech start/stop events.

    Speech starts on the first frame with prob >= threshold. While in speech, a frame with
    prob < threshold - 0.15 (silero's own release hysteresis, floored at 0.01) counts as silence, a frame
    with prob >= threshold ends any silence run, and frames in between continue whatever run they are in.
    Speech stops once the silence run reaches `silence_duration_ms`, counted from where the sound of the
    last speech frames ended (``ENERGY_END_RATIO``). Not thread-safe: one owner thread.
    """

    def __init__(
        self,
        model: SileroVadModel,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        sample_rate: int = 16000,
        sound_end_ratio: float = ENERGY_END_RATIO,
        silence_from_sound_end: bool = True,
    ) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if not 0.0 <= sound_end_ratio < 1.0:
            raise ValueError(f"sound_end_ratio must be in [0, 1) (0: count from Silero's last speech frame), got {sound_end_ratio}")
        self.sound_end_ratio = float(sound_end_ratio)
        # what `silence_ms` (and the stop) counts from; `sound_silence_ms` always counts from the sound's end
        self.silence_from_sound_end = bool(silence_from_sound_end)
        self.model = model
        self.sample_rate = sample_rate
        self.frame = SileroVadModel.frame_size(sample_rate)
        self._ctx_len = SileroVadModel.context_size(sample_rate)
        self.configure(threshold, prefix_padding_ms, silence_duration_ms)
        self.samples_seen = 0  # stream clock, in samples
        self._pending = np.zeros(0, dtype=np.float32)  # samples waiting for a whole frame
        self.reset()

    def configure(self, threshold: float, prefix_padding_ms: int, silence_duration_ms: int) -> None:
        """Change turn-detection settings mid-stream (session.update) without losing model state."""
        self.threshold = float(threshold)
        self.release_threshold = max(self.threshold - 0.15, 0.01)
        self.prefix_padding_ms = int(prefix_padding_ms)
        self.silence_duration_ms = int(silence_duration_ms)

    def reset(self) -> None:
        """Forget model state, buffered samples and turn state (buffer clear, forced turn end).

        The stream clock keeps running (dropped buffered samples count as heard), so later event offsets
        stay relative to the start of the stream, as the Realtime protocol's audio_*_ms are.
        """
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(self._ctx_len, dtype=np.float32)
        self.samples_seen += self._pending.size
        self._pending = np.zeros(0, dtype=np.float32)
        self.in_speech = False
        self.last_prob = 0.0
        self._last_speech_end = self.samples_seen  # sample index of the end of the last speech frame
        self._sound_end_at = self.samples_seen  # ... and where its sound ended (``_sound_end``)
        self._silence_run = False
        # per ENERGY_WINDOW_MS window RMS of the current run of speech frames (its last ENERGY_END_FRAMES), and
        # the loudest window of this turn's speech: computed once per speech frame, read when a silence starts
        self._run_rms: deque[np.ndarray] = deque(maxlen=ENERGY_END_FRAMES)
        self._peak_rms = 0.0

    def _speech_frame(self, frame: np.ndarray, new_run: bool) -> None:
        """Record a frame of the current run of speech frames (``new_run``: the first one of a run)."""
        w = self.sample_rate * ENERGY_WINDOW_MS // 1000
        rms = np.sqrt(np.mean(np.square(frame.reshape(-1, w), dtype=np.float64), axis=1))
        if new_run:
            self._run_rms.clear()
        self._run_rms.append(rms)
        self._peak_rms = max(self._peak_rms, float(rms.max()))

    def _sound_end(self) -> int:
        """Sample index where the run of speech frames' sound fell under ``sound_end_ratio`` of the turn's peak
        (the run ends at ``_last_speech_end``); ``_last_speech_end`` itself when it never did."""
        w = self.sample_rate * ENERGY_WINDOW_MS // 1000
        rms = np.concatenate(self._run_rms) if self._run_rms else np.zeros(0)
        if rms.size == 0 or self._peak_rms <= 0.0 or rms[-1] >= self.sound_end_ratio * self._peak_rms:
            return self._last_speech_end
        loud = np.nonzero(rms >= self.sound_end_ratio * self._peak_rms)[0]
        quiet_windows = rms.size - (int(loud[-1]) + 1 if loud.size else 0)
        return self._last_speech_end - quiet_windows * w

    def _speech_end(self) -> int:
        return self._sound_end_at if self.silence_from_sound_end else self._last_speech_end

    def _ms(self, samples: int) -> int:
        return int(samples * 1000 // self.sample_rate)

    @property
    def processed_ms(self) -> float:
        """Stream clock: milliseconds of audio run through the model (plus any dropped by `reset`)."""
        return self.samples_seen * 1000.0 / self.sample_rate

    @property
    def silence_ms(self) -> float:
        """Trailing silence while in speech (0 when not in speech), from where the sound ended or, with
        ``silence_from_sound_end=False``, from the last speech frame."""
        return self._silence_since(self._speech_end())

    @property
    def sound_silence_ms(self) -> float:
        """Trailing silence from where the sound ended, whatever ``silence_ms`` counts from."""
        return self._silence_since(self._sound_end_at)

    def _silence_since(self, end: int) -> float:
        if not self.in_speech:
            return 0.0
        return (self.samples_seen - end) * 1000.0 / self.sample_rate

    def force_stop(self) -> VadEvent:
        """End the current speech now (a turn model decided the turn is over), keeping the model's state.

        Unlike ``reset`` the recurrent state and context survive: the audio keeps flowing and the next
        speech start is found as usual. ``audio_ms`` is the stream clock now (the silence so far included).
        """
        ev = VadEvent("speech_stopped", self._ms(self.samples_seen), self._ms(self._speech_end()))
        self.in_speech = False
        self._silence_run = False
        return ev

    def feed(self, audio: np.ndarray) -> list[VadEvent]:
        """Process new audio (any length); remainders shorter than a frame wait for the next call."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        buf = np.concatenate([self._pending, audio]) if self._pending.size else audio
        n_frames = buf.size // self.frame
        events: list[VadEvent] = []
        for i in range(n_frames):
            frame = buf[i * self.frame : (i + 1) * self.frame]
            x = np.concatenate([self._context, frame])[None, :]
            probs, self._state = self.model.infer(x, self._state, self.sample_rate)
            self._context = frame[-self._ctx_len :].copy()
            start = self.samples_seen
            self.samples_seen += self.frame
            ev = self._step(float(probs[0]), start, frame)
            if ev is not None:
                events.append(ev)
        self._pending = buf[n_frames * self.frame :].copy()
        return events

    def _step(self, prob: float, frame_start: int, frame: np.ndarray) -> VadEvent | None:
        self.last_prob = prob
        frame_end = frame_start + self.frame
        if not self.in_speech:
            if prob >= self.threshold:
                self.in_speech = True
                self._silence_run = False
                self._last_speech_end = self._sound_end_at = frame_end
                self._peak_rms = 0.0
                self._speech_frame(frame, new_run=True)
                onset = self._ms(frame_start)
                return VadEvent("speech_started", max(0, onset - self.prefix_padding_ms), onset)
            return None
        new_run = False
        if prob >= self.threshold:
            new_run, self._silence_run = self._silence_run, False
        elif prob < self.release_threshold and not self._silence_run:
            self._silence_run = True
            self._sound_end_at = self._sound_end()  # the run of speech frames ends where this frame starts
        if not self._silence_run:
            self._last_speech_end = self._sound_end_at = frame_end
            self._speech_frame(frame, new_run)
            return None
        if self.silence_ms >= self.silence_duration_ms:
            self.in_speech = False
            self._silence_run = False
            return VadEvent("speech_stopped", self._ms(frame_end), self._ms(self._speech_end()))
        return None
