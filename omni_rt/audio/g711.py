"""ITU-T G.711 μ-law and A-law codecs, vectorized with numpy lookup tables.

Hand-written on purpose: stdlib `audioop` is deprecated (gone in Python 3.13), its replacement
`audioop-lts` only ships for Python >= 3.13, and the PyPI `g711` package is an unmaintained (2021),
sdist-only C extension. G.711 is a fixed, tiny table mapping, so we build the tables once from the
reference algorithm (the Sun/CCITT g711.c that audioop also uses) and encoding/decoding become a
single numpy indexing operation. Outputs are bit-identical to audioop (checked in tests/unit/audio/test_audio.py).
"""

from __future__ import annotations

import numpy as np

from .pcm import float_to_int16

_SEG_UEND = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_SEG_AEND = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def _build_ulaw_encode() -> np.ndarray:
    """Table indexed by int16 viewed as uint16 -> μ-law byte (14-bit magnitude, bias 33, clip 8159)."""
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), 8159) + 33
    seg = np.searchsorted(_SEG_UEND, mag, side="left")  # first segment whose end >= mag
    uval = (seg << 4) | ((mag >> (seg + 1)) & 0xF)
    uval = np.where(seg >= 8, 0x7F, uval)
    return (uval ^ mask).astype(np.uint8)


def _build_ulaw_decode() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _build_alaw_encode() -> np.ndarray:
    """Table indexed by int16 viewed as uint16 -> A-law byte (13-bit magnitude, even bits inverted)."""
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32) >> 3
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_SEG_AEND, mag, side="left")
    shift = np.where(seg < 2, 1, seg)
    aval = (seg << 4) | ((mag >> np.minimum(shift, 15)) & 0xF)
    aval = np.where(seg >= 8, 0x7F, aval)
    return (aval ^ mask).astype(np.uint8)


def _build_alaw_decode() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = ((a & 0x0F) << 4) + np.where(seg == 0, 8, 0x108)
    t = t << np.maximum(seg - 1, 0)
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_ENC = _build_ulaw_encode()
_ULAW_DEC = _build_ulaw_decode()
_ALAW_ENC = _build_alaw_encode()
_ALAW_DEC = _build_alaw_decode()


def _as_int16(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.int16:
        return x
    if np.issubdtype(x.dtype, np.floating):
        return float_to_int16(x)
    raise TypeError(f"G.711 encode expects int16 or float samples, got dtype {x.dtype}")


def _as_bytes_array(b: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    if isinstance(b, np.ndarray):
        return b.astype(np.uint8, copy=False).reshape(-1)
    return np.frombuffer(b, dtype=np.uint8)


def ulaw_encode(x: np.ndarray) -> bytes:
    """int16 samples, or float samples in [-1, 1], -> μ-law bytes (one byte per sample)."""
    return _ULAW_ENC[_as_int16(x).reshape(-1).view(np.uint16)].tobytes()


def ulaw_decode_int16(b: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """μ-law bytes -> int16 samples (16-bit scale, ±32124 full range)."""
    return _ULAW_DEC[_as_bytes_array(b)]


def ulaw_decode(b: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """μ-law bytes -> float32 in [-1, 1)."""
    return ulaw_decode_int16(b).astype(np.float32) / np.float32(32768.0)


def alaw_encode(x: np.ndarray) -> bytes:
    """int16 samples, or float samples in [-1, 1], -> A-law bytes (one byte per sample)."""
    return _ALAW_ENC[_as_int16(x).reshape(-1).view(np.uint16)].tobytes()


def alaw_decode_int16(b: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """A-law bytes -> int16 samples (16-bit scale, ±32256 full range)."""
    return _ALAW_DEC[_as_bytes_array(b)]


def alaw_decode(b: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """A-law bytes -> float32 in [-1, 1)."""
    return alaw_decode_int16(b).astype(np.float32) / np.float32(32768.0)
