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

Choices **[ours]**: a class or label without a positive or a negative in a seed's val split gets no
threshold (counted in the log); a test set without positives (negatives) has a NaN sensitivity
(specificity).
"""

from __future__ import annotations

import logging

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
"""The columns of an operating-point table (``condition`` is ``val`` for the split the threshold was chosen on)."""
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


def _column(labels: np.ndarray, probs: np.ndarray, j: int, k: int, task: str) -> tuple[np.ndarray, np.ndarray]:
    """Class (one-vs-rest) or label ``k``, held in column ``j`` of a set's probabilities (and labels,
    multi-label): y as bool and the scores, masked (NaN) cases left out."""
    score = np.asarray(probs, float)[:, j]
    if task == "multiclass":
        return np.asarray(labels) == k, score
    seen = ~np.isnan(labels[:, j])
    return labels[seen, j] == 1, score[seen]


def operating_points(val: tuple, tests: dict, *, task: str, label_names, columns: dict | None = None) -> pd.DataFrame:
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

    Returns
    -------
    DataFrame
        The :data:`COLUMNS` without ``encoder, family, dataset, seed``; the chosen rows of ``condition="val"`` too.
    """
    y_val, p_val = val
    sets = {VAL: val, **tests}
    rows, n_skipped = [], 0
    for k, name in enumerate(label_names):
        y, score = _column(y_val, p_val, k, k, task)
        if y.all() or not y.any():
            n_skipped += 1
            continue
        for point, (fixed, target) in OPERATING_POINTS.items():
            threshold = choose_threshold(y, score, fixed=fixed, target=target)
            for condition, (labels, probs) in sets.items():
                index = list((columns or {}).get(condition, range(len(label_names))))
                if k not in index:  # a transfer set that does not score this label
                    continue
                y_set, s_set = _column(labels, probs, index.index(k), k, task)
                sens, spec = achieved(y_set, s_set, threshold)
                rows.append({"label": name, "operating_point": point, "condition": condition,
                             "threshold": threshold, "sensitivity": sens, "specificity": spec,
                             "n_positive": int(y_set.sum()), "n_negative": int((~y_set).sum())})
    if n_skipped:
        logger.info("operating points: %d of %d classes/labels lack a positive or a negative in val: no threshold",
                    n_skipped, len(label_names))
    return pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("encoder", "family", "dataset", "seed")])


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


def operating_point_table(analysis) -> pd.DataFrame:
    """Every operating point of every cell and seed of a run, on val, each test condition and each transfer set.

    Parameters
    ----------
    analysis : crsrepro.analyse.run_analysis.RunAnalysis

    Returns
    -------
    DataFrame
        :data:`COLUMNS`, one row per encoder, dataset, seed, class or label, operating point and
        condition (``val``, ``clean``, ``<perturbation>@<severity>``, a transfer set).

    Examples
    --------
    >>> table = operating_point_table(RunAnalysis.load("demo"))      # doctest: +SKIP
    >>> severity_summary(table)                                      # doctest: +SKIP
    """
    from crsrepro.data import get_dataset_spec
    from crsrepro.run.results import ResultStore

    store, parts = ResultStore(analysis.profile.output_path), []
    families = analysis.results.groupby("encoder")["family"].first()
    for dataset in analysis.profile.datasets:
        task = get_dataset_spec(dataset).task
        names = None
        for (encoder, seed), key in full_label_rowsets(analysis, dataset).items():
            cases = store.read_cases(key)
            val = (cases[case_key("labels", VAL)], cases[case_key("probs", VAL, NO_RECALIBRATION)])
            if names is None:
                names = _label_names(analysis, dataset, val[1].shape[1])
            tests, columns = {}, {}
            for name, probs in cases.items():
                kind, condition, recalibrator = parse_case_key(name)
                if kind != "probs" or recalibrator != NO_RECALIBRATION or condition == VAL:
                    continue
                tests[condition] = (cases[case_key("labels", condition if is_transfer(condition) else CLEAN)], probs)
                if is_transfer(condition):
                    columns[condition] = _transfer_columns(dataset, condition, names, probs.shape[1])
            part = operating_points(val, tests, task=task, label_names=names, columns=columns)
            parts.append(part.assign(encoder=encoder, family=families[encoder], dataset=dataset, seed=seed))
    return pd.concat(parts, ignore_index=True)[COLUMNS]


def _severity(condition: str) -> tuple[str, float]:
    """(perturbation, severity) of a condition: ``clean`` is severity 0 of every perturbation, a
    transfer set is its own ``perturbation`` with severity NaN, ``val`` is not a test condition."""
    parsed = Condition.parse(condition)
    if parsed.is_perturbation:
        return parsed.perturbation, float(parsed.severity)
    return (condition, 0.0) if parsed.is_clean else (condition, float("nan"))


def severity_summary(table: pd.DataFrame) -> pd.DataFrame:
    """How the achieved values move with severity: per encoder, dataset, operating point and condition,
    the mean over seeds and classes/labels of the achieved sensitivity and specificity and their change
    from the clean test split.

    Returns
    -------
    DataFrame
        ``encoder, dataset, operating_point, condition, perturbation, severity, sensitivity,
        specificity, sensitivity_change, specificity_change``; clean rows have severity 0, transfer rows
        NaN; the val rows are left out.
    """
    test = table[table["condition"] != VAL]
    keys = ["encoder", "dataset", "operating_point", "condition"]
    out = test.groupby(keys, sort=False)[["sensitivity", "specificity"]].mean().reset_index()
    parsed = out["condition"].map(_severity)
    out.insert(4, "perturbation", parsed.str[0])
    out.insert(5, "severity", parsed.str[1])
    clean = out[out["condition"] == CLEAN].set_index(keys[:3])[["sensitivity", "specificity"]]
    base = clean.reindex(pd.MultiIndex.from_frame(out[keys[:3]])).to_numpy()
    out["sensitivity_change"] = out["sensitivity"].to_numpy() - base[:, 0]
    out["specificity_change"] = out["specificity"].to_numpy() - base[:, 1]
    return out.sort_values(keys[:3] + ["perturbation", "severity"], kind="stable").reset_index(drop=True)
