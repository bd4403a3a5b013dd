"""LoRA fine-tuning (DESIGN.md section 11): only adapters and head train, the base is unchanged bit for bit, a
resumed run equals an uninterrupted one, and the rows land in the tidy schema with regime lora."""

import numpy as np
import pandas as pd
import pytest
import torch

from crsrepro.analyse.lora import compare, lora_profiles
from crsrepro.core.schema import COLUMNS
from crsrepro.encoders import create_encoder
from crsrepro.profiles import load_profile
from crsrepro.run.lora import (LoraError, LoraParams, LoraStage, _features, _loss, adapt, adaptable, base_state,
                               default_cells, lora_targets, merged, train)
from crsrepro.run.plan import paper_gpu_hours, plan
from crsrepro.run.stages import run_stages
from crsrepro.score.dimensions import reliability_profiles

pytestmark = pytest.mark.slow  # minutes of grids, processes or training: the full suite runs it, test-fast does not


def _batch(n=16, size=96, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8)), rng.integers(0, classes, n)


def _state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("encoder_id", ["demo.random_cnn", "demo.random_vit"])
def test_only_adapters_and_head_train_and_the_base_is_unchanged(encoder_id):
    encoder = create_encoder(encoder_id)
    original = base_state(encoder.model)
    adapted = adapt(encoder, seed=0)
    assert {n for n, p in adapted.model.named_parameters() if p.requires_grad} == \
        {n for n, _ in adapted.model.named_parameters() if "lora_" in n} != set()
    before = {k: v for k, v in base_state(adapted.model).items()}
    images, labels = _batch()
    fine = train(adapted, images, labels, task="multiclass", n_outputs=3, seed=0, params=LoraParams(epochs=1, batch_size=8))
    assert _state_equal(base_state(adapted.model), before)  # weights and BatchNorm statistics, bit for bit
    assert _state_equal(base_state(encoder.model), original)  # the encoder itself is never touched
    assert _state_equal(before, original)
    lora_b = [v for k, v in fine.trainable_state().items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: the adapters did train


@pytest.mark.parametrize("encoder_id", ["demo.random_cnn", "demo.random_vit"])
def test_a_fine_tune_is_scored_with_its_adapters_merged_into_a_copy(encoder_id):
    """score() embeds with merged(): the same network in one path per layer, so the embeddings agree with
    peft's two-path forward to float32 rounding, and the trained adapters themselves are left as they were."""
    adapted = adapt(create_encoder(encoder_id), seed=0)
    with torch.no_grad():  # trained adapters: B is no longer zero (at zero, merging would change nothing)
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    before = {**base_state(adapted.model), **{k: v for k, v in adapted.model.state_dict().items() if "lora_" in k}}
    images, _ = _batch(n=24)
    two_paths = _features(adapted, images, 8)
    network = merged(adapted)
    one_path = _features(network, images, 8)
    base = _features(create_encoder(encoder_id), images, 8)
    assert np.abs(one_path - base).max() > 0.01 * np.abs(base).max()  # the adapters' update is in it
    assert np.abs(one_path - two_paths).max() <= 1e-5 * np.abs(two_paths).max()
    after = {**base_state(adapted.model), **{k: v for k, v in adapted.model.state_dict().items() if "lora_" in k}}
    assert _state_equal(after, before) and np.array_equal(_features(adapted, images, 8), two_paths)


def _probe(encoder, images, labels, val_images, val_labels, task="multiclass"):
    """The frozen linear probe on the encoder's final features (the LoRA head's start)."""
    from crsrepro.fit.linear import LinearProbe
    from crsrepro.run.lora import _features

    return LinearProbe(task=task).fit(_features(encoder, images, 8), labels, X_val=_features(encoder, val_images, 8),
                                      y_val=val_labels)


def _world(n, seed, task="multiclass"):
    """Images whose channel levels decide their labels (through noise), so that a probe has something to find."""
    rng = np.random.default_rng(seed)
    levels = rng.uniform(0, 1, (n, 3))
    images = rng.integers(0, 100, (n, 3, 96, 96)) + (150 * levels)[:, :, None, None]
    if task == "multilabel":
        labels = (levels[:, :2] + rng.normal(0, 0.15, (n, 2)) > 0.5).astype(float)
        labels[0, 1] = np.nan  # a masked label
    else:
        labels = np.digitize(levels[:, 0] + rng.normal(0, 0.15, n), [0.5] if task == "binary" else [1 / 3, 2 / 3])
    return torch.from_numpy(images.astype(np.uint8)), labels


@pytest.mark.parametrize("task", ["multiclass", "binary", "multilabel"])
def test_at_step_0_the_fine_tuned_model_is_the_frozen_probe(task):
    from crsrepro.run.lora import FineTuned, ProbeHead, _features

    encoder = create_encoder("demo.random_cnn")
    (images, labels), (val_images, val_labels) = _world(40, 0, task), _world(40, 1, task)
    kind = "multilabel" if task == "multilabel" else "multiclass"
    probe = _probe(encoder, images, labels, val_images, val_labels, task=kind)
    adapted = adapt(encoder, seed=0)
    start = FineTuned(adapted, ProbeHead(probe), kind, LoraParams())
    expected = probe.predict_proba(_features(encoder, val_images, 8))
    assert expected.shape[1] == {"multiclass": 3, "binary": 2, "multilabel": 2}[task]
    np.testing.assert_allclose(start.predict_proba(_features(adapted, val_images, 8)), expected, rtol=0, atol=1e-5)
    assert not np.allclose(expected, expected.mean(axis=0), atol=1e-3)  # a probe that says something


def test_the_learning_rate_warms_up_for_an_epoch_then_decays_to_zero():
    params = LoraParams(epochs=4, warmup_epochs=1, lr=1e-3)
    rates = np.array([params.learning_rate(step, 5) for step in range(20)])
    assert np.all(np.diff(rates[:5]) > 0) and rates[0] == pytest.approx(2e-4) and rates[4] == pytest.approx(1e-3)
    assert rates[5] == pytest.approx(1e-3) and np.all(np.diff(rates[5:]) < 0) and 0 < rates[-1] < 2e-5
    assert params.learning_rate(10, 5) == pytest.approx(1e-3 * (1 + np.cos(np.pi * 5 / 15)) / 2)


def _fit(encoder, params, checkpoint_dir=None, seed=1):
    """A fine-tune as finetune runs it: the head from the frozen probe, early stopping on val."""
    from crsrepro.run.lora import ProbeHead

    (images, labels), (val_images, val_labels) = _world(16, 0), _world(24, 1)
    head = ProbeHead(_probe(encoder, images, labels, val_images, val_labels))
    return train(adapt(encoder, seed=seed), images, labels, task="multiclass", seed=seed, head=head,
                 val=(val_images, val_labels), params=params, checkpoint_dir=checkpoint_dir)


def test_early_stopping_restores_the_best_epoch_and_never_ends_worse_on_val_than_the_probe():
    from crsrepro.core.metrics import macro_auroc
    from crsrepro.run.lora import _features, best_epoch

    encoder = create_encoder("demo.random_cnn")
    val_images, val_labels = _world(24, 1)
    for lr, patience in ((1e-3, 3), (3.0, 1)):  # 3.0: training wrecks the model, so the probe (epoch 0) wins
        fine = _fit(encoder, LoraParams(epochs=3, batch_size=8, lr=lr, patience=patience))
        probs = fine.predict_proba(_features(fine.encoder, val_images, 8))
        assert fine.best_epoch == best_epoch(fine.history)
        assert macro_auroc(val_labels, probs, task="multiclass") == pytest.approx(fine.history[fine.best_epoch][0])
        assert fine.history[fine.best_epoch][0] >= fine.history[0][0]
    assert fine.best_epoch == 0 and len(fine.history) == 2 and fine.steps == 2  # stopped after one epoch
    assert max(auroc for auroc, _ in fine.history[1:]) < fine.history[0][0]
    probe_start = _fit(encoder, LoraParams(epochs=0))  # no step: the frozen start itself
    np.testing.assert_allclose(probs, probe_start.predict_proba(_features(probe_start.encoder, val_images, 8)), atol=1e-6)
    assert fine.training_metrics() == {"best_epoch": 0, "epochs_trained": 1, "val_auroc_start": fine.history[0][0],
                                       "val_auroc_best": fine.history[0][0]}


def test_best_epoch_takes_the_highest_val_auroc_then_the_lower_loss_then_the_earlier_epoch():
    from crsrepro.run.lora import best_epoch

    assert best_epoch([(0.7, 0.5), (0.8, 0.6), (0.75, 0.1)]) == 1
    assert best_epoch([(0.7, 0.5), (0.7, 0.4)]) == 1 and best_epoch([(0.7, 0.5), (0.7, 0.5)]) == 0
    assert best_epoch([(np.nan, 0.5), (np.nan, 0.3)]) == 1  # no AUROC: the loss decides


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path, monkeypatch):
    from crsrepro.run import lora

    encoder = create_encoder("demo.random_cnn")
    params = LoraParams(epochs=3, batch_size=8)  # 2 steps per epoch
    whole = _fit(encoder, params, tmp_path / "a")
    write = lora._write_checkpoint

    def killed_after_the_first_epoch(*args, **kwargs):
        write(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(lora, "_write_checkpoint", killed_after_the_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        _fit(encoder, params, tmp_path / "b")
    monkeypatch.setattr(lora, "_write_checkpoint", write)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["step_2.pt"]
    resumed = _fit(encoder, params, tmp_path / "b")
    assert resumed.resumed_from == 2 and whole.resumed_from == 0 and whole.steps == resumed.steps == 6
    assert resumed.history == whole.history and resumed.best_epoch == whole.best_epoch
    assert _state_equal(resumed.trainable_state(), whole.trainable_state())
    kept = {f"step_{2 * whole.best_epoch}.pt", "step_6.pt"} - {"step_0.pt"}
    assert {p.name for p in (tmp_path / "a").iterdir()} == kept  # the last epoch's and the best epoch's
    done = _fit(encoder, params, tmp_path / "a")
    assert done.resumed_from == 6 and _state_equal(done.trainable_state(), whole.trainable_state())


def test_every_label_fraction_trains_for_the_same_step_budget():
    encoder = create_encoder("demo.random_cnn")
    images, labels = _batch(n=20)
    params = LoraParams(epochs=2, batch_size=8)
    budget = params.budget(len(images))  # 2 passes over the full split: 2 x ceil(20 / 8) = 6 steps
    fits = [train(adapt(encoder, seed=0), images[:n], labels[:n], task="multiclass", n_outputs=3, seed=0,
                  params=params, steps_per_epoch=params.steps_per_epoch(len(images))) for n in (3, 20)]
    assert budget == 6 and [fit.steps for fit in fits] == [6, 6]
    assert LoraParams(epochs=2, batch_size=8, accumulation_steps=2).budget(20) == 4  # a step sums 2 batches


def test_multilabel_loss_ignores_uncertain_labels():
    logits = torch.tensor([[2.0, -1.0], [-0.5, 3.0]])
    labels = torch.tensor([[1.0, np.nan], [0.0, np.nan]])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], labels[:, 0])
    assert torch.isclose(_loss(logits, labels, "multilabel"), expected)


def test_the_demo_plan_fine_tunes_a_medical_a_general_and_a_random_network():
    from crsrepro.encoders import get_encoder_spec

    demo = load_profile("demo")
    assert len(adaptable(demo.encoders)) >= 5
    plan_encoders = sorted({e for e, _ in default_cells(demo)})
    assert plan_encoders == ["demo.med_cnn", "demo.random_cnn", "demo.random_vit"]  # 3 ranks: a middle to reorder
    assert {get_encoder_spec(e).family for e in plan_encoders} == {"medical", "general"}
    assert demo.lora.n_seeds == 1 and demo.lora.label_fractions == (0.25, 1.0)  # retention needs two fractions
    paper = load_profile("paper").lora
    assert (paper.n_seeds, paper.epochs, LoraParams().rank, LoraParams().alpha) == (3, 8, 8, 16)
    with pytest.raises(LoraError, match="demo.texture: no LoRA target modules"):
        lora_targets(create_encoder("demo.texture"))


def test_paper_gpu_hours_scales_with_throughput():
    assert paper_gpu_hours(1550.0) == pytest.approx(2 * paper_gpu_hours(3100.0))
    assert paper_gpu_hours(fractions=(1.0,), n_seeds=1, epochs=1) < paper_gpu_hours()
    # the fixed step budget: a 1 % fine-tune costs what a 100 % one does
    assert paper_gpu_hours(fractions=(0.01,)) == pytest.approx(paper_gpu_hours(fractions=(1.0,)))


@pytest.mark.parametrize("name", ["demo", "paper"])
def test_the_planner_prices_exactly_the_lora_cells_and_plan(name):
    profile = load_profile(name)
    p = plan(profile)
    steps = p.encoders.set_index("encoder")["lora_steps"]
    adapted = {e for e, _ in default_cells(profile)}
    assert set(steps[steps > 0].index) == adapted != set()
    n_fine_tunes = profile.lora.n_seeds * len([f for f in profile.lora.label_fractions if f in profile.label_fractions])
    images = p.images.set_index("dataset")
    expected = {e: sum(n_fine_tunes * profile.lora.epochs * -(-images.loc[d, "train"] // 128)
                       for e2, d in default_cells(profile) if e2 == e) for e in adapted}
    assert steps[sorted(adapted)].to_dict() == expected


def test_lora_grid_writes_lora_rows_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    from crsrepro.run.grid import GridStage
    from crsrepro.run.lora import TRAINING_METRICS

    profile = load_profile("smoke", overrides={"datasets": ["aptos2019"], "transfer": {}, "severities": [2],
                                               "perturbations": ["jpeg"], "control_probes": {"probes": []},
                                               "encoders": ["demo.random_cnn"]})
    stage = LoraStage(cells=(("demo.random_cnn", "aptos2019"),), seeds=(0,), params=LoraParams(epochs=1, batch_size=16))
    rows = run_stages(profile, [stage], executor="serial", progress=False)[0]  # before the grid: extracts the pool
    assert list(rows.columns) == COLUMNS and set(rows["regime"]) == {"lora"}
    assert set(rows["condition"]) == {"clean", "jpeg@2"} and "temperature" in set(rows["recalibrator"])
    assert set(rows["label_fraction"]) == {0.25, 1.0}
    training = rows[rows["metric"].isin(TRAINING_METRICS)]
    assert len(training) == 2 * len(TRAINING_METRICS) and set(training["condition"]) == {"clean"}
    assert (training.pivot_table(index="label_fraction", columns="metric", values="value")["val_auroc_best"]
            >= training.pivot_table(index="label_fraction", columns="metric", values="value")["val_auroc_start"]).all()
    grid = run_stages(profile, [GridStage()], executor="serial", progress=False)[0]
    frozen = grid[(grid.seed == 0) & (grid.probe == "linear")].groupby("label_fraction")["probe_C"].first()
    assert rows.groupby("label_fraction")["probe_C"].first().to_dict() == frozen[[0.25, 1.0]].to_dict()  # the grid's C
    profiles = lora_profiles(rows)
    assert len(profiles) == 1 and np.isfinite(profiles[["auroc", "ece", "retention", "robustness"]].to_numpy()).all()
    checkpoints = list((profile.output_path / "lora" / "checkpoints").rglob("step_*.pt"))
    assert len(checkpoints) == 2 and len({p.name for p in checkpoints}) == 1  # one per fraction, the same budget
    runs = profile.output_path / "lora" / "runs"
    before = {p.name: p.stat().st_mtime_ns for p in runs.iterdir()}
    again = run_stages(profile, [stage], executor="serial", progress=False)[0]
    assert {p.name: p.stat().st_mtime_ns for p in runs.iterdir()} == before  # nothing retrained
    pd.testing.assert_frame_equal(again, rows)
    assert rows.attrs["epochs"] == 1


def _profiles(scores, seeds=(0, 1), jitter=None):
    return pd.DataFrame([dict(encoder=e, dataset=d, seed=s, auroc=a + (jitter or {}).get((e, s), 0.0), ece=0.1,
                              retention=0.9, robustness=0.9)
                         for (e, d), a in scores.items() for s in seeds])


def test_compare_counts_reversals_leaders_and_gains():
    frozen = _profiles({("a", "x"): 0.9, ("b", "x"): 0.8, ("c", "x"): 0.7, ("a", "y"): 0.9, ("b", "y"): 0.8})
    lora = _profiles({("a", "x"): 0.85, ("b", "x"): 0.95, ("c", "x"): 0.75, ("a", "y"): 0.95, ("b", "y"): 0.85})
    result = compare(frozen, lora)
    x = result.per_domain.set_index("dataset").loc["x"]
    assert x["reversed_pairs"] == 1 and x["leader_frozen"] == "a" and x["leader_lora"] == "b" and x["leader_changed"]
    assert x["auroc_gain"] == pytest.approx((-0.05 + 0.15 + 0.05) / 3)
    assert not result.per_domain.set_index("dataset").loc["y", "leader_changed"]
    assert set(result.crs.ranks.index) == {"a", "b", "c"} and result.movers["shift"].abs().is_monotonic_decreasing
    assert result.crs_frozen_peers is None and result.seeds == [0, 1]


def test_tau_intervals_come_from_the_seeds_and_hold_their_estimate():
    scores = {("a", "x"): 0.9, ("b", "x"): 0.85, ("c", "x"): 0.8, ("d", "x"): 0.75}
    frozen = _profiles(scores, seeds=(0, 1, 2))
    # LoRA: seed 2 alone reverses a and b, so resampled seeds disagree about the tau
    lora = _profiles(scores, seeds=(0, 1, 2), jitter={("a", 2): -0.2})
    row = compare(frozen, lora, rng=1).per_domain.iloc[0]
    assert row["n_seeds"] == 3 and row["tau_ci_low"] <= row["kendall_tau"] <= row["tau_ci_high"]
    assert row["tau_ci_low"] < row["tau_ci_high"] == pytest.approx(1.0)  # draws without seed 2 agree fully
    same = compare(frozen, _profiles(scores, seeds=(0, 1, 2))).per_domain.iloc[0]
    assert same["tau_ci_low"] == same["kendall_tau"] == same["tau_ci_high"] == 1.0  # no seed disagrees
    one = compare(_profiles(scores, seeds=(0,)), _profiles(scores, seeds=(0,))).per_domain.iloc[0]
    assert np.isnan(one["tau_ci_low"]) and np.isnan(one["tau_ci_high"])  # one seed: nothing to resample



def test_chapter_07_shows_tau_with_its_interval_and_says_so_where_one_seed_gives_none():
    from types import SimpleNamespace

    from crsrepro.present.report.tables import lora_per_domain

    scores = {("a", "x"): 0.9, ("b", "x"): 0.85, ("c", "x"): 0.8}
    lora = _profiles(scores, seeds=(0, 1, 2), jitter={("a", 2): -0.2})
    three = compare(_profiles(scores, seeds=(0, 1, 2)), lora, rng=1)
    row = three.per_domain.iloc[0]
    shown = lora_per_domain(SimpleNamespace(lora=three))
    assert shown.loc["x", "kendall_tau"] == (f"{row['kendall_tau']:.3f} [{row['tau_ci_low']:.3f}, "
                                             f"{row['tau_ci_high']:.3f}]")
    assert not {"tau_ci_low", "tau_ci_high"} & set(shown.columns)
    one = compare(_profiles(scores, seeds=(0,)), _profiles(scores, seeds=(0,)))
    assert lora_per_domain(SimpleNamespace(lora=one)).loc["x", "kendall_tau"] == "1.000 (no interval)"

def test_lora_is_ranked_among_lora_peers_and_the_frozen_peer_version_sits_beside_it():
    from crsrepro.score.crs import ReferenceFrame

    frozen = _profiles({("a", "x"): 0.9, ("b", "x"): 0.8, ("c", "x"): 0.7})
    lora = _profiles({("a", "x"): 0.95, ("b", "x"): 0.9, ("c", "x"): 0.85})
    frame = ReferenceFrame.freeze(frozen)
    primary = compare(frozen, lora, frame)
    # among its own peers, a LoRA profile is scored without the frozen table: worse frozen peers change nothing
    worse = compare(frozen.assign(auroc=frozen["auroc"] - 0.1), lora, ReferenceFrame.freeze(frozen))
    pd.testing.assert_series_equal(primary.crs.ranks["score_b"], worse.crs.ranks["score_b"])
    # against the frozen frame's peers, every LoRA profile dominates more frozen peers than it would LoRA ones
    fixed = primary.crs_frozen_peers
    among_lora = primary.crs.ranks["score_b"].reindex(fixed.ranks.index)
    assert fixed is not None and (fixed.ranks["score_b"] >= among_lora).all() and (fixed.ranks["score_b"] > among_lora).any()


def test_frozen_retention_is_compared_over_the_lora_fractions():
    from crsrepro.analyse.lora import frozen_profiles, lora_fractions

    rows = []
    for fraction, auroc in {0.01: 0.6, 0.25: 0.8, 1.0: 0.9}.items():
        for condition, drop in (("clean", 0.0), ("jpeg@2", 0.05)):
            rows.append(dict(encoder="a", dataset="x", seed=0, label_fraction=fraction, condition=condition,
                             probe="linear", layer="final", regime="frozen", recalibrator="none", auroc=auroc - drop,
                             ece=0.1))
    runs = pd.DataFrame(rows)
    lora_rows = runs[runs.label_fraction.isin([0.25, 1.0])].assign(regime="lora")
    assert lora_fractions(lora_rows) == [0.25, 1.0]
    assert frozen_profiles(runs, lora_rows)["retention"].item() == pytest.approx(0.8 / 0.9)  # 25 % only, like LoRA
    assert reliability_profiles(runs)["retention"].item() == pytest.approx((0.6 + 0.8) / 2 / 0.9)  # the frozen grid's
    with pytest.raises(LoraError, match="no label fraction"):
        frozen_profiles(runs[runs.label_fraction != 0.25], lora_rows)


def test_fine_tunes_say_which_kept_the_probe_and_which_gained_on_val_but_lost_on_test():
    from crsrepro.analyse.lora import early_stopping_summary, fine_tunes

    key = dict(family="general", dataset="x", seed=0, label_fraction=1.0, condition="clean", probe="linear",
               layer="final", recalibrator="none")
    frozen = pd.DataFrame([dict(key, encoder=e, regime="frozen", auroc=a, ece=0.1) for e, a in (("a", 0.8), ("b", 0.7))])
    metrics = {"a": dict(auroc=0.8, best_epoch=0, epochs_trained=3, val_auroc_start=0.75, val_auroc_best=0.75),
               "b": dict(auroc=0.65, best_epoch=2, epochs_trained=3, val_auroc_start=0.6, val_auroc_best=0.7)}
    lora_rows = pd.DataFrame([dict(key, encoder=e, regime="lora", metric=m, value=v)
                              for e, values in metrics.items() for m, v in values.items()])
    table = fine_tunes(frozen, lora_rows).set_index("encoder")
    assert table.loc["a", "auroc_gain"] == 0 and table.loc["a", "best_epoch"] == 0
    assert table.loc["b", "auroc_gain"] == pytest.approx(-0.05) and table.loc["b", "val_auroc_gain"] == pytest.approx(0.1)
    summary = early_stopping_summary(table.reset_index()).iloc[0]
    assert (summary["n_fine_tunes"], summary["kept_probe"], summary["val_up_test_down"]) == (2, 1, 1)


def test_a_checkpoint_is_keyed_by_the_heads_starting_weights():
    """Two probes on the same inputs that were solved differently (another FINISH_FACTOR) start different
    fine-tunes, so neither resumes the other's checkpoints."""
    import copy

    from crsrepro.fit.linear import LinearProbe
    from crsrepro.run.lora import probe_weights_key

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 4)), rng.integers(0, 3, 60)
    probe = LinearProbe(task="multiclass").fit(X, y, X_val=X, y_val=y)
    other = copy.deepcopy(probe)
    assert probe_weights_key(probe) == probe_weights_key(other)
    other.coef_ = other.coef_ + 1e-9
    assert probe_weights_key(probe) != probe_weights_key(other)
