"""The claims page (DESIGN.md section 12): the claims file, the status logic, and the measurements on a
small synthetic results table in the tidy layout of crsrepro.run.results."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from crsrepro.core.errors import CrsreproError
from crsrepro.core.schema import RUN_KEYS
from crsrepro.present.chapters import CHAPTERS
from crsrepro.present.claims import (CLAIMS_PATH, STATUSES, ClaimsError, claims_table, load_claims,
                                     paper_checks, reversed_pairs_for_tau, run_claims)
from crsrepro.present.measurements import measure
from crsrepro.profiles import load_profile

SEED_REVIEW = Path(__file__).parents[1] / ".." / "shared" / "seed" / "000_e17ff5654a74f3ba.txt"
CLAIMS = load_claims()


# --------------------------------------------------------------------------- the claims file

def test_claims_file_loads_with_unique_ids_and_known_chapters():
    """Every claim names a chapter that measures claims (:data:`CHAPTERS`), and every such chapter has one."""
    assert len(CLAIMS) > 100 and CLAIMS["id"].is_unique
    assert set(CLAIMS["notebook"]) == {name for name, chapter in CHAPTERS.items() if chapter.claims}
    assert set(CLAIMS["scope"]) == {"any", "paper"}
    ranges = CLAIMS[CLAIMS["value"].map(lambda v: isinstance(v, tuple))]
    assert set(ranges["id"]) >= {"crs_leader_diff_ci", "recalibration_relative_reduction", "rad_dino_depth50_gain"}


def test_the_counts_the_brief_names_are_claimed():
    value = CLAIMS.set_index("id")["value"]
    assert (value["n_runs"], value["n_seed_aggregated_rows"], value["n_cells"]) == (17575, 3515, 43)
    assert (value["chexpert_images"], value["isic_images"], value["aptos_images"]) == (191229, 25331, 3662)
    assert (value["auroc_crs_n_pairs"], value["auroc_crs_reversed_pairs"]) == (105, 21)
    assert value["crs_leader_diff_ci"] == (-0.097, 0.017)


@pytest.mark.skipif(not SEED_REVIEW.is_file(), reason="the seed review is not next to this checkout")
def test_every_source_sentence_occurs_verbatim_in_the_seed_review():
    review = SEED_REVIEW.read_text(encoding="utf-8")
    missing = [c.id for c in CLAIMS.itertuples() if c.source not in review]
    assert not missing, f"sources not found verbatim in {SEED_REVIEW.name}: {missing}"


CHINESE_NUMERALS = {"零": 0, "一": 1, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "八": 8, "十二": 12, "十五": 15}
# Values that a source implies without writing them: sums, consistency checks, "none", "unchanged".
DERIVED = {"p_rank1_sum", "reversed_pairs_implied_by_tau", "lodo_champions_recovered",
           "chexpert_mae_resnet50_never_match_vit", "lora_top3_overlap", "insertion_fixed_movement"}


def _numbers_in(sentence: str) -> set[float]:
    """Every number written in a sentence: decimal commas, thin-space thousands, percents, numerals."""
    found = set()
    for match in re.finditer(r"[-+]?\d+(?: \d{3})*(?:,\d+)?( %)?", sentence):
        number = float(match.group(0).replace(" %", "").replace(" ", "").replace(",", "."))
        found |= {number, number / 100} if match.group(1) else {number}
    return found | {v for word, v in CHINESE_NUMERALS.items() if word in sentence}


def test_every_value_is_written_in_its_source_sentence():
    wrong = []
    for claim in CLAIMS.itertuples():
        if claim.id in DERIVED:
            continue
        values = claim.value if isinstance(claim.value, tuple) else (claim.value,)
        written = _numbers_in(claim.source)
        if not all(any(np.isclose(v, w) for w in written) for v in values):
            wrong.append((claim.id, claim.value, sorted(written)))
    assert not wrong


def _write_claims(tmp_path, entries, version=1):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"version": version, "claims": entries}, allow_unicode=True), encoding="utf-8")
    return path


GOOD = dict(id="x_count", value=3, kind="count", source="三", gloss="three", section="DESIGN.md 7",
            notebook="00_setup", measure="x", scope="any")


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, r"claim 1 \(id 'x_count'\): unknown field\(s\) colour"),
    ({"gloss": None}, r"claim 1 \(id 'x_count'\): gloss must be a non-empty string"),
    ({"scope": "everywhere"}, r"claim 1 \(id 'x_count'\): scope must be one of any, paper"),
    ({"value": [0.3, 0.1]}, r"value must be a number or \[low, high\]"),
    ({"value": "0,5"}, r"value must be a number"),
    ({"notebook": ""}, r"notebook must be a non-empty string"),
    ({"id": "BadId"}, r"id must be snake_case"),
    ({"analogue": "y"}, r"analogue is only for scope paper"),
])
def test_a_bad_entry_names_itself_and_the_field(tmp_path, change, message):
    path = _write_claims(tmp_path, [GOOD | change])
    with pytest.raises(ClaimsError, match=message):
        load_claims(path)


def test_missing_fields_duplicates_version_and_file_are_user_errors(tmp_path):
    entry = {k: v for k, v in GOOD.items() if k != "source"}
    with pytest.raises(ClaimsError, match=r"claim 2 \(id 'x_count'\): missing field\(s\) source"):
        load_claims(_write_claims(tmp_path, [GOOD | {"id": "first"}, entry]))
    with pytest.raises(ClaimsError, match="claim 2 repeats the id 'x_count'"):
        load_claims(_write_claims(tmp_path, [GOOD, GOOD]))
    with pytest.raises(ClaimsError, match="version 2"):
        load_claims(_write_claims(tmp_path, [GOOD], version=2))
    with pytest.raises(CrsreproError, match="no claims file"):
        load_claims(tmp_path / "absent.yaml")
    assert load_claims(_write_claims(tmp_path, [GOOD]))["value"].tolist() == [3.0]


# --------------------------------------------------------------------------- status logic

STATUS_CLAIMS = [
    GOOD | {"id": "any_measured", "measure": "m_any"},
    GOOD | {"id": "any_missing", "measure": "m_absent", "notebook": "07_lora"},
    GOOD | {"id": "any_undefined", "measure": None, "note": "a remark"},
    GOOD | {"id": "paper_with_analogue", "measure": "m_paper", "scope": "paper", "analogue": "m_analogue"},
    GOOD | {"id": "paper_without_analogue", "measure": "m_paper", "scope": "paper"},
    GOOD | {"id": "paper_analogue_missing", "measure": "m_paper", "scope": "paper", "analogue": "m_absent",
            "notebook": "06_layer_depth"},
    GOOD | {"id": "paper_range", "value": [0.1, 0.2], "measure": "m_range", "scope": "paper"},
]
MEASURED = {"m_any": 3.0, "m_paper": 0.9123, "m_analogue": 0.61, "m_range": (0.12, 0.25), "m_none": None}


def _table(tmp_path, paper_scope):
    return claims_table(load_claims(_write_claims(tmp_path, STATUS_CLAIMS)), MEASURED,
                        paper_scope=paper_scope).set_index("id")


def test_status_on_a_non_paper_profile(tmp_path):
    table = _table(tmp_path, False)
    assert set(table["status"]) <= set(STATUSES)
    assert table.loc["any_measured", ["this run", "status"]].tolist() == ["3", "measured"]
    assert table.loc["any_missing", ["this run", "status"]].tolist() == ["", "not measured"]
    assert "needs 07_lora" in table.loc["any_missing", "note"]
    assert table.loc["any_undefined", "note"] == "no measurement is defined; a remark"
    # a paper-scope claim is never compared here: its own measurement is not shown even when present
    assert table.loc["paper_with_analogue", ["this run", "status"]].tolist() == ["0.61", "paper profile only"]
    assert table.loc["paper_with_analogue", "note"] == "analogue `m_analogue`: this run's own, not compared"
    assert table.loc["paper_without_analogue", ["this run", "status"]].tolist() == ["", "paper profile only"]
    assert table.loc["paper_analogue_missing", "this run"] == ""
    assert "needs 06_layer_depth" in table.loc["paper_analogue_missing", "note"]


def test_status_on_the_paper_profile(tmp_path):
    table = _table(tmp_path, True)
    assert table.loc["paper_with_analogue", ["this run", "status"]].tolist() == ["0.9123", "measured"]
    assert table.loc["paper_range", ["paper value", "this run"]].tolist() == ["[0.1, 0.2]", "[0.12, 0.25]"]
    assert table.loc["paper_analogue_missing", "status"] == "measured"
    assert table.loc["any_missing", "status"] == "not measured"
    assert list(table.columns) == ["claim", "source", "paper value", "this run", "notebook", "status", "note"]


def test_a_measurement_given_as_none_is_not_measured(tmp_path):
    claims = load_claims(_write_claims(tmp_path, [GOOD | {"measure": "m_none"}]))
    assert claims_table(claims, MEASURED, paper_scope=True)["status"].tolist() == ["not measured"]


def test_reversed_pairs_for_tau():
    assert reversed_pairs_for_tau(0.600, 15) == 21
    assert paper_checks(CLAIMS) == {"reversed_pairs_for_paper_tau": 21}   # the paper's tau over its 15 encoders
    assert reversed_pairs_for_tau(1.0, 4) == 0 and reversed_pairs_for_tau(-1.0, 4) == 6
    with pytest.raises(ValueError, match="0 counts"):
        reversed_pairs_for_tau(0.5, 4)  # 4 encoders: tau-b is 1 - r/3, never 0.5


# --------------------------------------------------------------------------- measurements

QUALITY = {"general.vit_b16": 0.45, "general.mae": 0.2, "general.resnet50": 0.3, "medical.medgemma": 0.9,
           "medical.medsiglip": 0.85, "specialist.panderm": 0.7}
DATASETS = ("isic2019", "aptos2019", "chexpert")
FRACTIONS = (0.01, 0.1, 1.0)
PERTURBED = {"gaussian_blur@1": 0.02, "jpeg@3": 0.06}


def make_results(seeds=(0, 1, 2)) -> pd.DataFrame:
    """A tidy results table (one row per run and metric) with structure we can compute by hand."""
    rng = np.random.default_rng(1)
    rows = []

    def add(auroc, ece, **keys):
        base = dict(probe="linear", layer="final", regime="frozen", recalibrator="none") | keys
        rows.extend([base | {"metric": "auroc", "value": auroc}, base | {"metric": "ece", "value": ece}])

    for encoder, q in QUALITY.items():
        for d, dataset in enumerate(DATASETS):
            for seed in seeds:
                keys = dict(encoder=encoder, family=encoder.split(".")[0], dataset=dataset, seed=seed)
                full = 0.62 + 0.3 * q + 0.01 * d + rng.normal(0, 0.004)
                ece = 0.16 - 0.12 * q + 0.01 * d + rng.normal(0, 0.003)
                for f in FRACTIONS:
                    add(full - (1 - f) * 0.2 * (1 - q), ece + 0.03 * (1 - f), **keys, label_fraction=f,
                        condition="clean")
                for condition, drop in PERTURBED.items():
                    add(full - drop * (1.4 - q), ece + drop * (2 - q) + rng.normal(0, 0.002), **keys,
                        label_fraction=1.0, condition=condition)
                add(full + 0.001, ece * 0.4, **keys, label_fraction=1.0, condition="clean",
                    recalibrator="temperature")
                if dataset == "chexpert":
                    mimic = full - (0.2 if keys["family"] == "general" else 0.07) + rng.normal(0, 0.01)
                    add(mimic, ece + 0.1, **keys, label_fraction=1.0, condition="mimic_cxr")
    return pd.DataFrame(rows)[RUN_KEYS + ["metric", "value"]]


RESULTS = make_results()


def _mean(metric, **keys):
    """Mean over seeds of one metric on the rows matching ``keys`` (defaults: the primary protocol)."""
    keys = dict(probe="linear", layer="final", regime="frozen", recalibrator="none") | keys
    rows = RESULTS[(RESULTS["metric"] == metric) & np.logical_and.reduce([RESULTS[k] == v for k, v in keys.items()])]
    return rows.groupby([c for c in ("encoder", "dataset") if c not in keys])["value"].mean()


# A depth sweep, seed-mean clean AUROC per (encoder, dataset) and depth (%): RAD-DINO is best at 50 % on both
# its datasets (+1.5 and +1.3 points over 100 %), DINOv2 at 75 %, ViT-B/16 at 100 %: 3 of 4 pairs.
DEPTH_AUROC = {("specialist.rad_dino", "chexpert"): {25: 0.70, 50: 0.800, 75: 0.78, 100: 0.785},
               ("specialist.rad_dino", "isic2019"): {25: 0.60, 50: 0.700, 75: 0.69, 100: 0.687},
               ("general.dinov2", "chexpert"): {25: 0.65, 50: 0.700, 75: 0.75, 100: 0.740},
               ("general.vit_b16", "isic2019"): {25: 0.60, 50: 0.650, 75: 0.70, 100: 0.720}}


def make_depth_table() -> pd.DataFrame:
    """:attr:`RunAnalysis.depth` (:func:`crsrepro.analyse.depth.depth_profiles`) for :data:`DEPTH_AUROC`, two seeds symmetric around the means."""
    rows = []
    for (encoder, dataset), by_depth in DEPTH_AUROC.items():
        for seed, noise in ((0, -0.002), (1, 0.002)):
            for layer, depth in [*((f"depth{d}", float(d)) for d in by_depth), ("final", np.nan)]:
                auroc = by_depth[int(depth)] + noise * depth / 50 if layer != "final" else by_depth[100] - 0.01
                rows.append({"encoder": encoder, "family": encoder.split(".")[0], "dataset": dataset, "seed": seed,
                             "layer": layer, "depth": depth, "auroc": auroc, "ece": 0.05, "retention": 0.9,
                             "robustness": 0.9, "val_auroc": auroc})
    return pd.DataFrame(rows)


def make_lora_comparison():
    """Frozen vs LoRA on synthetic profiles: on ISIC every encoder gains 0.02 (same order), on APTOS the
    LoRA order is the frozen one reversed (the leader changes)."""
    from crsrepro.analyse.lora import compare

    encoders = list(QUALITY)[:4]
    frozen, lora = [], []
    for dataset in ("isic2019", "aptos2019"):
        for seed in (0, 1):
            for i, encoder in enumerate(encoders):
                base = {"encoder": encoder, "dataset": dataset, "seed": seed, "ece": 0.05 + 0.01 * i,
                        "retention": 0.9, "robustness": 0.9}
                frozen.append(base | {"auroc": 0.9 - 0.05 * i})
                lora.append(base | {"auroc": 0.92 - 0.05 * i if dataset == "isic2019" else 0.74 + 0.05 * i})
    return compare(pd.DataFrame(frozen), pd.DataFrame(lora))


def _no_sweep(self):
    raise CrsreproError("no depth sweep or LoRA grid in this test")


def _without_sweeps(patch):
    """Make the depth sweep and the LoRA grid unavailable (they would compute on the smoke profile)."""
    from crsrepro.analyse.run_analysis import RunAnalysis

    patch.setattr(RunAnalysis, "depth", property(_no_sweep))
    patch.setattr(RunAnalysis, "lora", property(_no_sweep))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from crsrepro.analyse.run_analysis import RunAnalysis

    manifests = tmp_path_factory.mktemp("manifests")
    pd.DataFrame({"image_id": list("abcdefg"), "split": "train", "group": list("abcdefg")}).to_csv(
        manifests / "isic2019_smoke.csv", index=False)
    _freeze(RESULTS, manifests)
    analysis = RunAnalysis(load_profile("smoke"), RESULTS, manifest_dir=manifests)
    analysis.__dict__["depth"] = make_depth_table()   # the cached properties, set as the chapters would read them
    analysis.__dict__["lora"] = make_lora_comparison()
    values = measure(analysis)
    assert list(manifests.glob("crs_reference_*.yaml")) == [manifests / "crs_reference_smoke.yaml"]  # read, not rewritten
    return values


def _freeze(results, manifests):
    """Freeze a frame from hand-made results (``freeze_frame`` itself refuses them: they are not the
    smoke profile's grid)."""
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.score.crs import ReferenceFrame
    from crsrepro.score.frame import frame_path

    analysis = RunAnalysis("smoke", results, manifest_dir=manifests)
    ReferenceFrame.freeze(analysis.reliability_profiles, results_hash=analysis.results_hash).save(
        frame_path(analysis.profile, manifests))


def test_protocol_counts_are_always_measured(measured):
    assert (measured["paper_grid_runs"], measured["paper_grid_rows"], measured["paper_grid_cells"]) == (17575, 3515, 43)
    assert measured["paper_panel_pairs"] == 105
    assert measured["n_labels:chexpert"] == 14 and measured["n_labels:isic2019"] == 8
    assert measured["ece_worked_example"] == pytest.approx(0.15)
    assert (measured["auroc_perfect_ranking"], measured["auroc_constant_score"]) == (1.0, 0.5)
    assert measured["crs_weight:pareto"] == 0.6 and measured["knn_k"] == 5 and measured["ece_bins"] == 15
    assert measured["n_images:isic2019"] == 7 and "n_images:chexpert" not in measured  # no manifest, no count


def test_rankings_match_hand_computation(measured):
    auroc = _mean("auroc", condition="clean", label_fraction=1.0).groupby("encoder").mean()
    for encoder, value in auroc.items():
        assert measured[f"aggregate_auroc:{encoder}"] == pytest.approx(value)
    assert measured["aggregate_auroc:rank1"] == pytest.approx(auroc.max())
    assert measured["rank_auroc:medical.medgemma"] == 1 and measured["rank_auroc:general.mae"] == 6
    crs = {e: measured[f"aggregate_crs:{e}"] for e in QUALITY}
    leader = max(crs, key=crs.get)
    assert measured["rank_crs:" + leader] == 1 and measured["aggregate_crs:rank1"] == crs[leader]
    assert measured["auroc_crs_n_pairs"] == 15
    assert 0 <= measured["auroc_crs_reversed_pairs"] <= 15


def test_bootstrap_and_insertion_laws(measured):
    assert measured["p_rank1_sum"] == pytest.approx(1.0) and measured["p_top3_sum"] == pytest.approx(3.0)
    low, high = measured["crs_diff_ci:rank1-rank2"]
    assert low <= high
    assert measured["insertion_movement_max:fixed"] == 0.0
    assert measured["insertion_movement_max:cohort"] > 0
    assert measured["insertion_panel_size"] == 3 and measured["insertion_n_trials"] == 30


def test_calibration_transfer_and_label_efficiency_match_hand_computation(measured):
    before = _mean("ece", condition="clean", label_fraction=1.0)
    after = _mean("ece", condition="clean", label_fraction=1.0, recalibrator="temperature")
    cell = ("general.vit_b16", "aptos2019")
    assert measured["ece:general.vit_b16:aptos2019"] == pytest.approx(before[cell])
    assert measured["ece_recalibrated:general.vit_b16:aptos2019"] == pytest.approx(after[cell])
    assert measured["recalibration_relative_reduction_range"] == pytest.approx((0.6, 0.6))
    assert measured["recalibration_mean_auroc_change"] == pytest.approx(0.001)
    assert measured["recalibration_mean_absolute_drop"] == pytest.approx((before - after).mean())

    mimic = _mean("auroc", dataset="chexpert", condition="mimic_cxr", label_fraction=1.0)
    general = [e for e in QUALITY if e.startswith("general.")]
    assert measured["transfer_auroc_mean:general"] == pytest.approx(mimic[general].mean())
    assert measured["transfer_auroc_mean:medical"] == pytest.approx(mimic.drop(general).mean())
    assert measured["transfer_welch_p"] < 0.05

    at_1pct = _mean("auroc", condition="clean", label_fraction=0.01)
    assert measured["auroc_at_1pct:medical.medgemma:aptos2019"] == pytest.approx(at_1pct[("medical.medgemma", "aptos2019")])
    bar = _mean("auroc", condition="clean", label_fraction=1.0)[("general.vit_b16", "chexpert")]
    medical = [e for e in QUALITY if not e.startswith("general.")]
    assert measured["chexpert_1pct_reaching_vit_b16:medical"] == sum(at_1pct[(e, "chexpert")] >= bar for e in medical)
    assert measured["chexpert_reaching_vit_b16:mae_resnet50"] == 0
    assert measured["aulc_rho:encoder"] > 0.9
    assert measured["degradation_n_cells"] == 18 and -1 <= measured["degradation_pearson_r"] <= 1
    assert measured["ece_mean_rise:largest"] == max(measured[f"ece_mean_rise:{e}:{d}"] for e in QUALITY for d in DATASETS)
    assert set(measured) >= {"external_validity_rho:crs", "lodo_rho:chexpert", "lodo_champions_recovered"}


def test_depth_measures_match_hand_computation(measured):
    assert (measured["depth_n_sweeps"], measured["depth_intermediate_wins"]) == (4, 3)
    assert measured["depth_best:specialist.rad_dino"] == 0.5 and measured["depth_best:general.dinov2"] == 0.75
    assert measured["depth_best:general.vit_b16"] == 1.0
    assert measured["depth_gain_points_range:specialist.rad_dino:depth50"] == pytest.approx((1.3, 1.5))
    assert measured["depth_gain_points_range:general.dinov2:depth75"] == pytest.approx((1.0, 1.0))
    assert "depth_gain_points_range:specialist.rad_dino:depth100" not in measured


def test_lora_measures_match_hand_computation(measured):
    assert measured["lora_auroc_gain:isic2019"] == pytest.approx(0.02)
    assert measured["lora_auroc_gain:aptos2019"] == pytest.approx(-0.01)
    assert measured["lora_kendall_tau:isic2019"] == pytest.approx(1.0)
    assert measured["lora_kendall_tau:aptos2019"] == pytest.approx(-1.0)
    assert measured["lora_leader_changes"] == 1
    crs = make_lora_comparison().crs
    assert measured["lora_crs_kendall_tau"] == pytest.approx(crs.kendall_tau)
    assert measured["lora_crs_mean_abs_rank_shift"] == pytest.approx(crs.mean_abs_rank_shift)
    assert sorted(measured[f"lora_rank:{e}"] for e in list(QUALITY)[:4]) == [1, 2, 3, 4]
    # the paper's protocol for the adapter's shape; epochs and seeds only from what trained (nothing here)
    assert (measured["lora_rank"], measured["lora_alpha"]) == (8, 16)
    assert "lora_epochs" not in measured and "lora_seeds" not in measured


def test_chapters_06_and_07_quote_the_same_analyses(measured):
    """The numbers the depth and LoRA chapters glue are the ones the claims page measures from the same
    sweep and comparison (the ``measured`` fixture's analysis holds these two tables)."""
    from types import SimpleNamespace

    from crsrepro.present.chapters import chapter_numbers

    numbers = chapter_numbers(SimpleNamespace(depth=make_depth_table()), "06_layer_depth")
    assert (numbers["depth_pairs"], numbers["depth_wins"]) == (f"{measured['depth_n_sweeps']:.0f}",
                                                              f"{measured['depth_intermediate_wins']:.0f}")
    assert (numbers["depth_pairs"], numbers["depth_wins"], numbers["depth_n_seeds"]) == ("4", "3", "2")
    assert numbers["depth_top_gain_points"] == "1.5" and numbers["depth_top_depth"] == "50 %"
    gains = [measured[f"depth_gain_points_range:{e}:depth{d}"][1] for e in ("specialist.rad_dino", "general.dinov2")
             for d in (25, 50, 75)]
    assert numbers["depth_top_gain_points"] == f"{max(gains):.1f}"
    rows = pd.DataFrame({"encoder": ["a", "b", "a"], "seed": [0, 0, 1], "label_fraction": [0.25, 1.0, 1.0]})
    rows.attrs["epochs"] = 2
    numbers = chapter_numbers(SimpleNamespace(lora=make_lora_comparison(), lora_results=rows), "07_lora")
    assert (numbers["lora_epochs"], numbers["lora_n_seeds"], numbers["lora_n_domains"]) == ("2", "2", "2")
    assert numbers["lora_leader_changes"] == f"{measured['lora_leader_changes']:.0f}" == "1"
    assert numbers["lora_crs_tau"] == f"{measured['lora_crs_kendall_tau']:.3f}"
    assert numbers["lora_n_domains_below_frozen"] == "1"
    assert numbers["paper_gpu_hours"] == "24.8" and "not yet in benchmarks/" in numbers["lora_gpu_rate_source"]


def test_an_analysis_the_results_cannot_support_is_left_out(tmp_path, monkeypatch):
    four = ["general.mae", "general.resnet50", "medical.medgemma", "specialist.panderm"]
    no_transfer = RESULTS[(RESULTS["condition"] != "mimic_cxr") & RESULTS["encoder"].isin(four)]
    _freeze(no_transfer, tmp_path)
    _without_sweeps(monkeypatch)
    from crsrepro.analyse.run_analysis import RunAnalysis

    values = measure(RunAnalysis("smoke", no_transfer, manifest_dir=tmp_path))
    assert not any(k.startswith(("transfer_", "external_validity", "insertion_", "depth_", "lora_auroc")) for k in values)
    assert values["lora_rank"] == 8  # the protocol is always there
    assert "chexpert_1pct_reaching_vit_b16:medical" not in values  # no ViT-B/16, no bar
    assert "aggregate_crs:specialist.panderm" in values and "p_top3_sum" in values


def test_the_claims_page_for_synthetic_results(measured):
    page = claims_table(CLAIMS, measured, paper_scope=True).set_index("id")
    assert page.loc["n_runs", ["this run", "status"]].tolist() == ["17,575", "protocol"]  # an echo of the profile
    assert page.loc["auroc_medgemma", "status"] == "measured"
    assert page.loc["auroc_medgemma", "this run"] == f"{measured['aggregate_auroc:medical.medgemma']:.4g}"
    assert page.loc["lora_auroc_gain_isic", ["this run", "status"]].tolist() == ["0.02", "measured"]
    assert page.loc["rad_dino_best_depth", ["this run", "status"]].tolist() == ["0.5", "measured"]
    assert page.loc["lora_kendall_tau_chexpert", ["this run", "status"]].tolist() == ["", "not measured"]
    assert page.loc["dinov2_aptos_ece_before", "status"] == "not measured"  # DINOv2 is not in these results
    demo_page = claims_table(CLAIMS, measured, paper_scope=False).set_index("id")
    assert demo_page.loc["auroc_medgemma", "status"] == "paper profile only"
    assert demo_page.loc["auroc_medgemma", "this run"] == f"{measured['aggregate_auroc:rank1']:.4g}"
    assert demo_page.loc["insertion_fixed_movement", ["this run", "status"]].tolist() == ["0", "protocol"]  # an identity


def test_a_protocol_claim_is_never_measured(measured):
    """Every claim whose evidence is ``protocol`` reads ``protocol`` wherever its measurement is compared
    (scope ``any`` on every profile, every scope on the paper profile), and never ``measured``; off the
    paper profile a paper-scope one stays ``paper profile only`` (issue 24)."""
    protocol = CLAIMS[CLAIMS["evidence"] == "protocol"]
    assert len(protocol) >= 30 and {"n_runs", "knn_k", "p_rank1_sum", "lora_epochs"} <= set(protocol["id"])
    assert {"chexpert_images", "degradation_n_cells", "depth_n_sweeps"} <= set(protocol[protocol["scope"] == "paper"]["id"])
    everything = {m: 1.0 for m in CLAIMS["measure"].dropna()} | {m: 1.0 for m in CLAIMS["analogue"].dropna()}
    for paper_scope in (True, False):
        page = claims_table(CLAIMS, {**measured, **everything}, paper_scope=paper_scope).set_index("id")
        compared = protocol[(protocol["scope"] == "any") | paper_scope]["id"]
        assert (page.loc[compared, "status"] == "protocol").all(), page.loc[compared, "status"]
        assert "measured" not in set(page.loc[protocol["id"], "status"])
        assert "protocol" not in set(page.drop(index=compared)["status"])
        if not paper_scope:
            assert (page.loc[protocol[protocol["scope"] == "paper"]["id"], "status"] == "paper profile only").all()


def test_lora_epochs_and_seeds_are_what_trained_not_the_plan():
    """``lora_epochs`` and ``lora_seeds`` come from the LoRA results (the budget the merged row-sets trained
    for and the seeds of their rows), not from the profile's plan, which here says 8 epochs and 3 seeds."""
    from types import SimpleNamespace

    from crsrepro.present.measurements import _lora_trained_measures

    plan = load_profile("paper").lora
    rows = pd.DataFrame({"encoder": ["a", "a", "b"], "seed": [4, 4, 4], "label_fraction": [0.25, 1.0, 1.0]})
    rows.attrs["epochs"] = 2
    trained = _lora_trained_measures(SimpleNamespace(profile=load_profile("paper"), lora_results=rows))
    assert (plan.epochs, plan.n_seeds) == (8, 3)
    assert trained == {"lora_epochs": 2, "lora_seeds": 1}
    page = claims_table(CLAIMS[CLAIMS["id"].isin(["lora_epochs", "lora_seeds"])], trained, paper_scope=True)
    assert page[["this run", "status"]].values.tolist() == [["2", "protocol"], ["1", "protocol"]]
    assert page["note"].str.contains("not the plan").all()


def test_recalibration_claims_are_not_comparable_on_every_profile(measured):
    recalibration = CLAIMS[CLAIMS["measure"].fillna("").str.startswith("recalibration_")]["id"]
    assert len(recalibration) >= 4
    everything = {m: 0.5 for m in CLAIMS["measure"].dropna()} | {m: 0.5 for m in CLAIMS["analogue"].dropna()}
    for paper_scope in (True, False):
        page = claims_table(CLAIMS, everything, paper_scope=paper_scope).set_index("id")
        assert (page.loc[recalibration, "status"] == "not comparable").all(), page.loc[recalibration, "status"]
        assert page.loc[recalibration, "note"].str.contains("six main tests").all()


def test_the_claims_file_refuses_an_unknown_evidence(tmp_path):
    text = CLAIMS_PATH.read_text(encoding="utf-8").replace("  evidence: protocol", "  evidence: echo", 1)
    (tmp_path / "claims.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ClaimsError, match="evidence must be one of measured, protocol"):
        load_claims(tmp_path / "claims.yaml")


def test_default_claims_path_is_the_checkout_file():
    assert CLAIMS_PATH.name == "claims.yaml" and CLAIMS_PATH.parent.name == "data_manifests"


def test_seed_bootstrap_claims_are_not_comparable_without_seed_variance(measured):
    """DESIGN.md section 10: P(rank 1) and the paired intervals mean something only when the seeds vary D, C and R."""
    flat = dict(measured, has_seed_variance=0.0)
    page = claims_table(CLAIMS, flat, paper_scope=True).set_index("id")
    boot = CLAIMS[CLAIMS["measure"].fillna("").str.startswith(("p_rank1", "p_top3", "crs_diff_ci"))
                  & (CLAIMS["evidence"] != "protocol")]["id"]  # the sums are identities: protocol on any seeds
    assert len(boot) and (page.loc[boot, "status"] == "not comparable").all()
    assert (claims_table(CLAIMS, dict(measured, has_seed_variance=1.0), paper_scope=True)
            .set_index("id").loc[boot, "status"] != "not comparable").all()


def test_the_multiverse_column_can_fail(measured):
    """Issue 24: the column is the share of combinations in which the informative conclusions hold as in
    the default (leader, top three, tau within 0.10, reversals within 25 %), not tau < 1 or reversals > 0,
    which any two different rankings satisfy. Here the anchors move the leader in one combination of four."""
    from crsrepro.present.measurements import multiverse_shares

    ranking = ["a", "b", "c", "d"]
    table = pd.DataFrame({
        "is_default": [True, False, False, False],
        "leader": ["a", "a", "b", "a"],
        "top3": [("a", "b", "c"), ("a", "b", "c"), ("a", "b", "d"), ("a", "b", "c")],
        "kendall_tau": [0.6, 0.65, 0.2, 0.5],          # tau < 1 everywhere, within 0.10 in 3 of 4
        "reversed_pairs": [4, 4, 9, 5],                # > 0 everywhere, within max(1, 25 %) in 3 of 4
        "ranking": [ranking, ranking, ["b", "a", "d", "c"], ranking],
        "auroc_ranking": [ranking[::-1]] * 4,
        "rho_crs": [0.5, 0.9, 0.1, 0.2], "rho_auroc": [0.8, 0.8, 0.8, 0.8]})
    shares = multiverse_shares(table)
    assert shares["auroc_crs_kendall_tau"] == 0.75 and shares["auroc_crs_reversed_pairs"] == 0.75
    assert shares["p_rank1:"] == 0.75 and shares["auroc_crs_top3_overlap"] == 0.75
    assert shares["external_validity_rho:crs"] == 0.75  # rho_CRS <= rho_AUROC as in the default, 3 of 4
    page = claims_table(CLAIMS, measured, paper_scope=True, multiverse=shares).set_index("id")
    assert page.loc["auroc_crs_kendall_tau", "multiverse"] == "75%" and page.loc["n_runs", "multiverse"] == ""
    assert page.loc["p_rank1_panderm", "multiverse"] == "75%"  # a prefix covers every P(rank 1) claim
    assert "multiverse" not in claims_table(CLAIMS, measured, paper_scope=True).columns


def test_the_claims_page_of_a_run_is_computed_once_and_read_by_the_other_chapters(tmp_path, monkeypatch):
    """run_claims keeps the page of a grid run in <output_dir>/analysis/claims-<key>.pkl: another chapter's kernel
    reads it; another seed, other row-sets or a re-frozen frame compute a new one; a hand-built table
    (no row-sets) is never cached."""
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.present import claims

    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    calls = []

    def measured(analysis):
        calls.append(1)
        return {"paper_grid_runs": 17575.0}

    monkeypatch.setattr(claims, "measure", measured)
    monkeypatch.setattr(claims, "multiverse_shares", lambda table: {})

    def analysis(results, rng=0):
        a = RunAnalysis("smoke", results, rng=rng)
        a.__dict__["multiverse"] = None  # the cached property, set: the page needs no multiverse here
        return a

    run = pd.DataFrame({"rowset": ["k1", "k2"], "value": [0.1, 0.2]})
    first = run_claims(analysis(run))
    assert first.set_index("id").loc["n_runs", "this run"] == "17,575"
    assert len(calls) == 1 and len(list((tmp_path / ".crsrepro").rglob("analysis/claims-*.pkl"))) == 1
    pd.testing.assert_frame_equal(run_claims(analysis(run)), first)          # another chapter's kernel: read
    assert len(calls) == 1
    run_claims(analysis(run, rng=1))                                           # another input: computed
    run_claims(analysis(run.assign(rowset=["k1", "k3"])))
    assert len(calls) == 3
    (tmp_path / "manifests" / "crs_reference_smoke.yaml").write_text("frame\n")   # a (re)frozen frame
    run_claims(analysis(run))
    assert len(calls) == 4
    by_hand = pd.DataFrame({"value": [0.1]})                                    # no row-sets: never cached
    assert analysis(by_hand).shared_key() is None
    run_claims(analysis(by_hand))
    run_claims(analysis(by_hand))
    assert len(calls) == 6


def test_the_claims_page_compares_paper_claims_by_the_profile_key_not_its_name():
    """A copy of the paper's protocol under another name (``claims.paper_scope: true``) is compared."""
    from crsrepro.present.report.html import claims_box

    paper_claim = CLAIMS[CLAIMS["id"] == "auroc_medgemma"]
    measured = {"aggregate_auroc:medical.medgemma": 0.9, "aggregate_auroc:rank1": 0.8}
    for paper_scope, status in ((True, "measured"), (False, "paper profile only")):
        page = claims_table(paper_claim, measured, paper_scope=paper_scope)
        assert page["status"].tolist() == [status]
    copy = load_profile("paper")
    assert copy.claims.paper_scope and not load_profile("demo").claims.paper_scope
    box = claims_box(claims_table(paper_claim, measured, paper_scope=True), paper_claim["notebook"].iloc[0], copy)
    assert "analogue" not in box.data
