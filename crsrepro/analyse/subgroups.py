"""Subgroups: the full-label probe's AUROC and ECE per patient subgroup (DESIGN.md section 14; beyond the paper).

The paper reports no subgroup results. This module scores the stored per-case test probabilities of
the full-label linear probe (:data:`crsrepro.run.results.CASES_LAYOUT`) on the test cases of each
subgroup, with no refit:

- :func:`subgroup_metrics` is the computation on arrays: per encoder and subgroup, the seed-mean
  macro AUROC and ECE (the D and C of a reliability profile, restricted to the subgroup), their gap
  to the whole test set, intervals, and how often the subgroup is the encoder's worst (``p_worst``).
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
says how many.

**Intervals.** A subgroup is part of the whole test set, so both are resampled together: each
replicate draws the seeds with replacement and the *whole* test set's N cases with replacement (one
draw shared by every encoder, attribute and subgroup of a dataset), and recomputes from that one
resample the whole-set metric and every subgroup's metric (the drawn cases that fall in the subgroup,
each counted as often as it was drawn); the gap is their difference in that replicate. The number of a
subgroup's cases therefore varies between replicates, as it would between test sets. Every interval is
:func:`crsrepro.score.stats.bootstrap_interval`: for the AUROC and its gap the percentile interval
centred on the plug-in (the estimate is the plug-in); for the ECE and its gap the basic interval about
the median-bias-corrected estimate (the ``plug_in`` beside it), which corrects the upward bias of a
binned ECE on resampled cases (:data:`INTERVAL_METHODS`). Because every subgroup of a dataset is
scored on the same replicates, ``p_worst`` says in how many of them a subgroup has its encoder's lowest
AUROC gap on that dataset: the stability of "the worst subgroup", which the minimum of many noisy gaps
overstates (a winner's curse).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from crsrepro.data.common import AGE_BINS, UNKNOWN, age_group_names
from crsrepro.data.demo_world import OLDER_FROM
from crsrepro.core.errors import CrsreproError
from crsrepro.core.schema import case_key
from crsrepro.core.vocab import CLEAN
from crsrepro.core.metrics import expected_calibration_error

logger = logging.getLogger(__name__)

ATTRIBUTES = ("sex", "age_group", "site")
"""The subgroup attributes scored by default (``view`` is another one the chest loaders keep)."""
MIN_CASES = 30
"""The fewest test cases a subgroup needs to be scored **[ours]**."""
METRICS = ("auroc", "ece", "auroc_gap", "ece_gap")
"""The quantities with an interval; each has ``<name>, <name>_ci_low, <name>_ci_high, <name>_plug_in``."""
INTERVAL_METHODS = {"auroc": "percentile", "ece": "basic", "auroc_gap": "percentile", "ece_gap": "basic"}
"""The :func:`crsrepro.score.stats.bootstrap_interval` method of each metric: basic for the ECE, which
resampling inflates; the centred percentile interval otherwise."""
COLUMNS = ["encoder", "dataset", "attribute", "subgroup", "n_cases", "n_classes",
           *(f"{m}{suffix}" for m in METRICS[:2] for suffix in ("", "_ci_low", "_ci_high", "_plug_in")),
           "auroc_whole", "ece_whole",
           *(f"{m}{suffix}" for m in METRICS[2:] for suffix in ("", "_ci_low", "_ci_high", "_plug_in")), "p_worst"]
"""The columns of a subgroup table: ``n_classes`` classes or labels scored; ``auroc_whole`` the whole
test set's AUROC over those same classes, ``ece_whole`` its ECE (plug-ins); a gap is subgroup minus
whole test set (a negative AUROC gap and a positive ECE gap are worse than the whole); ``p_worst`` the
share of replicates in which the subgroup has the lowest AUROC gap of its encoder's subgroups on the
dataset (the module's **Intervals**)."""


def _scored_columns(labels: np.ndarray, n_columns: int, task: str) -> np.ndarray:
    """Which classes (one-vs-rest) or labels have both outcomes among ``labels``: the ones a macro AUROC
    averages over (:func:`crsrepro.core.metrics.macro_auroc`)."""
    if task == "multiclass":
        present = np.isin(np.arange(n_columns), labels)
        return present if len(np.unique(labels)) >= 2 else np.zeros(n_columns, bool)
    return (np.nansum(labels == 1, axis=0) > 0) & (np.nansum(labels == 0, axis=0) > 0)


def subgroup_metrics(labels: np.ndarray, probs: dict, groups: pd.DataFrame, *, task: str, n_resamples: int = 1000,
                     min_cases: int = MIN_CASES, level: float = 0.95, rng=0, device: str = "cpu",
                     n_bins: int = 15) -> pd.DataFrame:
    """AUROC and ECE per encoder and subgroup, with their gap to the whole test set and intervals.

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
        Replicates of the bootstrap of the module's **Intervals** (seeds x whole test set).
    min_cases : int, default :data:`MIN_CASES`
    level : float, default 0.95
    rng : int or numpy Generator, default 0
        Seeds the one draw shared by every encoder and subgroup (paired).
    device : str, default "cpu"
        A torch device for the case-weighted metrics.
    n_bins : int, default 15
        ECE bins (the paper's 15).

    Returns
    -------
    DataFrame
        One row per encoder and scored subgroup, the :data:`COLUMNS` without ``dataset``;
        ``attrs["skipped"]`` lists ``(attribute, subgroup, n_cases, reason)`` of the subgroups left out.
    """
    import torch

    from crsrepro.score.stats import (as_generator, bootstrap_interval, check_level, seed_weights, weighted_ece,
                                      weighted_macro_auroc)

    if len(groups) != len(labels):
        raise CrsreproError(f"subgroups: {len(groups)} group rows for {len(labels)} test cases")
    check_level(level)
    encoders = sorted(probs)
    arrays = {e: np.asarray(probs[e], float) for e in encoders}
    n_seeds, n_cases, n_columns = arrays[encoders[0]].shape
    for e in encoders:
        expected_calibration_error(labels, arrays[e][0], task=task, n_bins=n_bins)  # validates labels and shapes
    subgroups, skipped = [], []  # (attribute, subgroup, mask, scored columns)
    ages = age_group_names()
    for attribute in groups.columns:
        values = groups[attribute].astype(str).to_numpy()
        n_unknown = int(np.sum(values == UNKNOWN))
        if n_unknown:
            skipped.append((attribute, UNKNOWN, n_unknown, "unknown"))
        for subgroup in sorted(set(values) - {UNKNOWN}, key=lambda v: (ages.index(v) if v in ages else len(ages), v)):
            mask = values == subgroup
            n = int(mask.sum())
            scored = _scored_columns(labels[mask], n_columns, task)
            reason = (f"fewer than {min_cases} cases" if n < min_cases
                      else None if scored.any() else "one outcome only")
            if reason:
                skipped.append((attribute, subgroup, n, reason))
            else:
                subgroups.append((attribute, subgroup, mask, scored))
    for attribute, subgroup, n, reason in skipped:
        logger.info("subgroups: %s=%s (%d cases) not scored: %s", attribute, subgroup, n, reason)
    out = pd.DataFrame(columns=[c for c in COLUMNS if c != "dataset"])
    out.attrs["skipped"] = skipped
    if not subgroups:
        return out
    # row 0 weighs every case once (the plug-in), rows 1.. are the replicates: one draw of the seeds and
    # one of the whole test set, shared by every encoder and subgroup
    generator = as_generator(rng)
    seeds = np.vstack([np.full((1, n_seeds), 1 / n_seeds),
                       seed_weights(generator, n_resamples, n_seeds) if n_seeds > 1 else np.ones((n_resamples, 1))])
    cases = np.vstack([np.ones((1, n_cases)), seed_weights(generator, n_resamples, n_cases)])
    dev = torch.device(device)
    y = torch.as_tensor(np.asarray(labels, float), dtype=torch.float64, device=dev)
    y_ece, y_auroc = ((y.long(), torch.nn.functional.one_hot(y.long(), n_columns).double()) if task == "multiclass"
                      else (y, y))
    w_cases = torch.as_tensor(cases, dtype=torch.float64, device=dev)
    masks = torch.as_tensor(np.stack([m for _, _, m, _ in subgroups]), dtype=torch.float64, device=dev)
    values = {m: np.empty((len(encoders), len(subgroups), n_resamples + 1)) for m in ("auroc", "ece", "auroc_whole",
                                                                                      "ece_whole")}
    for j, e in enumerate(encoders):
        per_seed = {m: np.empty((n_seeds, len(subgroups), n_resamples + 1)) for m in values}
        for s in range(n_seeds):
            prob = torch.as_tensor(arrays[e][s], dtype=torch.float64, device=dev)
            ece_whole = weighted_ece(y_ece, prob, w_cases, task=task, n_bins=n_bins).cpu().numpy()
            for g, (_, _, _, scored) in enumerate(subgroups):
                columns = torch.as_tensor(np.flatnonzero(scored), device=dev)
                y_g, p_g, w_g = y_auroc[:, columns], prob[:, columns], w_cases * masks[g]
                per_seed["auroc"][s, g] = weighted_macro_auroc(y_g, p_g, w_g).cpu().numpy()
                per_seed["auroc_whole"][s, g] = weighted_macro_auroc(y_g, p_g, w_cases).cpu().numpy()
                per_seed["ece"][s, g] = weighted_ece(y_ece, prob, w_g, task=task, n_bins=n_bins).cpu().numpy()
                per_seed["ece_whole"][s, g] = ece_whole
        for m in values:  # the mean over the drawn seeds, with their multiplicities (as D and C are seed means)
            values[m][j] = np.einsum("bs,sgb->gb", seeds, per_seed[m])
    values["auroc_gap"] = values["auroc"] - values["auroc_whole"]
    values["ece_gap"] = values["ece"] - values["ece_whole"]
    gaps = np.where(np.isnan(values["auroc_gap"][..., 1:]), np.inf, values["auroc_gap"][..., 1:])
    p_worst = np.zeros((len(encoders), len(subgroups)))  # the share of replicates whose lowest gap is this subgroup
    np.add.at(p_worst, (np.repeat(np.arange(len(encoders)), n_resamples), gaps.argmin(1).ravel()), 1 / n_resamples)
    rows = {"encoder": np.repeat(encoders, len(subgroups)),
            "attribute": [a for a, _, _, _ in subgroups] * len(encoders),
            "subgroup": [g for _, g, _, _ in subgroups] * len(encoders),
            "n_cases": [int(m.sum()) for _, _, m, _ in subgroups] * len(encoders),
            "n_classes": [int(c.sum()) for _, _, _, c in subgroups] * len(encoders),
            "auroc_whole": values["auroc_whole"][..., 0].ravel(), "ece_whole": values["ece_whole"][..., 0].ravel(),
            "p_worst": p_worst.ravel()}
    for m in METRICS:
        plug_in = values[m][..., 0].ravel()
        estimate, low, high = bootstrap_interval(plug_in, values[m][..., 1:].reshape(len(plug_in), -1).T, level,
                                                 method=INTERVAL_METHODS[m], floor=0.0 if m == "ece" else None)
        rows |= {m: estimate, f"{m}_ci_low": low, f"{m}_ci_high": high, f"{m}_plug_in": plug_in}
    out = pd.DataFrame(rows)[[c for c in COLUMNS if c != "dataset"]]
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

    Chapters 02 and 09 both read it, so it is computed once for both
    (:meth:`~crsrepro.analyse.run_analysis.RunAnalysis.computed_once`).
    """
    return analysis.computed_once(
        "subgroups", lambda: _subgroup_table(analysis, attributes, n_resamples, min_cases, level),
        attributes=list(attributes), n_resamples=n_resamples, min_cases=min_cases, level=level)


def _subgroup_table(analysis, attributes, n_resamples, min_cases, level) -> pd.DataFrame:
    """:func:`subgroup_table`, computed."""
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
        row of the subgroup table, whose ``p_worst`` says how often it is the lowest across replicates.
    per_encoder : DataFrame
        Indexed by encoder: the largest AUROC drop (``auroc_gap`` with ``auroc_gap_ci_low,
        auroc_gap_ci_high, auroc_gap_plug_in``, most negative by its plug-in; ``auroc_p_worst``, that
        subgroup's ``p_worst`` on its dataset; and where: ``auroc_dataset, auroc_attribute,
        auroc_subgroup``) and the largest ECE rise (``ece_gap, ece_gap_ci_low, ece_gap_ci_high,
        ece_gap_plug_in`` and ``ece_dataset, ece_attribute, ece_subgroup``) over all its scored subgroups.
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

    For each cell (encoder, dataset), the worst subgroup is the one with the lowest AUROC gap (plug-in;
    its ``p_worst`` says how often it stays the lowest across replicates); its D (AUROC) and C (ECE),
    plug-ins like the cell's, replace the cell's, its L (retention) and R (robustness) are kept, and the
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
    table = table.reset_index(drop=True)  # the worst by plug-in, as p_worst counts the replicates' argmin
    cells = table.loc[table.groupby(["encoder", "dataset"])["auroc_gap_plug_in"].idxmin()].reset_index(drop=True)
    auroc_worst = table.loc[table.groupby("encoder")["auroc_gap_plug_in"].idxmin()].set_index("encoder")
    ece_worst = table.loc[table.groupby("encoder")["ece_gap_plug_in"].idxmax()].set_index("encoder")
    interval = lambda m: [m, f"{m}_ci_low", f"{m}_ci_high", f"{m}_plug_in"]  # noqa: E731
    where = ["dataset", "attribute", "subgroup"]
    per_encoder = pd.concat([auroc_worst[interval("auroc_gap")],
                             auroc_worst[["p_worst", *where]].add_prefix("auroc_"),
                             ece_worst[interval("ece_gap")], ece_worst[where].add_prefix("ece_")], axis=1)
    profiles = analysis.cell_means.copy()
    worst = cells.set_index(["encoder", "dataset"])[["auroc_plug_in", "ece_plug_in"]]  # like the cells' D and C
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


def older_patients_gap(table: pd.DataFrame, *, older_from: int = OLDER_FROM) -> pd.DataFrame:
    """Per dataset with age groups: the mean AUROC gap of the groups aged ``older_from`` or more beside that of
    the younger ones, over encoders (the demo world plants worse images from
    :data:`crsrepro.data.demo_world.OLDER_FROM` on; DESIGN.md section 14). ``older_from`` must be an edge of
    :data:`crsrepro.data.common.AGE_BINS`.

    ``table`` is a :func:`subgroup_table`; ``difference`` is older minus younger (negative: older patients are
    scored worse), and the group columns count the test cases of each side.
    """
    if older_from not in AGE_BINS:
        raise ValueError(f"older_from={older_from} is not an age-group edge {AGE_BINS}")
    older_groups = age_group_names()[AGE_BINS.index(older_from) + 1:]
    ages = table[(table["attribute"] == "age_group") & (table["subgroup"] != UNKNOWN)]
    rows = []
    for dataset, cells in ages.groupby("dataset", sort=False):
        older = cells["subgroup"].isin(older_groups)
        per_group = cells.groupby("subgroup")["n_cases"].first()
        rows.append({"dataset": dataset, "older_auroc_gap": cells.loc[older, "auroc_gap"].mean(),
                     "younger_auroc_gap": cells.loc[~older, "auroc_gap"].mean(),
                     "older_cases": int(per_group[cells.loc[older, "subgroup"].unique()].sum()),
                     "younger_cases": int(per_group[cells.loc[~older, "subgroup"].unique()].sum())})
    out = pd.DataFrame(rows, columns=["dataset", "older_auroc_gap", "younger_auroc_gap", "older_cases", "younger_cases"])
    return out.assign(difference=out["older_auroc_gap"] - out["younger_auroc_gap"]).set_index("dataset")
