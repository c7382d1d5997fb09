"""The labelled end-of-turn set: what tests and the bench measure turn taking on.

Why a set, not one sentence: Smart Turn's score for one Piper utterance is borderline often enough (a hesitation
scored 0.51 on one machine, 0.06 on another) that a test or a tuning decision on one score is noise. Rates over
many shapes, two speaking rates and two noise settings are what a threshold should be chosen from.

Items: ``complete`` utterances of many shapes (questions, greetings, requests direct and indirect, statements,
imperatives short and long, embedded questions and stranded prepositions that end on "is" / "for" / "to", lists,
numbers, names, "X, or Y?" with its comma pause, two clauses) and ``hesitant`` ones: a fragment cut at a filler
("..., um,", "So, uh,") or at a clause that cannot end there ("for", "and", "the", "to", "What I want is"), a
pause of 400-900 ms, then the rest (a few pause twice). Spoken by Piper (``omni_rt.backends.tts_piper``) in each
``VARIANTS`` voice setting; VITS noise is seeded (the seed is set before the ONNX session is built and the set is
always spoken in one order), so every run hears the same audio.

Two halves: ``ITEMS`` (the rule is tuned on it) and ``HELD_OUT`` (only the bench scores it, ``python -m
latency_bench turns --stage-level --held-out``, so its rates are reported apart, never tuned on). Each holds the
first set of its time (44 and 16 items), then one of every two of ``_MORE``, written in one go before the rule
was changed for its shapes and split mechanically (even places tune, odd ones are held out).

``TEST_ITEMS``: tests score only the first ``TEST_ITEMS`` of ``ITEMS`` (the first set, minutes of CPU in 3
voices); the bench scores the whole of each half.

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

# Held out: written after the rule was fitted to the first ITEMS (Whisper's last-word probability and the "?" cue), spoken the same way and scored only by the bench (``turns --stage-level --held-out``), never tuned on.
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

# ---- more shapes: written together before the rule was changed for them (issue #48), then split mechanically
# (``_MORE[0::2]`` joins ``ITEMS``, ``_MORE[1::2]`` joins ``HELD_OUT``), so each shape has a tuning half and a
# held-out half and nobody chose which sentence went where.
_MORE: tuple[Item, ...] = (
    # embedded questions: the wh-clause's verb or auxiliary ends the sentence ("... what X is")
    _c("embedded question", "Could you tell me what the capital of Italy is?"),
    _c("embedded question", "Can you tell me what the capital of Spain is?"),
    _c("embedded question", "Could you tell me where the nearest pharmacy is?"),
    _c("embedded question", "Can you tell me how far the airport is?"),
    _c("embedded question", "Do you know what time the museum opens?"),
    _c("embedded question", "Do you know where my keys are?"),
    _c("embedded question", "Can you tell me who the president of France is?"),
    _c("embedded question", "Could you tell me what the date today is?"),
    _c("embedded question", "Do you know how tall Mount Everest is?"),
    _c("embedded question", "Can you tell me what your name is?"),
    _c("embedded question", "Could you find out when the next train is?"),
    _c("embedded question", "Do you happen to know what the weather will be?"),
    _c("embedded question", "I wonder where the station is."),
    _c("embedded question", "I wonder what time it is in Tokyo."),
    _c("embedded question", "I would like to know how much this costs."),
    _c("embedded question", "I am not sure what the answer is."),
    _c("embedded question", "Tell me what the score was."),
    _c("embedded question", "Do you know if the bank is open?"),
    _c("embedded question", "Can you check whether the store is open?"),
    _c("embedded question", "I know where it is."),
    # a preposition or an auxiliary stranded after a wh-word
    _c("stranded", "Who is this gift for?"),
    _c("stranded", "What are you looking forward to?"),
    _c("stranded", "Where are you from?"),
    _c("stranded", "What is this tool used for?"),
    _c("stranded", "Which team does he play for?"),
    _c("stranded", "Who did you go to the party with?"),
    _c("stranded", "What are you talking about?"),
    _c("stranded", "What is it made of?"),
    _c("stranded", "Who should I send the letter to?"),
    _c("stranded", "Which box did you put it in?"),
    _c("stranded", "What are we waiting for?"),
    _c("stranded", "Where did this package come from?"),
    _c("stranded", "Do you know what day it is?"),
    _c("stranded", "I do not know who that is."),
    _c("stranded", "That is not what I asked for."),
    _c("stranded", "This is the song I was thinking of."),
    _c("stranded", "Guess how old I am."),
    _c("stranded", "I don't know what to do."),
    _c("stranded", "Tell me where to go."),
    _c("stranded", "Show me how to."),
    # the sentence ends on an auxiliary or "to" with no wh-word: only the sound can tell it from a hesitation
    _c("elliptical", "Yes, I can."),
    _c("elliptical", "I think you should."),
    _c("elliptical", "I would love to."),
    _c("elliptical", "You don't have to."),
    _c("elliptical", "Yes, I do."),
    _c("elliptical", "No, it was not."),
    # short imperatives (a verb and its particle: "on", "in" are prepositions too)
    _c("short imperative", "Stop."),
    _c("short imperative", "Go on."),
    _c("short imperative", "Hold on."),
    _c("short imperative", "Come in."),
    _c("short imperative", "Keep going."),
    _c("short imperative", "Try again."),
    _c("short imperative", "Say that again."),
    _c("short imperative", "Speak slower."),
    _c("short imperative", "Turn it off."),
    _c("short imperative", "Turn the music up."),
    _c("short imperative", "Cancel it."),
    _c("short imperative", "Next song, please."),
    _c("short imperative", "Read it to me."),
    _c("short imperative", "Call Mom."),
    _c("short imperative", "Log me in."),
    _c("short imperative", "Switch the lights on."),
    # "X, or Y?": a comma pause before the alternative
    _c("either-or", "Do you want tea, or coffee?"),
    _c("either-or", "Should I call you today, or tomorrow?"),
    _c("either-or", "Is it on Monday, or Tuesday?"),
    _c("either-or", "Would you like the window seat, or the aisle?"),
    _c("either-or", "Is the meeting at ten, or at eleven?"),
    _c("either-or", "Do you prefer cats, or dogs?"),
    _c("either-or", "Shall we walk, or take the bus?"),
    _c("either-or", "Is that a yes, or a no?"),
    _c("either-or", "Should I wear the red shirt, or the blue one?"),
    _c("either-or", "Are we meeting here, or at the office?"),
    # lists
    _c("list", "I need eggs, milk, bread, and butter."),
    _c("list", "Add apples, bananas, and oranges to my list."),
    _c("list", "The colors of the flag are red, white, and blue."),
    _c("list", "Remind me to buy stamps, envelopes, and tape."),
    _c("list", "We visited Rome, Florence, and Venice."),
    _c("list", "Pack a hat, sunscreen, and a towel."),
    _c("list", "My favorite sports are tennis, swimming, and golf."),
    _c("list", "The kids are Tom, Lucy, and Max."),
    # numbers
    _c("number", "My phone number is five five five, one two three four."),
    _c("number", "Set an alarm for six thirty."),
    _c("number", "The code is four seven two nine."),
    _c("number", "It costs twenty three dollars and fifty cents."),
    _c("number", "What is seventeen times three?"),
    _c("number", "I was born in nineteen eighty five."),
    _c("number", "Book a table for two at eight o'clock."),
    _c("number", "Convert one hundred dollars to euros."),
    _c("number", "The flight leaves at nine fifteen."),
    _c("number", "Add two cups of flour."),
    # names
    _c("name", "My name is Anna Smith."),
    _c("name", "Call Doctor Patel."),
    _c("name", "Send a message to Maria Garcia."),
    _c("name", "Who is Albert Einstein?"),
    _c("name", "Play a song by Taylor Swift."),
    _c("name", "Tell Jennifer I will be late."),
    _c("name", "What did Shakespeare write?"),
    _c("name", "Email the report to Kevin and Laura."),
    _c("name", "Where was Napoleon born?"),
    _c("name", "Is Mister Johnson in the office today?"),
    # statements and replies
    _c("statement", "It is raining again."),
    _c("statement", "I am really tired today."),
    _c("statement", "Thank you so much for your help."),
    _c("statement", "That is all for now."),
    _c("statement", "I think that is correct."),
    _c("statement", "We are out of milk."),
    _c("short", "Never mind."),
    _c("short", "Okay, sounds good."),
    _c("short", "Sure, go ahead."),
    _c("short", "No, that is wrong."),
    # indirect requests
    _c("indirect request", "I was wondering if you could help me with my homework."),
    _c("indirect request", "Would you mind turning down the volume?"),
    _c("indirect request", "It would be great if you could remind me tomorrow."),
    _c("indirect request", "I need you to check my calendar."),
    _c("indirect request", "Do you think you could speak a little slower?"),
    _c("indirect request", "Would it be possible to change my booking?"),
    _c("indirect request", "Can I ask you something?"),
    _c("indirect request", "May I have the bill, please?"),
    _c("indirect request", "I would like you to summarize this article."),
    _c("indirect request", "I'd love to hear a joke."),
    # a clause before the main one (an inner comma pause)
    _c("two clauses", "If it rains tomorrow, should I take an umbrella?"),
    _c("two clauses", "When you have a moment, could you read me the news?"),
    _c("two clauses", "Before we start, can you tell me how long this takes?"),
    _c("two clauses", "After lunch, remind me to call the bank."),
    _c("two clauses", "Well, I guess that is fine."),
    _c("two clauses", "Honestly, I have no idea where we are."),
    # hesitant: a filler or an open clause after a wh-word (what the wh-rule must not end)
    _h("wh filler", "Could you tell me what the, um,", "weather is like?", 700),
    _h("wh filler", "Can you tell me where, uh,", "the station is?", 600),
    _h("wh filler", "Do you know what, um,", "time it is?", 800),
    _h("wh filler", "Who is this, uh,", "letter from?", 650),
    _h("wh filler", "What are you, um,", "doing tonight?", 750),
    _h("wh filler", "Where is the, uh,", "nearest bank?", 550),
    _h("wh open clause", "Can you tell me what the capital of", "Germany is?", 700),
    _h("wh open clause", "How much is", "a ticket to London?", 600),
    _h("wh open clause", "Where is", "the post office?", 650),
    _h("wh open clause", "Which one is", "better for me?", 700),
    _h("wh open clause", "Who is the", "author of this book?", 600),
    _h("wh open clause", "What time does the", "store close?", 750),
    _h("wh open clause", "How long will it", "take to get there?", 800),
    _h("wh open clause", "Do you know if", "it will rain?", 600),
    _h("wh open clause", "What is the best place to", "eat around here?", 700),
    _h("wh open clause", "Where should I go for", "a good coffee?", 650),
    _h("wh filler", "Who is, uh,", "Marie Curie?", 700),
    _h("wh filler", "Why does the, um,", "moon change shape?", 850),
    # hesitant: a sentence whose subject is a clause, paused at its verb ("What I want is, ...")
    _h("clause subject", "What I want is", "a quiet evening at home.", 700),
    _h("clause subject", "The problem is", "the train is late.", 650),
    _h("clause subject", "My question is", "how long it takes.", 750),
    _h("clause subject", "What I mean is", "we should wait.", 600),
    _h("clause subject", "The thing is, um,", "I lost my ticket.", 800),
    _h("clause subject", "The reason I ask is", "that I am curious.", 700),
    # hesitant: lists, numbers and names
    _h("list", "I need eggs, milk, and, um,", "some butter.", 700),
    _h("list", "Buy apples, pears, and", "grapes.", 600),
    _h("list", "We went to Rome, and then, uh,", "to Paris.", 750),
    _h("list", "Pack my toothbrush, my phone, and", "the charger.", 650),
    _h("number", "Set an alarm for, uh,", "seven thirty.", 700),
    _h("number", "The code is, um,", "four seven two nine.", 800),
    _h("number", "It costs, uh,", "twenty dollars.", 600),
    _h("number", "Book a table for", "six people.", 650),
    _h("name", "Call, um,", "Sarah.", 700),
    _h("name", "Send a message to, uh,", "David.", 600),
    _h("name", "My name is", "John Miller.", 750),
    _h("name", "Tell, um,", "Peter I am on my way.", 650),
    # hesitant: requests and imperatives
    _h("request", "I was wondering if", "you could help me.", 700),
    _h("request", "Would you mind, uh,", "closing the window?", 600),
    _h("request", "It would be great if, um,", "you could call me.", 800),
    _h("request", "I want to go to the", "cinema tonight.", 650),
    _h("request", "I want to go to the, um,", "beach.", 750),
    _h("request", "I am looking for", "a good restaurant.", 600),
    _h("imperative", "Turn off the, um,", "radio.", 700),
    _h("imperative", "Play, uh,", "some jazz.", 650),
    _h("imperative", "Tell me, uh,", "a fun fact.", 600),
    _h("imperative", "Remind me at", "five o'clock.", 700),
    _h("imperative", "Can you, um,", "remind me later?", 750),
    _h("imperative", "I'd like a coffee with", "milk and sugar.", 600),
    _h("either-or", "Do you want tea, or, um,", "maybe some juice?", 700),
    _h("either-or", "Should we go today or", "wait until Friday?", 650),
    # hesitant: a lead-in and two pauses
    Item("hesitant", "two pauses", ("So, um,", "I was thinking,", "maybe we could go out."), 650),
    Item("hesitant", "two pauses", ("Well, uh,", "the thing is,", "I am not sure."), 700),
    Item("hesitant", "two pauses", ("Can you, um,", "tell me, uh,", "what time it is?"), 600),
    Item("hesitant", "two pauses", ("I need to, uh,", "buy some, um,", "new shoes."), 700),
)
TEST_ITEMS = len(ITEMS)  # the first set: what the tests score (the whole set is the bench's, ~15 min of CPU)
ITEMS = ITEMS + _MORE[0::2]
HELD_OUT = HELD_OUT + _MORE[1::2]

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
def spoken_set(variants: tuple[str, ...] | None = None, held_out: bool = False, first: int | None = None) -> tuple[Spoken, ...]:
    """Every item in every variant (or the named ones), synthesized once per process (``held_out``: ``HELD_OUT``
    instead of ``ITEMS``; ``first``: only the first items, e.g. ``TEST_ITEMS``, which sound exactly as in the whole
    set: a voice's seeded noise runs on from item to item, so a prefix is the same audio)."""
    from omni_rt.audio.pcm import resample

    if first is not None and not 0 < first <= len(HELD_OUT if held_out else ITEMS):
        raise ValueError(f"first: {first} is not between 1 and the set's {len(HELD_OUT if held_out else ITEMS)} items")
    out: list[Spoken] = []
    for name, ls, ns, nw, seed in VARIANTS:
        if variants is not None and name not in variants:
            continue
        tts = _voice(ls, ns, nw, seed)
        for item in (HELD_OUT if held_out else ITEMS)[:first]:  # always in one order: the seeded noise is the same
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


def counts(items: tuple[Item, ...] | None = None) -> dict[str, int]:
    return {k: sum(i.kind == k for i in (ITEMS if items is None else items)) for k in ("complete", "hesitant")}
