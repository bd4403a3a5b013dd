"""Profiles: the shipped ones load, and every bad input is an error that names the key."""

from pathlib import Path

import pytest
import yaml

from crsrepro.core.errors import ProfileError
from crsrepro.profiles import PROFILE_DIR, list_profiles, load_profile


def test_shipped_profiles_load():
    assert set(list_profiles()) >= {"demo", "smoke", "paper"}
    demo, smoke, paper = (load_profile(n) for n in ("demo", "smoke", "paper"))
    assert demo.conditions()[0] == "clean" and len(demo.conditions()) == 16
    assert smoke.probe.backend == demo.probe.backend  # inherited through include
    assert smoke.demo_world.seed == demo.demo_world.seed
    assert smoke.demo_world.image_size < demo.demo_world.image_size
    assert len(paper.encoders) == 15 and paper.transfer == {"chexpert": ("mimic_cxr",)}


def _write(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("override, message", [
    ({"probe": {"backend": "svm"}}, "probe.backend"),
    ({"seeds": []}, "seeds"),
    ({"label_fractions": [0.5, 2.0]}, "label_fractions"),
    ({"label_fractions": [0.1, 0.5]}, "must include 1.0"),
    ({"severities": [4]}, "severities"),
    ({"perturbations": ["motion_blur"]}, "perturbations"),
    ({"datasets": ["mnist"]}, "datasets"),
    ({"features": {"batch_size": 0}}, "features.batch_size"),
    ({"data": {"u_policy": "maybe"}}, "data.u_policy"),
    ({"transfer": {"isic2019": "mimic_cxr"}, "datasets": ["chexpert"]}, "transfer"),
    ({"depth": {"pairs": [["demo.random_cnn"]]}}, "depth.pairs"),
    ({"depth": {"pairs": [["demo.random_cnn", "mimic_cxr"]]}}, "depth.pairs"),
    ({"depth": {"exclude": ["random_cnn"]}}, "depth.exclude"),
    ({"lora": {"n_seeds": 0}}, "lora.n_seeds"),
    ({"lora": {"label_fractions": [2.0]}}, "lora.label_fractions"),
    ({"lora": {"exclude": ["effnet"]}}, "lora.exclude"),
    ({"manifests": {"name": 3}}, "manifests.name"),
    ({"claims": {"paper_scope": "yes"}}, "claims.paper_scope"),
    ({"book": {"coverage_profile": ""}}, "book.coverage_profile"),
])
def test_bad_values_name_the_key(tmp_path, override, message):
    with pytest.raises(ProfileError, match=message.replace(".", r"\.")):
        load_profile("smoke", overrides=override)


def test_unknown_keys_are_errors(tmp_path):
    with pytest.raises(ProfileError, match="unknown key probe.learning_rate"):
        load_profile(_write(tmp_path, {"include": "smoke", "probe": {"learning_rate": 1}}))
    with pytest.raises(ProfileError, match="unknown key colour"):
        load_profile(_write(tmp_path, {"include": "smoke", "colour": "red"}))


def test_missing_profile_and_include_cycle(tmp_path):
    with pytest.raises(ProfileError, match="no profile 'nope'.*shipped profiles"):
        load_profile("nope")
    _write(tmp_path, {"include": str(tmp_path / "b.yaml")}, "a.yaml")
    _write(tmp_path, {"include": str(tmp_path / "a.yaml")}, "b.yaml")
    with pytest.raises(ProfileError, match="include cycle"):
        load_profile(tmp_path / "a.yaml")


def test_paths_resolve_and_unset_variables_fail_only_when_used(tmp_path, monkeypatch):
    monkeypatch.delenv("CRSREPRO_DATA", raising=False)
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / "home"))
    paper = load_profile("paper")  # loading does not need the data
    assert paper.output_path == tmp_path / "home" / "paper" / "results"
    with pytest.raises(ProfileError, match=r"data\.root uses \$\{CRSREPRO_DATA\}"):
        paper.dataset_root("isic2019")
    monkeypatch.setenv("CRSREPRO_DATA", str(tmp_path / "data"))
    assert paper.dataset_root("isic2019") == tmp_path / "data" / "isic2019"
    assert load_profile("demo").dataset_root("aptos2019") == tmp_path / "home/demo/data/aptos2019"
    (tmp_path / "sub").mkdir()
    mine = _write(tmp_path / "sub", {"include": "smoke", "output_dir": "out", "data": {"root": "~/nowhere"}})
    assert load_profile(mine).output_path == tmp_path / "sub" / "out"  # relative: against the profile's folder
    assert load_profile(mine).dataset_root("isic2019") == Path.home() / "nowhere" / "isic2019"


def test_optional_keys_get_their_documented_defaults(tmp_path):
    """A valid profile without the optional keys loads and works (no AttributeError: transfer)."""
    data = yaml.safe_load((PROFILE_DIR / "demo.yaml").read_text())
    data["name"] = "mine"  # a copy may not keep a shipped profile's name
    for key in ("transfer", "description", "canonical_size"):
        data.pop(key, None)
    data["probe"].pop("c_selection", None)
    profile = load_profile(_write(tmp_path, data))
    assert profile.transfer == {} and profile.transfer_targets("chexpert") == ()
    assert profile.all_datasets() == ["isic2019", "aptos2019", "chexpert"]
    assert profile.probe.c_selection == "nested_val" and profile.data.images == "all"
    assert profile.control_probes.label_fractions is None and profile.canonical_size is None


def test_sections_are_frozen_dataclasses():
    import dataclasses

    profile = load_profile("smoke")
    assert dataclasses.is_dataclass(profile.probe) and isinstance(profile.seeds, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.probe.max_iter = 1
    assert load_profile("smoke").fingerprint() == profile.fingerprint()
    assert load_profile("smoke", overrides={"seeds": [0]}).fingerprint() != profile.fingerprint()


def test_errors_name_the_file(tmp_path):
    path = _write(tmp_path, {"include": "smoke", "seeds": "many"})
    with pytest.raises(ProfileError, match=f"{path}.*key seeds"):
        load_profile(path)


def test_what_differs_between_profiles_is_read_from_their_keys():
    """Behaviour comes from profile keys, never from a profile's name (the keys' defaults and the shipped
    settings; tests/test_stages.py checks that a renamed copy of paper.yaml plans the paper's work)."""
    demo, smoke, paper, seeds20, mini = (load_profile(n) for n in ("demo", "smoke", "paper", "demo-seeds20", "real-mini"))
    assert len(demo.depth.pairs) == 4 and len(paper.depth.pairs) == 8
    assert smoke.depth.pairs is None and smoke.depth.exclude == ("demo.effnet_lite0", "demo.cxr_cnn")
    assert demo.depth.exclude == paper.depth.exclude == ()
    assert (demo.lora.n_seeds, demo.lora.label_fractions, demo.lora.epochs, demo.lora.exclude) == \
        (1, (0.25, 1.0), 3, ("demo.effnet_lite0", "demo.derm_cnn", "demo.fundus_cnn", "demo.cxr_cnn"))
    assert (smoke.lora.n_seeds, smoke.lora.epochs, smoke.lora.exclude) == (2, 1, ("demo.effnet_lite0", "demo.cxr_cnn"))
    assert (paper.lora.n_seeds, paper.lora.epochs, len(paper.lora.label_fractions)) == (3, 8, 5)
    assert paper.manifests.name == "" and demo.manifests.name == "demo" and smoke.manifests.name == "smoke"
    assert paper.claims.paper_scope and not demo.claims.paper_scope and not smoke.claims.paper_scope
    assert demo.book.coverage_profile == "demo-seeds20"
    assert smoke.book.coverage_profile is seeds20.book.coverage_profile is mini.book.coverage_profile is None


def test_a_profile_selects_a_modality_noise_model_per_dataset(tmp_path):
    path = _write(tmp_path, {"include": "smoke", "noise_model": {"chexpert": "poisson_gaussian",
                                                                 "isic2019": "sensor_noise", "kermany_cxr": "poisson_gaussian"}})
    profile = load_profile(path)
    paper = load_profile("smoke").conditions()
    assert profile.conditions() == paper                      # no dataset: the paper's conditions only
    assert profile.conditions("chexpert") == paper + ["poisson_gaussian@1", "poisson_gaussian@3"]
    assert profile.conditions("isic2019")[len(paper):] == ["sensor_noise@1", "sensor_noise@3"]
    assert profile.conditions("aptos2019") == paper           # a dataset it does not name keeps the paper's
    assert load_profile("paper").noise_model == {}            # the default: none


@pytest.mark.parametrize("noise_model, message", [
    ({"chexpert": "gaussian_noise"}, "a noise model among poisson_gaussian, sensor_noise"),
    ({"chest": "poisson_gaussian"}, "a mapping from dataset ids"),
    (["poisson_gaussian"], "a mapping from dataset ids"),
])
def test_an_unknown_noise_model_is_refused_naming_the_file_and_the_key(tmp_path, noise_model, message):
    path = _write(tmp_path, {"include": "smoke", "noise_model": noise_model})
    with pytest.raises(ProfileError, match=f"{path}.*key noise_model must be .*{message}"):
        load_profile(path)
