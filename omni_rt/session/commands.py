"""What the sans-I/O session asks its driver to do to the pipeline (and to the connection).

The session never calls the pipeline: it queues these, the driver (``omni_rt.transports.runner``) runs them
in order after each input, and feeds what comes back (audio-in events, response outputs) into the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class OpenAudioIn:
    params: dict[str, Any]


@dataclass(slots=True)
class UpdateAudioIn:
    params: dict[str, Any]
    update_id: str  # the stage answers it: AudioInUpdated or AudioInUpdateRefused (omni_rt.contracts.payloads)


@dataclass(slots=True)
class AppendAudio:
    pcm: np.ndarray  # float32 at the pipeline input rate


@dataclass(slots=True)
class ControlAudioIn:
    op: str  # commit | clear | response_done (idle_timeout_ms counts from the end of the answer's playback)
    data: dict[str, Any] = field(default_factory=dict)


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
class CloseConnection:
    code: int
    reason: str


Command = (OpenAudioIn | UpdateAudioIn | AppendAudio | ControlAudioIn | CloseAudioIn | StartResponse | PrefillHint | AbortResponse
           | CloseConnection)
