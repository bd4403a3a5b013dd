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

A fitted recalibrator is saved as plain JSON data with ``to_dict()`` and restored with
:func:`recalibrator_from_dict` (no pickle); the restored map gives the same outputs bit for bit.

:func:`cross_validated_ece` and :func:`select_recalibrator` choose a method inside the calibration
subset by k-fold cross-fitting (beyond the paper, which reports every method; DESIGN.md section 14).

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
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.utils.validation import check_is_fitted

from crsrepro.core.errors import CrsreproError
from crsrepro.core.metrics import expected_calibration_error
from crsrepro.core.vocab import TASKS
from crsrepro.fit.lbfgs import batched_lbfgs

logger = logging.getLogger(__name__)

#: Probabilities are clipped to [LOG_FLOOR, 1] before the logarithm **[ours]**.
LOG_FLOOR = 1e-12

#: The ``format`` tag of a saved recalibrator (:meth:`_Recalibrator.to_dict`).
MAP_FORMAT = "crsrepro-recalibrator-v1"


class TooFewCasesError(CrsreproError, ValueError):
    """A calibration subset holds fewer cases than a method or a cross-validation needs."""


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

    A subclass implements ``_fit_maps(problems) -> states``, one state per ``(probs (n, K), y (n,))``
    problem (a multi-class fit is one problem, a multi-label fit one per label), and
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
            self.maps_ = self._fit_maps([(probs, y)])
            self.identity_labels_ = []
            return self
        problems, fitted = [], []
        for label in range(self.n_columns_):
            seen = ~np.isnan(y[:, label])
            targets = y[seen, label].astype(int)
            if np.unique(targets).size > 1:
                problems.append((_two_columns(probs[seen, label]), targets))
                fitted.append(label)
        self.maps_ = [None] * self.n_columns_
        for label, state in zip(fitted, self._fit_maps(problems)):
            self.maps_[label] = state
        self.identity_labels_ = [label for label in range(self.n_columns_) if label not in fitted]
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

    def _state_from_lists(self, arrays):
        """A map's state from the nested lists that :meth:`to_dict` wrote (the inverse of ``.tolist()``)."""
        return [np.asarray(a, dtype=np.float64) for a in arrays]

    def to_dict(self):
        """The fitted recalibrator as JSON-ready data: its name, parameters, task and every map's arrays.

        Floats are stored as Python floats, which JSON writes with round-trip precision, so
        :func:`recalibrator_from_dict` restores the exact same map.
        """
        check_is_fitted(self)
        name = next(n for n, cls in RECALIBRATORS.items() if type(self) is cls)
        return {"format": MAP_FORMAT, "method": name, "params": self.get_params(), "task": self.task_,
                "n_columns": self.n_columns_, "identity_labels": list(self.identity_labels_),
                "maps": [None if state is None else [np.asarray(a, dtype=np.float64).tolist() for a in state]
                         for state in self.maps_]}

    @classmethod
    def from_dict(cls, data):
        """Restore a recalibrator of this class from :meth:`to_dict` data (``ValueError`` if malformed)."""
        try:
            if data["format"] != MAP_FORMAT or RECALIBRATORS.get(data["method"]) is not cls:
                raise ValueError(f"expected format {MAP_FORMAT!r} and method of {cls.__name__}, "
                                 f"got {data['format']!r} and {data['method']!r}")
            self = cls(**data["params"])
            self.task_, self.n_columns_ = data["task"], int(data["n_columns"])
            self.identity_labels_ = [int(j) for j in data["identity_labels"]]
            self.maps_ = [None if state is None else self._state_from_lists(state) for state in data["maps"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a saved recalibrator: missing or bad entry {exc}") from None
        expected = 1 if self.task_ == "multiclass" else self.n_columns_
        if self.task_ not in TASKS or len(self.maps_) != expected:
            raise ValueError(f"not a saved recalibrator: task {self.task_!r} with {len(self.maps_)} maps")
        return self


class _LogLinearScaling(_Recalibrator):
    """``softmax(A(log p))`` with a parametric map A, fitted by L-BFGS on mean NLL plus a penalty.

    One map (a multi-class fit) is fitted by ``torch.optim.LBFGS`` with a strong Wolfe line search.
    The labels of a multi-label fit are fitted at once by :func:`crsrepro.fit.lbfgs.batched_lbfgs`, one
    history, step and stopping test per label, with every loss evaluation batched over the labels still
    running **[ours]**: the labels are padded to the longest one and a padded row carries no weight.
    The batched solver's backtracking (Armijo) line search converges on these two-class maps, and is
    3-5x faster on the demo's CheXpert val splits (``benchmarks/recalibration.py``); on a multi-class
    Dirichlet map (K^2 + K parameters on log-probabilities down to log 1e-12) it left a gradient of
    5e-4 after 200 iterations, where the strong Wolfe search converges.

    A subclass implements ``_init_params(K) -> list of arrays`` (the identity map) and
    ``_logits(params, log_p) -> Tensor`` on a leading problem axis (``params[i]`` of shape (P, ...),
    ``log_p`` (P, n, K)), and may override ``_penalty(params) -> Tensor (P,)``.
    """

    max_iter = 200  # L-BFGS iterations of the calibration fit [ours]
    tol = 1e-9  # the gradient tolerance of the calibration fit (largest absolute entry) [ours]

    def _penalty(self, params):
        return torch.zeros(params[0].shape[0], dtype=torch.float64)

    def _losses(self, params, log_p, targets, weight):
        """Each problem's weighted mean NLL plus its penalty, shape (P,)."""
        log_q = torch.log_softmax(self._logits(params, log_p), dim=2)
        return -(log_q.gather(2, targets[..., None])[..., 0] * weight).sum(1) + self._penalty(params)

    def _padded(self, problems):
        """``log p`` (P, n, K), targets (P, n) and row weights (P, n) of the problems, padded to the longest
        one: a problem's rows weigh ``1 / its length``, a padded row 0."""
        longest = max(len(y) for _, y in problems)
        log_p = torch.zeros(len(problems), longest, problems[0][0].shape[1], dtype=torch.float64)
        targets = torch.zeros(len(problems), longest, dtype=torch.long)
        weight = torch.zeros(len(problems), longest, dtype=torch.float64)
        for i, (probs, y) in enumerate(problems):
            log_p[i, :len(y)] = torch.as_tensor(np.log(np.clip(probs, LOG_FLOOR, 1)))
            targets[i, :len(y)] = torch.as_tensor(y)
            weight[i, :len(y)] = 1.0 / len(y)
        return log_p, targets, weight

    def _start(self, n_classes):
        return [np.asarray(p, dtype=np.float64) for p in self._init_params(n_classes)]

    def _fit_strong_wolfe(self, start, log_p, targets, weight):
        """One problem (a leading axis of 1) by ``torch.optim.LBFGS`` with a strong Wolfe line search."""
        params = [torch.tensor(p[None], requires_grad=True) for p in start]
        optimizer = torch.optim.LBFGS(params, max_iter=self.max_iter, line_search_fn="strong_wolfe",
                                      tolerance_grad=self.tol, tolerance_change=1e-12)

        def closure():
            optimizer.zero_grad()
            loss = self._losses(params, log_p, targets, weight)[0]
            loss.backward()
            return loss

        optimizer.step(closure)
        return [part.detach()[0] for part in params]

    def _fit_maps(self, problems):
        if not problems:
            return []
        start = self._start(problems[0][0].shape[1])
        log_p, targets, weight = self._padded(problems)
        if self.task_ == "multiclass":
            return [self._fit_strong_wolfe(start, log_p, targets, weight)]
        shapes, sizes = [p.shape for p in start], [p.size for p in start]

        def unflatten(theta):
            return [part.reshape(len(theta), *shape) for part, shape in zip(theta.split(sizes, dim=1), shapes)]

        def objective(theta, index):
            theta = theta.detach().requires_grad_(True)
            losses = self._losses(unflatten(theta), log_p[index], targets[index], weight[index])
            (grad,) = torch.autograd.grad(losses.sum(), theta)
            return losses.detach(), grad

        theta = torch.as_tensor(np.tile(np.concatenate([p.ravel() for p in start]), (len(problems), 1)))
        theta, _, converged, _ = batched_lbfgs(objective, theta, max_iter=self.max_iter, tol=self.tol)
        if not converged.all():
            logger.info("%s: %d of %d label maps stopped before the gradient tolerance", type(self).__name__,
                        int((~converged).sum()), len(problems))
        return [[part[0] for part in unflatten(theta[i:i + 1])] for i in range(len(problems))]

    def _state_from_lists(self, arrays):
        return [torch.tensor(a, dtype=torch.float64) for a in arrays]

    def _apply_map(self, state, probs):
        with torch.no_grad():
            log_p = torch.as_tensor(np.log(np.clip(probs, LOG_FLOOR, 1)))
            logits = self._logits([part[None] for part in state], log_p[None])[0]
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
        return log_p * torch.exp(-params[0])[:, None, None]

    @property
    def temperature_(self):
        check_is_fitted(self)
        temperatures = [np.nan if state is None else float(torch.exp(state[0])) for state in self.maps_]
        return temperatures[0] if self.task_ == "multiclass" else np.array(temperatures)


class VectorScaling(_LogLinearScaling):
    """Vector scaling: ``softmax(w * log p + b)`` with a weight and an intercept per class."""

    def _init_params(self, n_classes):
        return [np.ones(n_classes), np.zeros(n_classes)]

    def _logits(self, params, log_p):
        return log_p * params[0][:, None, :] + params[1][:, None, :]


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
        return log_p @ params[0].transpose(1, 2) + params[1][:, None, :]

    def _penalty(self, params):
        W, b = params
        k = W.shape[1]
        off_diagonal = W - torch.diag_embed(torch.diagonal(W, dim1=1, dim2=2))
        return (self.reg_lambda * (off_diagonal**2).sum((1, 2)) / (k * (k - 1))
                + self.reg_mu * (b**2).sum(1) / k)


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

    def _fit_maps(self, problems):
        if not 0 <= self.tie_break < 1:
            raise ValueError(f"tie_break must lie in [0, 1), got {self.tie_break!r}")
        return [self._fit_map(probs, y) for probs, y in problems]

    def _fit_map(self, probs, y):
        """Per class, the isotonic step function's thresholds ``[x_0..x_m, y_0..y_m]`` (2 arrays each)."""
        state = []
        for k in range(probs.shape[1]):
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(probs[:, k], y == k)
            state += [iso.X_thresholds_.astype(np.float64), iso.y_thresholds_.astype(np.float64)]
        return state

    def _apply_map(self, state, probs):
        # np.interp holds the end values outside the thresholds: IsotonicRegression's out_of_bounds="clip"
        mapped = np.column_stack([np.interp(probs[:, k], state[2 * k], state[2 * k + 1])
                                  for k in range(probs.shape[1])])
        mixed = (1 - self.tie_break) * mapped + self.tie_break * probs
        return mixed / mixed.sum(axis=1, keepdims=True)


#: The recalibrators by name: the names of :data:`crsrepro.core.vocab.RECALIBRATORS`, in its order.
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


def recalibrator_from_dict(data):
    """Restore a fitted recalibrator from :meth:`~_Recalibrator.to_dict` data, whichever its method.

    Examples
    --------
    >>> probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    >>> fitted = make_recalibrator("temperature").fit(probs, [0, 1, 1, 0])
    >>> restored = recalibrator_from_dict(fitted.to_dict())
    >>> bool(np.all(restored.predict_proba(probs) == fitted.predict_proba(probs)))
    True
    """
    method = data.get("method") if isinstance(data, dict) else None
    if method not in RECALIBRATORS:
        raise ValueError(f"not a saved recalibrator: method {method!r} is not one of {', '.join(RECALIBRATORS)}")
    return RECALIBRATORS[method].from_dict(data)


# ----------------------------------------------------------------------------------------------
# Choosing a method inside the calibration subset (beyond the paper, DESIGN.md section 14)

#: The fewest cases one cross-validation fold may hold **[ours]**.
MIN_FOLD_CASES = 10


def _cross_validation_folds(labels, task, n_folds, seed):
    """Stratified folds by class id (multi-class) or shuffled folds (multi-label), with the size checks.

    Multi-label folds are not stratified **[ours]**: stratifying 14 labels jointly needs iterative
    stratification, and a label left with a single class in a training part is kept as it is by the
    recalibrators.
    """
    if isinstance(n_folds, bool) or not isinstance(n_folds, (int, np.integer)) or n_folds < 2:
        raise ValueError(f"n_folds must be an integer >= 2, got {n_folds!r}")
    n = len(labels)
    if n // n_folds < MIN_FOLD_CASES:
        raise TooFewCasesError(f"{n} calibration cases give {n_folds} folds of {n // n_folds}; cross-validation "
                               f"needs at least {MIN_FOLD_CASES} per fold, so {MIN_FOLD_CASES * n_folds} cases")
    if task == "multilabel":
        return list(KFold(n_folds, shuffle=True, random_state=seed).split(labels))
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() < n_folds:
        raise TooFewCasesError(f"class {int(classes[counts.argmin()])} has {int(counts.min())} calibration cases; "
                               f"{n_folds}-fold stratified cross-validation needs at least {n_folds} of every "
                               f"class present")
    return list(StratifiedKFold(n_folds, shuffle=True, random_state=seed).split(np.zeros(n), labels))


def cross_validated_ece(probs, labels, *, methods=tuple(RECALIBRATORS), task,
                        n_folds=5, seed=0):
    """ECE of k-fold cross-fitted recalibrated probabilities inside a calibration subset.

    The subset is split into ``n_folds`` folds (stratified by class for multi-class labels); each
    method is fitted on k - 1 folds and predicts the held-out fold, and the ECE
    (:func:`crsrepro.core.metrics.expected_calibration_error`, 15 bins) is computed once on the pooled
    held-out predictions. Every method sees the same folds. ``"none"`` is the ECE of ``probs`` as
    they are.

    Parameters
    ----------
    probs : array of shape (N, K) or (N, L)
        Probabilities (multi-class rows sum to 1).
    labels : array of shape (N,) (class ids) or (N, L) (0/1/NaN)
        Their shape must agree with ``task``.
    methods : sequence of str
        Names among :data:`RECALIBRATORS`.
    task : {"multiclass", "multilabel"}
    n_folds : int, default 5 **[ours]**
    seed : int, default 0
        Seeds the fold assignment; the fits are deterministic, so a seed gives the same numbers.

    Returns
    -------
    dict[str, float]
        ``{"none": ece, method: ece, ...}``.

    Raises
    ------
    TooFewCasesError
        If a fold would hold fewer than :data:`MIN_FOLD_CASES` cases, or (multi-class) a class present
        has fewer than ``n_folds`` cases.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p1 = rng.uniform(size=400); y = (rng.uniform(size=400) < p1).astype(int)
    >>> sharp = np.column_stack([1 - p1, p1]) ** 3; sharp /= sharp.sum(axis=1, keepdims=True)
    >>> scores = cross_validated_ece(sharp, y, methods=("temperature",), task="multiclass")
    >>> scores["temperature"] < scores["none"]
    True
    """
    probs = np.asarray(probs, dtype=np.float64)
    labels, read_task = _check_labels(labels, probs)
    if read_task != task:
        raise ValueError(f"task is {task!r} but the labels' shape {labels.shape} means {read_task!r}")
    probs = _check_probs(probs, task=task)
    unknown = [m for m in methods if m not in RECALIBRATORS]
    if unknown or not methods:
        raise ValueError(f"methods must be names among {', '.join(RECALIBRATORS)}, got {list(methods)!r}")
    folds = _cross_validation_folds(labels, task, n_folds, seed)
    scores = {"none": expected_calibration_error(labels, probs, task=task)}
    for method in methods:
        held_out = np.empty_like(probs)
        for train, test in folds:
            held_out[test] = make_recalibrator(method).fit(probs[train], labels[train]).predict_proba(probs[test])
        scores[method] = expected_calibration_error(labels, held_out, task=task)
    return scores


def select_recalibrator(probs, labels, *, methods=tuple(RECALIBRATORS), task,
                        n_folds=5, seed=0, return_scores=False):
    """The method of lowest :func:`cross_validated_ece` (ties go to the earlier one in ``methods``).

    ``"none"`` is not a candidate: the caller asked for a recalibrator. Compare with
    ``scores["none"]`` (``return_scores=True``) to see whether recalibrating helps at all.

    Parameters are those of :func:`cross_validated_ece`; with ``return_scores=True`` the return
    value is ``(name, scores)``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p1 = rng.uniform(size=400); y = (rng.uniform(size=400) < p1).astype(int)
    >>> select_recalibrator(np.column_stack([1 - p1, p1]), y, methods=("temperature", "vector"),
    ...                     task="multiclass") in ("temperature", "vector")
    True
    """
    scores = cross_validated_ece(probs, labels, methods=methods, task=task, n_folds=n_folds, seed=seed)
    best = min(methods, key=scores.__getitem__)
    return (best, scores) if return_scores else best
