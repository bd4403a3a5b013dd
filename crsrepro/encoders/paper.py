"""The paper's 15 encoders: specs and builders (DESIGN.md section 4).

General (6): ResNet-50, ViT-B/16, CLIP, SigLIP, DINOv2, MAE. Medical (4): BiomedCLIP, LLaVA-Med (vision
tower), MedSigLIP, MedGemma (vision tower). Specialist (5): PanDerm, RETFound, RAD-DINO, BioViL,
CheXzero. The paper names the models, not the checkpoints; each spec's ``hf_repo`` / ``weight_files``
names the public checkpoint we load and ``notes`` says why. Preprocessing follows each release's own
processor; pooling choices where the paper is silent are marked [ours]. BioViL and CheXzero are
excluded from APTOS 2019, as in the paper.

:data:`PAPER_ENCODERS` is a list of ``(EncoderSpec, builder)`` pairs; :mod:`crsrepro.encoders`
registers it.
"""

from __future__ import annotations

import importlib

from crsrepro.encoders.registry import HALF, IMAGENET_MEAN, IMAGENET_STD, NETWORK_TAPS, EncoderSpec

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TIMM_FILES = ("model.safetensors", "pytorch_model.bin")
OPEN_CLIP_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
HF_FILES = ("model.safetensors", "pytorch_model.bin")


def _spec(**fields) -> EncoderSpec:
    return EncoderSpec(layer_taps=NETWORK_TAPS, **fields)


def _lazy(module: str, name: str):
    """A builder that imports its family module on first use (timm, open_clip and transformers are slow
    to import, and most runs need only some of them)."""
    def builder(spec, *, weights=None, device="cpu"):
        return getattr(importlib.import_module(f"crsrepro.encoders.{module}"), name)(spec, weights=weights,
                                                                                   device=device)
    builder.__name__ = builder.__qualname__ = name
    return builder


build_timm = _lazy("timm_family", "build_timm")
build_open_clip = _lazy("open_clip_family", "build_open_clip")
build_transformers = _lazy("transformers_family", "build_transformers")
build_medgemma, build_panderm, build_retfound, build_biovil, build_chexzero = (
    _lazy("local", name) for name in ("build_medgemma", "build_panderm", "build_retfound", "build_biovil",
                                      "build_chexzero"))


PAPER_ENCODERS = [
    # ---------------------------------------------------------------- general (6)
    (_spec(id="general.resnet50", family="general", loader="timm", architecture="resnet50",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear", pooling="gap",
           embed_dim=2048, licence="BSD-3-Clause", hf_repo="timm/resnet50.tv_in1k", weight_files=TIMM_FILES,
           notes="The original torchvision ImageNet-1k weights (timm tag tv_in1k), the classic ResNet-50. "
                 "Taps are the outputs of the four stages."), build_timm),
    (_spec(id="general.vit_b16", family="general", loader="timm", architecture="vit_base_patch16_224",
           input_size=224, mean=HALF, std=HALF, interpolation="bicubic", pooling="cls", embed_dim=768,
           licence="Apache-2.0", hf_repo="timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
           weight_files=TIMM_FILES,
           notes="timm's default ViT-B/16 (ImageNet-21k, fine-tuned on 1k); [ours] the CLS token after the "
                 "final norm, as its classifier uses."), build_timm),
    (_spec(id="general.clip", family="general", loader="open_clip", architecture="ViT-B-16",
           input_size=224, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
           pooling="image_embed", intermediate_pooling="cls", embed_dim=512, licence="MIT",
           hf_repo="timm/vit_base_patch16_clip_224.openai", weight_files=OPEN_CLIP_FILES,
           notes="OpenAI CLIP ViT-B/16 in open_clip's hub layout; [ours] the projected image embedding "
                 "(the zero-shot space); intermediate taps use the CLS token after ln_post."), build_open_clip),
    (_spec(id="general.siglip", family="general", loader="transformers", architecture="SiglipVisionModel",
           input_size=224, mean=HALF, std=HALF, interpolation="bicubic", pooling="image_embed",
           intermediate_pooling="mean_patch", embed_dim=768, licence="Apache-2.0",
           hf_repo="google/siglip-base-patch16-224", weight_files=HF_FILES,
           notes="SigLIP ViT-B/16 at 224; [ours] the attention-pool head output (SigLIP has no CLS token); "
                 "intermediate taps are the mean of the normed patch tokens."), build_transformers),
    (_spec(id="general.dinov2", family="general", loader="transformers", architecture="Dinov2Model",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic", pooling="cls",
           embed_dim=768, licence="Apache-2.0", hf_repo="facebook/dinov2-base", weight_files=HF_FILES,
           notes="DINOv2 ViT-B/14 at its processor's 224 crop; [ours] the normed CLS token "
                 "(DINOv2's linear probe also concatenates the patch mean; we keep one vector)."),
     build_transformers),
    (_spec(id="general.mae", family="general", loader="timm", architecture="vit_base_patch16_224",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic",
           pooling="mean_patch", embed_dim=768, licence="CC-BY-NC-4.0", hf_repo="timm/vit_base_patch16_224.mae",
           weight_files=TIMM_FILES,
           notes="MAE-pretrained ViT-B/16 (no fine-tuning); [ours] the mean of the normed patch tokens, "
                 "since MAE's CLS token is not trained by its objective."), build_timm),
    # ---------------------------------------------------------------- medical (4)
    (_spec(id="medical.biomedclip", family="medical", loader="open_clip",
           architecture="ViT-B-16 (timm trunk), PubMedBERT_256", input_size=224, mean=OPENAI_CLIP_MEAN,
           std=OPENAI_CLIP_STD, interpolation="bicubic", pooling="image_embed", intermediate_pooling="cls",
           embed_dim=512, licence="MIT", hf_repo="microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224",
           weight_files=OPEN_CLIP_FILES,
           notes="Only the image tower is built, so the PubMedBERT text config is never fetched; [ours] the "
                 "projected image embedding."), build_open_clip),
    (_spec(id="medical.llava_med", family="medical", loader="transformers", architecture="CLIPVisionModel",
           input_size=336, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
           pooling="mean_patch", embed_dim=1024, feature_layer=-2,
           licence="MIT (CLIP weights); LLaVA-Med is research-only",
           hf_repo="openai/clip-vit-large-patch14-336", weight_files=HF_FILES,
           notes="LLaVA-Med v1.5 (microsoft/llava-med-v1.5-mistral-7b) keeps its vision tower frozen: its "
                 "config names openai/clip-vit-large-patch14-336 and the release holds no tower weights, so the "
                 "tower is exactly that CLIP ViT-L/14-336. Like LLaVA (mm_vision_select_layer=-2, patch "
                 "features), 'final' is the penultimate block's patch tokens; [ours] their mean."),
     build_transformers),
    (_spec(id="medical.medsiglip", family="medical", loader="transformers", architecture="SiglipVisionModel",
           input_size=448, mean=HALF, std=HALF, interpolation="bicubic", pooling="image_embed",
           intermediate_pooling="mean_patch", embed_dim=1152,
           licence="Health AI Developer Foundations terms of use", hf_repo="google/medsiglip-448",
           weight_files=HF_FILES,
           notes="MedSigLIP-448 (SigLIP So400m); the vision model is read from the two-tower checkpoint; "
                 "[ours] the attention-pool head output."), build_transformers),
    (_spec(id="medical.medgemma", family="medical", loader="local", architecture="gemma3-siglip-vision-tower",
           input_size=896, mean=HALF, std=HALF, interpolation="bilinear", pooling="mean_patch",
           embed_dim=1152, licence="Health AI Developer Foundations terms of use",
           hf_repo="google/medgemma-4b-it", weight_files=("model.safetensors.index.json", "model.safetensors"),
           notes="MedGemma 4B's SigLIP tower (vision_use_head=False), read from the Gemma3 checkpoint's "
                 "vision_tower.vision_model.* tensors without loading the language model; [ours] the mean of "
                 "the normed patch tokens (Gemma3 itself average-pools them to 256 tokens)."), build_medgemma),
    # ---------------------------------------------------------------- specialist (5)
    (_spec(id="specialist.panderm", family="specialist", loader="local", architecture="beit_large_patch16_224",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic",
           pooling="mean_patch", embed_dim=1024, licence="research use (see the PanDerm release)",
           weight_files=("panderm_ll_data6_checkpoint-499.pth",),
           notes="PanDerm ViT-L/16 (CAE pretraining, dermatology); its linear-probe code strips 'encoder.' "
                 "and uses mean pooling; the key layout was checked against that code, not the released file "
                 "(no weights here)."), build_panderm),
    (_spec(id="specialist.retfound", family="specialist", loader="local", architecture="vit_large_patch16_224",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic",
           pooling="mean_patch", embed_dim=1024, licence="CC-BY-NC-4.0", hf_repo="YukunZhou/RETFound_mae_natureCFP",
           weight_files=("RETFound_cfp_weights.pth", "RETFound_mae_natureCFP.pth"),
           notes="RETFound-MAE for colour fundus photographs; RETFound fine-tunes with global pooling, so "
                 "[ours] the mean of the normed patch tokens."), build_retfound),
    (_spec(id="specialist.rad_dino", family="specialist", loader="transformers", architecture="Dinov2Model",
           input_size=518, mean=(0.5307, 0.5307, 0.5307), std=(0.2583, 0.2583, 0.2583),
           interpolation="bicubic", pooling="cls", embed_dim=768, licence="MSRLA",
           hf_repo="microsoft/rad-dino", weight_files=HF_FILES,
           notes="RAD-DINO (DINOv2 ViT-B/14 on chest X-rays) at its processor's 518 crop and its own "
                 "mean/std; the CLS token, as its model card uses."), build_transformers),
    (_spec(id="specialist.biovil", family="specialist", loader="local", architecture="resnet50",
           input_size=480, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), interpolation="bilinear",
           pooling="gap", embed_dim=2048, licence="MIT", excluded_datasets=("aptos2019",),
           hf_repo="microsoft/BiomedVLP-CXR-BERT-specialized",
           weight_files=("biovil_image_resnet50_proj_size_128.pt",),
           notes="BioViL's ResNet-50 from hi-ml (inference: 480 crop, no normalisation); [ours] the 2048-d "
                 "pooled output, not the 128-d projection trained for text matching."), build_biovil),
    (_spec(id="specialist.chexzero", family="specialist", loader="local", architecture="openai-clip-ViT-B-32",
           input_size=224, mean=(101.48761 / 255,) * 3, std=(83.43944 / 255,) * 3, interpolation="bicubic",
           pooling="image_embed", intermediate_pooling="cls", embed_dim=512, licence="MIT",
           excluded_datasets=("aptos2019",), weight_files=("best_64_5e-05_original_22000_0.864.pt",),
           notes="CheXzero's best released checkpoint (OpenAI CLIP ViT-B/32 fine-tuned on MIMIC-CXR reports) "
                 "with its own normalisation; [ours] the projected image embedding."), build_chexzero),
]
