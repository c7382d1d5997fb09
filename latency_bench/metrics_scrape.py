"""The server-side view of a run: ``/metrics`` histograms (TTFA, per-stage latency, per-stage queue/compute)
scraped before and after a level, and the exact per-turn stage times of ``/debug/stage_times``."""

from __future__ import annotations

from typing import Any

from latency_bench import report


def scrape(http_url: str) -> dict[str, list[tuple[float, float]]]:
    """{series: cumulative buckets} for the TTFA, per-stage latency and per-stage queue/compute histograms of
    /metrics (the last as ``stage_time:<stage>:<queue|compute>``)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{http_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in ("omni_rt_ttfa_seconds", "omni_rt_stage_latency_seconds", "omni_rt_stage_time_seconds"):
            continue
        for s in fam.samples:
            if not s.name.endswith("_bucket"):
                continue
            if fam.name == "omni_rt_stage_time_seconds":
                key = f"stage_time:{s.labels.get('stage', '?')}:{s.labels.get('kind', '?')}"
            else:
                key = "ttfa" if fam.name == "omni_rt_ttfa_seconds" else s.labels.get("stage", "?")
            out.setdefault(key, []).append((float(s.labels["le"]), float(s.value)))
    return out


def stage_samples(http_url: str, after: int = 0) -> dict[str, Any] | None:
    """The server's exact per-turn stage times numbered above ``after`` (``/debug/stage_times``); None when
    the server has no such endpoint (then the table falls back to the histograms)."""
    import httpx

    try:
        r = httpx.get(f"{http_url}/debug/stage_times", params={"after": after}, timeout=10)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def histogram_delta(before: dict, after: dict) -> dict[str, dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {}
    for key, buckets in after.items():
        prev = dict(before.get(key, []))
        diff = [(le, c - prev.get(le, 0.0)) for le, c in buckets]
        total = max((c for _, c in diff), default=0.0)
        if total <= 0:
            continue
        qs = {p: report.histogram_quantile(diff, p) for p in (0.5, 0.95)}
        res[key] = {"count": int(total), **{f"p{int(p * 100)}_ms": (None if v is None else round(v * 1000, 1)) for p, v in qs.items()}}
    return res


def stage_times(hist: dict[str, dict[str, Any]], samples: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """{stage: {queue|compute: {count, p50_ms, p95_ms, max_ms, exact}}} for one level (server-side, per answered
    turn: each stage's first output after the last word). From the exact ``samples`` of /debug/stage_times when
    given, else out of the histogram deltas (quantiles interpolated inside buckets)."""
    out: dict[str, dict[str, Any]] = {}
    if samples is not None:
        values: dict[tuple[str, str], list[float]] = {}
        for row in samples:
            values.setdefault((row["stage"], row["kind"]), []).append(float(row["ms"]))
        for (stage, kind), v in values.items():
            out.setdefault(stage, {})[kind] = {"count": len(v), "p50_ms": round(report.percentile(v, 50), 1),
                                               "p95_ms": round(report.percentile(v, 95), 1), "max_ms": round(max(v), 1),
                                               "exact": True}
        return out
    for key, v in hist.items():
        if key.startswith("stage_time:"):
            _, stage, kind = key.split(":", 2)
            out.setdefault(stage, {})[kind] = {**v, "exact": False}
    return out
