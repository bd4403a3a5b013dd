"""The benchmark's metrics as pure array functions (DESIGN.md section 8).

Every function here takes numpy arrays (or a dict of numbers) and returns a float or a small typed
result; nothing is fitted and nothing is stored. Options are keyword-only and bad shapes raise
``ValueError``. Two tasks exist throughout:

``"multiclass"``
    ``y_true`` holds integer class ids, shape ``(N,)``; scores or probabilities have shape ``(N, K)``.
    ISIC 2019 (8 classes) and APTOS 2019 (5 grades) are scored this way.
``"multilabel"``
    ``y_true`` holds 0/1 floats with ``NaN`` for a missing (masked) label, shape ``(N, L)``; scores
    have the same shape. CheXpert and MIMIC-CXR (14 labels) are scored this way.

The four dimensions of the paper are built from these: discrimination from :func:`macro_auroc`,
calibration from :func:`expected_calibration_error`, label efficiency from
:func:`label_efficiency_retention` (and :func:`aulc` beside it) and robustness from
:func:`robustness_raw`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from crsrepro.core.vocab import TASKS

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Input validation (kept apart from the computations)


def _check_task(task):
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def _check_n_bins(n_bins):
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")


def _check_pair(y_true, y_score, task, *, probabilities):
    """Validate ``(y_true, y_score)`` for ``task`` and return them as float/int arrays."""
    _check_task(task)
    y_score = np.asarray(y_score, dtype=float)
    y_true = np.asarray(y_true)
    if y_score.ndim != 2:
        raise ValueError(f"y_score must have shape (N, K), got shape {y_score.shape}")
    if y_true.shape[0] != y_score.shape[0]:
        raise ValueError(f"y_true has {y_true.shape[0]} rows but y_score has {y_score.shape[0]}")
    if y_score.shape[0] == 0:
        raise ValueError("y_true and y_score are empty")
    if not np.all(np.isfinite(y_score)):
        raise ValueError("y_score contains NaN or infinite values")
    if probabilities and (y_score.min() < 0 or y_score.max() > 1):
        raise ValueError("y_prob must hold probabilities in [0, 1]")
    if task == "multiclass":
        if y_true.ndim != 1:
            raise ValueError(f"multiclass y_true must have shape (N,), got shape {y_true.shape}")
        if not np.issubdtype(y_true.dtype, np.integer):
            if not np.all(np.isfinite(y_true.astype(float))) or np.any(y_true != np.round(y_true)):
                raise ValueError("multiclass y_true must hold integer class ids")
            y_true = y_true.astype(int)
        if y_true.min() < 0 or y_true.max() >= y_score.shape[1]:
            raise ValueError(f"multiclass y_true must hold class ids in [0, {y_score.shape[1] - 1}]")
    else:
        if y_true.shape != y_score.shape:
            raise ValueError(f"multilabel y_true has shape {y_true.shape}, y_score has {y_score.shape}")
        y_true = y_true.astype(float)
        observed = y_true[~np.isnan(y_true)]
        if np.any((observed != 0) & (observed != 1)):
            raise ValueError("multilabel y_true must hold 0, 1 or NaN")
    return y_true, y_score


def _columns(y_true, y_score, task):
    """Yield ``(binary targets, scores)`` per class (one-vs-rest) or per label, NaN rows removed."""
    for k in range(y_score.shape[1]):
        if task == "multiclass":
            yield (y_true == k).astype(float), y_score[:, k]
        else:
            seen = ~np.isnan(y_true[:, k])
            yield y_true[seen, k], y_score[seen, k]


# ----------------------------------------------------------------------------------------------
# Discrimination


def binary_auroc(y_true, y_score):
    """Area under the ROC curve of one binary problem, by the rank-sum (Mann-Whitney U) identity.

    Ties get average ranks, so the value equals ``sklearn.metrics.roc_auc_score``.

    Parameters
    ----------
    y_true : array of shape (N,)
        0/1 targets.
    y_score : array of shape (N,)
        Scores; higher means more likely positive.

    Returns
    -------
    float
        The AUROC, or ``nan`` when ``y_true`` holds only one class.

    Examples
    --------
    >>> binary_auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    """
    y_true = np.asarray(y_true, dtype=float)
    y_score = np.asarray(y_score, dtype=float)
    if y_true.ndim != 1 or y_true.shape != y_score.shape:
        raise ValueError(f"y_true and y_score must be 1-d of the same length, got {y_true.shape}, {y_score.shape}")
    n_pos = int(np.sum(y_true == 1))
    n_neg = y_true.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(y_score)
    return float((ranks[y_true == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def per_class_auroc(y_true, y_score, *, task):
    """One-vs-rest AUROC per class (multi-class) or AUROC per label (multi-label).

    Parameters
    ----------
    y_true, y_score : arrays
        See the module docstring for the two tasks' shapes.
    task : {"multiclass", "multilabel"}

    Returns
    -------
    ndarray of shape (K,)
        ``nan`` for a class or label whose (unmasked) targets hold only one class.

    Examples
    --------
    >>> y = np.array([[1, 0], [0, np.nan], [1, 0]])
    >>> per_class_auroc(y, np.array([[0.9, 0.2], [0.1, 0.3], [0.6, 0.1]]), task="multilabel")
    array([ 1., nan])
    """
    y_true, y_score = _check_pair(y_true, y_score, task, probabilities=False)
    return np.array([binary_auroc(t, s) for t, s in _columns(y_true, y_score, task)])


def macro_auroc(y_true, y_score, *, task, return_skipped=False):
    """Macro AUROC, the paper's discrimination dimension D (DESIGN.md section 8).

    Multi-class: the one-vs-rest AUROC of each class, averaged. Multi-label: the AUROC of each label
    over its unmasked (non-NaN) rows, averaged over the labels that have both classes. A class or
    label with only one class present is skipped; the number skipped is logged as a warning and can
    be returned.

    Parameters
    ----------
    y_true : array
        Class ids of shape (N,) (multi-class) or 0/1/NaN of shape (N, L) (multi-label).
    y_score : array of shape (N, K) or (N, L)
        Scores or probabilities.
    task : {"multiclass", "multilabel"}
    return_skipped : bool, default False
        Also return the number of skipped classes/labels.

    Returns
    -------
    float or (float, int)
        The macro AUROC (``nan`` if every class was skipped), and the skipped count if asked.

    Examples
    --------
    >>> y = np.array([0, 1, 2, 2])
    >>> p = np.array([[.8, .1, .1], [.2, .7, .1], [.1, .2, .7], [.3, .3, .4]])
    >>> macro_auroc(y, p, task="multiclass")
    1.0
    >>> macro_auroc(np.array([[1, 0], [0, 0]]), np.array([[.9, .3], [.2, .4]]), task="multilabel",
    ...             return_skipped=True)
    (1.0, 1)
    """
    aurocs = per_class_auroc(y_true, y_score, task=task)
    skipped = int(np.isnan(aurocs).sum())
    if skipped:
        logger.warning("macro_auroc: %d of %d %s have a single class and were skipped",
                       skipped, aurocs.size, "classes" if task == "multiclass" else "labels")
    value = float(np.nanmean(aurocs)) if skipped < aurocs.size else float("nan")
    return (value, skipped) if return_skipped else value


# ----------------------------------------------------------------------------------------------
# Calibration


@dataclass(frozen=True)
class ReliabilityCurve:
    """A binned reliability curve: fixed-length arrays, empty bins kept (count 0, NaN values).

    Attributes
    ----------
    bin_edges : ndarray of shape (n_bins + 1,)
        ``m / n_bins`` for m = 0..n_bins; bin m holds ``edges[m] < conf <= edges[m+1]`` (0 goes to
        the first bin).
    accuracy : ndarray of shape (n_bins,)
        Mean correctness (or observed frequency) per bin, NaN where the bin is empty.
    confidence : ndarray of shape (n_bins,)
        Mean confidence per bin, NaN where the bin is empty.
    counts : ndarray of shape (n_bins,)
        Number of predictions per bin.
    """

    bin_edges: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray
    counts: np.ndarray

    def calibration_error(self) -> float:
        """The count-weighted mean of ``|accuracy - confidence|`` over non-empty bins (the ECE)."""
        filled = self.counts > 0
        gaps = np.abs(self.accuracy[filled] - self.confidence[filled])
        return float(np.sum(self.counts[filled] * gaps) / self.counts.sum())


def _binned(confidence, correct, n_bins):
    """Bin ``confidence`` into ``(m-1)/M < conf <= m/M`` and average both arrays per bin."""
    edges = np.arange(n_bins + 1) / n_bins
    index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
    counts = np.bincount(index, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.bincount(index, weights=correct, minlength=n_bins) / counts
        mean_conf = np.bincount(index, weights=confidence, minlength=n_bins) / counts
    return ReliabilityCurve(edges, accuracy, mean_conf, counts)


def _top_label(y_true, y_prob, task):
    """Top-label (confidence, correctness) pairs: one array per label (multi-label) or one in all."""
    if task == "multiclass":
        return [(y_prob.max(axis=1), (y_prob.argmax(axis=1) == y_true).astype(float))]
    pairs = []
    for targets, p in _columns(y_true, y_prob, task):
        pairs.append((np.maximum(p, 1 - p), ((p > 0.5) == (targets == 1)).astype(float)))
    return pairs


def _mean_calibration_error(pairs, n_bins):
    """The mean binned calibration error over ``(confidence, outcome)`` pairs, empty pairs left out."""
    errors = [_binned(conf, outcome, n_bins).calibration_error() for conf, outcome in pairs if conf.size]
    if not errors:
        raise ValueError("every label of y_true is masked (NaN)")
    return float(np.mean(errors))


def reliability_curve(y_true, y_prob, *, task, n_bins=15):
    """Top-label reliability curve with equal-width bins ``(m-1)/M < conf <= m/M``.

    Multi-class uses the top-label confidence ``max_k p_k`` and correctness ``argmax == y``.
    Multi-label pools every unmasked (row, label) pair, with confidence ``max(p, 1-p)`` and
    correctness ``(p > 0.5) == y`` **[ours: pooling over labels for the plotted curve]**.

    Parameters
    ----------
    y_true, y_prob : arrays
        See the module docstring; ``y_prob`` must lie in [0, 1].
    task : {"multiclass", "multilabel"}
    n_bins : int, default 15
        The number of equal-width bins M (the paper uses 15).

    Returns
    -------
    ReliabilityCurve
        Fixed-length arrays; empty bins have count 0 and NaN accuracy and confidence.

    Examples
    --------
    Confidence 0.8 goes to the bin (0.6, 0.8]; 0.9 and 0.85 share the last bin, where one is right:

    >>> curve = reliability_curve([0, 1, 1], np.array([[.9, .1], [.2, .8], [.85, .15]]),
    ...                           task="multiclass", n_bins=5)
    >>> curve.counts.tolist(), curve.accuracy.tolist()
    ([0, 0, 0, 1, 2], [nan, nan, nan, 1.0, 0.5])
    """
    _check_n_bins(n_bins)
    y_true, y_prob = _check_pair(y_true, y_prob, task, probabilities=True)
    pairs = _top_label(y_true, y_prob, task)
    confidence = np.concatenate([c for c, _ in pairs])
    correct = np.concatenate([k for _, k in pairs])
    return _binned(confidence, correct, n_bins)


def expected_calibration_error(y_true, y_prob, *, task, n_bins=15):
    """Expected calibration error, the paper's calibration dimension C (DESIGN.md section 8).

    ``ECE = sum_m |B_m| / N * |acc(B_m) - conf(B_m)|`` over equal-width bins
    ``(m-1)/M < conf <= m/M``. Multi-class uses the top-label confidence. Multi-label is the macro
    over labels of each label's binary top-label ECE, with ``conf = max(p, 1-p)`` and correctness
    ``(p > 0.5) == y``, masking NaN **[ours]**; a label with no unmasked rows is left out.

    Parameters
    ----------
    y_true, y_prob : arrays
        See the module docstring; ``y_prob`` must lie in [0, 1].
    task : {"multiclass", "multilabel"}
    n_bins : int, default 15

    Returns
    -------
    float

    Examples
    --------
    Two predictions at confidence 0.9 (both right) and one at 0.6 (wrong):
    ``(2 * |1 - 0.9| + 1 * |0 - 0.6|) / 3 = 0.2667``.

    >>> p = np.array([[.9, .1], [.1, .9], [.6, .4]])
    >>> round(expected_calibration_error([0, 1, 1], p, task="multiclass"), 4)
    0.2667
    """
    _check_n_bins(n_bins)
    y_true, y_prob = _check_pair(y_true, y_prob, task, probabilities=True)
    return _mean_calibration_error(_top_label(y_true, y_prob, task), n_bins)


def calibrated_ece_floor(y_true, y_prob, *, task, n_bins=15, n_draws=20, rng=0):
    """The ECE that a perfectly calibrated model with these probabilities shows on this many cases.

    ECE is estimated from a finite test split, so even a model whose probabilities are exactly right
    scores above zero: its bins' accuracies scatter around their confidences. Here the labels are
    drawn ``n_draws`` times from ``y_prob`` itself (a class per row from its categorical distribution;
    each label from its Bernoulli, masked where ``y_true`` is NaN) and the mean
    :func:`expected_calibration_error` of the draws is returned **[ours]**. A recalibrator cannot bring
    a probe's ECE much below this floor (DESIGN.md section 8; chapter 02 sets it beside the observed ECE).

    Parameters
    ----------
    y_true : array
        Only its shape and, for multi-label, its NaN mask are used.
    y_prob : array
        As for :func:`expected_calibration_error`.
    task : {"multiclass", "multilabel"}
    n_bins : int, default 15
    n_draws : int, default 20
    rng : int or numpy Generator, default 0

    Returns
    -------
    float

    Examples
    --------
    Confident, calibrated predictions on 100 cases still show an ECE of a few points; on 10,000, almost none:

    >>> p = np.tile([[.8, .2]], (100, 1))
    >>> 0.01 < calibrated_ece_floor(np.zeros(100), p, task="multiclass") < 0.1
    True
    >>> calibrated_ece_floor(np.zeros(10_000), np.tile([[.8, .2]], (10_000, 1)), task="multiclass") < 0.01
    True
    """
    _check_n_bins(n_bins)
    y_true, y_prob = _check_pair(y_true, y_prob, task, probabilities=True)
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    errors = []
    for _ in range(n_draws):
        if task == "multiclass":
            cumulative = np.cumsum(y_prob, axis=1)
            draw = (generator.random((len(y_prob), 1)) * cumulative[:, -1:] > cumulative).sum(axis=1)
            drawn = np.minimum(draw, y_prob.shape[1] - 1)
        else:
            drawn = (generator.random(y_prob.shape) < y_prob).astype(float)
            drawn[np.isnan(y_true)] = np.nan
        errors.append(expected_calibration_error(drawn, y_prob, task=task, n_bins=n_bins))
    return float(np.mean(errors))


def classwise_ece(y_true, y_prob, *, task, n_bins=15):
    """Classwise ECE (Kull et al. 2019): the mean over classes of the binned error of ``p_k``.

    For each class (or label) k, the predictions ``p_k`` are binned by their own value and each bin's
    mean ``p_k`` is compared with the observed frequency of class k in that bin. Multi-label labels
    mask NaN rows; a label with no unmasked rows is left out.

    Parameters and return value are those of :func:`expected_calibration_error`.

    Examples
    --------
    Class 1 gets 0.25 where it is absent and 0.75 where it is present (class 0 mirrors this):
    every bin is off by 0.25.

    >>> classwise_ece([0, 1], np.array([[.75, .25], [.25, .75]]), task="multiclass", n_bins=4)
    0.25
    """
    _check_n_bins(n_bins)
    y_true, y_prob = _check_pair(y_true, y_prob, task, probabilities=True)
    return _mean_calibration_error([(p, t) for t, p in _columns(y_true, y_prob, task)], n_bins)


# ----------------------------------------------------------------------------------------------
# Label efficiency and robustness


def _check_fraction_curve(auroc_by_fraction):
    if not isinstance(auroc_by_fraction, dict) or len(auroc_by_fraction) < 2:
        raise ValueError("auroc_by_fraction must be a dict {label fraction: AUROC} with at least two fractions")
    fractions = np.array(sorted(float(f) for f in auroc_by_fraction), dtype=float)
    if fractions[0] <= 0 or fractions[-1] > 1:
        raise ValueError(f"label fractions must lie in (0, 1], got {fractions.tolist()}")
    values = np.array([np.asarray(auroc_by_fraction[f], dtype=float) for f in sorted(auroc_by_fraction, key=float)])
    if not np.all(np.isfinite(values)):
        raise ValueError("auroc_by_fraction holds a NaN or infinite AUROC")
    return fractions, values


def label_efficiency_retention(auroc_by_fraction):
    """Label-efficiency retention, the paper's dimension L (DESIGN.md section 8).

    ``L = mean_f AUROC_f / AUROC_1.0`` over the fractions present other than 1.0 (the paper's
    1, 5, 10 and 25 %).

    Parameters
    ----------
    auroc_by_fraction : dict[float, float or array]
        AUROC per label fraction; must contain 1.0 and at least one other fraction. Arrays of one
        shape (bootstrap replicates, say) give one retention per entry.

    Returns
    -------
    float, or an array of the values' shape

    Examples
    --------
    >>> label_efficiency_retention({0.01: 0.6, 0.05: 0.7, 0.10: 0.75, 0.25: 0.75, 1.0: 0.8})
    0.875
    """
    return _mean_ratio_to_full(auroc_by_fraction, offset=0.0)


CHANCE_FLOOR = 0.01
"""The smallest ``AUROC_1.0 - 0.5`` that :func:`chance_corrected_retention` divides by **[ours]**: an
encoder at chance with all its labels has no retention to measure."""


def chance_corrected_retention(auroc_by_fraction):
    """Retention above chance, the sensitivity chapter's alternative to L (DESIGN.md section 14).

    ``mean_f (AUROC_f - 0.5) / (AUROC_1.0 - 0.5)`` over the fractions other than 1.0, the denominator
    floored at :data:`CHANCE_FLOOR`. Unlike :func:`label_efficiency_retention`, an encoder that is near
    chance at every fraction does not score a retention near 1.

    Examples
    --------
    >>> round(chance_corrected_retention({0.01: 0.6, 0.05: 0.7, 0.10: 0.75, 0.25: 0.75, 1.0: 0.8}), 4)
    0.6667
    """
    return _mean_ratio_to_full(auroc_by_fraction, offset=0.5)


def _mean_ratio_to_full(auroc_by_fraction, *, offset):
    """``mean_f (AUROC_f - offset) / (AUROC_1.0 - offset)`` over the fractions below 1.0; with offset 0.5
    the denominator is floored at :data:`CHANCE_FLOOR`."""
    fractions, values = _check_fraction_curve(auroc_by_fraction)
    if not np.isclose(fractions[-1], 1.0):
        raise ValueError(f"auroc_by_fraction needs the full-label fraction 1.0, got {fractions.tolist()}")
    if offset == 0 and np.any(values[-1] <= 0):
        raise ValueError("the full-label AUROC must be positive")
    denominator = values[-1] - offset if offset == 0 else np.maximum(values[-1] - offset, CHANCE_FLOOR)
    retention = np.mean((values[:-1] - offset) / denominator, axis=0)
    return float(retention) if retention.ndim == 0 else retention


def aulc(auroc_by_fraction):
    """Area under the AUROC-vs-log10(fraction) curve, on the AUROC scale (DESIGN.md section 8).

    The trapezoid area over ``log10(f)`` is divided by ``log10(f_max) - log10(f_min)``, so a flat
    curve at AUROC a gives exactly a.

    Parameters
    ----------
    auroc_by_fraction : dict[float, float]
        AUROC per label fraction, at least two fractions.

    Returns
    -------
    float

    Examples
    --------
    >>> aulc({0.01: 0.6, 0.1: 0.8, 1.0: 0.8})
    0.75
    """
    fractions, values = _check_fraction_curve(auroc_by_fraction)
    x = np.log10(fractions)
    return float(np.sum(np.diff(x) * (values[1:] + values[:-1]) / 2) / (x[-1] - x[0]))


def robustness_raw(drops):
    """Raw robustness ``R_raw = 1 - (mean d + max d) / 2`` over AUROC drops (DESIGN.md section 8).

    Each drop is ``AUROC_clean - AUROC(perturbation, severity)``; for CheXpert the real
    CheXpert-to-MIMIC drop is one more entry. Negative drops (a perturbation that helps) are kept
    as they are **[ours]**.

    Parameters
    ----------
    drops : array-like of shape (..., n)
        AUROC drops, at least one, on the last axis (leading axes: bootstrap replicates, say).

    Returns
    -------
    float, or an array of the leading axes' shape

    Examples
    --------
    >>> round(robustness_raw([0.0, 0.02, 0.1]), 4)
    0.93
    """
    drops = np.asarray(drops, dtype=float)
    if drops.ndim == 0 or drops.shape[-1] == 0:
        raise ValueError(f"drops must hold at least one drop on its last axis, got shape {drops.shape}")
    if not np.all(np.isfinite(drops)):
        raise ValueError("drops contains NaN or infinite values")
    robustness = 1 - (drops.mean(axis=-1) + drops.max(axis=-1)) / 2
    return float(robustness) if robustness.ndim == 0 else robustness
