"""The worked examples of the chapters: each metric and score of the paper on a handful of toy numbers.

A chapter shows one of these tables before the same quantity on its run, so a reader meets the
definition on numbers small enough to check by hand. Every example computes with the library's own
function (:mod:`crsrepro.core.metrics`, :mod:`crsrepro.score.crs`, :mod:`crsrepro.score.stats`), never a
copy of it, and each docstring's example pins what the chapter's prose says about it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def toy_auroc() -> pd.DataFrame:
    """AUROC as a ranking probability on four cases (two positives, two negatives).

    One row per (positive, negative) pair: whether the positive is scored above the negative. The
    share of such pairs is the AUROC, as :func:`crsrepro.core.metrics.binary_auroc` computes it
    (``attrs["auroc"]``).

    >>> table = toy_auroc()
    >>> int(table["ranked above"].sum()), table.attrs["auroc"]
    (3, 0.75)
    """
    from crsrepro.core.metrics import binary_auroc

    cases = pd.DataFrame({"case": ["a", "b", "c", "d"], "label": [1, 1, 0, 0], "score": [0.9, 0.4, 0.6, 0.2]})
    positives, negatives = cases[cases["label"] == 1], cases[cases["label"] == 0]
    rows = [{"positive": f"{p.case} ({p.score})", "negative": f"{n.case} ({n.score})",
             "ranked above": p.score > n.score} for p in positives.itertuples() for n in negatives.itertuples()]
    table = pd.DataFrame(rows)
    table.attrs["auroc"] = float(binary_auroc(cases["label"].to_numpy(), cases["score"].to_numpy()))
    return table


def toy_ece(n_bins: int = 5) -> pd.DataFrame:
    """ECE on a dozen two-class predictions, bin by bin (``n_bins`` bins for readability; the paper uses 15).

    One row per non-empty bin: its predictions, mean confidence, accuracy and gap;
    ``attrs["ece"]`` is :func:`crsrepro.core.metrics.expected_calibration_error` of the twelve, which
    equals the count-weighted mean gap.

    >>> table = toy_ece()
    >>> round(table.attrs["ece"], 3) == round(float((table["n"] * table["gap"]).sum() / table["n"].sum()), 3)
    True
    """
    from crsrepro.core.metrics import expected_calibration_error, reliability_curve

    p1 = np.array([0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05])
    y = np.array([1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0])
    probs = np.column_stack([1 - p1, p1])
    curve = reliability_curve(y, probs, task="multiclass", n_bins=n_bins)
    filled = curve.counts > 0
    table = pd.DataFrame({"bin": [f"({lo:.1f}, {hi:.1f}]" for lo, hi in zip(curve.bin_edges[:-1], curve.bin_edges[1:])],
                          "n": curve.counts, "mean confidence": curve.confidence, "accuracy": curve.accuracy})[filled]
    table = table.assign(gap=(table["accuracy"] - table["mean confidence"]).abs()).round(3).reset_index(drop=True)
    table.attrs["ece"] = float(expected_calibration_error(y, probs, task="multiclass", n_bins=n_bins))
    return table


def toy_retention_vs_aulc() -> pd.DataFrame:
    """Two encoders' AUROC per label fraction, with their AULC (:func:`crsrepro.core.metrics.aulc`) and
    retention (:func:`crsrepro.core.metrics.label_efficiency_retention`): A is better with all labels but
    loses much of it with few; AULC still ranks A first, retention ranks B first.

    >>> table = toy_retention_vs_aulc()
    >>> table["AULC"].idxmax(), table["retention"].idxmax()
    ('A', 'B')
    """
    from crsrepro.core.metrics import aulc, label_efficiency_retention

    curves = {"A": {0.01: 0.70, 0.05: 0.80, 0.10: 0.85, 0.25: 0.88, 1.0: 0.92},
              "B": {0.01: 0.76, 0.05: 0.78, 0.10: 0.79, 0.25: 0.80, 1.0: 0.80}}
    rows = {name: {**{f"{f:.0%}": v for f, v in curve.items()}, "AULC": aulc(curve),
                   "retention": label_efficiency_retention(curve)} for name, curve in curves.items()}
    return pd.DataFrame(rows).T.round(3)


def toy_pareto() -> pd.DataFrame:
    """Pareto dominance on three encoders' normalised profiles: A dominates B (at least as good on
    every dimension, better on one); C trades AUROC for calibration and dominates no one. The CRS
    components come from :func:`crsrepro.score.crs.crs_components`, each encoder against the two others.

    >>> table = toy_pareto()
    >>> table["pareto"].tolist(), table["dominates"].tolist()
    ([0.5, 0.0, 0.0], ['B', '-', '-'])
    """
    from crsrepro.score.crs import DIMENSIONS, crs_components

    names = ["A", "B", "C"]
    p = np.array([[0.9, 0.8, 0.7, 0.6], [0.8, 0.7, 0.7, 0.5], [0.5, 0.9, 0.8, 0.4]])
    peers = ~np.eye(3, dtype=bool)
    parts = crs_components(p, p, peers)
    dominated = (p[:, None, :] >= p[None]).all(-1) & (p[:, None, :] > p[None]).any(-1)
    table = pd.DataFrame(p, index=names, columns=list(DIMENSIONS))
    table["dominates"] = [", ".join(n for n, d in zip(names, row) if d) or "-" for row in dominated]
    for name in ("pareto", "proximity", "worst", "crs"):
        table[name] = np.round(parts[name], 3)
    return table


def toy_paired_bootstrap(n_resamples: int = 2000) -> pd.DataFrame:
    """A seed-paired bootstrap on two encoders over five seeds of one dataset
    (:func:`crsrepro.score.stats.seed_paired_bootstrap`, against a frame frozen from the same profiles).

    A beats B on four seeds of five, by a little; seed 2 is hard for both, and B wins it. Returns the per-seed profiles;
    ``attrs`` holds A's P(rank 1) and the 95 % interval of the paired CRS difference A - B.

    >>> table = toy_paired_bootstrap(500)
    >>> table.attrs["p_rank1_a"] > 0.5, table.attrs["ci_low"] <= table.attrs["ci_high"]
    (True, True)
    """
    from crsrepro.score.crs import ReferenceFrame
    from crsrepro.score.stats import seed_paired_bootstrap

    auroc_a = [0.86, 0.88, 0.78, 0.84, 0.85]
    auroc_b = [0.84, 0.85, 0.80, 0.83, 0.84]
    rows = [{"encoder": name, "dataset": "toy", "seed": seed, "auroc": auroc, "ece": 0.06,
             "retention": 0.9, "robustness": 0.9}
            for name, aurocs in (("A", auroc_a), ("B", auroc_b)) for seed, auroc in enumerate(aurocs)]
    profiles = pd.DataFrame(rows)
    result = seed_paired_bootstrap(profiles, ReferenceFrame.freeze(profiles), n_resamples=n_resamples, rng=0)
    diff = result.paired_diff_ci("A", "B")
    table = profiles.pivot(index="seed", columns="encoder", values="auroc").add_prefix("AUROC ")
    table.attrs.update(p_rank1_a=float(result.p_rank1["A"]), ci_low=diff.ci_low, ci_high=diff.ci_high,
                       estimate=diff.estimate)
    return table
