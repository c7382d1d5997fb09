"""Talker stage (Piper, CPU preset): speaks each clause as soon as the thinker's text stream completes it.

Accepts the thinker's text deltas before its final payload (``can_accept_stream_before_payload``), so the
first short clause is synthesized while the thinker is still generating the rest of the answer.
Stream in: ``TextDelta``; stream out: one ``Clause`` (text + waveform) per clause.
"""

from __future__ import annotations

import time
from typing import Any

from omni_rt.core.streaming_scheduler import StreamingSimpleScheduler, StreamState
from omni_rt.stages.clauses import ClauseSplitter
from omni_rt.stages.contracts import Clause, text_of


class PiperTalkerScheduler(StreamingSimpleScheduler):
    def __init__(self, tts: Any, first_min_words: int = 2, first_max_words: int = 4, min_words: int = 5, max_words: int = 24) -> None:
        super().__init__(name="talker")
        self.tts = tts
        self.split_args = dict(first_min_words=first_min_words, first_max_words=first_max_words, min_words=min_words, max_words=max_words)

    def _splitter(self, state: StreamState) -> ClauseSplitter:
        sp = state.user.get("splitter")
        if sp is None:
            sp = state.user["splitter"] = ClauseSplitter(**self.split_args)
            state.user["spoken"] = []
            state.user["audio_samples"] = 0
        return sp

    def _speak(self, request_id: str, state: StreamState, clauses: list[str]) -> None:
        for clause in clauses:
            t0 = time.perf_counter()
            audio = self.tts.synthesize(clause)
            state.user["spoken"].append(clause)
            state.user["audio_samples"] += len(audio)
            self.emit(request_id, "stream", Clause(clause, audio, self.tts.sample_rate),
                      synth_ms=round((time.perf_counter() - t0) * 1000, 1))

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        text = text_of(data)
        if text:
            self._speak(request_id, state, self._splitter(state).push(text))

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        self._speak(request_id, state, self._splitter(state).flush())

    def on_complete(self, request_id: str, state: StreamState) -> None:
        self._splitter(state)
        payload = state.payload if isinstance(state.payload, dict) else {"text": str(state.payload)}
        self.emit(
            request_id, "result",
            {
                **{k: v for k, v in payload.items() if k != "token_ids"},
                "spoken_clauses": state.user["spoken"],
                "audio_s": round(state.user["audio_samples"] / self.tts.sample_rate, 3),
            },
        )


def create_piper_talker(
    voice: str | None = None, first_min_words: int = 2, first_max_words: int = 4, num_threads: int = 1
) -> PiperTalkerScheduler:
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS(voice_path=voice, num_threads=num_threads)
    tts.synthesize("Ready.")  # warm the ONNX session so the first answer pays no start-up cost
    return PiperTalkerScheduler(tts, first_min_words=first_min_words, first_max_words=first_max_words)
