"""``crsrepro dry-run --profile paper``: the paper's path at full size, before a GPU-day, without weights
(DESIGN.md section 13; issue 25).

For each encoder of the profile, in its own process (so that its peak memory is its own):

1. **Build at real size, through its own builder.** A checkpoint with random weights is written in the
   release's own layout (:func:`write_random_checkpoint`: a timm or open_clip hub folder, a
   ``save_pretrained`` folder, MedGemma's Gemma3 ``vision_tower.*`` tensors, PanDerm's flat
   ``encoder.*`` file, RETFound's ``{'model': ...}``, BioViL's ``encoder.encoder.*``, CheXzero's OpenAI
   CLIP state dict) from the architecture's real configuration (:data:`REAL_SIZE`), and the encoder's
   builder reads it, so the key layouts, prefixes and builder tweaks are the ones real weights meet.
   Nothing is downloaded. The parameter count must equal ``spec.n_params`` (the real checkpoint's).
   BioViL's MD5 check is skipped (random weights are not hi-ml's file).
2. **Extract** every depth tap (``spec.layer_taps``, one pass) at the encoder's native input size
   (896 px for MedGemma, 518 for RAD-DINO, 448 for MedSigLIP ...) on a handful of real images per
   domain (:data:`STAND_INS`: one image per class; the paper's datasets are not here, so CheXpert is
   stood in for by NIH ChestX-ray14, MIMIC-CXR by Kermany's paediatric CXR (2 classes), ISIC 2019 by
   ISIC 2017; APTOS 2019 has no stand-in and is skipped, and said so). Each tap must be finite with
   the right dimension.
3. **One LoRA step** (:func:`crsrepro.run.lora.adapt` and :func:`~crsrepro.run.lora.train`, the paper's
   rank 8 / alpha 16, one optimiser step on ``lora_images`` images of the first domain) for each encoder
   with declared targets; an encoder without targets is skipped, and said so. Reported: how many
   adapters changed in the step (each must have had a gradient) and whether the frozen base is
   unchanged bit for bit.
4. Back in the parent: **a linear probe, a recalibrator, the scores and the CRS** on the extracted
   ``final`` features (:class:`~crsrepro.fit.linear.LinearProbe` fit and scored on the same handful,
   the temperature recalibrator, :func:`~crsrepro.run.units.score_probabilities`, and
   :func:`~crsrepro.score.crs.crs_scores` against a frame frozen from the panel). With a handful of
   images and random weights these numbers mean nothing: the dry run proves that the code runs at the
   real sizes and dimensions. Retention and robustness need the label-fraction and perturbation runs,
   which a dry run does not do: they enter the CRS as 1.0 [dry run only].
5. **The grid and one chapter** (:func:`grid_and_chapter`): the run grid itself (:func:`crsrepro.run.grid.
   run_grid`: extraction with its feature cache, two perturbations, two label fractions, two seeds, the
   linear probe with its four recalibrators), on :data:`GRID_ENCODERS` at real size, each read by its own
   builder from a random checkpoint in its release layout, on small subsamples of the three stand-ins
   (:data:`GRID_SUBSAMPLE`); then the frame is frozen from that run and :data:`CHAPTER` is executed by
   papermill on it, as the book executes it. Everything is written under the scratch folder.

Per encoder it reports the peak resident memory (random checkpoint written and read, extraction and
LoRA), the images/s of extraction and of the LoRA step on this CPU, and beside them the planner's GPU
rate and GPU-hours (:func:`crsrepro.run.plan.plan`).

The defaults are [ours]: one image per class per domain (2 for NIH: one without and one with a finding)
and one LoRA image, so that all 15 run on a 2-core CPU; MedGemma at 896 px dominates (minutes per image);
the grid and the chapter run the two fastest architectures of two builders on a few hundred images.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from crsrepro.core.errors import CrsreproError
from crsrepro.core.schema import FINAL


@dataclass(frozen=True)
class StandIn:
    """A real dataset under ``images_root`` that stands in for one of the paper's."""

    dataset: str
    folder: str
    options: dict = field(default_factory=dict)


#: The paper's datasets and their stand-ins in ``../shared/realdata/images`` (None: no stand-in).
STAND_INS: dict[str, StandIn | None] = {
    "chexpert": StandIn("nih_cxr14", "nih_cxr14", {"images": "present-only"}),
    "mimic_cxr": StandIn("kermany_cxr", "kermany", {"n_classes": 2}),
    "isic2019": StandIn("isic2017", "isic2017"),
    "aptos2019": None,
}

_SIGLIP_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                  "patch_size": 14}
#: The real size of each paper architecture: the configuration its released checkpoint carries (timm and
#: open_clip names, transformers config fields). The parameter count built from it must equal
#: ``spec.n_params``, which is what makes this table checkable.
REAL_SIZE: dict[str, dict] = {
    "general.resnet50": {"timm": "resnet50"},
    "general.vit_b16": {"timm": "vit_base_patch16_224"},
    "general.mae": {"timm": "vit_base_patch16_224"},
    "specialist.retfound": {"timm": "vit_large_patch16_224"},
    "specialist.panderm": {"timm": "beit_large_patch16_224"},
    "specialist.biovil": {"timm": "resnet50"},
    "general.clip": {"open_clip": "ViT-B-16"},
    "specialist.chexzero": {"open_clip": "ViT-B-32"},
    "medical.biomedclip": {"open_clip_cfg": {"embed_dim": 512, "vision_cfg": {
        "timm_model_name": "vit_base_patch16_224", "timm_model_pretrained": False, "timm_pool": "",
        "timm_proj": "linear", "image_size": 224}}},
    "general.siglip": {"transformers": {}},  # SiglipVisionConfig's defaults are SigLIP base/16 at 224
    "general.dinov2": {"transformers": {"image_size": 518}},
    "specialist.rad_dino": {"transformers": {"image_size": 518}},
    "medical.llava_med": {"transformers": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                           "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                                           "projection_dim": 768}},
    "medical.medsiglip": {"transformers": {**_SIGLIP_SO400M, "image_size": 448}},
    "medical.medgemma": {"vision_config": {**_SIGLIP_SO400M, "image_size": 896, "vision_use_head": False}},
}


# --------------------------------------------------------------------------- random checkpoints

def _jittered(state_dict: dict, parameters: set[str], seed: int) -> dict:
    """The state dict with N(0, 0.02) added to every parameter (not the buffers), as trained weights are
    nowhere exactly zero: an untrained zero (timm's zero-initialised last BatchNorm of each ResNet block)
    would block the LoRA gradients the dry run checks."""
    generator = torch.Generator().manual_seed(seed)
    return {k: (v + 0.02 * torch.randn(v.shape, generator=generator) if k in parameters else v).contiguous()
            for k, v in state_dict.items()}


def _state(module: torch.nn.Module, prefix: str = "") -> dict:
    params = {prefix + k for k, _ in module.named_parameters()}
    return _jittered({prefix + k: v for k, v in module.state_dict().items()}, params, seed=0)


def real_size_model(spec) -> torch.nn.Module:
    """``spec``'s network at its real size (:data:`REAL_SIZE`), freshly initialised, as its release builds it
    (PanDerm with its timm BEiT arguments; the open_clip towers of OpenAI weights with QuickGELU). Works
    on the meta device, which the tests use to count parameters without memory."""
    size = REAL_SIZE[spec.id]
    if "timm" in size:
        import timm

        from crsrepro.encoders.local import PANDERM_MODEL_ARGS
        args = PANDERM_MODEL_ARGS if spec.id == "specialist.panderm" else {}
        return timm.create_model(size["timm"], pretrained=False, num_classes=0, **args)
    if "open_clip" in size or "open_clip_cfg" in size:
        import open_clip
        from open_clip.model import _build_vision_tower

        cfg = size.get("open_clip_cfg") or open_clip.get_model_config(size["open_clip"])
        return _build_vision_tower(cfg["embed_dim"], cfg["vision_cfg"], quick_gelu="open_clip" in size)
    from crsrepro.encoders.transformers_family import ARCHITECTURES, siglip_vision_model
    if "vision_config" in size:
        return siglip_vision_model(size["vision_config"])
    cls = ARCHITECTURES[spec.architecture]
    return cls(cls.config_class(**size["transformers"]))


def write_random_checkpoint(spec, folder: Path) -> Path:
    """Write random weights of ``spec``'s real-size network (:func:`real_size_model`) into ``folder`` in the
    layout of its release, and return the path its builder reads."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    size, model = REAL_SIZE[spec.id], real_size_model(spec)
    if "timm" in size:
        state = _state(model)
        if spec.id == "specialist.panderm":  # a flat state dict with encoder.* keys (and others, not read)
            torch.save({"encoder." + k: v for k, v in state.items()} | {"teacher.norm.weight": torch.ones(2)},
                       folder / spec.weight_files[0])
        elif spec.id == "specialist.retfound":  # MAE's save_model: {'model': ..., 'epoch': ...}
            torch.save({"model": state, "epoch": 0}, folder / spec.weight_files[0])
        elif spec.id == "specialist.biovil":  # hi-ml ImageModel: encoder.encoder.* + projector.*
            torch.save({"encoder.encoder." + k: v for k, v in state.items()} | {"projector.w": torch.ones(2)},
                       folder / spec.weight_files[0])
        else:  # a timm hub folder
            (folder / "config.json").write_text(json.dumps({"architecture": spec.architecture}))
            save_file(state, str(folder / "model.safetensors"))
    elif "open_clip" in size or "open_clip_cfg" in size:
        import open_clip

        state = _state(model, "visual.")
        if spec.id == "specialist.chexzero":  # the OpenAI CLIP state dict
            torch.save(state, folder / spec.weight_files[0])
        else:
            cfg = size.get("open_clip_cfg") or open_clip.get_model_config(size["open_clip"])
            model_cfg = {"embed_dim": cfg["embed_dim"], "vision_cfg": cfg["vision_cfg"], "quick_gelu": "open_clip" in size}
            (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg}))
            save_file(state, str(folder / "open_clip_model.safetensors"))
    elif "vision_config" in size:  # MedGemma: the Gemma3 layout, vision_tower.vision_model.* tensors only
        state = {k.removeprefix("vision_model."): v for k, v in _state(model).items()}
        (folder / "config.json").write_text(json.dumps({"vision_config": size["vision_config"]}))
        save_file({"vision_tower.vision_model." + k: v for k, v in state.items()}, str(folder / "model.safetensors"))
    else:
        from crsrepro.encoders.transformers_family import without_transformers_bars

        model.load_state_dict(_state(model))
        with without_transformers_bars():
            model.save_pretrained(folder)
    return folder


def build_at_real_size(spec, scratch: Path):
    """``spec``'s encoder at its real size with random weights, built by its own builder from
    :func:`write_random_checkpoint` (BioViL's MD5 check skipped)."""
    from crsrepro.encoders.paper import PAPER_ENCODERS

    builder = dict((s.id, b) for s, b in PAPER_ENCODERS)[spec.id]
    folder = write_random_checkpoint(spec, scratch / spec.id)
    return builder(dataclasses.replace(spec, weight_md5=None), weights=folder, device="cpu")


# --------------------------------------------------------------------------- the real images

@dataclass
class Domain:
    """A handful of real images of one stand-in: uint8 ``[3, H, W]`` tensors, their labels and the task."""

    paper_dataset: str
    dataset: str
    image_ids: list
    images: list
    labels: np.ndarray
    task: str
    label_names: list


def load_domains(images_root: Path, datasets) -> tuple[list[Domain], list[str]]:
    """One image per class of each stand-in (NIH: one without and one with a finding, and the labels
    that differ between them), the first by image id; and the notes on datasets without a stand-in."""
    from crsrepro.data import label_matrix, load_dataset, read_image
    from crsrepro.encoders.registry import pil_to_uint8_tensor

    domains, notes = [], []
    for paper_dataset in datasets:
        stand_in = STAND_INS.get(paper_dataset)
        if stand_in is None:
            notes.append(f"{paper_dataset}: no stand-in in {images_root}; skipped")
            continue
        df = load_dataset(stand_in.dataset, images_root / stand_in.folder, **stand_in.options)
        df = df.sort_values("image_id")
        y = label_matrix(df)
        if df.attrs["task"] == "multiclass":
            rows = [int(np.flatnonzero(y == k)[0]) for k in range(len(df.attrs["label_names"]))]
            labels, names = y[rows], list(df.attrs["label_names"])
        else:
            positives = np.nansum(y, axis=1)
            rows = [int(np.flatnonzero(positives == 0)[0]), int(np.flatnonzero(positives > 0)[0])]
            keep = np.flatnonzero(y[rows[0]] != y[rows[1]])
            labels, names = y[rows][:, keep], [df.attrs["label_names"][i] for i in keep]
        picked = df.iloc[rows]
        domains.append(Domain(paper_dataset, stand_in.dataset, picked["image_id"].astype(str).tolist(),
                              [pil_to_uint8_tensor(read_image(p)) for p in picked["path"]], labels,
                              df.attrs["task"], names))
    return domains, notes


# --------------------------------------------------------------------------- one encoder (own process)

def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # Linux: KiB


def _one_encoder(encoder_id: str, domains: list[Domain], lora_images: int, threads: int, scratch: str) -> dict:
    """Build, extract every tap per domain and take one LoRA step; runs in a fresh process."""
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.run.lora import LoraError, LoraParams, adapt, base_changes, base_state, lora_targets, train

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = get_encoder_spec(encoder_id)
    out = {"encoder": encoder_id, "lines": [], "features": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        encoder = build_at_real_size(spec, Path(tmp))
    n_params = sum(p.numel() for p in encoder.model.parameters())
    out["build_s"] = time.perf_counter() - started
    if n_params != spec.n_params:
        raise CrsreproError(f"{encoder_id}: built {n_params:,} parameters, the spec says {spec.n_params:,}")
    out["lines"].append(f"built at real size through its builder: {n_params:,} parameters (= spec), "
                        f"{out['build_s']:.0f} s with the random checkpoint")
    seconds, n_images, resized = 0.0, 0, {}
    for domain in domains:
        if domain.paper_dataset in spec.excluded_datasets:
            continue
        batch = torch.stack([encoder.resize(image[None])[0] for image in domain.images])
        resized[domain.paper_dataset] = batch
        t0 = time.perf_counter()
        feats = encoder.forward_features(encoder.preprocess(batch), layers=spec.layer_taps)
        seconds += time.perf_counter() - t0
        n_images += len(batch)
        for tap, f in feats.items():
            if not torch.isfinite(f).all() or f.shape[0] != len(batch):
                raise CrsreproError(f"{encoder_id}: tap {tap} on {domain.dataset} is not finite or has {f.shape}")
        if feats[FINAL].shape[1] != spec.embed_dim:
            raise CrsreproError(f"{encoder_id}: final has dimension {feats[FINAL].shape[1]}, spec {spec.embed_dim}")
        out["features"][domain.paper_dataset] = {tap: f.numpy() for tap, f in feats.items()}
        dims = ", ".join(f"{tap} {f.shape[1]}" for tap, f in feats.items())
        out["lines"].append(f"{domain.dataset} (for {domain.paper_dataset}): {len(batch)} images at "
                            f"{spec.input_size} px, taps {dims}")
    out["extract_img_s"] = n_images / seconds if seconds else float("nan")
    out["lora_img_s"] = float("nan")
    try:
        targets = lora_targets(encoder)
    except LoraError as err:
        out["lines"].append(f"LoRA: skipped ({err})")
        targets = None
    if targets is not None and lora_images > 0 and resized:
        domain = next(d for d in domains if d.paper_dataset in resized)
        images, labels = resized[domain.paper_dataset][:lora_images], domain.labels[:lora_images]
        params = LoraParams(epochs=1, batch_size=len(images))  # one optimiser step; the paper's rank and alpha
        adapted = adapt(encoder, params, seed=0)
        base = base_state(adapted.model)
        before = {k: v.detach().clone() for k, v in adapted.model.state_dict().items() if "lora_B" in k}
        fine = train(adapted, images, labels, task=domain.task, n_outputs=len(domain.label_names), seed=0,
                     params=params)
        after = adapted.model.state_dict()
        moved = sum(not torch.equal(after[k], v) for k, v in before.items())
        frozen = not base_changes(adapted.model, base)
        out["lora_img_s"] = fine.images_per_second
        out["lines"].append(f"LoRA: {len(targets)} target modules; one step on {len(images)} {domain.dataset} "
                            f"image(s): {moved} of {len(before)} adapters changed, frozen base "
                            f"{'unchanged bit for bit' if frozen else 'CHANGED'}")
        if moved != len(before) or not frozen:
            raise CrsreproError(f"{encoder_id}: the LoRA step trained {moved} of {len(before)} adapters "
                                f"(frozen base unchanged: {frozen})")
    out["peak_gb"] = _peak_rss_gb()
    return out


# --------------------------------------------------------------------------- the protocol's tail

def protocol_tail(results: list[dict], domains: list[Domain]) -> pd.DataFrame:
    """A linear probe, the temperature recalibrator, the scores and the CRS on the dry run's ``final``
    features (see the module docstring: mechanics only)."""
    from crsrepro.fit.calibration import make_recalibrator
    from crsrepro.fit.linear import LinearProbe
    from crsrepro.run.units import score_probabilities
    from crsrepro.score.crs import ReferenceFrame, crs_scores

    rows = []
    for result in results:
        for domain in domains:
            if domain.paper_dataset not in result["features"]:
                continue
            X, y = result["features"][domain.paper_dataset][FINAL], domain.labels
            probe = LinearProbe(task=domain.task).fit(X, y, X_val=X, y_val=y)
            probs = make_recalibrator("temperature").fit(probe.predict_proba(X), y).predict_proba(probe.predict_proba(X))
            metrics = score_probabilities(domain.task, y, probs)
            rows.append({"encoder": result["encoder"], "dataset": domain.paper_dataset, "auroc": metrics["auroc"],
                         "ece": metrics["ece"], "retention": 1.0, "robustness": 1.0})
    panel = pd.DataFrame(rows)
    scores = crs_scores(panel, ReferenceFrame.freeze(panel))
    return panel.merge(scores[["encoder", "dataset", "crs"]], on=["encoder", "dataset"])


# --------------------------------------------------------------------------- the grid and one chapter

#: The encoders of the dry run's grid [ours]: the two fastest paper architectures on a CPU, of two builders
#: (a timm hub folder; OpenAI's CLIP state dict) and two families.
GRID_ENCODERS = ("general.resnet50", "specialist.chexzero")
#: Images per stand-in in the dry run's grid [ours]: whole patients or lesions, as real-mini subsamples.
GRID_SUBSAMPLE = {"isic2017": 100, "kermany_cxr": 100, "nih_cxr14": 250}
#: The chapter the dry run executes on its grid's results.
CHAPTER = "01_discrimination"


@contextlib.contextmanager
def _environment(**variables):
    """``os.environ`` with ``variables`` set, restored on exit (the chapter's kernel inherits them)."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def grid_and_chapter(images_root: Path, scratch: Path, *, book_root: Path = Path("."), subsample=None,
                     out=print) -> pd.DataFrame:
    """Step 5 of the module docstring: the run grid on :data:`GRID_ENCODERS` at real size with random
    weights and the real-mini stand-ins subsampled to ``subsample`` (default :data:`GRID_SUBSAMPLE`; the tests
    take fewer), the frame frozen from it, and :data:`CHAPTER` executed by papermill; everything under
    ``scratch``. Returns the grid's results."""
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.present.book import execute_notebook
    from crsrepro.profiles import load_profile
    from crsrepro.run.grid import run_grid
    from crsrepro.score.frame import freeze_frame

    scratch = Path(scratch).absolute()
    weights = {e: write_random_checkpoint(get_encoder_spec(e), scratch / "weights" / e) for e in GRID_ENCODERS}
    profile_path = scratch / "paper-dryrun.yaml"
    profile_path.write_text(yaml.safe_dump({
        "include": "real-mini", "name": "paper-dryrun",
        "description": "The dry run's grid: paper architectures at real size with random weights, on real images.",
        "data": {"root": str(Path(images_root).absolute()), "subsample": dict(subsample or GRID_SUBSAMPLE)},
        "encoders": list(GRID_ENCODERS), "seeds": [0, 1], "label_fractions": [0.25, 1.0],
        "perturbations": ["gaussian_blur", "jpeg"], "severities": [3], "control_probes": {"probes": []},
        "features": {"cache_dir": str(scratch / "features")}, "output_dir": str(scratch / "results")}))
    profile, manifests = load_profile(profile_path), scratch / "manifests"
    started = time.perf_counter()
    results = run_grid(profile, weights=weights, manifest_dir=manifests, progress=False, executor="local")
    freeze_frame(profile, results, manifest_dir=manifests, overwrite=True)
    grid_s = time.perf_counter() - started
    notebook = scratch / f"{CHAPTER}.ipynb"
    with _environment(CRSREPRO_MANIFESTS=str(manifests)):
        chapter_s = execute_notebook(CHAPTER, profile=str(profile_path), book_root=book_root, progress=False,
                                     output=notebook)
    auroc = results[(results["metric"] == "auroc") & (results["condition"] == "clean")
                    & (results["label_fraction"] == 1.0) & (results["recalibrator"] == "none")]
    out(f"the run grid on {', '.join(GRID_ENCODERS)} at real size ({len(results):,} result rows from "
        f"{results['rowset'].nunique()} row-sets, clean full-label AUROC {auroc['value'].min():.3f}-"
        f"{auroc['value'].max():.3f}) in {grid_s:.0f} s, frame frozen; chapter {CHAPTER} executed by papermill "
        f"in {chapter_s:.0f} s -> {notebook}")
    return results


# --------------------------------------------------------------------------- the command

def dry_run(profile="paper", *, images_root=None, encoders=None, lora_images: int = 1, threads: int | None = None,
            scratch=None, grid: bool = True, book_root=Path("."), out=print) -> pd.DataFrame:
    """Run the dry run (see the module docstring) and print its report through ``out``.

    Parameters
    ----------
    profile : str or Profile
        Its encoders and datasets (with their transfer targets) are dry-run.
    images_root : path, optional
        The folder holding ``nih_cxr14/``, ``kermany/`` and ``isic2017/`` (default: ``$CRSREPRO_DATA``).
    encoders : list of str, optional
        A subset of the profile's encoders (the slow test's reduced run).
    lora_images : int
        Images in the one LoRA step (0: no LoRA step).
    threads : int, optional
        Torch threads per encoder process (default: the CPU cores).
    scratch : path, optional
        Where the random checkpoints are written, one encoder at a time, and the grid's profile, features,
        results, frame and executed chapter are kept (default: a new folder in the system's temp folder).
    grid : bool
        Run step 5, the grid and one chapter (:func:`grid_and_chapter`).
    book_root : path
        The checkout whose ``notebooks/`` the chapter is executed from.

    Returns
    -------
    DataFrame
        One row per encoder: ``params``, ``peak_gb``, ``extract_img_s``, ``lora_img_s``, the planner's
        ``gpu_img_s``, ``forward_gpu_hours`` and ``lora_gpu_hours``, and ``crs`` (mean over its datasets).
    """
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.profiles import as_profile
    from crsrepro.run.plan import plan

    profile = as_profile(profile)
    root = images_root or os.environ.get("CRSREPRO_DATA")
    if root is None or not Path(root).is_dir():
        raise CrsreproError(f"dry-run needs the real images: {root or '$CRSREPRO_DATA (not set)'} is not a folder "
                            f"(expected nih_cxr14/, kermany/ and isic2017/ inside)")
    ids = list(encoders or profile.encoders)
    unknown = [e for e in ids if e not in REAL_SIZE]
    if unknown:
        raise CrsreproError(f"dry-run builds the paper's architectures; no real size is known for {', '.join(unknown)}")
    targets = [t for value in profile.transfer.values() for t in ([value] if isinstance(value, str) else value)]
    datasets = list(dict.fromkeys(list(profile.datasets) + targets))
    started = time.perf_counter()
    domains, notes = load_domains(Path(root), datasets)
    for note in notes:
        out(note)
    out("images per domain: " + "; ".join(f"{d.dataset} for {d.paper_dataset}: {len(d.images)} ({', '.join(d.image_ids)})"
                                         for d in domains))
    costs = plan(profile).encoders.set_index("encoder")
    threads = threads or os.cpu_count() or 1
    scratch = Path(scratch or tempfile.mkdtemp(prefix="crsrepro-dry-run-"))
    scratch.mkdir(parents=True, exist_ok=True)  # a --scratch that does not exist yet
    out(f"scratch folder: {scratch}")
    results = []
    context = multiprocessing.get_context("spawn")
    for encoder_id in sorted(ids, key=lambda e: get_encoder_spec(e).n_params * get_encoder_spec(e).input_size ** 2):
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            result = pool.submit(_one_encoder, encoder_id, domains, lora_images, threads, str(scratch)).result()
        results.append(result)
        cost = costs.loc[encoder_id]
        out(f"{encoder_id}\n" + "\n".join(f"  {line}" for line in result["lines"]) +
            f"\n  peak memory {result['peak_gb']:.2f} GB; this CPU: extraction {result['extract_img_s']:.3g} img/s, "
            f"LoRA {result['lora_img_s']:.3g} img/s; planner: {cost['rate_img_s']:,.0f} img/s on a GPU, "
            f"{cost['forward_gpu_hours']:.2f} forward + {cost['lora_gpu_hours']:.2f} LoRA GPU-hours")
    tail = protocol_tail(results, domains)
    table = pd.DataFrame([{
        "encoder": r["encoder"], "params": get_encoder_spec(r["encoder"]).n_params, "input_px": get_encoder_spec(r["encoder"]).input_size,
        "peak_gb": r["peak_gb"], "extract_img_s": r["extract_img_s"], "lora_img_s": r["lora_img_s"],
        "gpu_img_s": costs.loc[r["encoder"], "rate_img_s"], "forward_gpu_hours": costs.loc[r["encoder"], "forward_gpu_hours"],
        "lora_gpu_hours": costs.loc[r["encoder"], "lora_gpu_hours"],
        "crs": tail.loc[tail["encoder"] == r["encoder"], "crs"].mean()} for r in results])
    out(f"probes, temperature recalibration, scores and CRS on {len(tail)} encoder x dataset cells "
        "(a handful of images and random weights: mechanics only; retention and robustness set to 1.0)")
    out(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if grid:
        grid_and_chapter(Path(root), scratch / "paper-dryrun", book_root=book_root, out=out)
    out(f"dry run done in {(time.perf_counter() - started) / 60:.1f} min with {threads} thread(s) per encoder")
    return table
