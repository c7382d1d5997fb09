"""The user's turns, keyed by the turn number the audio-in stage gives them.

The stage numbers turns 1, 2, ... per session and tags every event with it (speech started/stopped,
committed, partial/speculative/final transcripts). A turn here owns its conversation item id, the partial
transcript already sent, the end-of-turn time and the answer *held* for it during the end-of-turn silence.
Matching by number means a transcript that arrives after the next turn has begun still lands on its own
item, and a burst of commits gives each commit its own item.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Iterator

from omni_rt.realtime.events import new_id
from omni_rt.session.response_state import Response

MAX_TRACKED_TURNS = 64  # turns whose transcript is still awaited; older ones are forgotten
MAX_PENDING_COMMITS = 64


@dataclass
class Turn:
    number: int
    item_id: str
    partial_sent: str = ""  # the partial transcript already sent as deltas
    committed: bool = False
    end_at: float | None = None  # perf_counter of the end-of-turn decision (speech_stopped or commit)
    held: Response | None = None  # answer prepared from the speculative transcript

    def mark_end(self) -> None:
        if self.end_at is None:
            self.end_at = time.perf_counter()


class TurnTracker:
    def __init__(self) -> None:
        self._turns: OrderedDict[int, Turn] = OrderedDict()
        self.latest_started = 0  # highest turn number whose speech has started (or was committed)
        self.commit_event_ids: deque[str | None] = deque(maxlen=MAX_PENDING_COMMITS)  # client commits in flight

    def get(self, number: int) -> Turn:
        """The turn numbered ``number``, created (with a fresh item id) the first time it is seen."""
        turn = self._turns.get(number)
        if turn is None:
            turn = self._turns[number] = Turn(number, new_id("item"))
            while len(self._turns) > MAX_TRACKED_TURNS:
                self._turns.popitem(last=False)
        self.latest_started = max(self.latest_started, number)
        return turn

    def peek(self, number: int) -> Turn | None:
        return self._turns.get(number)

    def forget(self, number: int) -> None:
        self._turns.pop(number, None)

    def held(self) -> Iterator[Turn]:
        return (t for t in list(self._turns.values()) if t.held is not None)

    def superseded(self, number: int) -> bool:
        """A later turn has already begun: answering this one would only be talked over."""
        return self.latest_started > number

    def live(self) -> int:
        return len(self._turns)
