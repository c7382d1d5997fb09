"""Client audio formats of the Realtime protocol and the per-session codecs at the edge.

The pipeline works on float32: 16 kHz into VAD/ASR, the talker's native rate out of TTS/vocoder.
`InputDecoder` and `OutputEncoder` are the only places that know about wire formats; each holds a
streaming resampler so a session's chunks join without seams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast, get_args

import numpy as np

from . import g711
from .pcm import Quality, StreamResampler, float_to_pcm16, pcm16_to_float

AudioFormat = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]

AUDIO_FORMATS: tuple[AudioFormat, ...] = get_args(AudioFormat)
FORMAT_RATES: dict[AudioFormat, int] = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
BYTES_PER_SAMPLE: dict[AudioFormat, int] = {"audio/pcm": 2, "audio/pcmu": 1, "audio/pcma": 1}
# Beta-protocol names (`input_audio_format: "pcm16"`) map onto the GA ones.
_ALIASES: dict[str, AudioFormat] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}


def parse_audio_format(value: str | Mapping[str, Any]) -> AudioFormat:
    """Accept a GA format object ({"type": "audio/pcm", "rate": 24000}), a GA type or a beta name.

    Raises ValueError with a client-presentable message for anything unsupported.
    """
    rate = None
    if isinstance(value, Mapping):
        name = value.get("type")
        rate = value.get("rate")
    else:
        name = value
    if not isinstance(name, str):
        raise ValueError(f"audio format must be a string or an object with 'type', got {value!r}")
    fmt = _ALIASES.get(name, name)
    if fmt not in FORMAT_RATES:
        supported = ", ".join([*AUDIO_FORMATS, *_ALIASES])
        raise ValueError(f"unsupported audio format {name!r}; supported: {supported}")
    fmt = cast(AudioFormat, fmt)
    if rate is not None and int(rate) != FORMAT_RATES[fmt]:
        raise ValueError(f"{fmt} is only supported at {FORMAT_RATES[fmt]} Hz, got rate={rate}")
    return fmt


def format_rate(fmt: AudioFormat) -> int:
    """Sample rate of a wire format: audio/pcm 24000, audio/pcmu and audio/pcma 8000."""
    return FORMAT_RATES[fmt]


def bytes_to_ms(n_bytes: int, fmt: AudioFormat) -> float:
    """Duration in milliseconds of `n_bytes` of audio in `fmt`."""
    return 1000.0 * n_bytes / (BYTES_PER_SAMPLE[fmt] * FORMAT_RATES[fmt])


def ms_to_bytes(ms: float, fmt: AudioFormat) -> int:
    """Whole-sample number of bytes covering `ms` milliseconds of `fmt`."""
    return int(round(ms * FORMAT_RATES[fmt] / 1000.0)) * BYTES_PER_SAMPLE[fmt]


def decode_bytes(raw: bytes | bytearray | memoryview, fmt: AudioFormat) -> np.ndarray:
    """Wire bytes -> float32 at the format's own rate (no resampling)."""
    if fmt == "audio/pcm":
        return pcm16_to_float(raw)
    if fmt == "audio/pcmu":
        return g711.ulaw_decode(raw)
    if fmt == "audio/pcma":
        return g711.alaw_decode(raw)
    raise ValueError(f"unsupported audio format {fmt!r}")


def encode_float(x: np.ndarray, fmt: AudioFormat) -> bytes:
    """float32 at the format's own rate -> wire bytes (clipped)."""
    if fmt == "audio/pcm":
        return float_to_pcm16(x)
    if fmt == "audio/pcmu":
        return g711.ulaw_encode(x)
    if fmt == "audio/pcma":
        return g711.alaw_encode(x)
    raise ValueError(f"unsupported audio format {fmt!r}")


class InputDecoder:
    """Client bytes in `fmt` -> float32 at `target_rate` (16 kHz for VAD/ASR), one per session.

    Uses soxr's "QQ" (cubic) stream by default: the HQ filters hold back 20–115 ms of a chunked stream,
    which would delay end-of-turn detection by as much; for VAD and Whisper the cubic is transparent.
    """

    def __init__(self, fmt: AudioFormat, target_rate: int = 16000, quality: Quality = "QQ") -> None:
        self.fmt: AudioFormat = parse_audio_format(fmt)
        self.source_rate = FORMAT_RATES[self.fmt]
        self.target_rate = int(target_rate)
        self._resampler = StreamResampler(self.source_rate, self.target_rate, quality=quality)
        self.bytes_in = 0

    def decode(self, raw: bytes | bytearray | memoryview) -> np.ndarray:
        """Decode one chunk; raises ValueError on an odd byte count for audio/pcm (nothing is consumed)."""
        x = decode_bytes(raw, self.fmt)
        self.bytes_in += len(raw)
        return self._resampler.process(x)

    def flush(self) -> np.ndarray:
        """Drain the resampler tail (end of input stream); the decoder can then be reused."""
        return self._resampler.flush()

    def reset(self) -> None:
        """Drop buffered samples (input_audio_buffer.clear)."""
        self._resampler.reset()


class OutputEncoder:
    """float32 at `source_rate` (TTS/vocoder output) -> client bytes in `fmt`, one per response stream.

    HQ resampling: its lag only holds back the tail of each pushed chunk until the next push or
    `flush()`, which the end of a response always calls.
    """

    def __init__(self, fmt: AudioFormat, source_rate: int, quality: Quality = "HQ") -> None:
        self.fmt: AudioFormat = parse_audio_format(fmt)
        self.source_rate = int(source_rate)
        self.target_rate = FORMAT_RATES[self.fmt]
        self._resampler = StreamResampler(self.source_rate, self.target_rate, quality=quality)

    def encode(self, x: np.ndarray) -> bytes:
        """Encode one chunk; may return fewer samples than given (the resampler holds a short tail)."""
        return encode_float(self._resampler.process(x), self.fmt)

    def flush(self) -> bytes:
        """Emit the held tail at the end of a response; the encoder can then be reused."""
        return encode_float(self._resampler.flush(), self.fmt)

    def reset(self) -> None:
        """Drop the held tail without emitting it (barge-in)."""
        self._resampler.reset()
