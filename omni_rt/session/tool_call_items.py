"""Tool-call output items of a response: a ``function_call`` item per call, its arguments streamed as the
thinker's ``ToolCallDelta`` chunks arrive and completed by ``ToolCallDone``. A call the conversation has no room
for raises ``ProtocolError`` (``conversation_full``) before anything of it is announced; the response lifecycle
then fails the answer."""

from __future__ import annotations

from typing import Any, Callable

from omni_rt.contracts import payloads as c
from omni_rt.realtime.events import new_id
from omni_rt.session.conversation import Conversation, Item
from omni_rt.session.response_state import Response, ResponseState

Emit = Callable[[Response, dict[str, Any]], None]


class ToolCallItems:
    def __init__(self, conversation: Conversation, emit: Emit) -> None:
        """``emit``: sends a response's event, or keeps it while the response is held (``HeldAnswers.emit``)."""
        self._conversation = conversation
        self._emit = emit

    def on_delta(self, resp: Response, d: c.ToolCallDelta) -> None:
        """The model is calling a tool: a ``function_call`` output item whose arguments stream. Under
        ``parallel_tool_calls: false`` a call after the response's first is left out (any engine may write more)."""
        if resp.single_call and resp.calls and d.index not in resp.calls:
            return
        item = resp.calls.get(d.index)
        if item is None:
            item = Item(id=new_id("item"), role="assistant", content=[], status="in_progress", type="function_call",
                        call_id=d.call_id, name=d.name)
            prev = None
            if resp.in_conversation and resp.state is ResponseState.ACTIVE:
                prev = self._conversation.add(item)  # full: raises, never an unlisted item
            resp.calls[d.index] = item
            resp.output.append(item)
            self._emit(resp, {"type": "response.output_item.added", "response_id": resp.id, "output_index": resp.output_index(item),
                              "item": item.render()})
            if resp.in_conversation:
                self._emit(resp, {"type": "conversation.item.added", "previous_item_id": prev, "item": item.render()})
        if d.arguments_delta:
            item.arguments += d.arguments_delta
            self._emit(resp, {"type": "response.function_call_arguments.delta", "response_id": resp.id, "item_id": item.id,
                              "output_index": resp.output_index(item), "call_id": item.call_id, "delta": d.arguments_delta})

    def on_done(self, resp: Response, d: c.ToolCallDone) -> None:
        if resp.single_call and resp.calls and d.index not in resp.calls:
            return
        item = resp.calls.get(d.index)
        if item is None:
            self.on_delta(resp, c.ToolCallDelta(d.index, d.call_id, d.name, ""))
            item = resp.calls[d.index]
        item.arguments, item.status = d.arguments, "completed"
        self._emit(resp, {"type": "response.function_call_arguments.done", "response_id": resp.id, "item_id": item.id,
                          "output_index": resp.output_index(item), "call_id": item.call_id, "name": item.name,
                          "arguments": item.arguments})
        self._emit(resp, {"type": "response.output_item.done", "response_id": resp.id, "output_index": resp.output_index(item),
                          "item": item.render()})
        if resp.in_conversation:
            conv = self._conversation
            self._emit(resp, {"type": "conversation.item.done", "previous_item_id": conv.previous_id(item.id)
                              if item in conv.items else None, "item": item.render()})
