"""semantic_vad's turn scoring: Smart Turn's audio score and the speculative transcript's words, per pause.

Why its own component: the ASR stage segments audio (VAD) and decodes it (Whisper); deciding whether a pause
ends the turn is a third concern with its own model, thread and rule (``omni_rt.stages.asr.turn_rule``).
``TurnScorer`` owns the model and its worker thread; ``PauseVerdict`` is one session's view of the current
pause (the two inputs as they arrive, and the silence after which the turn ends). The stage feeds it and asks
it; it never touches the stage's state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_rt.stages.asr.turn_rule import Eagerness, words_cue
from omni_rt.pipeline.schedulers.session import SessionLimitError

WINDOW_S = 8  # Smart Turn hears the last 8 s


@dataclass
class PauseVerdict:
    """The current pause of one session: ``pause`` numbers it (bumped when speech resumes: older scores are
    stale); ``prob`` (Smart Turn) and ``words`` (the cue of the speculative transcript) arrive separately, and
    ``second`` (Smart Turn again at ``SECOND_LOOK_MS``) only if the first verdict asks for a second look."""

    pause: int = 0
    prob: float | None = None
    words: str | None = None
    last_word_prob: float | None = None  # Whisper's probability of the transcript's last word
    second: float | None = None  # Smart Turn at SECOND_LOOK_MS, when the first verdict was unsure
    pending: bool = False  # a Smart Turn score for this pause is in flight
    score_ms: float = 0.0
    queue_ms: float = 0.0  # how long the score waited for the scorer thread

    def new_pause(self) -> None:
        self.pause += 1
        self.prob, self.words, self.last_word_prob, self.second, self.pending = None, None, None, None, False

    def hear(self, text: str, last_word_prob: float | None = None) -> None:
        self.words, self.last_word_prob = words_cue(text, last_word_prob), last_word_prob

    def end_silence_ms(self, eager: Eagerness) -> int:
        return eager.end_silence_ms(self.prob, self.words, self.second)

    def wants_second_look(self, eager: Eagerness) -> bool:
        """The first verdict is in, unsure, on words that can end, and no second score is in or in flight."""
        return (self.second is None and not self.pending and self.words is not None
                and eager.wants_second_look(self.prob, self.words, self.last_word_prob))

    def decided(self, eager: Eagerness) -> bool:
        """Both inputs are in and they end the turn before the max silence."""
        return self.end_silence_ms(eager) < eager.max_silence_ms


class TurnScorer:
    """Smart Turn (a ``SmartTurnModel``, a loader returning one, or None: the packaged default), loaded once,
    scoring on one worker thread; results come back through ``post(session_id, data)`` as ``_scored`` ops."""

    def __init__(self, model: Any, post: Callable[[str, dict[str, Any]], None]) -> None:
        self._model = model
        self._error: str | None = None
        self._post = post
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr-turn-score")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def model(self) -> Any:
        """The Smart Turn model, loaded once; a missing model is a clear error naming the package and file."""
        if self._error is not None:
            raise SessionLimitError("turn_model_unavailable", self._error)
        if self._model is None or callable(self._model) and not hasattr(self._model, "predict"):
            try:
                if self._model is None:
                    from omni_rt.backends.turn_model import SmartTurnModel

                    self._model = SmartTurnModel()
                else:
                    self._model = self._model()
            except Exception as exc:  # noqa: BLE001 - every later semantic_vad session gets the same clear error
                self._error = f"semantic_vad needs the Smart Turn model: {exc}"
                raise SessionLimitError("turn_model_unavailable", self._error) from exc
        return self._model

    def score(self, session_id: str, audio: np.ndarray, sample_rate: int, verdict: PauseVerdict, look: int = 1) -> None:
        """Score the turn so far (its last 8 s) for ``verdict``'s pause (``look`` 2: the second look); skipped if
        speech resumed while it waited."""
        assert self._pool is not None, "scorer not started"
        model, clip, pause = self.model(), audio[-WINDOW_S * sample_rate :].copy(), verdict.pause
        verdict.pending = True
        submitted = time.perf_counter()

        def job() -> None:
            t0 = time.perf_counter()
            prob, error = None, None
            if verdict.pause == pause:  # a benign cross-thread read of an int: stale pauses are not scored
                try:
                    prob = model.predict(clip)
                except Exception as exc:  # noqa: BLE001 - reported to the session as an error event
                    error = f"{type(exc).__name__}: {exc}"
            self._post(session_id, {"op": "_scored", "pause": pause, "look": look, "prob": prob, "error": error,
                                    "score_ms": round((time.perf_counter() - t0) * 1000, 1),
                                    "queue_ms": round((t0 - submitted) * 1000, 1)})

        self._pool.submit(job)
