"""What crosses stage boundaries: small typed payloads, in one module.

Every stage's stream chunks and session events are one of these classes, so a producer and its consumers
agree by type rather than by dict keys normalised in several places. They stay plain data (dataclasses of
str / int / bytes / numpy arrays), so a stage can move behind a pickling queue unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_rt.contracts.rates import PIPELINE_OUTPUT_RATE


# ---- thinker -> talker / client -------------------------------------------------------------------
@dataclass(slots=True)
class TextDelta:
    """Speakable answer text as the thinker produces it (tool-call text never appears here)."""

    text: str
    token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of a tool call's JSON arguments; ``index`` orders parallel calls of one answer."""

    index: int
    call_id: str
    name: str
    arguments_delta: str
    token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class ToolCallDone:
    """A tool call whose arguments are complete."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(slots=True)
class TokenDelta:
    """Token ids of a request whose output is tokens, not text (a codec LM's audio codes). ``segment``: which
    prompt of a streamed request produced them (consumers restart frame grouping when it changes)."""

    token_ids: list[int]
    segment: int = 0


@dataclass(slots=True)
class SpeechPrompt:
    """One clause to speak, as a request for the codec LM it streams into. An AR stage that receives these as
    stream chunks runs a response's prompts one after another and streams their tokens under the response's id
    (``omni_rt.engine.builtin.segments``); ``request`` is an AR request payload (``prompt_ids``, ``max_tokens``...)."""

    text: str
    request: dict[str, Any]


# ---- talker -> vocoder / client -------------------------------------------------------------------
@dataclass(slots=True)
class Clause:
    """One spoken clause: its text and its waveform at the talker's native rate. A talker that streams a clause
    sends its audio in pieces: the first carries the text, each later one ``continued=True`` (text ``""``)."""

    text: str
    audio: np.ndarray
    sample_rate: int
    continued: bool = False

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.audio) / self.sample_rate


@dataclass(slots=True)
class CodecFrames:
    """SNAC codes, ``(n, 7)`` int array: n frames of 7 codes (one frame = 85 ms of 24 kHz audio)."""

    frames: np.ndarray


# ---- vocoder -> client ----------------------------------------------------------------------------
@dataclass(slots=True)
class PcmChunk:
    """PCM16 LE mono at ``sample_rate`` (always the pipeline output rate); the session encodes per surface."""

    pcm: bytes
    samples: int
    sample_rate: int = PIPELINE_OUTPUT_RATE


# ---- audio-in stage (VAD + ASR) -> session ----------------------------------------------------------
@dataclass(slots=True)
class AsrEvent:
    """Base of what the audio-in stage tells a session. ``turn`` numbers the session's user turns from 1;
    the session matches transcripts to turns by it, never by arrival order."""

    turn: int


@dataclass(slots=True)
class SpeechStarted(AsrEvent):
    audio_start_ms: int
    # held as a candidate first (an answer was heard): from the onset to the verdict, on the input stream's clock
    decision_ms: float | None = None


@dataclass(slots=True)
class InterruptionCandidate(AsrEvent):
    """Speech began while an answer was heard: its ``SpeechStarted`` is held until the stage decides whether it
    is a backchannel (``BackchannelDropped``) or an interruption (``SpeechStarted``, with this onset). A
    transport that paces playback pauses it meanwhile."""

    audio_start_ms: int


@dataclass(slots=True)
class BackchannelDropped(AsrEvent):
    """The candidate was a backchannel (or no words: a cough, a breath): dropped, no turn; playback resumes.
    ``decision_ms``: from the speech's onset to the verdict, on the input stream's clock."""

    text: str
    speech_ms: float
    decision_ms: float


@dataclass(slots=True)
class SpeechStopped(AsrEvent):
    audio_end_ms: int
    forced: bool = False  # the turn hit the maximum turn length
    semantic: bool = False  # ended by the turn model (semantic_vad)
    turn_prob: float | None = None  # the turn model's probability that the turn is complete


@dataclass(slots=True)
class Committed(AsrEvent):
    """The turn's audio is final (VAD end of turn, client commit, or max turn length)."""

    trigger: str
    audio_ms: int


@dataclass(slots=True)
class Cleared(AsrEvent):
    pass


@dataclass(slots=True)
class TranscriptPartial(AsrEvent):
    """A re-decode of the turn so far (the whole text, not a delta)."""

    text: str


@dataclass(slots=True)
class TranscriptSpeculative(AsrEvent):
    """The turn decoded during the end-of-turn silence: an answer may start (held) from it."""

    text: str
    asr_ms: float


@dataclass(slots=True)
class SpeculationCancelled(AsrEvent):
    """Speech resumed: the speculative transcript of this turn no longer holds."""


@dataclass(slots=True)
class TranscriptFinal(AsrEvent):
    text: str
    speculative: bool
    asr_ms: float  # decode time
    after_end_ms: float  # what the end of turn actually waited for it
    audio_ms: int
    trigger: str = "vad"  # vad | commit | max_turn | timeout (an idle timeout's turn is answered even if silent)
    queue_ms: float = 0.0  # of after_end_ms: waiting (decode queue, the stage's inbox) ...
    compute_ms: float = 0.0  # ... and decoding after the end of turn


@dataclass(slots=True)
class TurnScored(AsrEvent):
    """semantic_vad: a pause's verdict is in, sound and words (informational: for logs and benchmarks).
    ``complete``: the verdict ends the turn before the max silence, after ``end_silence_ms``."""

    prob: float  # Smart Turn's score
    complete: bool
    silence_ms: float  # the pause so far when the verdict came
    score_ms: float
    words: str = "empty"  # the speculative transcript's cue (omni_rt.stages.asr.turn_rule.words_cue)
    end_silence_ms: int = 0
    queue_ms: float = 0.0  # how long the Smart Turn score waited for its thread (score_ms: computing)
    look: int = 1  # 2: the second look (Smart Turn again at SECOND_LOOK_MS of silence after an unsure verdict)


@dataclass(slots=True)
class TimeoutTriggered(AsrEvent):
    """No speech for the session's ``idle_timeout_ms`` after the last answer."""

    audio_start_ms: int
    audio_end_ms: int


@dataclass(slots=True)
class SessionExpired(AsrEvent):
    idle_s: float


@dataclass(slots=True)
class AsrError(AsrEvent):
    code: str
    message: str


@dataclass(slots=True)
class AudioInUpdated(AsrEvent):
    """The stage applied the session's settings update ``update_id`` (op ``update``): they are in force."""

    update_id: str


@dataclass(slots=True)
class AudioInUpdateRefused(AsrEvent):
    """The stage could not apply update ``update_id`` (e.g. ``semantic_vad`` without its turn model) and kept
    the settings it had."""

    update_id: str
    code: str
    message: str


def text_of(chunk: Any) -> str:
    """The speakable text in a thinker chunk ('' for tool calls and anything else)."""
    return chunk.text if isinstance(chunk, TextDelta) else ""
