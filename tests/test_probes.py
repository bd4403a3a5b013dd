"""Tests for the probes (crsrepro.fit.linear, .controls, .lbfgs): the torch backend agrees with scikit-learn; the
estimator contract holds."""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from crsrepro.core.metrics import macro_auroc
from crsrepro.fit.controls import KNNProbe, MLPProbe
from crsrepro.fit.lbfgs import batched_lbfgs
from crsrepro.fit.linear import FINISH_FACTOR, LinearProbe, choose_c, fit_linear_probes, log_loss

SMALL_GRID = (1e-2, 1.0, 1e2)


def _world(task, *, n=600, d=12, n_out=4, seed=0):
    """Well-conditioned Gaussian features with a linear signal; 10 % of multi-label entries NaN."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 2, size=d) + rng.normal(size=d)
    W = rng.normal(size=(d, n_out))
    if task == "multiclass":
        y = (X @ W / 2 + rng.gumbel(size=(n, n_out))).argmax(1)
    else:
        y = (X @ W / 2 + rng.logistic(size=(n, n_out)) > 0).astype(float)
        y[rng.uniform(size=y.shape) < 0.1] = np.nan
    return X[: n // 2], y[: n // 2], X[n // 2 :], y[n // 2 :]


@pytest.mark.parametrize("task, n_out", [("multiclass", 4), ("multiclass", 2), ("multilabel", 3)])
def test_torch_backend_agrees_with_sklearn(task, n_out):
    X, y, X_val, y_val = _world(task, n_out=n_out)
    fitted = {
        backend: LinearProbe(task=task, c_grid=SMALL_GRID, backend=backend, max_iter=1000, tol=1e-6).fit(
            X, y, X_val=X_val, y_val=y_val)
        for backend in ("sklearn", "torch")
    }
    reference, batched = fitted["sklearn"], fitted["torch"]
    assert reference.converged_ and batched.converged_
    assert batched.C_ == reference.C_
    np.testing.assert_allclose(batched.val_auroc_, reference.val_auroc_, atol=1e-4)
    np.testing.assert_allclose(batched.predict_proba(X_val), reference.predict_proba(X_val), atol=1e-3)
    probs = batched.predict_proba(X_val)
    assert probs.shape == (X_val.shape[0], n_out)
    if task == "multiclass":
        np.testing.assert_allclose(probs.sum(axis=1), 1.0)


def test_probe_learns_and_standardises_with_the_given_features():
    X, y, X_val, y_val = _world("multiclass")
    full = np.vstack([X, X_val + 3.0])
    probe = LinearProbe(task="multiclass", c_grid=SMALL_GRID).fit(X, y, X_val=X_val, y_val=y_val, standardize_with=full)
    np.testing.assert_allclose(probe.mean_, full.mean(axis=0))
    assert probe.C_ == SMALL_GRID[int(np.nanargmax(probe.val_auroc_))]
    assert macro_auroc(y_val, probe.predict_proba(X_val), task="multiclass") > 0.8
    assert probe.fit_seconds_ > 0 and not probe.hit_time_cap_


def test_nan_labels_are_left_out_of_the_loss():
    X, y, X_val, y_val = _world("multilabel", n_out=2)
    seen = ~np.isnan(y[:, 0])
    masked = LinearProbe(task="multilabel", c_grid=(1.0,), backend="torch", tol=1e-7, max_iter=500).fit(
        X, y[:, :1], X_val=X_val, y_val=y_val[:, :1], standardize_with=X)
    dropped = LinearProbe(task="multilabel", c_grid=(1.0,), backend="torch", tol=1e-7, max_iter=500).fit(
        X[seen], y[seen, :1], X_val=X_val, y_val=y_val[:, :1], standardize_with=X)
    np.testing.assert_allclose(masked.coef_, dropped.coef_, atol=1e-5)


@pytest.mark.parametrize("backend", ["sklearn", "torch"])
def test_fit_linear_probes_fits_each_subset_with_full_train_standardisation(backend):
    X, y, X_val, y_val = _world("multiclass", n=800)
    subsets = {0.25: np.arange(100), 1.0: np.arange(X.shape[0])}
    probes = fit_linear_probes(X, y, subsets, X_val, y_val, task="multiclass", c_grid=SMALL_GRID, backend=backend,
                               max_iter=500, progress=False)
    assert sorted(probes) == [0.25, 1.0]
    single = LinearProbe(task="multiclass", c_grid=SMALL_GRID, backend=backend, max_iter=500).fit(
        X[:100], y[:100], X_val=X_val, y_val=y_val, standardize_with=X)
    np.testing.assert_allclose(probes[0.25].predict_proba(X_val), single.predict_proba(X_val), atol=1e-6)
    np.testing.assert_allclose(probes[0.25].mean_, X.mean(axis=0))
    with pytest.raises(ValueError, match="subsets"):
        fit_linear_probes(X, y, {0.1: np.array([10_000])}, X_val, y_val, task="multiclass", progress=False)


@pytest.mark.parametrize("task, n_out", [("multiclass", 4), ("multiclass", 2), ("multilabel", 3)])
def test_masked_solve_agrees_with_the_per_fraction_solve(task, n_out):
    X, y, X_val, y_val = _world(task, n=800, n_out=n_out)
    subsets = {0.1: np.arange(40), 0.5: np.arange(200), 1.0: np.arange(X.shape[0])}
    val_subsets = {0.1: np.arange(100), 0.5: np.arange(200), 1.0: np.arange(X_val.shape[0])}
    fits = {solve: fit_linear_probes(X, y, subsets, X_val, y_val, task=task, c_grid=SMALL_GRID, max_iter=500,
                                     val_subsets=val_subsets, solve=solve, progress=False)
            for solve in ("per_fraction", "masked")}
    for fraction in subsets:
        masked, alone = fits["masked"][fraction], fits["per_fraction"][fraction]
        assert masked.C_ == alone.C_ and masked.converged_ and alone.converged_
        np.testing.assert_array_equal(masked.n_iter_by_c_, alone.n_iter_by_c_)
        np.testing.assert_allclose(masked.val_auroc_, alone.val_auroc_, atol=1e-6)
        np.testing.assert_allclose(masked.predict_proba(X_val), alone.predict_proba(X_val), atol=1e-6)
    # a fraction whose rows lack the top class has fewer classes: it is solved in its own group
    small = {0.1: np.flatnonzero(y != y.max())[:60], 1.0: np.arange(X.shape[0])} if task == "multiclass" else None
    if small is not None and n_out > 2:
        val_small = {0.1: np.flatnonzero(y_val != y.max()), 1.0: np.arange(X_val.shape[0])}
        a, b = (fit_linear_probes(X, y, small, X_val, y_val, task=task, c_grid=SMALL_GRID, max_iter=500,
                                  val_subsets=val_small, solve=solve, progress=False)
                for solve in ("masked", "per_fraction"))
        assert a[0.1].n_classes_ == n_out - 1 == b[0.1].n_classes_
        np.testing.assert_allclose(a[0.1].predict_proba(X_val), b[0.1].predict_proba(X_val), atol=1e-6)
    with pytest.raises(ValueError, match="solve"):
        fit_linear_probes(X, y, subsets, X_val, y_val, task=task, backend="sklearn", solve="masked", progress=False)


@pytest.mark.parametrize("backend", ["sklearn", "torch"])
def test_time_cap_and_iteration_budget_are_recorded(backend):
    X, y, X_val, y_val = _world("multiclass")
    capped = LinearProbe(task="multiclass", c_grid=SMALL_GRID, backend=backend, time_cap_s=1e-9).fit(
        X, y, X_val=X_val, y_val=y_val)
    assert capped.hit_time_cap_
    short = LinearProbe(task="multiclass", c_grid=(1e2,), backend=backend, max_iter=1).fit(X, y, X_val=X_val, y_val=y_val)
    assert short.n_iter_ <= FINISH_FACTOR * 1
    assert short.converged_ or short.n_iter_ >= FINISH_FACTOR - 1


def test_the_chosen_c_finishes_converging_and_the_others_keep_the_budget():
    X, y, X_val, y_val = _world("multiclass")
    probe = LinearProbe(task="multiclass", c_grid=(1e-4, 1e2), backend="torch", max_iter=5).fit(
        X, y, X_val=X_val, y_val=y_val)
    chosen = list(probe.c_grid).index(probe.C_)
    assert probe.converged_ and 5 < probe.n_iter_ <= FINISH_FACTOR * 5
    assert probe.n_iter_by_c_[1 - chosen] <= 5


def test_sklearn_backend_under_time_cap_scores_only_the_fitted_c_values():
    X, y, X_val, y_val = _world("multiclass")
    capped = LinearProbe(task="multiclass", c_grid=SMALL_GRID, backend="sklearn", time_cap_s=1e-9).fit(
        X, y, X_val=X_val, y_val=y_val)
    assert np.isfinite(capped.val_auroc_[0]) and np.all(np.isnan(capped.val_auroc_[1:]))
    assert capped.C_ == SMALL_GRID[0]
    assert capped.n_iter_by_c_[0] > 0 and capped.n_iter_by_c_[1:].tolist() == [0, 0]
    assert not capped.converged_by_c_[1:].any()


def test_batched_lbfgs_solves_independent_quadratics():
    # f_p(x) = 0.5 x'A_p x - b_p'x with different conditioning per problem
    torch.manual_seed(0)
    A = torch.stack([torch.diag(torch.logspace(0, k, 6, dtype=torch.float64)) for k in (0, 1, 2, 3)])
    b = torch.randn(4, 6, dtype=torch.float64)

    def objective(theta, index):
        Ax = torch.einsum("pij,pj->pi", A[index], theta)
        return 0.5 * (theta * Ax).sum(1) - (b[index] * theta).sum(1), Ax - b[index]

    theta, n_iter, converged, hit_cap = batched_lbfgs(objective, torch.zeros(4, 6, dtype=torch.float64),
                                                      max_iter=200, tol=1e-7)
    assert converged.all() and not hit_cap
    expected = torch.linalg.solve(A, b.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(theta, expected, atol=1e-6, rtol=0)
    assert n_iter[0] < n_iter[3]  # the better-conditioned problem stops first


def test_linear_probe_rejects_bad_input_and_is_a_sklearn_estimator():
    X, y, X_val, y_val = _world("multiclass")
    probe = LinearProbe(task="multiclass", c_grid=SMALL_GRID)
    assert clone(probe).get_params()["c_grid"] == SMALL_GRID
    with pytest.raises(NotFittedError):
        probe.predict_proba(X)
    with pytest.raises(ValueError, match="classes \\[3\\]"):
        probe.fit(X[y < 3], y[y < 3], X_val=X_val, y_val=y_val)
    with pytest.raises(ValueError, match="backend"):
        LinearProbe(task="multiclass", backend="jax").fit(X, y, X_val=X_val, y_val=y_val)
    with pytest.raises(ValueError, match="features"):
        probe.fit(X, y, X_val=X_val[:, :3], y_val=y_val)
    with pytest.raises(ValueError, match="task"):
        LinearProbe(task="binary").fit(X, y, X_val=X_val, y_val=y_val)
    probe.fit(X, y, X_val=X_val, y_val=y_val)
    with pytest.raises(ValueError, match="fitted on"):
        probe.predict_proba(X[:, :3])


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_mlp_probe_learns_with_early_stopping(task):
    X, y, X_val, y_val = _world(task, n=800, n_out=3)
    params = dict(task=task, hidden=32, lr=1e-2, max_epochs=40, patience=5)
    mlp = MLPProbe(**params).fit(X, y, X_val=X_val, y_val=y_val)
    probs = mlp.predict_proba(X_val)
    assert probs.shape == (X_val.shape[0], 3)
    linear = LinearProbe(task=task).fit(X, y, X_val=X_val, y_val=y_val).predict_proba(X_val)
    assert macro_auroc(y_val, probs, task=task) > macro_auroc(y_val, linear, task=task) - 0.05
    assert 1 <= mlp.best_epoch_ <= mlp.n_epochs_ <= 40
    again = MLPProbe(**params).fit(X, y, X_val=X_val, y_val=y_val)
    np.testing.assert_allclose(again.predict_proba(X_val), probs, atol=1e-6)  # seeded


def test_mlp_probe_time_cap():
    X, y, X_val, y_val = _world("multiclass")
    mlp = MLPProbe(task="multiclass", hidden=8, max_epochs=50, time_cap_s=1e-9).fit(X, y, X_val=X_val, y_val=y_val)
    assert mlp.hit_time_cap_ and mlp.n_epochs_ == 1


def test_knn_probe_votes_and_masks_nan_labels():
    X = np.array([[1.0, 0.0], [0.9, 0.1], [0.8, 0.3], [0.0, 1.0], [0.1, 0.9]])
    knn = KNNProbe(task="multiclass", k=3).fit(X, [0, 0, 1, 1, 1])
    np.testing.assert_allclose(knn.predict_proba(np.array([[1.0, 0.05]])), [[2 / 3, 1 / 3]])
    y = np.array([[1, np.nan], [0, np.nan], [1, 1], [0, 0], [0, 1]])
    knn = KNNProbe(task="multilabel", k=2).fit(X, y)
    # neighbours of (1, 0.05) are rows 0 and 1: label 0 votes 1 and 0; label 1 has no vote -> prevalence 2/3
    np.testing.assert_allclose(knn.predict_proba(np.array([[1.0, 0.05]])), [[0.5, 2 / 3]])
    with pytest.raises(ValueError, match="k must be"):
        KNNProbe(task="multiclass", k=10).fit(X, [0, 0, 1, 1, 1])


def test_a_tie_in_val_auroc_goes_to_the_lower_log_loss_not_to_grid_order():
    assert choose_c([0.9, 0.9, 0.8], [0.6, 0.4, 0.3]) == (1, True)
    assert choose_c([0.9, 0.9, 0.8], [0.3, 0.4, 0.1]) == (0, True)
    assert choose_c([0.8, 0.9, np.nan], [0.1, 0.5, np.nan]) == (1, False)
    # a val split the probe separates perfectly at every C: AUROC ties at 1, the log-loss decides
    X, y, _, _ = _world("multiclass", n_out=2, n=400)
    X_val = np.array([[8.0] * 12, [-8.0] * 12] * 6) * np.sign(np.linalg.lstsq(X, y - 0.5, rcond=None)[0])
    y_val = np.array([1, 0] * 6)
    probe = LinearProbe(task="multiclass", c_grid=(1e-4, 1e-2, 1.0), backend="torch", min_val_cases=1).fit(
        X, y, X_val=X_val, y_val=y_val)
    assert probe.c_rule_ == "val" and np.all(probe.val_auroc_ == 1.0)
    assert probe.c_tie_ and probe.C_ == probe.c_grid[int(np.argmin(probe.val_log_loss_))]


def test_c_is_cross_validated_inside_the_labelled_subset_below_the_minimum_val_cases():
    X, y, X_val, y_val = _world("multiclass", n_out=3)
    few = np.concatenate([np.flatnonzero(y_val == k)[:3] for k in range(3)])  # 3 val cases per class
    small = LinearProbe(task="multiclass", c_grid=(1e-3, 1.0), backend="torch").fit(
        X[:60], y[:60], X_val=X_val[few], y_val=y_val[few])
    enough = LinearProbe(task="multiclass", c_grid=(1e-3, 1.0), backend="torch", min_val_cases=3).fit(
        X[:60], y[:60], X_val=X_val[few], y_val=y_val[few])
    assert small.c_rule_ == "cv" and enough.c_rule_ == "val"
    # the CV scores are out-of-fold over the 60 + 9 labelled cases: recompute one by hand
    from sklearn.model_selection import StratifiedKFold
    Z = np.concatenate([(X[:60] - small.mean_) / small.scale_, (X_val[few] - small.mean_) / small.scale_])
    labels = np.concatenate([y[:60], y_val[few]])
    out = np.empty((len(labels), 3))
    for fit_rows, held in StratifiedKFold(5, shuffle=True, random_state=0).split(Z, labels):
        ref = LinearProbe(task="multiclass", c_grid=(1e-3,), backend="sklearn", max_iter=1000, tol=1e-8).fit(
            Z[fit_rows], labels[fit_rows], X_val=Z[held], y_val=labels[held],
            standardize_with=np.array([[-1.0] * 12, [1.0] * 12]))  # mean 0, scale 1: Z as it is
        out[held] = ref.predict_proba(Z[held])
    assert small.val_log_loss_[0] == pytest.approx(log_loss(labels, out, task="multiclass"), abs=1e-3)
    # the model kept is the one fitted on the training rows, at the chosen C
    full = LinearProbe(task="multiclass", c_grid=(small.C_,), backend="torch").fit(X[:60], y[:60], X_val=X_val, y_val=y_val)
    np.testing.assert_allclose(small.coef_, full.coef_, atol=1e-3)
