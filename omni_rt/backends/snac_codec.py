"""SNAC 24 kHz codec decoding for an Orpheus-style codec talker, streamed with a sliding window.

SNAC's 24 kHz model has 3 codebooks at 12, 23 and 47 Hz; one coarse step ("frame") is 2048 samples
(85 ms) and Orpheus serializes it as 7 tokens: [c0, c1a, c2a, c2b, c1b, c2c, c2d], token id =
128266 + code + 4096 * position_in_frame.

The decoder is convolutional (no attention in the 24 kHz model), so audio for a frame depends only on a
few neighbouring frames. `SnacStreamingDecoder` decodes a window of `context_frames` already-emitted
frames + new frames + `lookahead_frames` future frames, and emits only the middle, which then equals a
one-shot decode of the whole sequence: no seams. SNAC's decoder also injects Gaussian noise
(`NoiseBlock`); drawn freshly per call that noise would differ between overlapping windows, so this
module draws it from a fixed table indexed by absolute sample position (`decode_codes`), making decoding
deterministic and window-invariant. Weights are never fetched here: `load_snac` reads a local directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
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


def build_random_snac(seed: int = 0, config: dict[str, Any] | None = None) -> torch.nn.Module:
    """Random-init SNAC with the 24 kHz architecture (for tests and GPU shape benchmarks), in eval mode."""
    from snac import SNAC

    torch.manual_seed(seed)
    return SNAC(**(config or SNAC_24KHZ_CONFIG)).eval()


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
    return model.to(device).eval()


def samples_per_frame(model: torch.nn.Module) -> int:
    """Output samples per coarse step: hop_length * coarsest VQ stride (2048 for the 24 kHz model)."""
    return int(model.hop_length) * int(model.vq_strides[0])


# ---------------------------------------------------------------- Orpheus token <-> frame mapping


def orpheus_tokens_to_frames(token_ids: Sequence[int] | np.ndarray, code_offset: int = ORPHEUS_CODE_OFFSET) -> np.ndarray:
    """Orpheus audio token ids (a multiple of 7, frame-aligned) -> int64 codes [n_frames, 7]."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size % CODES_PER_FRAME:
        raise ValueError(f"Orpheus audio tokens come in frames of 7; got {ids.size} tokens")
    codes = ids.reshape(-1, CODES_PER_FRAME) - code_offset - CODEBOOK_SIZE * np.arange(CODES_PER_FRAME)
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
    if isinstance(frame, (tuple, list)) and len(frame) == 3:
        return codes_to_frames(*(torch.as_tensor(c).cpu().numpy() for c in frame))[0]
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


def decode_frames(model: torch.nn.Module, frames: np.ndarray, device: str | torch.device = "cpu", noise_seed: int = 0) -> np.ndarray:
    """One-shot decode of Orpheus-ordered frames [n, 7] -> float32 audio [n * 2048]."""
    codes = [torch.as_tensor(c, device=device)[None, :] for c in frames_to_codes(frames)]
    return decode_codes(model, codes, 0, noise_seed)[0, 0].float().cpu().numpy()


class SnacStreamingDecoder:
    """Frames in, audio out, for one stream; concatenated output == `decode_frames` of the whole stream.

    A frame is emitted once `lookahead_frames` later frames have arrived (latency = lookahead * 85 ms);
    each decode covers `context_frames` earlier frames + the new ones + the lookahead, i.e. a window of
    `window_frames` = context + 1 + lookahead frames for one new frame. Both margins default to the
    decoder's measured receptive field. `flush()` emits the held frames at the end of the stream.
    Not thread-safe (one owner); the model may be shared by many decoders.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        context_frames: int = 3,
        lookahead_frames: int = 2,
        window_frames: int | None = None,
        device: str | torch.device | None = None,
        noise_seed: int = 0,
    ) -> None:
        if window_frames is not None:
            context_frames = window_frames - 1 - lookahead_frames
        if context_frames < 0 or lookahead_frames < 0:
            raise ValueError("context_frames and lookahead_frames must be >= 0")
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.context_frames = context_frames
        self.lookahead_frames = lookahead_frames
        self.noise_seed = noise_seed
        self.samples_per_frame = samples_per_frame(model)
        self.sample_rate = int(model.sampling_rate)
        self.reset()

    @property
    def window_frames(self) -> int:
        return self.context_frames + 1 + self.lookahead_frames

    def reset(self) -> None:
        """Forget the stream (barge-in or a new response)."""
        self._rows: list[np.ndarray] = []  # kept frames; the first is absolute frame self._base
        self._base = 0
        self._n = 0  # frames pushed
        self._emitted = 0  # frames whose audio has been returned

    def push(self, frame: Any) -> np.ndarray:
        """Add one frame (7 Orpheus-ordered codes or (c0, c1, c2)); returns newly finished audio (may be empty)."""
        return self.push_many([frame])

    def push_many(self, frames: Iterable[Any]) -> np.ndarray:
        """Add several frames with one decode; returns newly finished audio (may be empty)."""
        for f in frames:
            self._rows.append(_frame_to_row(f))
            self._n += 1
        return self._emit(self._n - self.lookahead_frames)

    def flush(self) -> np.ndarray:
        """Emit everything still held (end of stream) and reset."""
        out = self._emit(self._n)
        self.reset()
        return out

    def _emit(self, ready: int) -> np.ndarray:
        if ready <= self._emitted:
            return np.zeros(0, dtype=np.float32)
        start = max(self._base, self._emitted - self.context_frames)
        rows = np.stack(self._rows[start - self._base :])
        codes = [torch.as_tensor(c, device=self.device)[None, :] for c in frames_to_codes(rows)]
        audio = decode_codes(self.model, codes, start, self.noise_seed)[0, 0]
        spf = self.samples_per_frame
        out = audio[(self._emitted - start) * spf : (ready - start) * spf].float().cpu().numpy()
        self._emitted = ready
        keep_from = max(self._base, self._emitted - self.context_frames)
        del self._rows[: keep_from - self._base]
        self._base = keep_from
        return out
