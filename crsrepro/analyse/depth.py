"""The layer-depth sweep's analyses (chapter 06; DESIGN.md section 11).

:func:`depth_profiles` turns the sweep's tidy rows (:class:`crsrepro.run.depth.DepthStage`) into the four
dimensions of every (encoder, dataset, seed, layer); :func:`best_depths`, :func:`intermediate_wins`,
:func:`win_counts`, :func:`paired_test` and :func:`val_selected_ranking` read that table.

A depth is only ever *chosen* on the val split (``val_auroc``), and only *judged* on the test split: the
paper's "an intermediate layer wins in 5 of 8 sweeps" becomes "the val-chosen tap is intermediate", shown
beside the count that exchangeable taps would give (:func:`exchangeable_wins`: 3 of 4 taps are
intermediate, so chance alone gives 3/4 of the pairs), and the claim that it is *better* is a one-sided
paired test over seeds with Holm's correction across pairs (:func:`paired_test`, :func:`holm`). Each
is computed against both last layers of :data:`REFERENCES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.core.schema import FINAL
from crsrepro.core.vocab import CLEAN
from crsrepro.run.depth import DEPTHS, DepthError, tap_depth
from crsrepro.run.results import runs_table
from crsrepro.score.dimensions import reliability_profiles, select_runs

PROFILE_COLUMNS = ["encoder", "family", "dataset", "seed", "layer", "depth", "auroc", "ece", "retention",
                   "robustness", "val_auroc"]
REFERENCES = ("depth100", "final")
"""The last layers an intermediate tap is compared with: ``depth100``, the 100 % tap of the depth axis (the
last block's tokens pooled like the other taps; a demo network's ``final``, which *is* that), and ``final``,
the primary protocol's embedding (the sweep's ``final`` rows are the grid's linear probe on the same unit
and features; for the demo networks the two are one layer)."""
ALPHA = 0.05
"""The family-wise level of :func:`paired_test` [ours: the conventional 5 %]."""


def depth_profiles(results: pd.DataFrame) -> pd.DataFrame:
    """The four dimensions of every (encoder, dataset, seed, layer) of a depth sweep's tidy rows.

    Every layer's runs are scored by :func:`crsrepro.score.dimensions.reliability_profiles` (``layer=None``:
    each tap is a cell of its own); ``depth`` is :func:`crsrepro.run.depth.tap_depth` and ``val_auroc`` the
    clean full-label probe's val AUROC.

    Raises
    ------
    DepthError
        The table has no rows.
    """
    from crsrepro.encoders import get_encoder_spec

    if results.empty:
        raise DepthError("depth sweep: the results table has no rows")
    runs = runs_table(results)
    on = ["encoder", "dataset", "seed", "layer"]
    val = select_runs(runs, layer=None, condition=CLEAN, label_fraction=1.0)[on + ["val_auroc"]]
    table = reliability_profiles(runs, layer=None).merge(val, on=on)
    table["depth"] = [tap_depth(get_encoder_spec(e), layer) for e, layer in zip(table["encoder"], table["layer"])]
    order = {t: i for i, t in enumerate([*DEPTHS, FINAL])}
    table = table.iloc[np.lexsort((table["layer"].map(order), table["seed"], table["dataset"], table["encoder"]))]
    return table[[c for c in PROFILE_COLUMNS if c in table.columns]].reset_index(drop=True)


def curve(table: pd.DataFrame) -> pd.DataFrame:
    """The rows on the depth axis (depth 25 ... 100), for :func:`crsrepro.present.plots.depth_curves`."""
    return table[table["depth"].notna()].reset_index(drop=True)


def _choices(table: pd.DataFrame, reference: str, *, intermediate_only: bool = False) -> pd.DataFrame:
    """Per pair (index ``encoder, dataset``), the candidate tap of the best seed-mean val AUROC: ``layer, depth,
    val_auroc, auroc`` (seed means), and ``reference, auroc_reference, auroc_final, n_taps``.

    The candidates are the intermediate taps (depth < 100 %) and, unless ``intermediate_only``, the last
    layer ``reference`` (:data:`REFERENCES`); a tie on val goes to the last layer [ours].
    """
    if reference not in REFERENCES:
        raise DepthError(f"depth sweep: reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    pair = ["encoder", "dataset"]
    means = table.groupby([*pair, "layer"], sort=True)[["depth", "val_auroc", "auroc"]].mean().reset_index()
    means["last"] = means["depth"].eq(100) if reference == "depth100" else means["layer"].eq(FINAL)
    means["inner"] = means["depth"].lt(100)
    counts = means.groupby(pair)[["last", "inner"]].sum()
    bad = counts[(counts["last"] != 1) | (counts["inner"] == 0)]
    if len(bad):
        encoder, dataset = bad.index[0]
        raise DepthError(f"depth sweep: {encoder} on {dataset} lacks an intermediate tap or its {reference} tap")
    last = means[means["last"]].set_index(pair)
    pool = means[means["inner"] | (means["last"] & (not intermediate_only))]
    chosen = pool.sort_values([*pair, "val_auroc", "last"], ascending=[True, True, False, False]).groupby(pair).head(1)
    final = means[means["layer"] == FINAL].set_index(pair)["auroc"]
    return (chosen.set_index(pair)[["layer", "depth", "val_auroc", "auroc"]]
            .assign(reference=last["layer"], auroc_reference=last["auroc"], auroc_final=final,
                    n_taps=counts["inner"] + 1).sort_index())


def best_depths(table: pd.DataFrame, reference: str = "depth100") -> pd.DataFrame:
    """Per pair, the tap chosen on *val* (never on test) and its test-AUROC gain over the last layer.

    The candidates are the intermediate taps (25 / 50 / 75 %) and the last layer ``reference``
    (:data:`REFERENCES`); the chosen one has the best seed-mean val AUROC (a tie goes to the last layer
    [ours]). Its test AUROC is then read, so the choice and the gain use disjoint splits.

    Returns
    -------
    DataFrame
        One row per (encoder, dataset): ``reference`` (the last layer's name), ``best_layer``, ``best_depth``
        (NaN for a ``final`` that is a projection beside a ``depth100`` tap), ``best_val_auroc``,
        ``best_auroc`` and ``auroc_reference`` (seed-mean test AUROC), ``gain`` (best - reference, AUROC
        units), ``auroc_final`` (the primary protocol's), ``intermediate`` (the chosen tap is not the last
        layer), ``n_taps`` (the candidates) and ``n_seeds``.
    """
    chosen = _choices(table, reference)
    best = chosen.rename(columns={"layer": "best_layer", "depth": "best_depth", "val_auroc": "best_val_auroc",
                                  "auroc": "best_auroc"})
    best = best.assign(gain=best["best_auroc"] - best["auroc_reference"],
                       intermediate=best["best_layer"] != best["reference"],
                       n_seeds=table.groupby(["encoder", "dataset"])["seed"].nunique())
    return best[["reference", "best_layer", "best_depth", "best_val_auroc", "best_auroc", "auroc_reference", "gain",
                 "auroc_final", "intermediate", "n_taps", "n_seeds"]].reset_index()


def intermediate_wins(table: pd.DataFrame, reference: str = "depth100") -> tuple[int, int]:
    """``(pairs whose val-chosen tap is intermediate, pairs)``: the paper's "5 of 8" (:func:`best_depths`)."""
    best = best_depths(table, reference)
    return int(best["intermediate"].sum()), len(best)


def exchangeable_wins(n_taps) -> np.ndarray:
    """The null distribution of the intermediate-win count: ``pmf[k]`` = P(k wins) if every pair's taps were
    exchangeable (equally good, so noise alone picks one).

    A pair with T candidate taps, T - 1 of them intermediate, then picks an intermediate one with
    probability (T - 1) / T, whichever split chose it; over independent pairs [ours: pairs sharing an
    encoder or a dataset need not be] the count is Poisson-binomial, and binomial(n, (T - 1) / T), with
    mean n (T - 1) / T, when every pair has T taps (the paper's 8 pairs of 4 taps: 6 of 8).

    >>> exchangeable_wins([4, 4]).tolist()
    [0.0625, 0.375, 0.5625]
    """
    pmf = np.ones(1)
    for t in n_taps:
        pmf = np.convolve(pmf, [1 / t, (t - 1) / t])
    return pmf


def win_counts(table: pd.DataFrame) -> pd.DataFrame:
    """The val-chosen intermediate wins against each last layer, beside the count exchangeable taps would give.

    Returns
    -------
    DataFrame
        Indexed by ``reference`` (:data:`REFERENCES`): ``wins``, ``pairs``, ``expected`` (the null mean,
        :func:`exchangeable_wins`) and ``p_value`` (one-sided: P(count >= wins) under that null; a large
        value means the observed count is what chance alone gives).
    """
    rows = {}
    for reference in REFERENCES:
        best = best_depths(table, reference)
        pmf, wins = exchangeable_wins(best["n_taps"]), int(best["intermediate"].sum())
        expected = float(((best["n_taps"] - 1) / best["n_taps"]).sum())
        rows[reference] = {"wins": wins, "pairs": len(best), "expected": expected, "p_value": float(pmf[wins:].sum())}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("reference")


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control across pairs), in the input order.

    The i-th smallest of m p-values becomes max over j <= i of min(1, (m - j + 1) p_(j)); NaN stays NaN
    and does not count in m.

    >>> holm([0.01, 0.04, 0.03, 0.005]).round(3).tolist()
    [0.03, 0.06, 0.06, 0.02]
    """
    p = np.asarray(p_values, dtype=float)
    out, kept = np.full(p.shape, np.nan), ~np.isnan(p)
    m = int(kept.sum())
    order = np.argsort(p[kept], kind="stable")
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[kept][order]))
    out[kept] = adjusted
    return out


def paired_test(table: pd.DataFrame, reference: str = "depth100", *, alpha: float = ALPHA) -> pd.DataFrame:
    """Does the val-chosen intermediate tap beat the last layer? One-sided, paired over seeds, Holm across pairs.

    Per pair the intermediate tap (25 / 50 / 75 %) of the best seed-mean *val* AUROC is taken, and its
    per-seed test-AUROC differences to ``reference`` (:data:`REFERENCES`) get a one-sided one-sample
    t-test (H1: mean difference > 0) [ours: with 5 seeds a Wilcoxon signed-rank test cannot go below
    p = 0.0625; the t-test assumes roughly normal seed differences, and like every seed test here it is
    conditional on the one test set]. The p-values are Holm-adjusted across the pairs (:func:`holm`).
    The effect is the mean difference in AUROC points with a two-sided ``1 - alpha`` t-interval over
    seeds (n - 1 degrees of freedom). NaN where fewer than two seeds.

    Parameters
    ----------
    alpha : float
        The family-wise level of the Holm test and one minus the interval's level (default :data:`ALPHA`).

    Returns
    -------
    DataFrame
        ``encoder, dataset, layer, depth`` (the tested tap), ``reference``, ``gain_points, ci_low, ci_high``
        (AUROC points), ``t, p, p_holm``, ``survives`` (p_holm < alpha), ``worse`` (the interval lies below
        zero: the intermediate tap is worse than the last layer) and ``n_seeds``.
    """
    from scipy import stats

    chosen = _choices(table, reference, intermediate_only=True)
    rows = []
    for (encoder, dataset), pair in table.groupby(["encoder", "dataset"], sort=True):
        tap, depth, last = chosen.loc[(encoder, dataset), ["layer", "depth", "reference"]]
        wide = pair.pivot_table(index="seed", columns="layer", values="auroc")
        diff = 100 * (wide[tap] - wide[last]).dropna()
        n = len(diff)
        t, p, half = np.nan, np.nan, np.nan
        if n > 1:
            t, p = stats.ttest_1samp(diff, 0.0, alternative="greater")
            half = stats.t.ppf(1 - alpha / 2, n - 1) * diff.std(ddof=1) / np.sqrt(n)
        rows.append({"encoder": encoder, "dataset": dataset, "layer": tap, "depth": depth,
                     "reference": last, "gain_points": diff.mean(), "ci_low": diff.mean() - half,
                     "ci_high": diff.mean() + half, "t": float(t), "p": float(p), "n_seeds": n})
    out = pd.DataFrame(rows)
    out.insert(len(out.columns) - 1, "p_holm", holm(out["p"]))
    out.insert(len(out.columns) - 1, "survives", out["p_holm"] < alpha)
    out.insert(len(out.columns) - 1, "worse", out["ci_high"] < 0)
    return out


def val_choices(table: pd.DataFrame) -> pd.DataFrame:
    """Per (encoder, dataset, seed), the profile of the layer with the best *val* AUROC (never test)."""
    best = table.loc[table.groupby(["encoder", "dataset", "seed"])["val_auroc"].idxmax()]
    return best.reset_index(drop=True)


def val_selected_ranking(table: pd.DataFrame, frame=None):
    """What choosing each cell's depth on val would change in the CRS ranking of the swept encoders.

    The CRS of the final-layer profiles is compared with that of the val-chosen layers' profiles, by
    :func:`crsrepro.score.stats.rank_agreement` of the encoders' mean CRS.

    Parameters
    ----------
    table : DataFrame
        :func:`depth_profiles`' output.
    frame : ReferenceFrame, optional
        Score with the frozen frame (the paper's CRS); default [ours]: ``mode="cohort"`` over the swept
        encoders, since a sweep need not cover the frame's panel.

    Returns
    -------
    (RankAgreement, DataFrame)
        The agreement (``a`` = final layer, ``b`` = val-chosen depth) and the chosen layer per cell and seed.
    """
    from crsrepro.score.crs import aggregate_crs, crs_scores
    from crsrepro.score.stats import rank_agreement

    columns = ["encoder", "dataset", "seed", "auroc", "ece", "retention", "robustness"]
    mode = "cohort" if frame is None else "fixed"
    final = table[table["layer"] == FINAL][columns]
    chosen = val_choices(table)
    a = aggregate_crs(crs_scores(final, frame, mode=mode))["crs"]
    b = aggregate_crs(crs_scores(chosen[columns], frame, mode=mode))["crs"]
    return rank_agreement(a.to_dict(), b.to_dict()), chosen[["encoder", "dataset", "seed", "layer", "val_auroc", "auroc"]]


__all__ = ["ALPHA", "PROFILE_COLUMNS", "REFERENCES", "best_depths", "curve", "depth_profiles", "exchangeable_wins", "holm",
           "intermediate_wins", "paired_test", "val_choices", "val_selected_ranking", "win_counts"]
