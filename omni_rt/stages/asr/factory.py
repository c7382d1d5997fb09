"""The ASR stage's factory: what a preset's ``asr`` stage names (``omni_rt.stages.asr.factory:create_asr_stage``).
It builds the Whisper backend the preset asks for, Silero, and the ``AsrWorker`` over them, and loads Smart Turn
at start-up."""

from __future__ import annotations

from omni_rt.pipeline.schedulers.session import SessionLimitError
from omni_rt.stages.asr.decoding import Transcriber
from omni_rt.stages.asr.stage import AsrWorker

GPU_MAX_BATCH = 8  # not measured on a GPU yet: batch rows are cheap next to Whisper's fixed-window encoder
# On CPU the encoder's cost grows with the batch, so only the decoder's steps are shared: a batch of two gives a
# little more throughput when sessions commit at once with no worse mean latency, four no more throughput and a
# worse mean (python -m latency_bench stages asr-batch; the numbers: docs/tuning-cpu.md, "ASR batch").
CPU_MAX_BATCH = 2


def _denoiser() -> object:
    """The RNNoise library, loaded once at start-up; without its package, the message each request gets."""
    from omni_rt.backends.denoise import load_library

    try:
        return load_library()
    except (FileNotFoundError, OSError) as exc:
        return str(exc)


def create_asr_stage(
    backend: str = "faster-whisper",
    model: str | None = None,
    device: str = "cpu",
    compute_type: str = "int8",
    cpu_threads: int = 1,
    speculative_after_ms: int = 150,
    partial_interval_ms: int = 1200,
    speculative_alone_after_ms: int | None = None,
    partial_alone_interval_ms: int | None = None,
    max_sessions: int = 64,
    max_buffered_bytes: int = 24000 * 2 * 120,
    idle_timeout_s: float = 600.0,
    max_queued_decodes: int = 16,
    max_batch: int | None = None,
    random_init: bool = False,
    random_size: str = "full",
    vad_sound_end_ratio: float | None = None,
    min_window_s: float | None = None,
    noise_reduction: bool = True,
    backchannel_filter: bool = True,
) -> AsrWorker:
    """Factory for the pipeline config: the preset names the backend and model.

    ``max_batch``: sessions decoded together (one ``transcribe_batch``); default 8 on a GPU, where more rows
    cost little next to the encoder's fixed 30 s window, and CPU_MAX_BATCH on CPU (see there).
    ``min_window_s`` (faster-whisper): the shortest encoder window (``FasterWhisperASR``; None: its default).
    ``vad_sound_end_ratio``: where a turn's silence starts counting (``omni_rt.backends.vad.ENERGY_END_RATIO``;
    0 = at Silero's last speech frame, the ablation).
    ``random_init`` (transformers backend): random weights of ``model``'s real shape
    (``omni_rt.engine.weights.random_init``; ``random_size="tiny"`` for CPU), so the preset runs with no hub weights.
    ``noise_reduction``: whether sessions may turn on ``audio.input.noise_reduction`` (RNNoise,
    ``omni_rt.backends.denoise``); False refuses it server-wide with ``noise_reduction_unavailable``.
    ``backchannel_filter``: speech over a heard answer is decided (backchannel or interruption,
    ``omni_rt.stages.asr.interruption``) before it barges in; False: every speech start barges in at once.
    """
    if not isinstance(backchannel_filter, bool):
        raise ValueError(f"stage 'asr' field 'backchannel_filter': true or false, not {backchannel_filter!r}")
    from omni_rt.backends.vad import SileroVadModel

    for field, ms in (("partial_interval_ms", partial_interval_ms), ("partial_alone_interval_ms", partial_alone_interval_ms)):
        if ms is not None and ms < 100:  # a partial is a whole Whisper decode of the turn so far
            raise ValueError(f"stage 'asr' field '{field}': {ms} ms is under 100 ms (one decode of the turn each time)")
    if min_window_s is not None and backend != "faster-whisper":
        raise ValueError(f"stage 'asr' field 'min_window_s': only the faster-whisper backend has an encoder window, not '{backend}'")
    if random_init and backend != "transformers":
        raise ValueError(f"stage 'asr' field 'random_init': only the transformers backend builds random weights, not '{backend}'")
    if backend == "faster-whisper":
        from omni_rt.backends.whisper import FasterWhisperASR

        window = {} if min_window_s is None else {"min_window_s": min_window_s}
        transcriber: Transcriber = FasterWhisperASR(model_dir=model, compute_type=compute_type, cpu_threads=cpu_threads, **window)
    elif backend == "transformers":
        import torch

        from omni_rt.backends.whisper import TransformersWhisperASR

        if model is None:
            raise ValueError("stage 'asr' field 'model': the transformers backend needs a model path or hub id")
        dtype = torch.float16 if device != "cpu" else torch.float32
        if random_init:
            from omni_rt.engine.weights.random_init import build_whisper

            transcriber = TransformersWhisperASR(build_whisper(model, dtype=dtype, device=device, size=random_size),
                                                 device=device, dtype=dtype)
        else:
            transcriber = TransformersWhisperASR(model, device=device, dtype=dtype)
    else:
        raise ValueError(f"stage 'asr' field 'backend': unknown ASR backend '{backend}' (faster-whisper|transformers)")
    if max_batch is None:
        max_batch = GPU_MAX_BATCH if backend == "transformers" and device != "cpu" else CPU_MAX_BATCH
    scheduler = AsrWorker(
        transcriber,
        SileroVadModel(),
        max_batch=max_batch,
        speculative_after_ms=speculative_after_ms,
        speculative_alone_after_ms=speculative_alone_after_ms,
        partial_interval_ms=partial_interval_ms,
        partial_alone_interval_ms=partial_alone_interval_ms,
        max_queued_decodes=max_queued_decodes,
        max_sessions=max_sessions,
        max_buffered_bytes=max_buffered_bytes,
        idle_timeout_s=idle_timeout_s,
        vad_sound_end_ratio=vad_sound_end_ratio,
        denoiser=_denoiser() if noise_reduction else None,
        backchannel_filter=backchannel_filter,
    )
    try:
        scheduler.turn_model()  # load Smart Turn at start-up, not on the first semantic_vad session.update
    except SessionLimitError:
        pass  # no pipecat-ai wheel: server_vad works; each semantic_vad request gets the clear error
    return scheduler
