"""What the sans-I/O session asks its driver to do to the pipeline (and to the connection).

The session never calls the pipeline: it queues these, the driver (``omni_rt.transports.runner``) runs them
in order after each input, and feeds what comes back (audio-in events, response outputs) into the session.
The audio-in stage's ops (open, update, commit, clear, response done) are the contract types of
``omni_rt.contracts.audio_in``: the driver hands them to the stage as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_rt.contracts.audio_in import (
    AnswerStarted,
    AudioInSettings,
    ClearAudioIn,
    CommitAudioIn,
    OpenAudioIn,
    ResponseDone,
    SessionOp,
    UpdateAudioIn,
)

__all__ = ["AbortResponse", "AnswerStarted", "AppendAudio", "AudioInSettings", "ClearAudioIn", "CloseAudioIn", "CloseConnection",
           "Command", "CommitAudioIn", "OpenAudioIn", "PausePlayback", "PrefillHint", "ResponseDone", "SessionOp", "StartResponse",
           "UpdateAudioIn"]


@dataclass(slots=True)
class AppendAudio:
    pcm: np.ndarray  # float32 at the pipeline input rate


@dataclass(slots=True)
class CloseAudioIn:
    pass


@dataclass(slots=True)
class StartResponse:
    response_id: str
    payload: dict[str, Any]


@dataclass(slots=True)
class PrefillHint:
    payload: dict[str, Any]  # a StartResponse payload the session's next answer will likely extend


@dataclass(slots=True)
class AbortResponse:
    response_id: str


@dataclass(slots=True)
class PausePlayback:
    """For a transport that controls the answer's playback (WebRTC's paced track; Twilio's bridge, which clears and
    sends again): hold it (``paused``) while overlapping speech is a candidate interruption, go on from where it
    stopped when it was a backchannel. The WebSocket ignores it (the client plays)."""

    paused: bool


@dataclass(slots=True)
class CloseConnection:
    code: int
    reason: str


Command = (OpenAudioIn | UpdateAudioIn | CommitAudioIn | ClearAudioIn | ResponseDone | AnswerStarted | AppendAudio | CloseAudioIn
           | StartResponse | PrefillHint | AbortResponse | PausePlayback | CloseConnection)
