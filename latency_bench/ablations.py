"""The pipeline ablations a report run serves beside the preset (one server each), the presets they run, and
what each is compared with: ``ratios_and_checks`` turns a result into the ratios and the DESIGN.md targets the
report prints. It reads only the result dict, so a saved ``latest.json`` can be re-reported without a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from latency_bench import report
from latency_bench.server_proc import PRESETS_DIR, ROOT

# name -> (description, YAML written to latency_bench/presets/ for the cpu base, extra `omni-rt serve` flags)
VARIANTS: dict[str, tuple[str, str | None, list[str]]] = {
    "streaming": ("the preset as is", None, []),
    "naive": ("naive cascade, each stage waits for the whole previous output, ASR after the turn ends", "naive.yaml",
              ["--no-speculative"]),
    "no_held": ("no answer started in the end-of-turn silence (serve --no-speculative)", None, ["--no-speculative"]),
    "no_async": ("async decode lookahead off (no held answer: compared with no_held)", "no_async.yaml",
                 ["--no-speculative"]),
    "no_prefix": ("per-session prefix reuse off", "no_prefix.yaml", []),
    "windowed": ("thinker batching window 50 ms even when idle (no held answer: compared with no_held)", "windowed.yaml",
                 ["--no-speculative"]),
    "torch": ("the fp32 PyTorch thinker instead of llama.cpp", "torch.yaml", []),
    "arrival_talker": ("the talker speaks clauses in arrival order, not earliest-due first (matters with several "
                       "sessions: run it with --preset latency_bench/presets/arrival_talker.yaml --sessions 4,8)",
                       "arrival_talker.yaml", []),
}
QUICK_VARIANTS = ["streaming", "naive", "no_held", "windowed"]
WINDOW_MS = 50.0

# What an ablation is compared with. The preset starts the answer in the end-of-turn silence and holds it, so its
# first audio is ready when speech_stopped arrives: an ablation of the work done before that instant (the
# thinker's batching window, its decode lookahead) shows nothing next to it. Those run without the held answer
# (serve --no-speculative) and are compared with no_held, which differs from them by that ablation alone.
BASELINE: dict[str, str] = {"no_async": "no_held", "windowed": "no_held"}
# Ablations that show only with several sessions at once; the 1-session ablation run reports no ratio for them.
NEEDS_SESSIONS: dict[str, int] = {"arrival_talker": 4}


def derive_variant(data: dict[str, Any], variant: str) -> dict[str, Any]:
    """Apply an ablation to a preset dict (for base presets without a YAML in latency_bench/presets/)."""
    data = json.loads(json.dumps(data))
    stages = {st["name"]: st for st in data["stages"]}
    entry = stages[data["entry"]]
    entry.setdefault("args", {})
    if variant == "naive":
        for st in data["stages"]:
            if st.get("can_accept_stream_before_payload"):
                st["can_accept_stream_before_payload"] = False
        if "asr" in stages:
            asr_args = stages["asr"].setdefault("args", {})
            asr_args["speculative_after_ms"] = 100000
            asr_args.pop("speculative_alone_after_ms", None)
    elif variant == "no_async":
        entry["args"]["async_decode"] = False
    elif variant == "no_prefix":
        entry["args"]["prefix_reuse"] = False
    elif variant == "torch":
        entry["args"]["backend"] = "torch"
    elif variant == "arrival_talker":
        stages["talker"].setdefault("args", {})["clause_order"] = "arrival"
    elif variant == "windowed":
        if entry["factory"] != "omni_rt.engine.factory:create_ar_scheduler":
            raise ValueError(f"windowed: the entry stage factory is {entry['factory']}, not create_ar_scheduler")
        entry["args"].update(batch_wait_ms=WINDOW_MS, batch_wait_when_idle=True)
    elif variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {list(VARIANTS)}")
    data["name"] = f"{data.get('name', 'preset')}-{variant}"
    return data


def dump_preset(data: dict[str, Any], header: str) -> str:
    import yaml

    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=200)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def variant_preset(base: str, variant: str, tmp: Path) -> str:
    """Path of the preset a variant server runs: the base preset with the ablation applied. For the ``cpu`` base
    it is (re)written to ``latency_bench/presets/<variant>.yaml`` (so the file there is exactly what ran and
    follows ``models/cpu.yaml``); other bases go to a temp dir."""
    if VARIANTS[variant][1] is None:
        return base  # the base pipeline (streaming), or a server flag rather than a pipeline change
    import yaml

    from omni_rt.presets import PRESET_DIR

    path = Path(base) if Path(base).suffix else PRESET_DIR / f"{base}.yaml"
    data = derive_variant(yaml.safe_load(path.read_text()), variant)
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    header = (f"Ablation '{variant}' of {rel}: {VARIANTS[variant][0]}.\n"
              f"Generated by latency_bench (ablations.derive_variant) from {rel}; serve it with\n"
              f"omni-rt serve {' '.join(VARIANTS[variant][2] + [''])}--preset THIS_FILE")
    text = dump_preset(data, header)
    fname = VARIANTS[variant][1]
    out = PRESETS_DIR / fname if base == "cpu" and fname else tmp / f"{path.stem}-{variant}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return str(out)


def _p50(summary: dict[str, Any], key: str) -> float | None:
    return (summary.get(key) or {}).get("p50")


def baseline_of(result: dict[str, Any], name: str) -> tuple[str, dict[str, Any]] | None:
    """(name, summary) of the run an ablation is compared with: the streaming turns measured right after it (or
    all streaming turns pooled), or ``BASELINE``'s variant of the same run."""
    ab = result.get("ablation", {})
    base = BASELINE.get(name, "streaming")
    if base == "streaming" and ab[name].get("paired_streaming"):
        return "streaming", ab[name]["paired_streaming"].get("summary", {})
    if base in ab and ab[base].get("turns_ok"):
        return base, ab[base].get("summary", {})
    return None


def not_shown(result: dict[str, Any], name: str) -> str | None:
    """Why an ablation's numbers cannot show its effect in this result; None when they can."""
    if name in NEEDS_SESSIONS:
        return (f"shows only with {NEEDS_SESSIONS[name]}+ sessions at once (run it with --preset "
                f"latency_bench/presets/{VARIANTS[name][1]} --sessions 4,8); this run compares 1 session")
    flags = (result.get("servers", {}).get(name) or {}).get("serve_flags")
    if name in BASELINE and flags is not None and "--no-speculative" not in flags:
        return ("this run served it with the held answer, whose first audio is ready at speech_stopped, so it could not "
                "show; the report now serves it with --no-speculative and compares it with no_held")
    return None


def per_question_ratios(variant: dict[str, Any], key: str = "v2v_ms") -> dict[str, float]:
    """``key`` ratio per question: the variant's turns vs the paired streaming turns (medians per question)."""
    paired = (variant.get("paired_streaming") or {}).get("turns") or []

    def by_q(turns: list[dict[str, Any]]) -> dict[str, float]:
        acc: dict[str, list[float]] = {}
        for r in turns:
            if r.get("ok") and r.get(key) is not None:
                acc.setdefault(r["question"], []).append(r[key])
        return {q: report.percentile(v, 50) for q, v in acc.items()}

    mine, base = by_q(variant.get("turns", [])), by_q(paired)
    return {q: round(mine[q] / base[q], 2) for q in mine if base.get(q)}


def ratios(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each ablation against its baseline on V2V p50 (end of speech -> first audio: what the user waits for; the
    time after speech_stopped is ~0 with the held answer, so a ratio of it means nothing), with the difference in
    the thinker's first token where that is what the ablation changes."""
    ab = result.get("ablation", {})
    out: list[dict[str, Any]] = []
    for name, v in ab.items():
        if name == "streaming" or not v.get("turns_ok"):
            continue
        why = not_shown(result, name)
        if why:
            out.append({"variant": name, "shown": False, "text": f"{name}: not compared: {why}"})
            continue
        got = baseline_of(result, name)
        x = _p50(v.get("summary", {}), "v2v_ms")
        if got is None or x is None or not _p50(got[1], "v2v_ms"):
            continue
        base, bs = got
        b = _p50(bs, "v2v_ms")
        entry: dict[str, Any] = {"variant": name, "shown": True, "baseline": base, "v2v_p50_ms": x,
                                 "baseline_v2v_p50_ms": b, "ratio": round(x / b, 2), "diff_ms": round(x - b, 1)}
        text = f"{name} vs {base}: V2V p50 {x:.0f} vs {b:.0f} ms = {x / b:.2f}x ({x - b:+.0f} ms)"
        if base == "streaming" and v.get("paired_streaming"):
            text += " (streaming measured right after)"
        ft, fb = _p50(v.get("summary", {}), "first_token_ms"), _p50(bs, "first_token_ms")
        if ft is not None and fb is not None:
            entry["first_token_diff_ms"] = round(ft - fb, 1)
            text += f"; thinker 1st token after speech_stopped {ft:.0f} vs {fb:.0f} ms"
        if name == "windowed":
            text += f" (window {WINDOW_MS:.0f} ms)"
        if name == "naive" and (pairs := per_question_ratios(v)):
            entry["by_question"] = pairs
            text += "; V2V by question: " + ", ".join(f"{q!r} {r:.2f}x" for q, r in pairs.items())
        if name == "no_prefix" and "streaming" in ab:
            later = lambda var: report.summarize(r.get("first_token_ms") for r in var.get("turns", [])  # noqa: E731
                                                 if r.get("ok") and r.get("index", 0) >= 1)["p50"]
            lp, lb = later(v), later(ab["streaming"])  # pooled baseline: per-turn records are kept there
            if lp and lb:
                entry["first_token_later_turns"] = {"no_prefix": lp, "streaming": lb}
                text += f"; thinker 1st token on turns >= 2: {lp:.0f} vs {lb:.0f} ms"
        entry["text"] = text
        out.append(entry)
    return out


def checks(result: dict[str, Any], preset: str, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DESIGN.md targets this run can measure. None fails by construction: the naive cascade is an ablation
    reported beside the preset, not a target (its ratio measures answer length more than design), and the
    batching window is checked only where it ran without the held answer."""
    out: list[dict[str, Any]] = []
    sweep = result.get("sweep", {})
    gpu = "gpu" in Path(preset).stem

    def add(name: str, value: str, goal: str, ok: bool | None) -> None:
        out.append({"name": name, "value": value, "goal": goal, "status": "n/a" if ok is None else ("PASS" if ok else "FAIL")})

    def level(n: str, key: str, q: str = "p50") -> float | None:
        return (sweep.get(n, {}).get("summary", {}).get(key) or {}).get(q)

    if gpu:
        t1, top = level("1", "ttfa_ms"), level("16", "ttfa_ms", "p95")
        add("TTFA p50 at 1 session", f"{t1} ms", "<= 150 ms", None if t1 is None else t1 <= 150)
        add("TTFA p95 at 16 sessions", f"{top} ms", "<= 300 ms", None if top is None else top <= 300)
        under = sum((lv["summary"].get("underrun_count", {}).get("max") or 0) for lv in sweep.values())
        add("playback underruns", f"max {under} per answer", "none", under == 0)
    else:  # server_vad 500 ms, as the run speaks
        for n, ttfa_goal, v2v_goal in (("1", 50, 650), ("4", 100, 800)):
            if n not in sweep:
                continue
            t, v = level(n, "ttfa_ms"), level(n, "v2v_ms")
            s = "session" if n == "1" else "sessions"
            add(f"TTFA p50 at {n} {s}", f"{t} ms", f"<= {ttfa_goal} ms", None if t is None else t <= ttfa_goal)
            add(f"V2V p50 at {n} {s}", f"{v} ms", f"<= {v2v_goal} ms", None if v is None else v <= v2v_goal)
    win = next((r for r in found if r["variant"] == "windowed" and r.get("shown")), None)
    if win is not None and win.get("first_token_diff_ms") is not None:
        d = win["first_token_diff_ms"]
        add("windowed - no_held thinker 1st token p50", f"{d:+.0f} ms",
            f">= +{0.8 * WINDOW_MS:.0f} ms (idle-immediate batching saves the {WINDOW_MS:.0f} ms window)", d >= 0.8 * WINDOW_MS)
    barge = [r.get("barge_stop_ms") for lv in sweep.values() for r in lv.get("turns", []) if r.get("barge_cancelled")]
    bs = report.summarize(barge)
    add("barge-in stop (speech_started -> last delta)", f"p50 {bs['p50']} / max {bs['max']} ms (n={bs['n']})", "<= 100 ms",
        None if not bs["n"] else bs["max"] <= 100)
    return out


def ratios_and_checks(result: dict[str, Any], preset: str) -> None:
    """Set ``result["ratios"]`` and ``result["checks"]``, and note what made the numbers unreliable."""
    result["ratios"] = ratios(result)
    result["checks"] = checks(result, preset, result["ratios"])
    notes = result.setdefault("notes", [])
    m = result["machine"]
    start_load = (m.get("loadavg_start") or [0.0])[0]
    if start_load > 0.5 * (m.get("cpus_usable") or 1):
        notes.append(f"other processes were using the machine when this run started (load average {start_load:.1f} on "
                     f"{m.get('cpus_usable')} CPUs, before any server of the run existed): the numbers are inflated; rerun "
                     "on an idle machine for the real figures")
    late = max([(lv.get("client", {}).get("client_late_ms_max") or 0) for lv in list(result.get("sweep", {}).values())
                + list(result.get("ablation", {}).values())] or [0])
    if late > 50:
        notes.append(f"the load generator itself ran late (a microphone chunk up to {late:.0f} ms behind its real-time instant)")
