"""Probes on frozen features: the linear probe and the two control probes (DESIGN.md section 7).

The **linear probe** is the paper's primary probe: standardise the features with the train split's
mean and standard deviation, then fit an l2-regularised logistic regression, multinomial for ISIC and
APTOS and one binary problem per label for CheXpert. The inverse regularisation strength C is chosen
from a fixed grid by the validation macro AUROC, with the same grid, iteration budget and time cap for
every encoder (the paper's pairing). The objective follows scikit-learn exactly::

    C * sum_i logloss_i + 0.5 * ||W||^2        (the intercept is not penalised)

so that the two backends solve the same problem:

``backend="sklearn"``
    ``sklearn.linear_model.LogisticRegression`` (lbfgs), one fit per (C, label): the reference.
``backend="torch"``
    All C values (and, for multi-label data, all labels) of one probe as a single batched full-batch
    L-BFGS in float64 on a CPU or a GPU (:func:`batched_lbfgs`). This is what makes the paper's grid
    affordable; :func:`fit_linear_probes` fits one probe per label fraction this way, or every
    fraction of a cell-seed in one masked solve.

The **control probes** show that the conclusions do not hinge on the classifier: :class:`MLPProbe`
(two layers, fixed budget, early stopping on validation loss) and :class:`KNNProbe` (k = 5, cosine).

All probes follow the scikit-learn estimator contract: ``__init__`` stores parameters, ``fit``
validates its inputs, sets attributes ending in ``_`` and returns ``self``, ``predict_proba`` returns
class probabilities (rows sum to 1) for ``task="multiclass"`` and one probability per label for
``task="multilabel"``. Labels follow :mod:`crsrepro.core.metrics`: integer class ids of shape (N,), or
0/1 with NaN for a masked label, shape (N, L). A NaN label is left out of that label's loss.
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
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import NearestNeighbors
from sklearn.utils.validation import check_is_fitted
from tqdm import tqdm

from crsrepro.core.metrics import TASKS, per_class_auroc

logger = logging.getLogger(__name__)

#: The C grid of the linear probe **[ours]**: 10^-4 .. 10^2, 7 values, the same for every encoder.
C_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
BACKENDS = ("sklearn", "torch")


# ----------------------------------------------------------------------------------------------
# Input validation


def _check_features(X, name):
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 2-d array (N, D), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return X


def _check_labels(y, n_rows, task, name):
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


def _check_fit_inputs(task, X, y, X_val, y_val):
    """Validate a probe's training and validation arrays; return them converted."""
    X = _check_features(X, "X")
    y = _check_labels(y, X.shape[0], task, "y")
    X_val = _check_features(X_val, "X_val")
    y_val = _check_labels(y_val, X_val.shape[0], task, "y_val")
    if X_val.shape[1] != X.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but X_val has {X_val.shape[1]}")
    if task == "multilabel" and y_val.shape[1] != y.shape[1]:
        raise ValueError(f"y has {y.shape[1]} labels but y_val has {y_val.shape[1]}")
    return X, y, X_val, y_val


def _check_time_cap(time_cap_s):
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
    X = _check_features(X, "standardize_with")
    scale = X.std(axis=0)
    return X.mean(axis=0), np.where(scale > 0, scale, 1.0)


class _StandardizedProbe(BaseEstimator):
    """What every probe shares: standardising with stored train statistics, and timing a fit."""

    def _set_standardization(self, X, standardize_with):
        self.mean_, self.scale_ = feature_standardization(X if standardize_with is None else standardize_with)
        if self.mean_.shape[0] != X.shape[1]:
            raise ValueError(f"standardize_with has {self.mean_.shape[0]} features but X has {X.shape[1]}")

    def _standardize(self, X):
        check_is_fitted(self)
        X = _check_features(X, "X")
        if X.shape[1] != self.mean_.shape[0]:
            raise ValueError(f"X has {X.shape[1]} features, the probe was fitted on {self.mean_.shape[0]}")
        return (X - self.mean_) / self.scale_


def _n_classes(y, y_val):
    """Number of classes K of a multi-class problem; every class must occur in the training labels."""
    n_classes = int(max(y.max(), y_val.max())) + 1
    missing = np.setdiff1d(np.arange(n_classes), y)
    if missing.size:
        raise ValueError(f"classes {missing.tolist()} have no training example (at least one per class is needed)")
    return n_classes


# ----------------------------------------------------------------------------------------------
# The batched L-BFGS solver (torch backend)


def batched_lbfgs(objective, theta, *, max_iter, tol, time_cap_s=None, history_size=10, max_line_search=40):
    """Minimise P independent smooth objectives at once with L-BFGS (one history per problem).

    Each problem keeps its own curvature history, initial scaling and step length, and stops on its
    own when the largest absolute gradient entry falls to ``tol`` (scipy's ``pgtol``, the criterion
    scikit-learn's lbfgs uses). Every objective evaluation is batched over the problems still
    running. The step is found by backtracking on the Armijo condition **[ours: simpler than a strong
    Wolfe search and enough for convex problems]**; a pair that breaks the curvature condition
    ``s'y > 0`` is left out of the history.

    Parameters
    ----------
    objective : callable
        ``objective(theta_subset, index) -> (f, g)``: the values ``f`` (p,) and gradients ``g``
        (p, d) of the problems ``index`` (a LongTensor of length p) at ``theta_subset`` (p, d).
    theta : Tensor of shape (P, d)
        The starting points; not modified.
    max_iter : int
        The iteration budget per problem.
    tol : float
        Gradient tolerance (max-norm) for convergence.
    time_cap_s : float or None
        Stop every problem once this much wall time has passed.
    history_size : int, default 10
        Number of stored curvature pairs (scipy's default is 10).
    max_line_search : int, default 40
        Halvings of the step before a problem is given up as stalled.

    Returns
    -------
    theta : Tensor of shape (P, d)
    n_iter : ndarray of shape (P,)
        Iterations used per problem.
    converged : ndarray of shape (P,), bool
    hit_time_cap : bool
        True if the time cap stopped problems that had not converged.
    """
    start = time.perf_counter()
    theta = theta.clone()
    n_problems, dim = theta.shape
    m = history_size
    S = theta.new_zeros(m, n_problems, dim)
    Y = theta.new_zeros(m, n_problems, dim)
    rho = theta.new_zeros(m, n_problems)
    gamma = theta.new_ones(n_problems)
    has_pair = torch.zeros(n_problems, dtype=torch.bool, device=theta.device)
    f, g = objective(theta, torch.arange(n_problems, device=theta.device))
    converged = g.abs().amax(dim=1) <= tol
    running = ~converged
    n_iter = torch.zeros(n_problems, dtype=torch.long, device=theta.device)
    hit_time_cap = False
    for it in range(max_iter):
        idx = running.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        if time_cap_s is not None and time.perf_counter() - start > time_cap_s:
            hit_time_cap = True
            break
        g_i = g[idx]
        # two-loop recursion: direction = -H g, newest pair first
        direction = -g_i
        alphas = []
        for j in range(min(it, m)):
            slot = (it - 1 - j) % m
            alpha = rho[slot, idx] * (S[slot, idx] * direction).sum(1)
            direction = direction - alpha[:, None] * Y[slot, idx]
            alphas.append((slot, alpha))
        direction = gamma[idx, None] * direction
        for slot, alpha in reversed(alphas):
            beta = rho[slot, idx] * (Y[slot, idx] * direction).sum(1)
            direction = direction + S[slot, idx] * (alpha - beta)[:, None]
        slope = (g_i * direction).sum(1)
        uphill = slope >= 0
        direction[uphill] = -g_i[uphill]
        slope = torch.where(uphill, -(g_i * g_i).sum(1), slope)
        # first step of a problem without curvature information: scale as torch.optim.LBFGS does
        step = torch.where(has_pair[idx], torch.ones_like(slope), (1.0 / g_i.abs().sum(1)).clamp(max=1.0))
        # backtracking line search on the Armijo condition, batched over the pending problems
        accepted = torch.zeros_like(uphill)
        f_new, g_new = f[idx].clone(), g_i.clone()
        for _ in range(max_line_search):
            pending = (~accepted).nonzero().squeeze(1)
            if pending.numel() == 0:
                break
            f_try, g_try = objective(theta[idx[pending]] + step[pending, None] * direction[pending], idx[pending])
            ok = f_try <= f[idx[pending]] + 1e-4 * step[pending] * slope[pending]
            f_new[pending[ok]], g_new[pending[ok]] = f_try[ok], g_try[ok]
            accepted[pending[ok]] = True
            step[pending[~ok]] *= 0.5
        # the curvature pair of this iteration goes into slot it % m (zero rho: skipped pair)
        slot = it % m
        s = step[:, None] * direction * accepted[:, None]
        y = (g_new - g_i) * accepted[:, None]
        sy = (s * y).sum(1)
        good = accepted & (sy > 1e-10)
        S[slot, idx], Y[slot, idx] = s, y
        rho[slot, idx] = torch.where(good, 1.0 / torch.where(good, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        gamma[idx] = torch.where(good, sy / (y * y).sum(1).clamp(min=1e-300), gamma[idx])
        has_pair[idx] |= good
        theta[idx] += s
        f[idx], g[idx] = f_new, g_new
        n_iter[idx] += 1
        converged[idx] = g_new.abs().amax(dim=1) <= tol
        running[idx] = ~converged[idx] & accepted  # a failed line search stalls the problem
    return theta, n_iter.cpu().numpy(), converged.cpu().numpy(), hit_time_cap


class _LogisticObjective:
    """The normalised l2 logistic objectives of many problems: ``mean logloss + ||W||^2 / (2 C n)``.

    Dividing scikit-learn's ``C * sum logloss + ||W||^2 / 2`` by ``C n`` changes no minimiser and
    makes the gradient tolerance mean the same as in scikit-learn's lbfgs. ``link="sigmoid"``: each
    problem is one binary logistic regression on one target column (NaN targets masked).
    ``link="softmax"``: each problem is a multinomial regression on integer targets. A problem's
    parameters are flattened as ``(M, D + 1)`` (weights then intercept), M = 1 or K.

    Every problem also has a row mask, ``rows[fraction[p]]``: its loss and ``n`` run over those rows
    only, so problems on nested label subsets share one feature matrix (the masked solve of
    :func:`fit_linear_probes`). A masked row adds exact zeros to the loss and the gradient.
    """

    def __init__(self, Z, targets, *, link, C, rows, fraction, column=None, n_classes=None):
        self.Z, self.link, self.C = Z, link, C
        self.n_features = Z.shape[1]
        mask = rows.to(Z.dtype)[fraction].T  # (N, P): the problem's row subset
        if link == "sigmoid":
            mask = mask * (~torch.isnan(targets)).to(Z.dtype)[:, column]
            self.targets = torch.nan_to_num(targets)
            self.column = column
            self.n_outputs = 1
        else:
            self.onehot = torch.nn.functional.one_hot(targets, n_classes).to(Z.dtype)
            self.n_outputs = n_classes
        self.mask, self.n_obs = mask, mask.sum(0)

    def __call__(self, theta, index):
        n, d = self.Z.shape
        p = theta.shape[0]
        params = theta.view(p, self.n_outputs, d + 1)
        W, b = params[..., :d], params[..., d]
        C, mask, n_obs = self.C[index], self.mask[:, index, None], self.n_obs[index]
        z = (self.Z @ W.reshape(p * self.n_outputs, d).T).view(n, p, self.n_outputs) + b
        if self.link == "sigmoid":
            t = self.targets[:, self.column[index], None]
            loss = (mask * (torch.nn.functional.softplus(z) - t * z)).sum((0, 2))
            residual = mask * (torch.sigmoid(z) - t) / n_obs[None, :, None]
        else:
            loss = (mask[..., 0] * (torch.logsumexp(z, 2) - (z * self.onehot[:, None, :]).sum(2))).sum(0)
            residual = mask * (torch.softmax(z, 2) - self.onehot[:, None, :]) / n_obs[None, :, None]
        f = loss / n_obs + (W * W).sum((1, 2)) / (2 * C * n_obs)
        grad_W = (residual.reshape(n, -1).T @ self.Z).view(p, self.n_outputs, d) + W / (C * n_obs)[:, None, None]
        grad = torch.cat([grad_W, residual.sum(0)[..., None]], dim=2)
        return f, grad.reshape(p, -1)


def _solve_torch_masked(Z, targets, row_masks, *, link, n_classes, c_grid, max_iter, tol, time_cap_s, device):
    """Fit every (row mask, C, column) problem as one :func:`batched_lbfgs`.

    ``row_masks`` is a bool array (F, N): problem (f, c, j) fits column j at C ``c_grid[c]`` on the
    rows of mask f. Returns ``coef (F, nC, M, D)``, ``intercept (F, nC, M)``, ``n_iter (F, nC,
    n_cols)``, ``converged (F, nC, n_cols)`` and whether the time cap was hit.
    """
    device = torch.device(device)
    Z_t = torch.as_tensor(Z, dtype=torch.float64, device=device)
    n_masks, n_c = len(row_masks), len(c_grid)
    if link == "sigmoid":
        n_cols = targets.shape[1]
        y_t = torch.as_tensor(targets, dtype=torch.float64, device=device)
    else:
        n_cols = 1
        y_t = torch.as_tensor(targets, dtype=torch.long, device=device)
    # problem index = (mask, C index, column), column fastest
    fraction = torch.arange(n_masks, device=device).repeat_interleave(n_c * n_cols)
    column = torch.arange(n_cols, device=device).repeat(n_masks * n_c)
    C = torch.as_tensor(np.tile(np.repeat(c_grid, n_cols), n_masks), dtype=torch.float64, device=device)
    objective = _LogisticObjective(Z_t, y_t, link=link, C=C, rows=torch.as_tensor(row_masks, device=device),
                                   fraction=fraction, column=column if link == "sigmoid" else None,
                                   n_classes=n_classes)
    n_out = objective.n_outputs
    theta0 = Z_t.new_zeros(n_masks * n_c * n_cols, n_out * (Z.shape[1] + 1))
    theta, n_iter, converged, hit_cap = batched_lbfgs(objective, theta0, max_iter=max_iter, tol=tol,
                                                       time_cap_s=time_cap_s)
    params = theta.view(n_masks, n_c, n_cols * n_out, Z.shape[1] + 1).cpu().numpy()
    return (params[..., :-1], params[..., -1], n_iter.reshape(n_masks, n_c, n_cols),
            converged.reshape(n_masks, n_c, n_cols), hit_cap)


def _solve_torch(Z, targets, *, link, n_classes, c_grid, max_iter, tol, time_cap_s, device):
    """Fit every (C, column) problem with :func:`batched_lbfgs`; shapes as in :func:`_solve_sklearn`."""
    coef, intercept, n_iter, converged, hit_cap = _solve_torch_masked(
        Z, targets, np.ones((1, Z.shape[0]), dtype=bool), link=link, n_classes=n_classes, c_grid=c_grid,
        max_iter=max_iter, tol=tol, time_cap_s=time_cap_s, device=device)
    return coef[0], intercept[0], n_iter[0], converged[0], hit_cap


def _solve_sklearn(Z, targets, *, link, n_classes, c_grid, max_iter, tol, time_cap_s, device):
    """Fit one ``LogisticRegression`` per (C, column); after the first C, start none past the time cap.

    Returns ``coef (nC, M, D)``, ``intercept (nC, M)``, ``n_iter (nC, n_cols)``, ``converged (nC,
    n_cols)`` and whether the cap was hit; C values never reached have NaN coefficients.
    """
    del device  # the reference backend runs on the CPU
    start = time.perf_counter()
    columns = [targets[:, j] for j in range(targets.shape[1])] if link == "sigmoid" else [targets]
    n_out = len(columns) if link == "sigmoid" else n_classes
    coef = np.full((len(c_grid), n_out, Z.shape[1]), np.nan)
    intercept = np.full((len(c_grid), n_out), np.nan)
    n_iter = np.zeros((len(c_grid), len(columns)), dtype=int)
    converged = np.zeros((len(c_grid), len(columns)), dtype=bool)
    for c_index, C in enumerate(c_grid):
        if c_index > 0 and time_cap_s is not None and time.perf_counter() - start > time_cap_s:
            return coef, intercept, n_iter, converged, True
        for j, column in enumerate(columns):
            seen = ~np.isnan(column) if link == "sigmoid" else slice(None)
            model = LogisticRegression(C=C, solver="lbfgs", max_iter=max_iter, tol=tol)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model.fit(Z[seen], column[seen].astype(int))
            rows = slice(j, j + 1) if link == "sigmoid" else slice(None)
            coef[c_index, rows], intercept[c_index, rows] = model.coef_, model.intercept_
            n_iter[c_index, j] = int(model.n_iter_.max())
            converged[c_index, j] = n_iter[c_index, j] < max_iter
    return coef, intercept, n_iter, converged, False


_SOLVERS = {"torch": _solve_torch, "sklearn": _solve_sklearn}


def _linear_probabilities(Z, coef, intercept, *, link, binary_multiclass):
    """Probabilities of a fitted linear probe: softmax, per-label sigmoid, or [1-p, p] for K = 2."""
    z = Z @ coef.T + intercept
    if link == "softmax":
        return softmax(z, axis=1)
    p = expit(z)
    return np.column_stack([1 - p[:, 0], p[:, 0]]) if binary_multiclass else p


# ----------------------------------------------------------------------------------------------
# The probes


class LinearProbe(_StandardizedProbe):
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
        X, y, X_val, y_val = _check_fit_inputs(self.task, X, y, X_val, y_val)
        self._set_standardization(X, standardize_with)
        return self._fit_standardized((X - self.mean_) / self.scale_, y, (X_val - self.mean_) / self.scale_, y_val)

    def _check_params(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        grid = np.asarray(self.c_grid, dtype=float)
        if grid.ndim != 1 or grid.size == 0 or np.any(grid <= 0):
            raise ValueError(f"c_grid must be a non-empty sequence of positive numbers, got {self.c_grid!r}")
        if not (isinstance(self.max_iter, (int, np.integer)) and self.max_iter > 0):
            raise ValueError(f"max_iter must be a positive integer, got {self.max_iter!r}")
        _check_time_cap(self.time_cap_s)
        return np.sort(grid)

    def _fit_standardized(self, Z, y, Z_val, y_val):
        """Fit on features already standardised with ``mean_`` and ``scale_``."""
        start = time.perf_counter()
        grid = self._check_params()
        link, targets = self._problem(y, y_val)
        solution = _SOLVERS[self.backend](Z, targets, link=link, n_classes=self.n_classes_, c_grid=grid,
                                          max_iter=self.max_iter, tol=self.tol, time_cap_s=self.time_cap_s,
                                          device=self.device)
        return self._select(grid, *solution, Z_val, y_val, seconds=time.perf_counter() - start)

    def _problem(self, y, y_val):
        """Set ``n_classes_`` and return the solver's link and targets for labels ``y``."""
        if self.task == "multiclass":
            self.n_classes_ = _n_classes(y, y_val)
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
    X_train, y_train, X_val, y_val = _check_fit_inputs(task, X_train, y_train, X_val, y_val)
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
        coef, intercept, n_iter, converged, hit_cap = _solve_torch_masked(
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


class MLPProbe(_StandardizedProbe):
    """A two-layer perceptron control probe: Linear -> ReLU -> Linear, trained with AdamW.

    Training runs for at most ``max_epochs`` epochs and keeps the weights of the epoch with the
    lowest validation loss, stopping after ``patience`` epochs without improvement **[ours: every
    hyperparameter below; they are the same for every encoder]**. Multi-label training masks NaN
    labels out of the binary cross-entropy.

    Parameters
    ----------
    task : {"multiclass", "multilabel"}
    hidden : int, default 256
        Width of the hidden layer.
    lr : float, default 1e-3
    weight_decay : float, default 1e-4
    max_epochs : int, default 100
    batch_size : int, default 128
    patience : int, default 10
    device : str, default "cpu"
    time_cap_s : float or None, default None
        Wall-time cap of the fit; hitting it is recorded in ``hit_time_cap_``.
    random_state : int, default 0
        Seeds the weight initialisation and the batch order.

    Attributes
    ----------
    mean_, scale_ : ndarray of shape (D,)
    model_ : torch.nn.Sequential
        The best network (on the CPU).
    n_classes_ : int
    best_epoch_, n_epochs_ : int
    hit_time_cap_ : bool
    fit_seconds_ : float

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 5)); y = (X[:, 0] > 0).astype(int)
    >>> mlp = MLPProbe(task="multiclass", max_epochs=5).fit(X[:150], y[:150], X_val=X[150:], y_val=y[150:])
    >>> mlp.predict_proba(X[:4]).sum(axis=1).round(6).tolist()
    [1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, *, task, hidden=256, lr=1e-3, weight_decay=1e-4, max_epochs=100, batch_size=128, patience=10,
                 device="cpu", time_cap_s=None, random_state=0):
        self.task = task
        self.hidden = hidden
        self.lr = lr
        self.weight_decay = weight_decay
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.patience = patience
        self.device = device
        self.time_cap_s = time_cap_s
        self.random_state = random_state

    def _loss(self, logits, targets):
        if self.task == "multiclass":
            return torch.nn.functional.cross_entropy(logits, targets)
        mask = ~torch.isnan(targets)
        per_entry = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, torch.nan_to_num(targets), reduction="none")
        return (per_entry * mask).sum() / mask.sum().clamp(min=1)

    def fit(self, X, y, *, X_val, y_val, standardize_with=None):
        """Train with early stopping on (X_val, y_val); parameters as in :meth:`LinearProbe.fit`."""
        start = time.perf_counter()
        X, y, X_val, y_val = _check_fit_inputs(self.task, X, y, X_val, y_val)
        _check_time_cap(self.time_cap_s)
        self._set_standardization(X, standardize_with)
        self.n_classes_ = _n_classes(y, y_val) if self.task == "multiclass" else y.shape[1]
        device = torch.device(self.device)
        label_dtype = torch.long if self.task == "multiclass" else torch.float32

        def tensors(features, labels):
            return (torch.as_tensor((features - self.mean_) / self.scale_, dtype=torch.float32, device=device),
                    torch.as_tensor(labels, dtype=label_dtype, device=device))

        (Z, t), (Z_val, t_val) = tensors(X, y), tensors(X_val, y_val)
        generator = torch.Generator().manual_seed(self.random_state)
        with torch.random.fork_rng(devices=[]):  # seed the initialisation without touching the global state
            torch.manual_seed(self.random_state)
            model = torch.nn.Sequential(torch.nn.Linear(Z.shape[1], self.hidden), torch.nn.ReLU(),
                                        torch.nn.Linear(self.hidden, self.n_classes_)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best_loss, best_state, self.best_epoch_, self.hit_time_cap_ = np.inf, None, 0, False
        for epoch in range(1, self.max_epochs + 1):
            model.train()
            for batch in torch.randperm(Z.shape[0], generator=generator).split(self.batch_size):
                optimizer.zero_grad()
                self._loss(model(Z[batch.to(device)]), t[batch.to(device)]).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                val_loss = float(self._loss(model(Z_val), t_val))
            if val_loss < best_loss:
                best_loss, best_state, self.best_epoch_ = val_loss, copy.deepcopy(model.state_dict()), epoch
            self.n_epochs_ = epoch
            if epoch - self.best_epoch_ >= self.patience:
                break
            if self.time_cap_s is not None and time.perf_counter() - start > self.time_cap_s:
                self.hit_time_cap_ = True
                break
        model.load_state_dict(best_state)
        self.model_ = model.cpu().eval()
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def predict_proba(self, X):
        """Class probabilities (N, K) or per-label probabilities (N, L)."""
        Z = torch.as_tensor(self._standardize(X), dtype=torch.float32)
        with torch.no_grad():
            logits = self.model_(Z)
        probs = torch.softmax(logits, 1) if self.task == "multiclass" else torch.sigmoid(logits)
        return probs.double().numpy()


class KNNProbe(_StandardizedProbe):
    """A k-nearest-neighbour control probe on standardised features.

    The probability of a class (or label) is its share among the k nearest training rows, uniformly
    weighted **[ours]**. For multi-label data, a neighbour whose label is NaN does not vote on that
    label; a row with no voting neighbour gets the label's training prevalence **[ours]**.

    Parameters
    ----------
    task : {"multiclass", "multilabel"}
    k : int, default 5
        The number of neighbours (the paper's k = 5).
    metric : str, default "cosine"
        Distance for ``sklearn.neighbors.NearestNeighbors`` **[ours: cosine]**.

    Attributes
    ----------
    mean_, scale_ : ndarray of shape (D,)
    neighbors_ : NearestNeighbors
    labels_ : ndarray
        The training labels.
    n_classes_ : int
    fit_seconds_ : float

    Examples
    --------
    >>> X = np.array([[1.0, 0.1], [1.0, 0.2], [0.1, 1.0], [0.2, 1.0]])
    >>> knn = KNNProbe(task="multiclass", k=2).fit(X, [0, 0, 1, 1])
    >>> knn.predict_proba(np.array([[1.0, 0.0]])).tolist()
    [[1.0, 0.0]]
    """

    def __init__(self, *, task, k=5, metric="cosine"):
        self.task = task
        self.k = k
        self.metric = metric

    def fit(self, X, y, *, X_val=None, y_val=None, standardize_with=None):
        """Store the standardised training rows. ``X_val``/``y_val`` are accepted for a uniform call
        signature and unused: k is fixed, so nothing is tuned."""
        start = time.perf_counter()
        del X_val, y_val
        X = _check_features(X, "X")
        y = _check_labels(y, X.shape[0], self.task, "y")
        if not (isinstance(self.k, (int, np.integer)) and 1 <= self.k <= X.shape[0]):
            raise ValueError(f"k must be an integer in [1, {X.shape[0]}] (the training rows), got {self.k!r}")
        self._set_standardization(X, standardize_with)
        self.n_classes_ = int(y.max()) + 1 if self.task == "multiclass" else y.shape[1]
        self.labels_ = y
        self.neighbors_ = NearestNeighbors(n_neighbors=self.k, metric=self.metric, algorithm="brute").fit(
            (X - self.mean_) / self.scale_)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def predict_proba(self, X):
        """Neighbour vote shares: (N, K) summing to 1, or (N, L) per label."""
        Z = self._standardize(X)
        index = self.neighbors_.kneighbors(Z, return_distance=False)
        if self.task == "multiclass":
            votes = np.eye(self.n_classes_)[self.labels_[index]]  # (N, k, K)
            return votes.mean(axis=1)
        votes = self.labels_[index]  # (N, k, L) with NaN
        seen = ~np.isnan(votes)
        share = np.nansum(votes, axis=1) / np.maximum(seen.sum(axis=1), 1)
        prevalence = np.nanmean(self.labels_, axis=0)
        return np.where(seen.any(axis=1), share, prevalence)
