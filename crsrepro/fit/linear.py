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

import copy
import logging
import time
import warnings

import numpy as np
import torch
from scipy.special import expit, softmax
from sklearn.base import BaseEstimator
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.utils.validation import check_is_fitted
from tqdm import tqdm

from crsrepro.core.metrics import per_class_auroc
from crsrepro.core.vocab import PROBE_BACKENDS, TASKS
from crsrepro.fit.lbfgs import SOLVERS, solve_torch_masked

logger = logging.getLogger(__name__)

#: The C grid of the linear probe **[ours]**: 10^-4 .. 10^2, 7 values, the same for every encoder.
C_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
#: Below this many labelled validation cases (per class for multi-class) a probe chooses C by
#: stratified k-fold cross-validation inside its labelled subset (train and val rows of its label
#: fraction) instead of on the val cases alone **[ours]**.
MIN_VAL_CASES = 10
#: The folds of that cross-validation (fewer when the labelled subset is smaller) **[ours]**.
CV_FOLDS = 5
#: How a probe's C was chosen: on the val cases, or by cross-validation inside the labelled subset.
C_RULES = ("val", "cv")
#: The chosen C's problems that have not converged within ``max_iter`` go on, from where they stopped,
#: up to this many times ``max_iter`` in all (the weakly regularised, nearly separable problems need
#: it; the other C values only choose C, so they keep ``max_iter``) **[ours]**. It is not a probe
#: parameter, so not in the row-set keys: a change must bump ``crsrepro.run.results.CACHE_VERSION``.
FINISH_FACTOR = 50


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
        Candidate inverse regularisation strengths **[ours: 10^-4..10^2, 7 values]**. C is chosen by
        validation macro AUROC; a tie goes to the lower validation log-loss, never to grid order
        **[ours]**.
    backend : {"sklearn", "torch"}, default "sklearn"
        The reference solver, or the batched L-BFGS (see the module docstring).
    device : str, default "cpu"
        Torch device of the torch backend (``"cuda"`` on a GPU).
    max_iter : int, default 200
        L-BFGS iteration budget per (C, label) problem **[ours; a profile setting]**; the chosen C's
        problems may go on to :data:`FINISH_FACTOR` times it.
    tol : float, default 1e-4
        Gradient tolerance of the normalised objective, scikit-learn's default **[ours]**.
    time_cap_s : float or None, default None
        Wall-time cap of one probe fit, the whole C grid included (the paper's equal compute cap; a
        profile setting). The torch backend stops iterating when it is reached; the sklearn backend
        fits the first C, then starts no further C value.
    min_val_cases : int, default :data:`MIN_VAL_CASES`
        With fewer labelled validation cases than this (for multi-class: in the rarest class), C is
        chosen by ``cv_folds``-fold cross-validation (stratified for multi-class, seeded with 0) over
        the training and validation rows together, on the pooled out-of-fold probabilities, with the
        same AUROC-then-log-loss rule **[ours]**. The model kept is still the one fitted on the
        training rows at that C.
    cv_folds : int, default :data:`CV_FOLDS`

    Attributes
    ----------
    mean_, scale_ : ndarray of shape (D,)
        The standardisation.
    C_ : float
        The chosen C.
    val_auroc_, val_log_loss_ : ndarray of shape (len(c_grid),)
        Validation macro AUROC and log-loss per C (out of fold when ``c_rule_ == "cv"``; NaN where a
        C was not fitted before the time cap).
    c_rule_ : {"val", "cv"}
        How C was chosen (:data:`C_RULES`).
    c_tie_ : bool
        Whether several C shared the best AUROC, so that the log-loss decided.
    full_val_ : tuple (C, coef, intercept) or None
        The model the same solve gives when C is chosen on the whole validation split instead
        (``fit(..., full_val=...)``; the multiverse's C-budget level), see :meth:`full_val_probe`.
    coef_ : ndarray of shape (M, D)
    intercept_ : ndarray of shape (M,)
        The chosen model on standardised features (M = K, 1 for K = 2, or L).
    n_classes_ : int
        K for multi-class, L for multi-label.
    converged_ : bool
        Whether every problem of the chosen C met the gradient tolerance (after the finishing
        iterations of :data:`FINISH_FACTOR`).
    n_iter_ : int
        The largest iteration count among the chosen C's problems, the finishing ones included.
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
                 time_cap_s=None, min_val_cases=MIN_VAL_CASES, cv_folds=CV_FOLDS):
        self.task = task
        self.c_grid = c_grid
        self.backend = backend
        self.device = device
        self.max_iter = max_iter
        self.tol = tol
        self.time_cap_s = time_cap_s
        self.min_val_cases = min_val_cases
        self.cv_folds = cv_folds

    def fit(self, X, y, *, X_val, y_val, standardize_with=None, full_val=None):
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
        full_val : tuple (X, y) or None
            A larger validation split on which C is also chosen, from the same solve (``full_val_``; left
            None when it holds a class that the training labels lack).

        Returns
        -------
        self
        """
        X, y, X_val, y_val = check_fit_inputs(self.task, X, y, X_val, y_val)
        self._set_standardization(X, standardize_with)
        if full_val is not None:
            full_val = (self._standardize(full_val[0]), check_labels(full_val[1], len(full_val[0]), self.task, "full_val"))
        return self._fit_standardized((X - self.mean_) / self.scale_, y, (X_val - self.mean_) / self.scale_, y_val,
                                      full_val=full_val)

    def _check_params(self):
        if self.backend not in PROBE_BACKENDS:
            raise ValueError(f"backend must be one of {PROBE_BACKENDS}, got {self.backend!r}")
        grid = np.asarray(self.c_grid, dtype=float)
        if grid.ndim != 1 or grid.size == 0 or np.any(grid <= 0):
            raise ValueError(f"c_grid must be a non-empty sequence of positive numbers, got {self.c_grid!r}")
        for name in ("max_iter", "min_val_cases", "cv_folds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, np.integer)) and value > (1 if name == "cv_folds" else 0)):
                raise ValueError(f"{name} must be a positive integer (cv_folds at least 2), got {value!r}")
        check_time_cap(self.time_cap_s)
        return np.sort(grid)

    def _fit_standardized(self, Z, y, Z_val, y_val, *, full_val=None):
        """Fit on features already standardised with ``mean_`` and ``scale_`` (``full_val`` too)."""
        start = time.perf_counter()
        grid = self._check_params()
        link, targets = self._problem(y, y_val)
        solution = self._solve(Z, targets, grid)
        return self._select(grid, *solution, (Z, y), (Z_val, y_val), full_val=full_val,
                            seconds=time.perf_counter() - start)

    def _solve(self, Z, targets, grid, init=None, max_iter=None):
        return SOLVERS[self.backend](Z, targets, link=self._link, n_classes=self.n_classes_, c_grid=grid,
                                     max_iter=max_iter or self.max_iter, tol=self.tol, time_cap_s=self.time_cap_s,
                                     device=self.device, init=init)

    def _targets(self, y):
        """The solver's targets for labels ``y`` (after :meth:`_problem`)."""
        return y[:, None].astype(float) if self._binary else y

    def _problem(self, y, y_val):
        """Set ``n_classes_`` and return the solver's link and targets for labels ``y``."""
        if self.task == "multiclass":
            self.n_classes_ = count_classes(y, y_val)
            self._binary = self.n_classes_ == 2
            self._link = "sigmoid" if self._binary else "softmax"
            targets = self._targets(y)
        else:
            one_class = [j for j in range(y.shape[1]) if np.unique(y[~np.isnan(y[:, j]), j]).size < 2]
            if one_class:
                raise ValueError(f"labels {one_class} have fewer than two classes among the training rows")
            self.n_classes_, self._binary, self._link, targets = y.shape[1], False, "sigmoid", y
        return self._link, targets

    def _select(self, grid, coef, intercept, n_iter, converged, hit_time_cap, train, val, *, seconds, full_val=None):
        """Choose C (:meth:`_choose`) and keep its model; ``train`` and ``val`` are (Z, y) pairs, ``seconds``
        the solve's share of the fit time."""
        start = time.perf_counter()
        self.hit_time_cap_ = hit_time_cap
        best, self.c_rule_, self.c_tie_, self.val_auroc_, self.val_log_loss_ = self._choose(grid, coef, intercept,
                                                                                            train, val)
        self.full_val_ = None
        if full_val is not None and (self.task == "multilabel" or full_val[1].max() < self.n_classes_):
            index = self._choose(grid, coef, intercept, train, full_val)[0]
            self.full_val_ = (float(grid[index]), coef[index], intercept[index])
        self.C_ = float(grid[best])
        self.coef_, self.intercept_ = coef[best], intercept[best]
        self.converged_by_c_, self.n_iter_by_c_ = converged.all(axis=1), n_iter.max(axis=1)
        if not self.converged_by_c_[best] and not hit_time_cap:  # finish the chosen C (FINISH_FACTOR)
            solved = self._solve(train[0], self._targets(train[1]), grid[best:best + 1],
                                 init=(coef[best:best + 1], intercept[best:best + 1]),
                                 max_iter=(FINISH_FACTOR - 1) * self.max_iter)
            self.coef_, self.intercept_ = solved[0][0], solved[1][0]
            self.converged_by_c_[best] = bool(solved[3].all())
            self.n_iter_by_c_[best] += int(solved[2].max())
            self.hit_time_cap_ = self.hit_time_cap_ or solved[4]
        self.converged_ = bool(self.converged_by_c_[best])
        self.n_iter_ = int(self.n_iter_by_c_[best])
        self.fit_seconds_ = seconds + time.perf_counter() - start
        if not self.converged_:
            logger.info("linear probe (C=%g) stopped before converging after %d iterations", self.C_, self.n_iter_)
        return self

    def _choose(self, grid, coef, intercept, train, val):
        """(index of the chosen C, rule, tie, AUROC per C, log-loss per C) on ``val``, or by
        cross-validation over ``train`` and ``val`` together when ``val`` has too few cases."""
        fitted = np.flatnonzero(np.isfinite(coef).all(axis=(1, 2)))
        Z_val, y_val = val
        rule, scored = "val", None
        if _labelled_cases(y_val, self.task, self.n_classes_) < self.min_val_cases:
            scored = self._cross_validated(grid, fitted, train, val, (np.nan_to_num(coef), np.nan_to_num(intercept)))
            rule = "val" if scored is None else "cv"
        if scored is None:
            scored = y_val, {c: _linear_probabilities(Z_val, coef[c], intercept[c], link=self._link,
                                                      binary_multiclass=self._binary) for c in fitted}
        y_scored, probs = scored
        auroc, loss = np.full(grid.size, np.nan), np.full(grid.size, np.nan)
        for c, p in probs.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a class without both outcomes: NaN, left out
                auroc[c] = np.nanmean(per_class_auroc(y_scored, p, task=self.task))
            loss[c] = log_loss(y_scored, p, task=self.task)
        if np.all(np.isnan(auroc)):
            raise ValueError("no C value could be scored: the validation labels have no class with both outcomes")
        best, tie = choose_c(auroc, loss)
        return best, rule, tie, auroc, loss

    def _cross_validated(self, grid, fitted, train, val, init):
        """(labels, {C index: pooled out-of-fold probabilities}) over the train and val rows together, or
        None when they are too few for two folds. Each fold's solve starts from ``init``, the probe's own
        solution (the optimum does not depend on the start; the folds converge in fewer iterations)."""
        Z = np.concatenate([train[0], val[0]])
        y = np.concatenate([train[1], val[1]])
        n_folds = min(self.cv_folds, len(y) // 2)
        if self.task == "multiclass":  # stratification needs a class with at least one case per fold
            n_folds = min(n_folds, int(np.bincount(y).max()))
        if n_folds < 2:
            return None
        if self.task == "multiclass":
            splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=0)
        else:
            splitter = KFold(n_splits=n_folds, shuffle=True, random_state=0)
        out_of_fold = {c: None for c in fitted}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a class rarer than the folds: some folds lack it
            folds = list(splitter.split(Z, y if self.task == "multiclass" else None))
        masks = np.zeros((len(folds), len(y)), dtype=bool)
        for f, (fit_rows, _) in enumerate(folds):
            masks[f, fit_rows] = True
        coef, intercept = self._solve_folds(Z, self._targets(y), masks, grid, init)
        for f, (_, held_out) in enumerate(folds):
            for c in fitted:
                p = _linear_probabilities(Z[held_out], coef[f, c], intercept[f, c], link=self._link,
                                          binary_multiclass=self._binary)
                if out_of_fold[c] is None:
                    out_of_fold[c] = np.empty((len(y), p.shape[1]))
                out_of_fold[c][held_out] = p
        return y, out_of_fold

    def _solve_folds(self, Z, targets, masks, grid, init):
        """(coef (F, nC, M, D), intercept (F, nC, M)) of every (fold, C) problem, each fold fitted on the
        rows of its mask and started from ``init``. The torch backend solves all folds as one masked
        batched L-BFGS (:func:`~crsrepro.fit.lbfgs.solve_torch_masked`: one solver loop instead of one per
        fold, ``benchmarks/probes.py --cv``); scikit-learn fits fold by fold."""
        if self.backend == "torch":
            fold_init = tuple(np.repeat(part[None], len(masks), axis=0) for part in init)
            return solve_torch_masked(Z, targets, masks, link=self._link, n_classes=self.n_classes_, c_grid=grid,
                                      max_iter=self.max_iter, tol=self.tol, time_cap_s=self.time_cap_s,
                                      device=self.device, init=fold_init)[:2]
        return self._fold_by_fold(Z, targets, masks, grid, init)

    def _fold_by_fold(self, Z, targets, masks, grid, init):
        """:meth:`_solve_folds` with one solve per fold (any backend)."""
        solved = [self._solve(Z[rows], targets[rows], grid, init=init)[:2] for rows in masks]
        return np.stack([s[0] for s in solved]), np.stack([s[1] for s in solved])

    def full_val_probe(self) -> "LinearProbe":
        """A copy of this probe with the model chosen on the whole validation split (``full_val_``)."""
        check_is_fitted(self)
        if self.full_val_ is None:
            raise ValueError("this probe was fitted without full_val")
        other = copy.copy(self)
        other.C_, other.coef_, other.intercept_ = self.full_val_
        return other

    def predict_proba(self, X):
        """Class probabilities (N, K), rows summing to 1, or per-label probabilities (N, L)."""
        Z = self._standardize(X)
        return _linear_probabilities(Z, self.coef_, self.intercept_, link=self._link, binary_multiclass=self._binary)


def _labelled_cases(y, task, n_classes) -> int:
    """The labelled cases that choose C: those of the rarest class (multi-class), or the rows with at
    least one observed label (multi-label)."""
    if task == "multiclass":
        return int(np.bincount(y, minlength=n_classes).min())
    return int((~np.isnan(y)).any(axis=1).sum())


def log_loss(y, probs, *, task) -> float:
    """Mean log-loss of probabilities: categorical for multi-class, the binary log-loss over the observed
    (case, label) pairs for multi-label; probabilities are clipped to [1e-15, 1 - 1e-15].

    Examples
    --------
    >>> round(log_loss(np.array([0, 1]), np.array([[0.8, 0.2], [0.5, 0.5]]), task="multiclass"), 4)
    0.4581
    """
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-15, 1 - 1e-15)  # in float32, 1 - 1e-15 is 1: log(0)
    if task == "multiclass":
        return float(-np.mean(np.log(p[np.arange(len(y)), y])))
    observed = ~np.isnan(y)
    t = np.where(observed, y, 0.0)
    return float(-(t * np.log(p) + (1 - t) * np.log(1 - p))[observed].mean())


def choose_c(auroc, loss) -> tuple[int, bool]:
    """The index of the best C: the highest AUROC, a tie going to the lowest log-loss (never to grid
    order); and whether there was a tie. NaN entries (C not fitted or not scorable) are left out.

    Examples
    --------
    >>> choose_c(np.array([0.9, 0.9, 0.8]), np.array([0.6, 0.4, 0.3]))
    (1, True)
    >>> choose_c(np.array([0.7, 0.9, np.nan]), np.array([0.2, 0.4, np.nan]))
    (1, False)
    """
    auroc, loss = np.asarray(auroc, dtype=float), np.asarray(loss, dtype=float)
    tied = np.flatnonzero(auroc >= np.nanmax(auroc) - 1e-12)
    if tied.size == 1:
        return int(tied[0]), False
    return int(tied[np.nanargmin(np.where(np.isnan(loss[tied]), np.inf, loss[tied]))]), True


#: How :func:`fit_linear_probes` solves the fractions of one cell-seed with the torch backend **[ours]**.
SOLVES = ("masked", "per_fraction")


def default_solve(device) -> str:
    """The faster torch solve of :func:`fit_linear_probes` on ``device`` (measured, see there)."""
    return "masked" if torch.device(device).type == "cuda" else "per_fraction"


def fit_linear_probes(X_train, y_train, subsets, X_val, y_val, *, task, c_grid=C_GRID, backend="torch", device="cpu",
                      max_iter=200, tol=1e-4, time_cap_s=None, min_val_cases=MIN_VAL_CASES, cv_folds=CV_FOLDS,
                      standardize_with=None, val_subsets=None, progress=True, solve=None):
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
    task, c_grid, backend, device, max_iter, tol, time_cap_s, min_val_cases, cv_folds
        As in :class:`LinearProbe`. ``time_cap_s`` is per probe; the masked solve gets the caps of
        all its fractions together (``time_cap_s`` x the number of fractions) **[ours]**.
    standardize_with : array of shape (M, D) or None
        Features that define the standardisation; None uses ``X_train``.
    val_subsets : dict[float, array of int] or None
        Row indices into ``X_val`` that pick C at each fraction **[ours]** (DESIGN.md section 3: the
        nested val subset of the same fraction, so "1 % labels" means 1 % of the labels); None uses the
        whole validation split at every fraction. A fraction whose val subset is smaller than the split
        also chooses C on the whole split from the same solve (``full_val_``, the multiverse's C-budget
        level).
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
                            time_cap_s=time_cap_s, min_val_cases=min_val_cases, cv_folds=cv_folds)
        probe.mean_, probe.scale_ = mean, scale
        probes[fraction] = probe
    full_val = {f: (Z_val, y_val) if len(val_rows[f]) < len(Z_val) else None for f in subsets}
    if solve == "per_fraction":
        for fraction, probe in tqdm(probes.items(), desc=f"linear probes ({backend})", disable=not progress):
            probe._fit_standardized(Z_train[rows[fraction]], y_train[rows[fraction]], Z_val[val_rows[fraction]],
                                    y_val[val_rows[fraction]], full_val=full_val[fraction])
        return probes
    _fit_masked(probes, Z_train, y_train, rows, Z_val, y_val, val_rows, full_val)
    return probes


def _fit_masked(probes, Z_train, y_train, rows, Z_val, y_val, val_rows, full_val):
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
                                     (Z_train[rows[fraction]], y_train[rows[fraction]]),
                                     (Z_val[val_rows[fraction]], y_val[val_rows[fraction]]),
                                     full_val=full_val[fraction], seconds=share)


def _check_rows(rows, n: int, name: str) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 1 or rows.size == 0 or not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0 \
            or rows.max() >= n:
        raise ValueError(f"{name} must be non-empty row indices (0..{n - 1})")
    return rows
