"""The talkers' shared shell: the thinker's text stream in, clauses out as soon as each is complete.

Both talkers (Piper on CPU, the Orpheus prompts of the GPU preset) take the thinker's ``TextDelta`` chunks
before its final payload (``can_accept_stream_before_payload``), cut them into clauses — the first one short so
the first audio starts after a few words (``ClauseSplitter``) — and differ only in what a clause becomes.
Clauses of all sessions are computed earliest-due first (``StreamingSimpleScheduler.defer``): a new answer's
first clause ahead of later clauses of answers already playing."""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable

from omni_rt.pipeline.schedulers.streaming import StreamingSimpleScheduler, StreamState
from omni_rt.stages.talker.clause_splitter import ClauseSplitter
from omni_rt.contracts.payloads import text_of
from omni_rt.contracts.rates import SPEECH_S_PER_WORD  # a later clause is due this long per earlier word


# "due": earliest-due first (above); "arrival": in the order the text arrived, all sessions in one line (the
# ablation that shows what the due order buys: latency_bench/presets/fifo_talker.yaml)
CLAUSE_ORDERS = ("due", "arrival")


def check_clause_order(stage: str, clause_order: str) -> None:
    if clause_order not in CLAUSE_ORDERS:
        raise ValueError(f"stage '{stage}' field 'clause_order': {clause_order!r} is not one of {', '.join(CLAUSE_ORDERS)}")


class ClauseStreamWorker(StreamingSimpleScheduler):
    """Override ``on_clauses`` (and ``result_extra`` for what the result reports beyond the clauses spoken)."""

    def __init__(self, name: str, clause_order: str = "due", **split_args: int) -> None:
        super().__init__(name=name)
        check_clause_order(name, clause_order)
        self.clause_order = clause_order
        self.split_args = split_args

    def on_clauses(self, request_id: str, state: StreamState, clauses: list[str]) -> None:
        raise NotImplementedError

    def result_extra(self, state: StreamState) -> dict[str, Any]:
        return {}

    def _splitter(self, state: StreamState) -> ClauseSplitter:
        sp = state.user.get("splitter")
        if sp is None:
            sp = state.user["splitter"] = ClauseSplitter(**self.split_args)
            state.user["spoken"] = []
        return sp

    def _clauses(self, request_id: str, state: StreamState, clauses: list[str]) -> None:
        """Each clause is deferred work due when the speech before it will have played: the first at once."""
        arrived = self.arrived()
        user = state.user
        for clause in clauses:
            if not user["spoken"]:
                user["first_due"], user["words_before"] = arrived, 0
            due = user["first_due"] + user["words_before"] * SPEECH_S_PER_WORD if self.clause_order == "due" else arrived
            user["spoken"].append(clause)
            user["words_before"] += len(clause.split())
            self.queue_speech(request_id, state, functools.partial(self.on_clauses, request_id, state, [clause]), due)

    def queue_speech(self, request_id: str, state: StreamState, run: Callable[[], Any], due: float,
                     continues: bool = False) -> None:
        """Queue one unit of an answer's speech, due at ``due``. Answers are served earliest-due first, but one
        answer's units always run in its own order: each deferred slot runs the answer's next unit, so a unit
        queued late with an early due cannot overtake audio queued before it. ``continues``: the rest of the
        clause being spoken, ahead of the answer's queued clauses."""
        units: deque[Callable[[], Any]] = state.user.setdefault("units", deque())
        units.appendleft(run) if continues else units.append(run)
        self.defer(request_id, state, functools.partial(self._next_unit, state), due=due)

    @staticmethod
    def _next_unit(state: StreamState) -> None:
        state.user["units"].popleft()()

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        text = text_of(data)
        if text:
            self._clauses(request_id, state, self._splitter(state).push(text))

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        self._clauses(request_id, state, self._splitter(state).flush())

    def on_complete(self, request_id: str, state: StreamState) -> None:
        payload = state.payload if isinstance(state.payload, dict) else {"text": str(state.payload)}
        self.emit(request_id, "result", {**{k: v for k, v in payload.items() if k != "token_ids"},
                                         "spoken_clauses": state.user.get("spoken", []), **self.result_extra(state)})
