"""The GPU benchmark's pure parts: targets from measurements, the simulated playback. The end-to-end smoke run
(``python -m latency_bench gpu --smoke``, the whole bench on CPU at tiny sizes) is
tests/integration/test_gpu_bench_smoke.py."""

from __future__ import annotations

from latency_bench import gpu


def test_targets_follow_the_measurements_and_fail_on_missing_sections():
    rows = [{"model": gpu.CODEC_LM, "batch": 32, "context": c, "ms_per_step": ms, "x_floor": 3.0}
            for c, ms in ((512, 10.0), (4096, 20.0))]  # the target reads the smallest context
    rows.append({"model": gpu.THINKER, "batch": 1, "context": 512, "ms_per_step": 9.0, "x_floor": 2.4})
    targets = {t["what"].split(" (")[0]: t for t in gpu.check_targets({"decode": rows, "preset": {"error": "boom"}})}
    assert targets["talker ms/step at batch 32"]["ok"] is True and targets["talker ms/step at batch 32"]["value"] == 10.0
    assert targets["thinker batch 1 / weight-read floor"]["ok"] is False
    assert [t["ok"] for w, t in targets.items() if "TTFA" in w or "underruns" in w] == [False, False, False]


def test_playback_counts_a_chunk_that_arrives_after_the_buffer_ran_dry():
    tenth = gpu.SR // 10  # 100 ms of audio per chunk
    assert gpu.playback([(0.0, tenth), (0.05, tenth), (0.15, tenth)]) == (0, 0.0)
    count, gap_ms = gpu.playback([(0.0, tenth), (0.05, tenth), (0.3, tenth)])  # dry at 0.2 s, next at 0.3 s
    assert count == 1 and abs(gap_ms - 100.0) < 1e-6
