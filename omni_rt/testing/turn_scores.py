"""Score the labelled end-of-turn set (``omni_rt.testing.turn_set``) at the stage level, without a server.

Each spoken item is fed through Silero in 20 ms chunks, as the ASR stage is; at every pause that reaches
``SCORE_AFTER_MS`` of silence the turn audio the stage would hold then (prefix padding + speech + the pause so
far) is scored by Smart Turn and transcribed by Whisper, exactly the two inputs of the stage's verdict. What the
verdict then does (``omni_rt.stages.asr.turn_rule``) is pure arithmetic on these records, so tests and the
bench can assert rates per eagerness without 100 server round trips. The printed table: ``python -m latency_bench
turns --stage-level``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from omni_rt.stages.asr import turn_rule as tdm
from omni_rt.testing.turn_set import SR, Spoken

CHUNK = SR // 50


@dataclass(frozen=True)
class PauseScore:
    """One pause the stage would score. ``final``: after the last word (the turn should end here); otherwise a
    pause inside the utterance (the turn must stay open), ``lasts_ms`` long before speech resumed."""

    key: str  # "<variant>/<text>"
    kind: str  # the item's kind: complete | hesitant
    shape: str
    final: bool
    hesitation: bool  # the pause we inserted after a hesitant fragment (not a comma pause inside a part)
    lasts_ms: float  # silence until speech resumed (final: the tail, as heard)
    speech_end_ms: float  # end of the item's last word, from the start of the clip
    pause_at_ms: float  # stream time when the pause reached SCORE_AFTER_MS
    audio_prob: float
    text: str
    score_ms: float
    decode_ms: float
    last_word_prob: float | None = None  # Whisper's probability of the transcript's last word
    second_prob: float | None = None  # Smart Turn at SECOND_LOOK_MS of silence (None: the pause was shorter)

    @property
    def words(self) -> str:
        return tdm.words_cue(self.text, self.last_word_prob)

    def end_silence_ms(self, eager: tdm.Eagerness, words: bool = True, confidence: bool = True, second: bool = True) -> int:
        """The silence after which the stage ends the turn at this pause (``words=False``: Smart Turn alone;
        ``confidence=False``: the words without Whisper's last-word probability; ``second=False``: no second look)."""
        lwp = self.last_word_prob if confidence else None
        cue = tdm.words_cue(self.text, lwp) if words else "empty"
        looked = second and eager.wants_second_look(self.audio_prob, cue, lwp)  # as the stage: only when it asks
        return eager.end_silence_ms(self.audio_prob, cue, self.second_prob if looked else None)


def _pauses(sp: Spoken, vad_model: Any, score_from_sound_end: bool = True) -> Iterable[tuple[np.ndarray, float, float, int, bool]]:
    """(turn audio at the score point, stream ms there, silence ms before speech resumed, the sample where the
    silence reached SECOND_LOOK_MS or -1, whether it is the final pause: no speech after it) per pause. As the
    stage (``tdm.TurnDetection``): the score point is
    SCORE_AFTER_MS after the sound ended, the pause's length (what the verdict's silences are held against) and
    the second look count from Silero's frames; ``score_from_sound_end=False``: the score point from Silero's
    frames too (the earlier rule, kept to compare against)."""
    from omni_rt.backends.vad import StreamingVAD

    vad = StreamingVAD(vad_model, threshold=tdm.SEMANTIC_THRESHOLD, prefix_padding_ms=tdm.SEMANTIC_PREFIX_PADDING_MS,
                       silence_duration_ms=10 ** 6, silence_from_sound_end=False)

    def clock() -> float:
        return vad.sound_silence_ms if score_from_sound_end else vad.silence_ms

    turn_from: int | None = None
    pending: tuple[np.ndarray, float] | None = None
    look_at = -1
    pos = 0
    while pos < sp.audio.size:
        chunk = sp.audio[pos : pos + CHUNK]
        silent_before, clock_before = vad.silence_ms, clock()
        for ev in vad.feed(chunk):
            if ev.kind == "speech_started" and turn_from is None:
                turn_from = int(ev.audio_ms * SR / 1000)
        pos += chunk.size
        if not vad.in_speech:
            continue
        if vad.silence_ms < silent_before and pending is not None:  # speech resumed after a scored pause
            yield pending[0], pending[1], silent_before, look_at, False
            pending, look_at = None, -1
        if pending is None and clock() >= tdm.SCORE_AFTER_MS and clock_before < tdm.SCORE_AFTER_MS:
            pending = (sp.audio[turn_from or 0 : pos].copy(), 1000 * pos / SR)
        if pending is not None and look_at < 0 and vad.silence_ms >= tdm.SECOND_LOOK_MS:
            look_at = pos
    if pending is not None:
        yield pending[0], pending[1], vad.silence_ms, look_at, True


def score_set(spoken: Iterable[Spoken], vad_model: Any, turn_model: Any, transcriber: Any,
              score_from_sound_end: bool = True) -> list[PauseScore]:
    out: list[PauseScore] = []
    for sp in spoken:
        for audio, at_ms, lasts, look_at, final in _pauses(sp, vad_model, score_from_sound_end):
            t0 = time.perf_counter()
            prob = float(turn_model.predict(audio[-8 * SR :]))
            second = None
            if lasts >= tdm.SECOND_LOOK_MS and look_at > 0:  # the turn as the stage holds it at the second look
                start = int(at_ms * SR / 1000) - audio.size  # where the turn audio starts
                second = float(turn_model.predict(sp.audio[max(start, look_at - 8 * SR) : look_at]))
            t1 = time.perf_counter()
            if hasattr(transcriber, "transcribe_batch_scored"):  # what the stage's speculative decode runs
                text, last_word_prob = transcriber.transcribe_batch_scored([audio])[0]
            else:
                text, last_word_prob = transcriber.transcribe(audio), None
            text = text.strip()
            t2 = time.perf_counter()
            # final: no speech after it (not "scored after the last word's end": Silero can let go of a quiet
            # last word, "Turn the music up.", so its pause is scored just before the labelled end)
            hesitation = not final and any(s / SR * 1000 <= at_ms <= e / SR * 1000 + 100 for s, e in sp.pauses)
            out.append(PauseScore(f"{sp.variant}/{sp.item.text}", sp.item.kind, sp.item.shape, final, hesitation, lasts,
                                  sp.speech_end_ms, at_ms, prob, text, round(1000 * (t1 - t0), 1), round(1000 * (t2 - t1), 1),
                                  last_word_prob, second))
    return out


def rates(scores: list[PauseScore], eagerness: str = "auto", words: bool = True, confidence: bool = True,
          second: bool = True) -> dict[str, Any]:
    """Per eagerness: false end of turn (any pause inside an utterance outlasting its end silence) per hesitant
    utterance and per complete one, and the end silence the verdict picks at the end of each utterance not cut
    (``ended_sure``: at the "sure" silence; ``ended_second_look``: at SECOND_LOOK_MS; ``_complete``: of the
    complete utterances only; ``waited_complete``: complete utterances held past the unsure silence)."""
    eager = tdm.EAGERNESS_SETTINGS[eagerness]
    by_key: dict[str, list[PauseScore]] = {}
    for s in scores:
        by_key.setdefault(s.key, []).append(s)
    false_end = {"hesitant": [0, 0], "complete": [0, 0]}
    cut: list[str] = []
    end_silence: list[int] = []
    end_complete: dict[str, int] = {}
    sure = sure_c = n_c = second_all = second_c = 0
    for key, pauses in by_key.items():
        kind = pauses[0].kind
        early = any(not p.final and p.lasts_ms >= p.end_silence_ms(eager, words, confidence, second) for p in pauses)
        false_end[kind][0] += early
        if early:
            cut.append(key)
        false_end[kind][1] += 1
        finals = [p for p in pauses if p.final]
        if finals and not early:
            ms = finals[0].end_silence_ms(eager, words, confidence, second)
            first_sure = finals[0].end_silence_ms(eager, words, confidence, False) <= eager.complete_silence_ms
            looked = not first_sure and ms == eager.second_look_end_ms  # ended by the second look (the sure silence may be as long)
            end_silence.append(ms)
            sure += first_sure
            second_all += looked
            if kind == "complete":
                end_complete[key] = ms
                n_c += 1
                sure_c += first_sure
                second_c += looked
    return {
        "eagerness": eagerness,
        "false_end_hesitant": false_end["hesitant"], "false_end_complete": false_end["complete"],
        "endings": len(end_silence), "ended_sure": sure, "ended_second_look": second_all, "cut": cut,
        "endings_complete": n_c, "ended_sure_complete": sure_c, "ended_second_look_complete": second_c,
        "end_silence_ms": {"p50": pct(end_silence, 50), "p95": pct(end_silence, 95), "max": max(end_silence, default=None)},
        "end_silence_complete_ms": {"p50": pct(list(end_complete.values()), 50), "p95": pct(list(end_complete.values()), 95),
                                    "max": max(end_complete.values(), default=None)},
        # complete utterances that waited longer than the unsure silence (the words held them open), slowest first
        "waited_complete": sorted(((k, ms) for k, ms in end_complete.items() if ms > eager.unsure_silence_ms), key=lambda x: -x[1]),
    }


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def distributions(scores: list[PauseScore]) -> dict[str, Any]:
    """Smart Turn's score per kind of pause (p5/p50/p95) and how often each words cue occurs there."""
    groups = {"complete: end": [s for s in scores if s.final],
              "hesitation pause": [s for s in scores if s.hesitation],
              "pause inside a part": [s for s in scores if not s.final and not s.hesitation]}
    out: dict[str, Any] = {}
    for name, ss in groups.items():
        probs = [s.audio_prob for s in ss]
        out[name] = {"n": len(ss), "audio_p5": pct(probs, 5), "audio_p50": pct(probs, 50), "audio_p95": pct(probs, 95),
                     "words": {c: sum(s.words == c for s in ss) for c in tdm.WORDS_CUES}}
    return out


def thinker_end_of_turn(texts: list[str]) -> list[float]:
    """The CPU thinker's (SmolLM2-135M-Instruct) probability of its end-of-turn token ``<|im_end|>`` right after
    each transcript as a user message: the text cue LiveKit's turn detector uses (with a model trained for it).
    Measured here, not used by the stage (see ``omni_rt.stages.asr.turn_rule``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omni_rt.engine.weights.loader import ensure_smollm2

    path = ensure_smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tok("<|im_start|>user\n" + text, return_tensors="pt").input_ids
            out.append(float(torch.softmax(model(ids).logits[0, -1], -1)[eot]))
    return out


def load_scorers() -> tuple[Any, Any, Any]:
    """The CPU preset's Silero VAD, Smart Turn and Whisper tiny.en (what the ASR stage runs)."""
    from omni_rt.backends.whisper import FasterWhisperASR
    from omni_rt.backends.turn_model import SmartTurnModel
    from omni_rt.backends.vad import SileroVadModel

    return SileroVadModel(), SmartTurnModel(), FasterWhisperASR()
