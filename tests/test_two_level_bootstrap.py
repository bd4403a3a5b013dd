"""Tests of the two-level (seeds x test cases) bootstrap of D and C (DESIGN.md section 10)."""

import numpy as np
import pandas as pd
import pytest
import torch

from crsrepro.core.metrics import expected_calibration_error, macro_auroc
from crsrepro.score.stats import weighted_ece, case_paired_bootstrap, two_level_bootstrap


def multiclass_probs(n_seeds=3, n_cases=80, n_classes=3, encoders=("a", "b"), rng=0):
    rng = np.random.default_rng(rng)
    y = rng.integers(0, n_classes, n_cases)
    probs = {}
    for i, e in enumerate(encoders):
        logits = (1.0 + i) * np.eye(n_classes)[y] + rng.normal(0, 1, (n_seeds, n_cases, n_classes))
        p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        probs[e] = np.round(p, 2).astype(np.float16)  # rounding makes ties; float16 is the compact store
    return y, probs


def multilabel_probs(n_seeds=3, n_cases=80, n_labels=4, encoders=("a", "b"), rng=0):
    rng = np.random.default_rng(rng)
    y = (rng.random((n_cases, n_labels)) < 0.3).astype(float)
    y[rng.random(y.shape) < 0.2] = np.nan
    probs = {e: (0.2 + 0.3 * np.nan_to_num(y) * (1 + i) / 2 + 0.5 * rng.random((n_seeds, n_cases, n_labels))
                 ).clip(0, 1).astype(np.float16) for i, e in enumerate(encoders)}
    return y, probs


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_weighted_ece_is_metrics_ece_on_resampled_cases(task):
    rng = np.random.default_rng(1)
    y, probs = (multiclass_probs if task == "multiclass" else multilabel_probs)(n_seeds=1, n_cases=120, rng=2)
    p = probs["a"][0].astype(float)
    y_t = torch.as_tensor(np.asarray(y, float))
    y_t = y_t.long() if task == "multiclass" else y_t
    for _ in range(5):
        idx = rng.integers(0, len(y), len(y))
        counts = torch.as_tensor(np.bincount(idx, minlength=len(y))[None], dtype=torch.float64)
        got = float(weighted_ece(y_t, torch.as_tensor(p), counts, task=task, n_bins=15)[0])
        assert got == pytest.approx(expected_calibration_error(y[idx], p[idx], task=task), abs=1e-12)


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_identity_draw_matches_the_metrics(task):
    """Without case resampling and with the draw 'every seed once', a replicate is the package's D and C."""
    y, probs = (multiclass_probs if task == "multiclass" else multilabel_probs)(rng=3)
    result = two_level_bootstrap(y, probs, task=task, n_resamples=60, rng=0, resample_cases=False)
    for e, p in probs.items():
        assert result.auroc.estimate[e] == pytest.approx(np.mean([macro_auroc(y, q, task=task) for q in p]), abs=1e-12)
        assert result.ece.estimate[e] == pytest.approx(
            np.mean([expected_calibration_error(y, q, task=task) for q in p]), abs=1e-12)
    identity = (np.sort(np.random.default_rng(0).integers(0, 3, size=(60, 3)), 1) == [0, 1, 2]).all(1)
    assert identity.any()
    for metric in ("auroc", "ece"):
        boot = getattr(result, metric)
        np.testing.assert_allclose(boot.replicates[identity], np.tile(boot.estimate, (identity.sum(), 1)), atol=1e-12)


def test_seed_only_replicates_are_means_over_the_seed_paired_draw():
    """resample_cases=False: replicate r averages the per-seed metrics over seed_paired_bootstrap's draw r."""
    y, probs = multiclass_probs(n_seeds=4, rng=4)
    result = two_level_bootstrap(y, probs, task="multiclass", n_resamples=30, rng=5, resample_cases=False,
                                 batch_size=7)
    per_seed = {e: np.array([macro_auroc(y, q, task="multiclass") for q in p]) for e, p in probs.items()}
    draws = np.random.default_rng(5).integers(0, 4, size=(30, 4))
    for e in probs:
        np.testing.assert_allclose(result.auroc.replicates[e], per_seed[e][draws].mean(1), atol=1e-12)


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_one_seed_is_the_case_level_bootstrap(task):
    y, probs = (multiclass_probs if task == "multiclass" else multilabel_probs)(n_seeds=1, rng=6)
    two = two_level_bootstrap(y, probs, task=task, n_resamples=40, rng=9, batch_size=16)
    case = case_paired_bootstrap(y, {e: p[0].astype(float) for e, p in probs.items()}, task=task, n_resamples=40,
                                 rng=9, batch_size=16, progress=False)
    np.testing.assert_allclose(two.auroc.replicates, case.replicates, atol=1e-12)
    draws = np.random.default_rng(9)
    for start in range(0, 40, 16):  # the same case draws, batch by batch; ECE on them is metrics' ECE
        b = min(16, 40 - start)
        idx = draws.integers(0, len(y), size=(b, len(y)))
        for r in range(b):
            expected = expected_calibration_error(y[idx[r]], probs["b"][0][idx[r]].astype(float), task=task)
            assert two.ece.replicates["b"].iloc[start + r] == pytest.approx(expected, abs=1e-12)


def test_two_level_intervals_are_wider_than_seed_only_and_paired():
    y, probs = multiclass_probs(n_seeds=5, n_cases=120, rng=7)
    probs["a_copy"] = probs["a"].copy()
    both = two_level_bootstrap(y, probs, task="multiclass", n_resamples=200, rng=0).summary()
    seeds = two_level_bootstrap(y, probs, task="multiclass", n_resamples=200, rng=0, resample_cases=False).summary()
    assert list(both.columns) == ["auroc", "auroc_ci_low", "auroc_ci_high", "auroc_plug_in",
                                  "ece", "ece_ci_low", "ece_ci_high", "ece_plug_in"]
    for metric in ("auroc", "ece"):  # every interval holds its estimate (the ECE's is bias-corrected)
        assert ((both[f"{metric}_ci_low"] <= both[metric]) & (both[metric] <= both[f"{metric}_ci_high"])).all()
    for metric in ("auroc", "ece"):  # test-set noise widens both intervals of every encoder
        assert ((both[f"{metric}_ci_high"] - both[f"{metric}_ci_low"])
                > (seeds[f"{metric}_ci_high"] - seeds[f"{metric}_ci_low"])).all()
    pd.testing.assert_series_equal(both["auroc"], seeds["auroc"])  # one point estimate, the plug-in
    assert (both["ece"] < both["ece_plug_in"]).all()  # resampled cases inflate a binned ECE: corrected down
    paired = two_level_bootstrap(y, probs, task="multiclass", n_resamples=50, rng=0)
    assert paired.auroc.paired_diff_ci("a", "a_copy").ci_high == 0.0  # the same draws for every encoder


def test_two_level_bad_input():
    y, probs = multiclass_probs()
    with pytest.raises(ValueError, match="at least one encoder"):
        two_level_bootstrap(y, {}, task="multiclass")
    with pytest.raises(ValueError, match=r"probs\['a'\] has shape \(80, 3\), expected \(seeds, 80 cases"):
        two_level_bootstrap(y, {"a": probs["a"][0]}, task="multiclass")
    with pytest.raises(ValueError, match="same seeds and cases"):
        two_level_bootstrap(y, {"a": probs["a"], "b": probs["b"][:2]}, task="multiclass")
