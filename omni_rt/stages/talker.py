"""Talker stage (Piper, CPU preset): speaks each clause as soon as the thinker's text stream completes it.

Accepts the thinker's text deltas before its final payload (``can_accept_stream_before_payload``), so the
first short clause is synthesized while the thinker is still generating the rest of the answer.
Stream in: ``TextDelta``; stream out: one ``Clause`` (text + waveform) per clause.
"""

from __future__ import annotations

import time
from typing import Any

from omni_rt.core.streaming_scheduler import StreamState
from omni_rt.stages.clause_stream import ClauseStreamWorker, check_clause_order
from omni_rt.contracts.payloads import Clause


class PiperTalker(ClauseStreamWorker):
    def __init__(self, tts: Any, first_min_words: int = 2, first_max_words: int = 4, min_words: int = 5, max_words: int = 24,
                 clause_order: str = "due") -> None:
        super().__init__("talker", clause_order=clause_order, first_min_words=first_min_words,
                         first_max_words=first_max_words, min_words=min_words, max_words=max_words)
        self.tts = tts

    def on_clauses(self, request_id: str, state: StreamState, clauses: list[str]) -> None:
        for clause in clauses:
            t0 = time.perf_counter()
            audio = self.tts.synthesize(clause)
            state.user["audio_samples"] = state.user.get("audio_samples", 0) + len(audio)
            self.emit(request_id, "stream", Clause(clause, audio, self.tts.sample_rate),
                      synth_ms=round((time.perf_counter() - t0) * 1000, 1))

    def result_extra(self, state: StreamState) -> dict[str, Any]:
        return {"audio_s": round(state.user.get("audio_samples", 0) / self.tts.sample_rate, 3)}


def create_piper_talker(
    voice: str | None = None, first_min_words: int = 2, first_max_words: int = 4, num_threads: int = 1,
    clause_order: str = "due",
) -> PiperTalker:
    """``clause_order``: ``due`` (a new answer's first clause ahead of other answers' later ones) or ``arrival``."""
    from omni_rt.backends.tts_piper import PiperTTS

    check_clause_order("talker", clause_order)  # before loading the voice
    tts = PiperTTS(voice_path=voice, num_threads=num_threads)
    tts.synthesize("Ready.")  # warm the ONNX session so the first answer pays no start-up cost
    return PiperTalker(tts, first_min_words=first_min_words, first_max_words=first_max_words,
                                clause_order=clause_order)
