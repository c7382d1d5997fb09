"""Helpers for end-to-end tests: turn speech into Realtime append events and validate server events."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from omni_rt.audio.g711 import ulaw_encode
from omni_rt.audio.pcm import float_to_pcm16, resample

_SERVER_EVENT = None


def server_event_adapter() -> TypeAdapter:
    global _SERVER_EVENT
    if _SERVER_EVENT is None:
        from openai.types.realtime import RealtimeServerEvent

        _SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
    return _SERVER_EVENT


def validate_event(event: dict[str, Any]) -> None:
    """Raise if the event does not match openai-python's GA RealtimeServerEvent models."""
    server_event_adapter().validate_python(event)


def speech_with_silence(audio: np.ndarray, sr: int, lead_s: float = 0.3, tail_s: float = 1.2) -> np.ndarray:
    out = resample(audio.astype(np.float32), sr, 24000)
    return np.concatenate([np.zeros(int(24000 * lead_s), np.float32), out, np.zeros(int(24000 * tail_s), np.float32)])


def pcm_chunks_b64(audio_24k: np.ndarray, chunk_ms: int = 40) -> list[str]:
    step = 24 * chunk_ms
    return [base64.b64encode(float_to_pcm16(audio_24k[i : i + step])).decode() for i in range(0, len(audio_24k), step)]


def ulaw_frames_b64(audio: np.ndarray, sr: int, frame_ms: int = 20) -> list[str]:
    x = resample(audio.astype(np.float32), sr, 8000)
    step = 8 * frame_ms
    return [base64.b64encode(ulaw_encode(x[i : i + step])).decode() for i in range(0, len(x), step)]


def dumps(event: dict[str, Any]) -> str:
    return json.dumps(event)


# Whisper tiny.en sometimes hears Piper's "France" as "friends" through the streamed 24 kHz -> 16 kHz path (Piper
# samples its voice with noise, so the audio differs run to run). These tests are about turns, not the ear.
HEARD_AS = {"france": ("france", "friends"), "sky": ("sky", "this guy")}


def heard(word: str, transcript: str) -> bool:
    return any(w in transcript.lower() for w in HEARD_AS.get(word, (word,)))


def spoken(text: str, rate: int = 24000) -> np.ndarray:
    """``text`` in the CPU preset's Piper voice at ``rate`` (deterministic: VITS noise off), float32 mono."""
    from omni_rt.audio.pcm import resample
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(noise_scale=0.0, noise_w_scale=0.0)
    return resample(tts.synthesize(text), tts.sample_rate, rate)
