"""ASR stage: VAD + streaming Whisper on a SessionScheduler, one state per session across turns.

Why decode during the silence: Whisper always encodes a 30 s window (~250 ms on 2 cores for tiny.en, whatever
the audio length), so waiting for ``speech_stopped`` before decoding puts that whole cost on the critical path.
Once the VAD has seen ``speculative_after_ms`` of trailing silence we transcribe the turn; if no speech
follows before ``silence_duration_ms`` ends the turn, that transcript *is* the final one and is ready the moment
the turn ends.

Session ops (``new_request`` data ``op``): ``open`` (params below), ``update`` (new params), ``commit``
(end the turn now: manual turn taking), ``clear`` (drop buffered audio). Appends are float32 16 kHz arrays.
Events out: ``speech_started``, ``speech_stopped``, ``committed``, ``cleared``, ``transcript.delta``,
``transcript.final``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni_rt.core.session_scheduler import Session, SessionLimitError, SessionScheduler

SAMPLE_RATE = 16000


class Transcriber(Protocol):
    def transcribe(self, audio: np.ndarray) -> str: ...


@dataclass
class TurnDetection:
    """OpenAI ``server_vad`` parameters; ``enabled=False`` means the client commits turns itself."""

    enabled: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "TurnDetection":
        td = params.get("turn_detection", {"type": "server_vad"})
        if not td:
            return cls(enabled=False)
        return cls(
            enabled=td.get("type", "server_vad") in ("server_vad", "semantic_vad"),
            threshold=float(td.get("threshold", 0.5) or 0.5),
            prefix_padding_ms=int(td.get("prefix_padding_ms", 300) or 0),
            silence_duration_ms=int(td.get("silence_duration_ms", 500) or 500),
        )


@dataclass
class AsrState:
    td: TurnDetection
    vad: Any
    chunks: list[np.ndarray] = field(default_factory=list)  # audio of the current turn (or uncommitted buffer)
    samples: int = 0
    stream_samples: int = 0  # all samples ever appended (for audio_*_ms offsets)
    turn_start_sample: int = 0
    last_partial_samples: int = 0
    speculative: tuple[int, str] | None = None  # (turn samples when decoded, text)
    partials: bool = True
    turn: int = 0
    stopped_at: float = 0.0


class AsrSessionScheduler(SessionScheduler):
    def __init__(
        self,
        transcriber: Transcriber,
        vad_model: Any,
        speculative_after_ms: int = 200,
        partial_interval_ms: int = 1200,
        max_turn_s: float = 30.0,
        **limits: Any,
    ) -> None:
        super().__init__(name="asr", **limits)
        self.transcriber = transcriber
        self.vad_model = vad_model
        self.speculative_after_ms = speculative_after_ms
        self.partial_interval_samples = int(partial_interval_ms * SAMPLE_RATE / 1000)
        self.max_turn_samples = int(max_turn_s * SAMPLE_RATE)
        self.stats = {"turns": 0, "speculative_hits": 0, "speculative_misses": 0}

    # ---- helpers ---------------------------------------------------------------------------------
    def _new_vad(self, td: TurnDetection) -> Any:
        from omni_rt.backends.vad import StreamingVAD

        return StreamingVAD(
            self.vad_model,
            threshold=td.threshold,
            prefix_padding_ms=td.prefix_padding_ms,
            silence_duration_ms=td.silence_duration_ms,
            sample_rate=SAMPLE_RATE,
        )

    def _state(self, s: Session) -> AsrState:
        return s.state["asr"]

    def _turn_audio(self, st: AsrState) -> np.ndarray:
        if not st.chunks:
            return np.zeros(0, dtype=np.float32)
        if len(st.chunks) > 1:
            st.chunks = [np.concatenate(st.chunks)]
        return st.chunks[0]

    def _reset_turn(self, s: Session, st: AsrState, keep_ms: int = 0) -> None:
        audio = self._turn_audio(st)
        keep = int(keep_ms * SAMPLE_RATE / 1000)
        st.chunks = [audio[-keep:]] if keep and audio.size else []
        st.samples = sum(c.size for c in st.chunks)
        st.turn_start_sample = st.stream_samples - st.samples
        st.last_partial_samples = 0
        st.speculative = None
        s.buffered_bytes = st.samples * 2

    def _ms(self, samples: int) -> int:
        return int(samples * 1000 / SAMPLE_RATE)

    # ---- session hooks ---------------------------------------------------------------------------
    def on_open(self, session: Session) -> None:
        td = TurnDetection.from_params(session.params)
        session.state["asr"] = AsrState(td=td, vad=self._new_vad(td), partials=bool(session.params.get("partials", True)))

    def on_control(self, session: Session, op: str, data: dict[str, Any]) -> None:
        st = self._state(session)
        if op == "update":
            session.params.update(data.get("params") or {})
            td = TurnDetection.from_params(session.params)
            if td != st.td:
                st.td, st.vad = td, self._new_vad(td)
            st.partials = bool(session.params.get("partials", st.partials))
        elif op == "commit":
            if st.samples == 0:
                raise SessionLimitError(
                    "input_audio_buffer_commit_empty", "buffer is empty: append audio before committing"
                )
            if st.vad.in_speech:
                self.emit(session.session_id, "event", {"type": "speech_stopped", "audio_end_ms": self._ms(st.stream_samples)})
                st.vad.reset()
            self._finish_turn(session, st, trigger="commit")
        elif op == "clear":
            st.vad.reset()
            self._reset_turn(session, st)
            self.emit(session.session_id, "event", {"type": "cleared"})
        else:
            super().on_control(session, op, data)

    def buffered_bytes(self, session: Session, data: Any) -> int:
        return int(np.asarray(data).size) * 2  # counted as PCM16, the size a client sent

    def on_append(self, session: Session, data: Any) -> None:
        st = self._state(session)
        audio = np.asarray(data, dtype=np.float32)
        st.chunks.append(audio)
        st.samples += audio.size
        st.stream_samples += audio.size
        if not st.td.enabled:
            return
        events = st.vad.feed(audio)
        sid = session.session_id
        for ev in events:
            if ev.kind == "speech_started":
                # keep prefix padding before the speech start, drop older silence
                keep_ms = self._ms(st.stream_samples) - ev.audio_ms  # audio_ms already includes the prefix padding
                self._reset_turn(session, st, keep_ms=max(0, keep_ms))
                self.emit(sid, "event", {"type": "speech_started", "audio_start_ms": ev.audio_ms})
            elif ev.kind == "speech_stopped":
                self.emit(sid, "event", {"type": "speech_stopped", "audio_end_ms": ev.audio_ms})
                self._finish_turn(session, st, trigger="vad")
        if st.vad.in_speech:
            self._maybe_decode_early(session, st)
        else:
            # outside speech only the padding window is worth keeping
            pad = int((st.td.prefix_padding_ms + 100) * SAMPLE_RATE / 1000)
            if st.samples > 4 * pad:
                self._reset_turn(session, st, keep_ms=st.td.prefix_padding_ms + 100)
        if st.samples > self.max_turn_samples and st.vad.in_speech:
            self.emit(sid, "event", {"type": "speech_stopped", "audio_end_ms": self._ms(st.stream_samples), "forced": True})
            st.vad.reset()
            self._finish_turn(session, st, trigger="max_turn")

    def _maybe_decode_early(self, session: Session, st: AsrState) -> None:
        silence_ms = st.vad.silence_ms
        if silence_ms >= self.speculative_after_ms:
            if st.speculative is None:
                t0 = time.perf_counter()
                text = self.transcriber.transcribe(self._turn_audio(st)).strip()
                st.speculative = (st.samples, text)
                st.last_partial_samples = st.samples
                asr_ms = round((time.perf_counter() - t0) * 1000, 1)
                # lets the session start answering in the silence; the answer is held until the turn ends
                self.emit(session.session_id, "event", {"type": "transcript.speculative", "turn": st.turn + 1, "text": text,
                                                        "asr_ms": asr_ms})
            return
        if st.speculative is not None:  # speech resumed: that guess (and anything started from it) is stale
            st.speculative = None
            self.emit(session.session_id, "event", {"type": "speculative.cancelled", "turn": st.turn + 1})
        if st.partials and st.samples - st.last_partial_samples >= self.partial_interval_samples and self.inbox.empty():
            st.last_partial_samples = st.samples
            text = self.transcriber.transcribe(self._turn_audio(st))
            if text:
                self.emit(session.session_id, "event", {"type": "transcript.delta", "text": text, "partial": True})

    def _finish_turn(self, session: Session, st: AsrState, trigger: str) -> None:
        sid = session.session_id
        audio = self._turn_audio(st)
        st.turn += 1
        self.stats["turns"] += 1
        self.emit(sid, "event", {"type": "committed", "turn": st.turn, "trigger": trigger, "audio_ms": self._ms(audio.size)})
        t0 = time.perf_counter()
        spec = st.speculative
        if spec is not None and trigger == "vad":
            text, speculative = spec[1], True
            self.stats["speculative_hits"] += 1
        else:
            if trigger == "vad":
                self.stats["speculative_misses"] += 1
            text, speculative = self.transcriber.transcribe(audio), False
        self.emit(
            sid,
            "event",
            {
                "type": "transcript.final",
                "turn": st.turn,
                "text": text.strip(),
                "speculative": speculative,
                "asr_ms": round((time.perf_counter() - t0) * 1000, 1),
                "audio_ms": self._ms(audio.size),
            },
        )
        self._reset_turn(session, st)


def create_asr_stage(
    backend: str = "faster-whisper",
    model: str | None = None,
    device: str = "cpu",
    compute_type: str = "int8",
    cpu_threads: int = 2,
    speculative_after_ms: int = 200,
    partial_interval_ms: int = 1200,
    max_sessions: int = 64,
    max_buffered_bytes: int = 24000 * 2 * 120,
    idle_timeout_s: float = 600.0,
) -> AsrSessionScheduler:
    """Factory for the pipeline config: the preset names the backend and model."""
    from omni_rt.backends.vad import SileroVadModel

    if backend == "faster-whisper":
        from omni_rt.backends.asr import FasterWhisperASR

        transcriber: Transcriber = FasterWhisperASR(model_dir=model, compute_type=compute_type, cpu_threads=cpu_threads)
    elif backend == "transformers":
        import torch

        from omni_rt.backends.asr import TransformersWhisperASR

        if model is None:
            raise ValueError("stage 'asr' field 'model': the transformers backend needs a model path or hub id")
        transcriber = TransformersWhisperASR(model, device=device, dtype=torch.float16 if device != "cpu" else torch.float32)
    else:
        raise ValueError(f"stage 'asr' field 'backend': unknown ASR backend '{backend}' (faster-whisper|transformers)")
    return AsrSessionScheduler(
        transcriber,
        SileroVadModel(),
        speculative_after_ms=speculative_after_ms,
        partial_interval_ms=partial_interval_ms,
        max_sessions=max_sessions,
        max_buffered_bytes=max_buffered_bytes,
        idle_timeout_s=idle_timeout_s,
    )
