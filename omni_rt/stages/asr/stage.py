"""ASR stage: VAD + streaming Whisper on a SessionScheduler, one state per session across turns.

Why one module of ~530 lines: ~60 of them are this docstring (why each timing is what it is), and the rest
is one per-session state machine (VAD -> speculative decode -> verdict -> turn end) that reads best in one
class, ``AsrWorker``; its components (below), its turn rule (``turn_rule``) and its factory (``factory``) are
modules of their own beside it.

Three components, each its own module, with ``AsrWorker`` wiring them to the session's ops and events:
VAD segmentation (``turn_audio.TurnAudio``: the stream, Silero, the turn's audio), turn scoring for
``semantic_vad`` (``turn_scoring``: Smart Turn's score and the transcript's words -> the silence that ends the
turn) and decoding (``decoding.DecodeQueue``: one Whisper worker, fair across sessions, batched).

Why decode during the silence: Whisper encodes a fixed window (at least ``min_window_s``, whatever the audio
length), so its cost does not shrink with a short turn, and waiting for ``speech_stopped`` before decoding puts that whole cost on the critical path.
Once the VAD has seen ``speculative_after_ms`` of trailing silence we transcribe the turn; if no speech
follows before ``silence_duration_ms`` ends the turn, that transcript *is* the final one and is ready the moment
the turn ends. A session alone on the server starts sooner, at ``speculative_alone_after_ms``: a decode wasted
on a short pause then delays nobody, and the held answer is more often ready when the turn ends, while with
several sessions the extra decodes on shared cores cost more than they gain, so shared sessions keep the longer
one (the numbers: docs/tuning-cpu.md, "decode in the silence, alone").

Partials (``TranscriptPartial``): while the user speaks, the growing turn is decoded every
``partial_interval_ms`` of audio (``partial_alone_interval_ms`` for a session alone on the server), for the
client's transcription deltas and for the session's prefill hints (the thinker prefills the answer's prompt
with the words so far, so only the last words are left for the end of the turn). A partial never queues ahead
of a final and never starts in a pause (``PARTIAL_IN_PAUSE_MS``), where the speculative decode is due.

Whisper runs on a decode worker thread, never on the session thread: the VAD keeps up with the audio (a
late ``speech_stopped`` is latency too) while a decode is in flight. Finished decodes come back through the
inbox as ``_decoded`` ops, so all per-session state is still touched by one thread only. An ``epoch`` per
session tells a decode that is still valid from one made stale by new speech.

``semantic_vad`` (the rule and its numbers in ``omni_rt.stages.asr.turn_rule``): at each pause of
``SCORE_AFTER_MS`` the Smart Turn model scores the turn so far (``omni_rt.stages.asr.turn_scoring``, its own worker
thread) while the speculative Whisper decode of the same audio runs on the decode worker (started at that
point); the verdict needs both, the sound and the words of that transcript. A session alone on the server
decodes first (at ``SEMANTIC_DECODE_ALONE_AFTER_MS``) and scores once the words are in (``_words_first``).
The transcript is announced (``transcript.speculative``, which starts the held answer) only once the verdict
says the turn's end is near, or, alone, once the words end the turn whatever the sound (``_likely_end``); the turn ends when
the verdict's silence has passed; an unsure verdict on words that can end is scored once more at
``SECOND_LOOK_MS`` (Smart Turn is surer of a finished sentence later). A hesitation pause thus costs one or two
scores and one decode, never an answer;
decodes still queued behind a pause that speech has since ended are skipped, so a wrong guess does not delay
the real turn's decode.

``idle_timeout_ms`` (``server_vad``): after that much audio without speech since the later of the last turn's
end and the end of the last answer's playback (op ``response_done`` with the answer's ``audio_ms``), the stage
emits ``timeout_triggered`` and commits the (silent) buffer as a turn.

Fairness and batching: ``omni_rt.stages.asr.decoding``. A session may have ``max_queued_decodes``
waiting; a commit beyond that is refused with ``input_audio_buffer_commit_busy`` and its audio stays in
the buffer (nothing is lost: commit again once transcripts arrive). Every commit gets its own ``turn``
number, carried by ``Committed`` and by the turn's ``TranscriptFinal``, so a session matches transcripts to
turns by number, never by arrival.

Noise reduction (``AudioInSettings.noise_reduction``, the session's ``audio.input.noise_reduction``): a session
that asks for it gets its own ``omni_rt.backends.denoise.StreamingDenoiser``, and every append is denoised before
``TurnAudio`` sees it, so Silero, Smart Turn and Whisper all hear the denoised stream. The denoiser returns as many
samples as it takes, a fixed ~12 ms later (its zeros first), so the stream clock counts the client's samples
whether it is on or off; turning it off drops its delayed last ~12 ms for the same reason. A preset can turn it
off for the whole server (``denoiser=None``): the session's update is then refused with
``noise_reduction_unavailable``.

Backchannels (``omni_rt.stages.asr.interruption``, the decision and why it is made from Whisper's words): while
the session's answer is heard (``AnswerStarted`` .. ``ResponseDone`` plus its audio's length) a speech start is
held as a candidate (``InterruptionCandidate``), transcribed once ``FIRST_LOOK_MS`` of it is in and at its pause,
and either emitted as the ``SpeechStarted`` it would have been (an interruption: the turn goes on as any other) or
dropped with its audio (``BackchannelDropped``). While a candidate is undecided no partial, speculative decode or
turn verdict runs on it. The preset's ``backchannel_filter: false`` turns it off: every speech start is a barge-in
(the server's ``--no-backchannel-filter`` does it in the session: it never sends ``AnswerStarted``).

Session ops (``omni_rt.contracts.audio_in``, typed): ``OpenAudioIn`` and ``UpdateAudioIn`` (the session's
``AudioInSettings``: turn detection, partials and noise reduction; an update is answered ``AudioInUpdated`` or
``AudioInUpdateRefused``), ``CommitAudioIn`` (end the turn now: manual turn taking), ``ClearAudioIn`` (drop
buffered audio), ``ResponseDone``, ``AnswerStarted``. Appends are float32 16 kHz arrays. Events out (``omni_rt.contracts.payloads``, each tagged with its turn number): ``SpeechStarted``,
``SpeechStopped``, ``Committed``, ``Cleared``, ``TranscriptPartial``, ``TranscriptSpeculative``,
``SpeculationCancelled``, ``TranscriptFinal``, ``TurnScored``, ``TimeoutTriggered``, ``InterruptionCandidate``,
``BackchannelDropped``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.pipeline.schedulers.session import Session, SessionLimitError, SessionScheduler
from omni_rt.audio import PIPELINE_INPUT_RATE
from omni_rt.contracts.audio_in import (
    NOISE_REDUCTION_UNAVAILABLE,
    AnswerStarted,
    ClearAudioIn,
    CommitAudioIn,
    OpenAudioIn,
    ResponseDone,
    UpdateAudioIn,
)
from omni_rt.contracts.turn_detection import TurnDetectionConfig
from omni_rt.stages.asr.decoding import DecodeJob, DecodeQueue, Transcriber
from omni_rt.stages.asr.interruption import (
    CONFIRM_LOOKS,
    FIRST_LOOK_MS,
    MAX_BACKCHANNEL_MS,
    MAX_DECODES,
    NEXT_LOOK_MS,
    PAUSE_MS,
    READING_MARGIN,
    AnswerPlayback,
    Candidate,
    decide,
    heard,
    listener_readings,
)
from omni_rt.stages.asr.turn_audio import TurnAudio
from omni_rt.stages.asr.turn_rule import SCORE_AFTER_MS, SECOND_LOOK_MS, TurnDetection
from omni_rt.stages.asr.turn_scoring import PauseVerdict, TurnScorer
from omni_rt.contracts.payloads import (
    BackchannelDropped,
    Cleared,
    Committed,
    InterruptionCandidate,
    SpeculationCancelled,
    SpeechStarted,
    SpeechStopped,
    TimeoutTriggered,
    TranscriptFinal,
    TranscriptPartial,
    TranscriptSpeculative,
    TurnScored,
)

__all__ = ["AsrState", "AsrWorker"]

log = logging.getLogger("omni_rt.asr")

SAMPLE_RATE = PIPELINE_INPUT_RATE
# a partial decode starts only while the sound goes on (the first 2 Silero frames of a pause are a stop inside a
# word as often as not): one started later still runs when the speculative decode is due, and delays it
PARTIAL_IN_PAUSE_MS = 64
# semantic_vad, a session alone on the server: its speculative decode starts here, before the score point
# (``SCORE_AFTER_MS``, where Smart Turn scores): the verdict needs Whisper's words (~100-150 ms) and the held
# answer starts from them, so both come ~55 ms sooner; a decode wasted on a stop inside a sentence delays no one
# else (numbers: docs/tuning-cpu.md, "A session alone, words first"). Shared sessions keep the score point (the
# decodes are shared).
SEMANTIC_DECODE_ALONE_AFTER_MS = PARTIAL_IN_PAUSE_MS


@dataclass
class AsrState:
    td: TurnDetection
    seg: TurnAudio  # the stream, its VAD and the current turn's audio (or the uncommitted buffer)
    last_partial_samples: int = 0
    speculative: str | None = None  # text decoded in the silence for the current epoch
    spec_pending: bool = False  # a speculative decode for the current epoch is in flight
    awaiting_final: dict[str, Any] | None = None  # a finished turn waiting for its in-flight speculative decode
    epoch: int = 0  # bumped when speech resumes or a turn ends: older decodes no longer describe the turn
    partials: bool = True
    turn: int = 0
    spec_announced: bool = False  # transcript.speculative was sent for the current epoch
    verdict: PauseVerdict = field(default_factory=PauseVerdict)  # semantic_vad: sound and words on the current pause
    idle_from: int | None = 0  # stream sample from which the idle timeout counts (None: not counting)
    denoise: Any = None  # the session's StreamingDenoiser (noise_reduction on), else None
    noise_reduction: str | None = None  # the type the session asked for (near_field / far_field)
    playback: AnswerPlayback = field(default_factory=AnswerPlayback)  # when the session's answer is heard
    candidate: Candidate | None = None  # speech over the answer, not yet decided (interruption.py)


class AsrWorker(SessionScheduler):
    def __init__(
        self,
        transcriber: Transcriber,
        vad_model: Any,
        speculative_after_ms: int = 150,
        partial_interval_ms: int = 1200,
        max_turn_s: float = 30.0,
        speculative_alone_after_ms: int | None = None,
        partial_alone_interval_ms: int | None = None,
        turn_model: Any = None,
        semantic_announce_lead_ms: int = 700,
        max_queued_decodes: int = 16,
        max_batch: int = 1,
        vad_sound_end_ratio: float | None = None,
        denoiser: Any = None,
        backchannel_filter: bool = True,
        **limits: Any,
    ) -> None:
        super().__init__(name="asr", **limits)
        self.transcriber = transcriber
        self.vad_model = vad_model
        self.vad_sound_end_ratio = vad_sound_end_ratio  # None: StreamingVAD's default (omni_rt.backends.vad)
        self.semantic_announce_lead_ms = semantic_announce_lead_ms
        self.speculative_after_ms = speculative_after_ms
        self.speculative_alone_after_ms = speculative_after_ms if speculative_alone_after_ms is None else speculative_alone_after_ms
        self.partial_interval_samples = int(partial_interval_ms * SAMPLE_RATE / 1000)
        alone = partial_interval_ms if partial_alone_interval_ms is None else partial_alone_interval_ms
        self.partial_alone_interval_samples = int(alone * SAMPLE_RATE / 1000)
        self.max_turn_samples = int(max_turn_s * SAMPLE_RATE)
        self.counters = {"turns": 0, "speculative_hits": 0, "speculative_misses": 0, "turn_scores": 0, "turn_second_looks": 0,
                         "semantic_early_ends": 0, "stale_decodes_skipped": 0,
                         "decode_batches": 0, "batched_decodes": 0, "max_batch_seen": 0}
        post = lambda sid, data: self.inbox.put(IncomingMessage(sid, "new_request", data))  # noqa: E731
        self._decoder = DecodeQueue(transcriber, max_batch, post, self.counters)
        # Smart Turn (a SmartTurnModel, a loader returning one, or None); loaded on the first semantic_vad session
        self._turns = TurnScorer(turn_model, post)
        self.max_queued_decodes = max_queued_decodes
        # the RNNoise library (omni_rt.backends.denoise.RNNoiseLibrary), a str saying why there is none (the package
        # is missing), or None: the preset turned noise reduction off
        self.denoiser = denoiser
        # speech over a heard answer is decided (backchannel or interruption) before it barges in
        self.backchannel_filter = backchannel_filter
        self.counters.update({"backchannels_dropped": 0, "interruptions": 0})

    @property
    def max_batch(self) -> int:
        return self._decoder.max_batch

    @property
    def _alone(self) -> bool:
        """One session on the server: its speculative work (an early decode, a frequent partial, a held answer
        on an unsure verdict) delays no one else, so it gets the sooner timings."""
        return len(self.sessions) == 1

    @property
    def _words_first(self) -> bool:
        """semantic_vad, a session alone on the server: Whisper first, then Smart Turn, and the held answer starts
        from the words alone when they end the turn whatever the sound (``Eagerness.ends_whatever_the_sound``;
        Smart Turn only picks the silence then). Side by side on two cores, Whisper's two threads and Smart Turn's
        one slowed each other (a decode ~80 ms alone took ~155 beside the score; the verdict was in at ~255 ms of
        silence); one after the other the words are in ~190 and Smart Turn scores beside the answer's first
        tokens (one llama.cpp thread). Shared sessions keep both side by side at the score point."""
        return self._alone

    @property
    def _decodes_in_flight(self) -> int:
        return self._decoder.in_flight

    def stats(self) -> dict[str, float]:
        """Counters: turns, speculation, ``decode_batches`` (worker runs of 2+ sessions) and their decodes."""
        return dict(self.counters)

    def start(self) -> None:
        self._decoder.start()
        self._turns.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        self._decoder.stop()
        self._turns.stop()

    def _handle(self, msg: IncomingMessage) -> None:
        data = msg.data if msg.type == "new_request" else None
        op = data.get("op") if isinstance(data, dict) else None
        if op == "_decoded":
            self._decoder.returned(msg.request_id)
        if op not in ("_decoded", "_scored") or msg.request_id in self.sessions:  # else: closed while it ran
            super()._handle(msg)
        if op == "_decoded":
            self._decoder.pump()

    def on_close(self, session: Session) -> None:
        self._decoder.drop_session(session.session_id)
        st = session.state.get("asr")
        if st is not None and st.denoise is not None:
            st.denoise.close()

    def queued_decodes(self, session_id: str) -> int:
        return self._decoder.queued(session_id)

    def turn_model(self) -> Any:
        """The Smart Turn model, loaded once; a missing model is a clear error naming the package and file."""
        return self._turns.model()

    def _decode(self, session_id: str, kind: str, audio: np.ndarray, wanted: Any = None, scored: bool = False,
                brief: bool = False, readings: Any = None, **meta: Any) -> None:
        """Transcribe on the decode worker; the result returns to the session thread as a ``_decoded`` op
        (``scored``: with the last word's probability, for semantic_vad's verdict; ``brief``: its first words;
        ``readings``: texts to weigh against what a brief look heard)."""
        self._decoder.submit(DecodeJob(session_id, kind, audio.copy(), wanted, meta, scored, brief, readings))

    # ---- helpers ---------------------------------------------------------------------------------
    def _new_vad(self, td: TurnDetection) -> Any:
        from omni_rt.backends.vad import StreamingVAD

        return StreamingVAD(
            self.vad_model,
            threshold=td.threshold,
            prefix_padding_ms=td.prefix_padding_ms,
            silence_duration_ms=td.silence_duration_ms,
            sample_rate=SAMPLE_RATE,
            silence_from_sound_end=td.silence_from_sound_end,
            **({} if self.vad_sound_end_ratio is None else {"sound_end_ratio": self.vad_sound_end_ratio}),
        )

    def _state(self, s: Session) -> AsrState:
        return s.state["asr"]

    def _reset_turn(self, s: Session, st: AsrState, keep_ms: int = 0) -> None:
        st.seg.keep_last(keep_ms)
        st.last_partial_samples = 0
        st.speculative = None
        st.spec_pending = False
        st.spec_announced = False
        st.epoch += 1
        st.verdict.new_pause()
        s.buffered_bytes = st.seg.samples * 2

    def _ms(self, samples: int) -> int:
        return int(samples * 1000 / SAMPLE_RATE)

    # ---- session hooks ---------------------------------------------------------------------------
    def _turn_detection(self, cfg: TurnDetectionConfig | None) -> TurnDetection:
        """``cfg``: the session's parsed ``turn_detection`` (None: the client commits)."""
        td = TurnDetection.from_config(cfg)
        if td.semantic is not None:
            self.turn_model()  # load now: a missing model is an error at session.update, not mid-turn
        return td

    def _new_denoiser(self, kind: str | None) -> Any:
        """A fresh per-session denoiser for ``kind`` (None: none); refused with a clear error where the server
        has none."""
        if kind is None:
            return None
        if self.denoiser is None or isinstance(self.denoiser, str):
            why = self.denoiser or "this server's preset turned noise reduction off (stage 'asr' field 'noise_reduction')"
            raise SessionLimitError(NOISE_REDUCTION_UNAVAILABLE, f"noise_reduction is not available: {why}")
        from omni_rt.backends.denoise import StreamingDenoiser

        return StreamingDenoiser(self.denoiser, SAMPLE_RATE)

    def on_open(self, session: Session) -> None:
        op = session.params
        if not isinstance(op, OpenAudioIn):
            raise TypeError(f"the ASR stage opens a session with an OpenAudioIn op, not {type(op).__name__}")
        error: SessionLimitError | None = None
        try:
            td = self._turn_detection(op.settings.turn_detection)
        except SessionLimitError as exc:  # open the session anyway, with server_vad, and say why
            td, error = TurnDetection(), exc
        st = AsrState(td=td, seg=TurnAudio(self._new_vad(td), SAMPLE_RATE), partials=op.settings.partials)
        session.state["asr"] = st
        try:
            st.denoise, st.noise_reduction = self._new_denoiser(op.settings.noise_reduction), op.settings.noise_reduction
        except SessionLimitError as exc:  # open it anyway, without, and say why
            error = error or exc
        if error is not None:
            self.emit_error(session.session_id, str(error), code=error.code)

    def on_control(self, session: Session, op: str, data: Any) -> None:
        """``data``: a typed op (``omni_rt.contracts.audio_in``), or the dict of an internal ``_decoded`` /
        ``_scored`` op that this stage's own workers post back to its inbox."""
        st = self._state(session)
        if isinstance(data, UpdateAudioIn):
            td = self._turn_detection(data.settings.turn_detection)  # raises before anything changes
            nr = data.settings.noise_reduction
            denoise = self._new_denoiser(nr) if (nr is None) != (st.noise_reduction is None) else st.denoise
            if td != st.td:
                st.td, st.seg.vad = td, self._new_vad(td)
            st.partials = data.settings.partials
            if denoise is not st.denoise:
                if st.denoise is not None:  # its delayed ~12 ms are dropped: the stream clock counts the client's samples
                    st.denoise.close()
                st.denoise = denoise
            st.noise_reduction = nr
        elif isinstance(data, ResponseDone):
            # the idle clock restarts once the answer has played (its audio length from now, an upper bound)
            audio = int(float(data.audio_ms or 0) * SAMPLE_RATE / 1000)
            st.idle_from = st.seg.stream_samples + audio
            st.playback.done(st.seg.stream_samples, audio, data.played)
        elif isinstance(data, AnswerStarted):
            if self.backchannel_filter:
                st.playback.started(st.seg.stream_samples)
        elif op == "_scored":
            self._scored(session, st, data)
        elif isinstance(data, CommitAudioIn):
            if st.seg.samples == 0:
                raise SessionLimitError(
                    "input_audio_buffer_commit_empty", "buffer is empty: append audio before committing"
                )
            if self.queued_decodes(session.session_id) >= self.max_queued_decodes:
                raise SessionLimitError(
                    "input_audio_buffer_commit_busy",
                    f"{self.max_queued_decodes} committed turns of this session are still waiting to be "
                    "transcribed; the audio stays in the buffer: commit again after a transcript arrives",
                )
            if st.candidate is not None:  # the client ends the turn: the speech was meant
                self._interrupt(session, st, finish=False)
            if st.seg.vad.in_speech:
                self.emit(session.session_id, "event", SpeechStopped(st.turn + 1, self._ms(st.seg.stream_samples)))
                st.seg.vad.reset()
            self._finish_turn(session, st, trigger="commit")
        elif op == "_decoded":
            self._decoded(session, st, data)
        elif isinstance(data, ClearAudioIn):
            if st.candidate is not None:  # its audio is gone: nothing to decide, a paused playback goes on
                self._drop_candidate(session, st, "")
            st.seg.vad.reset()
            self._reset_turn(session, st)
            self.emit(session.session_id, "event", Cleared(st.turn + 1))
        else:
            super().on_control(session, op, data)

    def buffered_bytes(self, session: Session, data: Any) -> int:
        return int(np.asarray(data).size) * 2  # counted as PCM16, the size a client sent

    def on_append(self, session: Session, data: Any) -> None:
        st = self._state(session)
        audio = np.asarray(data, dtype=np.float32)
        if st.denoise is not None:
            audio = st.denoise.process(audio)
        events = st.seg.append(audio, detect=st.td.enabled)
        if not st.td.enabled:
            return
        sid = session.session_id
        for ev in events:
            if ev.kind == "speech_started":
                # keep prefix padding before the speech start, drop older silence
                keep_ms = self._ms(st.seg.stream_samples) - ev.audio_ms  # audio_ms already includes the prefix padding
                self._reset_turn(session, st, keep_ms=max(0, keep_ms))
                st.idle_from = None
                if st.playback.audible(st.seg.stream_samples):  # over the answer: decided before it barges in
                    onset = int(ev.speech_ms * SAMPLE_RATE / 1000)
                    st.candidate = Candidate(onset=onset, audio_start_ms=ev.audio_ms, epoch=st.epoch)
                    self.emit(sid, "event", InterruptionCandidate(st.turn + 1, ev.audio_ms))
                else:
                    self.emit(sid, "event", SpeechStarted(st.turn + 1, ev.audio_ms))
            elif ev.kind == "speech_stopped" and st.candidate is not None:
                st.candidate.stopped_ms = ev.audio_ms  # the turn ends once the candidate is decided
                st.candidate.sound_end = int(ev.speech_ms * SAMPLE_RATE / 1000)
            elif ev.kind == "speech_stopped":
                self.emit(sid, "event", SpeechStopped(st.turn + 1, ev.audio_ms))
                self._finish_turn(session, st, trigger="vad")
        if st.candidate is not None:
            self._candidate_step(session, st)
            if st.candidate is not None:  # undecided: no partial, speculative decode or verdict on it yet
                return
        if st.seg.vad.in_speech:
            if st.td.semantic is not None:
                self._semantic_pause(session, st)
            if st.seg.vad.in_speech:
                self._maybe_decode_early(session, st)
        else:
            self._maybe_idle_timeout(session, st)
            # outside speech only the padding window is worth keeping
            pad = int((st.td.prefix_padding_ms + 100) * SAMPLE_RATE / 1000)
            if st.seg.samples > 4 * pad:
                self._reset_turn(session, st, keep_ms=st.td.prefix_padding_ms + 100)
        if st.seg.samples > self.max_turn_samples and st.seg.vad.in_speech:
            self.emit(sid, "event", SpeechStopped(st.turn + 1, self._ms(st.seg.stream_samples), forced=True))
            st.seg.vad.reset()
            self._finish_turn(session, st, trigger="max_turn")

    def _maybe_decode_early(self, session: Session, st: AsrState) -> None:
        sid = session.session_id
        if st.td.semantic is not None:  # the score point counts from the sound's end (TurnDetection)
            pause_ms = SEMANTIC_DECODE_ALONE_AFTER_MS if self._alone else SCORE_AFTER_MS
            silence = st.seg.vad.sound_silence_ms
        else:
            pause_ms = self.speculative_alone_after_ms if self._alone else self.speculative_after_ms
            silence = st.seg.vad.silence_ms
        if silence >= pause_ms:
            # semantic_vad, shared sessions: Whisper starts at the pause the turn model scores, side by side with
            # it: gated on the verdict, the decode would add the whole score to the transcript's time (more on a
            # loaded machine; docs/tuning-cpu.md, "Shared sessions"); the answer stays gated on
            # the verdict. Alone, the decode comes first (``_words_first``)
            if st.speculative is None and not st.spec_pending:
                st.spec_pending = True
                st.last_partial_samples = st.seg.samples
                epoch = st.epoch
                wanted = None
                if st.td.semantic is not None:  # skip it if speech resumed while it queued (a benign cross-thread read)
                    wanted = lambda: st.epoch == epoch or (st.awaiting_final or {}).get("epoch") == epoch  # noqa: E731
                self._decode(sid, "speculative", st.seg.audio(), wanted=wanted, scored=st.td.semantic is not None,
                             epoch=epoch, turn=st.turn + 1)
            elif st.speculative is not None and not st.spec_announced and self._likely_end(st):
                self._announce(sid, st, st.speculative, asr_ms=0.0)
            return
        if st.speculative is not None or st.spec_pending:  # speech resumed: the guess (and what it started) is stale
            if st.spec_announced:
                self.emit(sid, "event", SpeculationCancelled(st.turn + 1))
            st.speculative, st.spec_pending, st.spec_announced = None, False, False
            st.epoch += 1
            if st.td.semantic is not None:
                st.verdict.new_pause()  # the words it heard were that pause's
        interval = self.partial_alone_interval_samples if self._alone else self.partial_interval_samples
        due = st.seg.samples - st.last_partial_samples >= interval
        # never queue a partial ahead of a final, nor start one in a pause (the speculative decode comes then)
        if st.partials and due and self._decodes_in_flight == 0 and st.seg.vad.sound_silence_ms < PARTIAL_IN_PAUSE_MS:
            st.last_partial_samples = st.seg.samples
            self._decode(sid, "partial", st.seg.audio(), epoch=st.epoch, turn=st.turn + 1)

    # ---- speech over a heard answer (interruption.py) ------------------------------------------------
    def _candidate_step(self, session: Session, st: AsrState) -> None:
        """Decide the candidate if its words so far allow; else start the decode it needs next (the first look,
        one per ``FIRST_LOOK_MS`` of further speech, one at its pause), at most ``MAX_DECODES``."""
        cand = st.candidate
        assert cand is not None
        now = st.seg.stream_samples
        if cand.stopped_ms is not None:
            sound_end = cand.sound_end
        else:
            sound_end = now - int(st.seg.vad.sound_silence_ms * SAMPLE_RATE / 1000)
        paused = cand.stopped_ms is not None or st.seg.vad.sound_silence_ms >= PAUSE_MS
        covered = cand.decoded_to >= sound_end or cand.decodes >= MAX_DECODES
        # how long the sound has lasted (not the silence after it, nor the wait for a decode)
        sound_ms = cand.speech_ms(sound_end if paused else now, SAMPLE_RATE)
        earlier = cand.history[-2] if len(cand.history) >= 2 else None
        verdict = decide(cand.text, sound_ms, paused and covered and not cand.pending, earlier, CONFIRM_LOOKS)
        if verdict == "interruption":
            self._interrupt(session, st)
            return
        if verdict == "backchannel":
            self._drop_candidate(session, st, cand.text or "")
            return
        if cand.pending or cand.decodes >= MAX_DECODES:
            return
        first, nxt = int(FIRST_LOOK_MS * SAMPLE_RATE / 1000), int(NEXT_LOOK_MS * SAMPLE_RATE / 1000)
        if (paused and not covered) or (cand.decodes == 0 and now - cand.onset >= first) or (cand.decodes and now - cand.decoded_to >= nxt):
            cand.pending, cand.decoded_to = True, now
            cand.decodes += 1
            # a look may still be a listener's response: what it heard is weighed against listener readings
            weigh = READING_MARGIN > 0 and sound_ms <= MAX_BACKCHANNEL_MS
            self._decode(session.session_id, "candidate", st.seg.audio(), brief=True,
                         readings=listener_readings if weigh else None, epoch=cand.epoch, turn=st.turn + 1)

    def _candidate_decoded(self, session: Session, st: AsrState, data: dict[str, Any]) -> None:
        cand = st.candidate
        if cand is None or data["epoch"] != cand.epoch:
            return  # decided (or cleared) while it ran
        cand.pending, cand.text = False, heard(data["text"], data.get("reading"), READING_MARGIN)
        cand.history.append(cand.text)
        cand.raw.append(data["text"])
        self._candidate_step(session, st)

    def _decision_ms(self, st: AsrState, cand: Candidate) -> float:
        return round(cand.speech_ms(st.seg.stream_samples, SAMPLE_RATE), 1)

    def _interrupt(self, session: Session, st: AsrState, finish: bool = True) -> None:
        """The candidate is a real interruption: the held ``SpeechStarted`` goes out with its onset, and the turn
        goes on as any barge-in (``finish``: and ends now if the VAD already heard its end)."""
        cand, st.candidate = st.candidate, None
        assert cand is not None
        self.counters["interruptions"] += 1
        decision_ms = self._decision_ms(st, cand)
        log.debug("session %s: interruption after %.0f ms (%s; Whisper wrote %s)", session.session_id, decision_ms,
                  cand.history, cand.raw)
        self.emit(session.session_id, "event", SpeechStarted(st.turn + 1, cand.audio_start_ms, decision_ms=decision_ms))
        if finish and cand.stopped_ms is not None:
            self.emit(session.session_id, "event", SpeechStopped(st.turn + 1, cand.stopped_ms))
            self._finish_turn(session, st, trigger="vad")

    def _drop_candidate(self, session: Session, st: AsrState, text: str) -> None:
        """A backchannel (or no words): its audio and speech are dropped, no turn begins; the VAD ends the
        speech now (keeping its state) so the next speech start is found as usual."""
        cand, st.candidate = st.candidate, None
        assert cand is not None
        self.counters["backchannels_dropped"] += 1
        if cand.stopped_ms is not None:
            speech_end = cand.sound_end
        else:
            speech_end = st.seg.stream_samples - int(st.seg.vad.sound_silence_ms * SAMPLE_RATE / 1000)
        if st.seg.vad.in_speech:
            st.seg.vad.force_stop()
        self._reset_turn(session, st)
        st.idle_from = st.seg.stream_samples
        self.emit(session.session_id, "event", BackchannelDropped(st.turn + 1, text.strip(),
                                                                  round((speech_end - cand.onset) * 1000 / SAMPLE_RATE, 1),
                                                                  self._decision_ms(st, cand)))

    # ---- semantic_vad and idle timeout -------------------------------------------------------------
    def _likely_end(self, st: AsrState) -> bool:
        """server_vad: any pause past ``speculative_after_ms``; semantic_vad: the turn's end (per the verdict) is
        near, or, for a session alone on the server, the verdict ends the turn at all (a held answer wasted on a
        pause that speech resumes after then delays nobody, and an unsure verdict's answer starts at the verdict
        instead of ``semantic_announce_lead_ms`` before the end: most complete turns that end at the second look
        started their answer at 300 ms of silence, the verdict having been in since ~190 ms)."""
        sem = st.td.semantic
        if sem is None:
            return True
        if st.seg.vad.sound_silence_ms < SCORE_AFTER_MS:
            return False
        if self._alone and st.verdict.decided(sem) or self._words_first and sem.ends_whatever_the_sound(st.verdict.words):
            return True
        # a decode (and the held answer) starts this long before the turn would end on the current verdict
        return st.seg.vad.silence_ms >= st.verdict.end_silence_ms(sem) - self.semantic_announce_lead_ms

    def _announce(self, sid: str, st: AsrState, text: str, asr_ms: float) -> None:
        """Let the session start the held answer from the speculative transcript."""
        st.spec_announced = True
        self.emit(sid, "event", TranscriptSpeculative(st.turn + 1, text, asr_ms))

    def _semantic_pause(self, session: Session, st: AsrState) -> None:
        """At a pause, score it once (the words come from the speculative decode); end the turn when the verdict's
        silence has passed."""
        sem, v = st.td.semantic, st.verdict
        assert sem is not None
        silence = st.seg.vad.silence_ms  # the verdict's silences: from Silero's frames (TurnDetection)
        if st.seg.vad.sound_silence_ms < SCORE_AFTER_MS:
            if v.prob is not None or v.pending:  # speech resumed: that score was another pause's (words: see above)
                v.new_pause()
            return
        if v.prob is None and not v.pending:
            if self._words_first and v.words is None:
                return  # Smart Turn waits for the words
            self.counters["turn_scores"] += 1
            self._turns.score(session.session_id, st.seg.audio(), SAMPLE_RATE, v)
        elif v.decided(sem) and silence >= v.end_silence_ms(sem):
            self._end_turn_now(session, st)
        elif silence >= SECOND_LOOK_MS and v.wants_second_look(sem):
            self.counters["turn_second_looks"] += 1
            self._turns.score(session.session_id, st.seg.audio(), SAMPLE_RATE, v, look=2)

    def _scored(self, session: Session, st: AsrState, data: dict[str, Any]) -> None:
        v = st.verdict
        if data.get("error"):
            v.pending = False
            raise RuntimeError(f"turn model failed: {data['error']}")
        if data["pause"] != v.pause or data["prob"] is None or not st.seg.vad.in_speech:
            return  # a pause that speech (or the turn's end) has already closed
        v.pending, v.score_ms, v.queue_ms = False, data["score_ms"], data.get("queue_ms", 0.0)
        if data.get("look", 1) == 2:
            v.second = float(data["prob"])
        else:
            v.prob = float(data["prob"])
        self._verdict_in(session, st)

    def _verdict_in(self, session: Session, st: AsrState) -> None:
        """Sound or words just arrived: once both are in, report the verdict, let the held answer start if the
        end is near, and end the turn if its silence has already passed."""
        sem, v = st.td.semantic, st.verdict
        if sem is None or v.prob is None or v.words is None:
            return
        end_ms = v.end_silence_ms(sem)
        prob = v.prob if v.second is None else v.second
        self.emit(session.session_id, "event", TurnScored(st.turn + 1, round(prob, 4), end_ms < sem.max_silence_ms,
                                                          round(st.seg.vad.silence_ms), v.score_ms, v.words, end_ms,
                                                          queue_ms=v.queue_ms, look=1 if v.second is None else 2))
        if st.speculative is not None and not st.spec_announced and self._likely_end(st):
            self._announce(session.session_id, st, st.speculative, asr_ms=0.0)
        if v.decided(sem) and st.seg.vad.silence_ms >= end_ms:
            self._end_turn_now(session, st)

    def _end_turn_now(self, session: Session, st: AsrState) -> None:
        ev = st.seg.vad.force_stop()
        self.counters["semantic_early_ends"] += 1
        self.emit(session.session_id, "event", SpeechStopped(st.turn + 1, ev.audio_ms, semantic=True, turn_prob=st.verdict.prob))
        self._finish_turn(session, st, trigger="vad")

    def _maybe_idle_timeout(self, session: Session, st: AsrState) -> None:
        timeout = st.td.idle_timeout_ms
        if timeout is None or st.idle_from is None or not st.td.enabled:
            return
        idle = int(timeout * SAMPLE_RATE / 1000)
        if st.seg.stream_samples - st.idle_from < idle:
            return
        self.emit(session.session_id, "event", TimeoutTriggered(st.turn + 1, self._ms(st.idle_from), self._ms(st.seg.stream_samples)))
        self._finish_turn(session, st, trigger="timeout")

    def _finish_turn(self, session: Session, st: AsrState, trigger: str) -> None:
        sid = session.session_id
        audio = st.seg.audio()
        st.turn += 1
        self.counters["turns"] += 1
        st.idle_from = st.seg.stream_samples
        self.emit(sid, "event", Committed(st.turn, trigger, self._ms(audio.size)))
        meta = {"turn": st.turn, "audio_ms": self._ms(audio.size), "t_end": time.perf_counter(), "trigger": trigger}
        if trigger == "vad" and st.speculative is not None:
            self.counters["speculative_hits"] += 1
            self._emit_final(sid, st.speculative, speculative=True, asr_ms=0.0, **meta)
        elif trigger == "vad" and st.spec_pending:
            self.counters["speculative_hits"] += 1  # the decode in flight covers this turn: wait for it
            st.awaiting_final = {"epoch": st.epoch, **meta}
        else:
            if trigger == "vad":
                self.counters["speculative_misses"] += 1
            self._decode(sid, "final", audio, **meta)
        self._reset_turn(session, st)

    def _decoded(self, session: Session, st: AsrState, data: dict[str, Any]) -> None:
        sid, kind, text = session.session_id, data["kind"], data["text"]
        if data.get("error"):
            raise RuntimeError(f"transcription failed: {data['error']}")
        ran = (data["t_start"], data["t_done"])
        if kind == "final":
            self._emit_final(sid, text, speculative=False, asr_ms=data["asr_ms"], turn=data["turn"],
                             audio_ms=data["audio_ms"], t_end=data["t_end"], trigger=data["trigger"], ran=ran)
        elif kind == "speculative":
            waiting = st.awaiting_final
            if waiting is not None and waiting["epoch"] == data["epoch"]:
                st.awaiting_final = None
                self._emit_final(sid, text, speculative=True, asr_ms=data["asr_ms"], turn=waiting["turn"],
                                 audio_ms=waiting["audio_ms"], t_end=waiting["t_end"], trigger=waiting["trigger"], ran=ran)
            elif data["epoch"] == st.epoch and not data.get("stale"):
                st.speculative, st.spec_pending = text, False
                if st.td.semantic is not None and st.seg.vad.in_speech:
                    st.verdict.hear(text, data.get("last_word_prob"))  # the words of this pause: half of the verdict
                    if self._words_first:
                        self._semantic_pause(session, st)  # Smart Turn's turn now
                # lets the session start answering in the silence; the answer is held until the turn ends
                if self._likely_end(st):
                    self._announce(sid, st, text, asr_ms=data["asr_ms"])
                if st.td.semantic is not None and st.seg.vad.in_speech:
                    self._verdict_in(session, st)
        elif kind == "candidate":
            self._candidate_decoded(session, st, data)
        elif kind == "partial" and data["epoch"] == st.epoch and text:
            self.emit(sid, "event", TranscriptPartial(data["turn"], text))

    def _emit_final(self, sid: str, text: str, speculative: bool, asr_ms: float, turn: int, audio_ms: int, t_end: float,
                    trigger: str = "vad", ran: tuple[float, float] | None = None) -> None:
        """``ran``: when the decode worker ran this transcript's decode. What the end of turn waited for it is
        split into decoding after the end (compute) and everything else (queue: the decode queue, this
        stage's inbox); a transcript ready before the end waited for nothing."""
        after_end = max(0.0, time.perf_counter() - t_end)
        compute = max(0.0, ran[1] - max(ran[0], t_end)) if ran is not None else 0.0
        compute = min(compute, after_end)
        self.emit(sid, "event", TranscriptFinal(turn, text.strip(), speculative, asr_ms,
                                                after_end_ms=round(after_end * 1000, 1), audio_ms=audio_ms, trigger=trigger,
                                                queue_ms=round((after_end - compute) * 1000, 1),
                                                compute_ms=round(compute * 1000, 1)))
