"""Vocoder stages: turn the talker's stream into 24 kHz PCM16 audio chunks for the client.

* ``PcmVocoderScheduler`` (CPU preset): the talker already produced waveforms; resample them with one
  stateful resampler per response (no seams between clauses) to 24 kHz PCM16.
* ``SnacVocoderScheduler`` (GPU preset): decode SNAC codes with a sliding window as they arrive.

Both stream ``PcmChunk`` (PCM16 LE mono at the pipeline output rate); the session layer converts to the
client's format (G.711 for telephony) because one response is encoded once per surface.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni_rt.audio.pcm import StreamResampler, float_to_pcm16
from omni_rt.audio import PIPELINE_OUTPUT_RATE
from omni_rt.core.streaming_scheduler import StreamingSimpleScheduler, StreamState
from omni_rt.backends.snac_codec import OrpheusFrameAssembler
from omni_rt.stages.contracts import Clause, CodecFrames, PcmChunk, TokenDelta

OUTPUT_RATE = PIPELINE_OUTPUT_RATE


class PcmVocoderScheduler(StreamingSimpleScheduler):
    def __init__(self, chunk_ms: int = 200) -> None:
        super().__init__(name="vocoder")
        self.chunk_samples = int(OUTPUT_RATE * chunk_ms / 1000)

    def _emit_audio(self, request_id: str, state: StreamState, audio: np.ndarray) -> None:
        # split long clauses so the first bytes leave early and barge-in can stop between chunks
        for start in range(0, len(audio), self.chunk_samples):
            piece = audio[start : start + self.chunk_samples]
            state.user["samples"] = state.user.get("samples", 0) + len(piece)
            self.emit(request_id, "stream", PcmChunk(float_to_pcm16(piece), len(piece)))

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        clause: Clause = data
        rs = state.user.get("resampler")
        if rs is None:
            rs = state.user["resampler"] = StreamResampler(clause.sample_rate, OUTPUT_RATE)
        self._emit_audio(request_id, state, rs.process(np.asarray(clause.audio, dtype=np.float32)))

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        rs = state.user.pop("resampler", None)
        if rs is not None:
            tail = rs.process(np.zeros(0, dtype=np.float32), last=True)
            if len(tail):
                self._emit_audio(request_id, state, tail)

    def on_complete(self, request_id: str, state: StreamState) -> None:
        payload = state.payload if isinstance(state.payload, dict) else {"text": str(state.payload)}
        self.emit(request_id, "result", {**payload, "output_samples": state.user.get("samples", 0)})


def create_pcm_vocoder(chunk_ms: int = 200) -> PcmVocoderScheduler:
    return PcmVocoderScheduler(chunk_ms=chunk_ms)


class SnacVocoderScheduler(StreamingSimpleScheduler):
    """Streams SNAC codes to 24 kHz PCM16 with a sliding-window decoder. Input: ``CodecFrames``, or the codec
    LM's raw Orpheus tokens (``TokenDelta``), regrouped into frames per response here."""

    def __init__(self, model: Any, device: str = "cpu", window_frames: int | None = None) -> None:
        super().__init__(name="vocoder")
        self.model = model
        self.device = device
        self.window_frames = window_frames

    def _decoder(self, state: StreamState) -> Any:
        from omni_rt.backends.snac_codec import SnacStreamingDecoder

        dec = state.user.get("decoder")
        if dec is None:
            kwargs = {} if self.window_frames is None else {"window_frames": self.window_frames}
            dec = state.user["decoder"] = SnacStreamingDecoder(self.model, device=self.device, **kwargs)
        return dec

    def _emit_audio(self, request_id: str, state: StreamState, audio: np.ndarray) -> None:
        if len(audio):
            state.user["samples"] = state.user.get("samples", 0) + len(audio)
            self.emit(request_id, "stream", PcmChunk(float_to_pcm16(audio), len(audio)))

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        if isinstance(data, TokenDelta):
            frames = state.user.setdefault("assembler", OrpheusFrameAssembler()).push(data.token_ids, data.segment)
        elif isinstance(data, CodecFrames):
            frames = np.asarray(data.frames)
        else:
            raise TypeError(f"the SNAC vocoder takes CodecFrames or TokenDelta, got {type(data).__name__}")
        self._push_frames(request_id, state, frames)

    def _push_frames(self, request_id: str, state: StreamState, frames: np.ndarray) -> None:
        if len(frames):
            state.user["frames"] = state.user.get("frames", 0) + len(frames)
            self._emit_audio(request_id, state, self._decoder(state).push_many(list(frames)))

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        self._emit_audio(request_id, state, self._decoder(state).flush())

    def on_complete(self, request_id: str, state: StreamState) -> None:
        payload = state.payload if isinstance(state.payload, dict) else {"text": str(state.payload)}
        self.emit(request_id, "result", {**payload, "output_samples": state.user.get("samples", 0),
                                         "frames": state.user.get("frames", 0)})


def create_snac_vocoder(model: str | None = None, device: str = "cpu", random_init: bool = False) -> SnacVocoderScheduler:
    """``model``: a local SNAC 24 kHz directory (config.json + pytorch_model.bin); ``random_init`` for shape tests."""
    from omni_rt.backends.snac_codec import build_random_snac, load_snac

    if random_init:
        snac = build_random_snac().to(device)
    elif model is None:
        raise ValueError("stage 'vocoder' field 'model': give a local SNAC 24 kHz directory or random_init: true")
    else:
        snac = load_snac(model, device=device)
    return SnacVocoderScheduler(snac, device=device)
