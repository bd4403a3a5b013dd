"""Operating points (DESIGN.md section 14): thresholds meet their target on val and are the best such, they are
chosen on val only (the test split and the transfer set never move them), and on a tiny grid with a
transfer set every condition is scored with the val threshold of its seed."""

import matplotlib
import numpy as np
import pandas as pd
import pytest

from crsrepro.data import get_dataset_spec
from crsrepro.analyse.operating_points import (ACHIEVED, COLUMNS, OPERATING_POINTS, TABLE_COLUMNS, achieved,
                                              achieved_replicates, choose_threshold, full_label_rowsets,
                                              operating_point_table, operating_points, severity_summary)
from crsrepro.present.plots.deployment import sensitivity_vs_severity
from crsrepro.run.results import ResultStore

matplotlib.use("Agg")


@pytest.mark.parametrize("seed", range(5))
def test_the_threshold_meets_its_target_and_is_the_best_one_that_does(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(200) < 0.3
    score = np.round(rng.normal(y * 1.0, 1.0), 1)  # ties, as float16 storage makes them
    for point, (fixed, target) in OPERATING_POINTS.items():
        t = choose_threshold(y, score, fixed=fixed, target=target)
        sens, spec = achieved(y, score, t)
        assert (spec if fixed == "specificity" else sens) >= target, point
        # the next candidate in the direction that gains the other quantity misses the target
        candidates = np.unique(score)
        if fixed == "specificity":
            lower = candidates[candidates < t]
            assert not len(lower) or achieved(y, score, lower[-1])[1] < target
        else:
            higher = candidates[candidates > t]
            assert not len(higher) or achieved(y, score, higher[0])[0] < target


def _probs(rng, labels, k, noise):
    logits = 2.0 * np.eye(k)[labels] + rng.normal(0, noise, (len(labels), k))
    p = np.exp(logits)
    return p / p.sum(1, keepdims=True)


def test_thresholds_are_chosen_on_val_and_never_see_test():
    rng = np.random.default_rng(0)
    y_val, y_test = rng.integers(0, 3, 150), rng.integers(0, 3, 150)
    val = (y_val, _probs(rng, y_val, 3, 1.0))
    names = ["a", "b", "c"]
    first, _ = operating_points(val, {"clean": (y_test, _probs(rng, y_test, 3, 1.0))}, task="multiclass",
                                label_names=names)
    other_test = rng.integers(0, 3, 90)
    second, _ = operating_points(val, {"clean": (other_test, _probs(rng, other_test, 3, 3.0)),
                                       "jpeg@3": (other_test, _probs(rng, other_test, 3, 5.0))},
                                 task="multiclass", label_names=names)
    key = ["label", "operating_point"]
    thresholds = lambda t: t[t["condition"] == "clean"].set_index(key)["threshold"]  # noqa: E731
    pd.testing.assert_series_equal(thresholds(first), thresholds(second))  # another test set: same thresholds
    val_rows = lambda t: t[t["condition"] == "val"].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(val_rows(first), val_rows(second))
    moved, _ = operating_points((y_val, _probs(rng, y_val, 3, 1.0)), {"clean": (y_test, _probs(rng, y_test, 3, 1.0))},
                                task="multiclass", label_names=names)
    assert not np.allclose(thresholds(moved), thresholds(first))  # another val split: other thresholds
    # val meets every target; one threshold per class and operating point, shared by all conditions
    chosen = first[first["condition"] == "val"]
    for row in chosen.itertuples():
        fixed, target = OPERATING_POINTS[row.operating_point]
        assert getattr(row, fixed) >= target
    assert (first.groupby(key)["threshold"].nunique() == 1).all() and len(chosen) == 3 * len(OPERATING_POINTS)


def test_multilabel_masks_and_a_transfer_set_scores_its_shared_labels_only():
    rng = np.random.default_rng(1)
    labels = (rng.random((120, 3)) < 0.4).astype(float)
    labels[:10, 1] = np.nan
    probs = 1 / (1 + np.exp(-(2 * np.nan_to_num(labels) - 1 + rng.normal(0, 1, labels.shape))))
    target_labels = labels[:60][:, [0, 2]]
    drawn = [0, 0, 1] + list(range(3, 60))  # one replicate: case 0 twice, case 2 never
    table, replicates = operating_points((labels, probs), {"nih": (target_labels, probs[:60][:, [0, 2]])},
                                         task="multilabel", label_names=["x", "y", "z"], columns={"nih": [0, 2]},
                                         weights={"nih": np.bincount(drawn, minlength=60)[None].astype(float)})
    assert set(table.loc[table["condition"] == "nih", "label"]) == {"x", "z"}
    val_y = table[(table["condition"] == "val") & (table["label"] == "y")]
    assert (val_y["n_positive"] + val_y["n_negative"] == 110).all()  # the masked cases are left out
    transfer = table[(table["condition"] == "nih") & (table["label"] == "z")].iloc[0]
    assert transfer["n_positive"] == int(target_labels[:, 1].sum())
    # the replicate is the achieved value on the drawn cases, each counted as often as it was drawn
    row = transfer.name
    expected = achieved(target_labels[drawn, 1] == 1, probs[:60][drawn, 2], transfer["threshold"])
    np.testing.assert_allclose(replicates[row, :, 0], expected)
    assert np.isnan(replicates[table["condition"].to_numpy() == "val"]).all()  # the val rows: no replicate


def test_achieved_replicates_with_unit_weights_is_achieved():
    rng = np.random.default_rng(4)
    y, score = rng.random(80) < 0.3, rng.random(80)
    np.testing.assert_allclose(achieved_replicates(y, score, 0.5, np.ones((2, 80)))[:, 1], achieved(y, score, 0.5))
    none = achieved_replicates(y, score, 0.5, np.where(y, 0.0, 1.0)[None])  # a draw without positives
    assert np.isnan(none[0, 0]) and np.isfinite(none[1, 0])


# ---------------------------------------------------------------- a tiny grid with a transfer set
MICRO = {"datasets": ["chexpert"], "transfer": {"chexpert": "mimic_cxr"},
         "encoders": ["demo.color_histogram", "demo.pixel_pca"], "seeds": [0, 1], "label_fractions": [0.25, 1.0],
         "perturbations": ["jpeg"], "severities": [1, 3], "control_probes": {"probes": []},
         "demo_world": {"n_images": {"chexpert": 180, "mimic_cxr": 80}}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_grid):
    yield from tiny_grid(tmp_path_factory, "operating_points", MICRO)


def _brackets(table, name):
    """Every finite interval of quantity ``name`` in ``table`` contains its estimate."""
    estimate, low, high = (table[c].to_numpy(float) for c in (name, f"{name}_ci_low", f"{name}_ci_high"))
    finite = np.isfinite(low)
    return bool(finite.any() and (low[finite] <= estimate[finite]).all() and (estimate[finite] <= high[finite]).all())


def test_chapters_04_and_09_compute_the_operating_points_once(tiny, monkeypatch):
    """The second chapter's kernel (a new RunAnalysis of the same run) reads the first one's table."""
    from crsrepro.analyse import operating_points as module

    first = operating_point_table(tiny, n_resamples=21)
    monkeypatch.setattr(module, "_operating_point_table", lambda *args: pytest.fail("computed a second time"))
    again = operating_point_table(type(tiny)(tiny.profile, tiny.results, manifest_dir=tiny.manifest_dir, rng=tiny.rng),
                                  n_resamples=21)
    pd.testing.assert_frame_equal(again.table, first.table)
    pd.testing.assert_frame_equal(again.replicates["sensitivity"], first.replicates["sensitivity"])
    with pytest.raises(pytest.fail.Exception, match="second time"):  # another seed: computed
        operating_point_table(type(tiny)(tiny.profile, tiny.results, manifest_dir=tiny.manifest_dir, rng=1),
                              n_resamples=21)


def test_operating_point_table_on_a_tiny_grid(tiny):
    points = operating_point_table(tiny, n_resamples=60)
    table = points.table
    assert list(table.columns) == TABLE_COLUMNS
    assert set(table["condition"]) == {"val", "clean", "jpeg@1", "jpeg@3", "mimic_cxr"}
    assert set(table["family"]) and table["family"].notna().all()
    # every condition of a seed uses the threshold chosen on that seed's stored val split
    store = ResultStore(tiny.profile.output_path)
    key = full_label_rowsets(tiny, "chexpert")[("demo.pixel_pca", 1)]
    cases = store.read_cases(key)
    mine = table[(table["encoder"] == "demo.pixel_pca") & (table["seed"] == 1)]
    label = mine["label"].iloc[0]
    names = list(get_dataset_spec("chexpert").label_names)
    assert cases["probs|val|none"].shape[1] == len(names)  # every label learnable in this tiny world
    k = names.index(label)
    y, p = cases["labels|val"][:, k], cases["probs|val|none"][:, k].astype(float)
    seen = ~np.isnan(y)
    expected = choose_threshold(y[seen] == 1, p[seen], fixed="specificity", target=0.9)
    rows = mine[(mine["label"] == label) & (mine["operating_point"] == "sens@spec90")]
    assert (rows["threshold"] == expected).all() and len(rows) == 5
    # the transfer set: the same threshold, scored on MIMIC's labels
    transfer = rows[rows["condition"] == "mimic_cxr"].iloc[0]
    y_t = cases["labels|mimic_cxr"][:, k]
    assert transfer["n_positive"] == int(np.nansum(y_t == 1))
    np.testing.assert_allclose(transfer[["sensitivity_plug_in", "specificity_plug_in"]].astype(float),
                               achieved(y_t[~np.isnan(y_t)] == 1, cases["probs|mimic_cxr|none"][~np.isnan(y_t), k],
                                        expected), equal_nan=True)
    # every interval of the table brackets its estimate; the val rows, where the threshold was chosen, have none
    val = table["condition"] == "val"
    assert table.loc[val, [f"{q}_ci_low" for q in ACHIEVED]].isna().all().all()
    assert (table.loc[val, "sensitivity"] == table.loc[val, "sensitivity_plug_in"]).all()
    for quantity in ACHIEVED:
        assert _brackets(table[~val], quantity)

    summary = severity_summary(points)
    clean = summary[summary["condition"] == "clean"]
    assert (clean[["sensitivity_change", "specificity_change"]] == 0).all().all()
    assert (clean[["sensitivity_change_ci_low", "sensitivity_change_ci_high"]] == 0).all().all()  # paired: exactly 0
    for quantity in ACHIEVED:
        for name in (quantity, f"{quantity}_change"):
            assert _brackets(summary[summary["condition"] != "clean"], name)
    # the summary's plug-in is the mean over seeds and labels of the rows' plug-ins
    mean = table[(table["condition"] == "jpeg@3") & (table["encoder"] == "demo.pixel_pca")
                 & (table["operating_point"] == "sens@spec90")]["sensitivity_plug_in"].mean()
    got = summary[(summary["condition"] == "jpeg@3") & (summary["encoder"] == "demo.pixel_pca")
                  & (summary["operating_point"] == "sens@spec90")]["sensitivity_plug_in"]
    assert got.item() == pytest.approx(mean)
    assert set(summary["severity"].dropna()) == {0.0, 1.0, 3.0}
    assert summary.loc[summary["condition"] == "mimic_cxr", "severity"].isna().all()
    assert (summary["sensitivity_ci_high"] > summary["sensitivity_ci_low"]).any()  # the case draw moves them
    fig = sensitivity_vs_severity(points)
    assert fig.axes and fig.axes[0].get_title() == "jpeg" and len(fig.axes[0].lines) == 2
