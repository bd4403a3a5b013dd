"""The stages of a run (DESIGN.md sections 11 and 13): behaviour comes from profile keys, never from a
profile's name; the LoRA keys follow every training parameter; and the stages plan the same row-set keys
as the code before the stage runner, so every cached row-set stays valid."""

import dataclasses

import pandas as pd
import pytest

from crsrepro.core.io import content_key
from crsrepro.data.manifests import manifest_path
from crsrepro.profiles import PROFILE_DIR, load_profile
from crsrepro.run import depth, grid, lora
from crsrepro.run.lora import LoraParams, rowset_key
from crsrepro.run.plan import plan
from crsrepro.run.results import ResultStore, keys_hash
from crsrepro.run.views import conditions_for


def _planned_work(profile) -> dict:
    """Everything a profile's run would do, from the profile and the registries alone (no data, no weights)."""
    lora_stage = lora.LoraStage()
    costed = plan(profile)
    return {
        "cells": grid.cells(profile),
        "runs": grid.enumerate_runs(profile),
        "conditions": {d: conditions_for(profile, d) for d in profile.datasets},
        "depth_pairs": depth.pairs(profile),
        "lora_cells": lora.default_cells(profile),
        "lora_plan": (profile.seeds[:profile.lora.n_seeds], profile.lora.label_fractions, lora_stage.lora_params(profile)),
        "manifests": [manifest_path("m", d, profile.manifests.name).name for d in profile.datasets],
        "claims_paper_scope": profile.claims.paper_scope,
        "coverage_profile": profile.book.coverage_profile,
        "plan": (costed.images, costed.forward, costed.encoders, costed.stages, costed.n_runs),
    }


def test_a_renamed_copy_of_paper_plans_the_papers_work(tmp_path):
    text = (PROFILE_DIR / "paper.yaml").read_text()
    assert text.count("\nname: paper\n") == 1
    path = tmp_path / "paper-gpu2.yaml"
    path.write_text(text.replace("\nname: paper\n", "\nname: paper-gpu2\n"))
    copy, paper = load_profile(path), load_profile("paper")
    assert copy.name == "paper-gpu2"
    ours, theirs = _planned_work(copy), _planned_work(paper)
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key == "runs":
            pd.testing.assert_frame_equal(ours[key], theirs[key])
        elif key == "plan":
            for a, b in zip(ours[key][:4], theirs[key][:4]):
                pd.testing.assert_frame_equal(a, b)
            assert ours[key][4] == theirs[key][4] == 17_575
        else:
            assert ours[key] == theirs[key], key
    assert ours["manifests"] == ["isic2019.csv", "aptos2019.csv", "chexpert.csv"] and ours["claims_paper_scope"]
    assert len(ours["depth_pairs"]) == 8 and ours["lora_plan"][2].epochs == 8


def test_a_demo_copy_gets_its_own_manifests_and_no_paper_comparison(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("include: smoke\nname: mine\n")
    mine = load_profile(path)
    assert manifest_path("m", "isic2019", mine.manifests.name).name == "isic2019_mine.csv"
    assert not mine.claims.paper_scope and mine.lora == load_profile("smoke").lora


def _other(value):
    if isinstance(value, tuple):
        return value + ("another.module",)
    return value * 2 if isinstance(value, float) and value else value + 1


def test_every_training_parameter_enters_the_lora_keys():
    """The LoRA keys derive from the one parameters object that finetune trains with, so a changed
    default can never be served a stale row-set (or resume another budget's checkpoints: the learning
    rate decays to zero at the end of the budget, so epochs is in the checkpoint key too)."""
    base = LoraParams(target_modules=("conv1",))
    for field in dataclasses.fields(LoraParams):
        changed = dataclasses.replace(base, **{field.name: _other(getattr(base, field.name))})
        assert rowset_key("unit", 0.25, changed) != rowset_key("unit", 0.25, base), field.name
        assert changed.training() != base.training(), field.name
    assert rowset_key("unit", 0.25, base) != rowset_key("unit", 1.0, base)
    assert rowset_key("unit", 0.25, base) != rowset_key("other unit", 0.25, base)


def test_the_lora_key_of_todays_defaults_is_the_one_cached_row_sets_carry():
    """Written out: the key of a LoRA plan (since issue 27.2: linear probe, then fine-tune, with warm-up,
    cosine decay and early stopping; lora.VERSION 4: the tie-breaking val log-loss in float64; 5: scored with
    the adapters merged into the base weights, issue 29)."""
    before = content_key(stage="lora", unit="u", fraction=0.25, epochs=2, warmup_epochs=1, patience=3, rank=8,
                         alpha=16, dropout=0.0, lr=1e-3, weight_decay=1e-2, batch_size=32, accumulation_steps=1,
                         target_modules=["conv1", "conv2"], version=5, head="the frozen linear probe",
                         optimiser="AdamW", schedule="linear warm-up, cosine decay to zero",
                         budget="steps of epochs x the full-label train split",
                         early_stopping="val macro AUROC, ties to the lower log-loss, epoch 0 the probe, best restored")
    assert rowset_key("u", 0.25, LoraParams(epochs=2, target_modules=("conv1", "conv2"))) == before


def test_adapt_trains_what_the_parameters_say():
    from crsrepro.encoders import create_encoder

    encoder = create_encoder("demo.random_cnn")
    shapes = {tuple(p.shape) for n, p in lora.adapt(encoder, LoraParams(rank=3)).model.named_parameters()
              if "lora_A" in n}
    assert shapes and all(shape[0] == 3 for shape in shapes)


#: The row-set keys of the tiny profile below: (count, keys_hash). A change here means every cached
#: row-set of every profile is recomputed; it must come with a reason (a changed input), never a refactor.
#: Last changed by issue 24: CACHE_VERSION 5 (c_rule, c_tie and auroc_full_val in every row-set) and the
#: linear probe's min_val_cases and cv_folds (C cross-validated below 10 val cases per class); the lora
#: keys by issue 27.2 (linear probe, then fine-tune: lora.VERSION 2 and the recipe's fields); every key by
#: CACHE_VERSION 6 and PERTURBATION_VERSION 2 (size-relative blur, in the perturbed feature keys); every key by
#: CACHE_VERSION 7 (FINISH_FACTOR really 50: version 6 was keyed while the code still finished at 10x); the lora
#: keys by lora.VERSION 3 (checkpoints keyed by the head's starting weights); the lora keys by lora.VERSION 4
#: (the val log-loss that breaks epoch ties in float64); every key of demo.random_cnn by its weights, redrawn by
#: numpy so that they are the same bytes on every CPU (PyTorch's init differed with the CPU's vector code);
#: every key by CACHE_VERSION 8 (the parametric recalibrators fit every label at once: issue 29); the lora keys
#: by lora.VERSION 5 (a fine-tune is scored with its adapters merged into the base weights: issue 29).
KEYS_BEFORE = {
    "grid": (8, "1adf66545f2adc9a0a3462dd9aa9378a28323ef2d11522f75a3997a5c7d73fce"),
    "depth": (8, "deafc3715871b402b9d32db3ef4d173458fdfab841ae3bdb08565cf03f827df6"),
    "lora": (4, "a0d593d127083734d9f6558292cb0293a0a12a76e274210c03150f0b19bb87fb"),
}
TINY = {"datasets": ["aptos2019"], "transfer": {}, "encoders": ["demo.random_cnn", "demo.color_histogram"],
        "seeds": [0, 1], "label_fractions": [0.25, 1.0], "perturbations": ["jpeg"], "severities": [2],
        "control_probes": {"probes": ["knn"]}, "demo_world": {"n_images": {"aptos2019": 120}}}


def test_the_stages_plan_the_row_set_keys_of_the_code_before_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    profile = load_profile("smoke", overrides=TINY)
    stages = {"grid": grid.GridStage(), "depth": depth.DepthStage(), "lora": lora.LoraStage()}
    for name, stage in stages.items():
        store = stage.store(profile)
        assert store.root == (profile.output_path if name == "grid" else profile.output_path / name)
        keys, tasks = stage.plan(profile, store)
        assert (len(keys), keys_hash(keys)) == KEYS_BEFORE[name], name
        assert tasks and all(not t.gpu for t in tasks)  # nothing is done yet; a CPU profile holds no GPU
    on_gpu = load_profile("smoke", overrides={**TINY, "features": {"device": "cuda"}})
    _, tasks = depth.DepthStage().plan(on_gpu, ResultStore(tmp_path / "elsewhere"))
    assert [t.gpu for t in tasks] == [True]


def test_reading_a_stage_that_has_not_run_names_the_command(tmp_path, monkeypatch):
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.core.errors import CrsreproError

    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    with pytest.raises(CrsreproError, match=r"no grid results at .*results\.parquet: run `crsrepro run --profile smoke`"):
        RunAnalysis.load("smoke")
    with pytest.raises(CrsreproError, match="no lora results .*`crsrepro book --profile smoke`"):
        RunAnalysis("smoke", pd.DataFrame()).lora_results
