"""The labelled end-of-turn set: what tests and the bench measure turn taking on.

Why a set, not one sentence: Smart Turn's score for one Piper utterance is borderline often enough (a hesitation
scored 0.51 on one machine, 0.06 on another) that a test or a tuning decision on one score is noise. Rates over
many shapes, two speaking rates and two noise settings are what a threshold should be chosen from.

Items: ``complete`` utterances of several shapes (question, greeting + question, short "Can you ...?", long
request, statement, imperative) and ``hesitant`` ones: a fragment cut at a filler ("..., um,", "So, uh,") or at
a clause that cannot end there ("for", "and", "the", "to"), a pause, then the rest. Spoken by Piper
(``omni_rt.backends.tts_piper``) in each ``VARIANTS`` voice setting; VITS noise is seeded (the seed is set
before the ONNX session is built and the set is always spoken in one order), so every run hears the same audio.

``HELD_OUT``: 16 more items, written after the rule was fitted to ``ITEMS``; only the bench scores them
(``python -m latency_bench turns --stage-level --held-out``), so their rates are reported apart, never tuned on.

``spoken_set()`` synthesizes once per process and caches (tests call it from a session fixture; the bench once).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SR = 16000
LEAD_MS = 300  # silence before the speech (a live mic's room tone is 0 here; Silero needs a little lead-in)
TAIL_MS = 1500  # silence after the last word: longer than any "sure" end, shorter than the max silence


@dataclass(frozen=True)
class Item:
    """One utterance. ``parts``: what is said, split where a hesitant speaker pauses for ``pause_ms``."""

    kind: str  # complete | hesitant
    shape: str  # question, greeting+question, can-you, long request, statement, imperative, filler, open clause
    parts: tuple[str, ...]
    pause_ms: int = 0

    @property
    def text(self) -> str:
        return " ".join(self.parts)


def _c(shape: str, text: str) -> Item:
    return Item("complete", shape, (text,))


def _h(shape: str, first: str, rest: str, pause_ms: int) -> Item:
    return Item("hesitant", shape, (first, rest), pause_ms)


ITEMS: tuple[Item, ...] = (
    _c("question", "What time is it?"),
    _c("question", "What is the capital of France?"),
    _c("question", "How many legs does a spider have?"),
    _c("question", "Why is the sky blue?"),
    _c("question", "Who wrote Romeo and Juliet?"),
    _c("question", "Which planet is closest to the sun?"),
    _c("greeting+question", "Hi there, how are you doing today?"),
    _c("greeting+question", "Hello, what is the weather like tomorrow?"),
    _c("greeting+question", "Hey, can you tell me a joke?"),
    _c("greeting+question", "Good morning, what is on my calendar today?"),
    _c("can-you", "Can you help me?"),
    _c("can-you", "Can you hear me?"),
    _c("long request", "Could you please tell me how long it takes to fly from London to New York on a normal day?"),
    _c("long request", "I would really appreciate it if you could recommend a good book for a long train ride."),
    _c("long request", "Please explain to me in simple words how a rainbow forms after the rain."),
    _c("statement", "I just got back from a long trip to Spain."),
    _c("statement", "My favorite color is blue."),
    _c("statement", "The meeting has been moved to Friday afternoon."),
    _c("statement", "That sounds great, thank you."),
    _c("imperative", "Set a timer for ten minutes."),
    _c("imperative", "Turn off the lights in the kitchen."),
    _c("imperative", "Tell me a story about a dragon."),
    _c("imperative", "Play some relaxing music."),
    _c("short", "Yes, please."),
    _h("filler", "Can you set a timer for, um,", "ten minutes?", 700),
    _h("filler", "Who wrote, uh,", "Romeo and Juliet?", 500),
    _h("filler", "What is the capital of, um,", "the country of France?", 900),
    _h("filler", "How do plants, uh,", "make their food?", 600),
    _h("filler", "Which planet is, um,", "closest to the sun?", 800),
    _h("filler", "So, uh,", "what time is it?", 600),
    _h("filler", "How many legs does, uh,", "a spider have?", 850),
    _h("filler", "Tell me about, um,", "the history of Rome.", 700),
    _h("filler", "I would like to order, uh,", "a large pizza.", 650),
    _h("filler", "I think we should, um,", "leave a bit earlier.", 750),
    _h("open clause", "I need a table for", "four people tonight.", 600),
    _h("open clause", "I want to buy some milk and", "a loaf of bread.", 700),
    _h("open clause", "Can you tell me the", "time in Tokyo?", 500),
    _h("open clause", "Remind me to call my mother because", "it is her birthday.", 800),
    _h("open clause", "We could go to the park or", "to the beach tomorrow.", 650),
    _h("open clause", "I would like to book a flight to", "Paris next week.", 700),
    _h("open clause", "What is the difference between a", "crocodile and an alligator?", 600),
    _h("open clause", "Please send a message to", "my brother.", 550),
    _h("open clause", "The best time to visit is in the", "spring.", 750),
    _h("open clause", "Turn on the lights in the kitchen and", "the living room.", 600),
)

# Held out: written after the rule was fitted to ITEMS (Whisper's last-word probability and the "?" cue), spoken the same way and scored only by the bench (``turn_scores --held-out``), never tuned on.
HELD_OUT: tuple[Item, ...] = (
    _c("question", "Where is the nearest train station?"),
    _c("question", "How far away is the moon?"),
    _c("greeting+question", "Hi, could you check my messages?"),
    _c("can-you", "Can you speak louder?"),
    _c("long request", "Would you mind telling me what the weather will be like this weekend in Berlin?"),
    _c("statement", "I had pasta for dinner last night."),
    _c("imperative", "Open the front door."),
    _c("short", "No, thanks."),
    _h("filler", "Where did I, um,", "put my keys?", 600),
    _h("filler", "Can you, uh,", "call my sister?", 700),
    _h("filler", "What is the best way to, um,", "learn French?", 800),
    _h("filler", "I want to, uh,", "cancel my order.", 650),
    _h("open clause", "Add eggs and butter to", "the shopping list.", 600),
    _h("open clause", "How long does it take to drive from", "Boston to Chicago?", 700),
    _h("open clause", "I am looking for a gift for", "my father.", 750),
    _h("open clause", "Is it going to rain or", "snow today?", 550),
)

# (name, length_scale, noise_scale, noise_w_scale, seed): two speaking rates, with and without VITS noise
VARIANTS: tuple[tuple[str, float, float, float, int], ...] = (
    ("plain", 1.0, 0.0, 0.0, 0),
    ("fast+noise", 0.85, 0.667, 0.8, 11),
    ("slow+noise", 1.2, 0.667, 0.8, 23),
)


@dataclass(frozen=True)
class Spoken:
    """An item in one voice: 16 kHz float32 audio (lead silence, speech, pauses, tail), and where the speech is."""

    item: Item
    variant: str
    audio: np.ndarray
    speech_end: int  # sample just past the last word
    pauses: tuple[tuple[int, int], ...]  # hesitant: (start, end) samples of each mid-utterance silence we inserted

    @property
    def speech_end_ms(self) -> float:
        return 1000 * self.speech_end / SR


def _trim(audio: np.ndarray, rel: float = 0.02, frame: int = 160) -> np.ndarray:
    """Cut Piper's own leading/trailing near-silence, so the silences are exactly what the set says."""
    n = audio.size // frame
    if n == 0:
        return audio
    rms = np.sqrt(np.mean(audio[: n * frame].reshape(n, frame) ** 2, axis=1))
    loud = np.flatnonzero(rms > rel * rms.max())
    return audio[loud[0] * frame : (loud[-1] + 1) * frame] if loud.size else audio


def _voice(length_scale: float, noise: float, noise_w: float, seed: int):
    from omni_rt.backends.tts_piper import PiperTTS

    # VITS draws its noise in RandomNormalLike ops, seeded when the session is built
    return PiperTTS(length_scale=length_scale, noise_scale=noise, noise_w_scale=noise_w, seed=seed)


@lru_cache(maxsize=None)
def spoken_set(variants: tuple[str, ...] | None = None, held_out: bool = False) -> tuple[Spoken, ...]:
    """Every item in every variant (or the named ones), synthesized once per process (``held_out``: ``HELD_OUT``
    instead of ``ITEMS``)."""
    from omni_rt.audio.pcm import resample

    out: list[Spoken] = []
    for name, ls, ns, nw, seed in VARIANTS:
        if variants is not None and name not in variants:
            continue
        tts = _voice(ls, ns, nw, seed)
        for item in HELD_OUT if held_out else ITEMS:  # always the whole set in one order: the seeded noise is the same
            pieces = [np.zeros(SR * LEAD_MS // 1000, np.float32)]
            pauses: list[tuple[int, int]] = []
            for i, part in enumerate(item.parts):
                pieces.append(_trim(resample(tts.synthesize(part), tts.sample_rate, SR).astype(np.float32)))
                if i < len(item.parts) - 1:
                    start = sum(p.size for p in pieces)
                    pieces.append(np.zeros(SR * item.pause_ms // 1000, np.float32))
                    pauses.append((start, start + pieces[-1].size))
            end = sum(p.size for p in pieces)
            pieces.append(np.zeros(SR * TAIL_MS // 1000, np.float32))
            out.append(Spoken(item, name, np.concatenate(pieces), end, tuple(pauses)))
    return tuple(out)


ROOM_NOISE_RMS = 0.003  # light room noise (white, about -50 dBFS; Piper's speech is ~-20 dBFS): SNR ~30 dB


def with_room_noise(spoken: tuple[Spoken, ...], rms: float = ROOM_NOISE_RMS, seed: int = 5) -> tuple[Spoken, ...]:
    """The same utterances with seeded white noise under them, silences included (a live mic is never digital
    silence); the bench's ``--room-noise`` scores these apart from the clean set."""
    rng = np.random.default_rng(seed)
    return tuple(Spoken(sp.item, sp.variant + "+room", (sp.audio + rng.normal(0.0, rms, sp.audio.size)).astype(np.float32),
                        sp.speech_end, sp.pauses) for sp in spoken)


def counts() -> dict[str, int]:
    return {k: sum(i.kind == k for i in ITEMS) for k in ("complete", "hesitant")}
