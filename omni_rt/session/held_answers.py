"""Held answers: a response started from a speculative transcript before the user's turn ended. Its events
are kept, not sent, until the turn ends as guessed (``_release``: they go out at once and the answer joins
the history) or does not (``_discard``: dropped without a trace on the wire). Mixed into ``RealtimeSession``
through ``ResponseLifecycle``."""

from __future__ import annotations

import time
from typing import Any

from omni_rt.session import commands as cmd
from omni_rt.session.response import Response, ResponseState
from omni_rt.session.turn import Turn


class HeldAnswers:
    def _emit(self, resp: Response, event: dict[str, Any]) -> None:
        """Send a response's event, or keep it while the response is held."""
        if resp.state is ResponseState.DISCARDED:
            return
        if resp.state is ResponseState.HELD:
            resp.held_events.append(event)
        else:
            self.send(event)

    def _release(self, resp: Response, turn: Turn) -> None:
        """The turn ended as speculated: the held answer joins the history and its events go out now."""
        resp.state = ResponseState.ACTIVE
        resp.turn_end = turn.end_at or time.perf_counter()
        prev = {it.id: self.conversation.add(it) for it in resp.output}  # the items announced while held
        self.response = resp
        for ev in resp.held_events:
            if ev["type"] in ("conversation.item.added", "conversation.item.done"):
                ev["previous_item_id"] = prev.get(ev["item"]["id"])
            if ev["type"] == "response.output_audio.delta" and resp.first_audio is None:
                self._first_audio(resp)
            self.send(ev)
        resp.held_events.clear()
        self.stats["speculative_released"] += 1
        self._observations.append(("speculative_released", 1))
        if resp.pending_final is not None:  # it finished while held
            self._finish(resp, *resp.pending_final)

    def _discard(self, resp: Response | None) -> None:
        """Drop a held answer without a trace on the wire (the user kept talking, or said something else)."""
        if resp is None or resp.state is not ResponseState.HELD:
            return
        resp.state = ResponseState.DISCARDED
        resp.held_events.clear()
        if self._responses.pop(resp.id, None) is not None:
            self._commands.append(cmd.AbortResponse(resp.id))
        self.stats["speculative_discarded"] += 1
        self._observations.append(("speculative_discarded", 1))

    def _discard_held(self, turn: Turn) -> None:
        held, turn.held = turn.held, None
        self._discard(held)
