"""Backchannels vs interruptions over a heard answer (``omni_rt.stages.asr.interruption``) on the real ASR stage
(Silero + Whisper tiny.en), with Piper's speech paced in real time: "yeah", "okay", "mm hmm" and a cough-like
noise burst are dropped (no ``SpeechStarted``, no turn); "Wait, stop. What time is it?" and "No, I meant Paris"
barge in (``SpeechStarted`` with the original onset, then the turn as always). Without an answer being heard,
or with the filter off, every speech start is a barge-in at once."""

from __future__ import annotations

import numpy as np
import pytest

from omni_rt.audio.pcm import resample
from omni_rt.contracts.audio_in import AnswerStarted, ResponseDone
from omni_rt.stages.asr.interruption import (
    READING_MARGIN,
    AnswerPlayback,
    decide,
    heard,
    is_backchannel_word,
    listener_readings,
    words_of,
)
from asr_stage import SR, asr_stage, of, run_stream, turn_model  # noqa: F401 (asr_stage, turn_model: fixtures)

# "Mmm hmm.": Piper's espeak reads "Mm-hm." as letters ("em em aitch em"); this spelling is a hum
BACKCHANNELS = ("Yeah.", "Okay.", "Right.", "Sure.", "Yes.", "I see.", "Uh-huh.", "Mmm hmm.")
INTERRUPTIONS = ("Wait, stop. What time is it?", "No, I meant Paris.", "Stop.", "What is the capital of Italy?")


@pytest.fixture(scope="module")
def tts():
    from omni_rt.backends.tts_piper import PiperTTS

    return PiperTTS(noise_scale=0.0, noise_w_scale=0.0)  # the same audio every run


def clip(audio: np.ndarray, lead_ms: int = 300, tail_ms: int = 1200) -> np.ndarray:
    return np.concatenate([np.zeros(SR * lead_ms // 1000, np.float32), audio, np.zeros(SR * tail_ms // 1000, np.float32)])


def say(tts, text: str) -> np.ndarray:
    return clip(resample(tts.synthesize(text), tts.sample_rate, SR).astype(np.float32))


def _resonate(x: np.ndarray, freq: float, bandwidth: float) -> np.ndarray:
    """A two-pole resonator (a formant), sample by sample."""
    r, th = np.exp(-np.pi * bandwidth / SR), 2 * np.pi * freq / SR
    a1, a2, y1, y2 = 2 * r * np.cos(th), -r * r, 0.0, 0.0
    out = np.empty_like(x)
    for i, v in enumerate(x):
        y1, y2 = (1 - r) * v + a1 * y1 + a2 * y2, y1
        out[i] = y1
    return out


def cough(seed: int = 3) -> np.ndarray:
    """A cough-like sound: two 150 ms bursts of a 100 Hz glottal buzz and breath noise through three formants,
    sharp onset and decay, at speech level. Silero takes it for speech; Whisper writes no words."""
    rng = np.random.default_rng(seed)
    n = SR * 150 // 1000
    src = np.zeros(n)
    src[:: SR // 100] = 1.0
    y = src + 0.6 * rng.normal(0, 1, n)
    for freq, bw in ((700, 130), (1200, 150), (2600, 250)):
        y = _resonate(y, freq, bw)
    y *= np.minimum(1, np.linspace(0, 8, n)) * np.exp(-np.linspace(0, 3, n))
    burst = (0.3 * y / np.abs(y).max()).astype(np.float32)
    return clip(np.concatenate([burst, np.zeros(SR // 10, np.float32), 0.8 * burst]))


def over_answer(sched, sid: str, audio: np.ndarray, td: dict | None = None) -> list[dict]:
    """``audio`` spoken while an answer is being heard (its first audio just went out, it is still streaming);
    the events once something was heard, every held start has its verdict (dropped or barged in) and every turn
    its transcript."""
    def settled(events: list[dict]) -> bool:
        held, stops = len(of(events, "interruption.candidate")), len(of(events, "speech_stopped"))
        verdicts = len(of(events, "backchannel.dropped")) + len(of(events, "speech_started"))
        return max(held, stops) >= 1 and verdicts >= held and len(of(events, "transcript.final")) >= stops

    return run_stream(sched, sid, td if td is not None else {"type": "server_vad"}, audio, ops=(AnswerStarted(),),
                      settle_s=8.0, settled=settled)


# ---------------------------------------------------------------- the rule, on Whisper's text


def test_words_of_drops_tags_splits_hyphens_and_merges_repeats() -> None:
    assert words_of("Uh-huh.") == ["uh", "huh"]
    assert words_of("[coughing] (laughs) *sigh*") == []
    assert words_of("M. M. M. M.") == ["m"]
    assert words_of("Fair enough. Fair enough. Fair enough.") == ["fair", "enough"]  # a decode's loop
    assert words_of("sounds good sounds good sounds") == ["sounds", "good", "sounds"]
    assert all(is_backchannel_word(w) for w in ("mmmm", "hmm", "mhm", "uhh", "haha", "okay", "yeah"))
    assert not any(is_backchannel_word(w) for w in ("no", "wait", "stop", "what", "him", "and"))
    assert words_of("Wait, stop. What time is it?") == ["wait", "stop", "what", "time", "is", "it"]


def test_decide() -> None:
    assert decide("Yeah.", 400, paused=True) == "backchannel"
    assert decide("Yeah.", 400, paused=False) == "undecided"  # "yeah, but ..." may follow
    assert decide("", 300, paused=True) == "backchannel"  # a cough: no words
    assert decide(None, 300, paused=True) == "undecided"  # no decode back yet
    assert decide("wait", 300, paused=False) == "interruption"  # the first non-backchannel word decides at once
    assert decide("No", 300, paused=True) == "interruption"
    assert decide("Okay.", 1500, paused=True) == "interruption"  # too long for a backchannel
    assert decide("yeah yeah okay right sure I see", 900, paused=True) == "interruption"  # too many words
    # while the speech goes on, the last (cut) word after a backchannel word decides nothing yet
    assert decide("Oh, oak", 300, paused=False) == "undecided"
    assert decide("Oh, oak", 500, paused=True) == "interruption"
    assert decide("Yeah, but wait", 500, paused=False) == "interruption"
    # a first word cut mid-way that begins a backchannel word waits for more; heard whole at the pause, it decides
    assert decide("Exact.", 300, paused=False) == "undecided"
    assert decide("Exact.", 500, paused=True) == "interruption"
    assert decide("Wait", 300, paused=False) == "interruption" and decide("No", 300, paused=False) == "interruption"


def test_decide_with_confirmed_looks() -> None:
    """``confirm``: a word outside the lexicon that is the look's last decides only once the look before heard it
    too (or its start), so one misread look ("Sure, sure" heard "Church") decides nothing; at the pause the whole
    speech's look decides."""
    assert decide("Church", 300, paused=False, confirm=True) == "undecided"  # a first look alone
    assert decide("Sure, sure.", 500, paused=False, earlier="Church", confirm=True) == "undecided"
    assert decide("Church", 500, paused=False, earlier="Sure.", confirm=True) == "undecided"  # the looks disagree
    assert decide("Wait, stop.", 400, paused=False, earlier="Wait.", confirm=True) == "interruption"
    assert decide("Actually, tell", 400, paused=False, earlier="Actu", confirm=True) == "interruption"  # cut before
    assert decide("Oh, no wait", 400, paused=False, earlier="Oh, no", confirm=True) == "interruption"
    # a word after it says the look heard it in context: decided at once ("Can you", "go back")
    assert decide("Can you", 200, paused=False, confirm=True) == "interruption"
    assert decide("Oh, oak", 300, paused=False, confirm=True) == "undecided"  # a cut word after a lexicon word
    assert decide("Church", 500, paused=True, confirm=True) == "interruption"  # at the pause: its last look decides
    assert decide("Sure, sure.", 500, paused=True, earlier="Church", confirm=True) == "backchannel"


def test_words_after_a_hum_need_two_looks() -> None:
    """tiny.en goes on from a cut hum into invented words ("Mmm." read "M in that.", "Em in."): a word outside the
    lexicon after nothing but hums is in doubt like a lone one; a real "Mm, wait, stop" is decided a look later."""
    assert decide("M in that.", 400, paused=False, earlier="Emmina.", confirm=True) == "undecided"
    assert decide("Em in.", 300, paused=False, confirm=True) == "undecided"
    assert decide("Mm, wait, stop", 400, paused=False, earlier="Mm, wait", confirm=True) == "interruption"
    assert decide("MMM.", 500, paused=True, earlier="M in that.", confirm=True) == "backchannel"
    assert decide("Hmm, wait a", 300, paused=False, confirm=True) == "undecided"
    # not after an open-mouth filler or a lexicon word, which tiny.en reads reliably
    assert decide("Oh, wait a", 300, paused=False, confirm=True) == "interruption"
    assert decide("Yeah, but why", 300, paused=False, confirm=True) == "interruption"


def test_listener_phrases_count_only_whole() -> None:
    """Words a listener says only together ("fair enough", "of course", "I see", "thank you") are a backchannel
    whole; a piece alone, or a phrase's first word followed by something else, is a turn ("Enough.", "Course.",
    "Thanks, that's all.")."""
    for text in ("Fair enough.", "Of course.", "Yeah, I see.", "Makes sense.", "Thank you.", "Sounds good.",
                 "Gotcha.", "Oh, really?", "Absolutely.", "All right.", "Hmm, interesting.", "Okay, thanks."):
        assert decide(text, 600, paused=True) == "backchannel", text
    for text in ("Enough.", "Course.", "Of.", "Sense.", "Thanks, that's all.", "Good, now the weather.", "Sure, but when?",
                 "Mm, no.", "That's wrong.", "Thank God.", "I have a question."):
        assert decide(text, 600, paused=True) == "interruption", text
    # while the speech goes on, a phrase being said is not yet a turn; one the cut word does not go on with is
    assert decide("Fair en", 300, paused=False) == "undecided"
    assert decide("Fair", 300, paused=False) == "undecided"
    assert decide("Yeah, I s", 400, paused=False) == "undecided"
    assert decide("Thanks, that's all", 500, paused=False) == "interruption"
    # ... in doubt when a cut word is all that says so: two looks must agree on that word
    assert decide("Fair in", 400, paused=False, confirm=True) == "undecided"
    assert decide("Fair in", 500, paused=False, earlier="Fair", confirm=True) == "undecided"
    assert decide("Fair in the", 600, paused=False, earlier="Fair in", confirm=True) == "interruption"
    assert decide("Thanks, that's all", 600, paused=False, confirm=True) == "interruption"  # a word after "that's"


def test_listener_readings_keep_the_listener_words_heard_first() -> None:
    """A look that heard a word outside the lexicon is weighed against listener responses: after the listener words
    it heard before that word (in Whisper's spelling), and alone; nothing to weigh when all are listener words or
    the text is a turn's."""
    after_oh = listener_readings("Oh, write")
    assert "Oh, right." in after_oh and "Right." in after_oh and "Oh, okay." in after_oh
    assert "Sure." in listener_readings("Church.") and "Uh-huh." in listener_readings("I have")
    assert "Okay. Yeah." in listener_readings("Okay. Trim")
    assert listener_readings("Yeah, right.") == [] and listener_readings("") == []
    assert listener_readings("Wait, stop. What time is it? Tell me now") == []


def test_a_close_listener_reading_is_what_the_look_heard() -> None:
    """``heard``: the reading replaces the text only when Whisper finds it at most ``READING_MARGIN`` less likely;
    the verdict then follows from the reading."""
    assert heard("Trim", ("True.", READING_MARGIN - 0.1)) == "True."
    assert heard("Wait.", ("Right.", READING_MARGIN + 0.1)) == "Wait."
    assert heard("Wait.", None) == "Wait."
    assert heard("Trim", ("True.", 1.0), margin=0.5) == "Trim"  # an operator's lower margin
    assert decide(heard("Church.", ("Sure.", 0.4)), 400, paused=True) == "backchannel"
    assert decide(heard("Church.", ("Sure.", 3.0)), 400, paused=True) == "interruption"


def test_answer_playback_clock() -> None:
    p = AnswerPlayback()
    assert not p.audible(0)
    p.started(100)
    assert p.audible(10_000)  # still streaming: heard until it is done
    p.done(200, audio_samples=1000, played=True)
    assert p.audible(1099) and not p.audible(1100)  # heard until all its audio has played
    p.started(2000)
    p.done(2100, audio_samples=5000, played=False)  # cut short: heard no more
    assert not p.audible(2100)


# ---------------------------------------------------------------- the real stage, real speech


@pytest.mark.parametrize("text", BACKCHANNELS)
@pytest.mark.integration  # the real ASR stage hears seconds of speech in real time
def test_backchannel_over_answer_is_dropped(asr_stage, tts, text: str) -> None:
    events = over_answer(asr_stage, f"bc-{text}", say(tts, text))
    kinds = [e["type"] for e in events]
    dropped = of(events, "backchannel.dropped")
    print(f"\n{text!r}: {kinds} {dropped}")
    assert of(events, "interruption.candidate"), kinds
    assert not of(events, "speech_started") and not of(events, "committed"), (text, events)
    assert len(dropped) == 1, kinds


@pytest.mark.integration  # the real ASR stage hears seconds of speech in real time
def test_cough_over_answer_starts_no_turn(asr_stage) -> None:
    events = over_answer(asr_stage, "bc-cough", cough())
    print(f"\ncough: {[e['type'] for e in events]} {of(events, 'backchannel.dropped')}")
    assert not of(events, "speech_started") and not of(events, "committed"), events
    assert of(events, "interruption.candidate"), "Silero did not take the burst for speech: the test tests nothing"
    assert len(of(events, "backchannel.dropped")) == len(of(events, "interruption.candidate"))


@pytest.mark.parametrize("text", INTERRUPTIONS)
@pytest.mark.integration  # the real ASR stage hears seconds of speech in real time
def test_interruption_over_answer_barges_in(asr_stage, tts, text: str) -> None:
    events = over_answer(asr_stage, f"int-{text}", say(tts, text))
    kinds = [e["type"] for e in events]
    cand, started = of(events, "interruption.candidate"), of(events, "speech_started")
    print(f"\n{text!r}: decided after {started[0]['decision_ms'] if started else None} ms; {kinds}")
    assert len(cand) == 1 and len(started) == 1 and not of(events, "backchannel.dropped"), kinds
    assert started[0]["audio_start_ms"] == cand[0]["audio_start_ms"]  # the held start keeps its onset
    assert kinds.index("interruption.candidate") < kinds.index("speech_started") < kinds.index("speech_stopped") < kinds.index("committed")
    assert started[0]["decision_ms"] <= 1200
    final = of(events, "transcript.final")
    assert len(final) == 1 and final[0]["text"].split()[0].strip(",.").lower() == text.split()[0].strip(",.").lower(), final


@pytest.mark.integration  # the real ASR stage hears seconds of speech in real time
def test_without_a_heard_answer_speech_barges_in_at_once(asr_stage, tts) -> None:
    """No answer heard (or its audio has played): "yeah" is a turn like any other, its start sent at once."""
    events = run_stream(asr_stage, "bc-idle", {"type": "server_vad"}, say(tts, "Yeah."), settle_s=8.0)
    assert len(of(events, "speech_started")) == 1 and of(events, "speech_started")[0]["decision_ms"] is None
    assert not of(events, "interruption.candidate")
    played = run_stream(asr_stage, "bc-played", {"type": "server_vad"}, say(tts, "Yeah."), settle_s=8.0,
                        ops=(AnswerStarted(), ResponseDone(audio_ms=100.0)))  # a 100 ms answer, long over by then
    assert len(of(played, "speech_started")) == 1 and not of(played, "interruption.candidate")


@pytest.mark.integration  # the real ASR stage hears seconds of speech in real time
def test_filter_off_every_start_barges_in(asr_stage, tts) -> None:
    asr_stage.backchannel_filter = False
    try:
        events = over_answer(asr_stage, "bc-off", say(tts, "Yeah."))
    finally:
        asr_stage.backchannel_filter = True
    assert len(of(events, "speech_started")) == 1 and not of(events, "interruption.candidate"), events


def test_preset_field_must_be_a_bool() -> None:
    from omni_rt.stages.asr.factory import create_asr_stage

    with pytest.raises(ValueError, match="stage 'asr' field 'backchannel_filter'"):
        create_asr_stage(backchannel_filter="off")


@pytest.mark.integration  # the real ASR stage hears seconds of speech in real time
def test_semantic_vad_backchannel_dropped_and_interruption_ends_its_turn(asr_stage, tts) -> None:
    """The client's semantic_vad is unchanged: "Yeah." is dropped, and an interruption's turn ends by its verdict."""
    td = {"type": "semantic_vad", "eagerness": "high"}
    events = over_answer(asr_stage, "sem-bc", say(tts, "Yeah."), td=td)
    assert of(events, "backchannel.dropped") and not of(events, "speech_started") and not of(events, "committed"), events
    events = over_answer(asr_stage, "sem-int", say(tts, "What is the capital of Italy?"), td=td)
    kinds = [e["type"] for e in events]
    assert len(of(events, "speech_started")) == 1 and len(of(events, "committed")) == 1, kinds
    assert "italy" in of(events, "transcript.final")[0]["text"].lower(), events
