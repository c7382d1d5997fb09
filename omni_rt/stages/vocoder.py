"""Vocoder stages: turn the talker's stream into 24 kHz PCM16 audio chunks for the client.

* ``PcmVocoder`` (CPU preset): the talker already produced waveforms; resample them with one
  stateful resampler per response (no seams between clauses) to 24 kHz PCM16.
* ``SnacVocoder`` (GPU preset): decode SNAC codes with a sliding window as they arrive, all
  streams that have new frames in one batched decode per step.

Both stream ``PcmChunk`` (PCM16 LE mono at the pipeline output rate); the session layer converts to the
client's format (G.711 for telephony) because one response is encoded once per surface.
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np

from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.audio.pcm import StreamResampler, float_to_pcm16
from omni_rt.audio import PIPELINE_OUTPUT_RATE
from omni_rt.pipeline.schedulers.streaming import StreamingSimpleScheduler, StreamState
from omni_rt.backends.snac_codec import OrpheusFrameAssembler
from omni_rt.contracts.payloads import Clause, CodecFrames, PcmChunk, TokenDelta

OUTPUT_RATE = PIPELINE_OUTPUT_RATE


class PcmVocoder(StreamingSimpleScheduler):
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


def create_pcm_vocoder(chunk_ms: int = 200) -> PcmVocoder:
    return PcmVocoder(chunk_ms=chunk_ms)


class SnacVocoder(StreamingSimpleScheduler):
    """Streams SNAC codes to 24 kHz PCM16 with sliding-window decoders, batched. Input: ``CodecFrames``, or
    the codec LM's raw Orpheus tokens (``TokenDelta``), regrouped into frames per response here.

    Why batched: decoding each stream's new frame alone (batch 1, one host sync each) was estimated at
    ~375 decodes/s at 32 streams on a GPU (issue #15), at the 32 x 11.7 frames/s the streams need. Each
    step drains the inbox (frames only join their stream's decoder), then decodes the windows of every
    stream with new frames as one batch (`decode_windows`: one forward, one device-to-host copy) and emits
    each stream's audio. Idle-immediate: the loop blocks only when no stream has work, and never waits to
    fill a batch, so a lone stream decodes the moment its frames arrive. A request's ``result`` leaves after
    its last audio (completion waits for the step that flushes the stream). Output equals each stream decoded
    alone (window invariance).
    """

    def __init__(
        self,
        model: Any,
        window_frames: int | None = None,
        max_batch_streams: int = 64,
        max_step_frames: int = 8,
    ) -> None:
        super().__init__(name="vocoder")
        if max_batch_streams < 1 or max_step_frames < 1:
            raise ValueError(f"max_batch_streams and max_step_frames must be >= 1; got {max_batch_streams}, {max_step_frames}")
        self.model = model  # decoding runs where its weights are
        self.window_frames = window_frames
        # streams beyond this wait for the next step (oldest first): bounds one step's activation memory
        self.max_batch_streams = max_batch_streams
        # a stream's backlog is decoded this many frames per step: a burst from one stream does not pad every
        # other window of the batch to its length, and its audio still starts after one step
        self.max_step_frames = max_step_frames
        self._ready: dict[str, StreamState] = {}  # streams with frames to decode or a tail to flush, oldest first
        self._completing: dict[str, StreamState] = {}  # complete, waiting for the step that emits their tail
        self.counters = {"steps": 0, "forwards": 0, "windows": 0, "samples": 0, "max_batch": 0}

    def stats(self) -> dict[str, float]:
        return dict(self.counters)

    def live_state(self) -> int:
        return len(self.states) + len(self._completing)

    def _decoder(self, state: StreamState) -> Any:
        from omni_rt.backends.snac_codec import SnacStreamingDecoder

        dec = state.user.get("decoder")
        if dec is None:
            kwargs = {} if self.window_frames is None else {"window_frames": self.window_frames}
            dec = state.user["decoder"] = SnacStreamingDecoder(self.model, **kwargs)
        return dec

    def _emit_audio(self, request_id: str, state: StreamState, audio: np.ndarray) -> None:
        if len(audio):
            state.user["samples"] = state.user.get("samples", 0) + len(audio)
            self.emit(request_id, "stream", PcmChunk(float_to_pcm16(audio), len(audio)))

    # ---- inputs ------------------------------------------------------------------------------------
    def _push_frames(self, request_id: str, state: StreamState, frames: np.ndarray) -> None:
        """The one entry point for a request's arriving frames ([n, 7] SNAC codes): queued for the next step."""
        frames = np.atleast_2d(np.asarray(frames, dtype=np.int64))
        if not frames.size:
            return
        state.user["frames"] = state.user.get("frames", 0) + len(frames)
        self._decoder(state).add(frames)  # add checks [n, 7]
        self._ready.setdefault(request_id, state)

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        if isinstance(data, TokenDelta):
            frames = state.user.setdefault("assembler", OrpheusFrameAssembler()).push(data.token_ids, data.segment)
        elif isinstance(data, CodecFrames):
            frames = np.asarray(data.frames)
        else:
            raise TypeError(f"the SNAC vocoder takes CodecFrames or TokenDelta, got {type(data).__name__}")
        self._push_frames(request_id, state, frames)

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        state.user["ending"] = True
        self._ready.setdefault(request_id, state)

    def on_complete(self, request_id: str, state: StreamState) -> None:
        if request_id in self._ready:  # its tail is still to decode: the result follows that audio
            self._completing[request_id] = state
            return
        payload = state.payload if isinstance(state.payload, dict) else {"text": str(state.payload)}
        self.emit(request_id, "result", {**payload, "output_samples": state.user.get("samples", 0),
                                         "frames": state.user.get("frames", 0)})

    def on_abort(self, request_id: str, state: StreamState) -> None:
        self._ready.pop(request_id, None)
        self._completing.pop(request_id, None)

    def _handle(self, msg: IncomingMessage) -> None:
        if msg.type == "abort" and msg.request_id in self._completing:  # no longer in `states`: drop it here
            self.on_abort(msg.request_id, self._completing[msg.request_id])
        super()._handle(msg)

    # ---- the loop ----------------------------------------------------------------------------------
    def run_loop(self) -> None:
        while self.running:
            if not self._ready:
                self._handle_safely(self.inbox.get())  # idle: block for the next message
            while True:  # drain what has arrived; never wait for more
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._handle_safely(msg)
            if self.running:
                self._step()

    def _step(self) -> None:
        """One batched decode for up to ``max_batch_streams`` streams with work, then their audio."""
        from omni_rt.backends.snac_codec import decode_windows

        if not self._ready:
            return
        taken = list(self._ready.items())[: self.max_batch_streams]
        planned = []
        for rid, state in taken:
            ending = bool(state.user.get("ending"))
            window = self._decoder(state).plan(final=ending, max_new_frames=self.max_step_frames)
            if window is not None:
                planned.append((rid, state, window))
        try:
            audios, forwards = decode_windows(self.model, [w for _, _, w in planned])
        except Exception as exc:  # noqa: BLE001 - a failed batch fails the requests in it, not the stage
            for rid, _, _ in planned:
                self._ready.pop(rid, None)
                self._completing.pop(rid, None)
                self._fail(rid, exc)
            return
        c = self.counters
        c["steps"] += 1
        c["forwards"] += forwards
        c["windows"] += len(planned)
        c["max_batch"] = max(c["max_batch"], len(planned))
        for (rid, state, window), audio in zip(planned, audios, strict=True):
            c["samples"] += len(audio)
            self._decoder(state).commit(window, audio)
            self._emit_audio(rid, state, audio)
        for rid, state in taken:
            del self._ready[rid]
            if self._decoder(state).backlog:
                self._ready[rid] = state  # more frames: back of the line
            elif state.user.get("ending"):  # the tail is out (the decoder reset itself)
                state.user["ending"] = False
                done = self._completing.pop(rid, None)
                if done is not None:
                    self.on_complete(rid, done)


def create_snac_vocoder(
    model: str | None = None,
    device: str = "cpu",
    random_init: bool = False,
    dtype: str | None = None,
    max_batch_streams: int = 64,
    max_step_frames: int = 8,
) -> SnacVocoder:
    """``model``: a local SNAC 24 kHz directory (config.json + pytorch_model.bin); ``random_init`` for shape tests.

    ``dtype``: float16 by default on CUDA (half the bytes and tensor-core convolutions; fp16 keeps 3 more
    mantissa bits than bf16 for audio that ends as 16-bit PCM), float32 on CPU (no fast half convolutions).
    """
    import torch

    from omni_rt.backends.snac_codec import build_random_snac, load_snac

    name = dtype or ("float16" if str(device).startswith("cuda") else "float32")
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}.get(name)
    if torch_dtype is None:
        raise ValueError(f"stage 'vocoder' field 'dtype': float16, bfloat16 or float32; got {name!r}")
    if random_init:
        snac = build_random_snac().to(device)
    elif model is None:
        raise ValueError("stage 'vocoder' field 'model': give a local SNAC 24 kHz directory or random_init: true")
    else:
        snac = load_snac(model, device=device)
    return SnacVocoder(snac.to(torch_dtype), max_batch_streams=max_batch_streams,
                                max_step_frames=max_step_frames)
