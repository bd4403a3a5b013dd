"""Tests of the paper's analyses on a small synthetic runs table (DESIGN.md section 10)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from crsrepro.analyse import findings as analyses
from crsrepro.score import crs, dimensions, stats
from crsrepro.analyse.findings import (absolute_label_efficiency, aulc_vs_retention, calibration_under_degradation,
                               control_probe_agreement, external_validity, insertion_experiment,
                               leave_one_dataset_out, recalibration_summary, welch_transfer_test)
from crsrepro.score.crs import ReferenceFrame
from crsrepro.score.dimensions import ProfileTableError, reliability_profiles
from crsrepro.core.metrics import aulc, label_efficiency_retention, robustness_raw
from crsrepro.core.schema import FINAL, FROZEN, LORA

FAMILIES = {"g1": "general", "g2": "general", "g3": "general", "m1": "medical", "m2": "medical", "s1": "specialist"}
QUALITY = {"g1": 0.1, "g2": 0.3, "g3": 0.5, "m1": 0.6, "m2": 0.8, "s1": 0.9}
DATASETS = ("isic2019", "aptos2019", "chexpert")
PERTURBED = {"gaussian_blur@1": 0.02, "gaussian_blur@2": 0.05, "jpeg@1": 0.03}


def make_runs(seeds=(0, 1, 2)):
    """A runs table in the column layout of crsrepro.core.schema.RUN_COLUMNS, with known structure."""
    rng = np.random.default_rng(0)
    rows = []

    def add(**kw):
        rows.append(dict(probe="linear", layer="final", regime="frozen", recalibrator="none") | kw)

    for e, q in QUALITY.items():
        for d_i, d in enumerate(DATASETS):
            for s in seeds:
                base = dict(encoder=e, family=FAMILIES[e], dataset=d, seed=s)
                full = 0.6 + 0.3 * q + 0.02 * d_i * (-1) ** (d_i + int(q * 10)) + rng.normal(0, 0.005)
                ece = 0.15 - 0.1 * q + rng.normal(0, 0.005)
                for f in (0.01, 0.1):
                    add(**base, label_fraction=f, condition="clean", auroc=full - (1 - f) * 0.15 * (1 - q), ece=ece + 0.02)
                add(**base, label_fraction=1.0, condition="clean", auroc=full, ece=ece)
                for c, drop in PERTURBED.items():
                    add(**base, label_fraction=1.0, condition=c, auroc=full - drop * (1.5 - q),
                        ece=ece + drop * (2 - q) + rng.normal(0, 0.002))
                if d == "chexpert":
                    mimic = full - (0.25 if FAMILIES[e] == "general" else 0.08) + rng.normal(0, 0.01)
                    add(**base, label_fraction=1.0, condition="mimic_cxr", auroc=mimic, ece=ece + 0.1)
                add(**base, label_fraction=1.0, condition="clean", probe="knn", auroc=full, ece=ece)
                add(**base, label_fraction=1.0, condition="clean", probe="mlp", auroc=1.5 - full, ece=ece)
                add(**base, label_fraction=1.0, condition="clean", recalibrator="temperature", auroc=full + 0.001,
                    ece=ece * 0.4)
    return pd.DataFrame(rows)


RUNS = make_runs()


def test_reliability_profiles_by_hand():
    profiles = reliability_profiles(RUNS)
    assert len(profiles) == 6 * 3 * 3 and set(profiles["family"]) == {"general", "medical", "specialist"}
    cell = RUNS[(RUNS.encoder == "m1") & (RUNS.dataset == "chexpert") & (RUNS.seed == 1) & (RUNS.probe == "linear")
                & (RUNS.recalibrator == "none")]
    clean = cell[cell.condition == "clean"].set_index("label_fraction")["auroc"]
    full = cell[cell.label_fraction == 1.0].set_index("condition")["auroc"]
    row = profiles[(profiles.encoder == "m1") & (profiles.dataset == "chexpert") & (profiles.seed == 1)].iloc[0]
    assert row["auroc"] == full["clean"]
    assert row["retention"] == pytest.approx(label_efficiency_retention(clean.to_dict()))
    drops = full["clean"] - full[list(PERTURBED) + ["mimic_cxr"]]
    assert row["robustness"] == pytest.approx(robustness_raw(drops.to_numpy()))
    without = reliability_profiles(RUNS, include_transfer=False)
    changed = (without["robustness"] != profiles["robustness"]).groupby(profiles["dataset"]).any()
    assert changed.to_dict() == {"aptos2019": False, "chexpert": True, "isic2019": False}


def test_insertion_experiment_fixed_is_exactly_zero_at_both_levels():
    result = insertion_experiment(reliability_profiles(RUNS), n_trials=5, rng=1)
    summary = result.summary
    assert list(summary.index) == [("cell", "cohort"), ("cell", "fixed"), ("aggregate", "cohort"),
                                   ("aggregate", "fixed")]
    assert summary.loc[("cell", "fixed"), "max_movement"] == 0.0 == summary.loc[("aggregate", "fixed"), "max_movement"]
    assert summary.loc[("cell", "cohort"), "max_movement"] > 0.0
    assert (summary["panel_size"] == 3).all()  # 6 encoders: panels of 6 - 3
    moves = result.movements
    assert (moves["level"] == "cell").sum() == 5 * 2 * 3 * 3  # trials x modes x panel encoders x datasets
    assert (moves["level"] == "aggregate").sum() == 5 * 2 * 3 and (moves.loc[moves["level"] == "aggregate",
                                                                           "dataset"] == "").all()
    # an encoder's aggregate moves by |mean of its cells' changes|, so at most the mean of its cells' movements
    cells = moves[moves["level"] == "cell"].groupby(["trial", "mode", "encoder"])["movement"].mean()
    aggregate = moves[moves["level"] == "aggregate"].set_index(["trial", "mode", "encoder"])["movement"]
    assert (aggregate <= cells.reindex(aggregate.index) + 1e-12).all()
    assert (aggregate < cells.reindex(aggregate.index) - 1e-6).any()  # cells move both ways: they partly cancel


def _brackets(table, columns=("estimate", "ci_low", "ci_high")):
    """Every finite interval of ``table`` contains its estimate (DESIGN.md section 15)."""
    estimate, low, high = (table[c].to_numpy(float) for c in columns)
    finite = np.isfinite(estimate)
    return bool(finite.any() and (low[finite] <= estimate[finite]).all() and (estimate[finite] <= high[finite]).all())


def test_external_validity_uses_its_own_frame_without_the_transfer_drop():
    result = external_validity(RUNS, n_resamples=300)
    t = result.table
    assert len(t) == 6
    assert result.rho_crs == pytest.approx(sps.spearmanr(t["crs"], t["target_auroc"]).statistic)
    assert result.rho_source_auroc == pytest.approx(sps.spearmanr(t["source_auroc"], t["target_auroc"]).statistic)
    full_frame = ReferenceFrame.freeze(reliability_profiles(RUNS))
    assert result.frame.content_hash() != full_frame.content_hash()
    cell = external_validity(RUNS, crs_level="cell", n_resamples=300).table
    assert (cell["crs"] != t["crs"]).any()


def test_external_validity_intervals_bracket_their_estimates_and_pair_the_difference():
    result = external_validity(RUNS, n_resamples=400, rng=3)
    intervals = result.intervals
    assert list(intervals.index) == ["rho_crs", "rho_source_auroc", "rho_difference"]
    assert list(intervals.columns) == ["estimate", "ci_low", "ci_high", "plug_in"]
    assert _brackets(intervals)
    assert intervals.loc["rho_crs", "plug_in"] == result.rho_crs
    assert intervals.loc["rho_difference", "plug_in"] == pytest.approx(result.rho_crs - result.rho_source_auroc)
    # the toy's transfer AUROC follows its source AUROC in rank: rho 1 in every encoder resample, a point
    # interval; the CRS does not, and its interval has width
    assert intervals.loc["rho_source_auroc", ["estimate", "ci_low", "ci_high"]].tolist() == pytest.approx([1.0] * 3)
    assert intervals.loc["rho_crs", "ci_high"] > intervals.loc["rho_crs", "ci_low"]
    again = external_validity(RUNS, n_resamples=400, rng=3).intervals
    pd.testing.assert_frame_equal(intervals, again)  # the same rng, the same draw


def test_leave_one_dataset_out_by_hand():
    scores = pd.DataFrame({"encoder": ["a", "b", "c"] * 2, "dataset": ["x"] * 3 + ["y"] * 3,
                           "auroc": [0.9, 0.8, 0.7, 0.8, 0.7, 0.6], "crs": [0.1, 0.2, 0.3, 0.5, 0.4, 0.3]})
    out = leave_one_dataset_out(scores, n_resamples=200)
    assert out.loc["x", "spearman_rho_plug_in"] == pytest.approx(1.0)  # CRS on y: a > b > c, AUROC on x: a > b > c
    assert out.loc["y", "spearman_rho_plug_in"] == pytest.approx(-1.0)
    # a perfect rank relation stays perfect in every encoder resample: the interval is the point
    for held_out, rho in (("x", 1.0), ("y", -1.0)):
        assert out.loc[held_out, ["spearman_rho", "spearman_rho_ci_low", "spearman_rho_ci_high"]].tolist() == \
            pytest.approx([rho] * 3)
    assert out.loc["x", "recovered"] and not out.loc["y", "recovered"]
    assert out.loc["y", "auroc_champion"] == "a" and out.loc["y", "crs_champion"] == "c"
    assert (out["n_encoders"] == 3).all()
    two = leave_one_dataset_out(scores[scores["encoder"] != "c"], n_resamples=50)
    assert two["spearman_rho"].isna().all() and two["spearman_rho_ci_low"].isna().all()  # 2 encoders: no rho


def test_leave_one_dataset_out_intervals_bracket_their_estimates():
    scores = crs.crs_scores(reliability_profiles(RUNS), ReferenceFrame.freeze(reliability_profiles(RUNS)))
    out = leave_one_dataset_out(scores, n_resamples=400, rng=1)
    assert _brackets(out, ("spearman_rho", "spearman_rho_ci_low", "spearman_rho_ci_high"))
    assert (out["spearman_rho_ci_high"] > out["spearman_rho_ci_low"]).any()


def test_control_probe_agreement():
    out = control_probe_agreement(RUNS).set_index(["dataset", "probe"])
    assert len(out) == 6 and (out["n_encoders"] == 6).all()
    assert (out.xs("knn", level="probe")["kendall_tau"] == 1.0).all()
    assert (out.xs("mlp", level="probe")["kendall_tau"] == -1.0).all()
    assert (out.xs("mlp", level="probe")["reversed_pairs"] == 15).all()


def test_recalibration_summary():
    result = recalibration_summary(RUNS)
    row = result.summary.loc["temperature"]
    assert row["n_cells"] == 18
    assert row["relative_reduction_min"] == pytest.approx(0.6) and row["relative_reduction_max"] == pytest.approx(0.6)
    assert row["mean_auroc_change"] == pytest.approx(0.001)
    drop = result.cells["absolute_drop"]
    low, high = sps.t.interval(0.95, len(drop) - 1, loc=drop.mean(), scale=sps.sem(drop))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
    assert result.summary.loc["best_in_val", "n_cells"] == 0 and result.best_in_val.empty  # no val_cv_ece
    assert any("no val_cv_ece" in n for n in result.notes) and not result.comparable_to_paper
    assert result.declared.empty and result.declared_cells == ()
    chosen = recalibration_summary(RUNS, cells=[("m1", "aptos2019"), ("g1", "isic2019")])
    assert chosen.declared.loc["temperature", "n_cells"] == 2 and chosen.summary.loc["temperature", "n_cells"] == 18
    assert any("six main tests" in n for n in chosen.notes) and not chosen.comparable_to_paper


def test_recalibration_best_in_val_is_chosen_on_val_never_on_test():
    """DESIGN.md section 10: per cell the method with the lowest seed-mean val_cv_ece, whatever the test ECE says."""
    clean = (RUNS["probe"] == "linear") & (RUNS["condition"] == "clean") & (RUNS["label_fraction"] == 1.0)
    runs = RUNS.copy()
    runs.loc[clean, "val_cv_ece"] = np.where(runs.loc[clean, "recalibrator"] == "none", 0.10, 0.05)
    isotonic = runs[clean & (runs["recalibrator"] == "temperature")].assign(
        recalibrator="isotonic", ece=lambda t: t["ece"] * 0.1, val_cv_ece=0.08)  # best on test, not in val
    runs = pd.concat([runs, isotonic], ignore_index=True)
    stays = (runs["encoder"] == "g1") & (runs["dataset"] == "isic2019") & clean
    runs.loc[stays, "val_cv_ece"] = np.where(runs.loc[stays, "recalibrator"] == "none", 0.01, 0.05)
    noisy = (runs["encoder"] == "m2") & (runs["dataset"] == "chexpert") & clean & (runs["recalibrator"] == "isotonic")
    runs.loc[noisy, "val_cv_ece"] = np.where(runs.loc[noisy, "seed"] == 0, 0.0, 0.2)  # seed mean 0.067 > 0.05
    result = recalibration_summary(runs)
    best = result.best_in_val.set_index(["encoder", "dataset"])
    assert len(best) == 18
    assert best.loc[("g1", "isic2019"), "recalibrator"] == "none"
    assert best.loc[("g1", "isic2019"), "absolute_drop"] == 0.0
    assert (best.drop(index=[("g1", "isic2019")])["recalibrator"] == "temperature").all()
    temperature = result.cells[result.cells["recalibrator"] == "temperature"].set_index(["encoder", "dataset"])
    np.testing.assert_allclose(best.loc[("m1", "aptos2019"), "ece_after"], temperature.loc[("m1", "aptos2019"), "ece_after"])
    row = result.summary.loc["best_in_val"]
    assert row["n_cells"] == 18
    assert row["mean_absolute_drop"] == pytest.approx(best["absolute_drop"].mean())
    assert result.summary.loc["isotonic", "mean_absolute_drop"] > row["mean_absolute_drop"]  # test would pick isotonic
    declared = recalibration_summary(runs, cells=[("g1", "isic2019"), ("m1", "aptos2019")]).declared
    assert declared.loc["best_in_val", "n_cells"] == 2 and declared.loc["isotonic", "n_cells"] == 2


def test_calibration_under_degradation():
    result = calibration_under_degradation(RUNS)
    cells = result.cells
    assert len(cells) == 18
    assert cells.loc[("g1", "isic2019"), "mean_auroc_drop"] == pytest.approx(np.mean(list(PERTURBED.values())) * 1.4)
    assert cells.loc[("g1", "isic2019"), "peak_auroc_drop"] == pytest.approx(0.05 * 1.4)
    assert cells.loc[("g1", "isic2019"), "peak_ece_rise"] == pytest.approx(0.05 * 1.9, abs=0.005)
    r = sps.pearsonr(cells["mean_auroc_drop"], cells["mean_ece_rise"])
    assert result.pearson_r == pytest.approx(r.statistic) and result.pearson_r > 0.9


def test_absolute_label_efficiency():
    table = absolute_label_efficiency(RUNS, reference_encoder="g2")
    bar = table.loc[("g2", "aptos2019"), "auroc_full"]
    assert (table.xs("aptos2019", level="dataset")["reference_full_auroc"] == bar).all()
    expected = table.xs("aptos2019", level="dataset")["auroc_at_fraction"] >= bar
    assert table.xs("aptos2019", level="dataset")["reaches_reference"].equals(expected)
    assert table.loc[("s1", "isic2019"), "reaches_reference"] and not table.loc[("g1", "isic2019"), "reaches_reference"]
    with pytest.raises(ValueError, match="general.vit_b16"):
        absolute_label_efficiency(RUNS)


def test_welch_transfer_test():
    result = welch_transfer_test(RUNS)
    assert (result.n_medical, result.n_general) == (3, 3)
    t = result.table
    ref = sps.ttest_ind(t[t.group == "medical"].target_auroc, t[t.group == "general"].target_auroc, equal_var=False)
    assert result.p_value == pytest.approx(ref.pvalue) and result.mean_medical > result.mean_general


def test_aulc_vs_retention():
    result = aulc_vs_retention(RUNS)
    assert result.cells.shape == (18, 3)
    cell = RUNS[(RUNS.encoder == "g3") & (RUNS.dataset == "isic2019") & (RUNS.condition == "clean")
                & (RUNS.probe == "linear") & (RUNS.recalibrator == "none")]
    per_seed = [aulc(c.set_index("label_fraction")["auroc"].to_dict()) for _, c in cell.groupby("seed")]
    assert result.cells.loc[("g3", "isic2019"), "aulc"] == pytest.approx(np.mean(per_seed))
    assert result.correlations.shape == (2, 2)
    assert result.correlations.loc["aulc", "encoder"] == pytest.approx(1.0)  # AULC copies full AUROC here


def test_reliability_profiles_errors_name_the_cell():
    missing_clean = RUNS.drop(RUNS.index[(RUNS.encoder == "g1") & (RUNS.dataset == "aptos2019") & (RUNS.seed == 2)
                                         & (RUNS.condition == "clean") & (RUNS.label_fraction == 1.0)])
    with pytest.raises(ProfileTableError, match="encoder g1, dataset aptos2019, seed 2: needs the clean run"):
        reliability_profiles(missing_clean)
    with pytest.raises(ProfileTableError, match="appears more than once"):
        reliability_profiles(pd.concat([RUNS, RUNS.iloc[:1]]))
    with pytest.raises(ProfileTableError, match="missing column.*regime"):
        reliability_profiles(RUNS.drop(columns="regime"))
    no_perturbation = RUNS[~RUNS.condition.str.contains("@")]
    with pytest.raises(ProfileTableError, match="no perturbation run"):
        reliability_profiles(no_perturbation)


def test_reliability_profiles_of_a_depth_tap_and_of_lora_without_relabelling():
    """The depth sweep and LoRA ask for their layer and regime (DESIGN.md section 11); the primary rows stay apart."""
    primary = RUNS[(RUNS.probe == "linear") & (RUNS.recalibrator == "none")]
    tap = primary.assign(layer="block_6", auroc=primary["auroc"] - 0.03 * primary["seed"])
    lora = primary.assign(regime=LORA, auroc=primary["auroc"] + 0.01, ece=primary["ece"] / 2)
    runs = pd.concat([RUNS, tap, lora], ignore_index=True)
    pd.testing.assert_frame_equal(reliability_profiles(runs), reliability_profiles(RUNS))  # the default: final, frozen

    by_layer = reliability_profiles(runs, layer=None)
    assert list(by_layer.columns[:4]) == ["encoder", "dataset", "seed", "layer"]
    assert sorted(by_layer["layer"].unique()) == ["block_6", FINAL]
    final = by_layer[by_layer["layer"] == FINAL].drop(columns="layer").reset_index(drop=True)
    pd.testing.assert_frame_equal(final, reliability_profiles(RUNS))
    at_tap = by_layer[by_layer["layer"] == "block_6"].drop(columns="layer").reset_index(drop=True)
    pd.testing.assert_frame_equal(at_tap, reliability_profiles(tap.assign(layer=FINAL)))  # what relabelling gave
    pd.testing.assert_frame_equal(reliability_profiles(runs, layer="block_6"), at_tap)
    assert (at_tap["auroc"] < final["auroc"]).any()  # the tap is scored from its own rows

    pd.testing.assert_frame_equal(reliability_profiles(runs, regime=LORA), reliability_profiles(lora.assign(regime=FROZEN)))
    by_regime = reliability_profiles(runs, regime=None)
    assert by_regime.groupby("regime").size().to_dict() == {FROZEN: 54, LORA: 54}
    with pytest.raises(ProfileTableError, match="layer block_9, regime any"):
        reliability_profiles(runs, layer="block_9", regime=None)


def test_seed_count_coverage_measures_how_much_few_seeds_under_cover():
    """DESIGN.md section 10: 5-seed intervals judged against the estimate from all 20 seeds."""
    profiles = reliability_profiles(make_runs(seeds=tuple(range(20))))
    frame = ReferenceFrame.freeze(profiles)
    table = analyses.seed_count_coverage(profiles, frame, n_seeds=5, n_subsets=6, n_resamples=200, rng=0)
    assert len(table) == 15 and table["coverage"].between(0, 1).all() and (table["mean_width"] > 0).all()
    assert table.attrs["n_all_seeds"] == 20 and 0 <= table.attrs["coverage"] <= 1
    with pytest.raises(ProfileTableError, match="demo-seeds20"):
        analyses.seed_count_coverage(reliability_profiles(make_runs(seeds=(0, 1, 2))), frame, n_seeds=5)
