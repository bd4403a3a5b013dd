"""Layer-depth sweeps (DESIGN.md section 11): the taps' rows in the tidy schema, resumable, and the analyses."""

import numpy as np
import pandas as pd
import pytest

from scipy import stats

from crsrepro.analyse.depth import (best_depths, depth_profiles, exchangeable_wins, holm, intermediate_wins, paired_test,
                                    val_choices, val_selected_ranking, win_counts)
from crsrepro.core.schema import COLUMNS
from crsrepro.encoders import get_encoder_spec
from crsrepro.profiles import load_profile
from crsrepro.run.depth import DepthError, DepthStage, pairs, tap_depth, taps
from crsrepro.run.results import ResultStore
from crsrepro.run.stages import run_stages

PAIR = ("demo.random_cnn", "aptos2019")


def sweep(profile, pairs):
    """The depth stage of ``pairs``, run serially, and the profiles of its merged rows."""
    return depth_profiles(run_stages(profile, [DepthStage(pairs=tuple(pairs))], executor="serial", progress=False)[0])


@pytest.fixture(scope="module")  # minutes of grids: the full suite runs its tests (slow), test-fast does not
def tiny(tmp_path_factory):
    """A one-dataset smoke world with two perturbations, and its depth sweep of one pair."""
    root = tmp_path_factory.mktemp("depth")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CRSREPRO_HOME", str(root / "home"))
        patch.setenv("CRSREPRO_MANIFESTS", str(root / "manifests"))
        (root / "manifests").mkdir()
        profile = load_profile("smoke", overrides={"datasets": ["aptos2019"], "transfer": {}, "severities": [2],
                                                   "perturbations": ["jpeg", "contrast"],
                                                   "control_probes": {"probes": []}})
        table = sweep(profile, [PAIR])
        yield profile, table


@pytest.mark.slow
def test_sweep_writes_each_tap_in_the_tidy_schema(tiny):
    profile, table = tiny
    assert sorted(table["layer"].unique()) == ["depth25", "depth50", "depth75", "final"]
    assert len(table) == 4 * len(profile.seeds)
    assert table["depth"].tolist()[:4] == [25.0, 50.0, 75.0, 100.0]  # the demo network's final is its 100 % tap
    merged = pd.read_parquet(ResultStore(profile.output_path / "depth").merged_path)
    assert list(merged.columns) == COLUMNS and set(merged["regime"]) == {"frozen"}
    assert set(merged["metric"]) >= {"auroc", "ece", "val_auroc"}
    assert set(merged["recalibrator"]) == {"none"}  # the sweep scores no recalibrator
    # the taps give different numbers: each layer's features were really used
    assert table.groupby("layer")["auroc"].mean().nunique() == 4
    # the analyses read the sweep's own val AUROC; a demo network's two last layers are one (its final)
    assert table["val_auroc"].between(0, 1).all()
    references = [best_depths(table, r)["reference"].tolist() for r in ("depth100", "final")]
    assert references == [["final"], ["final"]]
    assert paired_test(table)["n_seeds"].tolist() == [len(profile.seeds)]


@pytest.mark.slow
def test_sweep_resumes_from_its_row_sets(tiny):
    profile, table = tiny
    runs = ResultStore(profile.output_path / "depth").runs_dir
    before = {p.name: p.stat().st_mtime_ns for p in runs.iterdir()}
    again = sweep(profile, [PAIR])
    assert {p.name: p.stat().st_mtime_ns for p in runs.iterdir()} == before
    pd.testing.assert_frame_equal(again, table)


def test_pairs_and_taps():
    assert taps(get_encoder_spec("demo.color_histogram")) == ["final"]
    assert np.isnan(tap_depth(get_encoder_spec("medical.biomedclip"), "final"))
    assert tap_depth(get_encoder_spec("general.dinov2"), "depth100") == 100.0
    smoke = load_profile("smoke")
    assert pairs(smoke) == [(e, d) for d in smoke.datasets for e in ("demo.random_cnn", "demo.med_cnn")]
    every = load_profile("smoke", overrides={"depth": {"exclude": []}})  # every network with depth taps
    assert {e for e, _ in pairs(every)} == {"demo.effnet_lite0", "demo.random_cnn", "demo.cxr_cnn", "demo.med_cnn"}
    assert len(pairs(load_profile("paper"))) == 8
    with pytest.raises(DepthError, match="demo.color_histogram has no depth taps"):
        DepthStage(pairs=(("demo.color_histogram", "isic2019"),)).plan(smoke, ResultStore(smoke.output_path / "depth"))
    with pytest.raises(DepthError, match="nih_cxr14 is not among profile 'smoke'.*inherits its depth.pairs"):
        DepthStage(pairs=(("demo.random_cnn", "nih_cxr14"),)).plan(smoke, ResultStore(smoke.output_path / "depth"))


def _synthetic(gain=0.05, projection=False):
    """Two pairs x 5 seeds: pair a peaks at 50 %, pair b at 100 %; val AUROC tracks test AUROC. With
    ``projection`` the 100 % tap is ``depth100`` and ``final`` (no depth) is a projection 0.1 below it."""
    rng = np.random.default_rng(0)
    last = [("depth100", 100.0), ("final", np.nan)] if projection else [("final", 100.0)]
    rows = []
    for encoder, peak in (("demo.random_cnn", 50), ("demo.cxr_cnn", 100)):
        for seed in range(5):
            for layer, depth in [("depth25", 25.0), ("depth50", 50.0), ("depth75", 75.0), *last]:
                at = 100 if np.isnan(depth) else depth
                auroc = 0.8 - 0.001 * abs(at - peak) + (gain if at == peak else 0) + rng.normal(0, 0.002)
                auroc -= 0.1 if np.isnan(depth) else 0
                rows.append(dict(encoder=encoder, family="x", dataset="chexpert", seed=seed, layer=layer, depth=depth,
                                 auroc=auroc, ece=0.1, retention=0.9, robustness=0.9, val_auroc=auroc))
    return pd.DataFrame(rows)


def test_best_depth_wins_and_paired_test():
    table = _synthetic()
    best = best_depths(table).set_index("encoder")
    assert best.loc["demo.random_cnn", "best_depth"] == 50 and best.loc["demo.cxr_cnn", "best_depth"] == 100
    assert best.loc["demo.random_cnn", "gain"] == pytest.approx(0.05 + 0.05, abs=0.01)
    assert intermediate_wins(table) == (1, 2)
    tested = paired_test(table).set_index("encoder")
    assert tested.loc["demo.random_cnn", "p"] < 0.001 and tested.loc["demo.random_cnn", "gain_points"] > 0
    assert tested.loc["demo.cxr_cnn", "gain_points"] < 0


def test_the_tap_is_chosen_on_val_and_judged_on_test():
    table = _synthetic()
    table["val_auroc"] = np.where(table["layer"] == "depth25", 0.99, 0.5)  # val prefers 25 %, test prefers 50 or 100 %
    best = best_depths(table).set_index("encoder")
    assert set(best["best_layer"]) == {"depth25"} and best["intermediate"].all()
    means = table.groupby(["encoder", "layer"])["auroc"].mean()
    at = means["demo.random_cnn"]
    assert best.loc["demo.random_cnn", "gain"] == pytest.approx(at["depth25"] - at["final"])
    assert set(paired_test(table)["layer"]) == {"depth25"}
    table["val_auroc"] = 0.7  # a tie on val goes to the last layer
    assert intermediate_wins(table) == (0, 2)


def test_both_last_layers_are_references():
    table = _synthetic(projection=True)
    by_depth100 = best_depths(table, "depth100").set_index("encoder")
    by_final = best_depths(table, "final").set_index("encoder")
    assert set(by_depth100["reference"]) == {"depth100"} and set(by_final["reference"]) == {"final"}
    # pair b peaks at the 100 % tap, but the projection is 10 points below it: an intermediate tap beats final
    assert not by_depth100.loc["demo.cxr_cnn", "intermediate"] and by_final.loc["demo.cxr_cnn", "intermediate"]
    assert (by_final["n_taps"] == 4).all() and (by_depth100["n_taps"] == 4).all()
    counts = win_counts(table)
    assert counts.loc["depth100", "wins"] == 1 and counts.loc["final", "wins"] == 2
    # the same tap is tested against both; the gains differ by the two last layers' mean difference
    means = table[table["encoder"] == "demo.cxr_cnn"].groupby("layer")["auroc"].mean()
    gains = [paired_test(table, r).set_index("encoder").loc["demo.cxr_cnn", "gain_points"] for r in ("final", "depth100")]
    assert gains[0] - gains[1] == pytest.approx(100 * (means["depth100"] - means["final"]))
    with pytest.raises(DepthError, match="reference must be one of depth100, final"):
        best_depths(table, "last")
    with pytest.raises(DepthError, match="demo.cxr_cnn on chexpert lacks an intermediate tap or its final tap"):
        best_depths(table[(table["layer"] != "final") | (table["encoder"] != "demo.cxr_cnn")], "final")


def test_holm_against_a_hand_computation():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> raised to 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005, np.nan]) == pytest.approx([0.03, 0.06, 0.06, 0.02, np.nan], nan_ok=True)
    assert holm([0.5, 0.6]).tolist() == [1.0, 1.0]  # capped at 1
    assert holm([0.02, 0.001]) == pytest.approx([0.02, 0.002])
    assert holm([]).size == 0


def test_paired_test_is_one_sided_with_holm_and_a_t_interval():
    table = _synthetic(gain=0.01)
    tested = paired_test(table).set_index("encoder")
    wide = table[table["encoder"] == "demo.cxr_cnn"].pivot_table(index="seed", columns="layer", values="auroc")
    tap = tested.loc["demo.cxr_cnn", "layer"]
    diff = 100 * (wide[tap] - wide["final"])  # by hand: the points, a one-sided p and a 95 % t-interval
    half = stats.t.ppf(0.975, 4) * diff.std(ddof=1) / np.sqrt(5)
    assert tested.loc["demo.cxr_cnn", ["gain_points", "ci_low", "ci_high"]].tolist() == pytest.approx(
        [diff.mean(), diff.mean() - half, diff.mean() + half])
    assert tested.loc["demo.cxr_cnn", "p"] == pytest.approx(stats.t.sf(diff.mean() / (diff.std(ddof=1) / np.sqrt(5)), 4))
    assert tested.loc["demo.cxr_cnn", "p"] > 0.99 and tested.loc["demo.cxr_cnn", "worse"]  # worse: one-sided p near 1
    assert tested["p_holm"].tolist() == pytest.approx(holm(tested["p"]).tolist())
    assert tested.loc["demo.random_cnn", "survives"] and not tested.loc["demo.cxr_cnn", "survives"]
    assert not paired_test(table, alpha=1e-12)["survives"].any()


def _exchangeable(n_pairs, seed=0, seeds=3):
    """``n_pairs`` pairs whose four taps are equally good: val and test AUROC are noise around one value."""
    rng = np.random.default_rng(seed)
    layers = [("depth25", 25.0), ("depth50", 50.0), ("depth75", 75.0), ("final", 100.0)]
    keys = [(f"e{p}", "chexpert", s, layer, depth) for p in range(n_pairs) for s in range(seeds) for layer, depth in layers]
    table = pd.DataFrame(keys, columns=["encoder", "dataset", "seed", "layer", "depth"])
    return table.assign(auroc=0.8 + rng.normal(0, 0.01, len(table)), val_auroc=0.8 + rng.normal(0, 0.01, len(table)))


def test_the_exchangeable_tap_null_count_equals_its_closed_form():
    n = 8
    assert exchangeable_wins([4] * n) == pytest.approx(stats.binom.pmf(np.arange(n + 1), n, 3 / 4))
    assert exchangeable_wins([4, 3]) == pytest.approx([1 / 12, 1 / 4 + 1 / 6, 1 / 2])  # Poisson-binomial
    # simulated: 400 sweeps of 8 exchangeable pairs; the count of val-chosen intermediate taps per sweep
    best = best_depths(_exchangeable(400 * n))
    counts = best["intermediate"].to_numpy().reshape(400, n).sum(axis=1)
    assert counts.mean() == pytest.approx(n * 3 / 4, abs=4 * np.sqrt(n * 3 / 16 / 400))
    observed = np.bincount(counts, minlength=n + 1) / 400
    assert np.abs(observed - exchangeable_wins([4] * n)).max() < 0.08
    sweep = _exchangeable(n, seed=1)
    row = win_counts(sweep).loc["depth100"]
    assert row["expected"] == n * 3 / 4 and row["pairs"] == n
    assert row["p_value"] == pytest.approx(stats.binom.sf(row["wins"] - 1, n, 3 / 4))


def test_val_choice_reads_val_never_test():
    table = _synthetic()
    table["val_auroc"] = np.where(table["layer"] == "depth25", 0.99, 0.5)  # val prefers 25 %, test does not
    assert set(val_choices(table)["layer"]) == {"depth25"}
    agreement, chosen = val_selected_ranking(table)
    assert set(chosen["layer"]) == {"depth25"} and agreement.n_pairs == 1


def test_the_claims_page_quotes_the_null_beside_the_win_count():
    from crsrepro.present.claims import claims_table, load_claims

    claims = load_claims()
    claims = claims[claims["id"] == "depth_intermediate_wins"]
    measured = {"depth_intermediate_wins": 3, "depth_intermediate_wins_null": 6.0, "depth_intermediate_wins_p": 0.99}
    for paper_scope in (True, False):
        note = claims_table(claims, measured, paper_scope=paper_scope)["note"].iloc[0]
        assert "exchangeable taps would give 6 on this run's pairs (one-sided p = 0.99 for this run's 3)" in note
    assert "exchangeable" not in claims_table(claims, {}, paper_scope=True)["note"].iloc[0]
