"""The paper's analyses around the CRS (DESIGN.md sections 8-10), one function per claim.

Each function takes the runs table of :data:`crsrepro.core.schema.RUN_COLUMNS` (one row per run,
with ``family`` where families matter) or a reliability-profiles table, and returns a small typed
result; every per-cell value is the mean over seeds. The generic statistics they use (rank
agreement, bootstraps) are in :mod:`crsrepro.score.stats`.

- :func:`insertion_experiment`: movement of published scores when encoders join the panel.
- :func:`external_validity` and :func:`leave_one_dataset_out`: does the CRS predict held-out AUROC?
- :func:`control_probe_agreement`: do the control probes rank the encoders like the linear probe?
- :func:`recalibration_summary`: what post-hoc recalibration does to ECE.
- :func:`calibration_under_degradation`: ECE rise against AUROC drop under the perturbations.
- :func:`absolute_label_efficiency`, :func:`aulc_vs_retention`: label efficiency, two ways.
- :func:`welch_transfer_test`: medical-pretrained vs general encoders on the transfer set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from crsrepro.core.metrics import aulc
from crsrepro.core.schema import is_perturbation
from crsrepro.core.vocab import CLEAN, LINEAR, MEDICAL_FAMILIES, NO_RECALIBRATION
from crsrepro.score.crs import ReferenceFrame, aggregate_crs, cell_means, crs_scores
from crsrepro.score.dimensions import ProfileTableError, reliability_profiles, select_runs
from crsrepro.score.stats import (as_generator, bootstrap_interval, check_level, interval_table, rank_agreement,
                                  rank_correlations, seed_paired_bootstrap)

logger = logging.getLogger(__name__)


def _seed_means(rows: pd.DataFrame, by: list[str], columns=("auroc", "ece")) -> pd.DataFrame:
    """Mean over seeds of ``columns`` per ``by`` (the paper's cell values are seed averages)."""
    return rows.groupby(by, sort=True)[list(columns)].mean()


@dataclass(frozen=True)
class InsertionResult:
    """The insertion experiment (DESIGN.md section 9).

    Attributes
    ----------
    movements : DataFrame
        One row per trial, mode, level and published score: ``trial, mode, level, encoder, dataset,
        movement`` (|CRS after insertion - CRS before|). ``level`` is ``cell`` (one row per panel cell)
        or ``aggregate`` (one row per panel encoder, its mean CRS over its cells; ``dataset`` empty).
    summary : DataFrame
        Indexed by ``level`` and ``mode``: ``mean_movement`` and ``max_movement`` over every published
        score of every trial (the paper: cohort 0.053 and 0.167, fixed exactly 0; the paper does not
        say at which level, and the aggregate is the score it ranks by), ``panel_size``,
        ``n_inserted``, ``n_trials``.
    """

    movements: pd.DataFrame
    summary: pd.DataFrame


INSERTION_LEVELS = ("cell", "aggregate")
"""The levels at which the insertion experiment measures movement: each published cell CRS, and each
published encoder's aggregate (the mean over its cells, :func:`crsrepro.score.crs.aggregate_crs`)."""


def insertion_experiment(profiles: pd.DataFrame, *, n_trials: int = 30, n_inserted: int = 3, panel_size: int = 12,
                         rng=0) -> InsertionResult:
    """Insert encoders into a panel and measure how far the panel's published CRS move.

    Each trial draws a random panel of ``panel_size`` encoders and ``n_inserted`` others. Under
    ``fixed`` the frame is frozen from the panel alone, the panel is scored, then panel + inserted are
    scored against the same frame; under ``cohort`` both scorings re-normalise over the scored set.
    The movement of a published score is |after - before|, measured at both
    :data:`INSERTION_LEVELS`: per panel cell and per panel encoder's aggregate CRS. The paper does not
    say which it reports; both are shown **[ours]**.

    Parameters
    ----------
    profiles : DataFrame
        A reliability-profiles table (per seed or per cell).
    n_trials, n_inserted, panel_size : int
        The paper's 30 trials inserting 3 into 12. With fewer than ``panel_size + n_inserted``
        encoders (the demo has 10) the panel shrinks to ``n_encoders - n_inserted`` **[ours]**.
    rng : int or numpy Generator

    Returns
    -------
    InsertionResult
    """
    cells = cell_means(profiles)
    encoders = np.sort(cells["encoder"].unique())
    size = min(panel_size, len(encoders) - n_inserted)
    if size < 2 or n_inserted < 1:
        raise ValueError(f"insertion_experiment needs a panel of at least 2 encoders and 1 to insert; "
                         f"{len(encoders)} encoders, n_inserted={n_inserted}")
    if size < panel_size:
        logger.info("insertion experiment: %d encoders available, so panels of %d (not %d) + %d inserted",
                    len(encoders), size, panel_size, n_inserted)
    generator = as_generator(rng)
    parts = []
    for trial in range(n_trials):
        chosen = generator.permutation(encoders)
        panel = cells[cells["encoder"].isin(chosen[:size])]
        both = cells[cells["encoder"].isin(chosen[:size + n_inserted])]
        frame = ReferenceFrame.freeze(panel)
        for mode, frm in (("fixed", frame), ("cohort", None)):
            before, after = crs_scores(panel, frm, mode=mode), crs_scores(both, frm, mode=mode)
            for level in INSERTION_LEVELS:
                b, a = ((s.set_index(["encoder", "dataset"])["crs"] for s in (before, after)) if level == "cell"
                        else (aggregate_crs(s)["crs"] for s in (before, after)))
                moved = (a.reindex(b.index) - b).abs().rename("movement").reset_index()
                parts.append(moved.assign(trial=trial, mode=mode, level=level))
    movements = pd.concat(parts, ignore_index=True).fillna({"dataset": ""})
    movements = movements[["trial", "mode", "level", "encoder", "dataset", "movement"]]
    summary = movements.groupby(["level", "mode"]).agg(mean_movement=("movement", "mean"),
                                                       max_movement=("movement", "max"))
    summary = summary.loc[list(INSERTION_LEVELS)]  # cell first, as the paper's table
    return InsertionResult(movements=movements,
                           summary=summary.assign(panel_size=size, n_inserted=n_inserted, n_trials=n_trials))


def _encoder_draws(generator: np.random.Generator, n_resamples: int, n_encoders: int) -> np.ndarray:
    """(n_resamples, n_encoders) indices of encoders drawn with replacement, one draw per row: the
    resampling unit of the rank correlations across encoders (:func:`external_validity`,
    :func:`leave_one_dataset_out`)."""
    return generator.integers(0, n_encoders, size=(n_resamples, n_encoders))


def _spearman_replicates(x: np.ndarray, y: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Spearman rho of ``x`` and ``y`` (one value per encoder) on each row of encoder ``draws``; NaN
    for a draw in which either is constant (e.g. one encoder drawn n times)."""
    return rank_correlations(x[draws], y[draws])[1]


@dataclass(frozen=True)
class ExternalValidity:
    """CRS without the transfer term vs the transfer AUROC (DESIGN.md section 10).

    Attributes
    ----------
    table : DataFrame
        By encoder: ``crs`` (without the transfer drop), ``source_auroc`` (clean CheXpert AUROC) and
        ``target_auroc`` (MIMIC-CXR AUROC of the CheXpert probe).
    rho_crs : float
        Spearman rho of ``crs`` with ``target_auroc`` (the paper: 0.529); the plug-in.
    rho_source_auroc : float
        Spearman rho of ``source_auroc`` with ``target_auroc``: the baseline (the paper: 0.864); the plug-in.
    intervals : DataFrame
        Indexed by ``rho_crs``, ``rho_source_auroc`` and ``rho_difference`` (``rho_crs -
        rho_source_auroc``): ``estimate, ci_low, ci_high, plug_in``
        (:func:`crsrepro.score.stats.interval_table`) from the encoder bootstrap of
        :func:`external_validity`.
    n_resamples : int
    frame : ReferenceFrame
        The frame frozen from the profiles without the transfer term.
    """

    table: pd.DataFrame
    rho_crs: float
    rho_source_auroc: float
    intervals: pd.DataFrame
    n_resamples: int
    frame: ReferenceFrame


def external_validity(runs: pd.DataFrame, *, source: str = "chexpert", target: str = "mimic_cxr",
                      crs_level: str = "aggregate", n_resamples: int = 2000, level: float = 0.95,
                      rng=0) -> ExternalValidity:
    """Does the CRS, computed without the transfer term, predict the transfer AUROC better than AUROC?

    The profiles are rebuilt with ``include_transfer=False`` (robustness without the real drop), a
    frame is frozen from them, and their CRS is compared with the ``target`` AUROC of the probes
    trained on ``source`` (Spearman over encoders), against the clean ``source`` AUROC as baseline.

    The intervals of both rhos and of their difference come from a paired bootstrap over
    **encoders** **[ours: the resampling unit]**: each replicate draws the table's n encoders with
    replacement, the same draw for both rhos (so the difference is paired), and recomputes both
    Spearman rhos on the drawn rows; the intervals are :func:`crsrepro.score.stats.bootstrap_interval`.
    The unit is the encoder because a rank correlation over a panel is uncertain first through which
    encoders are in the panel; each encoder's CRS and AUROCs are kept at their published seed means
    (seed noise and test-set noise are left out, and the CRS keeps the peers it was published
    against).

    Parameters
    ----------
    runs : DataFrame
        A runs table with the transfer condition ``target`` on ``source``.
    source, target : str
        The training dataset and the transfer condition.
    crs_level : {"aggregate", "cell"}, default "aggregate" **[ours]**
        The encoder's aggregate CRS over all its cells (the benchmark-level summary the paper ranks
        by), or its CRS on the ``source`` cell alone.
    n_resamples : int, default 2000 **[ours]**
    level : float, default 0.95
    rng : int or numpy Generator, default 0
    """
    if crs_level not in ("aggregate", "cell"):
        raise ValueError(f"crs_level must be 'aggregate' or 'cell', got {crs_level!r}")
    check_level(level)
    profiles = reliability_profiles(runs, include_transfer=False)
    frame = ReferenceFrame.freeze(profiles, description=f"external validity: robustness without the {target} drop")
    scores = crs_scores(profiles, frame)
    on_source = scores[scores["dataset"] == source].set_index("encoder")
    crs = aggregate_crs(scores)["crs"] if crs_level == "aggregate" else on_source["crs"]
    transfer = select_runs(runs, label_fraction=1.0, dataset=source, condition=target)
    if transfer.empty:
        raise ProfileTableError(f"runs table: no primary run on dataset {source} with condition {target}")
    table = pd.DataFrame({"crs": crs, "source_auroc": on_source["auroc"],
                          "target_auroc": _seed_means(transfer, ["encoder"])["auroc"]}).dropna()
    table.index.name = "encoder"
    x = {name: table[column].to_numpy(float) for name, column in (("rho_crs", "crs"),
                                                                  ("rho_source_auroc", "source_auroc"))}
    y = table["target_auroc"].to_numpy(float)
    everyone = np.arange(len(table))[None, :]
    rho = {name: float(_spearman_replicates(v, y, everyone)[0]) for name, v in x.items()}
    draws = _encoder_draws(as_generator(rng), n_resamples, len(table))
    replicates = pd.DataFrame({name: _spearman_replicates(v, y, draws) for name, v in x.items()})
    replicates["rho_difference"] = replicates["rho_crs"] - replicates["rho_source_auroc"]
    plug_in = pd.Series(rho | {"rho_difference": rho["rho_crs"] - rho["rho_source_auroc"]})
    return ExternalValidity(table=table, rho_crs=rho["rho_crs"], rho_source_auroc=rho["rho_source_auroc"],
                            intervals=interval_table(plug_in, replicates, level), n_resamples=n_resamples,
                            frame=frame)


def leave_one_dataset_out(scores: pd.DataFrame, *, n_resamples: int = 2000, level: float = 0.95,
                          rng=0) -> pd.DataFrame:
    """For each dataset d: the mean CRS over the other datasets vs the AUROC on d **[ours]**.

    The interval of each rho comes from the encoder bootstrap of :func:`external_validity` (the
    encoders with a cell on d drawn with replacement, the cells' CRS and AUROC kept; one draw per
    held-out dataset from one generator).

    Parameters
    ----------
    scores : DataFrame
        The output of :func:`crsrepro.score.crs.crs_scores` (fixed mode: a cell's CRS does not depend on d).
    n_resamples : int, default 2000 **[ours]**
    level : float, default 0.95
    rng : int or numpy Generator, default 0

    Returns
    -------
    DataFrame
        Indexed by ``held_out`` dataset: ``n_encoders`` (those with a cell on d and another cell),
        ``spearman_rho, spearman_rho_ci_low, spearman_rho_ci_high`` and ``spearman_rho_plug_in`` (the
        paper: ISIC 0.550, APTOS 0.709, CheXpert 0.271; :func:`crsrepro.score.stats.bootstrap_interval`;
        NaN with fewer than 3 encoders), ``auroc_champion`` (argmax of AUROC on d), ``crs_champion``
        (argmax of the other-dataset CRS) and ``recovered``.
    """
    check_level(level)
    generator = as_generator(rng)
    rows = []
    for held_out in sorted(scores["dataset"].unique()):
        auroc = scores[scores["dataset"] == held_out].set_index("encoder")["auroc"]
        others = scores[scores["dataset"] != held_out].groupby("encoder")["crs"].mean()
        common = auroc.index.intersection(others.index).sort_values()
        auroc, others = auroc[common], others[common]
        x, y = others.to_numpy(float), auroc.to_numpy(float)
        if len(common) > 2:
            draws = _encoder_draws(generator, n_resamples, len(common))
            plug_in = float(_spearman_replicates(x, y, np.arange(len(common))[None, :])[0])
            estimate, low, high = (float(v) for v in bootstrap_interval(plug_in, _spearman_replicates(x, y, draws),
                                                                        level))
        else:
            plug_in = estimate = low = high = np.nan
        rows.append({"held_out": held_out, "n_encoders": len(common), "spearman_rho": estimate,
                     "spearman_rho_ci_low": low, "spearman_rho_ci_high": high, "spearman_rho_plug_in": plug_in,
                     "auroc_champion": auroc.idxmax(), "crs_champion": others.idxmax(),
                     "recovered": auroc.idxmax() == others.idxmax()})
    return pd.DataFrame(rows).set_index("held_out")


def control_probe_agreement(runs: pd.DataFrame, *, metric: str = "auroc") -> pd.DataFrame:
    """Rank agreement of each control probe (MLP, k-NN) with the linear probe, per dataset.

    Encoders are ranked by ``metric`` on the clean test split at 100 % labels (mean over seeds),
    where the control probes run (DESIGN.md section 7); only encoders present under both probes count.

    Returns
    -------
    DataFrame
        One row per (dataset, probe): ``n_encoders, kendall_tau, spearman_rho, reversed_pairs,
        n_pairs, top3_overlap``.
    """
    rows = select_runs(runs, probe=None, condition=CLEAN, label_fraction=1.0)
    means = _seed_means(rows, ["dataset", "encoder", "probe"], [metric])[metric]
    out = []
    for dataset, per_dataset in means.groupby(level="dataset"):
        table = per_dataset.droplevel("dataset").unstack("probe")  # encoder x probe
        for probe in [p for p in table.columns if p != LINEAR and LINEAR in table.columns]:
            both = table[[LINEAR, probe]].dropna()
            if len(both) < 2:
                continue
            r = rank_agreement(both[LINEAR].to_dict(), both[probe].to_dict())
            out.append({"dataset": dataset, "probe": probe, "n_encoders": len(both), "kendall_tau": r.kendall_tau,
                        "spearman_rho": r.spearman_rho, "reversed_pairs": r.reversed_pairs, "n_pairs": r.n_pairs,
                        "top3_overlap": r.top3_overlap})
    return pd.DataFrame(out)


VAL_CV_ECE = "val_cv_ece"
"""The grid's metric for choosing a recalibrator inside val: the cross-validated ECE within the
val/calibration split, per recalibrator and for ``none``, on the full-label linear probe's clean rows."""
BEST_IN_VAL = "best_in_val"
"""The summary row of the recalibrator chosen per cell by :data:`VAL_CV_ECE` (never by test ECE)."""
PAPER_SIX_TESTS: tuple[tuple[str, str], ...] | None = None
"""The paper's "six main tests" of recalibration as (encoder, dataset) cells: not named by the paper,
so None. Until they are known, no recalibration summary is comparable with the paper's 54-77 % and
0.067 [0.024; 0.110]."""


@dataclass(frozen=True)
class RecalibrationSummary:
    """ECE before and after post-hoc recalibration (DESIGN.md section 8), three ways.

    Attributes
    ----------
    cells : DataFrame
        One row per (encoder, dataset, recalibrator), every cell: ``ece_before, ece_after,
        absolute_drop, relative_reduction, auroc_change``.
    best_in_val : DataFrame
        One row per cell with a :data:`VAL_CV_ECE` for some method: the method with the lowest
        seed-mean ``val_cv_ece`` (``recalibrator``, possibly ``none``; ties go to the first name in
        alphabetical order), its ``val_cv_ece`` and the columns of ``cells`` for that method (a change
        of 0 when ``none`` wins). Empty when the runs have no ``val_cv_ece``: nothing is ever chosen on test.
    summary : DataFrame
        Over every cell, by recalibrator plus the row :data:`BEST_IN_VAL` (all NaN, ``n_cells`` 0,
        without ``val_cv_ece``): ``n_cells``, ``relative_reduction_min/max`` (the paper: 54-77 %),
        ``mean_absolute_drop`` with its t-interval ``ci_low, ci_high`` over cells (the paper: 0.067
        [0.024; 0.110]) and ``mean_auroc_change`` (the paper: about +0.001).
    declared : DataFrame
        The same layout over the declared cells only (the ``cells`` argument); empty when none were declared.
    declared_cells : tuple of (encoder, dataset)
    comparable_to_paper : bool
        Whether the declared cells are the paper's six main tests (:data:`PAPER_SIX_TESTS`); False
        while the six are unknown, and the paper's recalibration numbers are then not comparable.
    notes : tuple of str
        What the reader must know: cells left out, a missing ``val_cv_ece``, the comparability.
    """

    cells: pd.DataFrame
    best_in_val: pd.DataFrame
    summary: pd.DataFrame
    declared: pd.DataFrame
    declared_cells: tuple
    comparable_to_paper: bool
    notes: tuple


_SUMMARY_COLUMNS = ("n_cells", "relative_reduction_min", "relative_reduction_max", "mean_absolute_drop", "ci_low",
                    "ci_high", "mean_auroc_change")


def _summarise_drops(table: pd.DataFrame, level: float) -> pd.Series:
    """n_cells, the relative-reduction range, the mean absolute drop with its t-interval, the AUROC change."""
    drop = table["absolute_drop"].to_numpy(float)
    half = (sps.t.ppf((1 + level) / 2, len(drop) - 1) * drop.std(ddof=1) / np.sqrt(len(drop))
            if len(drop) > 1 else np.nan)
    mean = drop.mean() if len(drop) else np.nan
    values = (len(drop), table["relative_reduction"].min(), table["relative_reduction"].max(), mean, mean - half,
              mean + half, table["auroc_change"].mean())
    return pd.Series(dict(zip(_SUMMARY_COLUMNS, values)))


def _summary_by_method(table: pd.DataFrame, best: pd.DataFrame, level: float) -> pd.DataFrame:
    parts = {r: _summarise_drops(g, level) for r, g in table.groupby("recalibrator")}
    parts[BEST_IN_VAL] = _summarise_drops(best, level)
    summary = pd.DataFrame(parts).T.astype({"n_cells": int})
    summary.index.name = "recalibrator"
    return summary


def recalibration_summary(runs: pd.DataFrame, *, cells: list[tuple[str, str]] | None = None,
                          level: float = 0.95) -> RecalibrationSummary:
    """How much recalibration reduces ECE, per cell and overall (clean test split, 100 % labels).

    Three summaries (DESIGN.md section 15, selection on val only): each recalibrator over every cell; the recalibrator chosen per cell
    inside val (the lowest seed-mean :data:`VAL_CV_ECE`, never the test ECE), over every cell; and
    both again over a declared selection of cells, a sensitivity check for the paper's unnamed "six
    main tests".

    Parameters
    ----------
    runs : DataFrame
        A runs table with ``recalibrator`` rows ``none`` and at least one other; a ``val_cv_ece``
        column enables the best-in-val choice.
    cells : list of (encoder, dataset), optional **[ours]**
        The declared selection summarised in ``declared``. The paper reports "six main tests"
        without naming them; the default None declares none.
    level : float, default 0.95
        Level of the t-interval of the mean absolute drop over cells **[ours: a t-interval]**.
    """
    check_level(level)
    rows = select_runs(runs, recalibrator=None, condition=CLEAN, label_fraction=1.0)
    has_val = VAL_CV_ECE in rows.columns and rows[VAL_CV_ECE].notna().any()
    means = _seed_means(rows, ["encoder", "dataset", "recalibrator"],
                        ["auroc", "ece"] + ([VAL_CV_ECE] if has_val else [])).reset_index()
    before = means[means["recalibrator"] == NO_RECALIBRATION].set_index(["encoder", "dataset"])
    after = means[means["recalibrator"] != NO_RECALIBRATION].join(before[["ece", "auroc"]].add_suffix("_before"),
                                                        on=["encoder", "dataset"])
    notes = []
    orphans = after["ece_before"].isna()
    if orphans.any():
        notes.append(f"{int(orphans.sum())} recalibrated (cell, method) rows have no uncalibrated run and are "
                     f"left out")
        logger.info("recalibration summary: %s", notes[-1])
    after = after[~orphans]
    table = pd.DataFrame({"encoder": after["encoder"], "dataset": after["dataset"],
                          "recalibrator": after["recalibrator"], "ece_before": after["ece_before"],
                          "ece_after": after["ece"], "absolute_drop": after["ece_before"] - after["ece"],
                          "relative_reduction": (after["ece_before"] - after["ece"]) / after["ece_before"],
                          "auroc_change": after["auroc"] - after["auroc_before"]}).reset_index(drop=True)
    best_columns = ["encoder", "dataset", "recalibrator", VAL_CV_ECE, *table.columns[3:]]
    if has_val:
        candidates = means.dropna(subset=[VAL_CV_ECE]).sort_values(["encoder", "dataset", "recalibrator"])
        chosen = candidates.loc[candidates.groupby(["encoder", "dataset"])[VAL_CV_ECE].idxmin()]
        stay = before.reset_index()[["encoder", "dataset", "ece"]].assign(
            recalibrator=NO_RECALIBRATION, ece_before=lambda t: t["ece"], ece_after=lambda t: t["ece"], absolute_drop=0.0,
            relative_reduction=0.0, auroc_change=0.0).drop(columns="ece")
        outcomes = pd.concat([table, stay], ignore_index=True)
        best = chosen[["encoder", "dataset", "recalibrator", VAL_CV_ECE]].merge(
            outcomes, on=["encoder", "dataset", "recalibrator"], how="inner")[best_columns].reset_index(drop=True)
        n_cells = before.index.nunique()
        if len(best) < n_cells:
            notes.append(f"{n_cells - len(best)} of {n_cells} cells have no {VAL_CV_ECE} for any method and no "
                         f"best-in-val choice")
            logger.info("recalibration summary: %s", notes[-1])
    else:
        best = pd.DataFrame(columns=best_columns)
        notes.append(f"the runs have no {VAL_CV_ECE} (cross-validated ECE inside val), so no recalibrator is "
                     f"chosen per cell: the {BEST_IN_VAL} summary is empty (never chosen on test ECE)")
    declared_cells = tuple(tuple(c) for c in cells) if cells is not None else ()
    in_declared = lambda t: pd.MultiIndex.from_frame(t[["encoder", "dataset"]]).isin(declared_cells)  # noqa: E731
    declared = (_summary_by_method(table[in_declared(table)], best[in_declared(best)], level) if declared_cells
                else pd.DataFrame(columns=list(_SUMMARY_COLUMNS)))
    comparable = PAPER_SIX_TESTS is not None and set(declared_cells) == set(PAPER_SIX_TESTS)
    if not comparable:
        notes.append("the paper's six main tests of recalibration are not named, so no summary here is comparable "
                     "with its 54-77 % and 0.067 [0.024; 0.110]")
    return RecalibrationSummary(cells=table, best_in_val=best, summary=_summary_by_method(table, best, level),
                                declared=declared, declared_cells=declared_cells, comparable_to_paper=comparable,
                                notes=tuple(notes))


@dataclass(frozen=True)
class DegradationResult:
    """Calibration under image degradation (DESIGN.md section 10).

    Attributes
    ----------
    cells : DataFrame
        By (encoder, dataset): ``ece_clean``, ``mean_ece_rise`` and ``peak_ece_rise`` (the mean and
        the max over perturbation@severity of ECE - clean ECE; the paper: LLaVA-Med on APTOS +0.128
        and 0.418), ``mean_auroc_drop`` and ``peak_auroc_drop`` (clean AUROC - AUROC, likewise).
    pearson_r, p_value : float
        Pearson r over cells between the discrimination loss (``mean_auroc_drop``) and the
        calibration loss (``mean_ece_rise``) (the paper: r = 0.63 over 43 cells).
    """

    cells: pd.DataFrame
    pearson_r: float
    p_value: float


def calibration_under_degradation(runs: pd.DataFrame) -> DegradationResult:
    """Per-cell ECE rise and AUROC drop under the perturbations, and their correlation over cells.

    Every value is first averaged over seeds per (cell, condition) at 100 % labels; the transfer
    condition is not a perturbation and is left out.
    """
    rows = select_runs(runs, label_fraction=1.0)
    means = _seed_means(rows, ["encoder", "dataset", "condition"]).reset_index()
    clean = means[means["condition"] == CLEAN].set_index(["encoder", "dataset"])
    perturbed = means[means["condition"].map(is_perturbation)].join(clean[["auroc", "ece"]].add_suffix("_clean"),
                                                                     on=["encoder", "dataset"])
    perturbed = perturbed.assign(ece_rise=perturbed["ece"] - perturbed["ece_clean"],
                                 auroc_drop=perturbed["auroc_clean"] - perturbed["auroc"])
    grouped = perturbed.groupby(["encoder", "dataset"])
    cells = pd.DataFrame({"ece_clean": grouped["ece_clean"].first(), "mean_ece_rise": grouped["ece_rise"].mean(),
                          "peak_ece_rise": grouped["ece_rise"].max(), "mean_auroc_drop": grouped["auroc_drop"].mean(),
                          "peak_auroc_drop": grouped["auroc_drop"].max()}).dropna()
    if len(cells) < 3:
        raise ProfileTableError(f"runs table: {len(cells)} cells with clean and perturbed runs; a correlation "
                                f"needs at least 3")
    r = sps.pearsonr(cells["mean_auroc_drop"], cells["mean_ece_rise"])
    return DegradationResult(cells=cells, pearson_r=float(r.statistic), p_value=float(r.pvalue))


def absolute_label_efficiency(runs: pd.DataFrame, *, fraction: float = 0.01,
                              reference_encoder: str = "general.vit_b16") -> pd.DataFrame:
    """AUROC at a small label fraction per cell, against a reference encoder's full-label AUROC.

    Parameters
    ----------
    fraction : float, default 0.01
        The label fraction (the paper: 1 %).
    reference_encoder : str, default "general.vit_b16"
        Whose full-label AUROC is the bar per dataset (the paper: ViT-B/16). The demo panel has no
        ViT-B/16, so its notebook names one of its own encoders.

    Returns
    -------
    DataFrame
        By (encoder, dataset): ``auroc_at_fraction``, ``auroc_full``, ``reference_full_auroc`` (NaN on a
        dataset without the reference encoder) and ``reaches_reference`` (AUROC at ``fraction`` >= the
        bar; False where there is no bar).
    """
    rows = select_runs(runs, condition=CLEAN)
    if reference_encoder not in set(rows["encoder"]):
        raise ValueError(f"reference_encoder {reference_encoder!r} has no runs (encoders: "
                         f"{', '.join(sorted(rows['encoder'].unique()))})")
    means = _seed_means(rows, ["encoder", "dataset", "label_fraction"], ["auroc"])["auroc"].unstack("label_fraction")
    if fraction not in means.columns or 1.0 not in means.columns:
        raise ValueError(f"label fractions {fraction} and 1.0 must both have runs (have {list(means.columns)})")
    table = pd.DataFrame({"auroc_at_fraction": means[fraction], "auroc_full": means[1.0]})
    bar = table.xs(reference_encoder, level="encoder")["auroc_full"]
    table["reference_full_auroc"] = table.index.get_level_values("dataset").map(bar).astype(float)
    table["reaches_reference"] = table["auroc_at_fraction"] >= table["reference_full_auroc"]
    return table


@dataclass(frozen=True)
class WelchResult:
    """Welch's t-test of the transfer AUROC, medical-pretrained vs general encoders.

    Attributes
    ----------
    table : DataFrame
        By encoder: ``family``, ``group`` (medical / general) and ``target_auroc``.
    mean_medical, mean_general : float
        The group means (the paper: 0.717 and 0.540).
    statistic, p_value : float
        Welch's t and its two-sided p (the paper: p = 0.0029).
    n_medical, n_general : int
    """

    table: pd.DataFrame
    mean_medical: float
    mean_general: float
    statistic: float
    p_value: float
    n_medical: int
    n_general: int


def welch_transfer_test(runs: pd.DataFrame, *, source: str = "chexpert", target: str = "mimic_cxr",
                        medical_families: tuple[str, ...] = MEDICAL_FAMILIES,
                        general_families: tuple[str, ...] = ("general",)) -> WelchResult:
    """Welch's t-test on the transfer AUROC (probe trained on ``source``, scored on ``target``).

    The groups come from the runs table's ``family`` column (the registry's ``spec.family``): the
    paper's "medical-pretrained" is medical + specialist (9 encoders) against general (6).
    """
    if "family" not in runs.columns:
        raise ProfileTableError("runs table: missing column family (welch_transfer_test groups encoders by family)")
    transfer = select_runs(runs, label_fraction=1.0, dataset=source, condition=target)
    auroc = _seed_means(transfer, ["encoder"], ["auroc"])["auroc"]
    family = transfer.groupby("encoder")["family"].first()
    group = family.map(lambda f: "medical" if f in medical_families else "general" if f in general_families else None)
    table = pd.DataFrame({"family": family, "group": group, "target_auroc": auroc}).dropna(subset=["group"])
    medical = table.loc[table["group"] == "medical", "target_auroc"]
    general = table.loc[table["group"] == "general", "target_auroc"]
    if len(medical) < 2 or len(general) < 2:
        raise ProfileTableError(f"runs table: Welch's test needs 2 encoders per group on {target}, "
                                f"has {len(medical)} medical and {len(general)} general")
    t = sps.ttest_ind(medical, general, equal_var=False)
    return WelchResult(table=table, mean_medical=float(medical.mean()), mean_general=float(general.mean()),
                       statistic=float(t.statistic), p_value=float(t.pvalue), n_medical=len(medical),
                       n_general=len(general))


@dataclass(frozen=True)
class AulcVsRetention:
    """Which label-efficiency measure merely copies full-label AUROC (DESIGN.md section 10).

    Attributes
    ----------
    cells : DataFrame
        By (encoder, dataset): ``auroc_full``, ``aulc`` and ``retention`` (each the mean over seeds).
    correlations : DataFrame
        Spearman rho with ``auroc_full``, index ``aulc`` / ``retention``, columns ``encoder`` (means
        over each encoder's cells) and ``cell`` (the paper: AULC 0.986 / 0.977, retention 0.339 / -0.342).
    """

    cells: pd.DataFrame
    correlations: pd.DataFrame


def aulc_vs_retention(runs: pd.DataFrame) -> AulcVsRetention:
    """Spearman of AULC and of retention with full-label AUROC, at encoder and at cell level."""
    rows = select_runs(runs, condition=CLEAN)
    curves = rows.groupby(["encoder", "dataset", "seed"]).apply(
        lambda c: aulc(c.set_index("label_fraction")["auroc"].astype(float).to_dict()), include_groups=False)
    profiles = cell_means(reliability_profiles(runs)).set_index(["encoder", "dataset"])
    cells = pd.DataFrame({"auroc_full": profiles["auroc"], "aulc": curves.groupby(["encoder", "dataset"]).mean(),
                          "retention": profiles["retention"]})
    by_encoder = cells.groupby("encoder").mean()
    correlations = pd.DataFrame({level: {m: float(sps.spearmanr(t[m], t["auroc_full"]).statistic)
                                         for m in ("aulc", "retention")}
                                 for level, t in (("encoder", by_encoder), ("cell", cells))})
    return AulcVsRetention(cells=cells, correlations=correlations)


def probe_conclusions(runs: pd.DataFrame, *, probes=(LINEAR, "mlp", "knn")) -> pd.DataFrame:
    """Do the paper's conclusions depend on the classifier? (DESIGN.md section 7.)

    For each probe with a complete grid in ``runs``, the four-dimensional reliability profiles, the CRS
    against a frame frozen from that probe's own panel [ours: reference-relative within the same probe,
    as the linear probe's CRS is], and the agreement of its AUROC and CRS rankings; plus how its CRS
    ranking agrees with the linear probe's. A probe without a complete grid is left out (logged).

    Returns
    -------
    DataFrame
        One row per probe: ``n_encoders``, ``auroc_crs_kendall_tau``, ``auroc_crs_reversed_pairs``,
        ``n_pairs``, ``auroc_leader``, ``crs_leader``, ``crs_vs_linear_kendall_tau``.
    """
    aggregates, rows = {}, []
    for probe in probes:
        try:
            profiles = reliability_profiles(runs, probe=probe)
        except ProfileTableError as exc:
            logger.info("probe_conclusions: %s has no complete grid (%s)", probe, exc)
            continue
        aggregate = aggregate_crs(crs_scores(profiles, ReferenceFrame.freeze(profiles)))
        aggregates[probe] = aggregate
        agreement = rank_agreement(aggregate["auroc"].to_dict(), aggregate["crs"].to_dict())
        rows.append({"probe": probe, "n_encoders": len(aggregate), "auroc_crs_kendall_tau": agreement.kendall_tau,
                     "auroc_crs_reversed_pairs": agreement.reversed_pairs, "n_pairs": agreement.n_pairs,
                     "auroc_leader": aggregate["auroc"].idxmax(), "crs_leader": aggregate["crs"].idxmax()})
    table = pd.DataFrame(rows).set_index("probe")
    if LINEAR in aggregates:
        table["crs_vs_linear_kendall_tau"] = [
            rank_agreement(aggregates[LINEAR]["crs"].to_dict(), aggregates[p]["crs"].to_dict()).kendall_tau
            for p in table.index]
    return table


def seed_count_coverage(per_seed_profiles: pd.DataFrame, frame: ReferenceFrame, *, n_seeds: int = 5,
                        n_subsets: int = 40, n_resamples: int = 1000, level: float = 0.95, rng=0,
                        cases=None) -> pd.DataFrame:
    """How much a bootstrap over ``n_seeds`` seeds under-covers (DESIGN.md section 10), from a run with many.

    From a run with S > ``n_seeds`` seeds (the ``demo-seeds20`` profile has 20), ``n_subsets`` random
    subsets of ``n_seeds`` seeds are drawn; on each, the bootstrap gives the ``level`` interval
    (:func:`crsrepro.score.stats.bootstrap_interval`) of every paired aggregate-CRS difference, and we
    ask whether it contains the difference estimated from all S seeds (the best estimate this run has
    of the truth *on its test set*). The share that does is the empirical coverage of an
    ``n_seeds``-seed interval; the nominal is ``level``.

    - Without ``cases``: the paper's seed-paired bootstrap (:func:`crsrepro.score.stats.seed_paired_bootstrap`).
      A bootstrap over 5 units sees at most 126 distinct resamples, so it is expected to be too narrow.
    - With ``cases`` (``{dataset: DatasetCases}`` of all S seeds): the two-level bootstrap over seeds and
      test cases (:func:`crsrepro.score.stats.crs_bootstrap`). It also covers test-set noise, which the
      all-seed target leaves out (the same test set), so against this target it should over-cover.

    Returns
    -------
    DataFrame
        One row per pair (a, b): ``estimate_all_seeds``, ``coverage``, ``mean_width``; ``attrs`` holds
        the overall ``coverage``, ``level``, ``n_seeds``, ``n_all_seeds``, ``n_subsets``, ``n_resamples``
        and ``bootstrap`` (``seeds`` or ``seeds x cases``).
    """
    from crsrepro.score.stats import crs_bootstrap

    seeds = np.sort(per_seed_profiles["seed"].unique())
    if len(seeds) <= n_seeds:
        raise ProfileTableError(f"per-seed profiles: {len(seeds)} seeds; the coverage of a {n_seeds}-seed bootstrap "
                                f"needs a run with more (e.g. the demo-seeds20 profile)")
    generator = as_generator(rng)
    full = aggregate_crs(crs_scores(per_seed_profiles, frame))["crs"]
    encoders = sorted(full.index)
    pairs = [(a, b) for i, a in enumerate(encoders) for b in encoders[i + 1:]]
    hits = np.zeros(len(pairs))
    widths = np.zeros(len(pairs))
    for _ in range(n_subsets):
        chosen = np.sort(generator.choice(len(seeds), size=n_seeds, replace=False))
        subset = per_seed_profiles[per_seed_profiles["seed"].isin(seeds[chosen])]
        if cases is None:
            boot = seed_paired_bootstrap(subset, frame, n_resamples=n_resamples, rng=generator)
        else:
            boot = crs_bootstrap({d: c.take_seeds(chosen) for d, c in cases.items()}, subset, frame,
                                 n_resamples=n_resamples, rng=generator)
        for k, (a, b) in enumerate(pairs):
            ci = boot.paired_diff_ci(a, b, level)
            hits[k] += ci.ci_low <= full[a] - full[b] <= ci.ci_high
            widths[k] += ci.ci_high - ci.ci_low
    table = pd.DataFrame({"a": [a for a, _ in pairs], "b": [b for _, b in pairs],
                          "estimate_all_seeds": [full[a] - full[b] for a, b in pairs],
                          "coverage": hits / n_subsets, "mean_width": widths / n_subsets})
    table.attrs = {"coverage": float(hits.sum() / (n_subsets * len(pairs))), "level": level, "n_seeds": n_seeds,
                   "n_all_seeds": len(seeds), "n_subsets": n_subsets, "n_resamples": n_resamples,
                   "bootstrap": "seeds" if cases is None else "seeds x cases"}
    return table
