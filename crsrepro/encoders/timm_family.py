"""timm encoders: ViTs, BEiT-style ViTs and ResNets (DESIGN.md section 4).

A timm checkpoint folder is laid out as on the Hugging Face hub: ``config.json`` (``architecture``,
optional ``model_args``) and ``model.safetensors`` or ``pytorch_model.bin``. The network is built with
``timm.create_model(spec.architecture, pretrained=False, num_classes=0, **model_args)``; ``model_args``
from ``config.json`` is how a small test checkpoint shrinks the architecture while the spec keeps the
real one. Layer taps come from one ``forward_intermediates`` pass; ViT tokens pass through the final
norm at every tap ([ours], as DINOv2's ``get_intermediate_layers(norm=True)``).
"""

from __future__ import annotations

from pathlib import Path

import timm
import logging

import torch

from crsrepro.core.errors import WrongWeightsError
from crsrepro.encoders.registry import Encoder, EncoderSpec, depth_block_indices, pool_feature_map, pool_tokens
from crsrepro.encoders.weights import (find_weight_file, load_state_dict, load_weights_strictly, read_json,
                                       resolve_weights_folder)

logger = logging.getLogger(__name__)

HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_HEAD_KEYS = ("head.weight", "head.bias", "fc.weight", "fc.bias", "head.fc.weight", "head.fc.bias")


class TimmEncoder(Encoder):
    """A timm network: transformer blocks (``model.blocks``) or a ResNet's four stages."""

    def _forward_layers(self, x, layers):
        model = self.model
        if hasattr(model, "blocks"):  # ViT / BEiT: one tap per block, tokens out
            idx = depth_block_indices(len(model.blocks), layers)
            outs = model.forward_intermediates(x, indices=sorted(set(idx.values())), norm=True,
                                               return_prefix_tokens=True, output_fmt="NLC",
                                               intermediates_only=True)
            by_block = dict(zip(sorted(set(idx.values())), outs))
            pooled = {}
            for name, block in idx.items():
                patches, prefix = by_block[block]
                tokens = torch.cat([prefix, patches], dim=1)
                pooled[name] = pool_tokens(tokens, self.spec.pooling_at(name),
                                           num_prefix_tokens=prefix.shape[1])
            return pooled
        # ResNet: feature_info lists the stem then the four stages; the taps index the stages
        idx = {name: i + 1 for name, i in depth_block_indices(4, layers).items()}
        outs = model.forward_intermediates(x, indices=sorted(set(idx.values())), intermediates_only=True)
        by_stage = dict(zip(sorted(set(idx.values())), outs))
        return {name: pool_feature_map(by_stage[stage]) for name, stage in idx.items()}


def timm_from_state_dict(spec: EncoderSpec, state_dict: dict, *, model_args: dict, device,
                         weights_path: Path, weights_files: list[Path]) -> TimmEncoder:
    """Build ``spec.architecture`` with ``model_args`` and load ``state_dict`` strictly.

    The classifier head of a released file (``fc.*`` of torchvision's ResNet-50, ``head.*`` of an
    ImageNet ViT) is dropped, and the count logged; every other key must fit.
    """
    model = timm.create_model(spec.architecture, pretrained=False, num_classes=0, **model_args)
    heads = [k for k in state_dict if k in _HEAD_KEYS]
    if heads:
        logger.info("%s: dropped the classifier head of %s: %s", spec.id, weights_path, ", ".join(heads))
    state_dict = {k: v for k, v in state_dict.items() if k not in _HEAD_KEYS}
    load_weights_strictly(spec, model, state_dict, source=weights_path, what=f"timm {spec.architecture}")
    return TimmEncoder(spec, model, device=device, weights_path=weights_path, weights_files=weights_files)


def build_timm(spec: EncoderSpec, *, weights=None, device="cpu") -> TimmEncoder:
    """Builder for ``loader="timm"``: a hub-layout folder (``config.json`` + weights)."""
    folder = resolve_weights_folder(spec, weights)
    config = read_json(folder / "config.json")
    arch = config.get("architecture", spec.architecture)
    if arch != spec.architecture:
        raise WrongWeightsError(f"{spec.id}: {folder / 'config.json'} is for {arch!r}, "
                                f"expected {spec.architecture!r}")
    path = find_weight_file(spec, folder, HUB_WEIGHT_FILES)
    files = [p for p in (folder / "config.json", path) if p.is_file()]
    return timm_from_state_dict(spec, load_state_dict(path), model_args=config.get("model_args", {}),
                                device=device, weights_path=folder, weights_files=files)
