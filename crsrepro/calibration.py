"""Post-hoc recalibration of probe probabilities (DESIGN.md section 8, "Recalibration").

Four recalibrators map a probe's probabilities to new ones. Each is fitted on the calibration subset
(the validation split, DESIGN.md section 3) and scored on the test split:

``temperature``
    ``softmax(log p / T)``, one scalar T (Guo et al. 2017).
``vector``
    ``softmax(w * log p + b)``, a scale and a shift per class (Guo et al. 2017).
``isotonic``
    One-vs-rest isotonic regression per class, rows renormalised (Zadrozny and Elkan 2002).
``dirichlet``
    ``softmax(W log p + b)`` with a full K x K matrix, ODIR-regularised: off-diagonal entries of W
    and the intercepts are penalised (Kull et al. 2019).

The parametric maps use ``log p`` as the logits (only probabilities leave a probe) and are fitted by
minimising the mean negative log-likelihood with L-BFGS.

The task is read from the labels passed to ``fit``: integer class ids of shape (N,) mean a
multi-class problem (probabilities (N, K) whose rows sum to 1, and so do the outputs); 0/1/NaN labels
of shape (N, L) mean a multi-label problem, recalibrated per label as a two-class problem
``[1 - p, p]`` on the label's unmasked rows. A label whose calibration rows hold a single class is
left as it is and listed in ``identity_labels_``.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> p1 = rng.uniform(size=500); y = (rng.uniform(size=500) < p1).astype(int)
>>> sharp = np.column_stack([1 - p1, p1]) ** 3; sharp /= sharp.sum(axis=1, keepdims=True)
>>> scaler = make_recalibrator("temperature").fit(sharp, y)
>>> round(float(scaler.temperature_), 1)
3.0
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from scipy.special import softmax
from sklearn.base import BaseEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.utils.validation import check_is_fitted

logger = logging.getLogger(__name__)

#: Probabilities are clipped to [LOG_FLOOR, 1] before the logarithm **[ours]**.
LOG_FLOOR = 1e-12


def _check_probs(probs, *, task, n_columns=None):
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] == 0:
        raise ValueError(f"probs must be a non-empty 2-d array (N, K), got shape {probs.shape}")
    if n_columns is not None and probs.shape[1] != n_columns:
        raise ValueError(f"probs has {probs.shape[1]} columns, the recalibrator was fitted on {n_columns}")
    if not np.all(np.isfinite(probs)) or probs.min() < 0 or probs.max() > 1:
        raise ValueError("probs must hold finite probabilities in [0, 1]")
    if task == "multiclass" and not np.allclose(probs.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError("multi-class probs must have rows that sum to 1")
    return probs


def _check_labels(y, probs):
    """Read the task from the labels: (N,) class ids -> multiclass, (N, L) 0/1/NaN -> multilabel."""
    y = np.asarray(y, dtype=np.float64)
    if y.shape[:1] != probs.shape[:1]:
        raise ValueError(f"y has {y.shape[0] if y.ndim else 0} rows, probs has {probs.shape[0]}")
    if y.ndim == 1:
        if np.any(~np.isfinite(y)) or np.any(y != np.round(y)) or y.min() < 0 or y.max() >= probs.shape[1]:
            raise ValueError(f"multi-class y must hold class ids in [0, {probs.shape[1] - 1}]")
        return y.astype(int), "multiclass"
    observed = y[~np.isnan(y)]
    if y.shape != probs.shape or np.any((observed != 0) & (observed != 1)):
        raise ValueError(f"multi-label y must hold 0, 1 or NaN with the shape of probs {probs.shape}")
    return y, "multilabel"


def _two_columns(p):
    return np.column_stack([1 - p, p])


class _Recalibrator(BaseEstimator):
    """Shared fit/predict logic: one map for multi-class data, one two-class map per label otherwise.

    A subclass implements ``_fit_map(probs (n, K), y (n,)) -> state`` and
    ``_apply_map(state, probs (n, K)) -> probs (n, K)``.
    """

    def fit(self, probs, y):
        """Fit on the calibration subset.

        Parameters
        ----------
        probs : array of shape (N, K) or (N, L)
            A probe's probabilities.
        y : array of shape (N,) (class ids) or (N, L) (0/1/NaN)
            The labels; their shape sets the task.

        Returns
        -------
        self
        """
        probs = np.asarray(probs, dtype=np.float64)
        y, self.task_ = _check_labels(y, probs)
        probs = _check_probs(probs, task=self.task_)
        self.n_columns_ = probs.shape[1]
        if self.task_ == "multiclass":
            self.maps_ = [self._fit_map(probs, y)]
            self.identity_labels_ = []
            return self
        self.maps_, self.identity_labels_ = [], []
        for label in range(self.n_columns_):
            seen = ~np.isnan(y[:, label])
            targets = y[seen, label].astype(int)
            if np.unique(targets).size < 2:
                self.maps_.append(None)
                self.identity_labels_.append(label)
                continue
            self.maps_.append(self._fit_map(_two_columns(probs[seen, label]), targets))
        if self.identity_labels_:
            logger.warning("%s: labels %s have a single class in the calibration subset and are left as they are",
                           type(self).__name__, self.identity_labels_)
        return self

    def predict_proba(self, probs):
        """Recalibrated probabilities, the shape of ``probs``; multi-class rows sum to 1."""
        check_is_fitted(self)
        probs = _check_probs(probs, task=self.task_, n_columns=self.n_columns_)
        if self.task_ == "multiclass":
            return self._apply_map(self.maps_[0], probs)
        columns = [probs[:, j] if state is None else self._apply_map(state, _two_columns(probs[:, j]))[:, 1]
                   for j, state in enumerate(self.maps_)]
        return np.column_stack(columns)


class _LogLinearScaling(_Recalibrator):
    """``softmax(A(log p))`` with a parametric map A, fitted by L-BFGS on mean NLL plus a penalty.

    A subclass implements ``_init_params(K) -> list of arrays`` (the identity map) and
    ``_logits(params, log_p) -> Tensor``, and may override ``_penalty(params)``.
    """

    max_iter = 200  # L-BFGS iterations of the calibration fit [ours]

    def _penalty(self, params):
        return 0.0

    def _fit_map(self, probs, y):
        log_p = torch.as_tensor(np.log(np.clip(probs, LOG_FLOOR, 1)))
        targets = torch.as_tensor(y)
        params = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in self._init_params(probs.shape[1])]
        optimizer = torch.optim.LBFGS(params, max_iter=self.max_iter, line_search_fn="strong_wolfe",
                                      tolerance_grad=1e-9, tolerance_change=1e-12)

        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self._logits(params, log_p), targets) + self._penalty(params)
            loss.backward()
            return loss

        optimizer.step(closure)
        return [p.detach() for p in params]

    def _apply_map(self, state, probs):
        with torch.no_grad():
            logits = self._logits(state, torch.as_tensor(np.log(np.clip(probs, LOG_FLOOR, 1))))
        return softmax(logits.numpy(), axis=1)


class TemperatureScaling(_LogLinearScaling):
    """Temperature scaling: ``softmax(log p / T)`` with one T (per label for multi-label data).

    Attributes
    ----------
    temperature_ : float or ndarray of shape (L,)
        The fitted temperature(s); NaN for a label left as it is.
    """

    def _init_params(self, n_classes):
        return [0.0]  # log T

    def _logits(self, params, log_p):
        return log_p * torch.exp(-params[0])

    def fit(self, probs, y):
        super().fit(probs, y)
        temperatures = [np.nan if state is None else float(torch.exp(state[0])) for state in self.maps_]
        self.temperature_ = temperatures[0] if self.task_ == "multiclass" else np.array(temperatures)
        return self


class VectorScaling(_LogLinearScaling):
    """Vector scaling: ``softmax(w * log p + b)`` with a weight and an intercept per class."""

    def _init_params(self, n_classes):
        return [np.ones(n_classes), np.zeros(n_classes)]

    def _logits(self, params, log_p):
        return log_p * params[0] + params[1]


class DirichletCalibration(_LogLinearScaling):
    """Dirichlet calibration ``softmax(W log p + b)`` with ODIR regularisation (Kull et al. 2019).

    The loss is ``mean NLL + reg_lambda * sum_{i != j} W_ij^2 / (K (K - 1)) + reg_mu * sum_j b_j^2 / K``:
    Off-Diagonal and Intercept Regularisation, which leaves the diagonal free. Kull et al. choose the
    two strengths by cross-validation; here they are fixed parameters **[ours]**.

    Parameters
    ----------
    reg_lambda : float, default 1e-2
        Strength of the off-diagonal penalty **[ours]**.
    reg_mu : float, default 1e-2
        Strength of the intercept penalty **[ours]**.
    """

    def __init__(self, *, reg_lambda=1e-2, reg_mu=1e-2):
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu

    def _init_params(self, n_classes):
        return [np.eye(n_classes), np.zeros(n_classes)]

    def _logits(self, params, log_p):
        return log_p @ params[0].T + params[1]

    def _penalty(self, params):
        W, b = params
        k = W.shape[0]
        off_diagonal = W - torch.diag(torch.diagonal(W))
        return self.reg_lambda * (off_diagonal**2).sum() / (k * (k - 1)) + self.reg_mu * (b**2).sum() / k


class IsotonicCalibration(_Recalibrator):
    """One-vs-rest isotonic regression per class, then rows renormalised to sum to 1.

    Isotonic maps are step functions, so they tie many scores and can move AUROC. A small share of
    the original probability is mixed back in, ``(1 - tie_break) * iso(p) + tie_break * p``, which
    keeps the original order within each step **[ours]**.

    Parameters
    ----------
    tie_break : float, default 1e-6
        Weight of the original probability in the mix **[ours]**.
    """

    def __init__(self, *, tie_break=1e-6):
        self.tie_break = tie_break

    def _fit_map(self, probs, y):
        if not 0 <= self.tie_break < 1:
            raise ValueError(f"tie_break must lie in [0, 1), got {self.tie_break!r}")
        return [IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(probs[:, k], y == k)
                for k in range(probs.shape[1])]

    def _apply_map(self, state, probs):
        mapped = np.column_stack([iso.predict(probs[:, k]) for k, iso in enumerate(state)])
        mixed = (1 - self.tie_break) * mapped + self.tie_break * probs
        return mixed / mixed.sum(axis=1, keepdims=True)


RECALIBRATORS = {
    "temperature": TemperatureScaling,
    "vector": VectorScaling,
    "isotonic": IsotonicCalibration,
    "dirichlet": DirichletCalibration,
}


def make_recalibrator(name, **params):
    """Make an unfitted recalibrator by name.

    Parameters
    ----------
    name : {"temperature", "vector", "isotonic", "dirichlet"}
    **params
        Parameters of that recalibrator (``reg_lambda``/``reg_mu`` for Dirichlet, ``tie_break`` for
        isotonic).

    Returns
    -------
    estimator
        With ``fit(probs, y)`` and ``predict_proba(probs)``.

    Examples
    --------
    >>> make_recalibrator("dirichlet", reg_lambda=1e-3)
    DirichletCalibration(reg_lambda=0.001)
    """
    if name not in RECALIBRATORS:
        raise ValueError(f"unknown recalibrator {name!r}; expected one of {', '.join(RECALIBRATORS)}")
    return RECALIBRATORS[name](**params)
