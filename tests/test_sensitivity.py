"""The sensitivity multiverse (DESIGN.md section 14): the default reproduces the book's CRS, a choice can reverse a ranking."""

import numpy as np
import pandas as pd
import pytest
import yaml

from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.analyse.sensitivity import (CHOICES, SPACE_PATH, SensitivityError, choice_effects, conclusions,
                                          inert_levels, inert_sentence, load_space, matters_most, multiverse)
from crsrepro.core.schema import PRIMARY, RUN_KEYS
from crsrepro.score.crs import ReferenceFrame, aggregate_crs, crs_scores
from crsrepro.score.frame import frame_path


def make_analysis(tmp_path, drops, *, datasets=("isic2019", "aptos2019", "chexpert"), seeds=(0, 1, 2), noise=0.01,
                  spread=1.0):
    """A RunAnalysis of the smoke profile over a synthetic runs table, with its frame frozen from it.

    ``drops`` maps each encoder to its AUROC drops under (gaussian_blur@1, jpeg@1, contrast@1); the
    encoders' clean AUROC and ECE improve with their order in ``drops`` (by ``spread`` steps) plus seed
    noise (``noise``).
    """
    rng = np.random.default_rng(0)
    rows = []
    for i, (encoder, encoder_drops) in enumerate(drops.items()):
        for dataset in datasets:
            for seed in seeds:
                base = dict(PRIMARY, family="general", encoder=encoder, dataset=dataset, seed=seed)
                auroc = 0.7 + 0.02 * spread * i + rng.normal(0, noise)
                ece = 0.10 - 0.005 * spread * i + rng.normal(0, noise / 2)
                run = lambda **kw: rows.append(base | dict(ece=ece, classwise_ece=ece * 0.8 + 0.01 * (i % 3)) | kw)  # noqa: E731
                run(label_fraction=0.1, condition="clean", auroc=auroc - 0.05 + rng.normal(0, noise))
                run(label_fraction=1.0, condition="clean", auroc=auroc)
                for condition, drop in zip(("gaussian_blur@1", "jpeg@1", "contrast@1"), encoder_drops):
                    run(label_fraction=1.0, condition=condition, auroc=auroc - drop)
                if dataset == "chexpert":
                    run(label_fraction=1.0, condition="mimic_cxr", auroc=auroc - 0.1 + rng.normal(0, 0.03))
    runs = pd.DataFrame(rows)
    results = runs.melt(id_vars=RUN_KEYS, value_vars=["auroc", "ece", "classwise_ece"], var_name="metric")
    analysis = RunAnalysis("smoke", results.assign(rowset="synthetic"), manifest_dir=tmp_path)
    ReferenceFrame.freeze(analysis.reliability_profiles).save(frame_path(analysis.profile, tmp_path))
    return analysis


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    rng = np.random.default_rng(1)
    drops = {f"enc{i}": tuple(rng.uniform(0.0, 0.12, 3)) for i in range(6)}
    analysis = make_analysis(tmp_path_factory.mktemp("panel"), drops)
    return analysis, multiverse(analysis, load_space())


def test_default_combination_reproduces_the_primary_scores_exactly(panel):
    analysis, table = panel
    default = table.index[table["is_default"]]
    assert len(default) == 1
    row = table.loc[default[0]]
    assert table.attrs["cells"] == list(analysis.scores[["encoder", "dataset"]].itertuples(index=False, name=None))
    np.testing.assert_array_equal(table.attrs["cell_crs"][default[0]], analysis.scores["crs"].to_numpy())
    aggregate = analysis.aggregate["crs"].reindex(table.attrs["encoders"]).to_numpy()
    np.testing.assert_array_equal(table.attrs["aggregate_crs"][default[0]], aggregate)
    assert list(row["ranking"]) == list(analysis.aggregate.index)
    agreement = analysis.rank_agreement
    assert row["kendall_tau"] == pytest.approx(agreement.kendall_tau)
    assert row["reversed_pairs"] == agreement.reversed_pairs
    assert row["rho_crs"] == pytest.approx(analysis.external_validity().rho_crs)
    assert row["rho_auroc"] == analysis.external_validity().rho_source_auroc
    # the same seed draws as the book's bootstrap (n_resamples 200, rng 0 in the smoke profile)
    assert row["p_rank1_leader"] == pytest.approx(analysis.bootstrap.p_rank1[row["leader"]])


def test_every_combination_is_scored_and_the_skipped_budget_is_noted(panel):
    _, table = panel
    space = load_space()
    assert len(table) == space.size // len(space.levels["c_budget"])  # full_val has no rows here
    assert any("c_budget full_val skipped" in note for note in table.attrs["notes"])
    assert table.groupby([c for c in CHOICES if c != "c_budget"]).ngroups == len(table)
    # the anchor values move only under the fixed anchors
    assert set(table.loc[table["anchors"] != "fixed", "anchor_values"]) == {"frozen"}
    assert np.isfinite(table["kendall_tau"]).all() and np.isfinite(table["rho_crs"]).all()


def test_minmax_anchors_are_the_cohort_mode_and_other_levels_recompute(panel):
    analysis, table = panel
    pick = lambda **kw: table.index[np.logical_and.reduce([table[k] == v for k, v in kw.items()])][0]  # noqa: E731
    base = dict(proximity="l2", robustness="mean_max", dominance="weak", multilabel_ece="top_label",
                weights="0.60/0.25/0.15")
    cohort = crs_scores(analysis.reliability_profiles, None, mode="cohort")  # the same code, so the same bits
    np.testing.assert_array_equal(table.attrs["cell_crs"][pick(anchors="minmax", **base)], cohort["crs"])
    np.testing.assert_array_equal(table.attrs["aggregate_crs"][pick(anchors="minmax", **base)],
                                  aggregate_crs(cohort)["crs"].reindex(table.attrs["encoders"]))
    # another R_raw aggregate rebuilds the profiles and moves the scores
    assert not np.array_equal(table.attrs["cell_crs"][pick(anchors="fixed", **(base | {"robustness": "worst"}))],
                              table.attrs["cell_crs"][pick(anchors="fixed", **base)])


def test_the_robustness_choice_reverses_a_toy_ranking(tmp_path):
    # a: no drop, no drop, 0.40 (mean 0.133, max 0.40); b: 0.20 everywhere. Equal elsewhere, so R_raw
    # decides (it is also the worst dimension): mean_max (0.733 vs 0.8) and worst (0.6 vs 0.8) favour b,
    # mean (0.867 vs 0.8) favours a.
    analysis = make_analysis(tmp_path, {"a": (0.0, 0.0, 0.40), "b": (0.20, 0.20, 0.20)},
                             datasets=("isic2019",), seeds=(0, 1), noise=0.0, spread=0.0)
    table = multiverse(analysis, load_space(), n_resamples=20)
    # moving R_raw's anchor to 0.85 maps both encoders' R_raw to 0, a tie: leave the anchor values out here
    table = table[table["anchor_values"] == "frozen"].reset_index(drop=True)
    leaders = table.groupby("robustness")["leader"].agg(set)
    assert leaders.to_dict() == {"mean": {"a"}, "mean_max": {"b"}, "worst": {"b"}}
    assert any("external validity skipped" in note for note in table.attrs["notes"])
    verdicts = conclusions(table, analysis)
    leader = verdicts.loc["the leader is b"]
    assert leader["share"] == pytest.approx(2 / 3)
    assert leader["verdict"] == "depends on robustness" and leader["splits_most"] == "robustness"
    effects = choice_effects(table)
    assert effects.index[0] == "robustness"
    assert matters_most(effects).startswith("The choice that matters most is robustness")


def test_the_shipped_space_loads_with_the_papers_weights_first():
    space = load_space()
    assert space.path == SPACE_PATH
    assert space.weights[0] == (0.60, 0.25, 0.15) and len(space.weights) == 19
    assert all(abs(sum(w) - 1) < 1e-9 and min(w) >= 0 for w in space.weights)
    assert space.levels["anchors"] == ("fixed", "minmax", "zscore")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(normalisation={"levels": ["fixed"]}), "unknown key 'normalisation'"),
    (lambda d: d["proximity"].update(order=2), "unknown key proximity.order"),
    (lambda d: d["proximity"].update(levels=["l2", "cosine"]), "unknown level 'cosine'"),
    (lambda d: d["dominance"].update(levels=["strict", "weak"]), "must start with the package's own choice 'weak'"),
    (lambda d: d["weights"].update(default=[0.5, 0.5, 0.5]), "weights.default"),
    (lambda d: d.pop("anchors"), "key 'anchors' is missing"),
])
def test_a_bad_space_names_the_file_and_the_key(tmp_path, edit, message):
    data = yaml.safe_load(SPACE_PATH.read_text())
    edit(data)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SensitivityError, match=str(path)) as error:
        load_space(path)
    assert message in str(error.value)


def test_specification_curve_marks_every_level_and_the_default(panel):
    from crsrepro.present.plots.sensitivity import specification_curve

    _, table = panel
    fig = specification_curve(table, "kendall_tau")
    top, bottom = fig.axes
    assert len(bottom.get_yticklabels()) == sum(table[c].nunique() for c in CHOICES if table[c].nunique() > 1)
    assert len(top.collections[0].get_offsets()) == 1  # the default combination
    with pytest.raises(ValueError, match="numeric column"):
        specification_curve(table, "leader")


def test_the_new_levels_are_scored_like_for_like(tmp_path):
    # identical seeds (no noise): averaging profiles or scores over the seeds gives the same CRS, so the
    # seed-averaging level moves no conclusion; a full_val budget that lowers each small-fraction AUROC
    # moves retention and nothing else
    drops = {"a": (0.0, 0.05, 0.10), "b": (0.02, 0.02, 0.02), "c": (0.08, 0.0, 0.04)}
    analysis = make_analysis(tmp_path, drops, datasets=("isic2019", "aptos2019"), seeds=(0, 1), noise=0.0)
    runs = analysis.runs
    small = (runs["label_fraction"] < 1) & (runs["condition"] == "clean")
    analysis.runs = runs.assign(auroc_full_val=np.where(small, runs["auroc"] - 0.03, np.nan))
    table = multiverse(analysis, load_space(), n_resamples=20)
    space = load_space()
    assert len(table) == space.size and set(table["c_budget"]) == {"nested_val", "full_val"}
    key = [c for c in CHOICES if c != "seed_averaging"]
    order = {o: t.sort_values(key).index for o, t in table.groupby("seed_averaging")}
    np.testing.assert_allclose(table.attrs["cell_crs"][order["scores"]], table.attrs["cell_crs"][order["profiles"]],
                               atol=1e-12)
    assert ("seed_averaging", "scores") in inert_levels(table)
    assert "seed_averaging scores" in inert_sentence(table)
    pick = lambda **kw: table.index[np.logical_and.reduce([table[k] == v for k, v in kw.items()])]  # noqa: E731
    fixed = dict(anchors="fixed", proximity="l2", robustness="mean_max", dominance="weak", multilabel_ece="top_label",
                 weights="0.60/0.25/0.15", seed_averaging="profiles", retention="ratio")
    nested, full = pick(**fixed, anchor_values="frozen", c_budget="nested_val")[0], pick(**fixed, anchor_values="frozen",
                                                                                       c_budget="full_val")[0]
    assert not np.array_equal(table.attrs["cell_crs"][nested], table.attrs["cell_crs"][full])
    # the chance-corrected retention and a moved ECE anchor each rescore the cells
    for other in (dict(retention="chance_corrected", anchor_values="frozen"), dict(anchor_values="ece=0.15")):
        moved = pick(**(fixed | other), c_budget="nested_val")[0]
        assert not np.array_equal(table.attrs["cell_crs"][nested], table.attrs["cell_crs"][moved])


def test_an_unknown_anchor_value_is_refused(tmp_path):
    data = yaml.safe_load(SPACE_PATH.read_text())
    data["anchor_values"]["levels"] = ["frozen", "ece=high"]
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SensitivityError, match="anchor_values.levels: unknown level 'ece=high'"):
        load_space(path)
