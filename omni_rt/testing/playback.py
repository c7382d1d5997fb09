"""A client's 24 kHz player, simulated from the arrival times of an answer's audio deltas: how often it would
run dry (underruns, and the silence they add) and when it has played the last sample."""

from __future__ import annotations

SR = 24000


def playback(deltas: list[tuple[float, int]], prebuffer_ms: float = 0.0) -> tuple[int, float, float | None]:
    """A 24 kHz player that starts ``prebuffer_ms`` after the first delta: (underruns, total gap ms, when it has
    played the last sample; None without audio). ``deltas``: (arrival time in s, samples) per delta."""
    count, gap = 0, 0.0
    play_end: float | None = None
    for t, n in deltas:
        d = n / SR
        if play_end is None:
            play_end = t + prebuffer_ms / 1000.0 + d
        elif t > play_end + 1e-3:
            count += 1
            gap += t - play_end
            play_end = t + d
        else:
            play_end += d
    return count, gap * 1000.0, play_end


def simulate_playback(deltas: list[tuple[float, int]], prebuffer_ms: float = 0.0) -> tuple[int, float]:
    """Underruns of a 24 kHz player that starts ``prebuffer_ms`` after the first delta: (count, total gap ms)."""
    count, gap, _ = playback(deltas, prebuffer_ms)
    return count, gap
