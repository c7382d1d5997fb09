"""What the bench's clients say: the spoken questions (Piper, 24 kHz PCM16) and the labelled end-of-turn set as
utterances, each knowing where its speech starts and ends (V2V is timed from the chunk holding its last speech
sample), and the turn-detection settings the sessions ask for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SR = 24000

# Short factual questions; a few invite a two-sentence answer, as a voice assistant gets.
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "Who wrote Romeo and Juliet?",
    "Which planet is closest to the sun?",
    "How do plants make their food?",
]
SEMANTIC_VAD = {"type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}
SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
              "create_response": True, "interrupt_response": True}
TURN_DETECTION = {"server_vad": SERVER_VAD, "semantic_vad": SEMANTIC_VAD}
LONG_QUESTION = "Tell me a long story about a dragon who lived in the mountains and loved to read books."
INTERRUPT = "Wait, stop. What is two plus two?"


@dataclass
class Utterance:
    text: str
    pcm: bytes  # PCM16 LE mono 24 kHz
    speech_end: int  # index just past the last speech sample
    speech_start: int = 0  # index of the first speech sample
    pauses: tuple[int, ...] = ()  # hesitant utterances: index where each mid-sentence silence starts

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / SR


def speech_bounds(audio: np.ndarray, frame: int = 240, rel: float = 0.05) -> tuple[int, int]:
    """(start of the first, end of the last) 10 ms frame whose RMS is above ``rel`` x the loudest frame's."""
    n = len(audio) // frame
    if n == 0:
        return 0, len(audio)
    rms = np.sqrt((audio[: n * frame].reshape(n, frame).astype(np.float64) ** 2).mean(axis=1))
    loud = np.nonzero(rms > rel * rms.max())[0]
    return (int(loud[0] * frame), int((loud[-1] + 1) * frame)) if len(loud) else (0, len(audio))


def synthesize_corpus(texts: list[str]) -> dict[str, Utterance]:
    from omni_rt.audio.pcm import float_to_pcm16, resample
    from omni_rt.backends.tts_piper import PiperTTS

    tts = PiperTTS()
    out: dict[str, Utterance] = {}
    for text in texts:
        audio = resample(tts.synthesize(text).astype(np.float32), tts.sample_rate, SR)
        start, end = speech_bounds(audio)
        out[text] = Utterance(text, float_to_pcm16(audio), end, start)
    return out


def turn_set_utterances(variant: str = "plain", whole: bool = False) -> tuple[list[Utterance], list[Utterance]]:
    """The labelled end-of-turn set (``omni_rt.testing.turn_set``) in one voice, as 24 kHz utterances: (complete, hesitant).
    Each ends at its last word (the mic streams silence after it, as a live one does). The first set
    (``TEST_ITEMS``, 44 items: a live run of each mode in ~6 min) unless ``whole``: the whole tuning half."""
    from omni_rt.audio.pcm import float_to_pcm16, resample

    from omni_rt.testing.turn_set import LEAD_MS, SR as SET_SR, TEST_ITEMS, spoken_set

    complete: list[Utterance] = []
    hesitant: list[Utterance] = []
    k = SR / SET_SR
    for sp in spoken_set((variant,), first=None if whole else TEST_ITEMS):
        audio = resample(sp.audio[: sp.speech_end], SET_SR, SR).astype(np.float32)
        utt = Utterance(sp.item.text, float_to_pcm16(audio), audio.size, int(SR * LEAD_MS / 1000),
                        tuple(int(a * k) for a, _ in sp.pauses))
        (complete if sp.item.kind == "complete" else hesitant).append(utt)
    return complete, hesitant
