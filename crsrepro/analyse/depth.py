"""The layer-depth sweep's analyses (chapter 06; DESIGN.md section 11).

:func:`depth_profiles` turns the sweep's tidy rows (:class:`crsrepro.run.depth.DepthStage`) into the four
dimensions of every (encoder, dataset, seed, layer); :func:`best_depths`, :func:`intermediate_wins`,
:func:`paired_test` and :func:`val_selected_ranking` read that table.
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


def best_depths(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair, the depth of the best seed-mean clean AUROC, and its gain over the 100 % tap.

    Returns
    -------
    DataFrame
        One row per (encoder, dataset): ``best_depth``, ``best_auroc``, ``auroc_100``, ``gain``
        (best - 100 %, in AUROC units), ``auroc_final`` (the primary protocol's) and ``n_seeds``.
    """
    on_axis = curve(table)
    means = on_axis.groupby(["encoder", "dataset", "depth"])["auroc"].mean().reset_index()
    rows = []
    for (encoder, dataset), pair in means.groupby(["encoder", "dataset"], sort=True):
        best = pair.loc[pair["auroc"].idxmax()]
        at_100 = pair.loc[pair["depth"] == 100, "auroc"]
        if at_100.empty:
            raise DepthError(f"depth sweep: {encoder} on {dataset} has no 100 % tap")
        final = table[(table["encoder"] == encoder) & (table["dataset"] == dataset) & (table["layer"] == FINAL)]
        rows.append({"encoder": encoder, "dataset": dataset, "best_depth": int(best["depth"]),
                     "best_auroc": best["auroc"], "auroc_100": float(at_100.iloc[0]),
                     "gain": best["auroc"] - float(at_100.iloc[0]), "auroc_final": final["auroc"].mean(),
                     "n_seeds": on_axis.loc[(on_axis["encoder"] == encoder) & (on_axis["dataset"] == dataset), "seed"].nunique()})
    return pd.DataFrame(rows)


def intermediate_wins(table: pd.DataFrame) -> tuple[int, int]:
    """``(pairs whose best depth is below 100 %, pairs)``: the paper's "5 of 8"."""
    best = best_depths(table)
    return int((best["best_depth"] < 100).sum()), len(best)


def paired_test(table: pd.DataFrame) -> pd.DataFrame:
    """Best intermediate tap vs the 100 % tap, paired across seeds, per pair.

    The best intermediate tap is the one of the best seed-mean clean AUROC among 25 / 50 / 75 %. The
    test is a two-sided paired t-test over seeds of the AUROC differences [ours: with 5 seeds a
    Wilcoxon signed-rank test cannot go below p = 0.0625, so it could never reject at 5 %; the
    paired t assumes roughly normal seed differences]. NaN where fewer than two seeds.

    Returns
    -------
    DataFrame
        ``encoder, dataset, depth`` (the best intermediate), ``mean_diff``, ``sd_diff``, ``t``, ``p``, ``n_seeds``.
    """
    from scipy.stats import ttest_rel

    on_axis = curve(table)
    rows = []
    for (encoder, dataset), pair in on_axis.groupby(["encoder", "dataset"], sort=True):
        wide = pair.pivot_table(index="seed", columns="depth", values="auroc")
        inner = [d for d in wide.columns if d < 100]
        if not inner or 100 not in wide.columns:
            raise DepthError(f"depth sweep: {encoder} on {dataset} lacks an intermediate or the 100 % tap")
        depth = wide[inner].mean().idxmax()
        diff = (wide[depth] - wide[100]).dropna()
        t, p = ttest_rel(wide.loc[diff.index, depth], wide.loc[diff.index, 100]) if len(diff) > 1 else (np.nan, np.nan)
        rows.append({"encoder": encoder, "dataset": dataset, "depth": int(depth), "mean_diff": diff.mean(),
                     "sd_diff": diff.std(ddof=1) if len(diff) > 1 else np.nan, "t": float(t), "p": float(p),
                     "n_seeds": len(diff)})
    return pd.DataFrame(rows)


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


__all__ = ["PROFILE_COLUMNS", "best_depths", "curve", "depth_profiles", "intermediate_wins", "paired_test",
           "val_choices", "val_selected_ranking"]
