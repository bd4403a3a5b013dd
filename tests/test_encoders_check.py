"""``crsrepro check-weights``: reports found / not found, the file's entries, the strict load, the parameter
count against the spec and one embedding, on tiny checkpoints in the released layouts; never downloads."""

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

from crsrepro.cli import main
from crsrepro.tools.check_weights import PAPER_IDS, check_weights, describe_checkpoint, synthetic_image
from crsrepro.core.errors import CrsreproError


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
    results = check_weights(["general.resnet50"], out=lambda _: None)
    assert results[0].found and not results[0].passed
    assert any(line.startswith("strict load: FAILED") and "missing keys" in line for line in results[0].lines)


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
