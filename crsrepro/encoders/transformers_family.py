"""Hugging Face transformers encoders: CLIP, SigLIP and DINOv2 vision models (DESIGN.md section 4).

A checkpoint is a ``save_pretrained`` folder (``config.json`` + ``model.safetensors``), as on the hub.
A full two-tower checkpoint (``CLIPModel``, ``SiglipModel``) loads as its vision model, since the
vision config and the ``vision_model.*`` keys are read from it. Loading is offline
(``local_files_only=True``). The config in the folder decides the size, so a small test checkpoint
shrinks the architecture while the spec keeps the real one.

Layer taps come from one forward pass: a forward hook on each tapped block pools that block's output
as it goes, so only ``[B, D]`` vectors are kept, never every hidden state (MedGemma at 896 px would
keep about 0.5 GB per image). The tokens pass through the model's final norm where it has one
(SigLIP's ``post_layernorm``, DINOv2's ``layernorm``; [ours], as timm's ``norm=True``); CLIP's block
outputs are used raw, as LLaVA uses them. ``image_embed`` is SigLIP's attention-pool head output
(``pooler_output``); ``depth100`` is the last block's tokens pooled like the other depth taps.

The weights hash covers the files ``from_pretrained`` reads: ``config.json`` and ``model.safetensors``
(else ``pytorch_model.bin``, else the shards of an index), not the rest of a snapshot folder.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from transformers import CLIPVisionModel, Dinov2Model, SiglipVisionConfig, SiglipVisionModel
from transformers.utils import logging as transformers_logging

from crsrepro.core.errors import MissingWeightsError, WrongWeightsError
from crsrepro.encoders.registry import Encoder, EncoderSpec, depth_block_indices, pool_tokens
from crsrepro.encoders.weights import resolve_weights_folder

ARCHITECTURES = {"CLIPVisionModel": CLIPVisionModel, "SiglipVisionModel": SiglipVisionModel,
                 "Dinov2Model": Dinov2Model}


@contextlib.contextmanager
def without_transformers_bars():
    """transformers' own progress bars off while loading or saving a model ("Loading weights", "Writing
    model shards"): a run shows one bar per stage (:mod:`crsrepro.run.progress`), and a bar per model load
    in every worker would bury it. The previous setting is restored."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


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

    def _blocks(self) -> torch.nn.ModuleList:
        if isinstance(self.model, Dinov2Model):
            return self.model.encoder.layer
        return getattr(self.model, "vision_model", self.model).encoder.layers  # transformers 4 nests it

    def _forward_layers(self, x, layers):
        blocks = self._blocks()
        idx = depth_block_indices(len(blocks) + self.spec.feature_layer + 1, layers)
        norm = self._final_norm()
        token_taps = {name: block for name, block in idx.items() if self.spec.pooling_at(name) != "image_embed"}
        pooled = {}

        def pool_as_it_goes(block):
            def hook(module, inputs, output):
                tokens = norm(output[0] if isinstance(output, tuple) else output)
                for name, b in token_taps.items():
                    if b == block:
                        pooled[name] = pool_tokens(tokens, self.spec.pooling_at(name),
                                                   num_prefix_tokens=self._num_prefix_tokens())
            return hook

        handles = [blocks[b].register_forward_hook(pool_as_it_goes(b)) for b in sorted(set(token_taps.values()))]
        try:
            out = self.model(pixel_values=x)
        finally:
            for handle in handles:
                handle.remove()
        for name in idx:
            if name not in token_taps:
                pooled[name] = out.pooler_output
        return pooled


def hf_vision_encoder(spec: EncoderSpec, model: torch.nn.Module, *, device, weights_path, weights_files,
                      hash_parameters: bool = False) -> HFVisionEncoder:
    """Wrap a loaded transformers vision model (also used for MedGemma's SigLIP tower, in ``local``)."""
    if spec.pooling == "image_embed" and isinstance(model, SiglipVisionModel) and not model.config.vision_use_head:
        raise WrongWeightsError(f"{spec.id}: {weights_path} has no attention-pool head for image_embed pooling")
    return HFVisionEncoder(spec, model, device=device, weights_path=weights_path, weights_files=weights_files,
                           hash_parameters=hash_parameters)


def files_from_pretrained_reads(folder: Path) -> list[Path]:
    """The files ``from_pretrained(folder)`` reads: ``config.json`` and the weights, in its order of preference."""
    files = [folder / "config.json"]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return files + [folder / name]
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / name).is_file():
            shards = sorted(set(json.loads((folder / name).read_text())["weight_map"].values()))
            return files + [folder / name] + [folder / shard for shard in shards]
    raise MissingWeightsError(f"{folder}: no model.safetensors, pytorch_model.bin or shard index")


def build_transformers(spec: EncoderSpec, *, weights=None, device="cpu") -> HFVisionEncoder:
    """Builder for ``loader="transformers"``: a ``save_pretrained`` folder of ``spec.architecture``."""
    folder = resolve_weights_folder(spec, weights)
    if not (folder / "config.json").is_file():
        raise MissingWeightsError(f"{spec.id}: {folder} has no config.json (expected a save_pretrained folder "
                                  f"with {' or '.join(spec.weight_files)})")
    cls = ARCHITECTURES[spec.architecture]
    with without_transformers_bars():
        model, info = cls.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise WrongWeightsError(f"{spec.id}: {folder} does not fit {spec.architecture}: "
                                f"{len(missing)} missing keys (e.g. {missing[:3]})")
    return hf_vision_encoder(spec, model, device=device, weights_path=folder,
                             weights_files=files_from_pretrained_reads(folder))


def siglip_vision_model(vision_config: dict) -> SiglipVisionModel:
    """An uninitialised-weights SigLIP vision model from a ``vision_config`` dict (MedGemma's tower)."""
    return SiglipVisionModel(SiglipVisionConfig(**vision_config))
