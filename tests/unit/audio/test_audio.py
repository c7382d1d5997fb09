"""Audio utilities: PCM16, resampling (one-shot and streaming), G.711, wire formats."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from omni_rt.audio import g711
from omni_rt.audio.formats import (
    InputDecoder,
    OutputEncoder,
    bytes_to_ms,
    format_rate,
    ms_to_bytes,
    parse_audio_format,
)
from omni_rt.audio.pcm import StreamResampler, float_to_pcm16, pcm16_to_float, resample


def tone(freq: float, sr: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(x: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * sr / len(x))


# ---------------------------------------------------------------- PCM16


def test_pcm16_roundtrip_is_exact() -> None:
    ints = np.random.default_rng(0).integers(-32768, 32768, 4096).astype(np.int16)
    raw = ints.astype("<i2").tobytes()
    x = pcm16_to_float(raw)
    assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() < 1.0
    assert float_to_pcm16(x) == raw


def test_pcm16_odd_length_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="even number of bytes"):
        pcm16_to_float(b"\x00\x01\x02")


def test_float_to_pcm16_clips_instead_of_wrapping() -> None:
    out = np.frombuffer(float_to_pcm16(np.array([2.0, -2.0, 1.0, -1.0, 0.0])), "<i2")
    assert out.tolist() == [32767, -32768, 32767, -32768, 0]


# ---------------------------------------------------------------- resampling


@pytest.mark.parametrize(("sr_in", "sr_out"), [(24000, 16000), (8000, 16000), (22050, 24000), (24000, 8000)])
def test_resample_keeps_length_and_frequency(sr_in: int, sr_out: int) -> None:
    x = tone(1000.0, sr_in, 1.0)
    y = resample(x, sr_in, sr_out)
    assert y.dtype == np.float32
    assert len(y) == sr_out
    assert abs(peak_hz(y, sr_out) - 1000.0) <= 2.0
    assert 0.45 < np.abs(y[sr_out // 10 : -sr_out // 10]).max() < 0.55


@pytest.mark.parametrize("quality", ["HQ", "QQ"])
@pytest.mark.parametrize(("sr_in", "sr_out", "chunk"), [(24000, 16000, 480), (8000, 16000, 160), (22050, 8000, 1000)])
def test_stream_resampler_matches_one_shot(sr_in: int, sr_out: int, chunk: int, quality: str) -> None:
    x = np.random.default_rng(1).standard_normal(sr_in).astype(np.float32) * 0.1
    rs = StreamResampler(sr_in, sr_out, quality=quality)  # type: ignore[arg-type]
    parts = [rs.process(x[i : i + chunk]) for i in range(0, len(x), chunk)] + [rs.flush()]
    y = np.concatenate(parts)
    ref = resample(x, sr_in, sr_out, quality=quality)  # type: ignore[arg-type]
    assert len(y) == len(ref)
    np.testing.assert_allclose(y, ref, atol=1e-5)
    # after a flush the same object serves a fresh stream
    again = np.concatenate([rs.process(x[:chunk * 10]), rs.flush()])
    np.testing.assert_allclose(again, resample(x[:chunk * 10], sr_in, sr_out, quality=quality), atol=1e-5)  # type: ignore[arg-type]


def test_stream_resampler_passthrough() -> None:
    rs = StreamResampler(24000, 24000)
    x = tone(440, 24000, 0.01)
    np.testing.assert_array_equal(rs.process(x), x)
    assert rs.flush().size == 0


# ---------------------------------------------------------------- G.711

# ITU-T G.711 table points (codeword -> linear, 16-bit scale). μ-law: bits inverted, then
# value = ((2q + 33) << segment) - 33 on the 14-bit scale (x4); A-law: even bits inverted, 13-bit scale (x8).
ULAW_POINTS = {0xFF: 0, 0x7F: 0, 0x80: 32124, 0x00: -32124, 0xFE: 8, 0x7E: -8, 0xEF: 132, 0xF0: 120, 0x8F: 16764}
ALAW_POINTS = {0xD5: 8, 0x55: -8, 0xAA: 32256, 0x2A: -32256, 0xD4: 24, 0xC5: 264, 0xF5: 528}


def test_g711_decode_reference_points() -> None:
    for code, lin in ULAW_POINTS.items():
        assert int(g711.ulaw_decode_int16(bytes([code]))[0]) == lin, hex(code)
    for code, lin in ALAW_POINTS.items():
        assert int(g711.alaw_decode_int16(bytes([code]))[0]) == lin, hex(code)


def test_g711_encode_reference_points() -> None:
    pcm = np.array([0, 32767, -32768, 8, -8, 7932], dtype=np.int16)
    assert g711.ulaw_encode(pcm) == bytes([0xFF, 0x80, 0x00, 0xFE, 0x7E, 0xA0])
    pcm = np.array([0, -1, 32767, -32768, 8, 264], dtype=np.int16)
    assert g711.alaw_encode(pcm) == bytes([0xD5, 0x55, 0xAA, 0x2A, 0xD5, 0xC5])


def test_g711_codewords_roundtrip() -> None:
    codes = bytes(range(256))
    assert g711.alaw_encode(g711.alaw_decode_int16(codes)) == codes
    ulaw = g711.ulaw_encode(g711.ulaw_decode_int16(codes))
    assert ulaw == bytes(0xFF if c == 0x7F else c for c in codes)  # both zeros encode to +0


def test_g711_float_input_and_output() -> None:
    x = tone(440, 8000, 0.1, amp=0.5)
    for enc, dec in ((g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)):
        y = dec(enc(x))
        assert y.dtype == np.float32 and len(y) == len(x)
        assert np.abs(y - x).max() <= 2**-6 + 1e-6  # at most half the top segment's step (1024 / 32768 / 2)
    with pytest.raises(TypeError):
        g711.ulaw_encode(np.array([1, 2, 3], dtype=np.int32))


def test_g711_matches_stdlib_audioop_exhaustively() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16)
    raw = pcm.astype("<i2").tobytes()
    codes = bytes(range(256))
    assert g711.ulaw_encode(pcm) == audioop.lin2ulaw(raw, 2)
    assert g711.alaw_encode(pcm) == audioop.lin2alaw(raw, 2)
    assert g711.ulaw_decode_int16(codes).astype("<i2").tobytes() == audioop.ulaw2lin(codes, 2)
    assert g711.alaw_decode_int16(codes).astype("<i2").tobytes() == audioop.alaw2lin(codes, 2)


# ---------------------------------------------------------------- wire formats


def test_format_parsing_and_sizes() -> None:
    assert parse_audio_format("audio/pcm") == "audio/pcm"
    assert parse_audio_format({"type": "audio/pcmu"}) == "audio/pcmu"
    assert parse_audio_format({"type": "audio/pcm", "rate": 24000}) == "audio/pcm"
    assert parse_audio_format("g711_alaw") == "audio/pcma"
    assert parse_audio_format("pcm16") == "audio/pcm"
    with pytest.raises(ValueError, match="unsupported audio format"):
        parse_audio_format("audio/opus")
    with pytest.raises(ValueError, match="24000"):
        parse_audio_format({"type": "audio/pcm", "rate": 16000})
    assert (format_rate("audio/pcm"), format_rate("audio/pcmu"), format_rate("audio/pcma")) == (24000, 8000, 8000)
    assert bytes_to_ms(4800, "audio/pcm") == 100.0
    assert bytes_to_ms(160, "audio/pcmu") == 20.0
    assert ms_to_bytes(20, "audio/pcma") == 160 and ms_to_bytes(100, "audio/pcm") == 4800


def test_input_decoder_pcm_streams_to_16k() -> None:
    x = tone(1000, 24000, 1.0)
    raw = float_to_pcm16(x)
    dec = InputDecoder("audio/pcm", target_rate=16000)
    parts = [dec.decode(raw[i : i + 1920]) for i in range(0, len(raw), 1920)] + [dec.flush()]
    y = np.concatenate(parts)
    assert y.dtype == np.float32 and len(y) == 16000
    assert abs(peak_hz(y, 16000) - 1000.0) <= 2.0
    with pytest.raises(ValueError, match="even number of bytes"):
        dec.decode(b"\x00\x00\x00")


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
def test_input_decoder_g711_to_16k(fmt: str) -> None:
    x = tone(440, 8000, 1.0)
    raw = g711.ulaw_encode(x) if fmt == "audio/pcmu" else g711.alaw_encode(x)
    dec = InputDecoder(fmt, target_rate=16000)  # type: ignore[arg-type]
    y = np.concatenate([dec.decode(raw[i : i + 160]) for i in range(0, len(raw), 160)] + [dec.flush()])
    assert len(y) == 16000
    assert abs(peak_hz(y, 16000) - 440.0) <= 2.0


@pytest.mark.parametrize("fmt", ["audio/pcm", "audio/pcmu", "audio/pcma"])
def test_output_encoder_roundtrip(fmt: str) -> None:
    x = tone(300, 22050, 1.0)  # Piper's rate
    enc = OutputEncoder(fmt, source_rate=22050)  # type: ignore[arg-type]
    out = b"".join(enc.encode(x[i : i + 2205]) for i in range(0, len(x), 2205)) + enc.flush()
    rate = format_rate(fmt)  # type: ignore[arg-type]
    assert abs(bytes_to_ms(len(out), fmt) - 1000.0) < 1.0  # type: ignore[arg-type]
    if fmt == "audio/pcm":
        y = pcm16_to_float(out)
    else:
        y = (g711.ulaw_decode if fmt == "audio/pcmu" else g711.alaw_decode)(out)
    assert abs(peak_hz(y, rate) - 300.0) <= 2.0
    ref = resample(x, 22050, rate)
    assert np.abs(y - ref).max() < 0.02


def test_output_encoder_same_rate_is_plain_pcm16() -> None:
    x = tone(300, 24000, 0.05)
    enc = OutputEncoder("audio/pcm", source_rate=24000)
    assert enc.encode(x) == float_to_pcm16(x)
    assert enc.flush() == b""
