"""The session's config and its ``session.update`` path: validated once (``handlers.session_update``), applied
once, here, at once (the client's next events already see it), and confirmed by ``session.updated`` once the
audio-in stage holds its part of it.

The stage owns three fields (``SessionConfig.audio_in_settings``: turn detection, transcription's partials, noise
reduction) and may refuse them after validation (``semantic_vad`` without its turn model, noise reduction on a
server whose preset turned the denoiser off or lacks its package). An update that changes them sends
``UpdateAudioIn`` with an id, and its ``session.updated`` waits for the stage's answer (``AudioInUpdated`` or
``AudioInUpdateRefused``, a few ms); later confirmations queue behind it so they go out in order. A refusal
becomes an ``error`` naming the field, the stage's fields go back to what it still holds, and the
``session.updated`` that follows shows the config in force. An update that leaves them alone is confirmed at
once."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from omni_rt.contracts import payloads as c
from omni_rt.contracts.audio_in import NOISE_REDUCTION_UNAVAILABLE
from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.events import new_id
from omni_rt.realtime.session_config import SessionConfig
from omni_rt.session import commands as cmd


class ConfigUpdates:
    def __init__(self, session_id: str, config: SessionConfig, *, send: Callable[[dict[str, Any]], None],
                 send_error: Callable[..., None], commands: list[cmd.Command]) -> None:
        self.session_id = session_id
        self.config = config
        self._send, self._send_error, self._commands = send, send_error, commands
        self._held_by_stage = config  # the config whose audio-in part the stage holds (opened with it)
        self._sent = config.audio_in_settings()  # the audio-in part last sent to the stage
        self._in_flight: dict[str, SessionConfig] = {}  # update id -> the config it carried
        self._last_sent: str | None = None
        self._waiting: deque[str | None] = deque()  # per session.update: the update id its confirmation awaits
        self._answered: set[str] = set()

    def open_op(self) -> cmd.OpenAudioIn:
        """The op that opens the stage's session with the audio-in part of the config."""
        self._held_by_stage, self._sent = self.config, self.config.audio_in_settings()
        return cmd.OpenAudioIn(self._sent)

    def apply(self, config: SessionConfig) -> None:
        """A validated ``session.update``: in force now; its ``session.updated`` once the stage holds it."""
        self.config = config
        settings = config.audio_in_settings()
        update_id = None
        if settings != self._sent:
            update_id = new_id("upd")
            self._sent, self._last_sent, self._in_flight[update_id] = settings, update_id, config
            self._commands.append(cmd.UpdateAudioIn(settings, update_id))
        self._waiting.append(update_id)
        self._confirm()

    def receive(self, ev: c.AudioInUpdated | c.AudioInUpdateRefused) -> None:
        """The stage's answer to an ``UpdateAudioIn``."""
        carried = self._in_flight.pop(ev.update_id, None)
        if carried is None:
            return
        if isinstance(ev, c.AudioInUpdated):
            self._held_by_stage = carried
        else:
            self._refused(ev, carried)
        self._answered.add(ev.update_id)
        self._confirm()

    def _refused(self, ev: c.AudioInUpdateRefused, carried: SessionConfig) -> None:
        held = self._held_by_stage
        field = ("noise_reduction" if ev.code == NOISE_REDUCTION_UNAVAILABLE
                 else "turn_detection" if carried.turn_detection != held.turn_detection else "transcription")
        message = ev.message if ev.code != "stage_error" else "the audio input could not apply this setting"
        self._send_error(ProtocolError(ev.code, message, f"session.audio.input.{field}",
                                       type_="server_error" if ev.code == "stage_error" else "invalid_request_error"))
        if ev.update_id == self._last_sent:  # no later change is on its way: the stage's fields go back
            cfg = self.config.copy()
            cfg.turn_detection, cfg.transcription, cfg.noise_reduction = held.turn_detection, held.transcription, held.noise_reduction
            self.config, self._sent, self._last_sent = cfg, cfg.audio_in_settings(), None

    def _confirm(self) -> None:
        while self._waiting and (self._waiting[0] is None or self._waiting[0] in self._answered):
            self._answered.discard(self._waiting.popleft() or "")
            self._send({"type": "session.updated", "session": self.config.render(self.session_id)})
