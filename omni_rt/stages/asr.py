"""ASR stage: VAD + streaming Whisper on a SessionScheduler, one state per session across turns.

Why decode during the silence: Whisper always encodes a 30 s window (~250 ms on 2 cores for tiny.en, whatever
the audio length), so waiting for ``speech_stopped`` before decoding puts that whole cost on the critical path.
Once the VAD has seen ``speculative_after_ms`` of trailing silence we transcribe the turn; if no speech
follows before ``silence_duration_ms`` ends the turn, that transcript *is* the final one and is ready the moment
the turn ends.

Whisper runs on a decode worker thread, never on the session thread: the VAD keeps up with the audio (a
late ``speech_stopped`` is latency too) while a decode is in flight. Finished decodes come back through the
inbox as ``_decoded`` ops, so all per-session state is still touched by one thread only. An ``epoch`` per
session tells a decode that is still valid from one made stale by new speech.

Session ops (``new_request`` data ``op``): ``open`` (params below), ``update`` (new params), ``commit``
(end the turn now: manual turn taking), ``clear`` (drop buffered audio). Appends are float32 16 kHz arrays.
Events out (``omni_rt.stages.contracts``, each tagged with its turn number): ``SpeechStarted``,
``SpeechStopped``, ``Committed``, ``Cleared``, ``TranscriptPartial``, ``TranscriptSpeculative``,
``SpeculationCancelled``, ``TranscriptFinal``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni_rt.audio import PIPELINE_INPUT_RATE

from omni_rt.core.messages import IncomingMessage
from omni_rt.core.session_scheduler import Session, SessionLimitError, SessionScheduler
from omni_rt.stages.contracts import (
    Cleared,
    Committed,
    SpeculationCancelled,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
    TranscriptSpeculative,
)

SAMPLE_RATE = PIPELINE_INPUT_RATE


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
    last_partial_samples: int = 0
    speculative: str | None = None  # text decoded in the silence for the current epoch
    spec_pending: bool = False  # a speculative decode for the current epoch is in flight
    awaiting_final: dict[str, Any] | None = None  # a finished turn waiting for its in-flight speculative decode
    epoch: int = 0  # bumped when speech resumes or a turn ends: older decodes no longer describe the turn
    partials: bool = True
    turn: int = 0


class AsrSessionScheduler(SessionScheduler):
    def __init__(
        self,
        transcriber: Transcriber,
        vad_model: Any,
        speculative_after_ms: int = 150,
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
        self._decoder: ThreadPoolExecutor | None = None
        self._decodes_in_flight = 0

    def start(self) -> None:
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr-decode")
        super().start()

    def stop(self) -> None:
        super().stop()
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)

    def _handle(self, msg: IncomingMessage) -> None:
        data = msg.data if msg.type == "new_request" else None
        if isinstance(data, dict) and data.get("op") == "_decoded" and msg.request_id not in self.sessions:
            self._decodes_in_flight -= 1  # the session closed while its decode ran: nothing to deliver
            return
        super()._handle(msg)

    def _decode(self, session_id: str, kind: str, audio: np.ndarray, **meta: Any) -> None:
        """Transcribe on the worker; the result returns to the session thread as a ``_decoded`` op."""
        assert self._decoder is not None, "scheduler not started"
        self._decodes_in_flight += 1
        audio = audio.copy()

        def job() -> None:
            t0 = time.perf_counter()
            try:
                text, error = self.transcriber.transcribe(audio).strip(), None
            except Exception as exc:  # noqa: BLE001 - reported to the session as an error event
                text, error = "", f"{type(exc).__name__}: {exc}"
            self.inbox.put(IncomingMessage(session_id, "new_request", {
                "op": "_decoded", "kind": kind, "text": text, "error": error,
                "asr_ms": round((time.perf_counter() - t0) * 1000, 1), **meta}))

        self._decoder.submit(job)

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
        st.last_partial_samples = 0
        st.speculative = None
        st.spec_pending = False
        st.epoch += 1
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
                self.emit(session.session_id, "event", SpeechStopped(st.turn + 1, self._ms(st.stream_samples)))
                st.vad.reset()
            self._finish_turn(session, st, trigger="commit")
        elif op == "_decoded":
            self._decoded(session, st, data)
        elif op == "clear":
            st.vad.reset()
            self._reset_turn(session, st)
            self.emit(session.session_id, "event", Cleared(st.turn + 1))
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
                self.emit(sid, "event", SpeechStarted(st.turn + 1, ev.audio_ms))
            elif ev.kind == "speech_stopped":
                self.emit(sid, "event", SpeechStopped(st.turn + 1, ev.audio_ms))
                self._finish_turn(session, st, trigger="vad")
        if st.vad.in_speech:
            self._maybe_decode_early(session, st)
        else:
            # outside speech only the padding window is worth keeping
            pad = int((st.td.prefix_padding_ms + 100) * SAMPLE_RATE / 1000)
            if st.samples > 4 * pad:
                self._reset_turn(session, st, keep_ms=st.td.prefix_padding_ms + 100)
        if st.samples > self.max_turn_samples and st.vad.in_speech:
            self.emit(sid, "event", SpeechStopped(st.turn + 1, self._ms(st.stream_samples), forced=True))
            st.vad.reset()
            self._finish_turn(session, st, trigger="max_turn")

    def _maybe_decode_early(self, session: Session, st: AsrState) -> None:
        sid = session.session_id
        if st.vad.silence_ms >= self.speculative_after_ms:
            if st.speculative is None and not st.spec_pending:
                st.spec_pending = True
                st.last_partial_samples = st.samples
                self._decode(sid, "speculative", self._turn_audio(st), epoch=st.epoch, turn=st.turn + 1)
            return
        if st.speculative is not None or st.spec_pending:  # speech resumed: the guess (and what it started) is stale
            if st.speculative is not None:
                self.emit(sid, "event", SpeculationCancelled(st.turn + 1))
            st.speculative, st.spec_pending = None, False
            st.epoch += 1
        due = st.samples - st.last_partial_samples >= self.partial_interval_samples
        if st.partials and due and self._decodes_in_flight == 0:  # never queue a partial ahead of a final
            st.last_partial_samples = st.samples
            self._decode(sid, "partial", self._turn_audio(st), epoch=st.epoch, turn=st.turn + 1)

    def _finish_turn(self, session: Session, st: AsrState, trigger: str) -> None:
        sid = session.session_id
        audio = self._turn_audio(st)
        st.turn += 1
        self.stats["turns"] += 1
        self.emit(sid, "event", Committed(st.turn, trigger, self._ms(audio.size)))
        meta = {"turn": st.turn, "audio_ms": self._ms(audio.size), "t_end": time.perf_counter()}
        if trigger == "vad" and st.speculative is not None:
            self.stats["speculative_hits"] += 1
            self._emit_final(sid, st.speculative, speculative=True, asr_ms=0.0, **meta)
        elif trigger == "vad" and st.spec_pending:
            self.stats["speculative_hits"] += 1  # the decode in flight covers this turn: wait for it
            st.awaiting_final = {"epoch": st.epoch, **meta}
        else:
            if trigger == "vad":
                self.stats["speculative_misses"] += 1
            self._decode(sid, "final", audio, **meta)
        self._reset_turn(session, st)

    def _decoded(self, session: Session, st: AsrState, data: dict[str, Any]) -> None:
        self._decodes_in_flight -= 1
        sid, kind, text = session.session_id, data["kind"], data["text"]
        if data.get("error"):
            raise RuntimeError(f"transcription failed: {data['error']}")
        if kind == "final":
            self._emit_final(sid, text, speculative=False, asr_ms=data["asr_ms"], turn=data["turn"],
                             audio_ms=data["audio_ms"], t_end=data["t_end"])
        elif kind == "speculative":
            waiting = st.awaiting_final
            if waiting is not None and waiting["epoch"] == data["epoch"]:
                st.awaiting_final = None
                self._emit_final(sid, text, speculative=True, asr_ms=data["asr_ms"], turn=waiting["turn"],
                                 audio_ms=waiting["audio_ms"], t_end=waiting["t_end"])
            elif data["epoch"] == st.epoch:
                st.speculative, st.spec_pending = text, False
                # lets the session start answering in the silence; the answer is held until the turn ends
                self.emit(sid, "event", TranscriptSpeculative(data["turn"], text, data["asr_ms"]))
        elif kind == "partial" and data["epoch"] == st.epoch and text:
            self.emit(sid, "event", TranscriptPartial(data["turn"], text))

    def _emit_final(self, sid: str, text: str, speculative: bool, asr_ms: float, turn: int, audio_ms: int, t_end: float) -> None:
        self.emit(sid, "event", TranscriptFinal(turn, text.strip(), speculative, asr_ms,
                                                after_end_ms=round((time.perf_counter() - t_end) * 1000, 1), audio_ms=audio_ms))


def create_asr_stage(
    backend: str = "faster-whisper",
    model: str | None = None,
    device: str = "cpu",
    compute_type: str = "int8",
    cpu_threads: int = 2,
    speculative_after_ms: int = 150,
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
