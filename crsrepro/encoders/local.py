"""Released state-dict files that are not in a library's hub layout (DESIGN.md section 4).

Each builder reads the checkpoint as its authors released it, safely (:func:`load_state_dict`), picks
the image-encoder keys by their real prefix, and hands them to the family that has the architecture:

===================  =============================================  ==================================
encoder              file and key layout                            built as
===================  =============================================  ==================================
RETFound             ``RETFound_cfp_weights.pth``: ``{'model': sd}``  timm ``vit_large_patch16_224``
PanDerm              ``panderm_ll_data6_checkpoint-499.pth``:       timm ``beit_large_patch16_224``
                     ``{'model': sd}``, keys ``encoder.*``          (abs. position embedding)
BioViL               ``biovil_image_resnet50_proj_size_128.pt``:    timm ``resnet50`` (torchvision
                     hi-ml ``ImageModel``, keys ``encoder.encoder.*``  key names)
CheXzero             ``best_64_5e-05_original_22000_0.864.pt``:      open_clip image tower, config
                     an OpenAI CLIP ViT-B/32 state dict              inferred from the keys
MedGemma             Gemma3 ``model*.safetensors`` (+ index) and     transformers ``SiglipVisionModel``
                     ``config.json``; keys ``vision_tower.vision_model.*``  from ``vision_config``
===================  =============================================  ==================================

For the timm-built ones, an optional ``config.json`` with ``model_args`` beside the file (as in timm's
hub layout) changes the architecture's size; released folders have none, and tests use it to shrink
ViT-L. CheXzero's and MedGemma's sizes come from the checkpoint itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from crsrepro.encoders.open_clip_family import open_clip_visual_from_state_dict
from crsrepro.encoders.registry import (
    EncoderSpec,
    find_weight_file,
    load_state_dict,
    load_weights_strictly,
    read_json,
    resolve_weights,
    resolve_weights_folder,
)
from crsrepro.encoders.timm_family import timm_from_state_dict
from crsrepro.encoders.transformers_family import hf_vision_encoder, siglip_vision_model
from crsrepro.errors import MissingWeightsError


def _unwrap(spec: EncoderSpec, checkpoint: dict, key: str | None, path: Path) -> dict:
    if key is None:
        return checkpoint
    if key not in checkpoint:
        raise MissingWeightsError(f"{spec.id}: {path} has no {key!r} entry (found {sorted(checkpoint)[:5]})")
    return checkpoint[key]


def _strip_prefix(spec: EncoderSpec, state_dict: dict, prefix: str, path: Path) -> dict:
    picked = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not picked:
        raise MissingWeightsError(f"{spec.id}: no keys starting with {prefix!r} in {path}")
    return picked


def _timm_checkpoint(spec, weights, device, *, wrapper_key: str | None, prefix: str, model_args: dict,
                     drop: tuple[str, ...] = ()):
    path = find_weight_file(spec, resolve_weights(spec, weights))
    state_dict = _strip_prefix(spec, _unwrap(spec, load_state_dict(path), wrapper_key, path), prefix, path)
    state_dict = {k: v for k, v in state_dict.items() if not k.startswith(drop)}
    args = {**model_args, **read_json(path.parent / "config.json").get("model_args", {})}
    return timm_from_state_dict(spec, state_dict, model_args=args, device=device, weights_path=path)


def build_retfound(spec: EncoderSpec, *, weights=None, device="cpu"):
    """RETFound (MAE ViT-L/16 on retinal photographs): ``{'model': encoder state dict}``.

    The MAE decoder keys, if present, are dropped; the encoder keys must fit exactly.
    """
    return _timm_checkpoint(spec, weights, device, wrapper_key="model", prefix="", model_args={},
                            drop=("decoder", "mask_token"))


def build_panderm(spec: EncoderSpec, *, weights=None, device="cpu"):
    """PanDerm (CAE-pretrained ViT-L/16 on dermatology images): ``{'model': sd}``, keys ``encoder.*``.

    PanDerm's own code strips ``encoder.`` and loads the BEiT-style ViT of its ``modeling_finetune``
    (q/v biases, layer scale, absolute position embedding); timm's BEiT has the same key names.
    """
    return _timm_checkpoint(spec, weights, device, wrapper_key="model", prefix="encoder.",
                            model_args={"use_abs_pos_emb": True, "use_rel_pos_bias": False,
                                        "use_shared_rel_pos_bias": False})


def build_biovil(spec: EncoderSpec, *, weights=None, device="cpu"):
    """BioViL's image encoder (hi-ml ``ImageModel``): the ResNet-50 under ``encoder.encoder.``.

    The 128-d projector is not loaded: the embedding is the 2048-d pooled ResNet output ([ours]).
    """
    return _timm_checkpoint(spec, weights, device, wrapper_key=None, prefix="encoder.encoder.", model_args={})


def build_chexzero(spec: EncoderSpec, *, weights=None, device="cpu"):
    """CheXzero: an OpenAI-format CLIP ViT state dict; the image tower's size is read from its keys."""
    path = find_weight_file(spec, resolve_weights(spec, weights))
    state_dict = load_state_dict(path)
    try:
        conv1 = state_dict["visual.conv1.weight"]
        n_layers = len({k.split(".")[3] for k in state_dict if k.startswith("visual.transformer.resblocks.")})
        grid = round((state_dict["visual.positional_embedding"].shape[0] - 1) ** 0.5)
        vision_cfg = {"width": conv1.shape[0], "layers": n_layers, "patch_size": conv1.shape[-1],
                      "image_size": conv1.shape[-1] * grid}
        model_cfg = {"embed_dim": state_dict["visual.proj"].shape[1], "vision_cfg": vision_cfg, "quick_gelu": True}
    except KeyError as err:
        raise MissingWeightsError(f"{spec.id}: {path} is not an OpenAI CLIP ViT state dict (no {err})") from None
    return open_clip_visual_from_state_dict(spec, state_dict, model_cfg=model_cfg, device=device, weights_path=path)


MEDGEMMA_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.")


def build_medgemma(spec: EncoderSpec, *, weights=None, device="cpu"):
    """MedGemma's SigLIP vision tower, read from the Gemma3 checkpoint without loading the language model.

    The folder holds ``config.json`` (with ``vision_config``) and ``model.safetensors`` or shards listed
    in ``model.safetensors.index.json``. Only the tensors under ``vision_tower.vision_model.`` are read.
    """
    from safetensors import safe_open

    folder = resolve_weights_folder(spec, weights)
    config = read_json(folder / "config.json")
    if "vision_config" not in config:
        raise MissingWeightsError(f"{spec.id}: {folder / 'config.json'} is missing or has no vision_config")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = [find_weight_file(spec, folder, ("model.safetensors",)).name]
    model = siglip_vision_model(config["vision_config"])
    # transformers 4 nests the tower under ``vision_model.``; transformers 5 does not
    target = "vision_model." if hasattr(model, "vision_model") else ""
    state_dict = {}
    for shard in shards:
        with safe_open(str(folder / shard), framework="pt") as f:
            for key in f.keys():
                prefix = next((p for p in MEDGEMMA_PREFIXES if key.startswith(p)), None)
                if prefix is not None:
                    state_dict[target + key[len(prefix):]] = f.get_tensor(key)
    if not state_dict:
        raise MissingWeightsError(f"{spec.id}: no {MEDGEMMA_PREFIXES[0]}* tensors in {folder}")
    load_weights_strictly(spec, model, state_dict, source=folder, what="the SigLIP tower of its vision_config")
    return hf_vision_encoder(spec, model, device=device, weights_path=folder)
