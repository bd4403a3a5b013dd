"""Hugging Face transformers encoders: CLIP, SigLIP and DINOv2 vision models (DESIGN.md section 4).

A checkpoint is a ``save_pretrained`` folder (``config.json`` + ``model.safetensors``), as on the hub.
A full two-tower checkpoint (``CLIPModel``, ``SiglipModel``) loads as its vision model, since the
vision config and the ``vision_model.*`` keys are read from it. Loading is offline
(``local_files_only=True``). The config in the folder decides the size, so a small test checkpoint
shrinks the architecture while the spec keeps the real one.

Layer taps come from the ``hidden_states`` of one forward pass (block ``i`` is ``hidden_states[i + 1]``).
The tokens pass through the model's final norm where it has one (SigLIP's ``post_layernorm``,
DINOv2's ``layernorm``; [ours], as timm's ``norm=True``); CLIP's hidden states are used raw, as LLaVA
uses them. ``image_embed`` is SigLIP's attention-pool head output (``pooler_output``).
"""

from __future__ import annotations

import torch
from transformers import CLIPVisionModel, Dinov2Model, SiglipVisionConfig, SiglipVisionModel

from crsrepro.encoders.registry import (Encoder, EncoderSpec, depth_block_indices, pool_tokens,
                                       resolve_weights_folder)
from crsrepro.errors import MissingWeightsError

ARCHITECTURES = {"CLIPVisionModel": CLIPVisionModel, "SiglipVisionModel": SiglipVisionModel,
                 "Dinov2Model": Dinov2Model}


class HFVisionEncoder(Encoder):
    """A transformers vision model; taps from ``hidden_states``."""

    def _final_norm(self):
        if isinstance(self.model, SiglipVisionModel):
            return getattr(self.model, "vision_model", self.model).post_layernorm
        if isinstance(self.model, Dinov2Model):
            return self.model.layernorm
        return torch.nn.Identity()

    def _num_prefix_tokens(self) -> int:
        if isinstance(self.model, SiglipVisionModel):
            return 0
        return 1 + int(getattr(self.model.config, "num_register_tokens", 0) or 0)

    def _forward_layers(self, x, layers):
        out = self.model(pixel_values=x, output_hidden_states=True)
        n_blocks = len(out.hidden_states) - 1 + self.spec.feature_layer + 1
        idx = depth_block_indices(n_blocks, layers)
        norm = self._final_norm()
        pooled = {}
        for name, block in idx.items():
            pooling = self.spec.pooling_at(name)
            if pooling == "image_embed":
                pooled[name] = out.pooler_output
            else:
                tokens = norm(out.hidden_states[block + 1])
                pooled[name] = pool_tokens(tokens, pooling, num_prefix_tokens=self._num_prefix_tokens())
        return pooled


def hf_vision_encoder(spec: EncoderSpec, model: torch.nn.Module, *, device, weights_path) -> HFVisionEncoder:
    """Wrap a loaded transformers vision model (also used for MedGemma's SigLIP tower, in ``local``)."""
    if spec.pooling == "image_embed" and isinstance(model, SiglipVisionModel) and not model.config.vision_use_head:
        raise MissingWeightsError(f"{spec.id}: {weights_path} has no attention-pool head for image_embed pooling")
    return HFVisionEncoder(spec, model, device=device, weights_path=weights_path)


def build_transformers(spec: EncoderSpec, *, weights=None, device="cpu") -> HFVisionEncoder:
    """Builder for ``loader="transformers"``: a ``save_pretrained`` folder of ``spec.architecture``."""
    folder = resolve_weights_folder(spec, weights)
    if not (folder / "config.json").is_file():
        raise MissingWeightsError(f"{spec.id}: {folder} has no config.json (expected a save_pretrained folder "
                                  f"with {' or '.join(spec.weight_files)})")
    cls = ARCHITECTURES[spec.architecture]
    model, info = cls.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise MissingWeightsError(f"{spec.id}: {folder} does not fit {spec.architecture}: "
                                  f"{len(missing)} missing keys (e.g. {missing[:3]})")
    return hf_vision_encoder(spec, model, device=device, weights_path=folder)


def siglip_vision_model(vision_config: dict) -> SiglipVisionModel:
    """An uninitialised-weights SigLIP vision model from a ``vision_config`` dict (MedGemma's tower)."""
    return SiglipVisionModel(SiglipVisionConfig(**vision_config))
