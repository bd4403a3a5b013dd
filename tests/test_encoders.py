"""The encoder registry and the paper's 15 encoders, loaded from tiny checkpoints in their real formats.

Every paper spec gets a fixture writer below that saves a small random model of its architecture in the
format its real weights are released in (timm hub folder, open_clip hub folder, transformers
``save_pretrained`` folder, or the released state-dict file with its real key prefixes and its extra
entries: classifier heads, decoders, teachers, ``args``). Nothing is downloaded: the Hugging Face hub is
put offline and its cache pointed at an empty folder (or at a populated one, built here, for the
cache tests).
"""

import argparse
import dataclasses
import hashlib
import json

import numpy as np
import open_clip
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (
    CLIPConfig,
    CLIPModel,
    Dinov2Config,
    Dinov2Model,
    SiglipConfig,
    SiglipModel,
)

from crsrepro.encoders import create_encoder, get_encoder_spec, list_encoders, local, paper
from crsrepro.encoders import registry, weights
from crsrepro.encoders.registry import (NETWORK_TAPS, PAPER_TAPS, EncoderSpec, pil_to_uint8_tensor, register,
                                       remap_to_uint8, resize_to_input)
from crsrepro.encoders.weights import load_state_dict, md5_of, resolve_weights, state_dict_hash, weights_hash
from crsrepro.core.errors import MissingWeightsError, UnknownEncoderError, WrongWeightsError

PAPER_IDS = [spec.id for spec, _ in paper.PAPER_ENCODERS]


def point_hf_cache_at(monkeypatch, folder):
    """huggingface_hub reads HF_HUB_CACHE once, at import: set the variable and the constant it became."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))


@pytest.fixture(autouse=True)
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    point_hf_cache_at(monkeypatch, tmp_path / "empty_hf_cache")
    monkeypatch.delenv("CRSREPRO_WEIGHTS", raising=False)


# ------------------------------------------------------------------------------ fixture writers

def _timm_hub(folder, arch, model_args, *, head=True):
    # real tv_in1k / augreg files carry their ImageNet classifier (fc.* / head.*) and a pretrained_cfg
    model = timm.create_model(arch, pretrained=False, num_classes=10 if head else 0, **model_args)
    (folder / "config.json").write_text(json.dumps({"architecture": arch, "num_classes": 10, "model_args": model_args,
                                                    "pretrained_cfg": {"crop_pct": 0.875}}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")


TINY_VIT = {"embed_dim": 32, "depth": 4, "num_heads": 2}
TINY_RESNET = {"layers": [1, 1, 1, 1]}
TINY_TEXT = {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1}


def _open_clip_hub(folder, model_cfg, state_dict):
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    torch.save(state_dict, folder / "open_clip_pytorch_model.bin")


def write_clip(folder):
    cfg = {"embed_dim": 16, "vision_cfg": {"image_size": 224, "layers": 4, "width": 32, "head_width": 16,
                                           "patch_size": 32}, "text_cfg": TINY_TEXT, "quick_gelu": True}
    _open_clip_hub(folder, cfg, open_clip.CLIP(**cfg).state_dict())


def write_biomedclip(folder):
    # BiomedCLIP's real config: a timm trunk and a Hugging Face text tower (never built here)
    cfg = {"embed_dim": 16, "vision_cfg": {"timm_model_name": "vit_tiny_patch16_224", "timm_model_pretrained": False,
                                           "timm_pool": "", "timm_proj": "linear", "image_size": 224},
           "text_cfg": {"hf_model_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                        "hf_tokenizer_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                        "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler",
                        "context_length": 256}}
    from open_clip.model import _build_vision_tower
    visual = _build_vision_tower(16, cfg["vision_cfg"])
    state_dict = {f"visual.{k}": v for k, v in visual.state_dict().items()}
    state_dict["text.transformer.embeddings.word_embeddings.weight"] = torch.zeros(10, 8)
    _open_clip_hub(folder, cfg, state_dict)


def _siglip(folder, image_size, patch_size):
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
              "image_size": image_size, "patch_size": patch_size}
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "vocab_size": 64, "max_position_embeddings": 16}
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).save_pretrained(folder)


def _dinov2(folder, image_size):
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                             image_size=image_size, patch_size=14)).save_pretrained(folder)


def write_llava_med(folder):
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 5, "num_attention_heads": 2,
              "image_size": 336, "patch_size": 14, "projection_dim": 16}
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "vocab_size": 64, "max_position_embeddings": 16, "projection_dim": 16}
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(folder)


def write_medgemma(folder):
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 4, "num_attention_heads": 2, "image_size": 896, "patch_size": 56,
              "vision_use_head": False}
    from transformers import SiglipVisionConfig, SiglipVisionModel
    tower = SiglipVisionModel(SiglipVisionConfig(**vision)).state_dict()
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3", "vision_config": vision,
                                                    "text_config": {"hidden_size": 8}}))
    shard1 = {"language_model.model.embed_tokens.weight": torch.zeros(4, 8)}
    # the released key layout, whatever the installed transformers nests
    shard2 = {"vision_tower.vision_model." + k.removeprefix("vision_model."): v.contiguous() for k, v in tower.items()}
    shard2["multi_modal_projector.mm_input_projection_weight"] = torch.zeros(32, 8)
    names = {"model-00001-of-00002.safetensors": shard1, "model-00002-of-00002.safetensors": shard2}
    for name, tensors in names.items():
        save_file(tensors, folder / name)
    weight_map = {k: name for name, tensors in names.items() for k in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _shrunk_timm_pth(folder, filename, arch, model_args, *, wrap, prefix, extra, num_classes=0, top_level=None):
    model = timm.create_model(arch, pretrained=False, num_classes=num_classes, **model_args)
    state_dict = {prefix + k: v for k, v in model.state_dict().items()}
    state_dict.update(extra)
    (folder / "config.json").write_text(json.dumps({"model_args": model_args}))
    torch.save({"model": state_dict, **(top_level or {})} if wrap else state_dict, folder / filename)


def write_retfound(folder):
    # MAE's save_model: {'model', 'optimizer', 'epoch', 'scaler', 'args'}; args is an argparse.Namespace
    _shrunk_timm_pth(folder, "RETFound_cfp_weights.pth", "vit_large_patch16_224", TINY_VIT, wrap=True, prefix="",
                     extra={"decoder_embed.weight": torch.zeros(4, 32), "decoder_pos_embed": torch.zeros(1, 5, 4),
                            "mask_token": torch.zeros(1, 1, 4)},
                     top_level={"epoch": 799, "args": argparse.Namespace(model="mae_vit_large_patch16", lr=None,
                                                                         mask_ratio=0.75, norm_pix_loss=True)})


PANDERM_TINY = {**TINY_VIT, "init_values": 0.1}


def write_panderm(folder, *, wrap=False):
    # the released file: a flat CAE state dict, the encoder under encoder.*, plus teacher and decoder
    extra = {"teacher.norm.weight": torch.ones(32), "teacher.blocks.0.attn.qkv.weight": torch.zeros(96, 32),
             "decoder.norm.weight": torch.ones(32), "regressor.norm.weight": torch.zeros(4)}
    _shrunk_timm_pth(folder, "panderm_ll_data6_checkpoint-499.pth", "beit_large_patch16_224",
                     {**local.PANDERM_MODEL_ARGS, **PANDERM_TINY}, wrap=wrap, prefix="encoder.", extra=extra)
    (folder / "config.json").write_text(json.dumps({"model_args": PANDERM_TINY}))


def write_biovil(folder):
    # hi-ml's ImageModel: the torchvision ResNet-50 (with its fc.*) under encoder.encoder.*, plus the projector
    _shrunk_timm_pth(folder, "biovil_image_resnet50_proj_size_128.pt", "resnet50", TINY_RESNET, wrap=False,
                     prefix="encoder.encoder.", num_classes=10,
                     extra={"projector.model.0.weight": torch.zeros(8, 2048, 1, 1)})


def write_chexzero(folder):
    cfg = {"embed_dim": 16, "vision_cfg": {"image_size": 224, "layers": 4, "width": 64, "patch_size": 32},
           "text_cfg": TINY_TEXT, "quick_gelu": True}
    torch.save(open_clip.CLIP(**cfg).state_dict(), folder / "best_64_5e-05_original_22000_0.864.pt")


FIXTURES = {
    "general.resnet50": lambda f: _timm_hub(f, "resnet50", TINY_RESNET),
    "general.vit_b16": lambda f: _timm_hub(f, "vit_base_patch16_224", TINY_VIT),
    "general.clip": write_clip,
    "general.siglip": lambda f: _siglip(f, 224, 16),
    "general.dinov2": lambda f: _dinov2(f, 224),
    "general.mae": lambda f: _timm_hub(f, "vit_base_patch16_224", TINY_VIT),
    "medical.biomedclip": write_biomedclip,
    "medical.llava_med": write_llava_med,
    "medical.medsiglip": lambda f: _siglip(f, 448, 32),
    "medical.medgemma": write_medgemma,
    "specialist.panderm": write_panderm,
    "specialist.retfound": write_retfound,
    "specialist.rad_dino": lambda f: _dinov2(f, 518),
    "specialist.biovil": write_biovil,
    "specialist.chexzero": write_chexzero,
}


def make_weights(tmp_path, encoder_id, monkeypatch=None):
    """Write the fixture; with ``monkeypatch``, register the spec with the fixture's MD5 where the real
    spec pins the released file's (BioViL), so the rest of the load can be tested."""
    folder = tmp_path / "weights" / encoder_id
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    FIXTURES[encoder_id](folder)
    spec, builder = registry._lookup(encoder_id)
    if monkeypatch is not None and spec.weight_md5:
        fixture_md5 = md5_of(folder / spec.weight_files[0])
        patched = dataclasses.replace(spec, weight_md5=fixture_md5)
        monkeypatch.setitem(registry._REGISTRY, encoder_id, (patched, builder))
    return folder


def make_images(n=3):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40 + 8 * i, 56, 3), dtype=np.uint8)) for i in range(n)]


# ------------------------------------------------------------------------------ tests

def test_the_paper_panel_is_registered_with_its_families_and_exclusions():
    assert set(PAPER_IDS) <= set(list_encoders())
    families = [get_encoder_spec(i).family for i in PAPER_IDS]
    assert (families.count("general"), families.count("medical"), families.count("specialist")) == (6, 4, 5)
    excluded = {i for i in PAPER_IDS if "aptos2019" in get_encoder_spec(i).excluded_datasets}
    assert excluded == {"specialist.biovil", "specialist.chexzero"}
    assert set(FIXTURES) == set(PAPER_IDS), "every paper spec needs a checkpoint fixture"


@pytest.mark.parametrize("encoder_id", PAPER_IDS)
def test_each_paper_encoder_loads_from_its_real_format(tmp_path, monkeypatch, encoder_id):
    folder = make_weights(tmp_path, encoder_id, monkeypatch)
    encoder = create_encoder(encoder_id, weights=folder)
    spec = encoder.spec
    images = make_images()
    feats = encoder.encode_images(images)
    assert feats.dtype == np.float32 and feats.shape[0] == len(images) and np.isfinite(feats).all()
    np.testing.assert_array_equal(feats, encoder.encode_images(images))  # deterministic

    batch = torch.stack([encoder.resize(pil_to_uint8_tensor(im)[None])[0] for im in images])
    x = encoder.preprocess(batch)
    assert x.shape == (3, 3, spec.input_size, spec.input_size)
    assert spec.layer_taps == PAPER_TAPS and set(NETWORK_TAPS) < set(PAPER_TAPS)
    taps = encoder.forward_features(x, layers=PAPER_TAPS)
    assert list(taps) == list(PAPER_TAPS)
    np.testing.assert_allclose(taps["final"].numpy(), feats, rtol=1e-4, atol=1e-5)
    assert all(t.shape[0] == 3 and t.ndim == 2 for t in taps.values())
    early, final = taps["depth25"], taps["final"]
    assert early.shape != final.shape or not torch.allclose(early, final)
    # depth100: the last block pooled like the other depth taps; 'final' differs only where it is a head
    last = taps["depth100"]
    assert spec.pooling == "gap" or last.shape == taps["depth75"].shape  # ResNet stages widen; tokens do not
    if spec.pooling == "image_embed":
        assert last.shape != final.shape or not torch.allclose(last, final)
    else:
        torch.testing.assert_close(last, final)
    assert len(encoder.weights_hash) == 64


def test_weights_resolve_from_crsrepro_weights(tmp_path, monkeypatch):
    make_weights(tmp_path, "general.vit_b16")
    monkeypatch.setenv("CRSREPRO_WEIGHTS", str(tmp_path / "weights"))
    encoder = create_encoder("general.vit_b16")
    assert encoder.weights_path == tmp_path / "weights" / "general.vit_b16"


def test_missing_weights_say_where_we_looked_and_what_is_expected(tmp_path, monkeypatch):
    monkeypatch.setenv("CRSREPRO_WEIGHTS", str(tmp_path / "nothing"))
    with pytest.raises(MissingWeightsError) as err:
        create_encoder("specialist.retfound")
    message = str(err.value)
    assert "nothing/specialist.retfound" in message and "YukunZhou/RETFound_mae_natureCFP" in message
    assert "RETFound_cfp_weights.pth" in message
    with pytest.raises(MissingWeightsError, match="does not exist"):
        create_encoder("general.clip", weights=tmp_path / "absent")


def test_a_checkpoint_that_does_not_fit_is_refused(tmp_path):
    folder = tmp_path / "w"
    folder.mkdir()
    _timm_hub(folder, "vit_base_patch16_224", TINY_VIT)
    with pytest.raises(WrongWeightsError, match="expected 'resnet50'"):
        create_encoder("general.resnet50", weights=folder)
    state_dict = load_state_dict(folder / "model.safetensors")
    del state_dict["blocks.0.attn.qkv.weight"]
    save_file(state_dict, folder / "model.safetensors")
    with pytest.raises(WrongWeightsError, match="1 missing keys"):
        create_encoder("general.vit_b16", weights=folder)


class _NotATensor:
    pass


def test_pickled_objects_are_never_unpickled(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": _NotATensor()}, path)
    with pytest.raises(WrongWeightsError, match="weights-only"):
        load_state_dict(path)


def test_weights_hash_follows_the_bytes(tmp_path, monkeypatch):
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"one")
    first = weights_hash(folder)
    assert weights_hash(folder) == first
    (folder / "a.bin").write_bytes(b"two")
    assert weights_hash(folder) != first
    assert weights_hash(folder / "a.bin") == hashlib.sha256(b"two").hexdigest()  # a file: its own SHA-256
    read = []  # an unchanged file is hashed once per process (by path, size and mtime)
    monkeypatch.setattr(weights, "sha256_file", lambda path: read.append(path) or "x")
    (folder / "b.bin").write_bytes(b"three")
    weights_hash(folder), weights_hash(folder)
    assert read == [folder / "b.bin"]


def test_unknown_ids_and_duplicates_are_errors():
    with pytest.raises(UnknownEncoderError, match="general.dinov2"):
        get_encoder_spec("general.dinov3")
    spec = get_encoder_spec("general.dinov2")
    with pytest.raises(ValueError, match="already registered"):
        register(spec, lambda *a, **k: None)
    with pytest.raises(ValueError, match="interpolation"):
        EncoderSpec(**{**spec.__dict__, "interpolation": "nearest"})


def test_models_without_a_weight_file_hash_their_parameters_and_buffers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))  # has a 0-d buffer
    first = state_dict_hash(model)
    with torch.no_grad():
        model[1].running_mean += 1
    assert state_dict_hash(model) != first and len(first) == 64


# ------------------------------------------------------------------------------ as released (DESIGN.md section 14)

def test_panderm_reads_its_flat_release_and_returns_the_normed_cls(tmp_path, monkeypatch):
    folder = make_weights(tmp_path, "specialist.panderm")
    encoder = create_encoder("specialist.panderm", weights=folder)
    model = encoder.model
    assert isinstance(model.norm, torch.nn.LayerNorm) and isinstance(model.fc_norm, torch.nn.Identity)
    saved = torch.load(folder / "panderm_ll_data6_checkpoint-499.pth", weights_only=True)
    assert "model" not in saved and any(k.startswith("teacher.") for k in saved)
    torch.testing.assert_close(model.norm.weight, saved["encoder.norm.weight"])
    x = encoder.preprocess(torch.randint(0, 256, (2, 3, 224, 224), dtype=torch.uint8))
    with torch.no_grad():
        normed_cls = model.norm(_beit_tokens(model, x))[:, 0]
    torch.testing.assert_close(encoder.forward_features(x)["final"], normed_cls)
    # an older copy wraps the same state dict as {'model': ...}: read too, same features
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.manual_seed(0)
    write_panderm(legacy, wrap=True)
    torch.testing.assert_close(create_encoder("specialist.panderm", weights=legacy).forward_features(x)["final"],
                               normed_cls)


def _beit_tokens(model, x):
    """PanDerm's forward_features before its final norm: patch embed, CLS, position, blocks."""
    x = model.patch_embed(x)
    x = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed
    for block in model.blocks:
        x = block(x, shared_rel_pos_bias=None)
    return x


def test_retfound_args_namespace_is_allowed_and_nothing_else(tmp_path):
    folder = make_weights(tmp_path, "specialist.retfound")
    loaded = load_state_dict(folder / "RETFound_cfp_weights.pth")
    assert isinstance(loaded["args"], argparse.Namespace) and loaded["args"].mask_ratio == 0.75
    create_encoder("specialist.retfound", weights=folder)
    evil = tmp_path / "RETFound_cfp_weights.pth"
    torch.save({"model": {}, "args": argparse.Namespace(), "extra": _NotATensor()}, evil)
    with pytest.raises(WrongWeightsError) as err:
        create_encoder("specialist.retfound", weights=evil)
    message = str(err.value)
    assert str(evil) in message and "_NotATensor" in message and "\n" not in message


def test_openai_clip_is_quick_gelu_whatever_its_config_says(tmp_path):
    from open_clip.transformer import QuickGELU
    folder = make_weights(tmp_path, "general.clip")
    acts = lambda enc: {type(b.mlp.gelu) for b in enc.model.transformer.resblocks}  # noqa: E731
    assert acts(create_encoder("general.clip", weights=folder)) == {QuickGELU}
    config = json.loads((folder / "open_clip_config.json").read_text())
    del config["model_cfg"]["quick_gelu"]  # an older snapshot's config
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    assert acts(create_encoder("general.clip", weights=folder)) == {QuickGELU}
    # BiomedCLIP's timm trunk keeps nn.GELU, as trained
    biomed = create_encoder("medical.biomedclip", weights=make_weights(tmp_path, "medical.biomedclip"))
    assert {type(b.mlp.act) for b in biomed.model.trunk.blocks} == {torch.nn.GELU}


@pytest.mark.parametrize("mode", ["crop", "pad"])
def test_resize_modes_on_a_non_square_image(mode):
    spec = dataclasses.replace(get_encoder_spec("general.vit_b16"), input_size=8, resize_mode=mode, pad_fill=(10, 20, 30),
                               interpolation="bilinear")
    image = torch.full((1, 3, 4, 8), 200, dtype=torch.uint8)  # wide: 4 rows, 8 columns
    out = resize_to_input(spec, image)
    assert out.shape == (1, 3, 8, 8) and out.dtype == torch.uint8
    if mode == "crop":  # the short side fills the square: all image
        assert (out == 200).all()
    else:  # a centred band of image between padding of the fill colour
        assert out[0, :, 4, 4].tolist() == [200, 200, 200]
        assert out[0, :, 0, 4].tolist() == [10, 20, 30] and out[0, :, 7, 4].tolist() == [10, 20, 30]
    assert spec.preprocessing["resize"] == {"crop": "short_side_then_center_crop",
                                            "pad": "pad_to_square_then_resize"}[mode]


def test_the_padding_releases_pad_with_their_own_fill():
    modes = {i: (get_encoder_spec(i).resize_mode, get_encoder_spec(i).pad_fill) for i in PAPER_IDS if get_encoder_spec(i).resize_mode == "pad"}
    assert modes == {"medical.medsiglip": ("pad", (0, 0, 0)), "medical.llava_med": ("pad", (122, 116, 104)),
                     "specialist.chexzero": ("pad", (0, 0, 0))}
    assert get_encoder_spec("general.dinov2").preprocessing == {  # a crop-mode encoder: no pad fields; its pin
        "input_size": 224, "mean": list(paper.IMAGENET_MEAN), "std": list(paper.IMAGENET_STD),
        "interpolation": "bicubic", "resize": "short_side_then_center_crop",
        "hf_revision": "f9e44c814b77203eaa57a6bdbbd535f21ede1415"}


def test_release_fields_follow_the_releases():
    panderm = get_encoder_spec("specialist.panderm")
    assert (panderm.pooling, panderm.interpolation, panderm.licence) == ("cls", "bilinear", "CC-BY-NC-ND-4.0")
    assert get_encoder_spec("specialist.rad_dino").licence == "MIT"
    biovil = get_encoder_spec("specialist.biovil")
    assert biovil.hf_revision == "v1.1" and biovil.preprocessing["hf_revision"] == "v1.1"
    assert biovil.weight_md5 == "02ce6ee460f72efd599295f440dbb453"
    assert all(get_encoder_spec(i).n_params and get_encoder_spec(i).notes.startswith("Release:") for i in PAPER_IDS)


def test_biovil_refuses_a_file_whose_md5_is_not_the_release(tmp_path):
    folder = make_weights(tmp_path, "specialist.biovil")  # the real spec: the fixture is not the release
    with pytest.raises(WrongWeightsError, match="02ce6ee460f72efd599295f440dbb453"):
        create_encoder("specialist.biovil", weights=folder)


def _populate_hf_cache(cache, repo, files_from, *, revision="main", commit="a" * 40):
    """The layout huggingface_hub writes: models--org--name/{blobs,refs/<revision>,snapshots/<commit>/...}."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / revision).write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in files_from.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    return snapshot


def test_weights_resolve_from_a_populated_offline_hf_cache_at_the_pinned_revision(tmp_path, monkeypatch):
    cache = tmp_path / "hf_cache"
    source = make_weights(tmp_path, "general.resnet50")  # with the fc.* head of the real tv_in1k file
    assert "fc.weight" in load_state_dict(source / "model.safetensors")
    resnet = get_encoder_spec("general.resnet50")  # pinned to a commit: main at another commit is not used
    _populate_hf_cache(cache, resnet.hf_repo, source, commit="c" * 40)
    point_hf_cache_at(monkeypatch, cache)
    with pytest.raises(MissingWeightsError, match=f"revision {resnet.hf_revision}"):
        create_encoder("general.resnet50")
    snapshot = cache / "models--timm--resnet50.tv_in1k" / "snapshots" / resnet.hf_revision
    snapshot.mkdir()
    for path in source.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    encoder = create_encoder("general.resnet50")
    assert encoder.weights_path == snapshot
    # BioViL is pinned to v1.1: a cache holding only main is not used, one holding v1.1 is
    biovil = get_encoder_spec("specialist.biovil")
    files = make_weights(tmp_path, "specialist.biovil")
    _populate_hf_cache(cache, biovil.hf_repo, files, revision="main", commit="b" * 40)
    with pytest.raises(MissingWeightsError, match="revision v1.1"):
        resolve_weights(biovil)
    (cache / "models--microsoft--BiomedVLP-CXR-BERT-specialized" / "refs" / "v1.1").write_text("b" * 40)
    assert resolve_weights(biovil).name == "b" * 40


def test_the_weights_hash_covers_only_the_files_read(tmp_path, monkeypatch):
    folder = make_weights(tmp_path, "specialist.rad_dino")
    first = create_encoder("specialist.rad_dino", weights=folder).weights_hash
    (folder / "README.md").write_text("a model card edit")
    (folder / "dino_head.safetensors").write_bytes(b"not read")
    assert create_encoder("specialist.rad_dino", weights=folder).weights_hash == first
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-5}))
    assert create_encoder("specialist.rad_dino", weights=folder).weights_hash != first
    # MedGemma: the tower tensors and config.json, not the language-model shard
    gemma = make_weights(tmp_path, "medical.medgemma")
    before = create_encoder("medical.medgemma", weights=gemma).weights_hash
    language_model = {"language_model.model.embed_tokens.weight": torch.ones(4, 8)}
    save_file(language_model, gemma / "model-00001-of-00002.safetensors")
    assert create_encoder("medical.medgemma", weights=gemma).weights_hash == before


def test_hf_taps_are_pooled_as_they_go_and_match_the_hidden_states(tmp_path):
    encoder = create_encoder("medical.medsiglip", weights=make_weights(tmp_path, "medical.medsiglip"))
    x = encoder.preprocess(torch.randint(0, 256, (2, 3, 448, 448), dtype=torch.uint8))
    taps = encoder.forward_features(x, layers=PAPER_TAPS)
    with torch.no_grad():
        out = encoder.model(pixel_values=x, output_hidden_states=True)
    norm = encoder._final_norm()
    for name, block in registry.depth_block_indices(4, ["depth25", "depth50", "depth75", "depth100"]).items():
        torch.testing.assert_close(taps[name], norm(out.hidden_states[block + 1]).mean(dim=1))
    torch.testing.assert_close(taps["final"], out.pooler_output)


def test_llava_pads_a_greyscale_image_with_grey_114_and_a_colour_image_with_the_mean_colour():
    spec = get_encoder_spec("medical.llava_med")
    grey = torch.full((1, 3, 10, 20), 50, dtype=torch.uint8)
    colour = grey.clone()
    colour[:, 0] = 60
    out = resize_to_input(spec, torch.cat([grey, colour]))
    assert out[0, :, 0, 0].tolist() == [114, 114, 114] and out[1, :, 0, 0].tolist() == [122, 116, 104]
    assert spec.preprocessing["pad_fill_grey"] == 114


def test_biovil_stretches_each_image_to_0_255_as_hi_ml_remap_to_uint8():
    spec = get_encoder_spec("specialist.biovil")
    image = torch.randint(40, 200, (1, 3, 480, 480), dtype=torch.uint8)  # at the input size: remapped only
    out = resize_to_input(spec, image)
    assert int(out.min()) == 0 and int(out.max()) == 255 and spec.preprocessing["intensity_remap"] == "minmax"
    flat = torch.tensor([40, 120, 200], dtype=torch.uint8).view(1, 1, 1, 3).expand(1, 3, 1, 3)
    assert remap_to_uint8(flat)[0, 0, 0].tolist() == [0, 127, 255]  # hi-ml truncates to uint8
    assert "intensity_remap" not in get_encoder_spec("general.resnet50").preprocessing


def test_loading_a_transformers_checkpoint_prints_no_bar_of_its_own(tmp_path, capfd):
    """A run shows one bar per stage; transformers' "Loading weights" bar of every model load is kept out
    of it, and the setting is restored after."""
    from transformers.utils import logging as transformers_logging

    folder = make_weights(tmp_path, "medical.medsiglip")
    capfd.readouterr()
    create_encoder("medical.medsiglip", weights=folder)
    assert "Loading weights" not in capfd.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()
