"""``AnswerPace``: when an answer's text is far enough ahead of its playback to step out of the batch."""

from __future__ import annotations

from omni_rt.contracts.rates import SPEECH_S_PER_WORD
from omni_rt.engine.llama_cpp.decode_pacing import LEG_MIN_TOKENS, RESUME_AHEAD_S, AnswerPace


def _pace_with(words: int, t0: float = 100.0) -> AnswerPace:
    """``words`` words, the last one closing a clause."""
    pace = AnswerPace(ahead_s=1.0)
    for i in range(words):
        pace.feed(("" if i == 0 else " ") + f"word{i}" + ("." if i == words - 1 else ""), now=t0)
    return pace


def test_the_lead_is_speech_decoded_minus_time_since_the_first_word():
    pace = _pace_with(10)
    assert pace.lead_s(now=100.0) == 10 * SPEECH_S_PER_WORD
    assert abs(pace.lead_s(now=101.0) - (10 * SPEECH_S_PER_WORD - 1.0)) < 1e-9
    assert AnswerPace(ahead_s=1.0).lead_s(now=5.0) == 0.0  # no text yet: no lead


def test_only_whole_clauses_count_the_talker_cannot_speak_half_a_clause():
    pace = AnswerPace(ahead_s=1.0)
    for piece in ["The", " capital", " of", " France"]:
        pace.feed(piece, now=100.0)
    assert pace.lead_s(now=100.0) == 0.0
    pace.feed(" is", now=100.0)
    pace.feed(" Paris,", now=100.0)
    pace.feed(" a", now=100.0)
    assert pace.lead_s(now=100.0) == 6 * SPEECH_S_PER_WORD
    assert AnswerPace(ahead_s=1.0).lead_s(now=100.0) == 0.0
    pace = AnswerPace(ahead_s=1.0)
    pace.feed("It costs 3.5 dollars", now=100.0)  # a decimal point ends no clause
    assert pace.lead_s(now=100.0) == 0.0


def test_steps_out_only_when_ahead_and_another_answer_is_starting():
    pace = _pace_with(10)  # 3 s of speech at t=100
    assert not pace.may_step_out(False, now=100.5)  # nobody waiting
    assert pace.may_step_out(True, now=100.5)  # 2.5 s ahead
    assert not pace.may_step_out(True, now=102.5)  # 0.5 s ahead: needs its text soon
    assert abs(pace.pause_cap_s(now=100.5) - (2.5 - RESUME_AHEAD_S)) < 1e-9
    assert pace.pause_cap_s(now=110.0) == 0.0


def test_a_resumed_answer_decodes_a_few_tokens_before_stepping_out_again():
    pace = _pace_with(10)
    pace.resumed()
    assert pace.pauses == 1 and not pace.may_step_out(True, now=100.1)
    for i in range(LEG_MIN_TOKENS):
        pace.feed(f" more{i}", now=100.1)
    assert pace.may_step_out(True, now=100.1)
    assert pace.tokens == 10 + LEG_MIN_TOKENS  # every leg's tokens: the budget left for the next leg
