"""Conversations that hold together (issue #50): loop and copy control on every engine, the user's facts pinned
in the history window, tool results given as speakable words, the answer's language held.

No model here: the stream guard, the llama.cpp fields, the history window and the tool rendering on their own.
Each control with the real packaged SmolLM2 on every engine: tests/integration/test_conversation_hold_live.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from omni_rt.engine.prompt.history import HistoryWindow, recall_hints
from omni_rt.engine.streamed.remote import request_body
from omni_rt.engine.prompt.repetition import LLAMA_CPP_PENALTY_KEYS, RepeatGuard, copy_retry, earlier_answers, llama_cpp_fields
from omni_rt.engine.prompt.request import GenRequest, SamplingParams, parse_request
from omni_rt.engine.tools.prompt import _for_own, speakable

PRESET_SAMPLING = {"repetition_penalty": 1.2, "no_repeat_ngram_size": 4}


def _words(text: str) -> list[str]:
    from omni_rt.engine.prompt.repetition import words_of

    return words_of(text)


def _tokenizer():
    from omni_rt.engine.weights.loader import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2"))


def _max_4gram(text: str) -> int:
    w = _words(text)
    return max(Counter(tuple(w[i:i + 4]) for i in range(len(w) - 3)).values(), default=0)


# ============================================================================ unit: no model
def test_llama_cpp_gets_the_presets_repetition_controls_in_its_own_names():
    s = SamplingParams(repetition_penalty=1.2, no_repeat_ngram_size=4, presence_penalty=0.3)
    fields = llama_cpp_fields(s)
    assert fields["repeat_penalty"] == 1.2 and fields["repeat_last_n"] > 0
    assert not [k for k in fields if k.startswith("dry_")]  # the n-gram ban is the stream guard's (RepeatGuard)
    assert fields["presence_penalty"] == 0.3
    req = parse_request({"messages": [{"role": "user", "content": "hi"}]}, 32, PRESET_SAMPLING)
    body = request_body(req, "m", "llama.cpp")
    assert body["repeat_penalty"] == 1.2 and body["repeat_last_n"] > 0 and "repetition_penalty" not in body
    # an OpenAI-compatible upstream: its own names; the n-gram ban (no API equivalent) is enforced on the stream
    body = request_body(req, "m", "openai")
    assert body["repetition_penalty"] == 1.2 and not set(LLAMA_CPP_PENALTY_KEYS) & set(body)
    assert llama_cpp_fields(SamplingParams()) == {}  # nothing set, nothing sent


def test_an_upstream_without_the_setting_refuses_it_at_start_up_naming_stage_and_field():
    from omni_rt.engine.streamed.remote import RemoteThinker

    with pytest.raises(ValueError, match="stage 'thinker' field 'sampling.repetition_penalty'"):
        RemoteThinker("https://api.openai.com/v1", name="thinker", sampling={"repetition_penalty": 1.2})
    RemoteThinker("https://api.openai.com/v1", name="thinker", sampling={"no_repeat_ngram_size": 4})  # the guard


def test_guard_stops_a_loop_before_a_4gram_comes_twice():
    g = RepeatGuard(4)
    out, stopped = [], False
    for word in "Das kann, konkledi, konkledi, konkledi, konkledi, konkledi, konkledi, konkledi".split(" "):
        text, stopped = g.feed(word + " ")
        out.append(text)
        if stopped:
            break
    assert stopped and g.reason == "loop"
    assert _max_4gram("".join(out)) < 2, out


def test_guard_holds_a_copy_of_an_earlier_answer_and_drops_it():
    earlier = earlier_answers([{"role": "user", "content": "Opposite of loud?"},
                               {"role": "assistant", "content": "The opposite of loud is soft."}])
    g = RepeatGuard(4, earlier)
    released = "".join(g.feed(d)[0] for d in ["The", " opposite", " of", " loud", " is", " soft", "."]) + g.finish()
    assert released == "" and g.reason == "copy"
    # diverging from it releases everything at once
    g = RepeatGuard(4, earlier)
    released = "".join(g.feed(d)[0] for d in ["The", " opposite", " of", " hot", " is", " cold", "."]) + g.finish()
    assert released == "The opposite of hot is cold." and g.reason is None
    retry = copy_retry(GenRequest(None, [{"role": "user", "content": "x"}], 10), RepeatGuard(0), 0, "")
    assert retry is None  # nothing stopped: no retry


def test_guard_catches_an_answer_in_another_language_before_it_is_spoken():
    g = RepeatGuard(4, [], ("en",))
    assert g.feed("Eu")[0] == "" and g.feed(" nao")[1] and g.reason == "language"
    req = GenRequest(None, [{"role": "user", "content": "Hi! My name is Ana and I live in Lisbon."}], 10)
    retry = copy_retry(req, g, 0, "")
    assert retry.messages[-1]["content"].endswith("\nEnglish answer:")
    g = RepeatGuard(4, [], ("en",))
    assert g.feed("The ")[0] == "The "  # an English first word is let through at once (no latency)


def test_a_question_about_the_user_carries_their_earlier_facts_and_keeps_the_prefix():
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi! My name is Ana and I live in Lisbon."},
            {"role": "assistant", "content": "Nice to meet you."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "What is my name?"}]
    out = recall_hints(chat, 64, lambda t: len(t) // 4)
    assert out[-1]["content"] == 'Earlier I said: "Hi! My name is Ana and I live in Lisbon."\nWhat is my name?'
    assert out[:-1] == chat[:-1]  # questions not about the user, and statements, are left as they are
    # a later turn renders every earlier message the same way: the cached prefix still matches
    later = recall_hints(chat + [{"role": "assistant", "content": "Ana."}, {"role": "user", "content": "Thanks!"}], 64,
                         lambda t: len(t) // 4)
    assert later[: len(out)] == out


def test_the_window_keeps_the_users_facts_after_the_trim_bounded_by_tokens():
    tok = _tokenizer()
    w = HistoryWindow(tok, 1024, conversation_tokens=96)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! My name is Ana and I live in Lisbon."}]
    for i in range(12):
        chat += [{"role": "assistant", "content": f"Answer number {i} is a fairly long sentence about nothing much."},
                 {"role": "user", "content": f"Question number {i} about something else entirely?"}]
    chat[-1] = {"role": "user", "content": "Which city do I live in?"}
    kept, ids = w.fit("s", chat, 900)
    assert chat[1] not in kept  # the first turn itself was trimmed ...
    assert "Lisbon" in kept[-1]["content"]  # ... but its facts ride with the question that asks for them
    assert len(ids) <= 8 + 96 + w.cost(kept[0], 900) + w.cost(kept[-1], 900) + 16


def test_speakable_tool_output_and_no_call_markup_in_the_prompt():
    assert speakable(json.dumps({"order_id": "42", "status": "shipped", "ok": True})) == "order id: 42; status: shipped; ok: yes"
    assert speakable("not json") == "not json"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, I'm Sofia."},
            {"role": "assistant", "content": "Hello Sofia!"},
            {"role": "user", "content": "Can you check my order 42?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_order_status", "arguments": '{"order_id": "42"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'}]
    out = _for_own(msgs, None)
    assert all("<tool_call>" not in m["content"] for m in out)
    assert out[-1]["role"] == "user" and "status: shipped" in out[-1]["content"]
    assert "Can you check my order 42?" in out[-1]["content"] and "{" not in out[-1]["content"]
    # the answer to the result sees the instructions, the question and the result only
    assert [m["role"] for m in out] == ["system", "user", "user"] and "Sofia" not in str(out)
