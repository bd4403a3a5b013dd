"""open_clip encoders: the image tower of a CLIP-style model (DESIGN.md section 4).

An open_clip checkpoint folder is laid out as on the Hugging Face hub: ``open_clip_config.json``
(``model_cfg`` with ``embed_dim`` and ``vision_cfg``) and ``open_clip_pytorch_model.bin`` or
``open_clip_model.safetensors``. Only the image tower is built and loaded (the ``visual.*`` keys), so a
text tower that names a Hugging Face text model (BiomedCLIP's PubMedBERT) never has to be fetched.
The config in the folder decides the architecture, so a small test checkpoint shrinks it.

OpenAI CLIP weights were trained with QuickGELU, which the network's weights do not record: the
builder for them (:func:`build_openai_clip`, ``general.clip``) always builds QuickGELU, whatever
``open_clip_config.json`` says (older snapshots of the timm ``*.openai`` repositories lack the key).

Layer taps come from one ``visual.forward_intermediates`` pass; ``final`` with ``image_embed`` pooling
is the projected image embedding (what ``encode_image`` returns); the depth taps (``depth100``
included) are tokens after the final norm (``ln_post``), pooled as ``spec.intermediate_pooling``.
"""

from __future__ import annotations

from pathlib import Path

import logging

import torch
from open_clip.model import _build_vision_tower

from crsrepro.core.errors import MissingWeightsError
from crsrepro.core.schema import FINAL
from crsrepro.encoders.registry import Encoder, EncoderSpec, depth_block_indices, pool_tokens
from crsrepro.encoders.weights import (find_weight_file, load_state_dict, load_weights_strictly, read_json,
                                       resolve_weights_folder)

logger = logging.getLogger(__name__)

HUB_WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def _n_blocks(visual) -> int:
    if hasattr(visual, "transformer"):  # open_clip's own VisionTransformer
        return len(visual.transformer.resblocks)
    return len(visual.trunk.blocks)  # a timm trunk (TimmModel)


class OpenClipEncoder(Encoder):
    """The image tower (``model.visual``) of an open_clip model."""

    def _forward_layers(self, x, layers):
        idx = depth_block_indices(_n_blocks(self.model), layers)
        blocks = sorted(set(idx.values()))
        out = self.model.forward_intermediates(x, indices=blocks, normalize_intermediates=True,
                                               output_fmt="NLC", output_extra_tokens=True,
                                               intermediates_only=FINAL not in layers)
        patches = dict(zip(blocks, out["image_intermediates"]))
        prefixes = dict(zip(blocks, out.get("image_intermediates_prefix", [None] * len(blocks))))
        pooled = {}
        for name, block in idx.items():
            pooling = self.spec.pooling_at(name)
            if pooling == "image_embed":
                pooled[name] = out["image_features"]
                continue
            prefix = prefixes[block]
            tokens = patches[block] if prefix is None else torch.cat([prefix, patches[block]], dim=1)
            pooled[name] = pool_tokens(tokens, pooling, num_prefix_tokens=0 if prefix is None else prefix.shape[1])
        return pooled


def open_clip_visual_from_state_dict(spec: EncoderSpec, state_dict: dict, *, model_cfg: dict, device,
                                     weights_path: Path, weights_files: list[Path]) -> OpenClipEncoder:
    """Build the image tower from ``model_cfg`` and load the ``visual.*`` keys of ``state_dict`` strictly."""
    quick_gelu = bool(model_cfg.get("quick_gelu", False))
    visual = _build_vision_tower(model_cfg["embed_dim"], model_cfg["vision_cfg"], quick_gelu=quick_gelu)
    visual_sd = {k[len("visual."):]: v for k, v in state_dict.items() if k.startswith("visual.")}
    load_weights_strictly(spec, visual, visual_sd, source=weights_path, what="the open_clip image tower")
    return OpenClipEncoder(spec, visual, device=device, weights_path=weights_path, weights_files=weights_files)


def build_open_clip(spec: EncoderSpec, *, weights=None, device="cpu", quick_gelu: bool | None = None
                    ) -> OpenClipEncoder:
    """Builder for ``loader="open_clip"``: a hub-layout folder (``open_clip_config.json`` + weights).

    ``quick_gelu`` overrides the config's key when given (:func:`build_openai_clip`).
    """
    folder = resolve_weights_folder(spec, weights)
    config_path = folder / "open_clip_config.json"
    model_cfg = read_json(config_path).get("model_cfg")
    if model_cfg is None:
        raise MissingWeightsError(f"{spec.id}: {config_path} is missing or has no model_cfg")
    if quick_gelu is not None:
        if model_cfg.get("quick_gelu") != quick_gelu:
            logger.info("%s: %s says quick_gelu=%s; building quick_gelu=%s, as the weights were trained",
                        spec.id, config_path, model_cfg.get("quick_gelu"), quick_gelu)
        model_cfg = {**model_cfg, "quick_gelu": quick_gelu}
    path = find_weight_file(spec, folder, HUB_WEIGHT_FILES)
    return open_clip_visual_from_state_dict(spec, load_state_dict(path), model_cfg=model_cfg, device=device,
                                            weights_path=folder, weights_files=[config_path, path])


def build_openai_clip(spec: EncoderSpec, *, weights=None, device="cpu") -> OpenClipEncoder:
    """Builder for OpenAI CLIP weights in open_clip's hub layout: always QuickGELU (see the module doc)."""
    return build_open_clip(spec, weights=weights, device=device, quick_gelu=True)
