"""SNAC 24 kHz codec decoding for an Orpheus-style codec talker, streamed with a sliding window.

Why one module of ~500 lines: the code layout, the position-indexed noise, the receptive field and the
batched window decode are one argument (the stream equals a one-shot decode, no seams); each piece's
correctness rests on the others' numbers, so they are read and tested together (tests/unit/stages/test_snac_batching.py).

SNAC's 24 kHz model has 3 codebooks at 12, 23 and 47 Hz; one coarse step ("frame") is 2048 samples
(85 ms) and Orpheus serializes it as 7 tokens: [c0, c1a, c2a, c2b, c1b, c2c, c2d], token id =
128266 + code + 4096 * position_in_frame.

The decoder is convolutional (no attention in the 24 kHz model), so a frame's codes reach only ~2.3
frames of audio either side (`receptive_field`). `SnacStreamingDecoder` decodes a window holding the
frames that reach the not-yet-emitted audio and emits only the part no future frame can change, so the
concatenated stream equals a one-shot decode of the whole sequence: no seams. SNAC's decoder also injects
Gaussian noise (`NoiseBlock`); drawn freshly per call that noise would differ between overlapping windows,
so this module draws it from a fixed table indexed by absolute sample position (`decode_codes`), making
decoding deterministic and window-invariant. Weights are never fetched here: `load_snac` reads a local directory.

Many streams decode together: each decoder `plan`s the window its next audio needs (`DecodeWindow`),
`decode_windows` runs all of them as one batch (padded to one length where the padding provably cannot
reach the emitted samples) with a single device-to-host copy, and each decoder `commit`s its share.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

SNAC_24KHZ_CONFIG: dict[str, Any] = {
    # Matches hubertsiuzdak/snac_24khz config.json (19.8 M parameters, as its README states).
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}
ORPHEUS_CODE_OFFSET = 128266
CODES_PER_FRAME = 7
CODEBOOK_SIZE = 4096
# Orpheus frame position -> (codebook level, index within the frame at that level)
_ORPHEUS_LAYOUT = ((0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (2, 2), (2, 3))
_NOISE_PERIOD_LATENTS = 2048  # noise table period: 2048 * 512 samples ≈ 44 s at 24 kHz


def fuse_weight_norm(model: torch.nn.Module) -> torch.nn.Module:
    """Bake SNAC's weight-norm parametrizations into plain weights (same outputs, no per-call re-norm).

    Inference only; do it after loading a state dict (the checkpoint stores the parametrized form).
    """
    from torch.nn.utils import parametrize

    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    return model


def build_random_snac(seed: int = 0, config: dict[str, Any] | None = None) -> torch.nn.Module:
    """Random-init SNAC with the 24 kHz architecture (for tests and GPU shape benchmarks), in eval mode."""
    from snac import SNAC

    torch.manual_seed(seed)
    return fuse_weight_norm(SNAC(**(config or SNAC_24KHZ_CONFIG)).eval())


def load_snac(path: str | Path, device: str = "cpu") -> torch.nn.Module:
    """Load SNAC from a local directory holding config.json and pytorch_model.bin (the hub layout)."""
    from snac import SNAC

    d = Path(path)
    cfg, weights = d / "config.json", d / "pytorch_model.bin"
    for p in (cfg, weights):
        if not p.is_file():
            raise FileNotFoundError(
                f"SNAC file not found: {p}; prepare the directory with e.g. "
                f"`huggingface-cli download hubertsiuzdak/snac_24khz --local-dir {d}`"
            )
    with open(cfg, encoding="utf-8") as f:
        model = SNAC(**json.load(f))
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return fuse_weight_norm(model).to(device).eval()


def samples_per_frame(model: torch.nn.Module) -> int:
    """Output samples per coarse step: hop_length * coarsest VQ stride (2048 for the 24 kHz model)."""
    return int(model.hop_length) * int(model.vq_strides[0])


# ---------------------------------------------------------------- Orpheus token <-> frame mapping
# position k of an Orpheus frame codes its SNAC code in ids code_offset + k * 4096 ..
_FRAME_POSITION_OFFSETS = np.arange(CODES_PER_FRAME, dtype=np.int64) * CODEBOOK_SIZE


def orpheus_tokens_to_frames(
    token_ids: Sequence[int] | np.ndarray, code_offset: int = ORPHEUS_CODE_OFFSET
) -> np.ndarray:
    """Orpheus audio token ids (a multiple of 7, frame-aligned) -> int64 codes [n_frames, 7]."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size % CODES_PER_FRAME:
        raise ValueError(f"Orpheus audio tokens come in frames of 7; got {ids.size} tokens")
    codes = ids.reshape(-1, CODES_PER_FRAME) - code_offset - _FRAME_POSITION_OFFSETS
    if codes.size and (codes.min() < 0 or codes.max() >= CODEBOOK_SIZE):
        raise ValueError("token id out of range for its position in the Orpheus frame")
    return codes


def frames_to_orpheus_tokens(frames: np.ndarray, code_offset: int = ORPHEUS_CODE_OFFSET) -> np.ndarray:
    """Inverse of `orpheus_tokens_to_frames`: codes [n, 7] -> flat int64 token ids."""
    codes = np.asarray(frames, dtype=np.int64).reshape(-1, CODES_PER_FRAME)
    return (codes + code_offset + CODEBOOK_SIZE * np.arange(CODES_PER_FRAME)).reshape(-1)


def frames_to_codes(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames [n, 7] in Orpheus order -> SNAC codes per level: ([n], [2n], [4n])."""
    f = np.asarray(frames, dtype=np.int64).reshape(-1, CODES_PER_FRAME)
    return f[:, 0].copy(), f[:, [1, 4]].reshape(-1), f[:, [2, 3, 5, 6]].reshape(-1)


def codes_to_frames(c0: np.ndarray, c1: np.ndarray, c2: np.ndarray) -> np.ndarray:
    """SNAC codes per level ([n], [2n], [4n]) -> frames [n, 7] in Orpheus order."""
    c0, c1, c2 = (np.asarray(c, dtype=np.int64).reshape(-1) for c in (c0, c1, c2))
    n = c0.size
    if c1.size != 2 * n or c2.size != 4 * n:
        raise ValueError(f"code lengths must be n, 2n, 4n; got {c0.size}, {c1.size}, {c2.size}")
    out = np.empty((n, CODES_PER_FRAME), dtype=np.int64)
    levels = (c0.reshape(n, 1), c1.reshape(n, 2), c2.reshape(n, 4))
    for pos, (lvl, j) in enumerate(_ORPHEUS_LAYOUT):
        out[:, pos] = levels[lvl][:, j]
    return out


def _frame_to_row(frame: Any) -> np.ndarray:
    """One frame given as 7 Orpheus-ordered codes or as a (c0[1], c1[2], c2[4]) tuple -> [7] codes."""
    if isinstance(frame, (tuple, list)) and len(frame) == 3 and all(np.ndim(c) >= 1 for c in frame):
        levels = [torch.as_tensor(c).reshape(-1).cpu().numpy() for c in frame]
        if [c.size for c in levels] != [1, 2, 4]:
            raise ValueError(f"a (c0, c1, c2) frame has 1, 2 and 4 codes; got {[c.size for c in levels]}")
        return codes_to_frames(*levels)[0]
    row = np.asarray(torch.as_tensor(frame).cpu().numpy() if torch.is_tensor(frame) else frame, dtype=np.int64)
    if row.shape != (CODES_PER_FRAME,):
        raise ValueError(f"a frame is 7 codes or a (c0, c1, c2) tuple of 1, 2 and 4 codes; got shape {row.shape}")
    return row


# ---------------------------------------------------------------- deterministic decoding

_noise_tables: dict[tuple[int, int, str, torch.dtype, int], torch.Tensor] = {}


def _noise_table(seed: int, block: int, scale: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (seed, block, str(device), dtype, scale)
    t = _noise_tables.get(key)
    if t is None:
        g = torch.Generator().manual_seed(seed * 1000 + block)
        t = torch.randn(_NOISE_PERIOD_LATENTS * scale, generator=g).to(device=device, dtype=dtype)
        _noise_tables[key] = t
    return t


@torch.inference_mode()
def decode_codes(
    model: torch.nn.Module,
    codes: Sequence[torch.Tensor],
    frame_offset: int | Sequence[int] = 0,
    noise_seed: int = 0,
) -> torch.Tensor:
    """Decode SNAC codes ([B, n], [B, 2n], [B, 4n] long tensors) -> audio [B, 1, n * 2048].

    Like `model.decode`, but the decoder's noise comes from a fixed table indexed by absolute position
    (`frame_offset` = index of the first frame in its stream, one per batch row), so any window of a
    stream decodes to the same samples as the whole stream. Rows of a batch may belong to different streams.
    """
    from snac.layers import DecoderBlock, NoiseBlock

    z = model.quantizer.from_codes(list(codes))
    b = z.shape[0]
    # a device tensor passes through untouched (no host copy); ints and lists are copied once
    offs = torch.as_tensor(frame_offset, dtype=torch.long).reshape(-1).expand(b).to(z.device)
    latent_off = offs * int(model.vq_strides[0])
    x, scale, block_idx = z, 1, 0
    for layer in model.decoder.model:
        if not isinstance(layer, DecoderBlock):
            x = layer(x)
            continue
        scale *= int(layer.block[1].stride[0])
        for sub in layer.block:
            if isinstance(sub, NoiseBlock):
                table = _noise_table(noise_seed, block_idx, scale, x.device, x.dtype)
                pos = (latent_off[:, None] * scale + torch.arange(x.shape[-1], device=x.device)) % table.numel()
                x = x + table[pos][:, None, :] * sub.linear(x)
            else:
                x = sub(x)
        block_idx += 1
    return x


def decode_frames(
    model: torch.nn.Module, frames: np.ndarray, device: str | torch.device = "cpu", noise_seed: int = 0
) -> np.ndarray:
    """One-shot decode of Orpheus-ordered frames [n, 7] -> float32 audio [n * 2048]."""
    codes = [torch.as_tensor(c, device=device)[None, :] for c in frames_to_codes(frames)]
    return decode_codes(model, codes, 0, noise_seed)[0, 0].float().cpu().numpy()


_receptive_cache: dict[tuple, tuple[int, int]] = {}


def receptive_field(model: torch.nn.Module) -> tuple[int, int]:
    """(back, forward) reach in output samples of one frame's codes: frame k can change samples in
    [k * spf - back, (k + 1) * spf + forward) and no others.

    Exact structural bound, computed by propagating the support of one frame's latents through a narrow
    clone of the decoder whose weights are all 1 and biases 0 (snake, tanh and sums keep zero at zero and
    positive values positive; noise is switched off), so nothing can cancel. Widths do not change the
    reach, so the clone is cheap; cached per architecture. 24 kHz model: 4757 samples (~2.3 frames) each way.
    """
    from snac import SNAC
    from snac.layers import NoiseBlock

    if model.attn_window_size is not None:
        raise ValueError("receptive_field supports convolution-only SNAC decoders; pass margins explicitly")
    arch = (tuple(model.decoder_rates), tuple(model.vq_strides), int(model.hop_length))
    cached = _receptive_cache.get(arch)
    if cached is not None:
        return cached
    n_up = len(model.decoder_rates)
    probe = SNAC(
        sampling_rate=int(model.sampling_rate), encoder_dim=1, encoder_rates=list(model.encoder_rates),
        decoder_dim=2**n_up, decoder_rates=list(model.decoder_rates), attn_window_size=None,
        codebook_size=2, codebook_dim=1, vq_strides=list(model.vq_strides), noise=True, depthwise=True,
    )
    probe = fuse_weight_norm(probe).double().eval()
    with torch.no_grad():
        for module in probe.decoder.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                module.weight.fill_(1.0)
                if module.bias is not None:
                    module.bias.zero_()
        for module in probe.decoder.modules():
            if isinstance(module, NoiseBlock):
                module.linear.weight.zero_()  # after the fill above, which also reaches this conv
        spf = samples_per_frame(model)
        per_frame = int(model.vq_strides[0])  # latents per frame
        n, mid = 9, 4
        z = torch.zeros(1, probe.latent_dim, n * per_frame, dtype=torch.float64)
        z[..., mid * per_frame : (mid + 1) * per_frame] = 1.0
        out = probe.decoder(z)[0, 0].numpy()
    if not np.isfinite(out).all() or (out < 0).any():
        raise RuntimeError("SNAC receptive-field probe lost positivity; pass margins explicitly")
    support = np.nonzero(out > 0)[0]
    back = mid * spf - int(support.min())
    forward = int(support.max()) + 1 - (mid + 1) * spf
    if back >= mid * spf or forward >= (n - mid - 1) * spf:
        raise RuntimeError("SNAC receptive field exceeds the probe window")
    _receptive_cache[arch] = result = (back, forward)
    return result


@dataclass(slots=True)
class DecodeWindow:
    """One stream's share of a batched decode, planned by `SnacStreamingDecoder.plan`.

    ``rows`` (frames [m, 7]) start at absolute frame ``start``; samples ``[lo, hi)`` of the window's audio
    are the newly final ones. ``pad_left`` / ``pad_right``: frames may be added on that side without
    changing those samples (the margins cover the receptive field and the side is not the stream's
    boundary, whose zero padding a code frame would replace), so windows of different lengths can share
    one batch. ``n`` frames are covered (the decoder's state after `commit`), ``last``: the stream ends here.
    """

    rows: np.ndarray
    start: int
    lo: int
    hi: int
    pad_left: bool
    pad_right: bool
    n: int
    last: bool


def decode_windows(
    model: torch.nn.Module, windows: Sequence[DecodeWindow], noise_seed: int = 0
) -> tuple[list[np.ndarray], int]:
    """Decode many streams' windows together -> (float32 audio per window, number of forwards).

    Windows are padded (with code 0 frames, on a side where that is allowed) to the longest one and run as
    one batch; a window that may be padded on neither side (a whole short stream: head and tail at once,
    or margins below the receptive field) joins a batch of its exact length instead, so forwards is 1 in
    steady state. All emitted samples leave the device in one copy: one host sync per call.
    """
    if not windows:
        return [], 0
    spf = samples_per_frame(model)
    device = next(model.parameters()).device
    longest = max(len(w.rows) for w in windows)
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        m = len(w.rows)
        key = longest if m == longest or w.pad_left or w.pad_right else m
        groups.setdefault(key, []).append(i)
    # host side: every group's codes and frame offsets in one int64 buffer, so one host-to-device copy
    # serves the step (a blocking copy issued after queued kernels would wait for them: a sync per group)
    parts, layout = [], []
    for length, members in groups.items():
        batch = np.zeros((len(members), length, CODES_PER_FRAME), dtype=np.int64)
        offsets = np.empty(len(members), dtype=np.int64)
        spans = []
        for b, i in enumerate(members):
            w = windows[i]
            m = len(w.rows)
            left = 0 if m == length or w.pad_right else length - m  # right padding first: it never shifts offsets
            batch[b, left : left + m] = w.rows
            offsets[b] = w.start - left
            spans.append((w.lo + left * spf, w.hi + left * spf))
        parts += [batch.reshape(-1), offsets]
        layout.append((length, members, spans))
    staged = torch.from_numpy(np.concatenate(parts)).to(device)
    slices: list[torch.Tensor] = [None] * len(windows)  # type: ignore[list-item]  # every window is in a group
    at = 0
    for length, members, spans in layout:
        b = len(members)
        f = staged[at : at + b * length * CODES_PER_FRAME].view(b, length, CODES_PER_FRAME)
        offsets_t = staged[at + f.numel() : at + f.numel() + b]
        at += f.numel() + b
        # frames_to_codes on the device; stacked slices, not list indexing (which copies an index tensor over)
        codes = [f[:, :, 0], torch.stack([f[:, :, k] for k in (1, 4)], -1).reshape(b, -1),
                 torch.stack([f[:, :, k] for k in (2, 3, 5, 6)], -1).reshape(b, -1)]
        audio = decode_codes(model, codes, offsets_t, noise_seed)
        for row, i in enumerate(members):
            lo, hi = spans[row]
            slices[i] = audio[row, 0, lo:hi]
    flat = torch.cat(slices).float().cpu().numpy()  # the one host sync
    out, at = [], 0
    for w in windows:
        out.append(flat[at : at + w.hi - w.lo])
        at += w.hi - w.lo
    return out, len(groups)


class SnacStreamingDecoder:
    """Frames in, audio out, for one stream; concatenated output == `decode_frames` of the whole stream.

    After n frames, audio up to sample n * 2048 - lookahead is final (no later frame can change it), so
    that much is emitted; each decode covers just the frames that reach the unemitted span. With the
    defaults (margins = the decoder's exact receptive field, ~2.3 frames each way) output equals the
    one-shot decode to float precision, first audio comes after 3 frames (21 Orpheus tokens) and each
    later frame decodes a window of ~6 frames. Smaller `lookahead_frames` trades exactness for latency
    (1 frame: ~1e-2 relative error at window seams with random weights); `window_frames=W` sets both
    margins to (W - 1) / 2 frames. `flush()` emits the held tail.

    `push_many` decodes alone; for batching across streams use `add`, `plan`, `decode_windows`, `commit`.
    Not thread-safe (one owner); the model may be shared by many decoders.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        lookahead_frames: float | None = None,
        context_frames: float | None = None,
        noise_seed: int = 0,
        window_frames: int | None = None,
    ) -> None:
        if window_frames is not None:  # fixed window size: split its margin evenly between the two sides
            if window_frames < 1:
                raise ValueError(f"window_frames must be >= 1, got {window_frames}")
            half = (window_frames - 1) / 2
            lookahead_frames = half if lookahead_frames is None else lookahead_frames
            context_frames = half if context_frames is None else context_frames
        self.model = model  # decoding runs where its weights are
        self.noise_seed = noise_seed
        self.samples_per_frame = spf = samples_per_frame(model)
        self.sample_rate = int(model.sampling_rate)
        try:
            back, forward = receptive_field(model)
        except ValueError:  # attention decoders: no structural bound, so margins are given and never exact
            if lookahead_frames is None or context_frames is None:
                raise
            back = forward = None
        self.lookahead_samples = int(round(lookahead_frames * spf)) if lookahead_frames is not None else back
        self.context_samples = int(round(context_frames * spf)) if context_frames is not None else forward
        if self.lookahead_samples < 0 or self.context_samples < 0:
            raise ValueError("lookahead_frames and context_frames must be >= 0")
        # margins covering the receptive field make padding a window harmless (see DecodeWindow)
        self.exact = back is not None and self.lookahead_samples >= back and self.context_samples >= forward
        self.reset()

    @property
    def window_frames(self) -> int:
        """Frames decoded per pushed frame in steady state."""
        return -(-(self.lookahead_samples + self.context_samples) // self.samples_per_frame) + 1

    @property
    def backlog(self) -> int:
        """Frames added but not yet covered by a plan."""
        return self._n - self._used

    def reset(self) -> None:
        """Forget the stream (barge-in or a new response)."""
        self._rows: list[np.ndarray] = []  # kept frames; the first is absolute frame self._base
        self._base = 0
        self._n = 0  # frames added
        self._used = 0  # frames covered by plans so far
        self._emitted = 0  # samples returned so far

    def add(self, frames: Iterable[Any] | np.ndarray) -> None:
        """Add frames (an int array [n, 7], or frames of 7 Orpheus-ordered codes or (c0, c1, c2)); no decode."""
        if isinstance(frames, np.ndarray) and frames.ndim == 2:
            if frames.shape[1] != CODES_PER_FRAME:
                raise ValueError(f"frames are [n, 7] codes; got shape {frames.shape}")
            arr = frames.astype(np.int64, copy=False)
        else:
            arr = np.array([_frame_to_row(f) for f in frames], dtype=np.int64).reshape(-1, CODES_PER_FRAME)
        bad = (arr < 0) | (arr >= CODEBOOK_SIZE)  # one check for the whole batch of frames, not one per row
        if bad.any():
            raise ValueError(f"SNAC codes are in [0, {CODEBOOK_SIZE}); got {arr[bad.any(axis=1)][0].tolist()}")
        rows = list(arr)
        self._rows.extend(rows)
        self._n += len(rows)

    def push(self, frame: Any) -> np.ndarray:
        """Add one frame (7 Orpheus-ordered codes or (c0, c1, c2)); returns newly final audio (may be empty)."""
        return self.push_many([frame])

    def push_many(self, frames: Iterable[Any]) -> np.ndarray:
        """Add several frames with one decode; returns newly final audio (may be empty)."""
        self.add(frames)
        return self._decode_alone(self.plan())

    def flush(self) -> np.ndarray:
        """Emit everything still held (end of stream) and reset."""
        return self._decode_alone(self.plan(final=True))

    def _decode_alone(self, window: DecodeWindow | None) -> np.ndarray:
        if window is None:
            return np.zeros(0, dtype=np.float32)
        (audio,), _ = decode_windows(self.model, [window], self.noise_seed)
        return self.commit(window, audio)

    def plan(self, final: bool = False, max_new_frames: int | None = None) -> DecodeWindow | None:
        """The window that emits the audio made final by up to ``max_new_frames`` of the backlog (all of it
        by default); ``final``: the stream has ended, so its last window emits the tail. None when there is
        nothing new to emit (the frames are still counted; a final stream is then reset)."""
        spf = self.samples_per_frame
        n = self._n if max_new_frames is None else min(self._n, self._used + max(1, max_new_frames))
        last = final and n == self._n
        end = n * spf if last else n * spf - self.lookahead_samples
        if end <= self._emitted:
            self._used = n
            if last:
                self.reset()
            return None
        start = max(self._base, (self._emitted - self.context_samples) // spf)
        rows = np.stack(self._rows[start - self._base : n - self._base])
        return DecodeWindow(rows=rows, start=start, lo=self._emitted - start * spf, hi=end - start * spf,
                            pad_left=self.exact and start > 0, pad_right=self.exact and not last, n=n, last=last)

    def commit(self, window: DecodeWindow, audio: np.ndarray) -> np.ndarray:
        """Take a planned window's decoded samples (``decode_windows``); returns them as the stream's next audio."""
        if window.last:
            self.reset()
            return audio
        spf = self.samples_per_frame
        self._used = window.n
        self._emitted = window.start * spf + window.hi
        keep_from = max(self._base, (self._emitted - self.context_samples) // spf)
        del self._rows[: keep_from - self._base]
        self._base = keep_from
        return audio


class OrpheusFrameAssembler:
    """Regroups a codec LM's token stream into whole SNAC frames, per response.

    Tokens outside the audio-code range (specials) are skipped; a code in the wrong slot of its frame is clamped
    (a trained model rarely does it, a random one often). A new ``segment`` (the next clause's prompt) drops an
    unfinished frame of the previous one, so one clause cut mid-frame cannot shift every later frame."""

    def __init__(self, code_offset: int = ORPHEUS_CODE_OFFSET) -> None:
        self.code_offset = code_offset
        self.pending: list[int] = []
        self.segment = 0

    def push(self, token_ids: Iterable[int], segment: int = 0) -> np.ndarray:
        """New tokens -> the frames they complete, int64 ``(n, 7)`` (``n`` may be 0)."""
        if segment != self.segment:
            self.segment, self.pending = segment, []
        top = CODES_PER_FRAME * CODEBOOK_SIZE
        self.pending.extend(t for t in token_ids if 0 <= t - self.code_offset < top)
        whole = len(self.pending) // CODES_PER_FRAME * CODES_PER_FRAME
        toks = np.asarray(self.pending[:whole], dtype=np.int64).reshape(-1, CODES_PER_FRAME)
        self.pending = self.pending[whole:]
        return np.clip(toks - self.code_offset - _FRAME_POSITION_OFFSETS, 0, CODEBOOK_SIZE - 1)
