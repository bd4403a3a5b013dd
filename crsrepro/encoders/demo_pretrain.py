"""Pretrain the demo panel's domain CNNs and fit its pixel PCA: ``python -m crsrepro.encoders.demo_pretrain``.

The demo panel (:mod:`crsrepro.encoders.demo`) stands in for specialist and broad-medical pretraining
with four :class:`~crsrepro.encoders.demo.TinyCNN` s trained on a synthetic *pretraining corpus*: images
drawn from the demo world's generator (:func:`crsrepro.data.demo_world.sample_images`) with seeds
disjoint from the demo world itself (``seed`` >= 10,000 here, the demo world uses 0), so no evaluation
image is ever seen in pretraining. The same corpus fits the pixel PCA.

========== ============================================ ==========
weights    corpus                                       family
========== ============================================ ==========
derm_cnn   ISIC 2019 look-alike dermoscopy              specialist
fundus_cnn APTOS 2019 look-alike fundus photographs     specialist
cxr_cnn    CheXpert look-alike chest radiographs        specialist
med_cnn    all three                                    medical
pixel_pca  all three (pixels at 24 x 24)                general
========== ============================================ ==========

The pretraining task is supervised on the corpus's own labels (ISIC's 8 classes, APTOS's 5 grades,
CheXpert's 14 findings with uncertain labels masked), one linear head per dataset on a shared
backbone; ``med_cnn`` takes its batches from the three datasets in turn. The heads are thrown away;
only the backbone is saved.

[ours] The corpus (5,000 images per modality, 20 epochs) is large enough that a domain CNN is clearly
better than random features of the same architecture in its own domain: a pretrained specialist
that is no better than its random twin teaches nothing (in demo v3, with 800 images and
4 epochs, ``derm_cnn`` and ``random_cnn`` were tied on the ISIC look-alike and the random CNN led
the CRS). Every batch goes through :func:`acquisition_augment`, the modality-agnostic augmentation
that medical pretraining pipelines use (random resized crop and flip, blur, contrast and brightness,
Rician noise): it is what makes the pretrained encoders robust to acquisition changes, as the paper
found its medical encoders to be, while the random and classical extractors get no such training.
The augmentation ranges overlap the benchmark's perturbations (DESIGN.md section 6) on purpose,
as real pretraining augmentations overlap real acquisition variation; JPEG is left out.

Everything is deterministic on one machine: fixed seeds, ``torch.use_deterministic_algorithms``, a
fixed thread count, CPU only. (Float results across CPUs or library versions may differ in the last
bits; the committed files are the reference, and ``demo_weights.json`` records their SHA-256, the
settings, the versions and the time taken, in ``cpu_seconds`` and ``wall_seconds``.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.decomposition import PCA
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from crsrepro.data import get_dataset_spec
from crsrepro.data.demo_world import sample_images
from crsrepro.encoders.demo import DEMO_ENCODERS, WEIGHTS_DIR, WEIGHTS_RECORD, TinyCNN
from crsrepro.encoders.registry import Encoder
from crsrepro.encoders.weights import weights_hash

logger = logging.getLogger(__name__)

PRETRAIN_DATASETS = ("isic2019", "aptos2019", "chexpert")
CORPORA = {
    "derm_cnn": ("isic2019",),
    "fundus_cnn": ("aptos2019",),
    "cxr_cnn": ("chexpert",),
    "med_cnn": PRETRAIN_DATASETS,
}
_SPECS = {spec.id: spec for spec, _ in DEMO_ENCODERS}


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """Every setting of the pretraining run (all [ours]); written into ``demo_weights.json``.

    Parameters
    ----------
    seed : int
        Seed of the pretraining corpus (``sample_images(seed=...)``), of the initialisation and of
        the batch order. Disjoint from the demo world's seed 0.
    n_images : int
        Images per dataset in the pretraining corpus.
    image_size : int
        Side of the generated images (the demo world's 96 px).
    epochs : int
        Passes over each network's corpus.
    batch_size, lr, weight_decay : int, float, float
        AdamW mini-batch training; ``lr`` is the peak of a one-cycle schedule.
    augment : bool
        Pass every batch through :func:`acquisition_augment`.
    threads : int
        ``torch.set_num_threads``: fixed, because the thread count can change float reductions.
    """

    seed: int = 10_000
    n_images: int = 5000
    image_size: int = 96
    epochs: int = 20
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-4
    augment: bool = True
    threads: int = 2


#: [ours] The ranges of :func:`acquisition_augment` (images in [0, 1]).
AUGMENT = {"crop_scale": (0.6, 1.0), "blur_p": 0.5, "blur_sigma_px": (0.0, 2.0), "contrast": (0.3, 1.2),
           "brightness": 0.1, "noise_p": 0.6, "rician_sigma": (0.0, 0.1)}


def _gaussian_blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian blur of ``x [B, C, H, W]`` with one ``sigma`` (px) per image; 0 leaves it."""
    b, c, h, w = x.shape
    offsets = torch.arange(-4, 5, dtype=x.dtype)
    kernel = torch.exp(-offsets[None] ** 2 / (2 * sigma[:, None].clamp(min=1e-3) ** 2))
    kernel = (kernel / kernel.sum(1, keepdim=True)).repeat_interleave(c, 0)  # [B*C, 9]
    flat = x.reshape(1, b * c, h, w)
    flat = F.conv2d(F.pad(flat, (4, 4, 0, 0), mode="reflect"), kernel[:, None, None, :], groups=b * c)
    flat = F.conv2d(F.pad(flat, (0, 0, 4, 4), mode="reflect"), kernel[:, None, :, None], groups=b * c)
    return flat.reshape(b, c, h, w)


def acquisition_augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Randomly re-acquire a batch of images ``[B, C, H, W]`` in [0, 1] (ranges: :data:`AUGMENT`).

    Per image: a random resized crop (scale 0.6-1, random offset) and horizontal flip; with
    probability 0.5 a Gaussian blur; a contrast factor about the image mean and a brightness shift;
    with probability 0.6 Rician noise. Deterministic given ``generator``.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = acquisition_augment(torch.rand(4, 3, 16, 16, generator=g), g)
    >>> out.shape, bool(out.min() >= 0), bool(out.max() <= 1)
    (torch.Size([4, 3, 16, 16]), True, True)
    """
    b = x.shape[0]

    def uniform(low, high):
        return low + (high - low) * torch.rand(b, generator=generator)

    scale = uniform(*AUGMENT["crop_scale"])
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0] = scale * torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0)
    theta[:, 1, 1] = scale
    theta[:, 0, 2] = (1 - scale) * uniform(-1, 1)
    theta[:, 1, 2] = (1 - scale) * uniform(-1, 1)
    x = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False,
                      padding_mode="border")
    blurred = torch.rand(b, generator=generator) < AUGMENT["blur_p"]
    x = _gaussian_blur(x, uniform(*AUGMENT["blur_sigma_px"]) * blurred)
    mean = x.mean((1, 2, 3), keepdim=True)
    contrast = uniform(*AUGMENT["contrast"])[:, None, None, None]
    brightness = uniform(-AUGMENT["brightness"], AUGMENT["brightness"])[:, None, None, None]
    x = (mean + contrast * (x - mean) + brightness).clamp(0, 1)
    noisy = torch.rand(b, generator=generator) < AUGMENT["noise_p"]
    sigma = (uniform(*AUGMENT["rician_sigma"]) * noisy)[:, None, None, None]
    n1 = torch.randn(x.shape, generator=generator) * sigma
    n2 = torch.randn(x.shape, generator=generator) * sigma
    return torch.sqrt((x + n1) ** 2 + n2 ** 2).clamp(0, 1)


def pretraining_corpus(settings: PretrainSettings) -> dict[str, tuple[torch.Tensor, np.ndarray]]:
    """``{dataset: (uint8 images [N, 3, H, W], labels)}`` drawn with the pretraining seed."""
    corpus = {}
    for dataset in PRETRAIN_DATASETS:
        images, labels = sample_images(dataset, settings.n_images, seed=settings.seed,
                                       image_size=settings.image_size)
        batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
        corpus[dataset] = (batch, np.asarray(labels))
    return corpus


def fit_pixel_pca(images: torch.Tensor, *, encoder_id: str = "demo.pixel_pca") -> dict[str, torch.Tensor]:
    """Fit the PCA of ``encoder_id`` on uint8 ``images`` seen through that encoder's preprocessing.

    Returns ``{"mean": [P], "components": [K, P]}`` (float32), K = the spec's ``embed_dim``; the
    signs of the components are sklearn's deterministic ``svd_flip`` convention.
    """
    spec = _SPECS[encoder_id]
    pixels = Encoder(spec, None).preprocess(images).flatten(1).double().numpy()
    pca = PCA(n_components=spec.embed_dim, svd_solver="full").fit(pixels)
    logger.info("pixel PCA: %d components explain %.1f %% of the variance",
                spec.embed_dim, 100 * pca.explained_variance_ratio_.sum())
    return {"mean": torch.from_numpy(pca.mean_).float(), "components": torch.from_numpy(pca.components_).float().contiguous()}


def pretraining_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for class labels ``[B]``; masked binary cross-entropy for label matrices ``[B, L]``.

    In a label matrix only entries equal to 0 or 1 count (uncertain -1 and missing NaN are masked).

    >>> logits = torch.zeros(2, 2)
    >>> round(pretraining_loss(logits, torch.tensor([0, 1])).item(), 4)  # log 2
    0.6931
    >>> round(pretraining_loss(logits, torch.tensor([[1., -1.], [0., float("nan")]])).item(), 4)
    0.6931
    """
    if labels.ndim == 1:
        return F.cross_entropy(logits, labels.long())
    known = (labels == 0) | (labels == 1)
    return F.binary_cross_entropy_with_logits(logits[known], labels[known].float())


def pretrain_cnn(name: str, corpus: dict, settings: PretrainSettings, *, progress: bool = True) -> tuple[TinyCNN, float]:
    """Train the TinyCNN ``name`` (a key of :data:`CORPORA`) on its datasets; returns it and the last epoch's loss.

    One linear head per dataset on the shared backbone; each epoch visits every batch of every dataset
    once, in a seeded random interleaving, each batch augmented (:func:`acquisition_augment`) when
    ``settings.augment``.
    """
    spec = _SPECS[f"demo.{name}"]
    encoder = Encoder(spec, None)
    datasets = CORPORA[name]
    inputs = {d: encoder.resize(corpus[d][0]).float().div(255.0) for d in datasets}  # [0, 1], augmented per batch
    targets = {d: torch.as_tensor(corpus[d][1]) for d in datasets}
    with torch.random.fork_rng(devices=[]):  # seeded init that leaves the caller's RNG alone
        torch.manual_seed(settings.seed)
        model = TinyCNN().to(memory_format=torch.channels_last)  # [ours] about 2x faster on a CPU
        heads = nn.ModuleDict({d: nn.Linear(model.embed_dim, len(get_dataset_spec(d).label_names))
                               for d in datasets})
    generator = torch.Generator().manual_seed(settings.seed)  # the batch order
    optimiser = torch.optim.AdamW([*model.parameters(), *heads.parameters()], lr=settings.lr,
                                  weight_decay=settings.weight_decay)
    n_steps = settings.epochs * sum(-(-len(inputs[d]) // settings.batch_size) for d in datasets)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=settings.lr, total_steps=n_steps)
    mean, std = encoder._mean.cpu(), encoder._std.cpu()
    model.train()
    bar = tqdm(range(settings.epochs), desc=f"pretrain {name}", disable=not progress)
    for _ in bar:
        batches = [(d, idx) for d in datasets
                   for idx in torch.randperm(len(inputs[d]), generator=generator).split(settings.batch_size)]
        order = torch.randperm(len(batches), generator=generator).tolist()
        total = 0.0
        for i in order:
            dataset, idx = batches[i]
            x = inputs[dataset][idx]
            if settings.augment:
                x = acquisition_augment(x, generator)
            x = ((x - mean) / std).contiguous(memory_format=torch.channels_last)
            loss = pretraining_loss(heads[dataset](model(x)), targets[dataset][idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            total += loss.item()
        epoch_loss = total / len(batches)
        bar.set_postfix(loss=f"{epoch_loss:.3f}")
    return model.eval(), epoch_loss


class _Stopwatch:
    """Wall and process-CPU seconds of consecutive laps."""

    def __init__(self):
        self.wall, self.cpu = {}, {}
        self._last = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.wall[name] = round(now[0] - self._last[0], 1)
        self.cpu[name] = round(now[1] - self._last[1], 1)
        self._last = now


def run(settings: PretrainSettings, *, out_dir: Path = WEIGHTS_DIR, progress: bool = True) -> dict:
    """Make every committed demo weight file in ``out_dir`` and write their record; returns the record."""
    torch.set_num_threads(settings.threads)  # process-wide, as befits the command-line entry point
    torch.use_deterministic_algorithms(True)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = _Stopwatch()
    corpus = pretraining_corpus(settings)
    clock.lap("corpus")
    files, losses = {}, {}

    save_file(fit_pixel_pca(torch.cat([corpus[d][0] for d in PRETRAIN_DATASETS])), str(out_dir / "pixel_pca.safetensors"))
    files["pixel_pca.safetensors"] = {"encoder": "demo.pixel_pca", "datasets": list(PRETRAIN_DATASETS)}
    clock.lap("pixel_pca")

    for name, datasets in CORPORA.items():
        model, losses[name] = pretrain_cnn(name, corpus, settings, progress=progress)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out_dir / f"{name}.safetensors"))
        files[f"{name}.safetensors"] = {"encoder": f"demo.{name}", "datasets": list(datasets)}
        clock.lap(name)
        logger.info("%s: final epoch loss %.3f in %.1f s", name, losses[name], clock.wall[name])

    for filename, entry in files.items():
        path = out_dir / filename
        entry.update(sha256=weights_hash(path), bytes=path.stat().st_size)
    record = {
        "made_by": "python -m crsrepro.encoders.demo_pretrain",
        "settings": dataclasses.asdict(settings),
        "files": files,
        "final_epoch_loss": {k: round(v, 4) for k, v in losses.items()},
        "wall_seconds": clock.wall,
        "cpu_seconds": clock.cpu,  # all threads of this process; on a shared machine wall time is noisy
        "versions": {"torch": torch.__version__, "numpy": np.__version__},
    }
    (out_dir / WEIGHTS_RECORD.name).write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    """The command line: every :class:`PretrainSettings` field is an option."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = PretrainSettings()
    for f in dataclasses.fields(PretrainSettings):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)),
                            default=getattr(defaults, f.name))
    parser.add_argument("--out-dir", type=Path, default=WEIGHTS_DIR)
    parser.add_argument("--no-progress", action="store_true")
    args = vars(parser.parse_args(argv))
    out_dir, progress = args.pop("out_dir"), not args.pop("no_progress")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    record = run(PretrainSettings(**args), out_dir=out_dir, progress=progress)
    logger.info("wrote %s (total %.1f s wall, %.1f s CPU)", out_dir / WEIGHTS_RECORD.name,
                sum(record["wall_seconds"].values()), sum(record["cpu_seconds"].values()))


if __name__ == "__main__":
    main()
