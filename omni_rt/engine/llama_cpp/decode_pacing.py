"""An answer far ahead of its playback steps out of llama-server's batch while another answer is starting.

Why (issue #24): on a CPU, llama-server's decode step costs more the more slots it decodes at once (a step
for eight answers costs well over twice one for one). A voice answer's
text runs far ahead of its speech (a full answer decodes in a fraction of the time it takes to speak), so at four sessions a new
answer's first clause, which the listener is waiting for, shared every step with the later sentences of the
answers already playing, which nobody is waiting for yet. llama-server has no per-request priority, so an
answer steps out itself: while a short request is starting (``prefill_pieces.ShortPrefills``) and the answer
is at least ``ahead_s`` of text ahead of its playback, its stream is closed (llama-server cancels a task
whose client disconnects, keeping its tokens in the slot's cache) and, once no short request is left or its
lead is down to ``RESUME_AHEAD_S``, it is resumed as a continuation in the same slot: the prompt plus the
text so far as tokens, almost all of it found in the cache.

The lead is estimated from the words of the clauses decoded so far (the talker speaks whole clauses: the words
of an unfinished one cannot play yet) and the time since the first text, at ``SPEECH_S_PER_WORD``, a lower
bound on speech time; the clock starts at the first text, before the talker has made any audio. Both err
towards resuming early, and it resumes with ``RESUME_AHEAD_S`` left: more than finishing and synthesising a
clause takes, with room for the talker's own queue, which is not in the estimate (less left still gave
playback gaps).

Off in the CPU preset (``pace_ahead_s`` unset): under load it trades a little first-audio time for gaps in the
answers being played, and a listener hears a gap more than a short wait. The numbers: docs/tuning-cpu.md
("decode pacing") and docs/benchmarks/concurrency.md ("Decode pacing, measured and not adopted").
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from omni_rt.contracts.rates import SPEECH_S_PER_WORD

RESUME_AHEAD_S = 1.0  # a paused answer resumes when its text is only this far ahead of its playback
_CLAUSE_END = re.compile(r"[.,!?;:](?=\s|$)")
LEG_MIN_TOKENS = 4  # a resumed answer decodes at least this many tokens before it may step out again


@dataclass
class AnswerPace:
    """One answer's text against the clock; ``ahead_s``: the lead it needs before it may step out."""

    ahead_s: float
    first_t: float | None = None
    text: list[str] = field(default_factory=list)
    tokens: int = 0  # chunks with text, over every leg (llama-server streams one token a chunk)
    leg_tokens: int = 0
    pauses: int = 0

    def feed(self, text: str, now: float | None = None) -> None:
        if not text:
            return
        self.first_t = self.first_t if self.first_t is not None else (time.perf_counter() if now is None else now)
        self.text.append(text)
        self.tokens += 1
        self.leg_tokens += 1

    def lead_s(self, now: float | None = None) -> float:
        """Seconds of speech in whole clauses decoded but not yet due to play (a lower bound); 0 before the
        first text."""
        if self.first_t is None:
            return 0.0
        now = time.perf_counter() if now is None else now
        text = "".join(self.text)
        ends = [m.end() for m in _CLAUSE_END.finditer(text)]
        words = len(text[:ends[-1]].split()) if ends else 0
        return words * SPEECH_S_PER_WORD - (now - self.first_t)

    def may_step_out(self, others_starting: bool, now: float | None = None) -> bool:
        lead = self.lead_s(now)  # (a pause must have time to last: above RESUME_AHEAD_S too)
        return others_starting and self.leg_tokens >= LEG_MIN_TOKENS and lead >= self.ahead_s and lead > RESUME_AHEAD_S

    def pause_cap_s(self, now: float | None = None) -> float:
        """How long it may stay out: until its lead is down to ``RESUME_AHEAD_S``."""
        return max(0.0, self.lead_s(now) - RESUME_AHEAD_S)

    def resumed(self) -> None:
        self.pauses += 1
        self.leg_tokens = 0
