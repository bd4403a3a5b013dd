"""Layer-depth sweeps (DESIGN.md section 11): the taps' rows in the tidy schema, resumable, and the analyses."""

import numpy as np
import pandas as pd
import pytest

from crsrepro.analyse.depth import (best_depths, depth_profiles, intermediate_wins, paired_test, val_choices,
                                    val_selected_ranking)
from crsrepro.core.schema import COLUMNS
from crsrepro.encoders import get_encoder_spec
from crsrepro.profiles import load_profile
from crsrepro.run.depth import DepthError, DepthStage, pairs, tap_depth, taps
from crsrepro.run.results import ResultStore
from crsrepro.run.stages import run_stages

pytestmark = pytest.mark.slow  # minutes of grids, processes or training: the full suite runs it, test-fast does not

PAIR = ("demo.random_cnn", "aptos2019")


def sweep(profile, pairs):
    """The depth stage of ``pairs``, run serially, and the profiles of its merged rows."""
    return depth_profiles(run_stages(profile, [DepthStage(pairs=tuple(pairs))], executor="serial", progress=False)[0])


@pytest.fixture(scope="module")
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
    assert all(e != "demo.color_histogram" for e, _ in pairs(smoke))
    assert len(pairs(load_profile("paper"))) == 8
    with pytest.raises(DepthError, match="demo.color_histogram has no depth taps"):
        DepthStage(pairs=(("demo.color_histogram", "isic2019"),)).plan(smoke, ResultStore(smoke.output_path / "depth"))
    with pytest.raises(DepthError, match="nih_cxr14 is not among profile 'smoke'"):
        DepthStage(pairs=(("demo.random_cnn", "nih_cxr14"),)).plan(smoke, ResultStore(smoke.output_path / "depth"))


def _synthetic(gain=0.05):
    """Two pairs x 5 seeds: pair a peaks at 50 %, pair b at 100 %; val AUROC tracks test AUROC."""
    rng = np.random.default_rng(0)
    rows = []
    for encoder, peak in (("demo.random_cnn", 50), ("demo.cxr_cnn", 100)):
        for seed in range(5):
            for layer, depth in (("depth25", 25), ("depth50", 50), ("depth75", 75), ("final", 100)):
                auroc = 0.8 - 0.001 * abs(depth - peak) + (gain if depth == peak else 0) + rng.normal(0, 0.002)
                rows.append(dict(encoder=encoder, family="x", dataset="chexpert", seed=seed, layer=layer, depth=float(depth),
                                 auroc=auroc, ece=0.1, retention=0.9, robustness=0.9, val_auroc=auroc))
    return pd.DataFrame(rows)


def test_best_depth_wins_and_paired_test():
    table = _synthetic()
    best = best_depths(table).set_index("encoder")
    assert best.loc["demo.random_cnn", "best_depth"] == 50 and best.loc["demo.cxr_cnn", "best_depth"] == 100
    assert best.loc["demo.random_cnn", "gain"] == pytest.approx(0.05 + 0.05, abs=0.01)
    assert intermediate_wins(table) == (1, 2)
    tested = paired_test(table).set_index("encoder")
    assert tested.loc["demo.random_cnn", "p"] < 0.001 and tested.loc["demo.random_cnn", "mean_diff"] > 0
    assert tested.loc["demo.cxr_cnn", "mean_diff"] < 0


def test_val_choice_reads_val_never_test():
    table = _synthetic()
    table["val_auroc"] = np.where(table["layer"] == "depth25", 0.99, 0.5)  # val prefers 25 %, test does not
    assert set(val_choices(table)["layer"]) == {"depth25"}
    agreement, chosen = val_selected_ranking(table)
    assert set(chosen["layer"]) == {"depth25"} and agreement.n_pairs == 1
