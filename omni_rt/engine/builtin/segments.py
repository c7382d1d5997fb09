"""Streamed requests of an AR stage: a request whose input arrives as a stream of prompts (``SpeechPrompt``
chunks from an upstream stage's ``stream_to``), each generated as a request of its own.

Why here and not in the talker: the codec LM is a normal AR stage, batched with every other session's codec
requests by the same scheduler, and the stage before it (``omni_rt.stages.talker.speech_prompts``) only turns text
into prompts. This module is the bookkeeping between them: a response's segments run one after another (audio
must leave in order), their tokens stream out under the response's id, and the response's result follows the
last segment once its payload and every stream source's ``stream_done`` have arrived — the same completion rule
as ``StreamingSimpleScheduler``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from omni_rt.pipeline.schedulers.streaming import StreamState

SEGMENT_SEP = "/seg"  # inner ids are f"{owner}{SEGMENT_SEP}{n}": never a client-visible id
MAX_QUEUED_SEGMENTS = 256  # per request: a runaway upstream fails its own request, not the stage


@dataclass
class Streamed(StreamState):
    """One request fed by a stream: prompts waiting, the one running, what the result reports."""

    queue: deque[dict[str, Any]] = field(default_factory=deque)
    running: str | None = None
    count: int = 0
    tokens: int = 0


class SegmentedRequests:
    """Owner id -> its stream state, and inner segment id -> owner id. Used from the scheduler thread only."""

    def __init__(self) -> None:
        self.open: dict[str, Streamed] = {}
        self.owner: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.open)

    def state(self, owner: str) -> Streamed:
        st = self.open.get(owner)
        if st is None:
            st = self.open[owner] = Streamed()
        return st

    def add(self, owner: str, request: dict[str, Any]) -> None:
        st = self.state(owner)
        if len(st.queue) >= MAX_QUEUED_SEGMENTS:
            raise ValueError(f"more than {MAX_QUEUED_SEGMENTS} prompts queued for one request")
        st.queue.append(request)

    def next_segment(self, owner: str) -> tuple[str, dict[str, Any]] | None:
        """The next prompt to start, when none of the owner's is running."""
        st = self.open.get(owner)
        if st is None or st.running is not None or not st.queue:
            return None
        inner = f"{owner}{SEGMENT_SEP}{st.count}"
        st.count += 1
        st.running = inner
        self.owner[inner] = owner
        return inner, st.queue.popleft()

    def segment_done(self, inner: str, completion_tokens: int) -> None:
        """A segment finished (its owner is open: an orphan's result never gets here)."""
        st = self.open[self.owner.pop(inner)]
        st.running = None
        st.tokens += completion_tokens

    def complete(self, owner: str, sources: set[str]) -> dict[str, Any] | None:
        """The owner's result once it has its payload, every source is done and no prompt is left; else None."""
        st = self.open.get(owner)
        if st is None or not st.inputs_complete(sources) or st.running is not None or st.queue:
            return None
        del self.open[owner]
        payload = st.payload if isinstance(st.payload, dict) else {"text": str(st.payload)}
        return {**{k: v for k, v in payload.items() if k != "token_ids"}, "segments": st.count, "segment_tokens": st.tokens}

    def drop(self, owner: str) -> str | None:
        """Forget an owner (abort or failure); returns its running segment's inner id, to stop it. The inner id
        stays mapped to the owner until its result arrives, so what it still emits is known to be an orphan's."""
        st = self.open.pop(owner, None)
        return None if st is None else st.running

    def orphan(self, inner: str) -> bool:
        """Whether ``inner`` is a segment of an owner already dropped (its output goes nowhere)."""
        owner = self.owner.get(inner)
        return owner is not None and owner not in self.open
