"""Released state-dict files that are not in a library's hub layout (DESIGN.md section 4).

Each builder reads the checkpoint as its authors released it, safely (:func:`load_state_dict`), picks
the image-encoder keys by their real prefix, and hands them to the family that has the architecture:

===========  ===================================================  =====================================
encoder      file and key layout                                  built as
===========  ===================================================  =====================================
RETFound     ``RETFound_cfp_weights.pth`` / ``RETFound_mae_        timm ``vit_large_patch16_224``
             natureCFP.pth``: ``{'model': sd, 'args': Namespace,
             ...}``; MAE encoder keys + ``decoder*``/``mask_token``
PanDerm      ``panderm_ll_data6_checkpoint-499.pth``: a flat state  timm ``beit_large_patch16_224``,
             dict, ``encoder.*`` (+ ``teacher.*``, ``decoder.*``,  ``global_pool='token'`` (so it has
             ...); the older release wrapped it as ``{'model':}``  ``norm``, not ``fc_norm``), abs. pos.
BioViL       ``biovil_image_resnet50_proj_size_128.pt``: hi-ml     timm ``resnet50`` (torchvision key
             ``ImageModel``, ``encoder.encoder.*`` (with ``fc.*``)  names; ``fc.*`` dropped)
             + ``projector.*``
CheXzero     ``best_64_5e-05_original_22000_0.864.pt``: an OpenAI  open_clip image tower, QuickGELU,
             CLIP ViT-B/32 state dict                             config inferred from the keys
MedGemma     Gemma3 ``model*.safetensors`` (+ index) and           transformers ``SiglipVisionModel``
             ``config.json``; keys ``vision_tower.vision_model.*``  from ``vision_config``
===========  ===================================================  =====================================

Keys outside the image encoder (decoders, teachers, projectors, training arguments) are left out by
prefix, and how many is logged; the encoder keys must fit exactly (strict loading).

For the timm-built ones, an optional ``config.json`` with ``model_args`` beside the file (as in timm's
hub layout) changes the architecture's size; released folders have none, and tests use it to shrink
ViT-L. CheXzero's and MedGemma's sizes come from the checkpoint itself.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from crsrepro.core.errors import MissingWeightsError, WrongWeightsError
from crsrepro.encoders.open_clip_family import open_clip_visual_from_state_dict
from crsrepro.encoders.registry import EncoderSpec
from crsrepro.encoders.timm_family import timm_from_state_dict
from crsrepro.encoders.transformers_family import hf_vision_encoder, siglip_vision_model
from crsrepro.encoders.weights import (check_md5, find_weight_file, load_state_dict, load_weights_strictly, read_json,
                                       resolve_weights, resolve_weights_folder)

logger = logging.getLogger(__name__)


def _unwrap(spec: EncoderSpec, checkpoint: dict, key: str | None, path: Path) -> dict:
    """``checkpoint[key]``; ``key=None`` means a flat state dict, or one wrapped as ``{'model': ...}``."""
    if key is None:
        inner = checkpoint.get("model")
        return inner if isinstance(inner, dict) else checkpoint
    if key not in checkpoint:
        raise WrongWeightsError(f"{spec.id}: {path} has no {key!r} entry (found {sorted(checkpoint)[:5]})")
    return checkpoint[key]


def _strip_prefix(spec: EncoderSpec, state_dict: dict, prefix: str, path: Path) -> dict:
    picked = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not picked:
        raise WrongWeightsError(f"{spec.id}: no keys starting with {prefix!r} in {path}")
    left_out = Counter(k.split(".")[0] for k in state_dict if not k.startswith(prefix))
    if left_out:
        logger.info("%s: %s: left out %d entries outside %r: %s", spec.id, path, sum(left_out.values()), prefix,
                    ", ".join(f"{name}.* ({n})" for name, n in sorted(left_out.items())))
    return picked


def _timm_checkpoint(spec, weights, device, *, wrapper_key: str | None, prefix: str, model_args: dict,
                     drop: tuple[str, ...] = ()):
    path = find_weight_file(spec, resolve_weights(spec, weights))
    check_md5(spec, path)
    state_dict = _strip_prefix(spec, _unwrap(spec, load_state_dict(path), wrapper_key, path), prefix, path)
    dropped = {k for k in state_dict if k.startswith(drop)} if drop else set()
    if dropped:
        logger.info("%s: %s: dropped %d keys starting with %s", spec.id, path, len(dropped), drop)
    state_dict = {k: v for k, v in state_dict.items() if k not in dropped}
    config = path.parent / "config.json"
    args = {**model_args, **read_json(config).get("model_args", {})}
    files = [p for p in (config, path) if p.is_file()]
    return timm_from_state_dict(spec, state_dict, model_args=args, device=device, weights_path=path,
                                weights_files=files)


def build_retfound(spec: EncoderSpec, *, weights=None, device="cpu"):
    """RETFound (MAE ViT-L/16 on retinal photographs): ``{'model': encoder state dict, ...}``.

    The MAE decoder keys and ``mask_token`` are dropped; the encoder keys (with the trained ``norm``)
    must fit exactly. Other top-level entries (``args``, ``epoch``, ``optimizer``) are not read.
    """
    return _timm_checkpoint(spec, weights, device, wrapper_key="model", prefix="", model_args={},
                            drop=("decoder", "mask_token"))


PANDERM_MODEL_ARGS = {"global_pool": "token", "use_abs_pos_emb": True, "use_rel_pos_bias": False,
                      "use_shared_rel_pos_bias": False}


def build_panderm(spec: EncoderSpec, *, weights=None, device="cpu"):
    """PanDerm (CAE-pretrained ViT-L/16 on dermatology images): the ``encoder.*`` keys of its checkpoint.

    The released file is a flat state dict (PanDerm's loader: ``torch.load(..., weights_only=True)``,
    then strip ``encoder.``); an older release and PanDerm's fine-tuning script wrap it as
    ``{'model': ...}``; both are read. Its linear-probe model (``PanDerm_Large_LP``:
    ``use_mean_pooling=False``) returns ``norm(x)[:, 0]``, the normed CLS token, so the timm BEiT is
    built with ``global_pool='token'``: a ``norm`` LayerNorm (the checkpoint's ``norm.*``) and no
    ``fc_norm``. Layer scale, q/v biases and the absolute position embedding have timm's key names.

    Every block's attention is set to ``qkv_bias_separate`` (timm BEiT: ``self.qkv(x) + bias`` instead of
    ``F.linear(x, self.qkv.weight, bias)``, the same output up to float rounding), so that the ``qkv``
    module is called and a LoRA adapter on it trains (:mod:`crsrepro.encoders.lora_targets`).
    """
    encoder = _timm_checkpoint(spec, weights, device, wrapper_key=None, prefix="encoder.",
                               model_args=PANDERM_MODEL_ARGS)
    for block in encoder.model.blocks:
        block.attn.qkv_bias_separate = True
    return encoder


def build_biovil(spec: EncoderSpec, *, weights=None, device="cpu"):
    """BioViL's image encoder (hi-ml ``ImageModel``): the ResNet-50 under ``encoder.encoder.``.

    The file's MD5 is checked against hi-ml's (``spec.weight_md5``). The torchvision ``fc.*`` head and
    the 128-d projector are not loaded: the embedding is the 2048-d pooled ResNet output, hi-ml's
    ``img_embedding``.
    """
    return _timm_checkpoint(spec, weights, device, wrapper_key=None, prefix="encoder.encoder.", model_args={})


def build_chexzero(spec: EncoderSpec, *, weights=None, device="cpu"):
    """CheXzero: an OpenAI-format CLIP ViT state dict; the image tower's size is read from its keys.

    QuickGELU always, as OpenAI CLIP (which CheXzero fine-tunes) was trained.
    """
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
        raise WrongWeightsError(f"{spec.id}: {path} is not an OpenAI CLIP ViT state dict (no {err})") from None
    return open_clip_visual_from_state_dict(spec, state_dict, model_cfg=model_cfg, device=device, weights_path=path,
                                            weights_files=[path])


MEDGEMMA_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.")


def build_medgemma(spec: EncoderSpec, *, weights=None, device="cpu"):
    """MedGemma's SigLIP vision tower, read from the Gemma3 checkpoint without loading the language model.

    The folder holds ``config.json`` (with ``vision_config``) and ``model.safetensors`` or shards listed
    in ``model.safetensors.index.json``. Only the tensors under ``vision_tower.vision_model.`` are read,
    and only from the shards that the index says hold them. The weights hash covers ``config.json`` and
    the tower tensors, not the shards (about 8.6 GB, mostly language model).
    """
    from safetensors import safe_open

    folder = resolve_weights_folder(spec, weights)
    config = read_json(folder / "config.json")
    if "vision_config" not in config:
        raise MissingWeightsError(f"{spec.id}: {folder / 'config.json'} is missing or has no vision_config")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted({shard for key, shard in weight_map.items() if key.startswith(MEDGEMMA_PREFIXES)})
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
        raise WrongWeightsError(f"{spec.id}: no {MEDGEMMA_PREFIXES[0]}* tensors in {folder}")
    load_weights_strictly(spec, model, state_dict, source=folder, what="the SigLIP tower of its vision_config")
    return hf_vision_encoder(spec, model, device=device, weights_path=folder, weights_files=[folder / "config.json"],
                             hash_parameters=True)
