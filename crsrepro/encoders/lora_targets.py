"""Which modules LoRA adapts in each encoder (DESIGN.md section 11; issue 25).

:data:`TARGETS` maps an encoder id to one regular expression, full-matched against the module names of
the built network (``encoder.model.named_modules()``); :func:`target_modules` returns the matching names,
which :mod:`crsrepro.run.lora` hands to peft as an explicit list. The paper says only that the adapters go
on "the attention projections of transformers and the Conv2d layers of ResNet-type encoders"; the module
each pattern names is the one that really computes in the release's own module tree, because a module
whose weight the forward reads directly (``F.linear(x, self.qkv.weight)``, ``nn.MultiheadAttention``'s
``out_proj``) never calls the adapter peft wraps around it, and such an adapter trains nothing.

Per architecture, and why:

- **timm ViT** (ViT-B/16, MAE, RETFound; BiomedCLIP's ``trunk.``): ``blocks.N.attn.qkv`` and
  ``blocks.N.attn.proj``, the fused q/k/v and the output projection (timm's ``Attention`` calls both).
- **timm BEiT** (PanDerm): the same two. BEiT with q/v biases computes ``F.linear(x, self.qkv.weight,
  bias)`` and never calls ``self.qkv``; the PanDerm builder sets ``attn.qkv_bias_separate = True``
  (:func:`crsrepro.encoders.local.build_panderm`), which calls ``self.qkv(x)`` and adds the same bias
  (the output differs by float rounding only).
- **open_clip ViT** (CLIP, CheXzero): [ours] ``transformer.resblocks.N.mlp.c_fc`` and ``mlp.c_proj``, the
  block's MLP. Its attention is ``nn.MultiheadAttention``, which passes ``in_proj_weight`` (a parameter)
  and ``out_proj.weight`` to ``F.multi_head_attention_forward``: an adapter on ``attn.out_proj`` gets no
  gradient. peft's own ``MultiheadAttention`` LoRA (target ``attn``) does train, but it merges the
  adapters into the frozen weights before every forward and subtracts them after, which changes the
  frozen base by float rounding (measured: 3e-8 after three steps), so the base is no longer unchanged
  bit for bit. The MLP is the one place in these blocks where plain ``nn.Linear`` modules compute.
- **transformers SigLIP** (SigLIP, MedSigLIP) and **MedGemma's SigLIP tower**: ``encoder.layers.N.
  self_attn.{q,k,v,out}_proj``, anchored at ``encoder.layers`` so that the attention-pool head's
  ``head.attention.out_proj`` (an ``nn.MultiheadAttention`` projection that never runs as a module) is
  not matched, as a bare suffix ``out_proj`` would.
- **transformers CLIP** (LLaVA-Med's tower): the same four projections, in the blocks ``final`` reads.
  LLaVA-Med's feature is the penultimate block's output (``spec.feature_layer = -2``), so the last
  block's adapters would get no gradient; :func:`target_modules` leaves out every block after the one
  the feature comes from.
- **transformers DINOv2** (DINOv2, RAD-DINO): ``encoder.layer.N.attention.{q,k,v,o}_proj`` (transformers
  5), or ``attention.attention.{query,key,value}`` and ``attention.output.dense`` (the transformers 4
  names of the same four projections); the pattern accepts both.
- **timm ResNet** (ResNet-50, BioViL): the three convolutions of every bottleneck block,
  ``layerS.N.conv{1,2,3}`` (the paper's "Conv2d layers"; [ours] the stem convolution and the 1x1
  ``downsample`` shortcuts are left out, as for the demo's CNNs).
- **The demo's networks**: :data:`crsrepro.encoders.demo.LORA_TARGETS` (module-name suffixes), read as
  the same kind of pattern.

Transformers with a ``transformers`` 4.x prefix (``vision_model.``) are matched with or without it. The
patterns were checked, by an adapter-gradient test per architecture (``tests/test_lora_targets.py``), on
the library versions in :data:`CHECKED_ON`; a pattern that matches nothing in a build is an error at
:func:`crsrepro.run.lora.lora_targets`, never an empty adapter set.
"""

from __future__ import annotations

import re

from crsrepro.encoders.demo import LORA_TARGETS as DEMO_SUFFIXES

#: The library versions the patterns were checked on (tests/test_lora_targets.py).
CHECKED_ON = {"timm": "1.0.31", "open_clip_torch": "3.3.0", "transformers": "5.24.0", "peft": "0.21.2"}

#: A named group ``block`` in a pattern is the transformer block's index (:func:`target_modules` keeps
#: only the blocks the ``final`` feature reads).
TIMM_VIT = r"blocks\.(?P<block>\d+)\.attn\.(qkv|proj)"
BIOMEDCLIP = r"trunk\." + TIMM_VIT
OPEN_CLIP_VIT = r"transformer\.resblocks\.(?P<block>\d+)\.mlp\.(c_fc|c_proj)"
HF_SIGLIP_CLIP = r"(vision_model\.)?encoder\.layers\.(?P<block>\d+)\.self_attn\.(q|k|v|out)_proj"
HF_DINOV2 = (r"encoder\.layer\.(?P<block>\d+)\.attention\."
             r"(q_proj|k_proj|v_proj|o_proj|attention\.(query|key|value)|output\.dense)")
TIMM_RESNET = r"layer[1-4]\.\d+\.conv[123]"


def _suffixes(names) -> str:
    """peft's suffix rule (a module's name is a suffix, or ends with ``.suffix``) as one pattern."""
    return r"(.*\.)?(" + "|".join(re.escape(n) for n in names) + r")"


#: Encoder id -> the regular expression full-matched against its module names.
TARGETS: dict[str, str] = {
    "general.resnet50": TIMM_RESNET,
    "general.vit_b16": TIMM_VIT,
    "general.clip": OPEN_CLIP_VIT,
    "general.siglip": HF_SIGLIP_CLIP,
    "general.dinov2": HF_DINOV2,
    "general.mae": TIMM_VIT,
    "medical.biomedclip": BIOMEDCLIP,
    "medical.llava_med": HF_SIGLIP_CLIP,
    "medical.medsiglip": HF_SIGLIP_CLIP,
    "medical.medgemma": HF_SIGLIP_CLIP,
    "specialist.panderm": TIMM_VIT,
    "specialist.retfound": TIMM_VIT,
    "specialist.rad_dino": HF_DINOV2,
    "specialist.biovil": TIMM_RESNET,
    "specialist.chexzero": OPEN_CLIP_VIT,
    **{encoder_id: _suffixes(names) for encoder_id, names in DEMO_SUFFIXES.items()},
}


def target_modules(encoder) -> list[str]:
    """The names of the modules LoRA adapts in ``encoder.model``, in module order; empty when no pattern
    is declared for the encoder or the pattern matches nothing (:func:`crsrepro.run.lora.lora_targets`
    turns both into an error).

    Where the pattern names a block index, the blocks after the one ``final`` reads
    (``spec.feature_layer``, -1 for the last) are left out: their adapters could get no gradient.
    """
    pattern = TARGETS.get(encoder.spec.id)
    if pattern is None:
        return []
    compiled = re.compile(pattern)
    matches = [(name, compiled.fullmatch(name)) for name, _ in encoder.model.named_modules()]
    matches = [(name, m) for name, m in matches if m is not None]
    if "block" not in compiled.groupindex or not matches:
        return [name for name, _ in matches]
    last = max(int(m["block"]) for _, m in matches) + 1 + encoder.spec.feature_layer
    return [name for name, m in matches if int(m["block"]) <= last]


__all__ = ["CHECKED_ON", "TARGETS", "target_modules"]
