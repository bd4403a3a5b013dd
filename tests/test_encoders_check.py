"""``crsrepro check-weights``: reports found / not found, the file's entries, the strict load, the parameter
count against the spec and one embedding, on tiny checkpoints in the released layouts; never downloads."""

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

from crsrepro.cli import main
from crsrepro.core.errors import CrsreproError, MissingWeightsError, WrongWeightsError
from crsrepro.encoders import get_encoder_spec, paper
from crsrepro.tools.check_weights import PAPER_IDS, check_encoder, check_weights, describe_checkpoint, synthetic_image


@pytest.fixture(autouse=True)
def no_weights_anywhere(tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hf_cache"))
    monkeypatch.setenv("CRSREPRO_WEIGHTS", str(tmp_path / "weights"))


def _tiny_resnet(folder):
    folder.mkdir(parents=True)
    model = timm.create_model("resnet50", pretrained=False, num_classes=10, layers=[1, 1, 1, 1])
    config = {"architecture": "resnet50", "model_args": {"layers": [1, 1, 1, 1]}}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")


def test_a_user_without_weights_sees_where_we_looked_and_exit_0(tmp_path, capsys):
    assert main(["check-weights"]) == 0
    out = capsys.readouterr().out
    assert out.count("weights: not found") == len(PAPER_IDS) == 15
    assert str(tmp_path / "weights" / "specialist.panderm") in out and "revision v1.1" in out
    assert "0 of 15 found" in out


def test_an_encoder_asked_for_by_id_that_is_not_found_fails(capsys):
    assert main(["check-weights", "--encoder", "specialist.rad_dino"]) == 2
    out, err = capsys.readouterr()
    assert "weights: not found" in out and "specialist.rad_dino" in err and "not found" in err


def test_all_fails_when_any_of_the_15_is_missing(capsys):
    with pytest.raises(MissingWeightsError, match=r"15 encoder\(s\) of the 15 \(--all\) not found") as info:
        check_weights(require_all=True, out=lambda _: None)
    assert "medical.medgemma" in str(info.value)
    assert main(["check-weights"]) == 0  # without --all, a survey: not found is reported, not failed
    with pytest.raises(CrsreproError, match="without --encoder"):
        check_weights(["general.resnet50"], require_all=True)


def test_each_encoder_says_where_to_get_it_its_revision_and_licence_and_a_summary_ends(capsys):
    lines = []
    check_weights(out=lines.append)
    text = "\n".join(lines)
    for encoder_id in PAPER_IDS:
        spec, release = get_encoder_spec(encoder_id), paper.PAPER_RELEASES[encoder_id]
        report = next(chunk for chunk in lines if chunk.startswith(encoder_id + "\n"))
        assert f"get: {release.source}" in report and f"licence: {spec.licence}" in report
        if spec.hf_repo is not None:
            assert f"--revision {spec.hf_revision}" in report
    assert "drive.google.com/file/d/1SwEzaOlFV_gBKf2UzeowMC8z9UH7AQbE" in text  # PanDerm's README link
    assert "drive.google.com/drive/folders/1makFLiEMbSleYltaRxw81aBhEDMpVwno" in text  # CheXzero's
    summary = lines[-2].splitlines()
    assert summary[0].split()[:2] == ["encoder", "found"] and len(summary) == 1 + len(PAPER_IDS)
    assert any("general.mae" in row and "main (UNVERIFIED)" in row for row in summary)
    assert any("specialist.rad_dino" in row and "110cbc18d513" in row and row.endswith("MIT") for row in summary)


def test_every_hub_encoder_is_pinned_to_a_full_commit_or_marked_unverified():
    for spec, _ in paper.PAPER_ENCODERS:
        release = paper.PAPER_RELEASES[spec.id]
        if spec.hf_repo is None:
            assert spec.hf_revision is None
        elif not release.verified:
            assert spec.hf_revision == paper.UNVERIFIED_MAIN and "UNVERIFIED" in release.pin
        elif spec.id != "specialist.biovil":  # hi-ml's own tag
            assert len(spec.hf_revision) == 40 and int(spec.hf_revision, 16) >= 0
    assert [s.id for s, _ in paper.PAPER_ENCODERS if not paper.PAPER_RELEASES[s.id].verified] == ["general.mae"]


def test_found_weights_are_loaded_strictly_and_measured(tmp_path, capsys):
    _tiny_resnet(tmp_path / "weights" / "general.resnet50")
    assert main(["check-weights", "--encoder", "general.resnet50"]) == 2  # a tiny network is not the release
    out, err = capsys.readouterr()
    assert "weights: found at" in out and "model.safetensors: 104 tensors: layer1.* (24)" in out and "fc.* (2)" in out
    assert "strict load: ok" in out and "(spec 23,508,032: DIFFERS)" in out
    assert "embedding: shape (1, 2048), L2 norm" in out
    assert "general.resnet50" in err and "\n" not in err.strip()


def test_a_checkpoint_that_does_not_fit_fails_with_the_reason(tmp_path, capsys):
    folder = tmp_path / "weights" / "general.resnet50"
    _tiny_resnet(folder)
    (folder / "config.json").write_text(json.dumps({"architecture": "resnet50"}))  # full-size network
    result = check_encoder("general.resnet50")
    assert result.found and not result.passed
    assert any(line.startswith("strict load: FAILED") and "missing keys" in line for line in result.lines)
    with pytest.raises(WrongWeightsError, match="general.resnet50"):
        check_weights(["general.resnet50"], out=lambda _: None)


def test_non_tensor_entries_are_shown(tmp_path):
    import argparse
    path = tmp_path / "RETFound_cfp_weights.pth"
    torch.save({"model": {"norm.weight": torch.ones(2)}, "args": argparse.Namespace(lr=1), "epoch": 3}, path)
    text = describe_checkpoint(path)
    assert "model (1 tensors: norm.* (1))" in text and "args (non-tensor: Namespace)" in text


def test_only_paper_encoders_and_a_fixed_image():
    with pytest.raises(CrsreproError, match="not one"):
        check_weights(["demo.derm_cnn"])
    with pytest.raises(CrsreproError, match="exactly one"):
        check_weights(None, weights="x")
    assert torch.equal(synthetic_image(), synthetic_image()) and synthetic_image().shape == (1, 3, 300, 400)
