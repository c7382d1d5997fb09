"""The audio-in control path: what the session tells the audio-in stage about one session, and its replies.

The session layer builds these (``omni_rt.session``), the transport runner hands them to the coordinator as
they are (``open_session`` / ``session_control``), and the audio-in stage's session scheduler takes them from its
inbox (``omni_rt.pipeline.schedulers.session``) and acts on them (``omni_rt.stages.asr.stage``). Audio itself
goes the stream way (``append``), not through here. The stage answers in ``omni_rt.contracts.payloads`` types:
an op with an ``ack`` gets exactly one reply, built by the op itself (``done`` / ``failed``); errors are
``AsrError`` and an idle session's end is ``SessionExpired``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omni_rt.contracts.payloads import AudioInUpdated, AudioInUpdateRefused
from omni_rt.contracts.turn_detection import SERVER_VAD, TurnDetectionConfig

# the code the stage refuses ``noise_reduction`` with (the preset turned the denoiser off, or its package is missing)
NOISE_REDUCTION_UNAVAILABLE = "noise_reduction_unavailable"


class SessionOp:
    """Base of a typed op on a session stage's session. ``op`` names it (the scheduler tells ``open`` from the
    rest by it, and an error names it); ``ack``: an id, or None. An op with an id gets exactly one reply: what
    ``done()`` returns once the stage applied it, or ``failed(code, message)`` when it refused it."""

    op: ClassVar[str]

    @property
    def ack(self) -> str | None:
        return None

    def done(self) -> Any:
        raise NotImplementedError(f"op '{self.op}' is not acknowledged")

    def failed(self, code: str, message: str) -> Any:
        raise NotImplementedError(f"op '{self.op}' is not acknowledged")


@dataclass(frozen=True)
class AudioInSettings:
    """The part of a session's config the audio-in stage holds: turn detection (None: the client commits),
    whether it decodes partial transcripts (for transcription deltas and the thinker's prefill hints), and
    ``noise_reduction`` (``audio.input.noise_reduction``'s type, ``"near_field"`` / ``"far_field"``, or None: off),
    which denoises the input before the VAD, the turn model and Whisper hear it."""

    turn_detection: TurnDetectionConfig | None = SERVER_VAD
    partials: bool = True
    noise_reduction: str | None = None


@dataclass(frozen=True)
class OpenAudioIn(SessionOp):
    """Open the session's state in the stage, with these settings."""

    op: ClassVar[str] = "open"
    settings: AudioInSettings = AudioInSettings()


@dataclass(frozen=True)
class UpdateAudioIn(SessionOp):
    """New settings; answered ``AudioInUpdated`` (in force) or ``AudioInUpdateRefused`` (the old ones stand)."""

    op: ClassVar[str] = "update"
    settings: AudioInSettings
    update_id: str

    @property
    def ack(self) -> str | None:
        return self.update_id

    def done(self) -> AudioInUpdated:
        return AudioInUpdated(0, self.update_id)

    def failed(self, code: str, message: str) -> AudioInUpdateRefused:
        return AudioInUpdateRefused(0, self.update_id, code, message)


@dataclass(frozen=True)
class CommitAudioIn(SessionOp):
    """End the turn now with the buffered audio (manual turn taking, ``input_audio_buffer.commit``)."""

    op: ClassVar[str] = "commit"


@dataclass(frozen=True)
class ClearAudioIn(SessionOp):
    """Drop the buffered audio (``input_audio_buffer.clear``)."""

    op: ClassVar[str] = "clear"


@dataclass(frozen=True)
class ResponseDone(SessionOp):
    """An answer ended; its audio lasts ``audio_ms``, so ``idle_timeout_ms`` counts from the end of its playback.
    ``played``: it completed, so the listener hears it until all its audio has played (False: cut short, heard
    no more; the backchannel filter's ``AnswerPlayback`` ends now)."""

    op: ClassVar[str] = "response_done"
    audio_ms: float = 0.0
    played: bool = True


@dataclass(frozen=True)
class AnswerStarted(SessionOp):
    """The active answer's first audio went to the listener: from now until its ``ResponseDone`` (plus its audio's
    length) speech that overlaps it is a candidate interruption (``omni_rt.stages.asr.interruption``)."""

    op: ClassVar[str] = "answer_started"
