"""Talker stage (Piper, CPU preset): speaks each clause as soon as the thinker's text stream completes it.

Accepts the thinker's text deltas before its final payload (``can_accept_stream_before_payload``), so the
first short clause is synthesized while the thinker is still generating the rest of the answer.
Stream in: ``TextDelta``; stream out: ``Clause`` (text + waveform) per clause.

An answer's first clause is streamed (``first_piece_s``, a voice built with ``streaming=True``): its first
~0.35 s of audio is decoded and sent, and the rest of it is deferred work of its own, due at once. So first
audio waits for Piper's front and one short decoder slice instead of the whole clause.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from omni_rt.pipeline.schedulers.streaming import StreamState
from omni_rt.stages.talker.clause_stream import ClauseStreamWorker, check_clause_order
from omni_rt.contracts.payloads import Clause



class PiperTalker(ClauseStreamWorker):
    def __init__(self, tts: Any, first_min_words: int = 2, first_max_words: int = 4, min_words: int = 5, max_words: int = 24,
                 clause_order: str = "due", first_piece_s: float | None = None) -> None:
        super().__init__("talker", clause_order=clause_order, first_min_words=first_min_words,
                         first_max_words=first_max_words, min_words=min_words, max_words=max_words)
        self.tts = tts
        if first_piece_s is not None and not getattr(tts, "streaming", False):
            raise ValueError("stage 'talker' field 'first_piece_s': the voice was not built for streaming")
        self.first_piece_s = first_piece_s

    def on_clauses(self, request_id: str, state: StreamState, clauses: list[str]) -> None:
        for clause in clauses:
            first = self.first_piece_s is not None and not state.user.get("streamed")
            if not first:
                self._speak(request_id, state, clause, iter([self.tts.synthesize(clause)]))
                continue
            state.user["streamed"] = True
            pieces = self.tts.stream(clause, first_s=self.first_piece_s)
            self._speak(request_id, state, clause, pieces, limit=1)
            rest = functools.partial(self._speak, request_id, state, "", pieces)
            # due at once: it must play right after the first piece, as urgent as a newer answer's first audio (due
            # a little before the piece ends instead, newer answers' first pieces kept passing it and it played late)
            self.queue_speech(request_id, state, rest, time.perf_counter(), continues=True)

    def _speak(self, request_id: str, state: StreamState, text: str, pieces: Iterator[np.ndarray],
               limit: int | None = None) -> None:
        """Emit up to ``limit`` pieces of one clause (the first with ``text``)."""
        t0 = time.perf_counter()
        for audio in pieces:
            state.user["audio_samples"] = state.user.get("audio_samples", 0) + len(audio)
            self.emit(request_id, "stream", Clause(text, audio, self.tts.sample_rate, continued=not text),
                      synth_ms=round((time.perf_counter() - t0) * 1000, 1))
            text, t0 = "", time.perf_counter()
            if limit is not None and (limit := limit - 1) == 0:
                break

    def release_memory(self) -> None:
        self.tts.release_memory()

    def result_extra(self, state: StreamState) -> dict[str, Any]:
        return {"audio_s": round(state.user.get("audio_samples", 0) / self.tts.sample_rate, 3)}


def create_piper_talker(
    voice: str | None = None, first_min_words: int = 2, first_max_words: int = 4, num_threads: int = 1,
    clause_order: str = "due", first_piece_s: float | None = None,
) -> PiperTalker:
    """``clause_order``: ``due`` (a new answer's first clause ahead of other answers' later ones) or ``arrival``.
    ``first_piece_s``: stream each answer's first clause, this many seconds first (None: every clause whole)."""
    from omni_rt.backends.tts_piper import PiperTTS

    check_clause_order("talker", clause_order)  # before loading the voice
    if first_piece_s is not None and not 0.05 <= first_piece_s <= 5.0:
        raise ValueError(f"stage 'talker' field 'first_piece_s': {first_piece_s} is outside 0.05-5 s")
    tts = PiperTTS(voice_path=voice, num_threads=num_threads, streaming=first_piece_s is not None)
    list(tts.stream("Ready.", first_s=first_piece_s))  # warm the ONNX sessions so the first answer pays no start-up cost
    return PiperTalker(tts, first_min_words=first_min_words, first_max_words=first_max_words,
                       clause_order=clause_order, first_piece_s=first_piece_s)
