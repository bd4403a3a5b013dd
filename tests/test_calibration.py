"""Tests for crsrepro.fit.calibration: every recalibrator fixes an over-confident classifier."""

import numpy as np
import pytest
from scipy.special import expit, softmax
from sklearn.exceptions import NotFittedError

import json

from crsrepro.fit.calibration import (RECALIBRATORS, TooFewCasesError, cross_validated_ece, make_recalibrator,
                                  recalibrator_from_dict, select_recalibrator)
from crsrepro.core import vocab
from crsrepro.core.metrics import expected_calibration_error, macro_auroc

SHARPNESS = 3.0  # the over-confident classifier multiplies the true logits by this


def _overconfident(task, n, rng):
    """Labels drawn from true probabilities; predictions from logits scaled by SHARPNESS."""
    if task == "multiclass":
        z = rng.normal(size=(n, 5)) * 1.5
        cumulative = softmax(z, axis=1).cumsum(axis=1)
        y = (rng.uniform(size=(n, 1)) > cumulative).sum(axis=1)
        return softmax(SHARPNESS * z, axis=1), y
    z = rng.normal(size=(n, 4)) * 2
    y = (rng.uniform(size=z.shape) < expit(z)).astype(float)
    y[rng.uniform(size=y.shape) < 0.1] = np.nan
    return expit(SHARPNESS * z), y


def test_every_recalibrator_of_the_vocabulary_has_its_class():
    # the run grid and the plan count vocab.RECALIBRATORS; each must have its class, in the same order
    assert tuple(RECALIBRATORS) == vocab.RECALIBRATORS


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
@pytest.mark.parametrize("name", sorted(RECALIBRATORS))
def test_recalibration_halves_ece_and_keeps_auroc(name, task):
    rng = np.random.default_rng(0)
    calib_probs, calib_y = _overconfident(task, 2000, rng)
    test_probs, test_y = _overconfident(task, 2000, rng)
    recalibrated = make_recalibrator(name).fit(calib_probs, calib_y).predict_proba(test_probs)
    ece_before = expected_calibration_error(test_y, test_probs, task=task)
    ece_after = expected_calibration_error(test_y, recalibrated, task=task)
    assert ece_before > 0.1  # the fixture really is over-confident
    assert ece_after <= ece_before / 2
    auroc_change = macro_auroc(test_y, recalibrated, task=task) - macro_auroc(test_y, test_probs, task=task)
    assert abs(auroc_change) <= 0.01
    assert recalibrated.shape == test_probs.shape
    if task == "multiclass":
        np.testing.assert_allclose(recalibrated.sum(axis=1), 1.0)


def test_temperature_recovers_the_sharpening():
    rng = np.random.default_rng(1)
    probs, y = _overconfident("multiclass", 4000, rng)
    scaler = make_recalibrator("temperature").fit(probs, y)
    assert scaler.temperature_ == pytest.approx(SHARPNESS, rel=0.1)
    probs, y = _overconfident("multilabel", 4000, rng)
    np.testing.assert_allclose(make_recalibrator("temperature").fit(probs, y).temperature_, SHARPNESS, rtol=0.15)


def test_odir_penalty_shrinks_the_off_diagonal():
    rng = np.random.default_rng(2)
    probs, y = _overconfident("multiclass", 1000, rng)

    def off_diagonal_norm(reg):
        W = make_recalibrator("dirichlet", reg_lambda=reg, reg_mu=reg).fit(probs, y).maps_[0][0].numpy()
        return np.linalg.norm(W - np.diag(np.diag(W)))

    assert off_diagonal_norm(100.0) < 0.1 * off_diagonal_norm(1e-6)


def test_isotonic_keeps_the_order_within_a_step():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.2, 0.8]])
    y = np.array([0, 1, 1, 1])
    out = make_recalibrator("isotonic").fit(probs, y).predict_proba(np.array([[0.05, 0.95], [0.01, 0.99]]))
    assert out[1, 1] > out[0, 1]  # both fall in the top isotonic step; the tie is broken by p


def test_single_class_label_is_left_as_it_is(caplog):
    rng = np.random.default_rng(3)
    probs, y = _overconfident("multilabel", 500, rng)
    y[:, 2] = np.where(np.isnan(y[:, 2]), np.nan, 0.0)
    recalibrator = make_recalibrator("vector").fit(probs, y)
    assert recalibrator.identity_labels_ == [2]
    np.testing.assert_array_equal(recalibrator.predict_proba(probs)[:, 2], probs[:, 2])
    assert "labels [2]" in caplog.text


def test_bad_input():
    probs = np.array([[0.7, 0.3], [0.4, 0.6]])
    with pytest.raises(ValueError, match="unknown recalibrator"):
        make_recalibrator("platt")
    with pytest.raises(ValueError, match="sum to 1"):
        make_recalibrator("temperature").fit(np.array([[0.7, 0.7], [0.4, 0.6]]), [0, 1])
    with pytest.raises(ValueError, match="class ids"):
        make_recalibrator("temperature").fit(probs, [0, 2])
    with pytest.raises(NotFittedError):
        make_recalibrator("isotonic").predict_proba(probs)
    fitted = make_recalibrator("temperature").fit(probs, [0, 1])
    with pytest.raises(ValueError, match="fitted on 2"):
        fitted.predict_proba(np.array([[0.2, 0.3, 0.5]]))


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
@pytest.mark.parametrize("name", sorted(RECALIBRATORS))
def test_saved_map_gives_the_same_output_after_reload(name, task):
    rng = np.random.default_rng(4)
    probs, y = _overconfident(task, 300, rng)
    if task == "multilabel":
        y[:, 1] = np.where(np.isnan(y[:, 1]), np.nan, 1.0)  # a label left as it is survives the round trip
    fitted = make_recalibrator(name).fit(probs, y)
    restored = recalibrator_from_dict(json.loads(json.dumps(fitted.to_dict())))
    test_probs, _ = _overconfident(task, 200, rng)
    np.testing.assert_array_equal(restored.predict_proba(test_probs), fitted.predict_proba(test_probs))
    assert restored.get_params() == fitted.get_params() and restored.identity_labels_ == fitted.identity_labels_


def test_a_malformed_map_is_refused():
    data = make_recalibrator("vector").fit(np.array([[0.7, 0.3], [0.4, 0.6]]), [0, 1]).to_dict()
    with pytest.raises(ValueError, match="method 'platt'"):
        recalibrator_from_dict({**data, "method": "platt"})
    with pytest.raises(ValueError, match="missing or bad entry 'maps'"):
        recalibrator_from_dict({k: v for k, v in data.items() if k != "maps"})
    with pytest.raises(ValueError, match="method of TemperatureScaling"):
        RECALIBRATORS["temperature"].from_dict(data)


def test_cross_validated_ece_prefers_a_recalibrator_on_overconfident_scores():
    rng = np.random.default_rng(5)
    probs, y = _overconfident("multiclass", 600, rng)
    scores = cross_validated_ece(probs, y, task="multiclass")
    assert list(scores) == ["none", "temperature", "vector", "isotonic", "dirichlet"]
    assert scores["temperature"] < scores["none"] / 2 and scores["vector"] < scores["none"] / 2
    best, again = select_recalibrator(probs, y, task="multiclass", return_scores=True)
    assert again == scores  # deterministic for a seed
    assert best == min(RECALIBRATORS, key=scores.__getitem__)
    assert cross_validated_ece(probs, y, methods=("isotonic",), task="multiclass", seed=1) != \
        {k: scores[k] for k in ("none", "isotonic")}  # the seed moves the folds


def test_cross_validated_ece_on_multilabel_scores():
    rng = np.random.default_rng(6)
    probs, y = _overconfident("multilabel", 400, rng)
    scores = cross_validated_ece(probs, y, methods=("temperature",), task="multilabel")
    assert scores["temperature"] < scores["none"]


def test_cross_validation_with_too_few_cases_says_so():
    rng = np.random.default_rng(7)
    probs, y = _overconfident("multiclass", 40, rng)
    with pytest.raises(TooFewCasesError, match="40 calibration cases give 5 folds of 8"):
        cross_validated_ece(probs, y, task="multiclass")
    probs, y = _overconfident("multiclass", 200, rng)
    y[:3] = 4
    y[3:][y[3:] == 4] = 0  # class 4 keeps 3 cases
    with pytest.raises(TooFewCasesError, match="class 4 has 3 calibration cases"):
        cross_validated_ece(probs, y, task="multiclass")
    with pytest.raises(ValueError, match="means 'multiclass'"):
        cross_validated_ece(probs, y, task="multilabel")
    with pytest.raises(ValueError, match="methods must be names"):
        cross_validated_ece(probs, y, methods=("none",), task="multiclass")


@pytest.mark.parametrize("name", ["temperature", "vector", "dirichlet"])
def test_every_label_fitted_at_once_gives_each_label_its_own_map(name):
    # the labels of a multi-label fit are solved in one batched L-BFGS, padded to the longest label:
    # each label's map must be the one it gets fitted alone (a two-class fit on its observed rows)
    rng = np.random.default_rng(5)
    probs, y = _overconfident("multilabel", 600, rng)
    y[:300, 1] = np.nan  # labels of very different lengths: padding must carry no weight
    together = make_recalibrator(name).fit(probs, y)
    for label in range(y.shape[1]):
        seen = ~np.isnan(y[:, label])
        two = np.column_stack([1 - probs[:, label], probs[:, label]])
        alone = make_recalibrator(name).fit(two[seen], y[seen, label].astype(int))
        np.testing.assert_allclose(together.predict_proba(probs)[:, label], alone.predict_proba(two)[:, 1],
                                   atol=1e-5)  # both stop near the optimum, at different points
