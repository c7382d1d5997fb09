"""The voice answer policy: sentence and word stops, cuts at a sentence boundary (never mid-word), the spoken
transcript equals what was released — on its own, in the built-in AR scheduler, on the remote path (which
must cancel its upstream when it stops), and end to end through the live server."""

from __future__ import annotations


import pytest

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.prompt.answer_policy import AnswerPolicy, count_words
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app
from omni_rt.engine.prompt.request import AnswerPolicyParams as P
from omni_rt.engine.prompt.request import parse_request
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send, wait_until

LONG = ("The capital of France is Paris. It is a big city on the Seine. It has the Eiffel Tower, which is tall. "
        "Many people visit it every year.")


def feed_all(text: str, params: P, reason: str = "stop", step: int = 3) -> tuple[str, list[str], AnswerPolicy]:
    """Stream ``text`` in ``step``-char deltas (like tokens); returns (spoken, released deltas, policy)."""
    pol, out = AnswerPolicy(params), []
    for i in range(0, len(text), step):
        delta, stop = pol.feed(text[i : i + step])
        out.append(delta)
        if stop:
            break
    else:
        out.append(pol.finish(reason))
    assert "".join(out) == pol.spoken
    return pol.spoken, [d for d in out if d], pol


@pytest.mark.parametrize("step", [1, 3, 7])
def test_sentence_stop(step):
    spoken, _, pol = feed_all(LONG, P(max_sentences=2), step=step)
    assert spoken == "The capital of France is Paris. It is a big city on the Seine."
    assert pol.cut and pol.sentences == 2


def test_word_stop_ends_before_the_sentence_that_would_overrun():
    spoken, _, pol = feed_all(LONG, P(max_words=14))
    assert spoken == "The capital of France is Paris. It is a big city on the Seine."  # 6 + 8 words
    spoken, _, _ = feed_all(LONG, P(max_words=13))
    assert spoken == "The capital of France is Paris."


def test_natural_end_is_kept_whole():
    spoken, _, pol = feed_all("Paris is the capital", P(max_sentences=2, max_words=40))
    assert spoken == "Paris is the capital" and not pol.cut


def test_length_cut_ends_at_a_sentence_boundary():
    spoken, _, pol = feed_all("The capital of France is Paris. It is a big city and", P(max_sentences=3), "length")
    assert spoken == "The capital of France is Paris." and pol.cut
    # a first sentence cut by max_tokens ends after its last whole word, with a period
    spoken, _, _ = feed_all("Red, orange and yellow are colo", P(), "length")
    assert spoken == "Red, orange and yellow are ."


def test_run_on_first_sentence_is_cut_after_whole_words():
    loop = "the rainbow has red and the other two colors, which is the most common color, and the other two " * 3
    spoken, _, pol = feed_all(loop, P(max_sentences=2, max_words=20))
    assert count_words(spoken) == 20 and spoken.endswith("the other two the .") and pol.cut


def test_released_text_never_ends_mid_word():
    text = "Cats sleep for about sixteen hours a day. Their whiskers help them feel their way in the dark."
    _, deltas, _ = feed_all(text, P(max_sentences=1), step=2)
    so_far = ""
    for d in deltas:
        so_far += d
        assert text.startswith(so_far)
        nxt = text[len(so_far) : len(so_far) + 1]
        assert not (so_far[-1].isalnum() and nxt.isalnum()), f"released mid-word: {so_far!r}"
    assert so_far == "Cats sleep for about sixteen hours a day."


def test_abbreviations_initials_and_list_numbers_do_not_end_sentences():
    text = "Dr. Smith met J. R. R. Tolkien at No. 5 Main St. in 1950. He liked it. Then he left."
    spoken, _, _ = feed_all(text, P(max_sentences=2))
    assert spoken == "Dr. Smith met J. R. R. Tolkien at No. 5 Main St. in 1950. He liked it."
    spoken, _, _ = feed_all("1. Red\n2. Blue\n3. Green", P(max_sentences=2))
    assert spoken == "1. Red\n2. Blue"


def test_request_field_parsing():
    default = P(max_sentences=2, max_words=40)
    assert parse_request({"prompt_ids": [1]}, 8, None, default).answer_policy == default
    assert parse_request({"prompt_ids": [1], "answer_policy": None}, 8, None, default).answer_policy == default
    assert parse_request({"prompt_ids": [1], "answer_policy": {"max_words": 80}}, 8, None, default).answer_policy == P(
        max_words=80)
    assert parse_request({"prompt_ids": [1]}, 8).answer_policy is None  # no preset policy: raw text
    for bad in ({"max_words": 0}, {"max_lines": 2}, "short", {"max_sentences": 1.5}):
        with pytest.raises(ValueError, match="answer_policy|max_"):
            parse_request({"prompt_ids": [1], "answer_policy": bad}, 8)


# ---------------------------------------------------------------- in the schedulers
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = weights.load_tokenizer(weights.ensure_smollm2())
    return build_tiny_model("llama", tmp_path_factory.mktemp("policy") / "llama", vocab_size=len(tok), tokenizer=tok)


MSGS = [{"role": "user", "content": "Say something."}]


def check_policy_result(got: dict, max_words: int) -> str:
    assert got["error"] is None, got["error"]
    res = got["result"]
    text = "".join(c.text for c in got["stream"])
    assert text == res["text"], "the result text must be exactly what was streamed (what the talker speaks)"
    assert res["finish_reason"] == "policy", res
    assert 1 <= count_words(text) <= max_words and text[-1] in ".!?", text
    return text


def test_ar_scheduler_applies_the_policy(model_dir):
    sched = create_ar_scheduler(str(model_dir), max_batch_size=2, answer_policy={"max_words": 5})
    sched.start()
    try:
        send(sched, "a", {"messages": MSGS, "max_tokens": 200, "ignore_eos": True})
        send(sched, "raw", {"messages": MSGS, "max_tokens": 30, "ignore_eos": True, "answer_policy": {}})
        out = collect(sched, ["a", "raw"])
        check_policy_result(out["a"], 5)
        assert out["raw"]["result"]["finish_reason"] == "length"  # {}: no limits, only the boundary rule
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()


def test_response_policy_for_the_session_layer():
    from omni_rt.engine.prompt.answer_policy import response_answer_policy

    assert response_answer_policy("inf") is None and response_answer_policy(None) is None
    assert parse_request({"prompt_ids": [1], "answer_policy": response_answer_policy(400)}, 8, None,
                         P(2, 40)).answer_policy == P()
