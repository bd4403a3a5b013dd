"""Subgroups (DESIGN.md section 14): the metric on synthetic per-case arrays finds a planted subgroup effect, skips
what it must and counts it; on a tiny grid the test cases join the loaders' metadata and the worst
subgroup is scored with the frozen frame."""

import logging

import numpy as np
import pandas as pd
import pytest

from crsrepro.score.crs import aggregate_crs, crs_scores
from crsrepro.data import prepare_dataset
from crsrepro.data.common import age_groups, subgroup_columns
from crsrepro.core.metrics import expected_calibration_error, macro_auroc
from crsrepro.analyse.subgroups import COLUMNS, METRICS, case_groups, subgroup_metrics, subgroup_table, worst_subgroup


def _planted(n=300, n_seeds=2, seed=0):
    """Three classes, two encoders with the same informative scores, except that encoder ``noisy``'s
    scores on women are mostly noise: the planted subgroup effect."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    sex = np.where(rng.random(n) < 0.5, "female", "male").astype(object)
    sex[:8] = "unknown"
    site = np.where(np.arange(n) < 20, "palms/soles", "torso").astype(object)  # 20 cases: below min_cases
    probs = {}
    for name, noise_women in (("steady", 1.0), ("noisy", 6.0)):
        logits = 2.0 * np.eye(3)[labels][None] + rng.normal(0, 1.0, (n_seeds, n, 3))
        women = sex == "female"
        logits[:, women] = 2.0 * np.eye(3)[labels[women]][None] + rng.normal(0, noise_women, (n_seeds, women.sum(), 3))
        p = np.exp(logits)
        probs[name] = (p / p.sum(-1, keepdims=True)).astype(np.float16)
    return labels, probs, pd.DataFrame({"sex": sex, "site": site})


def test_the_planted_subgroup_effect_is_found_with_intervals_around_the_estimates(caplog):
    labels, probs, groups = _planted()
    with caplog.at_level(logging.INFO):
        table = subgroup_metrics(labels, probs, groups, task="multiclass", n_resamples=80, min_cases=30)
    row = table.set_index(["encoder", "attribute", "subgroup"])
    noisy, steady = row.loc[("noisy", "sex", "female")], row.loc[("steady", "sex", "female")]
    assert noisy["auroc_gap"] < -0.1 and noisy["auroc_gap_ci_high"] < 0  # found, and the interval says so
    assert noisy["ece_gap"] > 0
    assert abs(steady["auroc_gap"]) < 0.05 and steady["auroc_gap_ci_low"] < 0 < steady["auroc_gap_ci_high"]
    assert row.loc[("noisy", "sex", "male"), "auroc_gap"] > 0  # the rest of the test set is better than the whole
    for metric in METRICS:  # every interval brackets its estimate
        assert (table[f"{metric}_ci_low"] <= table[metric]).all()
        assert (table[metric] <= table[f"{metric}_ci_high"]).all()
    np.testing.assert_allclose(table["auroc_gap_plug_in"], table["auroc_plug_in"] - table["auroc_whole"])
    whole = {e: np.mean([macro_auroc(labels, p.astype(float), task="multiclass") for p in probs[e]]) for e in probs}
    np.testing.assert_allclose(table["auroc_whole"], table["encoder"].map(whole))  # every class in every subgroup
    # the plug-ins are the seed means of the metrics on the subgroup's cases
    women = groups["sex"].to_numpy() == "female"
    np.testing.assert_allclose(noisy[["auroc_plug_in", "ece_plug_in"]].astype(float), [
        np.mean([macro_auroc(labels[women], p[women].astype(float), task="multiclass") for p in probs["noisy"]]),
        np.mean([expected_calibration_error(labels[women], p[women].astype(float), task="multiclass")
                 for p in probs["noisy"]])])
    # the planted subgroup is the noisy encoder's worst in (nearly) every replicate; shares sum to 1
    assert noisy["p_worst"] > 0.9
    np.testing.assert_allclose(table.groupby("encoder")["p_worst"].sum(), 1.0)
    assert (table["n_classes"] == 3).all()
    # skipped and counted: the unknown cases, the 20-case site; the 280-case site is scored
    skipped = {(a, s): (n, why) for a, s, n, why in table.attrs["skipped"]}
    assert skipped == {("sex", "unknown"): (8, "unknown"), ("site", "palms/soles"): (20, "fewer than 30 cases")}
    assert "site=palms/soles (20 cases) not scored: fewer than 30 cases" in caplog.text
    assert set(table["subgroup"]) == {"female", "male", "torso"} and list(table.columns) == COLUMNS[:1] + COLUMNS[2:]


def test_the_gap_comes_from_one_resample_of_the_whole_test_set():
    """A subgroup that is the whole test set has a gap of exactly 0 in every replicate, so its gap interval is
    the point 0; a subgroup scored on its own resample (and the whole set held fixed) would give a wide one."""
    labels, probs, groups = _planted(n=200)
    groups = groups.assign(everyone="all", half=np.where(np.arange(200) < 100, "first", "second"))
    table = subgroup_metrics(labels, probs, groups[["everyone", "half"]], task="multiclass", n_resamples=100)
    everyone = table[table["attribute"] == "everyone"]
    for gap in ("auroc_gap", "ece_gap"):
        assert (everyone[[gap, f"{gap}_ci_low", f"{gap}_ci_high"]].abs().to_numpy() < 1e-12).all()
    assert (everyone["auroc_ci_high"] - everyone["auroc_ci_low"] > 0.01).all()  # the AUROC itself is uncertain
    # a half of the set: its gap varies less than its AUROC, as the whole moves with it
    half = table[table["attribute"] == "half"]
    gap_width = half["auroc_gap_ci_high"] - half["auroc_gap_ci_low"]
    assert (gap_width < half["auroc_ci_high"] - half["auroc_ci_low"]).all()


def test_the_ece_estimate_is_bias_corrected_and_inside_its_interval():
    """Resampling duplicates cases, which inflates a binned ECE: the replicates sit above the plug-in,
    so the estimate (2 plug-in - median) is below it, and inside the interval (science review B2)."""
    labels, probs, groups = _planted(n=120, n_seeds=1)
    table = subgroup_metrics(labels, probs, groups[["sex"]], task="multiclass", n_resamples=200, min_cases=30)
    assert (table["ece"] < table["ece_plug_in"]).all()
    assert ((table["ece_ci_low"] <= table["ece"]) & (table["ece"] <= table["ece_ci_high"])).all()


def test_a_subgroup_with_one_outcome_is_skipped():
    labels = np.array([0, 1] * 20 + [2] * 40)
    probs = {"a": np.full((1, 80, 3), 1 / 3, np.float16)}
    groups = pd.DataFrame({"sex": ["male"] * 40 + ["female"] * 40})  # the women are all class 2
    table = subgroup_metrics(labels, probs, groups, task="multiclass", n_resamples=20, min_cases=10)
    assert set(table["subgroup"]) == {"male"}
    assert table.attrs["skipped"] == [("sex", "female", 40, "one outcome only")]


def test_age_groups_and_metadata_columns_are_defined_once(tmp_path, caplog):
    assert age_groups([0, 39.9, 40, 79, 80, 130, np.nan, -1]).tolist() == [
        "<40", "<40", "40-59", "60-79", "80+", "unknown", "unknown", "unknown"]
    raw = pd.DataFrame({"Sex": ["Male", "F", "", "Unknown"], "Age": ["45", "", "x", "81"]})
    with caplog.at_level(logging.INFO):
        out = subgroup_columns(raw, tmp_path / "x.csv", sex="Sex", age="Age", site="anatom_site_general")
    assert out["sex"].tolist() == ["male", "female", "unknown", "unknown"]
    assert out["age_group"].tolist() == ["40-59", "unknown", "unknown", "80+"]
    assert out["site"].tolist() == ["unknown"] * 4  # an absent column: all unknown, logged
    assert "no column 'anatom_site_general': site is unknown for all 4 rows" in caplog.text
    assert "column 'Sex': sex is unknown for 2 of 4 rows" in caplog.text


# ---------------------------------------------------------------- a tiny grid
MICRO = {"datasets": ["isic2019"], "transfer": {}, "encoders": ["demo.color_histogram", "demo.pixel_pca"],
         "seeds": [0, 1], "label_fractions": [0.25, 1.0], "perturbations": ["jpeg"], "severities": [3],
         "control_probes": {"probes": []}, "demo_world": {"n_images": {"isic2019": 200}}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_grid):
    yield from tiny_grid(tmp_path_factory, "subgroups", MICRO, freeze=True)


def test_test_cases_join_the_dataset_table_in_stored_order(tiny):
    groups = case_groups(tiny, "isic2019", ("sex", "age_group", "site", "view"))
    assert list(groups.columns) == ["sex", "age_group", "site"]  # ISIC has no view
    table = prepare_dataset(tiny.profile, "isic2019", progress=False)
    test = table[table["split"] == "test"].reset_index(drop=True)  # the grid's test split, sorted by image_id
    pd.testing.assert_frame_equal(groups, test[["sex", "age_group", "site"]])
    assert set(groups["sex"]) <= {"male", "female", "unknown"}


def test_chapters_02_and_09_compute_the_subgroup_table_once(tiny, monkeypatch):
    """The second chapter's kernel (a new RunAnalysis of the same run) reads the first one's table."""
    from crsrepro.analyse import subgroups

    first = subgroup_table(tiny, n_resamples=31, min_cases=8)
    monkeypatch.setattr(subgroups, "_subgroup_table", lambda *args: pytest.fail("computed a second time"))
    again = type(tiny)(tiny.profile, tiny.results, manifest_dir=tiny.manifest_dir, rng=tiny.rng)
    pd.testing.assert_frame_equal(subgroup_table(again, n_resamples=31, min_cases=8), first)
    assert subgroup_table(again, n_resamples=31, min_cases=8).attrs["skipped"] == first.attrs["skipped"]
    with pytest.raises(pytest.fail.Exception, match="second time"):  # other inputs: computed
        subgroup_table(again, n_resamples=32, min_cases=8)


def test_subgroup_table_and_worst_subgroup_on_a_tiny_grid(tiny):
    table = subgroup_table(tiny, n_resamples=50, min_cases=8)
    assert list(table.columns) == COLUMNS and set(table["encoder"]) == set(tiny.profile.encoders)
    assert set(table["attribute"]) <= {"sex", "age_group", "site"} and len(table)
    # the whole-test-set values are the cells' D and C (float16 storage rounds confident probabilities into
    # ties: up to about 1e-2 of AUROC on this 40-case test split); the AUROC is over the subgroup's classes,
    # so it is the cell's D where the subgroup has all eight
    cells = tiny.cell_means.set_index("encoder")
    np.testing.assert_allclose(table["ece_whole"], cells.loc[table["encoder"], "ece"], atol=5e-3)
    full = table[table["n_classes"] == 8]
    np.testing.assert_allclose(full["auroc_whole"], cells.loc[full["encoder"], "auroc"], atol=1e-2)
    assert (table["n_classes"] < 8).any()  # small subgroups lack rare classes: the like-with-like case

    worst = worst_subgroup(tiny, table)
    for encoder, row in worst.per_encoder.iterrows():
        mine = table[table["encoder"] == encoder]
        assert row["auroc_gap_plug_in"] == mine["auroc_gap_plug_in"].min()
        assert row["ece_gap_plug_in"] == mine["ece_gap_plug_in"].max()
        assert 0 <= row["auroc_p_worst"] <= 1
    # the worst-subgroup CRS: D and C of the worst subgroup, L and R kept, the frozen frame
    cell = worst.cells.set_index("encoder")
    profiles = tiny.cell_means.set_index("encoder")
    profiles.loc[cell.index, ["auroc", "ece"]] = cell[["auroc_plug_in", "ece_plug_in"]].to_numpy()
    expected = aggregate_crs(crs_scores(profiles.reset_index(), tiny.frame))
    pd.testing.assert_series_equal(worst.aggregate["crs"], expected["crs"])
    assert worst.agreement.n_pairs == 1 and worst.ranking_changes == (worst.agreement.reversed_pairs > 0)
    assert worst.n_cells_unchanged == 0
    # the book's side: the worst-subgroup summary's intervals bracket their estimates, the prose quotes them
    from crsrepro.present.report import numbers, tables

    summary = tables.worst_subgroup_summary(table, worst)  # estimate [low, high] in one column, where beside it
    for column in ("largest AUROC drop [95 % CI]", "largest ECE rise [95 % CI]"):
        for text in summary[column]:
            estimate, low, high = (float(v) for v in text.replace("[", "").replace("]", "").replace(",", "").split())
            assert low <= estimate <= high
    first = worst.per_encoder.iloc[0]
    assert summary["AUROC drop in"].iloc[0] == (f"{first['auroc_dataset']}: {first['auroc_attribute']} = "
                                                 f"{first['auroc_subgroup']}")
    drops = tables.largest_subgroup_drops(table, n=5)  # the same rows as the table's five lowest gaps
    assert len(drops) == 5 and "auroc_gap_ci_low" not in drops.columns and "auroc_whole" not in drops.columns
    assert list(drops.index.get_level_values("encoder")) == list(table.sort_values("auroc_gap").head(5)["encoder"])
    glue = numbers.subgroups(table, worst)
    low, high = (float(v) for v in glue["worst_auroc_gap_ci"].strip("[]").split(", "))
    assert low <= float(glue["worst_auroc_gap"]) <= high and glue["worst_p_worst_median"].endswith("%")
    none = numbers.subgroups(table.iloc[:0], None)
    assert none["n_subgroups"] == "0" and all(v == "n/a" for k, v in none.items() if not k.startswith("n_"))
    assert set(none) == set(glue)
