"""Subgroups: the full-label probe's AUROC and ECE per patient subgroup (DESIGN.md section 14; beyond the paper).

The paper reports no subgroup results. This module scores the stored per-case test probabilities of
the full-label linear probe (:data:`crsrepro.run.results.CASES_LAYOUT`) on the test cases of each
subgroup, with no refit:

- :func:`subgroup_metrics` is the computation on arrays: per encoder and subgroup, the seed-mean
  macro AUROC and ECE (the D and C of a reliability profile, restricted to the subgroup), their gap
  to the whole test set, and percentile intervals from :func:`crsrepro.score.stats.two_level_bootstrap`
  restricted to the subgroup's cases (seeds and cases resampled).
- :func:`subgroup_table` runs it on every dataset of a run, joining the test cases (``image_id|clean``)
  to the subgroup columns of the dataset table (:func:`crsrepro.data.prepare_dataset`).
- :func:`worst_subgroup` finds each encoder's worst subgroup and asks whether the CRS ranking changes
  when every cell is scored on its worst subgroup (D and C of that subgroup, L and R unchanged, the
  frozen frame).

The subgroup columns are those the loaders keep (:func:`crsrepro.data.common.subgroup_columns`):
ISIC 2019 has ``sex``, ``age_group`` and ``site`` (anatomic site), CheXpert ``sex``, ``age_group`` and
``view``; APTOS 2019 has no metadata at all, so it has no subgroups; MIMIC-CXR-JPG has only the view
(its demographics are in MIMIC-IV, out of scope). ISIC 2019 has no skin-tone labels, so the subgroup
question that matters most for dermoscopy cannot be asked of it.

Choices **[ours]**: a subgroup is scored only with at least :data:`MIN_CASES` test cases and both
outcomes present (at least two classes for a multi-class task; at least one label with a positive and
a negative for a multi-label task), and the AUROC is macro over the classes or labels the subgroup has
both outcomes of (as :func:`crsrepro.core.metrics.macro_auroc` skips the others); cases whose attribute is
``unknown`` form no subgroup. What is skipped is counted in the log and in ``attrs["skipped"]``. The
AUROC gap compares like with like: the whole test set's AUROC is averaged over the same classes or
labels as the subgroup's (a small subgroup of ISIC 2019 often lacks a rare class), and ``n_classes``
says how many. The interval of a gap is the subgroup's interval minus the whole-test-set estimate (the
whole set is treated as fixed: it is the deployment's reference value).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from crsrepro.data.common import UNKNOWN, age_group_names
from crsrepro.core.errors import CrsreproError
from crsrepro.core.schema import case_key
from crsrepro.core.vocab import CLEAN
from crsrepro.core.metrics import expected_calibration_error, per_class_auroc

logger = logging.getLogger(__name__)

ATTRIBUTES = ("sex", "age_group", "site")
"""The subgroup attributes scored by default (``view`` is another one the chest loaders keep)."""
MIN_CASES = 30
"""The fewest test cases a subgroup needs to be scored **[ours]**."""
COLUMNS = ["encoder", "dataset", "attribute", "subgroup", "n_cases", "n_classes", "auroc", "auroc_ci_low", "auroc_ci_high",
           "ece", "ece_ci_low", "ece_ci_high", "auroc_whole", "ece_whole", "auroc_gap", "auroc_gap_ci_low",
           "auroc_gap_ci_high", "ece_gap", "ece_gap_ci_low", "ece_gap_ci_high"]
"""The columns of a subgroup table: ``n_classes`` classes or labels scored; ``auroc_whole`` the whole
test set's AUROC over those same classes, ``ece_whole`` its ECE; a gap is subgroup minus whole test set
(a negative AUROC gap and a positive ECE gap are worse than the whole)."""


def _scored_columns(labels: np.ndarray, n_columns: int, task: str) -> np.ndarray:
    """Which classes (one-vs-rest) or labels have both outcomes among ``labels``: the ones a macro AUROC
    averages over (:func:`crsrepro.core.metrics.macro_auroc`)."""
    if task == "multiclass":
        present = np.isin(np.arange(n_columns), labels)
        return present if len(np.unique(labels)) >= 2 else np.zeros(n_columns, bool)
    return (np.nansum(labels == 1, axis=0) > 0) & (np.nansum(labels == 0, axis=0) > 0)


def subgroup_metrics(labels: np.ndarray, probs: dict, groups: pd.DataFrame, *, task: str, n_resamples: int = 1000,
                     min_cases: int = MIN_CASES, level: float = 0.95, rng=0, device: str = "cpu") -> pd.DataFrame:
    """AUROC and ECE per encoder and subgroup, with their gap to the whole test set.

    Parameters
    ----------
    labels : array
        The test labels: class ids (N,) or 0/1/NaN (N, L).
    probs : dict
        ``{encoder: array (seeds, N, K)}``, the same cases in the same order as ``labels``.
    groups : DataFrame
        N rows, one column per attribute (e.g. ``sex``), in the order of ``labels``.
    task : {"multiclass", "multilabel"}
    n_resamples : int, default 1000 **[ours]**
        Replicates of :func:`crsrepro.score.stats.two_level_bootstrap` per subgroup.
    min_cases : int, default :data:`MIN_CASES`
    level : float, default 0.95
        The level of the percentile intervals.
    rng : int, default 0
        The seed of every subgroup's bootstrap (the same draw for every encoder: paired).
    device : str, default "cpu"

    Returns
    -------
    DataFrame
        One row per encoder and scored subgroup, the :data:`COLUMNS` without ``dataset``;
        ``attrs["skipped"]`` lists ``(attribute, subgroup, n_cases, reason)`` of the subgroups left out.
    """
    from crsrepro.score.stats import two_level_bootstrap

    if len(groups) != len(labels):
        raise CrsreproError(f"subgroups: {len(groups)} group rows for {len(labels)} test cases")
    encoders = sorted(probs)
    arrays = {e: np.asarray(probs[e], float) for e in encoders}
    n_columns = arrays[encoders[0]].shape[2]
    per_class = {e: np.array([per_class_auroc(labels, p, task=task) for p in arrays[e]]) for e in encoders}
    ece_whole = {e: float(np.mean([expected_calibration_error(labels, p, task=task) for p in arrays[e]]))
                 for e in encoders}
    rows, skipped = [], []
    for attribute in groups.columns:
        values = groups[attribute].astype(str).to_numpy()
        n_unknown = int(np.sum(values == UNKNOWN))
        if n_unknown:
            skipped.append((attribute, UNKNOWN, n_unknown, "unknown"))
        ages = age_group_names()
        for subgroup in sorted(set(values) - {UNKNOWN}, key=lambda v: (ages.index(v) if v in ages else len(ages), v)):
            mask = values == subgroup
            n = int(mask.sum())
            scored = _scored_columns(labels[mask], n_columns, task)
            reason = (f"fewer than {min_cases} cases" if n < min_cases
                      else None if scored.any() else "one outcome only")
            if reason:
                skipped.append((attribute, subgroup, n, reason))
                continue
            boot = two_level_bootstrap(labels[mask], {e: np.asarray(probs[e])[:, mask] for e in encoders}, task=task,
                                       n_resamples=n_resamples, rng=rng, device=device).summary(level)
            for e in encoders:
                b = boot.loc[e]
                auroc_whole = float(np.mean(np.nanmean(per_class[e][:, scored], axis=1)))  # the same classes
                rows.append({"encoder": e, "attribute": attribute, "subgroup": subgroup, "n_cases": n,
                             "n_classes": int(scored.sum()),
                             **{k: float(b[k]) for k in ("auroc", "auroc_ci_low", "auroc_ci_high",
                                                         "ece", "ece_ci_low", "ece_ci_high")},
                             "auroc_whole": auroc_whole, "ece_whole": ece_whole[e],
                             "auroc_gap": b["auroc"] - auroc_whole, "auroc_gap_ci_low": b["auroc_ci_low"] - auroc_whole,
                             "auroc_gap_ci_high": b["auroc_ci_high"] - auroc_whole,
                             "ece_gap": b["ece"] - ece_whole[e], "ece_gap_ci_low": b["ece_ci_low"] - ece_whole[e],
                             "ece_gap_ci_high": b["ece_ci_high"] - ece_whole[e]})
    for attribute, subgroup, n, reason in skipped:
        logger.info("subgroups: %s=%s (%d cases) not scored: %s", attribute, subgroup, n, reason)
    out = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "dataset"])
    out.attrs["skipped"] = skipped
    return out


def case_groups(analysis, dataset: str, attributes) -> pd.DataFrame:
    """The subgroup columns of ``dataset``'s test cases, in the order the grid stored them.

    The stored ``image_id|clean`` of the full-label probe is joined to the dataset table of
    :func:`crsrepro.data.prepare_dataset`; an attribute the table lacks (APTOS has none, CheXpert no
    ``site``) is left out and logged. A stored id absent from the table raises a CrsreproError.
    """
    from crsrepro.data import prepare_dataset
    from crsrepro.analyse.operating_points import full_label_rowsets
    from crsrepro.run.results import ResultStore

    key = full_label_rowsets(analysis, dataset).iloc[0]  # every row-set holds the same test split
    ids = ResultStore(analysis.profile.output_path).read_cases(key)[case_key("image_id", CLEAN)]
    table = prepare_dataset(analysis.profile, dataset, manifest_dir=analysis.manifest_dir, progress=False)
    present = [a for a in attributes if a in table.columns]
    if len(present) < len(attributes):
        logger.info("subgroups: %s has no %s column(s)", dataset, ", ".join(a for a in attributes if a not in present))
    table = table.set_index("image_id")
    missing = [i for i in ids if i not in table.index]
    if missing:
        raise CrsreproError(f"{dataset}: stored test case {missing[0]} is not in the dataset table "
                            f"({len(missing)} of {len(ids)} missing); rerun `crsrepro run`")
    return table.loc[ids, present].reset_index(drop=True)


def subgroup_table(analysis, *, attributes=ATTRIBUTES, n_resamples: int = 1000, min_cases: int = MIN_CASES,
                   level: float = 0.95) -> pd.DataFrame:
    """Per encoder, dataset and subgroup: AUROC and ECE of the full-label probe, gaps and intervals.

    Parameters
    ----------
    analysis : crsrepro.analyse.run_analysis.RunAnalysis
    attributes : tuple of str, default :data:`ATTRIBUTES`
        Subgroup columns of the dataset tables; those a dataset lacks are skipped (logged).
    n_resamples : int, default 1000 **[ours]**
    min_cases : int, default :data:`MIN_CASES`
    level : float, default 0.95

    Returns
    -------
    DataFrame
        :data:`COLUMNS`, one row per encoder, dataset and scored subgroup; ``attrs["skipped"]`` lists
        ``(dataset, attribute, subgroup, n_cases, reason)``.

    Examples
    --------
    >>> analysis = RunAnalysis.load("demo")            # doctest: +SKIP
    >>> subgroup_table(analysis).query("attribute == 'sex'")  # doctest: +SKIP
    """
    from crsrepro.data import get_dataset_spec

    parts, skipped = [], []
    for dataset in analysis.profile.datasets:
        groups = case_groups(analysis, dataset, attributes)
        if groups.columns.empty:
            continue
        labels, probs = analysis.case_probabilities(dataset)
        part = subgroup_metrics(labels, probs, groups, task=get_dataset_spec(dataset).task, n_resamples=n_resamples,
                                min_cases=min_cases, level=level, rng=analysis.rng,
                                device=analysis.profile.probe.device)
        parts.append(part.assign(dataset=dataset))
        skipped += [(dataset, *s) for s in part.attrs["skipped"]]
    out = pd.concat(parts, ignore_index=True)[COLUMNS] if parts else pd.DataFrame(columns=COLUMNS)
    out.attrs["skipped"] = skipped
    logger.info("subgroups: %d subgroups scored, %d skipped", out[["dataset", "attribute", "subgroup"]]
                .drop_duplicates().shape[0], len(skipped))
    return out


@dataclass(frozen=True)
class WorstSubgroups:
    """Each encoder's worst subgroups and the CRS ranking on them (:func:`worst_subgroup`).

    Attributes
    ----------
    cells : DataFrame
        Per (encoder, dataset): the subgroup with the lowest AUROC gap (``attribute, subgroup``) and its
        row of the subgroup table.
    per_encoder : DataFrame
        Indexed by encoder: the largest AUROC drop (``auroc_gap``, most negative, and where:
        ``auroc_dataset, auroc_attribute, auroc_subgroup``) and the largest ECE rise (``ece_gap`` and
        ``ece_dataset, ece_attribute, ece_subgroup``) over all its scored subgroups.
    aggregate : DataFrame
        :func:`crsrepro.score.crs.aggregate_crs` of the cells scored on their worst subgroup.
    agreement : crsrepro.score.stats.RankAgreement
        The whole-test-set CRS ranking (a) vs the worst-subgroup CRS ranking (b).
    n_cells_unchanged : int
        Cells without a scored subgroup, which keep their whole-test-set D and C.
    """

    cells: pd.DataFrame
    per_encoder: pd.DataFrame
    aggregate: pd.DataFrame
    agreement: object
    n_cells_unchanged: int

    @property
    def ranking_changes(self) -> bool:
        """Whether some pair of encoders is ordered the other way on the worst subgroups."""
        return self.agreement.reversed_pairs > 0


def worst_subgroup(analysis, table: pd.DataFrame | None = None, **options) -> WorstSubgroups:
    """Each encoder's worst subgroup, and whether the CRS ranking changes when scored on it.

    For each cell (encoder, dataset), the worst subgroup is the one with the lowest AUROC gap; its D
    (AUROC) and C (ECE) replace the cell's, its L (retention) and R (robustness) are kept, and the
    cells are scored with the frozen frame (:func:`crsrepro.score.crs.crs_scores`). The rankings of the
    aggregate CRS before and after are compared with :func:`crsrepro.score.stats.rank_agreement`.

    Parameters
    ----------
    analysis : crsrepro.analyse.run_analysis.RunAnalysis
    table : DataFrame, optional
        A :func:`subgroup_table` of ``analysis`` (computed with ``**options`` when not given).
    """
    from crsrepro.score.crs import aggregate_crs, crs_scores
    from crsrepro.score.stats import rank_agreement

    table = subgroup_table(analysis, **options) if table is None else table
    if table.empty:
        raise CrsreproError("worst_subgroup: no subgroup was scored (see the log for the ones skipped)")
    cells = table.loc[table.groupby(["encoder", "dataset"])["auroc_gap"].idxmin()].reset_index(drop=True)
    auroc_worst = table.loc[table.groupby("encoder")["auroc_gap"].idxmin()].set_index("encoder")
    ece_worst = table.loc[table.groupby("encoder")["ece_gap"].idxmax()].set_index("encoder")
    per_encoder = pd.concat([auroc_worst[["auroc_gap", "dataset", "attribute", "subgroup"]].add_prefix("auroc_")
                             .rename(columns={"auroc_auroc_gap": "auroc_gap"}),
                             ece_worst[["ece_gap", "dataset", "attribute", "subgroup"]].add_prefix("ece_")
                             .rename(columns={"ece_ece_gap": "ece_gap"})], axis=1)
    profiles = analysis.cell_means.copy()
    worst = cells.set_index(["encoder", "dataset"])[["auroc", "ece"]]
    key = pd.MultiIndex.from_frame(profiles[["encoder", "dataset"]])
    found = key.isin(worst.index)
    profiles.loc[found, ["auroc", "ece"]] = worst.loc[key[found]].to_numpy()
    n_unchanged = int((~found).sum())
    if n_unchanged:
        logger.info("worst_subgroup: %d cells have no scored subgroup and keep their whole-test-set D and C",
                    n_unchanged)
    aggregate = aggregate_crs(crs_scores(profiles, analysis.frame))
    agreement = rank_agreement(analysis.aggregate["crs"].to_dict(), aggregate["crs"].to_dict())
    return WorstSubgroups(cells=cells, per_encoder=per_encoder, aggregate=aggregate, agreement=agreement,
                          n_cells_unchanged=n_unchanged)
