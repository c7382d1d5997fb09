"""The ASR stage's decoding: one Whisper worker shared by all sessions, fair across them, batched when busy.

Why its own component: which session's audio is transcribed next (start-time fair queuing), how jobs are
batched and which stale ones are skipped has nothing to do with where turns begin and end (the VAD) or whether
a pause ends one (turn scoring); the stage hands it ``DecodeJob``s and gets ``_decoded`` ops back in its inbox.

Fairness and batching: decodes wait in a queue per session and the one worker takes them by start-time fair
queuing across sessions. When it is free it takes the head job of up to ``max_batch`` sessions (at most one
per session, in fair order) and runs them as one ``transcribe_batch`` (one encoder pass for all); a lone
decode runs at once, and a batch is only what queued while the worker was busy (no admission window: a
wait would only add latency unless more sessions commit within it, and nothing measured says they do).
So a burst of commits from one session delays another session's decode by at most the batch already running.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Transcriber(Protocol):
    def transcribe(self, audio: np.ndarray) -> str: ...

    def transcribe_batch(self, audios: list[np.ndarray]) -> list[str]: ...  # optional: without it max_batch is 1

    # optional too: each text with Whisper's probability of its last word (semantic_vad's speculative decodes)
    # def transcribe_batch_scored(self, audios: list[np.ndarray]) -> list[tuple[str, float | None]]: ...
    # optional too: a quick look, only the first words of a short piece of speech (``DecodeJob.brief``)
    # def transcribe_brief(self, audio, readings=None) -> tuple[str, tuple[str, float] | None]: ...
    #     (``readings``: texts to weigh against the one heard; the likeliest with its log-probability deficit)


@dataclass
class DecodeJob:
    """One queued decode: the audio, and what to send back with its text. ``wanted`` (optional, called on the
    worker just before decoding): False skips a decode that new speech made stale while it waited."""

    session_id: str
    kind: str  # partial | speculative | final
    audio: np.ndarray
    wanted: Callable[[], bool] | None
    meta: dict[str, Any]
    scored: bool = False  # wants the last word's probability too (``last_word_prob`` in the result)
    brief: bool = False  # only its first words are wanted (``transcribe_brief``, when it runs alone)
    # a brief look's alternative texts to weigh against what it heard (``reading`` in the result)
    readings: Callable[[str], list[str]] | None = None


class DecodeQueue:
    """Queues per session, one worker thread; each result is posted as ``post(session_id, data)`` with data
    ``{"op": "_decoded", "kind", "text", "last_word_prob", "reading", "error", "asr_ms", **meta}``
    (``reading``: a brief look's likeliest alternative text and its log-probability deficit, or None). Only the stage's thread calls it."""

    def __init__(self, transcriber: Transcriber, max_batch: int, post: Callable[[str, dict[str, Any]], None],
                 counters: dict[str, int]) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 (sessions decoded together), got {max_batch}")
        self.transcriber = transcriber
        # a transcriber without transcribe_batch decodes one session at a time
        self.max_batch = max_batch if hasattr(transcriber, "transcribe_batch") else 1
        self._post = post
        self.counters = counters
        self._pool: ThreadPoolExecutor | None = None
        self.in_flight = 0  # queued + running, all sessions
        self._jobs: dict[str, deque] = {}  # session -> (tag, seq, job) waiting for the worker
        self._tags: dict[str, float] = {}  # session -> virtual start time of its next job (fair queuing)
        self._vclock = 0.0
        # sessions whose decode the worker is running (results not yet back): the worker is busy while any is
        self._decoding: set[str] = set()
        self._seq = 0  # arrival order, breaks tag ties

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr-decode")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def queued(self, session_id: str) -> int:
        return len(self._jobs.get(session_id, ()))

    def submit(self, job: DecodeJob) -> None:
        assert self._pool is not None, "decoder not started"
        self.in_flight += 1
        sid = job.session_id
        backlogged = sid in self._jobs or sid in self._decoding
        tag = max(self._vclock, self._tags.get(sid, 0.0)) if backlogged else self._vclock
        self._tags[sid] = tag + 1.0
        self._seq += 1
        self._jobs.setdefault(sid, deque()).append((tag, self._seq, job))
        self._pump()

    def returned(self, session_id: str) -> None:
        """A ``_decoded`` op reached the stage (delivered or not): the worker may take the next batch."""
        self._decoding.discard(session_id)
        self.in_flight -= 1

    def pump(self) -> None:
        self._pump()

    def drop_session(self, session_id: str) -> None:
        """Queued decodes of a closed session are never run."""
        jobs = self._jobs.pop(session_id, None)
        self._tags.pop(session_id, None)
        if jobs:
            self.in_flight -= len(jobs)

    def _pump(self) -> None:
        """Hand the free worker the next batch: start-time fair queuing across sessions. Each job is tagged
        with ``max(virtual clock, the session's previous tag)``; the sessions whose head jobs have the
        smallest tags run next (one job each, up to ``max_batch``) and the clock moves to the largest tag
        taken. A session that just had a decode waits behind one that has not, and a session arriving with
        nothing queued starts at the clock (no credit saved up, no debt carried)."""
        if self._decoding or self._pool is None or not self._jobs:
            return
        heads = sorted(self._jobs, key=lambda k: self._jobs[k][0][:2])[: self.max_batch]
        batch: list[DecodeJob] = []
        for sid in heads:
            jobs = self._jobs[sid]
            tag, _, job = jobs.popleft()
            if not jobs:
                del self._jobs[sid]
            self._vclock = max(self._vclock, tag)
            batch.append(job)
        self._decoding = set(heads)
        if len(batch) > 1:
            self.counters["decode_batches"] += 1
            self.counters["batched_decodes"] += len(batch)
        self.counters["max_batch_seen"] = max(self.counters["max_batch_seen"], len(batch))
        self._pool.submit(self._run_batch, batch)

    def _run_batch(self, batch: list[DecodeJob]) -> None:
        """On the worker: skip stale jobs, transcribe the rest in one call, post one ``_decoded`` per job."""
        t0 = time.perf_counter()
        live = []
        for job in batch:
            if job.wanted is not None and not job.wanted():
                self.counters["stale_decodes_skipped"] += 1
                job.meta["stale"] = True
            else:
                live.append(job)
        results: list[tuple[str, float | None]] = []
        reading: tuple[str, float] | None = None
        error = None
        try:
            scored = getattr(self.transcriber, "transcribe_batch_scored", None)
            brief = getattr(self.transcriber, "transcribe_brief", None)
            if len(live) == 1 and live[0].brief and brief is not None:
                text, reading = brief(live[0].audio, readings=live[0].readings)
                results = [(text, None)]
            elif live and scored is not None and any(j.scored for j in live):
                results = list(scored([j.audio for j in live]))
            elif len(live) == 1:
                results = [(self.transcriber.transcribe(live[0].audio), None)]
            elif live:
                results = [(t, None) for t in self.transcriber.transcribe_batch([j.audio for j in live])]
            if len(results) != len(live):
                raise RuntimeError(f"the transcriber returned {len(results)} texts for {len(live)} inputs")
        except Exception as exc:  # noqa: BLE001 - reported to each session of the batch as an error event
            error = f"{type(exc).__name__}: {exc}"
        by_job = {id(j): r for j, r in zip(live, results)} if error is None else {}
        t1 = time.perf_counter()
        asr_ms = round((t1 - t0) * 1000, 1)
        for job in batch:
            text, last_word_prob = by_job.get(id(job), ("", None))
            text = text.strip()
            err = error if error is not None and not job.meta.get("stale") else None
            # t_start/t_done: when the worker ran it, so the stage can split a turn's wait into queue vs compute
            self._post(job.session_id, {"op": "_decoded", "kind": job.kind, "text": text, "last_word_prob": last_word_prob,
                                        "reading": reading if job.brief and id(job) in by_job else None, "error": err, "asr_ms": asr_ms,
                                        "t_start": t0, "t_done": t1, **job.meta})
