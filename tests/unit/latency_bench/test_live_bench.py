"""latency_bench live: what counts as the answer's first sound, and as a gap in the Live stream."""

import numpy as np

from latency_bench.live_bench import SR, WINDOW, loud_offset, loud_stretches


def test_first_loud_window_skips_digital_zeros_and_quiet_samples():
    pcm = np.zeros(SR, np.int16)
    pcm[100:200] = 50  # -56 dBFS: not a sound
    pcm[4800:] = 3000
    assert loud_offset(pcm) == 4800 // WINDOW * WINDOW
    assert loud_offset(np.zeros(SR, np.int16)) is None


def test_stretches_split_on_400_ms_of_quiet():
    tone = np.full(SR // 2, 3000, np.int16)
    gap = np.zeros(int(0.45 * SR), np.int16)
    short = np.zeros(int(0.2 * SR), np.int16)
    assert loud_stretches(np.concatenate([gap, tone, short, tone])) == 1
    assert loud_stretches(np.concatenate([tone, gap, tone])) == 2
