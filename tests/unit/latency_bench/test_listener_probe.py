"""The listener-sound probe's fitting code (``latency_bench.listener_probe``): its corpus never repeats a bench
clip's text, interruptions led by a listener word stay out, and the fit and AUC do what they say."""

from __future__ import annotations

import numpy as np

from latency_bench import backchannel_bench as bench
from latency_bench import listener_probe as lp


def test_training_texts_are_none_of_the_bench_sets() -> None:
    bench_texts = {t for bcs, ints, _ in bench.HALVES.values() for t in bcs + ints}
    assert not bench_texts & set(lp.TRAIN_BACKCHANNELS + lp.TRAIN_INTERRUPTIONS)
    assert lp.led_by_listener_word("Okay, wait.") and lp.led_by_listener_word("Mm, no.")
    assert not lp.led_by_listener_word("Wait a second.") and not lp.led_by_listener_word("Hey, listen.")


def test_fit_separates_and_auc_ranks() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-1, 1, (200, 4)), rng.normal(1, 1, (200, 4))])
    y = np.r_[np.zeros(200), np.ones(200)]
    w, b = lp.fit(x, y, l2=1e-3)
    scores = x @ w + b
    assert lp.auc(scores, y.astype(np.int64)) > 0.95 and (w > 0).all()
    assert lp.auc(-scores, y.astype(np.int64)) < 0.05
    assert lp.auc(scores, np.zeros(400, np.int64)) is None  # one class only: no AUC


def test_out_of_fold_logits_come_from_the_other_texts() -> None:
    """One logit per training look, from probes fitted on the other folds' texts: an interruption text that sounds
    like the backchannels scores as one; the longest look of each clip is what the pause rule is checked on."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(10):
        for kind in ("interruption", "backchannel"):
            for cut in (250, 900):
                centre = 1.0 if kind == "interruption" and i else -1.0
                rows += [{"text": f"{kind} {i}", "kind": kind, "cut": cut, "f": rng.normal(centre, 0.3, 3)} for _ in range(4)]
    oof = lp.out_of_fold(rows, l2=1e-3)
    assert oof.shape == (len(rows),)
    odd = np.array([r["text"] == "interruption 0" for r in rows])
    ints = np.array([r["kind"] == "interruption" for r in rows])
    assert (oof[odd] < 0).all() and (oof[ints & ~odd] > 0).all() and (oof[~ints] < 0).all()
    # every clip here has one voice key (no "voice"): one longest look per (kind, text)
    for r in rows:
        r["voice"] = "-"
    under = lp._last_looks_under(rows, oof, 0.0)
    assert under == {"backchannel": "10/10", "cough": "0/0", "interruption": "1/10"}
