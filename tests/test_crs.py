"""Tests of the CRS and its frozen reference frame (DESIGN.md section 9)."""

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from crsrepro.score.crs import (FrameError, ProfileTableError, ReferenceFrame, aggregate_crs, cell_means, crs_scores,
                          score_encoder)


def panel(rows, dataset="isic2019"):
    return pd.DataFrame([dict(encoder=e, dataset=dataset, auroc=a, ece=c, retention=r, robustness=b)
                         for e, a, c, r, b in rows])


# Normalised with the default anchors these are (by hand):
# a: auroc .9 -> .8, ece .05 -> .8, retention .95 -> .9, robustness .95 -> .8
# b: .8 -> .6, .10 -> .6, .9 -> .8, .9 -> .6
# c: .7 -> .4, .20 -> .2, .8 -> .6, .85 -> .4
# d: .9 -> .8, .05 -> .8, .95 -> .9, .90 -> .6  (a dominates d: equal on three, better on robustness)
PANEL = panel([("a", 0.9, 0.05, 0.95, 0.95), ("b", 0.8, 0.10, 0.9, 0.9), ("c", 0.7, 0.20, 0.8, 0.85),
               ("d", 0.9, 0.05, 0.95, 0.90)])


def test_hand_computed_crs():
    scores = crs_scores(PANEL, ReferenceFrame.freeze(PANEL)).set_index("encoder")
    np.testing.assert_allclose(scores.loc["a", ["p_auroc", "p_ece", "p_retention", "p_robustness"]].to_numpy(float),
                               [0.8, 0.8, 0.9, 0.8], atol=1e-12)
    # pareto: a dominates b, c, d (3 of its 3 peers); d dominates b and c; b dominates c; c nothing
    assert scores["pareto"].to_dict() == pytest.approx({"a": 1.0, "b": 1 / 3, "c": 0.0, "d": 2 / 3})
    prox = {"a": 1 - math.sqrt(0.04 + 0.04 + 0.01 + 0.04) / 2, "b": 1 - math.sqrt(0.16 + 0.16 + 0.04 + 0.16) / 2,
            "c": 1 - math.sqrt(0.36 + 0.64 + 0.16 + 0.36) / 2, "d": 1 - math.sqrt(0.04 + 0.04 + 0.01 + 0.16) / 2}
    worst = {"a": 0.8, "b": 0.6, "c": 0.2, "d": 0.6}
    pareto = {"a": 1.0, "b": 1 / 3, "c": 0.0, "d": 2 / 3}
    for e in "abcd":
        assert scores.loc[e, "proximity"] == pytest.approx(prox[e], abs=1e-12)
        assert scores.loc[e, "worst"] == pytest.approx(worst[e], abs=1e-12)
        assert scores.loc[e, "crs"] == pytest.approx(0.6 * pareto[e] + 0.25 * prox[e] + 0.15 * worst[e], abs=1e-12)
    assert scores.loc["a", "crs"] == pytest.approx(0.6 + 0.25 * 0.819722 + 0.12, abs=1e-6)


def test_equal_profile_is_not_dominated_and_newcomer_peers_are_the_whole_set():
    frame = ReferenceFrame.freeze(PANEL)
    twin_of_a = panel([("new", 0.9, 0.05, 0.95, 0.95)])
    row = crs_scores(twin_of_a, frame).iloc[0]
    assert row["pareto"] == pytest.approx(3 / 4)  # dominates b, c, d of 4 peers; ties with a
    clipped = panel([("a", 1.0, 0.0, 1.3, 1.0)])  # above the anchors: clipped to 1 everywhere
    row = crs_scores(clipped, frame).iloc[0]
    assert (row["pareto"], row["proximity"], row["worst"], row["crs"]) == (1.0, 1.0, 1.0, 1.0)


def test_fixed_frame_invariance_bit_for_bit_under_insertion():
    rng = np.random.default_rng(3)
    datasets = ["isic2019", "aptos2019", "chexpert"]
    base = pd.concat([panel([(f"e{i}", *rng.uniform([0.6, 0.0, 0.6, 0.7], [1.0, 0.3, 1.1, 1.0]))
                             for i in range(12)], d) for d in datasets], ignore_index=True)
    new = pd.concat([panel([(f"n{i}", *rng.uniform([0.6, 0.0, 0.6, 0.7], [1.0, 0.3, 1.1, 1.0]))
                            for i in range(3)], d) for d in datasets], ignore_index=True)
    frame = ReferenceFrame.freeze(base)
    before = crs_scores(base, frame)
    after = crs_scores(pd.concat([new, base], ignore_index=True), frame)
    after = after[after["encoder"].isin(before["encoder"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(before, after, check_exact=True)
    pd.testing.assert_frame_equal(before.drop(columns=["auroc", "ece", "retention", "robustness"]),
                                  frame.published_scores(), check_exact=True)
    cohort_before = crs_scores(base, None, mode="cohort").set_index(["encoder", "dataset"])["crs"]
    cohort_after = crs_scores(pd.concat([base, new]), None, mode="cohort").set_index(["encoder", "dataset"])["crs"]
    assert (cohort_after[cohort_before.index] - cohort_before).abs().max() > 0.01


def test_cohort_mode_is_min_max_within_the_panel():
    scores = crs_scores(PANEL, None, mode="cohort").set_index("encoder")
    # auroc .9/.8/.7/.9 -> 1, .5, 0, 1; ece .05/.1/.2/.05 -> 1, 2/3, 0, 1
    np.testing.assert_allclose(scores["p_auroc"], [1.0, 0.5, 0.0, 1.0])
    np.testing.assert_allclose(scores["p_ece"], [1.0, 2 / 3, 0.0, 1.0])
    assert scores.loc["a", "crs"] == pytest.approx(0.6 + 0.25 + 0.15)
    with pytest.raises(ValueError, match="mode"):
        crs_scores(PANEL, ReferenceFrame.freeze(PANEL), mode="cohort")
    with pytest.raises(ValueError, match="mode must be one of"):
        crs_scores(PANEL, None, mode="relative")


def test_seeds_are_averaged_before_scoring():
    per_seed = pd.concat([PANEL.assign(seed=0, auroc=PANEL["auroc"] - 0.02), PANEL.assign(seed=1, auroc=PANEL["auroc"] + 0.02)])
    cells = cell_means(per_seed)
    np.testing.assert_allclose(cells["auroc"], PANEL["auroc"])
    assert (cells["n_seeds"] == 2).all()
    frame = ReferenceFrame.freeze(PANEL)
    np.testing.assert_allclose(crs_scores(per_seed, frame)["crs"], crs_scores(PANEL, frame)["crs"], atol=1e-12)


def test_save_load_round_trip_and_hash_check(tmp_path):
    frame = ReferenceFrame.freeze(PANEL, description="unit test")
    path = frame.save(tmp_path / "data_manifests" / "crs_reference_test.yaml")
    loaded = ReferenceFrame.load(path)
    assert loaded.content_hash() == frame.content_hash()
    pd.testing.assert_frame_equal(crs_scores(PANEL, loaded), crs_scores(PANEL, frame), check_exact=True)
    content = yaml.safe_load(path.read_text())
    assert content["version"] == 1 and len(content["hash"]) == 64
    content["reference"][0]["p_auroc"] = 0.5
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(FrameError, match="does not match its hash"):
        ReferenceFrame.load(path)
    content["version"] = 99
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(FrameError, match="version 99"):
        ReferenceFrame.load(path)
    with pytest.raises(FrameError, match="no CRS reference frame"):
        ReferenceFrame.load(tmp_path / "missing.yaml")


def test_frame_records_and_checks_its_results_hash(tmp_path):
    """DESIGN.md section 9: a frame names the results it was frozen from and says when they changed."""
    frame = ReferenceFrame.freeze(PANEL, results_hash="a" * 64)
    assert frame.to_dict()["results_hash"] == "a" * 64
    assert frame.content_hash() != ReferenceFrame.freeze(PANEL, results_hash="b" * 64).content_hash()
    assert frame.check_results("a" * 64) is None
    assert "not saved" in frame.check_results("b" * 64)
    path = frame.save(tmp_path / "crs_reference_test.yaml")
    loaded = ReferenceFrame.load(path)
    assert loaded.results_hash == "a" * 64 and loaded.path == path
    assert loaded.content_hash() == frame.content_hash()
    assert loaded.check_results("a" * 64) is None
    message = loaded.check_results("b" * 64)
    assert message == f"{path}: frozen from results aaaaaaaaaaaa, but the results now hash to bbbbbbbbbbbb: the frame is stale"
    assert "results record no hash" in loaded.check_results(None)
    content = yaml.safe_load(path.read_text())
    content["results_hash"] = "c" * 64  # an edit the content hash catches
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(FrameError, match="does not match its hash"):
        ReferenceFrame.load(path)
    with pytest.raises(FrameError, match="results_hash must be a string"):
        ReferenceFrame.freeze(PANEL, results_hash=123)


def test_frame_saved_without_results_hash_still_loads(tmp_path):
    """A frame file from before results_hash existed loads, keeps its hash and cannot be checked."""
    old = ReferenceFrame.freeze(PANEL, description="old")
    content = old.to_dict()
    assert "results_hash" not in content
    content["hash"] = old.content_hash()
    path = tmp_path / "crs_reference_old.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=True))
    loaded = ReferenceFrame.load(path)
    assert loaded.results_hash is None and loaded.content_hash() == content["hash"]
    assert "records no results hash" in loaded.check_results("d" * 64)
    assert str(path) in loaded.check_results("d" * 64)


def test_bad_tables_and_uncovered_dataset_raise():
    frame = ReferenceFrame.freeze(PANEL)
    with pytest.raises(ProfileTableError, match="missing column.*robustness"):
        crs_scores(PANEL.drop(columns="robustness"), frame)
    with pytest.raises(ProfileTableError, match="row 2 .*encoder c.*ece must be a finite number"):
        crs_scores(PANEL.assign(ece=[0.1, 0.1, np.nan, 0.1]), frame)
    with pytest.raises(ProfileTableError, match="repeats the cell"):
        crs_scores(pd.concat([PANEL, PANEL.iloc[:1]], ignore_index=True), frame)
    with pytest.raises(FrameError, match="no reference profiles for dataset 'chexpert'"):
        crs_scores(PANEL.assign(dataset="chexpert"), frame)
    with pytest.raises(FrameError, match="no peer"):
        crs_scores(PANEL.iloc[:1], ReferenceFrame.freeze(PANEL.iloc[:1]))


def test_aggregate_never_imputes_and_score_encoder_ranks():
    two = pd.concat([PANEL, panel([("a", 0.6, 0.25, 0.5, 0.75), ("b", 0.9, 0.0, 1.0, 1.0)], "aptos2019")])
    frame = ReferenceFrame.freeze(two)
    agg = aggregate_crs(crs_scores(two, frame))
    assert agg.loc["c", "n_cells"] == 1 and agg.loc["a", "n_cells"] == 2
    scores = crs_scores(two, frame).set_index(["encoder", "dataset"])
    assert agg.loc["c", "crs"] == scores.loc[("c", "isic2019"), "crs"]
    assert agg.loc["a", "crs"] == pytest.approx(scores.loc["a", "crs"].mean())
    newcomer = score_encoder(panel([("new", 0.85, 0.07, 0.92, 0.92)]), frame)
    published = aggregate_crs(frame.published_scores())
    expected_rank = 1 + int((published["crs"] > newcomer["aggregate_crs"].iloc[0]).sum())
    assert newcomer["rank"].iloc[0] == expected_rank and newcomer["n_published"].iloc[0] == 4
    with pytest.raises(ProfileTableError, match="one encoder"):
        score_encoder(PANEL, frame)
