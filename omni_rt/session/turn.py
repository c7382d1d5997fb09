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


def transcript_extension(sent: str, text: str) -> str:
    """What of ``text`` (a transcript of the whole turn, re-decoded) goes out after ``sent`` (the deltas already
    sent, which cannot be taken back): its continuation when it extends ``sent``; when the re-decode changed the
    start, the words past as many as were sent."""
    if text.startswith(sent):
        return text[len(sent):]
    words = text.split()[len(sent.split()):]
    return ((" " if sent else "") + " ".join(words)) if words else ""


def _word(w: str) -> str:
    return w.lower().strip(".,;:!?\"'")


def stable_partial_words(previous: str, current: str) -> list[str]:
    """The words of ``current`` (the newest partial) that ``previous`` (the one before) agrees on, from the
    start, case and punctuation aside; the newest one's last word never (the audio may end inside it). Two
    consecutive re-decodes agreeing is the usual test that a streamed word will not change (local agreement):
    a word sent as a delta cannot be taken back, and a partial's tail ("the cap?" of "the capital of France")
    is often wrong. Streaming these words while the user talks, instead of only what literally extends the
    text sent, keeps deltas coming (a client may read a pause in them as the end of the user's speech:
    LiveKit's GPT-Live client does after 0.8 s)."""
    prev, cur = previous.split(), current.split()
    n = 0
    for a, b in zip(prev, cur[:-1]):
        if _word(a) != _word(b):
            break
        n += 1
    return cur[:n]


@dataclass
class Turn:
    number: int
    item_id: str
    partial_sent: str = ""  # the partial transcript already sent as deltas
    partial_last: str = ""  # the newest partial (the next one is compared with it: stable_partial_words)
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
