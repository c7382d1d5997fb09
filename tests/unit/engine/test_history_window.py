"""A session's history token budget (issues #26, #27) on ``HistoryWindow`` itself: the session's share of the
KV capped by the context, oldest turns trimmed in chunks, the instructions and the newest message always kept,
items too large for any prompt refused naming the field. Long sessions on real servers and llama-server's slots:
tests/integration/test_history_budget.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from rt_helpers import validate_event

from omni_rt.engine.prompt.history import HistoryWindow, PromptTooLong
from omni_rt.engine.llama_cpp.build import locate_binary

_WORDS = ("I have been thinking about my garden this spring and the tomatoes the beans the roses and the small "
          "apple tree near the fence that my grandmother planted many years ago when she first moved here").split()


def big_turn(turn: int, words: int = 400) -> str:
    body = " ".join(_WORDS[(i + turn) % len(_WORDS)] for i in range(words))
    return f"{body}. In one sentence: what should I plant next to the apple tree? (turn {turn})"


@pytest.fixture(scope="module")
def tokenizer():
    from omni_rt.engine.weights.loader import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2"))


# ---------------------------------------------------------------------------------------------- the window
def test_budget_is_the_sessions_share_of_the_kv_capped_by_the_context(tokenizer):
    assert HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=8).session_tokens == 1024
    assert HistoryWindow(tokenizer, 1024, kv_tokens=32768, slots=8).session_tokens == 1024  # the context caps it
    assert HistoryWindow(tokenizer, 4096).session_tokens == 4096
    assert HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=8, session_tokens=3000).session_tokens == 3000
    w = HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=8)
    assert w.prompt_budget(96) == 1023 - 96 and w.prompt_budget(10_000) == 1023 - 1023 // 4
    assert w.max_item_tokens < w.prompt_budget(10_000)  # an accepted item fits a prompt at any answer length


def test_trim_drops_oldest_turns_in_chunks_so_the_prefix_stays_for_several_turns(tokenizer):
    w = HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=4)  # 2048 tokens per session
    system = {"role": "system", "content": "You are a helpful voice assistant."}
    msgs, prompts = [system], []
    for turn in range(16):
        msgs.append({"role": "user", "content": big_turn(turn, 120)})
        kept, ids = w.fit("s", msgs, w.prompt_budget(96))
        assert kept[0] == system and kept[-1] == msgs[-1] and len(ids) <= w.prompt_budget(96)
        prompts.append(ids)
        msgs.append({"role": "assistant", "content": f"Plant basil, answer {turn}."})
    shared = [next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), min(len(p), len(q)))
              for p, q in zip(prompts, prompts[1:])]
    stable = sum(1 for n, p in zip(shared, prompts) if n >= len(p) - 2)  # this turn's prompt is the next's prefix
    state = w.state()
    assert 1 <= state["trims"] <= 6 and stable >= 9, (state, shared)
    assert state["sessions"]["s"]["dropped_messages"] > 0
    w.forget("s")
    assert "s" not in w.state()["sessions"]
    with pytest.raises(PromptTooLong):
        w.fit("s", [system, {"role": "user", "content": big_turn(0, 3000)}], w.prompt_budget(96))


def test_the_conversation_bound_trims_old_turns_but_never_the_instructions_or_the_newest_message(tokenizer):
    """``conversation_tokens``: the turns after the instructions stay within the bound (trimmed in the same big
    steps), long instructions are kept whole, and a newest message longer than the bound is still answered."""
    bound = 160
    w = HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=8, conversation_tokens=bound)
    plain = HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=8)
    system = {"role": "system", "content": big_turn(0, 200)}  # ~200 tokens of instructions: over the bound alone
    fixed = w.cost(system, w.prompt_budget(96))
    msgs, kept_turns = [system], []
    for turn in range(12):
        msgs.append({"role": "user", "content": f"What should I plant next, part {turn}?"})
        kept, ids = w.fit("s", msgs, w.prompt_budget(96))
        assert kept[0] == system and kept[-1] == msgs[-1]
        assert len(ids) <= fixed + bound + 8, (turn, len(ids))  # a render's template tokens beyond the estimate
        kept_turns.append(len(kept) - 1)
        msgs.append({"role": "assistant", "content": f"Plant basil and some marigolds, answer {turn}."})
    assert max(kept_turns) < 12 and min(kept_turns[4:]) >= 2, kept_turns  # trimmed, keeping a few turns
    assert len(plain.fit("s", msgs[:-1], plain.prompt_budget(96))[0]) == len(msgs) - 1  # unbounded: all kept
    long_question = {"role": "user", "content": big_turn(1, 150)}  # itself over the bound
    kept, ids = w.fit("s", msgs + [long_question], w.prompt_budget(96))
    assert kept == [system, long_question] and len(ids) <= w.prompt_budget(96)
    assert w.state()["conversation_tokens"] == 160
    with pytest.raises(ValueError, match="conversation_tokens"):
        HistoryWindow(tokenizer, 8192, conversation_tokens=4)


def test_items_and_instructions_too_large_for_any_prompt_are_refused_naming_the_field(tokenizer):
    """The session gets the thinker's window through its limits (as the server passes it) and refuses, at
    creation, an item or instructions no prompt could hold; the same text one size down is accepted."""
    from omni_rt.session.core import RealtimeSession, SessionLimits

    w = HistoryWindow(tokenizer, 8192, kv_tokens=8192, slots=8)
    s = RealtimeSession(limits=SessionLimits(item_tokens=w.count, max_item_tokens=w.max_item_tokens,
                                             item_budget_note=f" ({w.describe()})"))
    s.open()
    s.events_to_send()
    too_big, fits = big_turn(0, 900), big_turn(0, 300)
    assert w.count(too_big) > w.max_item_tokens >= w.count(fits)

    def send(event: dict[str, Any]) -> list[dict[str, Any]]:
        s.receive_event(event)
        out = s.events_to_send()
        for e in out:
            validate_event(e)
        return out

    cases = [
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": too_big}]}}, "item.content[0].text"),
        ({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1", "output": too_big}},
         None),  # no such call: refused for that first (unknown call_id)
        ({"type": "session.update", "session": {"type": "realtime", "instructions": too_big}}, "session.instructions"),
        ({"type": "response.create", "response": {"instructions": too_big}}, "response.instructions"),
    ]
    for event, param in cases:
        out = send(event)
        assert [e["type"] for e in out] == ["error"], out
        if param is not None:
            err = out[0]["error"]
            assert err["code"] == "context_length_exceeded" and err["param"] == param, err
            assert str(w.max_item_tokens) in err["message"] and "1024 tokens per session" in err["message"], err
    assert s.conversation.items == [] and s.response is None
    out = send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": fits}]}})
    assert [e["type"] for e in out] == ["conversation.item.added", "conversation.item.done"], out
    assert [e["type"] for e in send({"type": "session.update", "session": {"type": "realtime", "instructions": fits}})] == ["session.updated"]
