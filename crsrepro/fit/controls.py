"""The two control probes: a two-layer perceptron and k nearest neighbours (DESIGN.md section 7).

They show that the conclusions do not hinge on the classifier: :class:`MLPProbe` (two layers, fixed
budget, early stopping on validation loss) and :class:`KNNProbe` (k = 5, cosine). Both run on every
fraction and condition, as the linear probe (:mod:`crsrepro.fit.linear`) does, and follow the same
estimator contract, input checks and standardisation (:class:`crsrepro.fit.linear.StandardizedProbe`).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from sklearn.neighbors import NearestNeighbors

from crsrepro.fit.linear import (StandardizedProbe, check_features, check_fit_inputs, check_labels, check_time_cap,
                                 count_classes)


class MLPProbe(StandardizedProbe):
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
        """Train with early stopping on (X_val, y_val); parameters as in :meth:`crsrepro.fit.linear.LinearProbe.fit`."""
        start = time.perf_counter()
        X, y, X_val, y_val = check_fit_inputs(self.task, X, y, X_val, y_val)
        check_time_cap(self.time_cap_s)
        self._set_standardization(X, standardize_with)
        self.n_classes_ = count_classes(y, y_val) if self.task == "multiclass" else y.shape[1]
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


class KNNProbe(StandardizedProbe):
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
        X = check_features(X, "X")
        y = check_labels(y, X.shape[0], self.task, "y")
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
