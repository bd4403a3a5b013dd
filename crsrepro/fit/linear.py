"""The linear probe on frozen features, the paper's primary probe (DESIGN.md section 7).

Standardise the features with the train split's mean and standard deviation, then fit an
l2-regularised logistic regression: multinomial for ISIC and APTOS, one binary problem per label for
CheXpert. The inverse regularisation strength C is chosen from a fixed grid by the validation macro
AUROC, with the same grid, iteration budget and time cap for every encoder (the paper's pairing). The
objective follows scikit-learn exactly, so that the two backends (:data:`crsrepro.core.vocab.PROBE_BACKENDS`)
solve the same problem (:mod:`crsrepro.fit.lbfgs`):

``backend="sklearn"``
    ``sklearn.linear_model.LogisticRegression`` (lbfgs), one fit per (C, label): the reference.
``backend="torch"``
    All C values (and, for multi-label data, all labels) of one probe as a single batched full-batch
    L-BFGS in float64 on a CPU or a GPU (:func:`crsrepro.fit.lbfgs.batched_lbfgs`). This is what makes
    the paper's grid affordable; :func:`fit_linear_probes` fits one probe per label fraction this way,
    or every fraction of a cell-seed in one masked solve.

Every probe, this one and the controls of :mod:`crsrepro.fit.controls`, follows the scikit-learn
estimator contract: ``__init__`` stores parameters, ``fit`` validates its inputs (with the checks of
this module: :func:`check_fit_inputs`), sets attributes ending in ``_`` and returns ``self``,
``predict_proba`` returns class probabilities (rows sum to 1) for ``task="multiclass"`` and one
probability per label for ``task="multilabel"``. Labels follow :mod:`crsrepro.core.metrics`: integer
class ids of shape (N,), or 0/1 with NaN for a masked label, shape (N, L). A NaN label is left out of
that label's loss.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from scipy.special import expit, softmax
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted
from tqdm import tqdm

from crsrepro.core.metrics import per_class_auroc
from crsrepro.core.vocab import PROBE_BACKENDS, TASKS
from crsrepro.fit.lbfgs import SOLVERS, solve_torch_masked

logger = logging.getLogger(__name__)

#: The C grid of the linear probe **[ours]**: 10^-4 .. 10^2, 7 values, the same for every encoder.
C_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


# ----------------------------------------------------------------------------------------------
# Input validation, shared by every probe


def check_features(X, name):
    """``X`` as a float64 (N, D) array; a ValueError names ``name`` if it is empty, not 2-d or not finite."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 2-d array (N, D), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return X


def check_labels(y, n_rows, task, name):
    """``y`` as the labels of ``task`` for ``n_rows`` feature rows: int64 class ids (N,), or float
    0/1/NaN (N, L); a ValueError names ``name`` otherwise."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    y = np.asarray(y)
    if y.shape[:1] != (n_rows,):
        raise ValueError(f"{name} has {y.shape[0] if y.ndim else 0} rows, its features have {n_rows}")
    if task == "multiclass":
        if y.ndim != 1 or not np.all(np.isfinite(y.astype(float))) or np.any(y != np.round(y)) or y.min() < 0:
            raise ValueError(f"multiclass {name} must be non-negative integer class ids of shape (N,)")
        return y.astype(np.int64)
    y = y.astype(np.float64)
    observed = y[~np.isnan(y)]
    if y.ndim != 2 or np.any((observed != 0) & (observed != 1)):
        raise ValueError(f"multilabel {name} must hold 0, 1 or NaN with shape (N, L)")
    return y


def check_fit_inputs(task, X, y, X_val, y_val):
    """Validate a probe's training and validation arrays; return them converted."""
    X = check_features(X, "X")
    y = check_labels(y, X.shape[0], task, "y")
    X_val = check_features(X_val, "X_val")
    y_val = check_labels(y_val, X_val.shape[0], task, "y_val")
    if X_val.shape[1] != X.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but X_val has {X_val.shape[1]}")
    if task == "multilabel" and y_val.shape[1] != y.shape[1]:
        raise ValueError(f"y has {y.shape[1]} labels but y_val has {y_val.shape[1]}")
    return X, y, X_val, y_val


def check_time_cap(time_cap_s):
    """A probe's wall-time cap must be positive or None."""
    if time_cap_s is not None and not time_cap_s > 0:
        raise ValueError(f"time_cap_s must be positive or None, got {time_cap_s!r}")


def feature_standardization(X):
    """Per-feature mean and standard deviation; a constant feature gets scale 1 (as StandardScaler).

    Parameters
    ----------
    X : array of shape (N, D)
        The features that define the standardisation: the full train split (DESIGN.md section 3).

    Returns
    -------
    mean, scale : ndarrays of shape (D,)

    Examples
    --------
    >>> feature_standardization(np.array([[0.0, 1.0], [2.0, 1.0]]))
    (array([1., 1.]), array([1., 1.]))
    """
    X = check_features(X, "standardize_with")
    scale = X.std(axis=0)
    return X.mean(axis=0), np.where(scale > 0, scale, 1.0)


class StandardizedProbe(BaseEstimator):
    """What every probe shares: standardising with stored train statistics (``mean_``, ``scale_``).

    Subclasses call ``_set_standardization`` in ``fit`` and ``_standardize`` in ``predict_proba``.
    """

    def _set_standardization(self, X, standardize_with):
        self.mean_, self.scale_ = feature_standardization(X if standardize_with is None else standardize_with)
        if self.mean_.shape[0] != X.shape[1]:
            raise ValueError(f"standardize_with has {self.mean_.shape[0]} features but X has {X.shape[1]}")

    def _standardize(self, X):
        check_is_fitted(self)
        X = check_features(X, "X")
        if X.shape[1] != self.mean_.shape[0]:
            raise ValueError(f"X has {X.shape[1]} features, the probe was fitted on {self.mean_.shape[0]}")
        return (X - self.mean_) / self.scale_


def count_classes(y, y_val):
    """Number of classes K of a multi-class problem; every class must occur in the training labels."""
    n_classes = int(max(y.max(), y_val.max())) + 1
    missing = np.setdiff1d(np.arange(n_classes), y)
    if missing.size:
        raise ValueError(f"classes {missing.tolist()} have no training example (at least one per class is needed)")
    return n_classes


# ----------------------------------------------------------------------------------------------
# The linear probe


def _linear_probabilities(Z, coef, intercept, *, link, binary_multiclass):
    """Probabilities of a fitted linear probe: softmax, per-label sigmoid, or [1-p, p] for K = 2."""
    z = Z @ coef.T + intercept
    if link == "softmax":
        return softmax(z, axis=1)
    p = expit(z)
    return np.column_stack([1 - p[:, 0], p[:, 0]]) if binary_multiclass else p


class LinearProbe(StandardizedProbe):
    """Standardise, then l2 logistic regression with C chosen on validation macro AUROC.

    Parameters
    ----------
    task : {"multiclass", "multilabel"}
        Multinomial regression over K classes (a single binary regression when K = 2, as in
        scikit-learn), or one binary regression per label.
    c_grid : sequence of float, default :data:`C_GRID`
        Candidate inverse regularisation strengths **[ours: 10^-4..10^2, 7 values]**. Ties in
        validation AUROC go to the smallest C (the strongest regularisation).
    backend : {"sklearn", "torch"}, default "sklearn"
        The reference solver, or the batched L-BFGS (see the module docstring).
    device : str, default "cpu"
        Torch device of the torch backend (``"cuda"`` on a GPU).
    max_iter : int, default 200
        L-BFGS iteration budget per (C, label) problem **[ours; a profile setting]**.
    tol : float, default 1e-4
        Gradient tolerance of the normalised objective, scikit-learn's default **[ours]**.
    time_cap_s : float or None, default None
        Wall-time cap of one probe fit, the whole C grid included (the paper's equal compute cap; a
        profile setting). The torch backend stops iterating when it is reached; the sklearn backend
        fits the first C, then starts no further C value.

    Attributes
    ----------
    mean_, scale_ : ndarray of shape (D,)
        The standardisation.
    C_ : float
        The chosen C.
    val_auroc_ : ndarray of shape (len(c_grid),)
        Validation macro AUROC per C (NaN where a C was not fitted before the time cap).
    coef_ : ndarray of shape (M, D)
    intercept_ : ndarray of shape (M,)
        The chosen model on standardised features (M = K, 1 for K = 2, or L).
    n_classes_ : int
        K for multi-class, L for multi-label.
    converged_ : bool
        Whether every problem of the chosen C met the gradient tolerance.
    n_iter_ : int
        The largest iteration count among the chosen C's problems.
    converged_by_c_, n_iter_by_c_ : ndarray of shape (len(c_grid),)
        The same two per C of the sorted grid (False and 0 where a C was not fitted).
    hit_time_cap_ : bool
        Whether the time cap cut the fit short.
    fit_seconds_ : float
        Wall time of the fit (all C values, validation scoring included).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 5)); y = (X[:, 0] > 0).astype(int)
    >>> probe = LinearProbe(task="multiclass").fit(X[:150], y[:150], X_val=X[150:], y_val=y[150:])
    >>> probe.predict_proba(X[:3]).shape, bool(probe.converged_)
    ((3, 2), True)
    """

    def __init__(self, *, task, c_grid=C_GRID, backend="sklearn", device="cpu", max_iter=200, tol=1e-4,
                 time_cap_s=None):
        self.task = task
        self.c_grid = c_grid
        self.backend = backend
        self.device = device
        self.max_iter = max_iter
        self.tol = tol
        self.time_cap_s = time_cap_s

    def fit(self, X, y, *, X_val, y_val, standardize_with=None):
        """Fit on (X, y), choosing C on (X_val, y_val).

        Parameters
        ----------
        X : array of shape (N, D)
        y : array of shape (N,) or (N, L)
        X_val, y_val : arrays
            The validation split that picks C.
        standardize_with : array of shape (M, D) or None
            Features that define the standardisation (the full train split, DESIGN.md section 3);
            None uses X.

        Returns
        -------
        self
        """
        X, y, X_val, y_val = check_fit_inputs(self.task, X, y, X_val, y_val)
        self._set_standardization(X, standardize_with)
        return self._fit_standardized((X - self.mean_) / self.scale_, y, (X_val - self.mean_) / self.scale_, y_val)

    def _check_params(self):
        if self.backend not in PROBE_BACKENDS:
            raise ValueError(f"backend must be one of {PROBE_BACKENDS}, got {self.backend!r}")
        grid = np.asarray(self.c_grid, dtype=float)
        if grid.ndim != 1 or grid.size == 0 or np.any(grid <= 0):
            raise ValueError(f"c_grid must be a non-empty sequence of positive numbers, got {self.c_grid!r}")
        if not (isinstance(self.max_iter, (int, np.integer)) and self.max_iter > 0):
            raise ValueError(f"max_iter must be a positive integer, got {self.max_iter!r}")
        check_time_cap(self.time_cap_s)
        return np.sort(grid)

    def _fit_standardized(self, Z, y, Z_val, y_val):
        """Fit on features already standardised with ``mean_`` and ``scale_``."""
        start = time.perf_counter()
        grid = self._check_params()
        link, targets = self._problem(y, y_val)
        solution = SOLVERS[self.backend](Z, targets, link=link, n_classes=self.n_classes_, c_grid=grid,
                                          max_iter=self.max_iter, tol=self.tol, time_cap_s=self.time_cap_s,
                                          device=self.device)
        return self._select(grid, *solution, Z_val, y_val, seconds=time.perf_counter() - start)

    def _problem(self, y, y_val):
        """Set ``n_classes_`` and return the solver's link and targets for labels ``y``."""
        if self.task == "multiclass":
            self.n_classes_ = count_classes(y, y_val)
            self._binary = self.n_classes_ == 2
            self._link, targets = ("sigmoid", y[:, None].astype(float)) if self._binary else ("softmax", y)
        else:
            one_class = [j for j in range(y.shape[1]) if np.unique(y[~np.isnan(y[:, j]), j]).size < 2]
            if one_class:
                raise ValueError(f"labels {one_class} have fewer than two classes among the training rows")
            self.n_classes_, self._binary, self._link, targets = y.shape[1], False, "sigmoid", y
        return self._link, targets

    def _select(self, grid, coef, intercept, n_iter, converged, hit_time_cap, Z_val, y_val, *, seconds):
        """Score every fitted C on the validation split and keep the best (``seconds``: the solve's share)."""
        start = time.perf_counter()
        self.hit_time_cap_ = hit_time_cap
        self.val_auroc_ = np.full(grid.size, np.nan)
        for c_index in np.flatnonzero(np.isfinite(coef).all(axis=(1, 2))):
            probs = _linear_probabilities(Z_val, coef[c_index], intercept[c_index], link=self._link,
                                          binary_multiclass=self._binary)
            self.val_auroc_[c_index] = np.nanmean(per_class_auroc(y_val, probs, task=self.task))
        if np.all(np.isnan(self.val_auroc_)):
            raise ValueError("no C value could be scored: the validation labels have no class with both outcomes")
        best = int(np.nanargmax(self.val_auroc_))
        self.C_ = float(grid[best])
        self.coef_, self.intercept_ = coef[best], intercept[best]
        self.converged_by_c_, self.n_iter_by_c_ = converged.all(axis=1), n_iter.max(axis=1)
        self.converged_ = bool(self.converged_by_c_[best])
        self.n_iter_ = int(self.n_iter_by_c_[best])
        self.fit_seconds_ = seconds + time.perf_counter() - start
        if not self.converged_:
            logger.info("linear probe (C=%g) stopped before converging after %d iterations", self.C_, self.n_iter_)
        return self

    def predict_proba(self, X):
        """Class probabilities (N, K), rows summing to 1, or per-label probabilities (N, L)."""
        Z = self._standardize(X)
        return _linear_probabilities(Z, self.coef_, self.intercept_, link=self._link, binary_multiclass=self._binary)


#: How :func:`fit_linear_probes` solves the fractions of one cell-seed with the torch backend **[ours]**.
SOLVES = ("masked", "per_fraction")


def default_solve(device) -> str:
    """The faster torch solve of :func:`fit_linear_probes` on ``device`` (measured, see there)."""
    return "masked" if torch.device(device).type == "cuda" else "per_fraction"


def fit_linear_probes(X_train, y_train, subsets, X_val, y_val, *, task, c_grid=C_GRID, backend="torch", device="cpu",
                      max_iter=200, tol=1e-4, time_cap_s=None, standardize_with=None, val_subsets=None,
                      progress=True, solve=None):
    """Fit one linear probe per label fraction, all standardised with the full train split.

    This is the run grid's entry point (DESIGN.md section 7: a probe is fitted once per cell, seed
    and fraction). With the torch backend each fraction's probe fits all its C values (and labels)
    as a batched L-BFGS, in one of two ways **[ours]** (``solve``; both give the same probes up to
    the solver tolerance, and each is a deterministic function of its inputs):

    ``"masked"``
        One batched L-BFGS over every (fraction, C[, label]) problem of the cell-seed: each problem's
        loss runs over its own fraction's rows (a row mask on the shared standardised features). One
        solver loop instead of one per fraction, but each objective evaluation pays for the full
        train split on every fraction's problems (5 N rows instead of 1.41 N for the fractions 1, 5,
        10, 25 and 100 %).
    ``"per_fraction"``
        One batched L-BFGS per fraction, on that fraction's rows only.

    ``solve=None`` picks :func:`default_solve`: ``"per_fraction"`` on a CPU, ``"masked"`` on a GPU,
    where one solver loop's per-iteration overhead is expected to outweigh the extra arithmetic (not
    yet measured: no GPU has been lent; ``benchmarks/probes.py --demo-cell --device cuda``). Measured with
    ``benchmarks/probes.py --demo-cell`` on the demo's heaviest cell-seed (CheXpert-like, 840 train
    x 14 labels x 7 C x 5 fractions, ``max_iter`` 100, one thread, a 2-core x86-64 VM shared with other
    jobs; two runs): per-fraction 1.6-1.7 s, masked 2.5-2.8 s (x1.5-1.7), scikit-learn 4.6-5.1 s at
    128-d features; 9.6-16.4 s, 11.1-23.9 s (x1.2-1.5) and 13.0-31.4 s at 1280-d. The masked solve
    chose the same C at every fraction, with probabilities within 6e-11 of the per-fraction solve.
    The scikit-learn backend always fits per fraction.

    Parameters
    ----------
    X_train : array of shape (N, D)
        Features of the full train split.
    y_train : array of shape (N,) or (N, L)
    subsets : dict[float, array of int]
        Row indices into ``X_train`` per label fraction (the nested label subsets).
    X_val, y_val : arrays
        The validation split, which picks C.
    task, c_grid, backend, device, max_iter, tol, time_cap_s
        As in :class:`LinearProbe`. ``time_cap_s`` is per probe; the masked solve gets the caps of
        all its fractions together (``time_cap_s`` x the number of fractions) **[ours]**.
    standardize_with : array of shape (M, D) or None
        Features that define the standardisation; None uses ``X_train``.
    val_subsets : dict[float, array of int] or None
        Row indices into ``X_val`` that pick C at each fraction **[ours]** (DESIGN.md section 3: the
        nested val subset of the same fraction, so "1 % labels" means 1 % of the labels); None uses the
        whole validation split at every fraction.
    progress : bool, default True
        Show a progress bar over the fractions.
    solve : {"masked", "per_fraction"} or None, default None
        See above; only ``"per_fraction"`` (or None) with the sklearn backend.

    Returns
    -------
    dict[float, LinearProbe]
        A fitted probe per fraction. After a masked solve, each probe's ``fit_seconds_`` is an equal
        share of the joint solve plus its own validation scoring.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 4)); y = (X[:, :2] > 0).astype(float)
    >>> probes = fit_linear_probes(X[:200], y[:200], {0.5: np.arange(100), 1.0: np.arange(200)},
    ...                            X[200:], y[200:], task="multilabel", progress=False)
    >>> sorted(probes), probes[1.0].predict_proba(X[:2]).shape
    ([0.5, 1.0], (2, 2))
    """
    X_train, y_train, X_val, y_val = check_fit_inputs(task, X_train, y_train, X_val, y_val)
    if not isinstance(subsets, dict) or not subsets:
        raise ValueError("subsets must be a non-empty dict {label fraction: row indices}")
    if solve is None:
        solve = default_solve(device) if backend == "torch" else "per_fraction"
    if solve not in SOLVES or (solve == "masked" and backend != "torch"):
        raise ValueError(f"solve must be one of {SOLVES} ('masked' needs backend='torch'), got {solve!r}")
    mean, scale = feature_standardization(X_train if standardize_with is None else standardize_with)
    if mean.shape[0] != X_train.shape[1]:
        raise ValueError(f"standardize_with has {mean.shape[0]} features but X_train has {X_train.shape[1]}")
    Z_train, Z_val = (X_train - mean) / scale, (X_val - mean) / scale
    if val_subsets is not None and set(val_subsets) != set(subsets):
        raise ValueError(f"val_subsets has fractions {sorted(val_subsets)}, subsets {sorted(subsets)}")
    rows = {f: _check_rows(r, X_train.shape[0], f"subsets[{f}]") for f, r in subsets.items()}
    val_rows = {f: np.arange(len(Z_val)) if val_subsets is None
                else _check_rows(val_subsets[f], X_val.shape[0], f"val_subsets[{f}]") for f in subsets}
    probes = {}
    for fraction in subsets:
        probe = LinearProbe(task=task, c_grid=c_grid, backend=backend, device=device, max_iter=max_iter, tol=tol,
                            time_cap_s=time_cap_s)
        probe.mean_, probe.scale_ = mean, scale
        probes[fraction] = probe
    if solve == "per_fraction":
        for fraction, probe in tqdm(probes.items(), desc=f"linear probes ({backend})", disable=not progress):
            probe._fit_standardized(Z_train[rows[fraction]], y_train[rows[fraction]], Z_val[val_rows[fraction]],
                                    y_val[val_rows[fraction]])
        return probes
    _fit_masked(probes, Z_train, y_train, rows, Z_val, y_val, val_rows)
    return probes


def _fit_masked(probes, Z_train, y_train, rows, Z_val, y_val, val_rows):
    """The masked solve of :func:`fit_linear_probes`: one batched L-BFGS per group of fractions that share
    the link and the class count (one group unless a small fraction lacks the top class)."""
    groups = {}
    for fraction, probe in probes.items():
        grid = probe._check_params()
        link, _ = probe._problem(y_train[rows[fraction]], y_val[val_rows[fraction]])
        groups.setdefault((link, probe.n_classes_), []).append(fraction)
    for (link, n_classes), fractions in groups.items():
        start = time.perf_counter()
        masks = np.zeros((len(fractions), Z_train.shape[0]), dtype=bool)
        for i, fraction in enumerate(fractions):
            masks[i, rows[fraction]] = True
        # rows outside every mask of the group carry no weight; give them a valid class id
        targets = np.where(masks.any(axis=0), y_train.T, 0).T
        targets = targets[:, None].astype(float) if link == "sigmoid" and targets.ndim == 1 else targets
        first = probes[fractions[0]]
        cap = None if first.time_cap_s is None else first.time_cap_s * len(fractions)
        coef, intercept, n_iter, converged, hit_cap = solve_torch_masked(
            Z_train, targets, masks, link=link, n_classes=n_classes, c_grid=grid, max_iter=first.max_iter,
            tol=first.tol, time_cap_s=cap, device=first.device)
        share = (time.perf_counter() - start) / len(fractions)
        for i, fraction in enumerate(fractions):
            probes[fraction]._select(grid, coef[i], intercept[i], n_iter[i], converged[i], hit_cap,
                                     Z_val[val_rows[fraction]], y_val[val_rows[fraction]], seconds=share)


def _check_rows(rows, n: int, name: str) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 1 or rows.size == 0 or not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0 \
            or rows.max() >= n:
        raise ValueError(f"{name} must be non-empty row indices (0..{n - 1})")
    return rows
