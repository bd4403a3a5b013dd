"""Tests for crsrepro.core.metrics: AUROC against scikit-learn, ECE against hand-computed cases."""

import logging

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from crsrepro.core.metrics import (
    aulc,
    binary_auroc,
    classwise_ece,
    expected_calibration_error,
    label_efficiency_retention,
    macro_auroc,
    reliability_curve,
    robustness_raw,
)


@pytest.fixture
def multiclass_scores():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=300)
    logits = rng.normal(size=(300, 4)) + 1.5 * np.eye(4)[y]
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return y, probs


def test_binary_auroc_matches_sklearn_with_ties():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=500)
    s = np.round(rng.normal(size=500) + y, 1)
    assert binary_auroc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_multiclass_macro_auroc_matches_sklearn_ovr(multiclass_scores):
    y, p = multiclass_scores
    expected = roc_auc_score(y, p, multi_class="ovr", average="macro")
    assert macro_auroc(y, p, task="multiclass") == pytest.approx(expected, abs=1e-12)


def test_multilabel_macro_auroc_masks_nan_and_skips_one_class_labels(caplog):
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, size=(200, 3)).astype(float)
    s = rng.normal(size=(200, 3)) + y
    y[:50, 0] = np.nan
    y[:, 2] = 0.0  # one class only: skipped
    expected = np.mean([roc_auc_score(y[50:, 0], s[50:, 0]), roc_auc_score(y[:, 1], s[:, 1])])
    with caplog.at_level(logging.WARNING, logger="crsrepro.core.metrics"):
        value, skipped = macro_auroc(y, s, task="multilabel", return_skipped=True)
    assert value == pytest.approx(expected, abs=1e-12)
    assert skipped == 1
    assert "1 of 3 labels" in caplog.text


def test_macro_auroc_all_skipped_is_nan():
    assert np.isnan(macro_auroc(np.zeros((3, 1)), np.ones((3, 1)) / 2, task="multilabel"))


@pytest.mark.parametrize(
    "y, s, task",
    [
        (np.array([0, 1]), np.ones((3, 2)), "multiclass"),  # row count
        (np.array([0, 5]), np.ones((2, 2)), "multiclass"),  # class id out of range
        (np.array([[0, 2]]), np.ones((1, 2)), "multilabel"),  # label value
        (np.array([0, 1]), np.ones(2), "multiclass"),  # 1-d scores
        (np.array([0, 1]), np.ones((2, 2)), "binary"),  # unknown task
    ],
)
def test_macro_auroc_rejects_bad_input(y, s, task):
    with pytest.raises(ValueError):
        macro_auroc(y, s, task=task)


def test_ece_hand_computed_multiclass():
    # bins of width 0.1: conf 0.95 (x2, one wrong) -> |0.5-0.95|; conf 0.55 (x2, both right) -> |1-0.55|
    p = np.array([[0.95, 0.05], [0.95, 0.05], [0.45, 0.55], [0.45, 0.55]])
    y = np.array([0, 1, 1, 1])
    assert expected_calibration_error(y, p, task="multiclass", n_bins=10) == pytest.approx(0.45)


def test_ece_bin_edges_are_right_closed():
    # conf exactly 0.6 belongs to (0.4, 0.6] with 5 bins, not (0.6, 0.8]; it joins 0.5 there
    p = np.array([[0.6, 0.4], [0.5, 0.5], [0.8, 0.2]])
    curve = reliability_curve(np.array([0, 1, 0]), p, task="multiclass", n_bins=5)
    assert curve.counts.tolist() == [0, 0, 2, 1, 0]
    assert curve.confidence[2] == pytest.approx(0.55)
    assert np.isnan(curve.accuracy[0]) and np.isnan(curve.accuracy[4])
    assert curve.bin_edges.shape == (6,)


def test_ece_hand_computed_multilabel_macro_over_labels():
    # label 0: p=0.8,y=1 and p=0.2,y=0 -> conf 0.8, both right -> ECE 0.2
    # label 1: p=0.7,y=0 (wrong, conf .7), NaN row masked -> ECE 0.7
    y = np.array([[1, 0], [0, np.nan]])
    p = np.array([[0.8, 0.7], [0.2, 0.9]])
    assert expected_calibration_error(y, p, task="multilabel") == pytest.approx((0.2 + 0.7) / 2)


def test_perfectly_calibrated_predictions_have_small_ece():
    rng = np.random.default_rng(3)
    p1 = rng.uniform(size=20000)
    y = (rng.uniform(size=20000) < p1).astype(int)
    p = np.column_stack([1 - p1, p1])
    assert expected_calibration_error(y, p, task="multiclass") < 0.02
    assert classwise_ece(y, p, task="multiclass") < 0.02


def test_classwise_ece_hand_computed():
    # class 0: p=.9 (y=1) err .1, p=.1 (y=0) err .1, p=.6 (y=0) err .6; class 1 mirrors -> 0.8/3
    p = np.array([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4]])
    assert classwise_ece(np.array([0, 1, 1]), p, task="multiclass", n_bins=5) == pytest.approx(0.8 / 3)
    # multi-label: label 1 has only a masked row and is left out
    y = np.array([[1, np.nan], [0, np.nan]])
    assert classwise_ece(y, np.array([[0.8, 0.5], [0.4, 0.5]]), task="multilabel") == pytest.approx(0.3)


def test_ece_rejects_non_probabilities_and_bad_bins():
    with pytest.raises(ValueError):
        expected_calibration_error(np.array([0]), np.array([[1.2, -0.2]]), task="multiclass")
    with pytest.raises(ValueError):
        expected_calibration_error(np.array([0]), np.array([[0.5, 0.5]]), task="multiclass", n_bins=0)


def test_label_efficiency_retention_and_aulc():
    curve = {0.01: 0.6, 0.05: 0.7, 0.10: 0.8, 0.25: 0.9, 1.0: 1.0}
    assert label_efficiency_retention(curve) == pytest.approx(0.75)
    assert aulc({0.01: 0.7, 1.0: 0.7}) == pytest.approx(0.7)  # a flat curve keeps its level
    # trapezoids over log10 f: [-2,-1] at (0.6+0.8)/2 and [-1,0] at 0.8, normalised by the range 2
    assert aulc({0.01: 0.6, 0.1: 0.8, 1.0: 0.8}) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        label_efficiency_retention({0.01: 0.6, 0.25: 0.8})  # no 1.0
    with pytest.raises(ValueError):
        aulc({1.0: 0.8})


def test_robustness_raw():
    assert robustness_raw([0.1, 0.1]) == pytest.approx(0.9)
    assert robustness_raw([0.0, 0.0, 0.3]) == pytest.approx(1 - (0.1 + 0.3) / 2)
    with pytest.raises(ValueError):
        robustness_raw([])
    with pytest.raises(ValueError):
        robustness_raw([0.1, np.nan])


def test_the_calibrated_ece_floor_shrinks_with_the_test_split_and_respects_the_label_mask():
    """A calibrated model's finite-sample ECE falls like 1/sqrt(N); masked labels are never drawn."""
    from crsrepro.core.metrics import calibrated_ece_floor

    rng = np.random.default_rng(0)
    small, large = (rng.dirichlet(np.ones(5), size=n) for n in (250, 25_000))
    floor_small = calibrated_ece_floor(np.zeros(250), small, task="multiclass")
    floor_large = calibrated_ece_floor(np.zeros(25_000), large, task="multiclass")
    assert floor_small > 5 * floor_large > 0
    probs = rng.uniform(0.05, 0.95, size=(300, 3))
    labels = np.zeros((300, 3))
    labels[:, 2] = np.nan  # a label with no unmasked rows is left out, as in expected_calibration_error
    masked = calibrated_ece_floor(labels, probs, task="multilabel")
    two_labels = calibrated_ece_floor(labels[:, :2], probs[:, :2], task="multilabel")
    assert masked == pytest.approx(two_labels, rel=0.5) and masked > 0
