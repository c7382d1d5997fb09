"""Speech prompts (GPU preset): the first of the codec talker's two stages — the thinker's text stream in,
one codec-LM prompt per clause out.

The talker is a normal pair of stages: this one splits the answer into clauses as it streams (the first one
short, so the first audio starts early) and writes each as an Orpheus prompt; the next stage is a plain AR
scheduler (``codec_lm``) that generates each prompt's SNAC codes batched with every other session's
(``omni_rt.engine.builtin.segments``), and the vocoder regroups those codes into frames. Stream in: ``TextDelta``;
stream out: ``SpeechPrompt``; result: the payload plus the clauses spoken.

A clause's token budget comes from its words (``clause_token_budget``): enough codes for the clause spoken
slowly, so a long clause is never cut mid-word; the model ends a clause itself with ``END_OF_SPEECH``.
"""

from __future__ import annotations

import math
from typing import Any

from omni_rt.backends.snac_codec import CODES_PER_FRAME
from omni_rt.pipeline.schedulers.streaming import StreamState
from omni_rt.stages.talker.clause_stream import ClauseStreamWorker
from omni_rt.contracts.payloads import SpeechPrompt

# Orpheus special tokens (Llama-3 tokenizer + added specials; audio codes start at ORPHEUS_CODE_OFFSET).
# A prompt is [START_OF_HUMAN] "voice: text" [END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]: the
# model's own reply opens with the last two, so putting them in the prompt saves two decode steps before the
# first code (as Orpheus' reference engine does).
START_OF_HUMAN, END_OF_TEXT, END_OF_HUMAN = 128259, 128009, 128260
START_OF_AI, START_OF_SPEECH, END_OF_SPEECH = 128261, 128257, 128258

FRAMES_PER_SECOND = 24000 / 2048  # SNAC 24 kHz: one 7-code frame per 2048 samples
SLOW_SECONDS_PER_WORD = 0.75  # 80 words/min: slower than Orpheus speaks any voice
SLOW_CHARS_PER_SECOND = 8.0  # long words and digits take longer than their word count says
CLAUSE_LEAD_SECONDS = 1.0  # breath and pauses around the clause


def clause_token_budget(clause: str) -> int:
    """Codec tokens allowed for one clause: whole frames for the clause spoken slowly, plus a lead."""
    seconds = CLAUSE_LEAD_SECONDS + max(len(clause.split()) * SLOW_SECONDS_PER_WORD, len(clause) / SLOW_CHARS_PER_SECOND)
    return math.ceil(seconds * FRAMES_PER_SECOND) * CODES_PER_FRAME


class SpeechPrompter(ClauseStreamWorker):
    def __init__(
        self,
        tokenizer: Any,
        voice: str = "tara",
        sampling: dict[str, Any] | None = None,
        max_tokens_per_clause: int | None = None,
        ignore_eos: bool = False,
        first_max_words: int = 4,
    ) -> None:
        """``max_tokens_per_clause`` caps the per-clause budget (benchmarks and tests with random weights
        that never stop by themselves); ``None``: the budget from the clause's words."""
        super().__init__("talker", first_max_words=first_max_words)
        self.tokenizer = tokenizer
        self.voice = voice
        self.sampling = dict(sampling or {})
        self.max_tokens_per_clause = max_tokens_per_clause
        self.ignore_eos = ignore_eos

    def prompt_ids(self, clause: str) -> list[int]:
        ids = self.tokenizer.encode(f"{self.voice}: {clause}", add_special_tokens=True)
        return [START_OF_HUMAN, *ids, END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]

    def request(self, clause: str) -> dict[str, Any]:
        budget = clause_token_budget(clause)
        if self.max_tokens_per_clause is not None:
            budget = min(budget, self.max_tokens_per_clause)
        return {"prompt_ids": self.prompt_ids(clause), "output": "tokens", "max_tokens": budget,
                "token_chunk": CODES_PER_FRAME,  # one TokenDelta per frame, not per code
                "stop_token_ids": [END_OF_SPEECH], "ignore_eos": self.ignore_eos, **self.sampling}

    def on_clauses(self, request_id: str, state: StreamState, clauses: list[str]) -> None:
        for clause in clauses:
            self.emit(request_id, "stream", SpeechPrompt(clause, self.request(clause)))


def create_speech_prompts(
    tokenizer: str,
    voice: str = "tara",
    temperature: float = 0.6,
    top_p: float = 0.95,
    repetition_penalty: float = 1.1,  # Orpheus loops on codes below 1.1
    max_tokens_per_clause: int | None = None,
    ignore_eos: bool = False,
    first_max_words: int = 4,
    random_init: bool = False,
) -> SpeechPrompter:
    """``tokenizer``: the codec LM's text tokenizer (a local directory or a hub id already cached locally).
    ``random_init`` (a codec LM on random weights, offline): the packaged stand-in tokenizer instead."""
    from omni_rt.engine.weights.random_init import stand_in_tokenizer
    from omni_rt.engine.weights.loader import load_tokenizer, resolve_model

    try:
        tok = stand_in_tokenizer() if random_init else load_tokenizer(resolve_model(tokenizer))
    except Exception as exc:
        raise ValueError(f"stage 'talker' field 'tokenizer': cannot load {tokenizer!r} ({exc})") from exc
    sampling = {"temperature": temperature, "top_p": top_p, "repetition_penalty": repetition_penalty, "seed": 0}
    return SpeechPrompter(tok, voice=voice, sampling=sampling, max_tokens_per_clause=max_tokens_per_clause,
                                 ignore_eos=ignore_eos, first_max_words=first_max_words)
