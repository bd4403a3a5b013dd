"""Operating points: sensitivity and specificity at thresholds chosen on val (DESIGN.md section 14; beyond the paper).

A deployed classifier is used at a threshold, not through its AUROC. For each cell and seed of the
full-label linear probe, and for each class (one-vs-rest, multi-class) or label (multi-label):

1. a threshold is chosen on the seed's **val split** (``probs|val|none`` of
   :data:`crsrepro.run.results.CASES_LAYOUT`) for each operating point of :data:`OPERATING_POINTS`:
   sensitivity at 90 % and at 95 % specificity (the lowest threshold whose val specificity reaches the
   target: the most sensitive such threshold) and specificity at 90 % sensitivity (the highest
   threshold whose val sensitivity reaches the target);
2. that threshold is applied, unchanged, to the test split under every condition
   (``probs|<condition>|none``: clean, each perturbation and severity) and to each transfer set (a
   threshold chosen at one hospital used at another: CheXpert -> MIMIC-CXR), and the achieved
   sensitivity and specificity are recorded.

A case is called positive when its probability is >= the threshold. The test split never enters the
choice (``tests/test_operating_points.py`` checks it). :func:`operating_point_table` gives the tidy
table, :func:`severity_summary` how the achieved values move with severity, and
:func:`crsrepro.present.plots.deployment.sensitivity_vs_severity` draws it.

**Intervals.** The thresholds stay fixed (chosen on val); the *test cases* are bootstrapped. Each
replicate draws the test split's N cases with replacement, one draw shared by every encoder, seed,
class and perturbed condition of a dataset (the perturbed copies are the same cases, so a change from
clean is paired), and one draw of its own for each transfer set; the achieved sensitivity and
specificity are recomputed on the drawn cases. Every interval is
:func:`crsrepro.score.stats.bootstrap_interval`'s percentile interval centred on the plug-in (the
estimate is the plug-in, repeated as ``plug_in``). The val rows, where the threshold was chosen, get none.

Choices **[ours]**: a class or label without a positive or a negative in a seed's val split gets no
threshold (counted in the log); a test set without positives (negatives) has a NaN sensitivity
(specificity).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.core.schema import FINAL, FROZEN, Condition, case_key, is_transfer, parse_case_key
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION

logger = logging.getLogger(__name__)

OPERATING_POINTS = {"sens@spec90": ("specificity", 0.90), "sens@spec95": ("specificity", 0.95),
                    "spec@sens90": ("sensitivity", 0.90)}
"""Operating point -> (the quantity fixed on val, its target); the other quantity is the one reported."""
COLUMNS = ["encoder", "family", "dataset", "seed", "label", "operating_point", "condition", "threshold", "sensitivity",
           "specificity", "n_positive", "n_negative"]
"""The columns of :func:`operating_points` (``condition`` is ``val`` for the split the threshold was chosen on;
``sensitivity`` and ``specificity`` are the achieved plug-in values)."""
ACHIEVED = ("sensitivity", "specificity")
"""The achieved quantities; each gets ``<name>, <name>_ci_low, <name>_ci_high, <name>_plug_in`` in
:attr:`OperatingPointTable.table` and :func:`severity_summary`."""
TABLE_COLUMNS = [*COLUMNS[:8],
                 *(f"{q}{suffix}" for q in ACHIEVED for suffix in ("", "_ci_low", "_ci_high", "_plug_in")),
                 "n_positive", "n_negative"]
"""The columns of :attr:`OperatingPointTable.table`."""
SUMMARY_KEYS = ["encoder", "dataset", "operating_point", "condition"]
"""The grain of :func:`severity_summary`: its values are means over seeds and classes or labels."""
N_RESAMPLES = 200
"""Test-case replicates of the operating-point intervals **[ours]**."""
VAL = "val"


def choose_threshold(y: np.ndarray, score: np.ndarray, *, fixed: str, target: float) -> float:
    """The threshold on ``score`` that meets ``target`` for the ``fixed`` quantity on (y, score).

    ``fixed="specificity"``: the lowest threshold t with ``mean(score[y == 0] < t) >= target`` (the
    most sensitive one). ``fixed="sensitivity"``: the highest t with ``mean(score[y == 1] >= t) >= target``
    (the most specific one). Candidates are the observed scores (and +inf, which calls no case positive).

    >>> y, s = np.array([0, 0, 0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.6, 0.5, 0.9])
    >>> choose_threshold(y, s, fixed="specificity", target=0.75)
    0.5
    >>> choose_threshold(y, s, fixed="sensitivity", target=0.9)
    0.5
    """
    y, score = np.asarray(y, bool), np.asarray(score, float)
    candidates = np.append(np.unique(score), np.inf)
    if fixed == "specificity":
        negatives = np.sort(score[~y])
        spec = np.searchsorted(negatives, candidates, side="left") / len(negatives)
        return float(candidates[np.argmax(spec >= target - 1e-12)])  # spec rises with t and is 1 at +inf
    if fixed == "sensitivity":
        positives = np.sort(score[y])
        sens = 1 - np.searchsorted(positives, candidates, side="left") / len(positives)
        return float(candidates[np.flatnonzero(sens >= target - 1e-12)[-1]])  # sens is 1 at the lowest score
    raise ValueError(f"fixed must be 'specificity' or 'sensitivity', got {fixed!r}")


def achieved(y: np.ndarray, score: np.ndarray, threshold: float) -> tuple[float, float]:
    """(sensitivity, specificity) of calling ``score >= threshold`` positive; NaN without positives / negatives."""
    y, positive = np.asarray(y, bool), np.asarray(score, float) >= threshold
    sens = float(positive[y].mean()) if y.any() else float("nan")
    spec = float((~positive[~y]).mean()) if (~y).any() else float("nan")
    return sens, spec


def _column(labels: np.ndarray, probs: np.ndarray, j: int, k: int, task: str) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
    """Class (one-vs-rest) or label ``k``, held in column ``j`` of a set's probabilities (and labels,
    multi-label): y as bool and the scores, masked (NaN) cases left out, and which cases were kept."""
    score = np.asarray(probs, float)[:, j]
    if task == "multiclass":
        return np.asarray(labels) == k, score, np.ones(len(score), bool)
    seen = ~np.isnan(labels[:, j])
    return labels[seen, j] == 1, score[seen], seen


def achieved_replicates(y: np.ndarray, score: np.ndarray, threshold: float, weights: np.ndarray) -> np.ndarray:
    """(sensitivity, specificity) of :func:`achieved` on each row of case ``weights`` (B, N): an array (2, B).

    A case drawn c times weighs c; a replicate without a drawn positive (negative) has a NaN sensitivity
    (specificity).
    """
    y, positive = np.asarray(y, bool), np.asarray(score, float) >= threshold
    with np.errstate(divide="ignore", invalid="ignore"):
        sens = (weights @ (y & positive)) / (weights @ y)
        spec = (weights @ (~y & ~positive)) / (weights @ ~y)
    return np.stack([sens, spec])


def operating_points(val: tuple, tests: dict, *, task: str, label_names, columns: dict | None = None,
                     weights: dict | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """Thresholds chosen on ``val`` and applied to every set of ``tests``, for one probe.

    Parameters
    ----------
    val : (labels, probs)
        The val split's labels and (N, K) probabilities: the only data the thresholds see.
    tests : dict
        ``{condition: (labels, probs)}``; a transfer set's probabilities may cover a subset of the K
        columns, given by ``columns``.
    task : {"multiclass", "multilabel"}
    label_names : list of str
        The K class or label names.
    columns : dict, optional
        ``{condition: indices into the K columns}`` for the sets that score fewer columns.
    weights : dict, optional
        ``{condition: (B, N) case weights}``, one bootstrap draw of the set's cases per row (the
        same array for the sets that hold the same cases); without it, no replicates.

    Returns
    -------
    table : DataFrame
        The :data:`COLUMNS` without ``encoder, family, dataset, seed``; the chosen rows of ``condition="val"`` too.
    replicates : array (rows, 2, B)
        The achieved (sensitivity, specificity) of each row on each replicate (:func:`achieved_replicates`);
        NaN on the val rows; B = 0 without ``weights``.
    """
    y_val, p_val = val
    sets = {VAL: val, **tests}
    n_resamples = len(next(iter(weights.values()))) if weights else 0
    rows, replicates, n_skipped = [], [], 0
    for k, name in enumerate(label_names):
        y, score, _ = _column(y_val, p_val, k, k, task)
        if y.all() or not y.any():
            n_skipped += 1
            continue
        for point, (fixed, target) in OPERATING_POINTS.items():
            threshold = choose_threshold(y, score, fixed=fixed, target=target)
            for condition, (labels, probs) in sets.items():
                index = list((columns or {}).get(condition, range(len(label_names))))
                if k not in index:  # a transfer set that does not score this label
                    continue
                y_set, s_set, seen = _column(labels, probs, index.index(k), k, task)
                sens, spec = achieved(y_set, s_set, threshold)
                rows.append({"label": name, "operating_point": point, "condition": condition,
                             "threshold": threshold, "sensitivity": sens, "specificity": spec,
                             "n_positive": int(y_set.sum()), "n_negative": int((~y_set).sum())})
                replicates.append(np.full((2, n_resamples), np.nan) if condition == VAL or not weights else
                                  achieved_replicates(y_set, s_set, threshold, weights[condition][:, seen]))
    if n_skipped:
        logger.info("operating points: %d of %d classes/labels lack a positive or a negative in val: no threshold",
                    n_skipped, len(label_names))
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("encoder", "family", "dataset", "seed")])
    return table, np.stack(replicates) if replicates else np.empty((0, 2, n_resamples))


def full_label_rowsets(analysis, dataset: str) -> pd.Series:
    """The row-set keys of the full-label linear probe on ``dataset``, indexed by (encoder, seed): the
    row-sets whose per-case arrays the grid stores (:data:`crsrepro.run.results.CASES_LAYOUT`)."""
    results = analysis.results
    rows = results[(results["dataset"] == dataset) & (results["probe"] == LINEAR)
                   & (results["label_fraction"] == 1.0) & (results["layer"] == FINAL)
                   & (results["regime"] == FROZEN)]
    if rows.empty:
        raise CrsreproError(f"no full-label linear probe on {dataset} in these results")
    return rows.groupby(["encoder", "seed"])["rowset"].first()


def _label_names(analysis, dataset: str, n_columns: int) -> list[str]:
    """The names of the probe's columns: the dataset's labels, less those the grid left out as
    unlearnable on this run's splits (:func:`crsrepro.run.views.learnable_labels`)."""
    from crsrepro.data import get_dataset_spec, prepare_dataset
    from crsrepro.run.views import learnable_labels

    names = list(get_dataset_spec(dataset).label_names)
    if len(names) != n_columns:
        table = prepare_dataset(analysis.profile, dataset, manifest_dir=analysis.manifest_dir, progress=False)
        names = list(learnable_labels(table, analysis.profile.seeds).attrs["label_names"])
    if len(names) != n_columns:
        raise CrsreproError(f"{dataset}: the stored probabilities have {n_columns} columns, the dataset "
                            f"{len(names)} labels")
    return names


def _transfer_columns(source: str, target: str, names: list[str], n_columns: int) -> list[int]:
    """Where each column of a transfer set's stored probabilities sits among the source's labels, as
    the grid restricted them: every label (CheXpert -> MIMIC-CXR) or a label map's shared labels
    (CheXpert -> NIH ChestX-ray14, :data:`crsrepro.data.label_maps.CHEXPERT_TO_NIH`)."""
    from crsrepro.data.label_maps import CHEXPERT_TO_NIH

    if n_columns == len(names):
        return list(range(n_columns))
    if (source, target) == ("chexpert", "nih_cxr14"):
        return [names.index(k) for k in CHEXPERT_TO_NIH if k in names]
    raise CrsreproError(f"{source} -> {target}: {n_columns} transfer columns and no label map")


@dataclass(frozen=True)
class OperatingPointTable:
    """Every operating point of a run, with its test-case bootstrap (:func:`operating_point_table`).

    Attributes
    ----------
    table : DataFrame
        :data:`TABLE_COLUMNS`, one row per encoder, dataset, seed, class or label, operating point and
        condition (``val``, ``clean``, ``<perturbation>@<severity>``, a transfer set): the threshold, and
        each achieved quantity's estimate, interval and plug-in (:data:`ACHIEVED`; no interval on val).
    replicates : dict
        ``{quantity: DataFrame}`` for each of :data:`ACHIEVED`: indexed by :data:`SUMMARY_KEYS` (test
        conditions only), one column per replicate: the mean over seeds and classes or labels of the
        achieved value on that replicate's drawn cases (what :func:`severity_summary`'s intervals are of).
    n_resamples : int
    level : float
    """

    table: pd.DataFrame
    replicates: dict
    n_resamples: int
    level: float


def _nanmean_rows(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """The mean over the rows of each group of ``values`` (rows, ...), NaN left out (NaN where all are)."""
    finite = np.isfinite(values)
    total = np.zeros((n_groups, *values.shape[1:]))
    count = np.zeros_like(total)
    np.add.at(total, groups, np.where(finite, values, 0.0))
    np.add.at(count, groups, finite)
    with np.errstate(divide="ignore", invalid="ignore"):
        return total / count


def _with_intervals(table: pd.DataFrame, replicates: np.ndarray, level: float) -> pd.DataFrame:
    """``table`` with each achieved quantity as ``estimate, ci_low, ci_high, plug_in`` from its row
    ``replicates`` (rows, 2, B) (:func:`crsrepro.score.stats.bootstrap_interval`); the val rows keep
    the plug-in as estimate and get no interval."""
    from crsrepro.score.stats import bootstrap_interval

    out = table.copy()
    test = (table["condition"] != VAL).to_numpy()
    for i, quantity in enumerate(ACHIEVED):
        plug_in = table[quantity].to_numpy(float)
        estimate, low, high = plug_in.copy(), np.full(len(table), np.nan), np.full(len(table), np.nan)
        scored = test & np.isfinite(plug_in)  # NaN: a test set without positives (negatives) for the class
        if scored.any():
            estimate[scored], low[scored], high[scored] = bootstrap_interval(plug_in[scored],
                                                                             replicates[scored, i].T, level)
        out[quantity], out[f"{quantity}_ci_low"], out[f"{quantity}_ci_high"] = estimate, low, high
        out[f"{quantity}_plug_in"] = plug_in
    return out


def operating_point_table(analysis, *, n_resamples: int = N_RESAMPLES, level: float = 0.95) -> OperatingPointTable:
    """Every operating point of every cell and seed of a run, on val, each test condition and each
    transfer set, with test-case bootstrap intervals (the module's **Intervals**).

    Parameters
    ----------
    analysis : crsrepro.analyse.run_analysis.RunAnalysis
        Its ``rng`` seeds the case draws.
    n_resamples : int, default :data:`N_RESAMPLES` **[ours]**
    level : float, default 0.95

    Returns
    -------
    OperatingPointTable

    Examples
    --------
    >>> points = operating_point_table(RunAnalysis.load("demo"))     # doctest: +SKIP
    >>> severity_summary(points)                                     # doctest: +SKIP

    Chapters 04 and 09 both read it, so it is computed once for both
    (:meth:`~crsrepro.analyse.run_analysis.RunAnalysis.computed_once`).
    """
    from crsrepro.score.stats import check_level

    check_level(level)
    return analysis.computed_once("operating_points", lambda: _operating_point_table(analysis, n_resamples, level),
                                  n_resamples=n_resamples, level=level)


def _operating_point_table(analysis, n_resamples: int, level: float) -> OperatingPointTable:
    """:func:`operating_point_table`, computed."""
    from crsrepro.data import get_dataset_spec
    from crsrepro.run.results import ResultStore
    from crsrepro.score.stats import as_generator, seed_weights

    store, generator, parts = ResultStore(analysis.profile.output_path), as_generator(analysis.rng), []
    replicates = {q: [] for q in ACHIEVED}
    families = analysis.results.groupby("encoder")["family"].first()
    for dataset in analysis.profile.datasets:
        task = get_dataset_spec(dataset).task
        names, draws = None, {}  # draws: one per case set (the test split, each transfer set), shared by all
        rowsets = full_label_rowsets(analysis, dataset)
        for encoder in rowsets.index.get_level_values("encoder").unique():
            block, block_replicates = [], []
            for seed, key in rowsets[encoder].items():
                cases = store.read_cases(key)
                val = (cases[case_key("labels", VAL)], cases[case_key("probs", VAL, NO_RECALIBRATION)])
                if names is None:
                    names = _label_names(analysis, dataset, val[1].shape[1])
                tests, columns, weights = {}, {}, {}
                for name, probs in cases.items():
                    kind, condition, recalibrator = parse_case_key(name)
                    if kind != "probs" or recalibrator != NO_RECALIBRATION or condition == VAL:
                        continue
                    case_set = condition if is_transfer(condition) else CLEAN  # the perturbed copies: the test cases
                    tests[condition] = (cases[case_key("labels", case_set)], probs)
                    if case_set not in draws:
                        draws[case_set] = seed_weights(generator, n_resamples, len(probs))
                    weights[condition] = draws[case_set]
                    if is_transfer(condition):
                        columns[condition] = _transfer_columns(dataset, condition, names, probs.shape[1])
                part, part_replicates = operating_points(val, tests, task=task, label_names=names, columns=columns,
                                                         weights=weights)
                block.append(part.assign(encoder=encoder, family=families[encoder], dataset=dataset, seed=seed))
                block_replicates.append(part_replicates)
            table, reps = pd.concat(block, ignore_index=True), np.concatenate(block_replicates)
            parts.append(_with_intervals(table, reps, level))
            test = (table["condition"] != VAL).to_numpy()
            groups = table[test].groupby(SUMMARY_KEYS, sort=False).ngroup().to_numpy()
            index = pd.MultiIndex.from_frame(table.loc[test, SUMMARY_KEYS].drop_duplicates())
            means = _nanmean_rows(reps[test], groups, len(index))  # (groups, 2, B)
            for i, quantity in enumerate(ACHIEVED):
                replicates[quantity].append(pd.DataFrame(means[:, i], index=index))
    return OperatingPointTable(table=pd.concat(parts, ignore_index=True)[TABLE_COLUMNS],
                               replicates={q: pd.concat(r) for q, r in replicates.items()},
                               n_resamples=n_resamples, level=level)


def _severity(condition: str) -> tuple[str, float]:
    """(perturbation, severity) of a condition: ``clean`` is severity 0 of every perturbation, a
    transfer set is its own ``perturbation`` with severity NaN, ``val`` is not a test condition."""
    parsed = Condition.parse(condition)
    if parsed.is_perturbation:
        return parsed.perturbation, float(parsed.severity)
    return (condition, 0.0) if parsed.is_clean else (condition, float("nan"))


def severity_summary(points: OperatingPointTable) -> pd.DataFrame:
    """How the achieved values move with severity, with intervals: per encoder, dataset, operating point
    and condition, the mean over seeds and classes/labels of the achieved sensitivity and specificity,
    and their change from the clean test split.

    Each mean and each change has ``estimate, ci_low, ci_high, plug_in`` from the test-case replicates
    of ``points`` (:func:`crsrepro.score.stats.bootstrap_interval`); a perturbed condition's change is
    paired with clean (the same drawn cases), a transfer set's is the difference of two independent draws.

    Parameters
    ----------
    points : OperatingPointTable
        :func:`operating_point_table`.

    Returns
    -------
    DataFrame
        ``encoder, dataset, operating_point, condition, perturbation, severity``, then for each
        quantity ``q`` of :data:`ACHIEVED`: ``q, q_ci_low, q_ci_high, q_plug_in, q_change,
        q_change_ci_low, q_change_ci_high, q_change_plug_in``; clean rows have severity 0 (and a change of
        exactly 0), transfer rows NaN; the val rows are left out.
    """
    from crsrepro.score.stats import bootstrap_interval

    test = points.table[points.table["condition"] != VAL]
    keys = SUMMARY_KEYS
    means = test.groupby(keys, sort=False)[[f"{q}_plug_in" for q in ACHIEVED]].mean()
    out = means.index.to_frame(index=False)
    parsed = out["condition"].map(_severity)
    out["perturbation"], out["severity"] = parsed.str[0], parsed.str[1]
    clean_index = pd.MultiIndex.from_frame(out[keys[:3]].assign(condition=CLEAN))
    for quantity in ACHIEVED:
        plug_in = means[f"{quantity}_plug_in"].to_numpy(float)
        reps = points.replicates[quantity].reindex(means.index).to_numpy(float)
        clean_plug_in = means[f"{quantity}_plug_in"].reindex(clean_index).to_numpy(float)
        clean_reps = points.replicates[quantity].reindex(clean_index).to_numpy(float)
        for name, value, value_reps in ((quantity, plug_in, reps),
                                        (f"{quantity}_change", plug_in - clean_plug_in, reps - clean_reps)):
            estimate, low, high = np.full((3, len(value)), np.nan)
            scored = np.isfinite(value)
            if scored.any():
                estimate[scored], low[scored], high[scored] = bootstrap_interval(value[scored],
                                                                                 value_reps[scored].T, points.level)
            out[name], out[f"{name}_ci_low"], out[f"{name}_ci_high"], out[f"{name}_plug_in"] = \
                estimate, low, high, value
    return out.sort_values(keys[:3] + ["perturbation", "severity"], kind="stable").reset_index(drop=True)
