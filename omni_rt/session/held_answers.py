"""Held answers: a response started from a speculative transcript before the user's turn ended. Its events
are kept, not sent, until the turn ends as guessed (``release``: they go out at once and the answer joins the
history) or does not (``discard``: dropped without a trace on the wire). This part owns the keeping and the
two counts; stopping a discarded answer in the pipeline is the response lifecycle's."""

from __future__ import annotations

import time
from typing import Any, Callable

from omni_rt.session.conversation import Conversation
from omni_rt.session.response_state import Response, ResponseState
from omni_rt.session.turn import Turn

Send = Callable[[dict[str, Any]], None]


class HeldAnswers:
    def __init__(self, send: Send, conversation: Conversation, observations: list[tuple[str, float]]) -> None:
        self._send = send
        self._conversation = conversation
        self._observations = observations
        self.released = 0  # speculation that paid off ...
        self.discarded = 0  # ... and that was thrown away

    def emit(self, resp: Response, event: dict[str, Any]) -> None:
        """Send a response's event, or keep it while the response is held."""
        if resp.state is ResponseState.DISCARDED:
            return
        if resp.state is ResponseState.HELD:
            resp.held_events.append(event)
        else:
            self._send(event)

    def release(self, resp: Response, turn: Turn) -> list[dict[str, Any]]:
        """The turn ended as speculated: the answer becomes active and its announced items join the history.
        Returns its kept events, in order, for the caller to send now."""
        resp.state = ResponseState.ACTIVE
        resp.turn_end = turn.end_at or time.perf_counter()
        prev = {it.id: self._conversation.add(it) for it in resp.output}  # the items announced while held
        events, resp.held_events = resp.held_events, []
        for ev in events:
            if ev["type"] in ("conversation.item.added", "conversation.item.done"):
                ev["previous_item_id"] = prev.get(ev["item"]["id"])
        self.released += 1
        self._observations.append(("speculative_released", 1))
        return events

    def discard(self, resp: Response | None) -> bool:
        """Drop a held answer without a trace on the wire (the user kept talking, or said something else).
        True when ``resp`` was held (the caller then stops it in the pipeline)."""
        if resp is None or resp.state is not ResponseState.HELD:
            return False
        resp.state = ResponseState.DISCARDED
        resp.held_events.clear()
        self.discarded += 1
        self._observations.append(("speculative_discarded", 1))
        return True
