"""The run grid's middle layer (DESIGN.md section 7): keys are functions of their inputs, a finished unit is really
skipped, the merge notices a changed key set, and the frame is frozen only by an explicit act."""

import numpy as np
import pandas as pd
import pytest

from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.core.errors import CrsreproError
from crsrepro.encoders import get_encoder_spec
from crsrepro.profiles import load_profile
from crsrepro.run import grid, units, views
from crsrepro.run.results import ResultStore
from crsrepro.score import frame
from crsrepro.score.crs import ReferenceFrame

# A micro grid: one small dataset, two fast encoders, two seeds, one perturbation, no controls.
MICRO = {"datasets": ["aptos2019"], "transfer": {}, "encoders": ["demo.color_histogram", "demo.pixel_pca"],
         "seeds": [0, 1], "label_fractions": [0.25, 1.0], "perturbations": ["jpeg"], "severities": [3],
         "control_probes": {"probes": []}, "demo_world": {"n_images": {"aptos2019": 120}}}


def micro(**overrides):
    config = {**MICRO, **overrides}
    return load_profile("smoke", overrides=config)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    return tmp_path


def _rowsets(profile):
    return {p.stem for p in ResultStore(profile.output_path).runs_dir.glob("*.parquet")}


def test_keys_follow_their_inputs_and_a_finished_unit_is_skipped(home, monkeypatch):
    profile = micro()
    first = grid.run_grid(profile, progress=False)
    keys = _rowsets(profile)
    assert len(keys) == 2 * 2  # cells x seeds (linear only)
    assert first["rowset"].nunique() == 4 and set(first["seed"]) == {0, 1}

    # nothing that cannot change a number: num_threads; and a finished unit is never re-run
    monkeypatch.setattr(units.Unit, "run", lambda self, feats: pytest.fail("a finished unit was re-run"))
    again = grid.run_grid(micro(probe={"num_threads": 2}), progress=False)
    assert _rowsets(profile) == keys
    pd.testing.assert_frame_equal(again, first)
    monkeypatch.undo()
    monkeypatch.setenv("CRSREPRO_HOME", str(home / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(home / "manifests"))

    # each input that changes a number changes every key: the plan (keys without fitting) finds no row-set done
    store = ResultStore(profile.output_path)
    for change in ({"probe": {"max_iter": 50}}, {"probe": {"c_selection": "full_val"}},
                   {"probe": {"c_grid": [0.1, 10.0]}}, {"label_fractions": [0.5, 1.0]}):
        planned, tasks = grid.GridStage().plan(micro(**change), store)
        assert len(set(planned)) == 4 and not set(planned) & keys, change
        assert sum(task.stage == "probe fits" for task in tasks) == 4, change


def test_a_new_image_size_recomputes_features_and_rowsets(home):
    """Changing demo_world.image_size recomputes what depends on it."""
    profile = micro()
    grid.run_grid(profile, progress=False)
    keys, cache = _rowsets(profile), profile.feature_cache_path
    entries = set(cache.rglob("*.npy"))
    resized = micro(demo_world={"image_size": 48, "n_images": {"aptos2019": 120}})
    grid.run_grid(resized, progress=False)
    assert _rowsets(profile).isdisjoint(keys) is False and len(_rowsets(profile) - keys) == 4
    assert len(set(cache.rglob("*.npy")) - entries) == len(entries)  # every feature array recomputed


def test_the_merge_notices_a_changed_key_set(home):
    profile = micro()
    table = grid.run_grid(profile, progress=False)
    store = ResultStore(profile.output_path)
    keys = sorted(table["rowset"].unique())
    assert len(store.merge(keys[:2])) < len(table)  # a different key set is re-merged, not served
    assert len(store.merge(keys)) == len(table)


def test_seeds_vary_discrimination_calibration_and_robustness(home):
    """DESIGN.md section 3: every seed draws its own train / val split, so D, C and R vary across seeds."""
    analysis = RunAnalysis(micro(), grid.run_grid(micro(), progress=False))
    sd = analysis.reliability_profiles.groupby(["encoder", "dataset"])[["auroc", "ece", "robustness"]].std()
    assert (sd > 0).all().all()


def test_freeze_frame_is_an_act_and_refuses_an_incomplete_run(home):
    profile = micro()
    results = grid.run_grid(profile, progress=False)
    path = frame.frame_path(profile)
    with pytest.raises(CrsreproError, match="no CRS reference frame.*crsrepro freeze-frame"):
        RunAnalysis(profile, results).frame  # reading never freezes one
    assert not path.exists()
    partial = results[~((results["encoder"] == "demo.pixel_pca") & (results["seed"] == 1))]
    with pytest.raises(CrsreproError, match=r"incomplete.*demo.pixel_pca on aptos2019 \(seed 1\)"):
        frame.freeze_frame(profile, partial)
    assert not path.exists()
    frozen = frame.freeze_frame(profile, results)
    assert path.is_file() and frozen.results_hash == RunAnalysis(profile, results).results_hash
    # the frame is frozen from exactly the profiles the analysis reads (the transfer sets robustness keeps)
    by_analysis = ReferenceFrame.freeze(RunAnalysis(profile, results).reliability_profiles,
                                        results_hash=frozen.results_hash, description=frozen.description)
    assert by_analysis.to_dict() == frozen.to_dict()
    with pytest.raises(CrsreproError, match="never silently replaced"):
        frame.freeze_frame(profile, results)
    before = path.read_bytes()
    analysis = RunAnalysis(profile, results)
    assert analysis.frame_warning is None and len(analysis.scores) == 2
    assert path.read_bytes() == before  # reading the frame does not write it
    changed = results.copy()
    changed.attrs = {"keys_hash": "0" * 64}
    assert "crs_reference_smoke.yaml" in RunAnalysis(profile, changed).frame_warning


def test_label_budget_nests_val_subsets_of_the_same_fraction(home):
    profile = micro()
    view = views.prepare_view(profile, "aptos2019")
    unit = units.Unit(profile, get_encoder_spec("demo.pixel_pca"), view, 0, "linear")
    n_val = len(unit.val.labels)
    assert len(unit.val_subsets[0.25]) < n_val and len(unit.val_subsets[1.0]) == n_val
    assert np.isin(unit.val_subsets[0.25], unit.val_subsets[1.0]).all()
    assert set(unit.val.labels[unit.val_subsets[0.25]]) == set(unit.val.labels)  # every class kept


def test_the_controls_give_their_own_reliability_profiles_and_conclusions(home):
    """DESIGN.md section 7: MLP and k-NN run on every fraction and condition, and the conclusions (AUROC vs CRS
    rankings) are computed under each probe."""
    profile = micro(control_probes={"probes": ["knn"]})
    results = grid.run_grid(profile, progress=False)
    knn = results[results["probe"] == "knn"]
    assert set(knn["label_fraction"]) == {0.25, 1.0} and set(knn["condition"]) == {"clean", "jpeg@3"}
    table = RunAnalysis(profile, results).probe_conclusions
    assert list(table.index) == ["linear", "knn"] and (table["n_encoders"] == 2).all()
    assert table.loc["linear", "crs_vs_linear_kendall_tau"] == 1.0


def test_a_multilabel_label_without_both_classes_in_a_split_is_left_out_and_said_once(caplog):
    table = pd.DataFrame({"A": [1, 0, 1, 0, 1, 0], "B": [0, 0, 0, 0, 1, 0],
                          "split": ["test", "test", "pool", "pool", "pool", "pool"],
                          "seed_0": ["test", "test", "train", "train", "val", "val"]})
    table.attrs = {"task": "multilabel", "label_names": ["A", "B"], "dataset": "toy_said_once"}
    with caplog.at_level("WARNING", logger="crsrepro.run.views"):
        kept = views.learnable_labels(table, [0])
        views.learnable_labels(table, [0])   # another task in this process prepares the same dataset
    assert kept.attrs["label_names"] == ["A"] and kept.attrs["labels_left_out"] == ["B"]
    assert [r.getMessage() for r in caplog.records].count(
        "toy_said_once: left out 1 of 2 labels that lack a positive or a negative in some split: B") == 1
