"""``python -m latency_bench gpu --smoke``: the GPU benchmark's own code, on CPU at tiny sizes, in-process.
Checks that every section is there with sane numbers; the numbers themselves are not asserted (CPU, tiny).
An end-to-end run of the bench (its preset section serves real sessions), so it is an integration test."""

from __future__ import annotations

import json

from latency_bench import gpu
from omni_rt.engine.weights.random_init import supports_random_init
from omni_rt.presets import load_preset


def test_gpu_bench_smoke_writes_every_section(tmp_path, capsys):
    out = tmp_path / "gpu-smoke.json"
    gpu.main(["--smoke", "--out", str(out)])
    r = json.loads(out.read_text())
    plan = gpu.SMOKE
    failed = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
    assert not failed and "decode_errors" not in r, (failed, r.get("decode_errors"))
    assert r["kind"] == "gpu-smoke" and r["wall_s"] > 0
    assert r["bandwidth"]["gb_per_s"] > 0

    rows = r["decode"]
    cases = {(row["model"], row["batch"], row["context"]) for row in rows}
    assert cases == {(m, b, c) for m in (gpu.THINKER, gpu.CODEC_LM) for b in plan.batches for c in plan.contexts}
    for row in rows:
        assert row["ms_per_step"] > 0 and 0 < row["floor_ms"] <= row["floor_kv_ms"] and row["tokens_per_s"] > 0
    for info in r["decode_models"].values():
        assert 0 < info["weight_gb"] <= info["param_gb"] and info["kv_bytes_per_token"] > 0

    eq = r["equality"]
    assert eq["tokens_equal"] is True and eq["compared"] == "static-KV eager vs growable"
    assert eq["distinct_tokens"] > 1  # a comparison of one repeated token would prove little
    paged = r["paged"]  # on CPU the page tables are read by gather + SDPA: exactly the packed-GQA tokens
    assert paged["compared"] == "paged_sdpa vs packed_gqa" and paged["tokens_equal"] is True
    assert paged["token_agreement"] == 1.0
    assert {row["attention"] for row in rows} == {"omni_packed_gqa"}  # "auto" on CPU

    pre = r["preset"]
    cfg = load_preset("gpu")  # every stage that can run on random weights did (ASR, thinker, codec LM, vocoder)
    assert pre["stages_random"] == [st.name for st in cfg.stages if supports_random_init(st.factory, st.args)]
    assert len(pre["stages_random"]) >= 4
    assert set(pre["levels"]) == {str(n) for n in plan.sessions}
    for n, lv in pre["levels"].items():
        assert lv["answers"] == int(n) * plan.turns and lv["failures"] == 0, lv["turns"]
        assert lv["ttfa_ms"]["p50"] > 0 and lv["ttfa_ms"]["n"] == lv["answers"]
        assert lv["underruns_total"] >= 0
        assert all(t["audio_s"] >= plan.audio_s for t in lv["turns"])  # followed the answer for audio_s

    assert len(r["targets"]) == 5 and all(isinstance(t["ok"], bool) for t in r["targets"])
    printed = capsys.readouterr().out
    assert "| model | attention | batch | context | ms/step |" in printed and "TTFA p50" in printed
    assert "paged decode: paged_sdpa vs packed_gqa, tokens equal: True" in printed
