"""LoRA targets that provably train (issue 25; crsrepro/encoders/lora_targets.py): for every paper architecture,
built shrunk from its release's own module layout (the checkpoint fixtures of tests/test_encoders.py, random
weights jittered as trained weights are, nothing downloaded), two optimiser steps give every adapter a non-zero
gradient and leave the frozen base unchanged bit for bit; the targets that look plausible but train nothing
(PanDerm's fused qkv, CLIP's attn.out_proj, SigLIP's pooling head, LLaVA-Med's last block) are caught; and the
patterns match the real-size module trees (built on the meta device) with the releases' block counts."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from crsrepro.encoders import create_encoder
from crsrepro.encoders.lora_targets import TARGETS, target_modules
from crsrepro.run.lora import LoraError, LoraParams, default_cells, lora_targets, step_check

_spec = importlib.util.spec_from_file_location("encoder_fixtures", Path(__file__).with_name("test_encoders.py"))
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)  # the checkpoint writers of the 15 paper encoders, in their release formats

PAPER_IDS = fixtures.PAPER_IDS
SMALL = LoraParams(rank=4, alpha=8, lr=1e-2)


@pytest.fixture(autouse=True)
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fixtures.point_hf_cache_at(monkeypatch, tmp_path / "empty_hf_cache")
    monkeypatch.delenv("CRSREPRO_WEIGHTS", raising=False)


def _built(tmp_path, monkeypatch, encoder_id):
    """The encoder from its shrunk fixture, every weight jittered: an untrained fixture has exact zeros where
    trained weights have none (timm's zero_init_last sets each bottleneck's last BatchNorm scale to 0)."""
    encoder = create_encoder(encoder_id, weights=fixtures.make_weights(tmp_path, encoder_id, monkeypatch))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in encoder.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return encoder


def _batch(encoder, n=2):
    rng = np.random.default_rng(0)
    size = encoder.spec.input_size
    return torch.from_numpy(rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8)), np.arange(n) % 2


def _check(encoder, params=SMALL):
    images, labels = _batch(encoder)
    return step_check(encoder, images, labels, task="multiclass", n_outputs=2, params=params)


def test_every_paper_encoder_declares_targets_and_the_paper_plan_has_its_cells():
    assert set(PAPER_IDS) <= set(TARGETS)
    assert len(default_cells("paper")) == 43  # DESIGN.md section 11: LoRA on all 43 cells


def test_an_empty_target_list_means_no_cells():
    from crsrepro.profiles import load_profile

    demo = load_profile("demo")
    none_left = load_profile("demo", overrides={"lora": {"exclude": list(demo.encoders)}})
    assert default_cells(none_left) == []
    assert default_cells(load_profile("demo", overrides={"encoders": ["demo.texture", "demo.pixel_pca"]})) == []


SLOW = {"general.resnet50", "specialist.biovil", "medical.biomedclip", "specialist.rad_dino"}  # 10-30 s each here


@pytest.mark.parametrize("encoder_id", [pytest.param(e, marks=pytest.mark.slow) if e in SLOW else e for e in PAPER_IDS])
def test_every_adapter_trains_and_the_base_is_unchanged(tmp_path, monkeypatch, encoder_id):
    encoder = _built(tmp_path, monkeypatch, encoder_id)
    check = _check(encoder)
    assert check.adapters and check.dead == [] and check.base_changed == []


def _names(encoder, suffix: str) -> list[str]:
    return [name for name, _ in encoder.model.named_modules() if re.fullmatch(rf"(.*\.)?{suffix}", name)]


def test_panderm_qkv_trains_only_because_its_bias_is_added_separately(tmp_path, monkeypatch):
    encoder = _built(tmp_path, monkeypatch, "specialist.panderm")
    assert all(block.attn.qkv_bias_separate for block in encoder.model.blocks)
    x = encoder.preprocess(_batch(encoder)[0])
    separate = encoder.forward_features(x)["final"]
    for block in encoder.model.blocks:
        block.attn.qkv_bias_separate = False  # timm's default: F.linear(x, self.qkv.weight, bias)
    torch.testing.assert_close(encoder.forward_features(x)["final"], separate)  # the same output
    check = _check(encoder)
    assert check.dead == _names(encoder, r"attn\.qkv") != []  # every qkv adapter is dead on the fused path


@pytest.mark.parametrize("encoder_id", ["general.clip", "specialist.chexzero"])
def test_multihead_attention_out_proj_would_train_nothing(tmp_path, monkeypatch, encoder_id):
    encoder = _built(tmp_path, monkeypatch, encoder_id)
    out_proj = tuple(_names(encoder, r"attn\.out_proj"))
    check = _check(encoder, dataclasses.replace(SMALL, target_modules=out_proj))
    assert out_proj and check.dead == list(out_proj)
    assert all(".mlp." in name for name in lora_targets(encoder))


@pytest.mark.parametrize("encoder_id", ["general.siglip", "medical.medsiglip"])
def test_siglip_targets_leave_out_the_pooling_head(tmp_path, monkeypatch, encoder_id):
    encoder = _built(tmp_path, monkeypatch, encoder_id)
    suffix = tuple(_names(encoder, "out_proj"))  # what the bare suffix out_proj would wrap
    assert any(name.startswith("head.") for name in suffix)
    assert not any(name.startswith("head.") for name in lora_targets(encoder))
    check = _check(encoder, dataclasses.replace(SMALL, target_modules=suffix))
    assert check.dead == [name for name in suffix if name.startswith("head.")]


def test_llava_med_adapts_only_the_blocks_its_feature_reads(tmp_path, monkeypatch):
    encoder = _built(tmp_path, monkeypatch, "medical.llava_med")
    n_layers = len(encoder.model.vision_model.encoder.layers if hasattr(encoder.model, "vision_model")
                   else encoder.model.encoder.layers)
    blocks = {int(re.search(r"layers\.(\d+)\.", name)[1]) for name in target_modules(encoder)}
    assert blocks == set(range(n_layers - 1))  # feature_layer -2: the penultimate block's output
    every_block = tuple(_names(encoder, r"self_attn\.(q|k|v|out)_proj"))
    check = _check(encoder, dataclasses.replace(SMALL, target_modules=every_block))
    assert check.dead and all(f"layers.{n_layers - 1}." in name for name in check.dead)


def test_an_undeclared_encoder_or_a_pattern_matching_nothing_is_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(LoraError, match="demo.texture: no LoRA target modules are declared"):
        lora_targets(create_encoder("demo.texture"))
    encoder = _built(tmp_path, monkeypatch, "general.dinov2")
    monkeypatch.setitem(TARGETS, "general.dinov2", r"encoder\.layer\.\d+\.attention\.attention\.query")
    with pytest.raises(LoraError, match="general.dinov2: its LoRA pattern .* matches no module of Dinov2Model"):
        lora_targets(encoder)


def _real_size_trees():
    """Each paper architecture at its release's real size, built on the meta device (no memory, no weights)."""
    import timm
    from open_clip.model import _build_vision_tower
    from transformers import (CLIPVisionConfig, CLIPVisionModel, Dinov2Config, Dinov2Model, SiglipVisionConfig,
                              SiglipVisionModel)

    from crsrepro.encoders.local import PANDERM_MODEL_ARGS

    def clip(patch):
        return _build_vision_tower(512, {"image_size": 224, "layers": 12, "width": 768, "patch_size": patch},
                                   quick_gelu=True)

    so400m = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, patch_size=14)
    return {
        "general.resnet50": lambda: timm.create_model("resnet50", num_classes=0),
        "general.vit_b16": lambda: timm.create_model("vit_base_patch16_224", num_classes=0),
        "general.clip": lambda: clip(16),
        "general.siglip": lambda: SiglipVisionModel(SiglipVisionConfig()),
        "general.dinov2": lambda: Dinov2Model(Dinov2Config(image_size=518)),  # the hub config's position table
        "general.mae": lambda: timm.create_model("vit_base_patch16_224", num_classes=0),
        "medical.biomedclip": lambda: _build_vision_tower(512, {"timm_model_name": "vit_base_patch16_224",
                                                               "timm_model_pretrained": False, "timm_pool": "",
                                                               "timm_proj": "linear", "image_size": 224}),
        "medical.llava_med": lambda: CLIPVisionModel(CLIPVisionConfig(hidden_size=1024, intermediate_size=4096,
                                                                      num_hidden_layers=24, num_attention_heads=16,
                                                                      image_size=336, patch_size=14)),
        "medical.medsiglip": lambda: SiglipVisionModel(SiglipVisionConfig(image_size=448, **so400m)),
        "medical.medgemma": lambda: SiglipVisionModel(SiglipVisionConfig(image_size=896, vision_use_head=False,
                                                                         **so400m)),
        "specialist.panderm": lambda: timm.create_model("beit_large_patch16_224", num_classes=0, **PANDERM_MODEL_ARGS),
        "specialist.retfound": lambda: timm.create_model("vit_large_patch16_224", num_classes=0),
        "specialist.rad_dino": lambda: Dinov2Model(Dinov2Config(image_size=518)),
        "specialist.biovil": lambda: timm.create_model("resnet50", num_classes=0),
        "specialist.chexzero": lambda: clip(32),
    }


#: Blocks x adapted modules per block of each release (LLaVA-Med: 23 of its 24 blocks feed its feature).
REAL_TARGETS = {"general.resnet50": 16 * 3, "general.vit_b16": 12 * 2, "general.clip": 12 * 2, "general.siglip": 12 * 4,
                "general.dinov2": 12 * 4, "general.mae": 12 * 2, "medical.biomedclip": 12 * 2,
                "medical.llava_med": 23 * 4, "medical.medsiglip": 27 * 4, "medical.medgemma": 27 * 4,
                "specialist.panderm": 24 * 2, "specialist.retfound": 24 * 2, "specialist.rad_dino": 12 * 4,
                "specialist.biovil": 16 * 3, "specialist.chexzero": 12 * 2}


def test_the_targets_match_the_real_size_module_trees():
    from types import SimpleNamespace

    from crsrepro.encoders import get_encoder_spec

    trees = _real_size_trees()
    assert set(trees) == set(REAL_TARGETS) == set(PAPER_IDS)
    with torch.device("meta"):
        for encoder_id, build in trees.items():
            spec, model = get_encoder_spec(encoder_id), build()
            assert sum(p.numel() for p in model.parameters()) == spec.n_params, encoder_id  # the real size
            names = target_modules(SimpleNamespace(spec=spec, model=model))
            assert len(names) == REAL_TARGETS[encoder_id], encoder_id
