"""Report helpers for the latency benchmark: machine info, percentiles, tables, JSON, the PNG plot, and
``docs/benchmarks/index.md`` (the latest generated table). No omni_rt imports here (the bench client stays light).

Over 400 lines on purpose: every table, the plot and the docs page read the same result dict; one module keeps
that format in one place.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterable

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
DOCS_INDEX = ROOT / "docs" / "benchmarks" / "index.md"
# the pages beside index.md, one per topic, that hold each topic's history
TOPIC_PAGES = [("concurrency", "concurrency.md"), ("turn taking", "turn-taking.md"), ("soak", "soak.md"),
               ("WebRTC", "webrtc.md"), ("answer quality", "quality.md"), ("engine", "engine.md"), ("GPU", "gpu.md"),
               ("tools", "tools.md"), ("GPT-Live", "gpt-live.md")]

# (key in a turn record, label in tables) — every value is in milliseconds unless the label says otherwise.
METRICS: list[tuple[str, str]] = [
    ("ttfa_ms", "TTFA client (speech_stopped -> 1st audio)"),
    ("ttfa_server_ms", "TTFA server (response.done metadata)"),
    ("v2v_ms", "V2V (end of speech sent -> 1st audio)"),
    ("endpoint_ms", "end of speech sent -> speech_stopped"),
    ("asr_final_ms", "ASR final (speech_stopped -> transcript)"),
    ("first_token_ms", "thinker 1st token (speech_stopped -> 1st text)"),
    ("token_to_audio_ms", "talker+vocoder (1st text -> 1st audio)"),
    ("underrun_ms", "playback underrun per answer (sum)"),
    ("underrun_count", "playback underruns per answer (count)"),
]
BARGE_METRICS: list[tuple[str, str]] = [
    ("barge_stop_ms", "barge-in: speech_started -> last audio delta"),
    ("barge_done_ms", "barge-in: speech_started -> response.done"),
    ("barge_from_speech_ms", "barge-in: talking over sent -> last audio delta"),
]


# ---------------------------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    cpu_model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    gpu = "none"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
            gpu = "; ".join(line.strip() for line in out.splitlines() if line.strip()) or "none"
        except (OSError, subprocess.SubprocessError):
            pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpu_model": cpu_model or "unknown",
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "memory_gb": mem_gb,
        "gpu": gpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": loadavg(),
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_line(m: dict[str, Any]) -> str:
    load = m.get("loadavg_start")
    end = m.get("loadavg_end")
    load_s = f"load avg {load[0]:.1f}" if load else ""
    if load and end:
        load_s += f" -> {end[0]:.1f}"
    return (f"{m['cpu_model']}, {m['cpus_usable']}/{m['cpu_count']} CPUs usable, {m.get('memory_gb')} GB RAM, "
            f"GPU: {m['gpu']}, Python {m['python']}" + (f", {load_s}" if load_s else ""))


# ---------------------------------------------------------------------------------------------- stats
def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return math.nan
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Iterable[float | None]) -> dict[str, float | int | None]:
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        return {"n": 0, "p50": None, "p95": None, "max": None, "mean": None}
    return {"n": len(xs), "p50": round(percentile(xs, 50), 1), "p95": round(percentile(xs, 95), 1),
            "max": round(max(xs), 1), "mean": round(sum(xs) / len(xs), 1)}


def summarize_turns(turns: list[dict[str, Any]], metrics=METRICS) -> dict[str, dict[str, Any]]:
    return {key: summarize(t.get(key) for t in turns) for key, _ in metrics}


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus-style quantile from cumulative (le, count) buckets (linear inside a bucket)."""
    if not buckets:
        return None
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return buckets[-1][0]


# ---------------------------------------------------------------------------------------------- tables
def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _cell(s: dict[str, Any], count: bool = False) -> str:
    if not s or not s.get("n"):
        return "-"
    d = 1 if count else 0
    return f"{_fmt(s['p50'], d)} / {_fmt(s['p95'], d)} / {_fmt(s['max'], d)}"


def sweep_table(result: dict[str, Any], markdown: bool = False) -> str:
    levels = result.get("sweep", {})
    keys = list(levels)
    header = ["metric (ms) — p50 / p95 / max"] + [f"{k} session{'s' if k != '1' else ''} (n={levels[k]['turns_ok']})" for k in keys]
    rows = []
    for key, label in METRICS + BARGE_METRICS:
        cells = [_cell(levels[k]["summary"].get(key, {}), count=key == "underrun_count") for k in keys]
        if all(c == "-" for c in cells):
            continue
        rows.append([label] + cells)
    rows.append(["turns failed / timed out"] + [str(levels[k]["turns_failed"]) for k in keys])
    return _table(header, rows, markdown)


STAGE_ORDER = ("asr_final", "smart_turn", "thinker", "talker", "vocoder")  # the path after the last word, in order


def stage_time_table(result: dict[str, Any], markdown: bool = False) -> str:
    """Per stage on the path after the last word: queue and compute p50 / p95 (ms) at each concurrency level,
    from the server's exact samples (``/debug/stage_times``; ``~`` marks values interpolated in the
    ``omni_rt_stage_time_seconds`` histograms instead); '' when the server reports none."""
    levels = result.get("sweep", {})
    keys = [k for k in levels if levels[k].get("stage_times")]
    if not keys:
        return ""
    found = {st for k in keys for st in levels[k]["stage_times"]}
    stages = [st for st in STAGE_ORDER if st in found] + sorted(found - set(STAGE_ORDER))
    header = ["stage (ms) — p50 / p95"]
    for k in keys:
        header += [f"{k} sess. queue", f"{k} sess. compute"]
    rows = []
    for st in stages:
        row = [st]
        for k in keys:
            for kind in ("queue", "compute"):
                v = levels[k]["stage_times"].get(st, {}).get(kind)
                mark = "" if not v or v.get("exact", True) else "~"  # ~: interpolated in histogram buckets
                row.append(f"{mark}{_fmt(v.get('p50_ms'))} / {mark}{_fmt(v.get('p95_ms'))} (n={v.get('count', 0)})" if v else "-")
        rows.append(row)
    # the CPU the level burnt, per answered turn (a run that started its server): what two shared cores must fit
    for part, label in (("server", "CPU per turn: server process"), ("children", "CPU per turn: its children (llama-server)")):
        if any(part in levels[k].get("cpu_ms_per_turn", {}) for k in keys):
            rows.append([label] + [c for k in keys for c in ("", _fmt(levels[k].get("cpu_ms_per_turn", {}).get(part)))])
    return _table(header, rows, markdown)


def ablation_table(result: dict[str, Any], markdown: bool = False) -> str:
    """One row per variant (1 session): its V2V and where the time after speech_stopped went, and the V2V of the
    run it is compared with (``ratios``: the paired streaming turns, or no_held for the ablations the held
    answer hides); '-' where the comparison cannot show anything (``ratios``' ``shown``)."""
    ab = result.get("ablation", {})
    if not ab:
        return ""
    header = ["variant (1 session)", "turns", "V2V p50", "V2V p95", "TTFA p50", "ASR final p50", "1st token p50",
              "compared with", "its V2V p50", "V2V difference"]
    by_name = {r["variant"]: r for r in result.get("ratios", [])}
    rows = []
    for name, v in ab.items():
        s = v.get("summary", {})
        r = by_name.get(name, {})
        shown = bool(r.get("shown", "ratio" in r))
        base = r.get("baseline", "streaming") if shown else "-"
        diff = f"{r['diff_ms']:+.0f} ms ({r['ratio']:.2f}x)" if shown and r.get("diff_ms") is not None else "-"
        rows.append([f"{name}: {v.get('description', '')}", str(v.get("turns_ok", 0)), _fmt(s.get("v2v_ms", {}).get("p50")),
                     _fmt(s.get("v2v_ms", {}).get("p95")), _fmt(s.get("ttfa_ms", {}).get("p50")),
                     _fmt(s.get("asr_final_ms", {}).get("p50")), _fmt(s.get("first_token_ms", {}).get("p50")),
                     base, _fmt(r.get("baseline_v2v_p50_ms")) if shown else "-", diff])
    return _table(header, rows, markdown)


def stages_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    header = ["stage", "p50 ms", "p95 ms", "max ms", "n", "note"]
    body = [[r["stage"], _fmt(r["p50"], 1), _fmt(r["p95"], 1), _fmt(r["max"], 1), str(r["n"]), r.get("note", "")] for r in rows]
    return _table(header, body, markdown)


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), sep] + [fmt(r) for r in rows])


def checks_lines(result: dict[str, Any]) -> list[str]:
    return [f"[{c['status']}] {c['name']}: {c['value']} (goal {c['goal']})" for c in result.get("checks", [])]


def ratio_lines(result: dict[str, Any]) -> list[str]:
    return [r["text"] for r in result.get("ratios", [])]


def thinker_of(result: dict[str, Any]) -> str:
    """Which thinker a run measured (runs saved before ``--thinker`` existed ran the preset's)."""
    return result["config"].get("thinker") or "the preset's"


def text_report(result: dict[str, Any]) -> str:
    m = result["machine"]
    out = [f"omni-rt latency benchmark — preset {result['config']['preset']}, {result['config']['mode']} run, {result['started_at']}",
           f"thinker: {thinker_of(result)}", f"machine: {machine_line(m)}", ""]
    if result.get("sweep"):
        out += ["Concurrency sweep (client-side timings; server TTFA from response.done metadata):", sweep_table(result), ""]
        if st := stage_time_table(result):
            out += ["Where the time goes (server-side, per answered turn: each stage's first output after the last word, "
                    "waiting vs computing):", st, ""]
    if result.get("ablation"):
        out += ["Ablations (one server per variant, 1 session, same questions; streaming rerun right after each variant; "
                "compared on V2V):",
                ablation_table(result), ""]
        out += ratio_lines(result) + [""]
    if result.get("checks"):
        out += ["Targets (DESIGN.md):"] + checks_lines(result) + [""]
    if result.get("notes"):
        out += [f"note: {n}" for n in result["notes"]]
    return "\n".join(out)


def markdown_report(result: dict[str, Any], png_rel: str = "latency_bench/results/latest.png") -> str:
    m = result["machine"]
    cmd = result["config"].get("command", "python -m latency_bench")
    out = ["The report: `python -m latency_bench report --update-docs` (starts one server per pipeline variant itself; "
           "< 15 min on 2 cores; `--quick` for a < 5-minute run, `--url ws://HOST:PORT` to load a running server, "
           "`--preset gpu` on a GPU machine) writes `latency_bench/results/latest.{json,png,md}` and this page. "
           "Per-stage timings in-process: `python -m latency_bench stages`. Every session streams Piper-spoken questions "
           "in real time (24 kHz PCM16, 20 ms chunks, `server_vad` with 500 ms silence) and times events as the client "
           "receives them: V2V = last speech sample sent -> first audio delta (what the user waits for), TTFA = "
           "`speech_stopped` -> first audio delta. The preset starts the answer in the end-of-turn silence and holds it "
           "until the turn ends, so its TTFA is near 0 ms and V2V is the figure to compare; the ablations are compared "
           "on V2V.",
           "",
           f"Latest run: `{cmd}` ({result['started_at']}, preset `{result['config']['preset']}`, thinker "
           f"{thinker_of(result)}), {machine_line(m)}.", ""]
    if result.get("notes"):
        for n in result["notes"]:
            out += [f"> **Note:** {n}", ""]
    if result.get("sweep"):
        out += [sweep_table(result, markdown=True), ""]
        if st := stage_time_table(result, markdown=True):
            out += ["Where the time goes (server-side `omni_rt_stage_time_seconds`, per answered turn: each stage's first "
                    "output after the last word, waiting vs computing):", "", st, ""]
    if result.get("ablation"):
        out += [ablation_table(result, markdown=True), ""]
        out += [f"- {line}" for line in ratio_lines(result)] + [""]
    if result.get("checks"):
        out += [f"- {line}" for line in checks_lines(result)] + [""]
    out += [f"![]({png_rel})", ""]
    stages_path = RESULTS_DIR / "stages.json"
    if stages_path.exists():
        try:
            st = json.loads(stages_path.read_text())
            est = st.get("estimate", {})
            out += [f"Per-stage latency in-process (`python -m latency_bench stages`, {st['started_at']}, "
                    f"{machine_line(st['machine'])}), a {st['utterance_s']} s question:", "",
                    stages_table(st["stages"], markdown=True), "",
                    f"End-of-turn critical path (p50 sums): {est.get('critical_path_speculative_ms', 0):.0f} ms with the "
                    f"speculative ASR decode, {est.get('critical_path_no_speculative_ms', 0):.0f} ms without.", ""]
        except (KeyError, ValueError, TypeError):
            pass
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- files
def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = result.get("sweep", {})
    ab = result.get("ablation", {})
    ncols = 2 if ab else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.6), squeeze=False)
    ax = axes[0][0]
    levels = sorted(int(k) for k in sweep)
    series = [("ttfa_ms", "TTFA", "tab:blue"), ("v2v_ms", "V2V", "tab:red"), ("asr_final_ms", "ASR final", "tab:green"),
              ("first_token_ms", "thinker 1st token", "tab:purple")]
    for key, label, color in series:
        for q, style in (("p50", "-o"), ("p95", "--s")):
            ys = [sweep[str(n)]["summary"].get(key, {}).get(q) for n in levels]
            pts = [(n, y) for n, y in zip(levels, ys) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{label} {q}",
                        alpha=1.0 if q == "p50" else 0.6)
    if levels:
        if levels[-1] / max(levels[0], 1) > 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(n) for n in levels])
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("ms")
    ax.set_title(f"latency vs concurrency — preset {result['config']['preset']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    if ab:
        ax2 = axes[0][1]
        names = list(ab)
        p50 = [ab[n]["summary"].get("v2v_ms", {}).get("p50") or 0 for n in names]
        p95 = [ab[n]["summary"].get("v2v_ms", {}).get("p95") or 0 for n in names]
        xs = range(len(names))
        bars = ax2.bar([x - 0.2 for x in xs], p50, 0.4, label="V2V p50", color="tab:red")
        ax2.bar([x + 0.2 for x in xs], p95, 0.4, label="V2V p95", color="tab:orange")
        ax2.bar_label(bars, labels=[f"{v:.0f}" for v in p50], fontsize=7)
        ax2.set_xticks(list(xs))
        ax2.set_xticklabels(names, rotation=20, fontsize=8)
        ax2.set_ylabel("ms")
        ax2.set_title("ablations, 1 session")
        ax2.grid(alpha=0.3, axis="y")
        ax2.legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(f"omni-rt — {m['cpu_model']}, {m['cpus_usable']} CPUs, GPU: {m['gpu']} ({result['started_at']})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def index_page(md: str) -> str:
    """``docs/benchmarks/index.md``: a line linking the topic pages, then the latest generated report."""
    links = " · ".join(f"[{name}]({page})" for name, page in TOPIC_PAGES)
    return (f"# Benchmarks\n\nBy topic, with their history: {links}.\n\n"
            "Generated by `python -m latency_bench report --update-docs` (from the saved result without a run: "
            "`python -m latency_bench report --from-json latency_bench/results/latest.json --update-docs`); "
            "do not edit by hand.\n\n"
            + md.rstrip("\n") + "\n")


def update_docs(md: str, page: Path = DOCS_INDEX) -> None:
    """Write the latest generated report as ``docs/benchmarks/index.md`` (the whole page is generated)."""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(index_page(md))


def write_markdown(result: dict[str, Any], out_json: Path, out_png: Path, docs: bool = False) -> str:
    """Write ``out_json``'s .md beside it (and ``docs/benchmarks/index.md`` when ``docs``); return the markdown."""
    md = markdown_report(result, png_rel=os.path.relpath(out_png, ROOT) if out_png.is_relative_to(ROOT) else str(out_png))
    out_json.with_suffix(".md").write_text(md)
    if docs:
        update_docs(_docs_md(result, out_png))
    return md


def _docs_md(result: dict[str, Any], out_png: Path) -> str:
    """The report as the docs page shows it: image links relative to docs/benchmarks/."""
    rel = os.path.relpath(out_png.resolve(), DOCS_INDEX.parent)
    return markdown_report(result, png_rel=rel)


def rereport(path: Path, png: Path, docs: bool = False) -> dict[str, Any]:
    """``report --from-json``: recompute the ratios and checks of a saved result with today's rules, rewrite it and
    its .md (and the docs page when ``docs``); the run's own notes are kept as they were."""
    from latency_bench.ablations import checks, ratios

    result = json.loads(path.read_text())
    result["ratios"] = ratios(result)
    result["checks"] = checks(result, result["config"]["preset"], result["ratios"])
    write_json(result, path)
    write_markdown(result, path, png, docs=docs)
    return result
