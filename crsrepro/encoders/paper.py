"""The paper's 15 encoders: specs and builders (DESIGN.md section 4).

General (6): ResNet-50, ViT-B/16, CLIP, SigLIP, DINOv2, MAE. Medical (4): BiomedCLIP, LLaVA-Med (vision
tower), MedSigLIP, MedGemma (vision tower). Specialist (5): PanDerm, RETFound, RAD-DINO, BioViL,
CheXzero. The paper names the models, not the checkpoints; each spec's ``hf_repo`` / ``hf_revision`` /
``weight_files`` names the public checkpoint we load, and ``notes`` says what the release does and,
marked [ours], where we differ and why. Input size, mean/std, interpolation and the resize mode (crop,
or pad to a square where the release pads) follow each release's own processor; the crop fraction
(1.0) and pooling choices where the paper is silent are [ours]. ``n_params`` is the parameter count of
the image network as built from the real checkpoint (``crsrepro check-weights`` compares against it).
:data:`PAPER_RELEASES` says, per encoder, where its checkpoint is published (the release's own
instructions), on which terms, and how its revision was pinned. The book's chapter "Encoders as released" (``book/encoders_as_released.md``) tabulates all of this.
BioViL and CheXzero are excluded from APTOS 2019, as in the paper.

:data:`PAPER_ENCODERS` is a list of ``(EncoderSpec, builder)`` pairs; :mod:`crsrepro.encoders`
registers it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from crsrepro.encoders.registry import HALF, IMAGENET_MEAN, IMAGENET_STD, PAPER_TAPS, EncoderSpec

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TIMM_FILES = ("model.safetensors", "pytorch_model.bin")
OPEN_CLIP_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
HF_FILES = ("model.safetensors", "pytorch_model.bin")
LLAVA_PAD = tuple(int(v * 255) for v in OPENAI_CLIP_MEAN)  # LLaVA's expand2square background: (122, 116, 104)
LLAVA_GREY = int(255 * sum(OPENAI_CLIP_MEAN) / 3)  # ... and for an 'L' image (llava/mm_utils.py): 114
UNVERIFIED_MAIN = "main"
"""The ``hf_revision`` of a hub encoder for which no commit could be checked: it follows the branch, and
``crsrepro check-weights`` reports it as unverified (:data:`PAPER_RELEASES`)."""


def _spec(**fields) -> EncoderSpec:
    return EncoderSpec(layer_taps=PAPER_TAPS, **fields)


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
build_openai_clip = _lazy("open_clip_family", "build_openai_clip")
build_transformers = _lazy("transformers_family", "build_transformers")
build_medgemma, build_panderm, build_retfound, build_biovil, build_chexzero = (
    _lazy("local", name) for name in ("build_medgemma", "build_panderm", "build_retfound", "build_biovil",
                                      "build_chexzero"))


PAPER_ENCODERS = [
    # ---------------------------------------------------------------- general (6)
    (_spec(id="general.resnet50", family="general", loader="timm", architecture="resnet50",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear", pooling="gap",
           embed_dim=2048, n_params=23_508_032, licence="BSD-3-Clause", hf_repo="timm/resnet50.tv_in1k",
           hf_revision="78f3ecfdb38e06d9b8397f662e7ab8fee96026fa",
           weight_files=TIMM_FILES,
           notes="Release: the original torchvision ImageNet-1k weights (timm tag tv_in1k), resize 256 "
                 "bilinear, crop 224; its file carries the fc.* classifier, which we drop. The embedding is "
                 "the global-average-pooled layer4, as its classifier uses. Taps are the four stages. "
                 "[ours] crop fraction 1.0."), build_timm),
    (_spec(id="general.vit_b16", family="general", loader="timm", architecture="vit_base_patch16_224",
           input_size=224, mean=HALF, std=HALF, interpolation="bicubic", pooling="cls", embed_dim=768,
           n_params=85_798_656, licence="Apache-2.0", hf_repo="timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
           hf_revision="063c6c38a5d8510b2e57df480445e94b231dad2c",
           weight_files=TIMM_FILES,
           notes="Release: timm's default ViT-B/16 (ImageNet-21k, fine-tuned on 1k), crop_pct 0.9 bicubic; its "
                 "file carries head.*, which we drop. The CLS token after the final norm, as its classifier "
                 "uses. [ours] crop fraction 1.0."), build_timm),
    (_spec(id="general.clip", family="general", loader="open_clip", architecture="ViT-B-16",
           input_size=224, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
           pooling="image_embed", intermediate_pooling="cls", embed_dim=512, n_params=86_192_640,
           licence="MIT (OpenAI); HF card apache-2.0", hf_repo="timm/vit_base_patch16_clip_224.openai",
           hf_revision="977e3dd0ec55ab8da155f2fbeb6b5f54948b6e3d",
           weight_files=OPEN_CLIP_FILES,
           notes="Release: OpenAI CLIP ViT-B/16 in open_clip's hub layout, trained with QuickGELU (built so "
                 "whatever the config says); resize 224 bicubic, crop 224. 'final' is the projected image "
                 "embedding (encode_image, the zero-shot space); the depth taps, depth100 included, are the "
                 "CLS token after ln_post. [ours] crop fraction 1.0."), build_openai_clip),
    (_spec(id="general.siglip", family="general", loader="transformers", architecture="SiglipVisionModel",
           input_size=224, mean=HALF, std=HALF, interpolation="bicubic", pooling="image_embed",
           intermediate_pooling="mean_patch", embed_dim=768, n_params=92_884_224, licence="Apache-2.0",
           hf_repo="google/siglip-base-patch16-224",
           hf_revision="7fd15f0689c79d79e38b1c2e2e2370a7bf2761ed", weight_files=HF_FILES,
           notes="Release: SigLIP ViT-B/16; its processor squashes the image to 224x224 (no crop). 'final' is "
                 "the attention-pool head output (pooler_output; SigLIP has no CLS token); the depth taps, "
                 "depth100 included, are the mean of the post-layernorm patch tokens. [ours] a crop of the "
                 "short side instead of the squash, so that the aspect ratio is kept."), build_transformers),
    (_spec(id="general.dinov2", family="general", loader="transformers", architecture="Dinov2Model",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic", pooling="cls",
           embed_dim=768, n_params=86_580_480, licence="Apache-2.0", hf_repo="facebook/dinov2-base",
           hf_revision="f9e44c814b77203eaa57a6bdbbd535f21ede1415",
           weight_files=HF_FILES,
           notes="Release: DINOv2 ViT-B/14; its processor resizes to 256 bicubic and crops 224. The normed CLS "
                 "token (pooler_output). [ours] one vector: DINOv2's own linear probe also concatenates the "
                 "patch mean; crop fraction 1.0."), build_transformers),
    (_spec(id="general.mae", family="general", loader="timm", architecture="vit_base_patch16_224",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic",
           pooling="mean_patch", embed_dim=768, n_params=85_798_656, licence="CC-BY-NC-4.0",
           hf_repo="timm/vit_base_patch16_224.mae", hf_revision=UNVERIFIED_MAIN, weight_files=TIMM_FILES,
           notes="Release: MAE-pretrained ViT-B/16 (no fine-tuning). MAE's own linear probe "
                 "(main_linprobe.py, global_pool=False) uses the CLS token. [ours] the mean of the normed "
                 "patch tokens instead, the pooling MAE fine-tunes with, and the same as RETFound's here; "
                 "crop fraction 1.0."), build_timm),
    # ---------------------------------------------------------------- medical (4)
    (_spec(id="medical.biomedclip", family="medical", loader="open_clip",
           architecture="ViT-B-16 (timm trunk), PubMedBERT_256", input_size=224, mean=OPENAI_CLIP_MEAN,
           std=OPENAI_CLIP_STD, interpolation="bicubic", pooling="image_embed", intermediate_pooling="cls",
           embed_dim=512, n_params=86_191_872, licence="MIT",
           hf_repo="microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224",
           hf_revision="9f341de24bfb00180f1b847274256e9b65a3a32e", weight_files=OPEN_CLIP_FILES,
           notes="Release: open_clip config with a timm vit_base_patch16_224 trunk (nn.GELU, as timm trains "
                 "it) and a linear projection; OpenAI mean/std, bicubic, crop 224. Only the image tower is "
                 "built, so the PubMedBERT text config is never fetched. 'final' is encode_image's projected "
                 "embedding; the depth taps, depth100 included, are the CLS token after the trunk's norm. "
                 "[ours] crop fraction 1.0."), build_open_clip),
    (_spec(id="medical.llava_med", family="medical", loader="transformers", architecture="CLIPVisionModel",
           input_size=336, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, interpolation="bicubic",
           resize_mode="pad", pad_fill=LLAVA_PAD, pad_fill_grey=LLAVA_GREY, pooling="mean_patch", embed_dim=1024, feature_layer=-2,
           n_params=303_507_456, licence="MIT (CLIP weights); LLaVA-Med is research-only",
           hf_repo="openai/clip-vit-large-patch14-336",
           hf_revision="ce19dc912ca5cd21c8a653c79e251e808ccabcd1", weight_files=HF_FILES,
           notes="Release: LLaVA-Med v1.5 (microsoft/llava-med-v1.5-mistral-7b) keeps its vision tower "
                 "frozen and loads it from mm_vision_tower = openai/clip-vit-large-patch14-336, so the tower "
                 "is exactly that CLIP ViT-L/14-336. Like LLaVA (image_aspect_ratio=pad: the image is padded "
                 "to a square with the mean colour, then resized to 336; mm_vision_select_layer=-2, patch "
                 "features), 'final' is the penultimate block's patch tokens, raw. [ours] their mean (LLaVA "
                 "feeds all 576 tokens to its projector)."), build_transformers),
    (_spec(id="medical.medsiglip", family="medical", loader="transformers", architecture="SiglipVisionModel",
           input_size=448, mean=HALF, std=HALF, interpolation="bicubic", resize_mode="pad", pad_fill=(0, 0, 0),
           pooling="image_embed", intermediate_pooling="mean_patch", embed_dim=1152, n_params=428_565_440,
           licence="Health AI Developer Foundations terms of use", hf_repo="google/medsiglip-448",
           hf_revision="9cea28a1a1195f665105faa6e8544c112fd960a4",
           weight_files=HF_FILES,
           notes="Release: MedSigLIP-448 (SigLIP So400m); its serving code zero-pads the image to a square, "
                 "then resizes to 448 (bicubic), and returns image_embeds, the attention-pool head output "
                 "(L2-normalised there). The vision model is read from the two-tower checkpoint. 'final' is "
                 "the head output, not L2-normalised [ours: the probes standardise features]; the depth taps, "
                 "depth100 included, are the mean of the post-layernorm patch tokens."), build_transformers),
    (_spec(id="medical.medgemma", family="medical", loader="local", architecture="gemma3-siglip-vision-tower",
           input_size=896, mean=HALF, std=HALF, interpolation="bilinear", pooling="mean_patch",
           embed_dim=1152, n_params=416_866_032, licence="Health AI Developer Foundations terms of use",
           hf_repo="google/medgemma-4b-it",
           hf_revision="290cda5eeccbee130f987c4ad74a59ae6f196408", weight_files=("model.safetensors.index.json", "model.safetensors"),
           notes="Release: MedGemma 4B's SigLIP tower (vision_use_head=False) at 896 (Gemma3's processor "
                 "squashes to 896x896, bilinear), read from the Gemma3 checkpoint's vision_tower.vision_model.* "
                 "tensors without loading the language model. Gemma3 average-pools the post-layernorm tokens "
                 "to 256 and projects them; the mean of those 256 equals the mean of all patch tokens, which "
                 "is 'final' [ours: one vector, before the projector]. [ours] a crop of the short side instead "
                 "of the squash."), build_medgemma),
    # ---------------------------------------------------------------- specialist (5)
    (_spec(id="specialist.panderm", family="specialist", loader="local", architecture="beit_large_patch16_224",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear", pooling="cls",
           embed_dim=1024, n_params=303_326_208, licence="CC-BY-NC-ND-4.0",
           weight_files=("panderm_ll_data6_checkpoint-499.pth",),
           notes="Release: PanDerm ViT-L/16 (CAE pretraining on dermatology images), a flat state dict with "
                 "encoder.* keys (plus teacher.* and decoder.*, not read); older copies wrap it as "
                 "{'model': ...}. Its linear-probe model PanDerm_Large_LP returns norm(x)[:, 0], the normed "
                 "CLS token, which is 'final' here; its transform is Resize(256) (bilinear) and CenterCrop(224) "
                 "with ImageNet mean/std (its std[0] 0.228 is a typo for 0.229). [ours] crop fraction 1.0."),
     build_panderm),
    (_spec(id="specialist.retfound", family="specialist", loader="local", architecture="vit_large_patch16_224",
           input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic",
           pooling="mean_patch", embed_dim=1024, n_params=303_301_632, licence="CC-BY-NC-4.0",
           hf_repo="YukunZhou/RETFound_mae_natureCFP",
           hf_revision="556830f78214f0e8da35af965292ac5a3180ac47",
           weight_files=("RETFound_cfp_weights.pth", "RETFound_mae_natureCFP.pth"),
           notes="Release: RETFound-MAE for colour fundus photographs, {'model': MAE encoder + decoder, "
                 "'args': Namespace, ...} (the decoder is dropped, args allowed and not read); resize 256 "
                 "bicubic, crop 224. Its official latent feature (global_pool=True) is the mean of the "
                 "pre-norm patch tokens followed by a freshly initialised LayerNorm (fc_norm), dropping the "
                 "trained norm. [ours] the mean of the patch tokens after the trained norm, as for MAE, so "
                 "no untrained layer enters; crop fraction 1.0."), build_retfound),
    (_spec(id="specialist.rad_dino", family="specialist", loader="transformers", architecture="Dinov2Model",
           input_size=518, mean=(0.5307, 0.5307, 0.5307), std=(0.2583, 0.2583, 0.2583),
           interpolation="bicubic", pooling="cls", embed_dim=768, n_params=86_580_480, licence="MIT",
           hf_repo="microsoft/rad-dino",
           hf_revision="110cbc18d5133582e320b43d53bf5c44e410c936", weight_files=HF_FILES,
           notes="Release: RAD-DINO (DINOv2 ViT-B/14 on chest X-rays). Its licence depends on the revision "
                 "(stored model cards: MIT at some revisions, MSRLA at others); the pinned revision is recorded "
                 "as MIT (PAPER_RELEASES says how it was chosen). Its processor resizes to 518 bicubic and "
                 "crops 518 with its own mean/std; the CLS token, as its model card uses. Only config.json "
                 "and model.safetensors are read (the repository also holds backbone_compatible.safetensors, "
                 "dino_head.safetensors and a csv)."), build_transformers),
    (_spec(id="specialist.biovil", family="specialist", loader="local", architecture="resnet50",
           input_size=480, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), interpolation="bilinear",
           pooling="gap", embed_dim=2048, n_params=23_508_032, licence="MIT", excluded_datasets=("aptos2019",),
           intensity_remap="minmax",
           hf_repo="microsoft/BiomedVLP-CXR-BERT-specialized", hf_revision="v1.1",
           weight_files=("biovil_image_resnet50_proj_size_128.pt",), weight_md5="02ce6ee460f72efd599295f440dbb453",
           notes="Release: BioViL's ResNet-50 from hi-ml, which downloads it from revision v1.1 and checks its "
                 "MD5 (both pinned here); a flat ImageModel state dict, encoder.encoder.* (torchvision "
                 "ResNet-50 with fc.*, dropped) plus projector.*; inference resizes to 512 and crops 480, no "
                 "normalisation. 'final' is img_embedding, the 2048-d pooled output; the 128-d projection is "
                 "trained for text matching and not used. [ours] crop fraction 1.0."), build_biovil),
    (_spec(id="specialist.chexzero", family="specialist", loader="local", architecture="openai-clip-ViT-B-32",
           input_size=224, mean=(101.48761 / 255,) * 3, std=(83.43944 / 255,) * 3, interpolation="bicubic",
           resize_mode="pad", pad_fill=(0, 0, 0), pooling="image_embed", intermediate_pooling="cls",
           embed_dim=512, n_params=87_849_216,
           licence="code MIT; weights unlicensed, trained on MIMIC-CXR (PhysioNet DUA)",
           excluded_datasets=("aptos2019",), weight_files=("best_64_5e-05_original_22000_0.864.pt",),
           notes="Release: CheXzero's best checkpoint (OpenAI CLIP ViT-B/32, QuickGELU, fine-tuned on "
                 "MIMIC-CXR reports), a state dict of the OpenAI CLIP model; its data step letterboxes each "
                 "image onto a black 320x320 square, then resizes to 224 bicubic, with its own mean/std. "
                 "'final' is encode_image's projected embedding; the depth taps, depth100 included, are the "
                 "CLS token after ln_post. [ours] the pad goes straight to 224, without the 320-pixel "
                 "intermediate image."), build_chexzero),
]


# ---------------------------------------------------------------------------------------------------
# Where each checkpoint is published, and how its revision was pinned
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Release:
    """Where a paper encoder's checkpoint is published and how ``hf_revision`` was chosen.

    Attributes
    ----------
    source : str
        Where to get the files, from the release's own instructions (a hub repository, or the authors'
        Google Drive link as their README publishes it).
    access : str
        Public, or gated and on which terms.
    pin : str
        How the pinned revision was chosen, and what was checked. None of the commits was read from the
        Hugging Face hub by this package (it cannot reach it): each was found, in full, in public code
        and notes that pin or cache that repository (the files they name are given), and its licence
        is the model card's.
    verified : bool
        False when no commit could be found: ``hf_revision`` is then :data:`UNVERIFIED_MAIN`.
    """

    source: str
    access: str
    pin: str
    verified: bool = True


def _hub(repo: str) -> str:
    return f"https://huggingface.co/{repo}"


_SEEN = "full commit found in public code that pins or caches this repository"
PAPER_RELEASES: dict[str, Release] = {
    "general.resnet50": Release(
        _hub("timm/resnet50.tv_in1k") + " (timm: create_model('resnet50.tv_in1k', pretrained=True))", "public",
        f"{_SEEN} (with pytorch_model.bin, 102,469,840 bytes); BSD-3-Clause (torchvision weights)"),
    "general.vit_b16": Release(
        _hub("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"), "public",
        f"{_SEEN} (several projects; model.safetensors SHA-256 32aa17d6e17b43500f531d5f6dc9bc93e56ed8841b8a75682e1bb"
        "295d722405b); Apache-2.0"),
    "general.clip": Release(
        _hub("timm/vit_base_patch16_clip_224.openai") + " (open_clip's hf_hub entry for ViT-B-16 'openai')", "public",
        f"{_SEEN} (open_clip_model.safetensors SHA-256 4b8699299b1e8997753c64b052ba32031449d5d853f55a039148560ee02b"
        "820f; open_clip_pytorch_model.bin); MIT (OpenAI CLIP)"),
    "general.siglip": Release(
        _hub("google/siglip-base-patch16-224"), "public", f"{_SEEN} (snapshot_download pins); Apache-2.0"),
    "general.dinov2": Release(
        _hub("facebook/dinov2-base"), "public", f"{_SEEN} (many projects, licence recorded as apache-2.0)"),
    "general.mae": Release(
        _hub("timm/vit_base_patch16_224.mae"), "public",
        "UNVERIFIED: no commit of this repository was found to check; follows main. CC-BY-NC-4.0 (timm's "
        "pretrained config)", verified=False),
    "medical.biomedclip": Release(
        _hub("microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224") + " (open_clip: hf-hub:microsoft/BiomedCLIP-...)",
        "public", f"{_SEEN} (Hugging Face cache snapshots holding open_clip_pytorch_model.bin); MIT"),
    "medical.llava_med": Release(
        _hub("openai/clip-vit-large-patch14-336") + ", the mm_vision_tower of microsoft/llava-med-v1.5-mistral-7b "
        "(only the tower is read, so the 7B language model is not needed)",
        "public (the tower); LLaVA-Med itself is for research use only (its model card)",
        f"{_SEEN} (the snapshot LLaVA-style training scripts load; pytorch_model.bin); MIT (CLIP)"),
    "medical.medsiglip": Release(
        _hub("google/medsiglip-448"),
        "gated: log in to Hugging Face and accept the Health AI Developer Foundations terms on the model page "
        "(processed immediately), then download with a token",
        f"{_SEEN} (many projects); Health AI Developer Foundations terms of use"),
    "medical.medgemma": Release(
        _hub("google/medgemma-4b-it") + " (only config.json, the shard index and the shards holding "
        "vision_tower.* are read)",
        "gated: accept the Health AI Developer Foundations terms on the model page, then download with a token",
        f"{_SEEN} (many projects; one notes that a token confirmed access to it); Health AI Developer "
        "Foundations terms of use"),
    "specialist.panderm": Release(
        "the authors' Google Drive link in the PanDerm README (SiyuanYan1/PanDerm, 'Download PanDerm Pre-trained "
        "Weights', row 'PanDerm (proposed in our paper)', ViT-L/16): "
        "https://drive.google.com/file/d/1SwEzaOlFV_gBKf2UzeowMC8z9UH7AQbE/view?usp=sharing; put the file in "
        "$CRSREPRO_WEIGHTS/specialist.panderm/",
        "public link; CC-BY-NC-ND-4.0 (the README)",
        "the file name the README's scripts use (panderm_ll_data6_checkpoint-499.pth), read at "
        "SiyuanYan1/PanDerm@97e09d0"),
    "specialist.retfound": Release(
        _hub("YukunZhou/RETFound_mae_natureCFP") + " (RETFound_MAE README: 'Get access to the pre-trained models "
        "on HuggingFace', then huggingface-cli login)",
        "gated: register on Hugging Face and fill in the access form on the model page; CC-BY-NC-4.0",
        f"{_SEEN} (a Hugging Face cache snapshot holding RETFound_mae_natureCFP.pth, about 3.95 GB)"),
    "specialist.rad_dino": Release(
        _hub("microsoft/rad-dino"), "public",
        f"{_SEEN} (many projects; one records licence MIT at this revision, model.safetensors 346,345,912 bytes, "
        "SHA-256 dbfb9f54459c38773505de64a6ab7807bdcb392610fe1e697166342e43fb91ae, and the 518 / 0.5307 / 0.2583 "
        "processor). The licence is revision-dependent: stored model cards say MIT at some revisions and "
        "'other / msrla' at others; MIT is recorded for this pin"),
    "specialist.biovil": Release(
        _hub("microsoft/BiomedVLP-CXR-BERT-specialized") + ", file biovil_image_resnet50_proj_size_128.pt at tag "
        "v1.1 (hi-ml downloads it from there)", "public; MIT",
        "hi-ml's own pin (health_multimodal/image/model/pretrained.py: CXR_BERT_COMMIT_TAG = 'v1.1' and the MD5 "
        "02ce6ee460f72efd599295f440dbb453, checked on load), read at microsoft/hi-ml@b67c1d27"),
    "specialist.chexzero": Release(
        "the authors' Google Drive folder in the CheXzero README ('Model Checkpoints'): "
        "https://drive.google.com/drive/folders/1makFLiEMbSleYltaRxw81aBhEDMpVwno?usp=sharing; put "
        "best_64_5e-05_original_22000_0.864.pt in $CRSREPRO_WEIGHTS/specialist.chexzero/",
        "public link; code MIT, weights without a licence, trained on MIMIC-CXR (PhysioNet credentialed data)",
        "the checkpoint file name, read at rajpurkarlab/CheXzero@5c341db"),
}
