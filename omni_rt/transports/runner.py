"""Drives one sans-I/O ``RealtimeSession`` against the pipeline and a connection.

After every input to the session the runner runs the session's commands (audio to the audio-in stage,
responses started and aborted in the coordinator) and wakes the sender. Each response runs as one task that
reads the coordinator's stream and feeds it back into the session by role. The transports (WebSocket,
Twilio) only move bytes: they call ``feed_*`` and send what ``next_events`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Callable

from omni_rt.pipeline.coordinator import PipelineError, ResultItem, StreamItem
from omni_rt.realtime.errors import ProtocolError
from omni_rt.session import commands as cmd
from omni_rt.session.core import RealtimeSession
from omni_rt.contracts.payloads import AsrEvent

if TYPE_CHECKING:
    from omni_rt.transports.host import TransportHost

log = logging.getLogger("omni_rt.session")


class SessionRunner:
    def __init__(self, runtime: "TransportHost", session: RealtimeSession, transport: str) -> None:
        """``transport``: which adapter drives this session ("websocket", "twilio", "webrtc"), for the logs."""
        self.runtime = runtime
        self.session = session
        self.transport = transport
        roles = runtime.coordinator.roles
        self.audio_in = roles.audio_in
        self.response_entry = roles.response
        self.role_of = {stage: role for role, stage in (("text", roles.text), ("clauses", roles.clauses), ("audio", roles.audio)) if stage}
        self.close_request: cmd.CloseConnection | None = None
        self._wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task] = {}
        # a transport that paces the answer's playback (WebRTC) pauses and resumes it here (cmd.PausePlayback)
        self.on_playback: Callable[[bool], None] | None = None

    # ---- inputs --------------------------------------------------------------------------------------
    def open(self) -> None:
        self.session.open()
        self._pump()

    def feed_message(self, raw: str | bytes) -> None:
        if self.session.closed:  # input racing the close (a transport's reader not yet cancelled) is dropped:
            return  # it would reopen per-session state in the audio-in stage that nothing frees
        self.session.receive_message(raw)
        self._pump()

    def feed_event(self, event: dict[str, Any]) -> None:
        if self.session.closed:
            return
        self.session.receive_event(event)
        self._pump()

    def report(self, exc: ProtocolError) -> None:
        """A client message the transport refused before parsing (e.g. too large): an ``error`` event."""
        self.session.send_error(exc)
        self._pump()

    def _on_audio_in(self, stage: str, event: AsrEvent) -> None:
        """Listener for the audio-in stage: every event is typed (``omni_rt.contracts.payloads``: the stage's
        events, its replies to acknowledged ops, an error, an expiry) and goes to the session as it is."""
        self.session.receive_asr(event)
        self._pump()

    def request_close(self, code: int, reason: str) -> None:
        """Close from the server side (shutdown): the active answer ends cancelled, then the socket closes."""
        self.session.close()
        self._pump()
        self.close_request = cmd.CloseConnection(code, reason)
        self._wake.set()

    async def close(self) -> None:
        """Free everything: the session's answers, its audio-in state, every running task."""
        self.session.close()
        self._pump()
        for task in list(self._tasks.values()):
            task.cancel()
        self._wake.set()

    # ---- outputs -------------------------------------------------------------------------------------
    async def next_events(self) -> list[dict[str, Any]] | None:
        """The next batch of server events to send; ``None`` once the session is closed and drained."""
        while True:
            events = self.session.events_to_send()
            if events:
                return events
            if self.session.closed or self.close_request is not None:
                return None
            self._wake.clear()
            await self._wake.wait()

    # ---- machinery -----------------------------------------------------------------------------------
    def _pump(self) -> None:
        coord = self.runtime.coordinator
        sid = self.session.id
        for c in self.session.commands():
            if isinstance(c, cmd.AppendAudio):
                coord.append(sid, self.audio_in, c.pcm)
            elif isinstance(c, cmd.StartResponse):
                self._tasks[c.response_id] = asyncio.create_task(self._run(c.response_id, c.payload), name=f"response-{c.response_id}")
            elif isinstance(c, cmd.PrefillHint):
                coord.prefill_hint(sid, self.response_entry, c.payload)
            elif isinstance(c, cmd.AbortResponse):
                task = self._tasks.pop(c.response_id, None)
                coord.abort(c.response_id)
                if task is not None:
                    task.cancel()
            elif isinstance(c, cmd.OpenAudioIn):
                coord.open_session(sid, self.audio_in, c, self._on_audio_in)
            elif isinstance(c, cmd.SessionOp):  # update, commit, clear, response done: to the stage as they are
                coord.session_control(sid, self.audio_in, c)
            elif isinstance(c, cmd.CloseAudioIn):
                coord.close_session(sid)
            elif isinstance(c, cmd.PausePlayback):
                if self.on_playback is not None:
                    self.on_playback(c.paused)
            elif isinstance(c, cmd.CloseConnection):
                self.close_request = c
        self._observe()
        self._wake.set()

    def _observe(self) -> None:
        m = self.runtime.metrics
        for name, value in self.session.observations():
            if name.startswith("error."):
                m.errors.labels(code=name.removeprefix("error.")).inc()
            elif name == "ttfa":
                m.ttfa.observe(value)
            elif name.startswith("speculative_"):
                m.speculative.labels(outcome=name.removeprefix("speculative_")).inc()
            elif name.startswith("stage:"):  # stage:<stage>:<queue|compute>
                _, stage, kind = name.split(":", 2)
                m.observe_stage(stage, kind, value)
            else:
                m.stage_latency.labels(stage=name).observe(value)

    def _observe_timings(self, result: ResultItem) -> None:
        """An answer finished: where each stage's first output waited and computed (aborted or discarded
        answers never get here, so only answered turns count)."""
        m = self.runtime.metrics
        for stage, t in result.timings.items():
            m.observe_stage(stage, "queue", t.queue_s)
            m.observe_stage(stage, "compute", t.compute_s)

    async def _run(self, response_id: str, payload: dict[str, Any]) -> None:
        coord = self.runtime.coordinator
        try:
            async with contextlib.aclosing(coord.stream(response_id, payload, entry=self.response_entry)) as stream:
                async for out in stream:
                    if isinstance(out, StreamItem):
                        role = self.role_of.get(out.stage)
                        if role is not None:
                            self.session.receive_output(response_id, role, out.data)
                    elif isinstance(out, ResultItem):
                        self._observe_timings(out)
                        self.session.receive_result(response_id, out.data)
                    self._pump()
        except PipelineError as exc:
            if exc.code != "aborted":
                self.runtime.metrics.errors.labels(code=exc.code).inc()
            self.session.receive_failure(response_id, exc.code, exc.stage, str(exc))
            self._pump()
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - whatever broke, the answer still ends with one response.done
            log.exception("response %s: unexpected error while relaying its output", response_id)
            coord.abort(response_id)
            self.session.receive_failure(response_id, "server_error", "session", "unexpected error (see the log)")
            self._pump()
        else:  # the stream ended: without a result (never expected) the answer still ends; else a no-op
            self.session.receive_failure(response_id, "server_error", "coordinator", "the stream ended without a result")
            self._pump()
        finally:
            self._tasks.pop(response_id, None)

    def live_state(self) -> dict[str, int]:
        return {"tasks": len(self._tasks), **self.session.live_state()}
