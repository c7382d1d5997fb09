"""The ASR stage's VAD segmentation: one session's input stream, its Silero VAD, and the current turn's audio.

Why its own component: where a turn's audio begins and ends (the prefix padding kept before a speech start,
the silence dropped outside speech, offsets on the stream clock) is bookkeeping the stage's decisions read
but do not own; it is also what a stage-level test or benchmark replays without a scheduler.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class TurnAudio:
    """The stream clock (``stream_samples``), the turn buffer (``samples`` in ``chunks``) and the VAD over them.
    ``vad`` is a ``StreamingVAD`` (``None``: nothing detects turns, the client commits). One owner thread."""

    def __init__(self, vad: Any, sample_rate: int) -> None:
        self.vad = vad
        self.sample_rate = sample_rate
        self.chunks: list[np.ndarray] = []
        self.samples = 0
        self.stream_samples = 0  # all samples ever appended (for audio_*_ms offsets)

    def append(self, audio: np.ndarray, detect: bool) -> list[Any]:
        """Buffer ``audio``; with ``detect``, run the VAD over it and return its events (speech started/stopped)."""
        self.chunks.append(audio)
        self.samples += audio.size
        self.stream_samples += audio.size
        return self.vad.feed(audio) if detect else []

    def audio(self) -> np.ndarray:
        """The turn's audio so far (one array; the chunks are joined once)."""
        if not self.chunks:
            return np.zeros(0, dtype=np.float32)
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0]

    def keep_last(self, keep_ms: int) -> None:
        """Start a new turn buffer holding only the last ``keep_ms`` of audio (0: empty)."""
        audio = self.audio()
        keep = int(keep_ms * self.sample_rate / 1000)
        self.chunks = [audio[-keep:]] if keep and audio.size else []
        self.samples = sum(c.size for c in self.chunks)

    def ms(self, samples: int) -> int:
        return int(samples * 1000 / self.sample_rate)
