"""Per-session conversation history (the items a Realtime client sees) and the prompt built from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.events import new_id



@dataclass
class Item:
    """A conversation item: a ``message`` (role + content), a ``function_call`` the model made, or the
    client's ``function_call_output`` for it."""

    id: str
    role: str  # user | assistant | system (messages); assistant for function_call, user-side tool for outputs
    content: list[dict[str, Any]]
    status: str = "completed"
    audio_ms: int = 0  # assistant audio length sent so far (for truncate bounds)
    clause_ms: list[tuple[int, str]] = field(default_factory=list)  # (start ms, clause) of spoken audio
    type: str = "message"  # message | function_call | function_call_output
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""

    def render(self) -> dict[str, Any]:
        base = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "function_call":
            return {**base, "call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type == "function_call_output":
            return {**base, "call_id": self.call_id, "output": self.output}
        return {**base, "role": self.role, "content": [dict(c) for c in self.content]}

    def text(self) -> str:
        parts = []
        for c in self.content:
            for key in ("text", "transcript"):
                if c.get(key):
                    parts.append(c[key])
                    break
        return " ".join(parts).strip()

    def size(self) -> int:
        """Characters held (for the per-session conversation cap)."""
        return sum(len(str(v)) for c in self.content for v in c.values()) + len(self.arguments) + len(self.output)


MAX_ITEM_CHARS = 64 * 1024  # one item's text, tool arguments or tool output
MAX_ITEMS = 512  # items per conversation
MAX_CONVERSATION_CHARS = 2 * 1024 * 1024  # all items of one conversation together


def _short_text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError("invalid_type", f"{param} must be a string", param)
    if len(value) > MAX_ITEM_CHARS:
        raise ProtocolError("string_above_max_length", f"{param} holds {len(value)} characters; at most {MAX_ITEM_CHARS}", param)
    return value


ALLOWED_CONTENT = {
    "user": {"input_text", "input_audio"},
    "system": {"input_text"},
    "assistant": {"output_text", "output_audio", "text"},
}


def item_from_client(data: Any) -> Item:
    """Validate a ``conversation.item.create`` item; only messages are supported (no tools yet)."""
    if not isinstance(data, dict):
        raise ProtocolError("invalid_value", "item must be an object", "item")
    item_id = data.get("id") or new_id("item")
    if not isinstance(item_id, str) or len(item_id) > 64:
        raise ProtocolError("invalid_value", "item.id must be a string of at most 64 characters", "item.id")
    kind = data.get("type", "message")
    if kind == "function_call_output":
        call_id = _short_text(data.get("call_id"), "item.call_id")
        return Item(id=item_id, role="tool", content=[], type=kind, call_id=call_id[:128],
                    output=_short_text(data.get("output"), "item.output"))
    if kind == "function_call":
        return Item(id=item_id, role="assistant", content=[], type=kind, call_id=_short_text(data.get("call_id"), "item.call_id")[:128],
                    name=_short_text(data.get("name"), "item.name")[:64], arguments=_short_text(data.get("arguments", ""), "item.arguments"))
    if kind != "message":
        raise ProtocolError("invalid_value", f"item type '{str(kind)[:32]}' is not supported (message, function_call, "
                            "function_call_output)", "item.type")
    role = data.get("role")
    if role not in ALLOWED_CONTENT:
        raise ProtocolError("invalid_value", "item.role must be 'user', 'assistant' or 'system'", "item.role")
    content = data.get("content")
    if not isinstance(content, list) or not content:
        raise ProtocolError("missing_required_parameter", "item.content must be a non-empty list", "item.content")
    clean: list[dict[str, Any]] = []
    for i, c in enumerate(content):
        if not isinstance(c, dict):
            raise ProtocolError("invalid_type", f"item.content[{i}] must be an object", f"item.content[{i}]")
        ctype = c.get("type")
        if ctype not in ALLOWED_CONTENT[role]:
            raise ProtocolError("invalid_value", f"content type '{ctype}' is not allowed for role '{role}'", f"item.content[{i}].type")
        if ctype == "input_audio":
            if not isinstance(c.get("transcript"), str):
                raise ProtocolError("invalid_value", "input_audio content needs a 'transcript' here (audio items are transcribed from the input buffer)",
                                    f"item.content[{i}].transcript")
            clean.append({"type": "input_audio", "transcript": _short_text(c["transcript"], f"item.content[{i}].transcript")})
            continue
        text = c.get("text", c.get("transcript"))
        if not isinstance(text, str):
            raise ProtocolError("invalid_type", f"item.content[{i}].text must be a string", f"item.content[{i}].text")
        _short_text(text, f"item.content[{i}].text")
        ctype = "output_text" if ctype == "text" else ctype
        key = "transcript" if ctype == "output_audio" else "text"
        clean.append({"type": ctype, key: text})
    return Item(id=item_id, role=role, content=clean)


def check_item_tokens(item: Item, limit: int, count: Callable[[str], int], note: str = "", prefix: str = "item") -> None:
    """Refuse an item too large for any prompt of the thinker (``limit`` tokens for one item), naming its part."""
    parts = [(f"{prefix}.content[{i}].{'transcript' if 'transcript' in c else 'text'}", c.get("transcript") or c.get("text") or "")
             for i, c in enumerate(item.content)]
    parts += [(f"{prefix}.{k}", getattr(item, k)) for k in ("arguments", "output") if getattr(item, k)]
    total = 0
    for param, text in parts:
        n = count(text) if text else 0
        total += n
        if total > limit:
            whole = "" if n == total else f" (the item's parts together: {total})"
            raise ProtocolError("context_length_exceeded", f"{param} is about {n} tokens{whole}; one item may hold at most "
                                f"{limit} tokens, the most a prompt of this thinker fits{note}", param)


class Conversation:
    """The items, and the session's ``truncation`` at the caps: ``auto`` (default) and ``retention_ratio``
    drop the oldest items to make room (each announced with ``conversation.item.deleted`` through
    ``on_evict``), ``disabled`` refuses with ``conversation_full``. The thinker's prompt keeps only the newest
    turns that fit its context (``omni_rt.engine.prompt.history``), so items dropped at the caps (512 items, 2 MB) are
    long out of every prompt: dropping them changes no prompt and no cached prefix."""

    def __init__(self, max_items: int = MAX_ITEMS) -> None:
        self.items: list[Item] = []
        self.max_items = max_items
        self.truncation: Callable[[], Any] = lambda: "auto"  # the session's config (session.update replaces it)
        self.on_evict: Callable[[Item], None] | None = None

    def get(self, item_id: Any) -> Item:
        for it in self.items:
            if it.id == item_id:
                return it
        raise ProtocolError("item_not_found", f"no conversation item with id '{item_id}'", "item_id")

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` (``root`` = first) or append; returns the actual previous id."""
        if any(it.id == item.id for it in self.items):
            raise ProtocolError("item_id_exists", f"an item with id '{item.id}' already exists", "item.id")
        self.check_room(item.size())
        if previous_item_id is None:
            prev = self.last_id()
            self.items.append(item)
            return prev
        if previous_item_id == "root":
            self.items.insert(0, item)
            return None
        idx = next((i for i, it in enumerate(self.items) if it.id == previous_item_id), None)
        if idx is None:
            raise ProtocolError("item_not_found", f"previous_item_id '{previous_item_id}' does not exist", "previous_item_id")
        self.items.insert(idx + 1, item)
        return previous_item_id

    def check_room(self, chars: int = 0, items: int = 1) -> None:
        """Make room for ``items`` more items holding ``chars`` characters, by the session's truncation, or raise
        ``conversation_full``. A response checks before it starts, so a full conversation refuses it rather than
        failing it half-announced."""
        self._truncate(chars, items)
        if len(self.items) + items > self.max_items:
            raise ProtocolError("conversation_full", f"the conversation holds {len(self.items)} items and keeps at most "
                                f"{self.max_items} (session.truncation is 'disabled'); delete some with "
                                "conversation.item.delete", "item")
        if sum(it.size() for it in self.items) + chars > MAX_CONVERSATION_CHARS:
            raise ProtocolError("conversation_full", f"the conversation would exceed {MAX_CONVERSATION_CHARS} characters; "
                                "delete some items with conversation.item.delete", "item")

    def _truncate(self, chars: int, items: int) -> None:
        """Drop the oldest finished items until ``items`` more (``chars`` characters) fit under the caps; with a
        ``retention_ratio`` r, down to r of the caps, so the next drop comes later. Never an item in progress."""
        policy = self.truncation()
        if policy == "disabled":
            return
        total = sum(it.size() for it in self.items)
        if len(self.items) + items <= self.max_items and total + chars <= MAX_CONVERSATION_CHARS:
            return
        ratio = policy.get("retention_ratio", 1.0) if isinstance(policy, dict) else 1.0
        keep_items = min(self.max_items - items, int(self.max_items * ratio))
        keep_chars = min(MAX_CONVERSATION_CHARS - chars, int(MAX_CONVERSATION_CHARS * ratio))
        for it in list(self.items):
            if len(self.items) <= keep_items and total <= keep_chars:
                break
            if it.status == "in_progress":
                continue
            self.items.remove(it)
            total -= it.size()
            if self.on_evict is not None:
                self.on_evict(it)

    def delete(self, item_id: Any) -> None:
        self.items.remove(self.get(item_id))

    def previous_id(self, item_id: str) -> str | None:
        ids = [it.id for it in self.items]
        i = ids.index(item_id)
        return ids[i - 1] if i > 0 else None

    def call(self, call_id: str) -> Item | None:
        return next((it for it in self.items if it.type == "function_call" and it.call_id == call_id), None)

    @staticmethod
    def messages_of(items: list[Item], instructions: str) -> list[dict[str, Any]]:
        """Chat messages for the thinker: instructions, then the newest items (empty messages skipped).
        Consecutive function calls become one assistant message with ``tool_calls``, which also carries the words
        the assistant said just before them (a spoken preamble and its call are one assistant turn); outputs
        ``tool`` messages."""
        msgs: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
        for it in items:  # no count cap: the thinker trims the oldest turns by tokens to fit its context
            if it.type == "function_call":
                call = {"id": it.call_id, "type": "function", "function": {"name": it.name, "arguments": it.arguments or "{}"}}
                if msgs and msgs[-1]["role"] == "assistant":
                    msgs[-1].setdefault("tool_calls", []).append(call)
                else:
                    msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif it.type == "function_call_output":
                msgs.append({"role": "tool", "tool_call_id": it.call_id, "content": it.output})
            elif text := it.text():
                msgs.append({"role": it.role, "content": text})
        return msgs
