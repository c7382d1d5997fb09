"""Where an answered turn's time goes, from the server's own stamps (issue 24, point 1): after one real spoken
turn (server_vad, CPU preset, llama.cpp thinker), ``/metrics`` holds ``omni_rt_stage_time_seconds`` for every
stage on the path after the last word, split into queue and compute, and the bench's table reads them.

No timing thresholds: the numbers must exist, count this turn, and be non-negative (a load-dependent number
belongs in latency_bench/, not in a test)."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rt_helpers import pcm_chunks_b64, speech_with_silence
from test_server_protocol import connect

from latency_bench import report
from latency_bench.metrics_scrape import histogram_delta, scrape, stage_samples, stage_times

PATH_STAGES = ("asr_final", "thinker", "talker", "vocoder")  # server_vad: no Smart Turn


def stage_time_totals(text: str) -> dict[tuple[str, str], tuple[float, float]]:
    """{(stage, kind): (count, sum in seconds)} of omni_rt_stage_time_seconds."""
    out: dict[tuple[str, str], list[float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "omni_rt_stage_time_seconds":
            continue
        for s in fam.samples:
            key = (s.labels["stage"], s.labels["kind"])
            if s.name.endswith("_count"):
                out.setdefault(key, [0.0, 0.0])[0] = s.value
            elif s.name.endswith("_sum"):
                out.setdefault(key, [0.0, 0.0])[1] = s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


async def test_one_turn_reports_queue_and_compute_per_stage(live_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    chunks = pcm_chunks_b64(speech_with_silence(audio, sr, tail_s=1.5))
    get = lambda: httpx.get(f"{live_server.http_url}/metrics", timeout=10).text  # noqa: E731
    before_text = await asyncio.to_thread(get)
    before = await asyncio.to_thread(scrape, live_server.http_url)
    mark = await asyncio.to_thread(stage_samples, live_server.http_url)
    async with asyncio.timeout(180), connect(live_server) as rt:
        await rt.update({"max_output_tokens": 24, "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500, "create_response": True}}}})
        for chunk in chunks:
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
            await asyncio.sleep(0.02)
        done = await rt.until("response.done")
        assert done["response"]["status"] == "completed", done
    assert live_server.wait_idle()["total"] == 0
    after_text = await asyncio.to_thread(get)
    after = await asyncio.to_thread(scrape, live_server.http_url)
    got = await asyncio.to_thread(stage_samples, live_server.http_url, mark["last"])

    t0, t1 = stage_time_totals(before_text), stage_time_totals(after_text)
    for stage in PATH_STAGES:
        for kind in ("queue", "compute"):
            n0, s0 = t0.get((stage, kind), (0.0, 0.0))
            n1, s1 = t1.get((stage, kind), (0.0, 0.0))
            assert n1 - n0 == 1, f"{stage}/{kind}: {n1 - n0} observations for one answered turn"
            assert s1 - s0 >= 0.0, f"{stage}/{kind}: negative time {s1 - s0}"
    # the first audio needs real work from the thinker and the talker: not everything can be "waiting"
    for stage in ("thinker", "talker"):
        assert t1[(stage, "compute")][1] > t0.get((stage, "compute"), (0.0, 0.0))[1], stage

    # /debug/stage_times: the same observations, exact (what the bench's table is computed from)
    rows = got["samples"]
    assert got["last"] == mark["last"] + len(rows) and all(r["ms"] >= 0 for r in rows), got
    for stage in PATH_STAGES:
        for kind in ("queue", "compute"):
            mine = [r["ms"] for r in rows if (r["stage"], r["kind"]) == (stage, kind)]
            assert len(mine) == 1, (stage, kind, rows)
            hist_ms = (t1[(stage, kind)][1] - t0.get((stage, kind), (0.0, 0.0))[1]) * 1000
            assert abs(mine[0] - hist_ms) < 0.1, (stage, kind, mine, hist_ms)

    # the bench's view of the same run: one row per stage, both kinds, in the text report
    for times in (stage_times({}, rows), stage_times(histogram_delta(before, after))):
        assert set(PATH_STAGES) <= set(times), times
        for stage in PATH_STAGES:
            for kind in ("queue", "compute"):
                v = times[stage][kind]
                assert v["count"] == 1 and v["p50_ms"] is not None and v["p50_ms"] >= 0 and v["p95_ms"] >= 0, (stage, kind, v)
    times = stage_times({}, rows)
    table = report.stage_time_table({"sweep": {"1": {"stage_times": times}}})
    print("\n" + table)
    lines = table.splitlines()
    assert "1 sess. queue" in lines[0] and "1 sess. compute" in lines[0], table
    assert [ln.split()[0] for ln in lines[2:]] == list(PATH_STAGES), table


def test_first_token_split_by_the_upstreams_own_timings():
    """llama-server's prefill + one token's decode count as compute, the rest of arrival -> first token as
    waiting; with no timings (a generic upstream) the whole time is compute, never a negative wait."""
    from omni_rt.engine.streamed.async_stream import first_token_timing

    t = first_token_timing(10.0, 10.5, {"prompt_ms": 120.0, "predicted_per_token_ms": 30.0})
    assert abs(t.compute_s - 0.15) < 1e-9 and abs(t.queue_s - 0.35) < 1e-9
    t = first_token_timing(10.0, 10.5, None)
    assert t.queue_s == 0.0 and abs(t.compute_s - 0.5) < 1e-9
    t = first_token_timing(10.0, 10.1, {"prompt_ms": 500.0})  # clocks disagree: capped, the wait stays >= 0
    assert t.queue_s == 0.0 and abs(t.compute_s - 0.1) < 1e-9


async def test_the_servers_numpy_blas_pool_runs_one_thread(live_server, speech_samples):
    """numpy's OpenBLAS, left at one thread per core, wakes a worker for Whisper's mel filter that then spins ~100
    ms: on two cores that is CPU the other sessions' decodes need (docs/tuning-cpu.md, "numpy's BLAS").
    ``/debug/state`` lists the native pools the server loaded; after a spoken turn numpy's BLAS runs one thread."""
    audio, sr, _ = speech_samples["capital"]
    async with asyncio.timeout(180), connect(live_server) as rt:
        await rt.update({"max_output_tokens": 8, "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500, "create_response": True}}}})
        for chunk in pcm_chunks_b64(speech_with_silence(audio, sr, tail_s=1.5)):
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        assert (await rt.until("response.done"))["response"]["status"] == "completed"
    pools = (await asyncio.to_thread(live_server.state))["thread_pools"]
    blas = [p for p in pools if p["api"] == "openblas"]
    assert blas, f"numpy's OpenBLAS is not among the loaded pools: {pools}"
    assert all(p["threads"] == 1 for p in blas), pools
