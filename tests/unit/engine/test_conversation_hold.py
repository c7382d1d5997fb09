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
from omni_rt.engine.tools.prompt import speakable, speakable_tool_messages

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
    # an engine that can continue the answer goes on from there without the word that repeated the 4-gram
    said, banned = g.fork()
    assert said == "".join(out) and banned == ["konkledi"] and g.reason is None


def _released(guard: RepeatGuard | None, deltas: list[str]) -> list[str]:
    """What the answer policy releases (what the talker gets) after each of ``deltas``, passed through ``guard``
    first (None: no guard), until either stops."""
    from omni_rt.engine.prompt.answer_policy import AnswerPolicy
    from omni_rt.engine.prompt.request import parse_answer_policy

    policy = AnswerPolicy(parse_answer_policy({"max_sentences": 2, "max_words": 35}))
    out = []
    for d in deltas:
        passed, stop = guard.feed(d) if guard is not None else (d, False)
        released, done = policy.feed(passed)
        out.append(released)
        if stop or done:
            break
    return out


def test_guard_lets_a_copy_go_on_past_its_end_and_holds_nothing_back():
    earlier = earlier_answers([{"role": "user", "content": "Opposite of loud?"},
                               {"role": "assistant", "content": "The opposite of loud is soft."}])
    deltas = ["The", " opposite", " of", " loud", " is", " soft", "."]
    # every word reaches the talker exactly when it would with no guard at all; only the ending is not passed on
    assert _released(RepeatGuard(4, earlier), deltas)[:6] == _released(None, deltas)[:6]
    g = RepeatGuard(4, earlier)
    assert "".join(g.feed(d)[0] for d in deltas) == "The opposite of loud is soft" and g.reason == "copy"
    # the fork goes on after its last word (the fact stays): the engine bans the ending for one token
    said, banned = g.fork()
    assert (said, banned) == ("The opposite of loud is soft", [])
    assert g.reason is None and "".join(g.feed(d)[0] for d in [",", " or", " quiet", "."]) + g.finish() == ", or quiet."
    # a copy that ends the stream without a full stop is caught at its last word too, which is passed on
    g = RepeatGuard(4, earlier)
    assert "".join(g.feed(d)[0] for d in deltas[:6]) + g.finish() == "The opposite of loud is soft" and g.reason == "copy"
    assert g.fork() == ("The opposite of loud is soft", [])
    # diverging from it passes everything on
    g = RepeatGuard(4, earlier)
    released = "".join(g.feed(d)[0] for d in ["The", " opposite", " of", " hot", " is", " cold", "."]) + g.finish()
    assert released == "The opposite of hot is cold." and g.reason is None
    # an answer that says an earlier (cut) answer's words and goes on is no copy: "... not a credit ." then
    # "... not a credit card." (the ending is held only until the answer shows it goes on)
    cut = earlier_answers([{"role": "assistant", "content": "Your order number is not a credit ."}])
    g = RepeatGuard(4, cut)
    deltas = ["Your", " order", " number", " is", " not", " a", " credit", " card", "."]
    assert "".join(g.feed(d)[0] for d in deltas) + g.finish() == "Your order number is not a credit card."
    assert g.reason is None
    g = RepeatGuard(4, cut)
    assert "".join(g.feed(d)[0] for d in deltas[:7] + [" ", "."]) == "Your order number is not a credit" and g.reason == "copy"


def test_a_copy_cut_at_the_word_cap_changes_its_last_word():
    """An answer the policy cuts at its word cap ends after that word whatever follows: the same cut a second time
    would be a copy, so there the word that completes it is banned instead (the text before it goes on)."""
    cut = earlier_answers([{"role": "assistant", "content": "Sofia, your order number is 42, and you may ."}])
    g = RepeatGuard(4, cut, cap=9)
    passed = ""
    for d in ["Sofia", ",", " your", " order", " number", " is", " 42", ",", " and", " you", " may", " also"]:
        out, stop = g.feed(d)
        passed += out
        if stop:
            break
    assert g.reason == "copy" and g.at_cap and passed == "Sofia, your order number is 42, and you "
    assert g.fork() == ("Sofia, your order number is 42, and you ", ["may"])
    # under the cap the same words going on are no copy
    g = RepeatGuard(4, cut, cap=35)
    assert "".join(g.feed(d)[0] for d in [" Sofia", ",", " your", " order", " number", " is", " 42", ",", " and", " you", " may", " also", " "])
    assert g.reason is None


def test_a_copy_goes_on_and_may_not_become_a_longer_earlier_answer():
    """The copy of a short earlier answer goes on from all its words; the next word of a longer earlier answer
    that starts the same way is banned there, so the continuation is not that answer's copy either."""
    earlier = earlier_answers([{"role": "assistant", "content": "Hello! My name is Ana."},
                               {"role": "assistant", "content": "Hello! My name is Ana and I live in Lisbon."}])
    g = RepeatGuard(4, earlier)
    for d in ["Hello", "!", " My", " name", " is", " Ana", "."]:
        passed, stop = g.feed(d)
        if stop:
            break
    assert g.reason == "copy" and g.fork() == ("Hello! My name is Ana", ["and"])


def test_an_engine_that_cannot_fork_holds_a_copy_and_drops_it():
    earlier = earlier_answers([{"role": "user", "content": "Opposite of loud?"},
                               {"role": "assistant", "content": "The opposite of loud is soft."}])
    g = RepeatGuard(4, earlier, hold_copies=True)
    released = "".join(g.feed(d)[0] for d in ["The", " opposite", " of", " loud", " is", " soft", "."]) + g.finish()
    assert released == "" and g.reason == "copy"
    retry = copy_retry(GenRequest(None, [{"role": "user", "content": "x"}], 10), RepeatGuard(0), 0, "")
    assert retry is None  # nothing stopped: no retry


def test_guard_catches_an_answer_in_another_language_before_it_is_spoken():
    g = RepeatGuard(4, [], ("en",))
    assert _released(g, ["Eu", " nao", " Ana", ","]) == ["", ""] and g.reason == "language"
    req = GenRequest(None, [{"role": "user", "content": "Hi! My name is Ana and I live in Lisbon."}], 10)
    retry = copy_retry(req, g, 0, "")
    assert retry.messages[-1]["content"].endswith("\nEnglish answer:")
    # once the answer is being spoken, a word of another language is not passed on: the answer forks before it
    g = RepeatGuard(4, [], ("en",))
    assert "".join(g.feed(d)[0] for d in ["Lisbon", ",", " also", " known", " como", " a"]) == "Lisbon, also known "
    assert g.reason == "language" and g.fork() == ("Lisbon, also known ", ["como"])
    # nothing held: an English answer, or one whose first words say no language, reaches the talker as with no guard
    for first in (["The", " capital", " of"], ["Plants", " make", " their"], ["William", " Shakespeare", " wrote"]):
        assert _released(RepeatGuard(4, [], ("en",)), first) == _released(None, first)


def test_an_elided_first_word_is_heard_as_another_language():
    """SmolLM2-135M opens some answers with a French or Italian elision ("L'Alma: Paris, France" for the capital
    of France under a client's own instructions): the guard holds "L'" until the word is whole, and an elided
    article is French or Italian, while English apostrophes ("It's", "L'Aquila" among English words) stay English."""
    from omni_rt.engine.prompt.language import guess_language

    assert [guess_language(t) for t in ("L'Alma: Paris", "D'avoir bonjour", "dell'arte", "Ao lado")] == ["fr", "fr", "it", "pt"]
    assert all(guess_language(t) in (None, "en") for t in ("It's Paris.", "I'm sure.", "Let's go to L'Aquila."))
    g = RepeatGuard(4, [], ("en",))
    assert _released(g, ["L'", "Al", "ma", ":"]) == ["", "", "", ""] and g.reason == "language"
    english = ["It", "'s", " the", " capital", " of"]
    assert _released(RepeatGuard(4, [], ("en",)), english) == _released(None, english)  # nothing held longer
    # a Portuguese interjection opener ("Nossa mesaura! I am Ana", under a client's "Be brief.") is caught at it
    g = RepeatGuard(4, [], ("en",))
    assert _released(g, ["N", "ossa", " mes", "aura", "!"]) == ["", "", ""] and g.reason == "language"  # stopped


def test_a_question_about_the_user_carries_their_earlier_facts_and_keeps_the_prefix():
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi! My name is Ana and I live in Lisbon."},
            {"role": "assistant", "content": "Nice to meet you."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "What is my name?"}]
    out = recall_hints(chat, 64, lambda t: len(t) // 4)
    assert out[-1]["content"] == 'Earlier I said: "Hi! My name is Ana and I live in Lisbon."\nWhat is my name?'
    # the words heard so far (a prefill hint's) get the same hint: the prompt it warms is the question's prefix
    heard = recall_hints(chat[:-1] + [{"role": "user", "content": "What is my name"}], 64, lambda t: len(t) // 4)
    assert out[-1]["content"].startswith(heard[-1]["content"])
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


def test_speakable_tool_output_for_a_remote_upstream():
    """``speakable`` renders a JSON tool output as words for an upstream's own chat template (remote engines).
    The built-in template path (``_for_own``) keeps its earlier wording: the cut-down, words-only variant lost
    the Agents SDK and background-tool flows' results (the answer ignored them) and is not used."""
    assert speakable(json.dumps({"order_id": "42", "status": "shipped", "ok": True})) == "order id: 42; status: shipped; ok: yes"
    assert speakable("not json") == "not json"
    msgs = [{"role": "user", "content": "Can you check my order 42?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_order_status", "arguments": '{"order_id": "42"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'}]
    out = speakable_tool_messages(msgs)
    assert out[-1]["content"] == "status: shipped" and out[:2] == msgs[:2]
