"""From the runs table to the four dimensions: the paper's reliability profiles (DESIGN.md section 8).

A *reliability profile* is the paper's four-dimensional description of one encoder x dataset cell:
``auroc`` (discrimination D), ``ece`` (calibration C, lower is better), ``retention`` (label
efficiency L) and ``robustness`` (R_raw). (The YAML run configuration under ``crsrepro/profiles/``
is a different thing that keeps the word "profile" for the command line.)

This module reads the runs table (one row per run, :data:`crsrepro.core.schema.RUN_COLUMNS`; the
wide view of the results store, :func:`crsrepro.run.results.runs_table`), keeps the paper's primary
runs (:data:`crsrepro.core.schema.PRIMARY`) and builds one reliability profile per cell and seed
(:func:`reliability_profiles`); the depth sweep and LoRA ask it for their layers and regime
(DESIGN.md section 11). The CRS that scores those profiles is :mod:`crsrepro.score.crs`.

A reliability-profiles table is a DataFrame with the columns ``encoder, dataset, auroc, ece,
retention, robustness`` and either one row per cell (averaged over seeds) or one row per seed with a
``seed`` column; :func:`crsrepro.score.crs.cell_means` validates one and averages its seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.core.metrics import label_efficiency_retention, robustness_raw
from crsrepro.core.schema import FINAL, FROZEN, PRIMARY, RUN_COLUMNS, is_perturbation
from crsrepro.core.vocab import CLEAN, LINEAR


class ProfileTableError(CrsreproError, ValueError):
    """A runs or reliability-profiles table lacks a column, holds a non-finite value or repeats a cell."""


def select_runs(runs: pd.DataFrame, **keys) -> pd.DataFrame:
    """The rows of a runs table whose columns equal ``PRIMARY`` updated with ``keys``.

    A key given as None is not filtered on (e.g. ``recalibrator=None`` keeps every recalibrator).

    Examples
    --------
    >>> runs = pd.DataFrame([dict(encoder="e", dataset="d", seed=0, label_fraction=1.0, condition="clean",
    ...                           probe=p, layer="final", regime="frozen", recalibrator="none", auroc=a, ece=0.1)
    ...                      for p, a in [("linear", 0.8), ("knn", 0.7)]])
    >>> select_runs(runs)["auroc"].tolist(), len(select_runs(runs, probe=None))
    ([0.8], 2)
    """
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise ProfileTableError(f"runs table: missing column(s) {', '.join(missing)} (expected {', '.join(RUN_COLUMNS)})")
    wanted = {k: v for k, v in {**PRIMARY, **keys}.items() if v is not None}
    mask = np.ones(len(runs), bool)
    for column, value in wanted.items():
        mask &= (runs[column] == value).to_numpy()
    return runs[mask]


def reliability_profiles(runs: pd.DataFrame, *, include_transfer: bool = True, robustness=robustness_raw,
                         retention=label_efficiency_retention, ece_metric: str = "ece", probe: str = LINEAR,
                         layer: str | None = FINAL,
                         regime: str | None = FROZEN) -> pd.DataFrame:
    """The per-seed reliability profile of every cell, from the primary runs (DESIGN.md section 8).

    Per (encoder, dataset, seed): ``auroc`` and ``ece`` of the clean test split at 100 % labels;
    ``retention`` = :func:`crsrepro.core.metrics.label_efficiency_retention` of the clean AUROC over the
    label fractions; ``robustness`` = :func:`crsrepro.core.metrics.robustness_raw` of the AUROC drops
    ``AUROC_clean - AUROC(p@s)`` at 100 % labels, plus the real drop to each transfer condition
    (CheXpert -> MIMIC-CXR) when ``include_transfer``.

    Parameters
    ----------
    runs : DataFrame
        A runs table (:data:`crsrepro.core.schema.RUN_COLUMNS`); only the rows of
        :data:`crsrepro.core.schema.PRIMARY` (with ``probe``, ``layer`` and ``regime`` as given) are read.
    include_transfer : bool, default True
        Whether the transfer drop enters robustness (the paper's CRS: True; the external-validity
        check removes it).
    robustness : callable, default :func:`crsrepro.core.metrics.robustness_raw`
        The aggregate of a cell's AUROC drops (the sensitivity chapter's alternatives, :mod:`crsrepro.analyse.sensitivity`).
    retention : callable, default :func:`crsrepro.core.metrics.label_efficiency_retention`
        Retention from ``{label fraction: clean AUROC}`` (the sensitivity chapter's alternative:
        :func:`crsrepro.core.metrics.chance_corrected_retention`).
    ece_metric : str, default "ece"
        The runs-table column read as the calibration dimension (``classwise_ece`` for the alternative).
    probe : str, default "linear"
        The probe whose runs are read (the primary linear probe, or a control: ``mlp``, ``knn``).
    layer : str or None, default "final"
        The layer whose runs are read (:data:`crsrepro.core.schema.FINAL`, or a depth sweep's tap);
        None reads every layer, each on its own (DESIGN.md section 11).
    regime : str or None, default "frozen"
        The regime whose runs are read (:data:`crsrepro.core.schema.FROZEN` or ``lora``); None reads
        every regime, each on its own.

    Returns
    -------
    DataFrame
        A per-seed reliability-profiles table: ``encoder, dataset, seed``, then ``layer`` when
        ``layer`` is None and ``regime`` when ``regime`` is None (one profile per layer and regime),
        ``auroc, ece, retention, robustness`` (and ``family`` when the runs have it).

    Raises
    ------
    ProfileTableError
        A run is repeated, or a cell x seed lacks its clean 100 % run, a smaller fraction or a perturbation.
    """
    primary = select_runs(runs, probe=probe, layer=layer, regime=regime)
    swept = [column for column, value in (("layer", layer), ("regime", regime)) if value is None]
    profile_key = ["encoder", "dataset", "seed", *swept]
    key = profile_key[:3] + ["label_fraction", "condition"] + swept
    dup = primary.duplicated(key, keep=False)
    if dup.any():
        row = primary[dup].iloc[0]
        raise ProfileTableError("runs table: the primary run " + ", ".join(f"{k} {row[k]}" for k in key)
                                + " appears more than once")
    if primary.empty:
        wanted = {**PRIMARY, "probe": probe, "layer": layer or "any", "regime": regime or "any"}
        raise ProfileTableError("runs table: no primary runs (" + ", ".join(f"{k} {v}" for k, v in wanted.items())
                                + ")")
    # One pass over numpy arrays, cell by cell in the sorted key order (the multiverse calls this ~50 times)
    grouped = primary.groupby(profile_key, sort=True)
    cells = grouped.size().index.to_frame(index=False)
    code = grouped.ngroup().to_numpy()
    order = np.argsort(code, kind="stable")  # each cell's rows in their table order
    starts = np.searchsorted(code[order], np.arange(len(cells) + 1))
    fraction = primary["label_fraction"].to_numpy(float)[order]
    condition = primary["condition"].to_numpy(object)[order]
    auroc = primary["auroc"].to_numpy(float)[order]
    ece = primary[ece_metric].to_numpy()[order]
    clean = condition == CLEAN
    perturbed = pd.Series(condition).map({c: is_perturbation(c) for c in pd.unique(condition)}).to_numpy(bool)
    transfer = ~clean & ~perturbed  # crsrepro.core.schema.is_transfer: neither clean nor perturbed
    full = fraction == 1.0
    dropped = full & (perturbed | (transfer & include_transfer))
    family = primary["family"].to_numpy(object)[order] if "family" in primary.columns else None
    rows = []
    for n, at in enumerate(cells.to_dict("records")):
        cell = slice(starts[n], starts[n + 1])
        where = "runs table, " + ", ".join(f"{k} {v}" for k, v in at.items())
        on_clean = np.flatnonzero(clean[cell]) + starts[n]
        reference = on_clean[full[on_clean]]
        if reference.size == 0 or on_clean.size < 2:
            raise ProfileTableError(f"{where}: needs the clean run at label_fraction 1.0 and at least one smaller "
                                    f"fraction, has fractions {sorted(fraction[on_clean])}")
        if not (full[cell] & perturbed[cell]).any():
            raise ProfileTableError(f"{where}: no perturbation run (<perturbation>@<severity>) at label_fraction 1.0")
        top = reference[0]
        drops = auroc[top] - auroc[cell][dropped[cell]]
        row = at | {"auroc": auroc[top], "ece": ece[top],
                    "retention": retention(dict(zip(fraction[on_clean].tolist(), auroc[on_clean].tolist()))),
                    "robustness": robustness(drops)}
        if family is not None:
            row["family"] = family[starts[n]]
        rows.append(row)
    return pd.DataFrame(rows)

