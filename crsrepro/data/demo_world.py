"""The demo world: synthetic look-alikes of ISIC 2019, APTOS 2019, CheXpert and MIMIC-CXR (DESIGN.md sections 2-3).

:func:`generate_demo_world` writes all four datasets into ``<root>/<dataset id>/`` **in each real
release's on-disk layout** (csvs, including MIMIC's ``.csv.gz``; jpg/png files), so that the very
loaders that read the real data read the demo world. Images are procedural but meaningful, and made
hard enough to teach: class signal and nuisance variation overlap, so that a colour histogram does
decently but not perfectly.

- Dermoscopy (ISIC-like, 8 classes with ISIC 2019's imbalance, NV dominant): the class sets the
  lesion's shape irregularity, border sharpness, colour and colour variegation, and the odds of
  dermoscopic structures (pigment network, blue-white veil, vessels, scale, dots, white centre,
  lacunae). :data:`COLOUR_LOOKALIKE` (30 %) of lesions take their colours from a look-alike class
  [ours], so that colour alone misleads and shape and structures carry the class. Nuisance: skin
  tone, hair, illumination gradient, dermoscope vignette, white balance, noise, position, size, rotation.
  Images of one lesion share it, with new nuisance; some lesion ids are blank, as in the release.
- Fundus (APTOS-like, 5 ordinal grades, grade 0 dominant): the grade drives the Poisson counts of
  microaneurysms, haemorrhages, hard exudates, cotton-wool spots and new vessels; the per-image lesion
  load varies, so neighbouring grades overlap. Nuisance: exposure, colour cast, disc size and crop,
  focus blur, noise, left/right eye.
- Chest X-ray (CheXpert-like, 14 labels): a label generator with shared latent causes (heart failure
  -> cardiomegaly, oedema, effusion; infection -> consolidation, pneumonia) sets each finding's
  severity, which the renderer draws (heart size, mediastinal width, fluid at the bases, perihilar
  haze, patches, nodules, pneumothorax, pleural thickening, rib breaks, tubes/lines/pacemakers). The
  csv holds 1 / 0 / blank / -1 at CheXpert-like uncertainty rates (borderline findings are more often
  uncertain). Each study has a frontal view, and a lateral view 17 % of the time (filtered by the loader).
- The MIMIC-like second hospital shares the label generator but not the acquisition: another intensity
  curve, more noise and blur, a smaller field scale, collimation borders and other markers, so the
  transfer drop is real.

Patient metadata, in the releases' own columns and vocabulary (DESIGN.md section 14): ISIC 2019's
``ISIC_2019_Training_Metadata.csv`` has ``age_approx`` (5-year steps, some blank), ``anatom_site_general``
and ``sex`` (``male`` / ``female`` / blank), drawn per lesion with the release's shares; CheXpert's csvs
have ``Sex`` (``Male`` / ``Female``) and ``Age`` (18-90), drawn per patient. MIMIC-CXR-JPG has no
demographics (they need MIMIC-IV), and neither has the demo's MIMIC look-alike.

**The planted subgroup effect** [ours]: the images of patients aged :data:`OLDER_FROM` (60) or more,
in the ISIC and CheXpert look-alikes, are acquired worse (:func:`older_acquisition`): their contrast is
cut to :data:`OLDER_CONTRAST` of the original and Gaussian noise of SD :data:`OLDER_NOISE` is added, so
the same lesion or finding is harder to see and every encoder's AUROC is lower on older patients
(sex and site carry no effect). Labels do not depend on age, so the gap is image quality alone: a
subgroup analysis should find ``age_group`` >= 60 the worst subgroup, and nothing for ``sex``.

**Label noise** [ours]: graders disagree, so :data:`LABEL_NOISE` of the ISIC lesions and APTOS images
carry a confusable recorded label (a look-alike class, a neighbouring grade) while the image shows the
true one. It caps every encoder's AUROC below 1 and makes probes that fit their train split closely
over-confident on test, which is what post-hoc recalibration repairs (DESIGN.md section 8).

Sizes come from the profile (``demo_world.n_images``: the number of **frontal** images for the CXR sets).
At tiny sizes (the ``smoke`` profile) rare classes and labels are raised to at least
:data:`MIN_PER_CLASS` examples [ours], so that every class or label reaches every split.
Generation is deterministic (each image has its own seed, JPEG/PNG encoding is fixed), skipped
when the completion marker ``<root>/.demo_world.json`` holds the same parameters, and done by one
process at a time (:func:`generate_demo_world`).
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import shutil
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from scipy.ndimage import gaussian_filter
from tqdm import tqdm

from crsrepro.core.io import atomic_write
from crsrepro.data.common import CHEXPERT_LABELS

logger = logging.getLogger(__name__)

DEMO_WORLD_VERSION = 3  # bump when the generator changes what it writes
MARKER = ".demo_world.json"
PARTIAL = ".demo_world.writing"  # the folder a generation writes into, then moves from
LOCK = ".demo_world.lock"  # held while one process generates
DATASET_CODES = {"isic2019": 1, "aptos2019": 2, "chexpert": 3, "mimic_cxr": 4}
PRETRAIN_STREAM = 7  # sample_images draws from a stream the written world never uses
MIN_PER_CLASS = 10  # [ours] floor on each class/label's count at tiny sizes (smoke)
JPEG_QUALITY = 92
COLOUR_LOOKALIKE = 0.3  # [ours] share of lesions coloured like a look-alike class (colour alone misleads)
LABEL_NOISE = 0.05  # [ours] share of ISIC lesions / APTOS images whose recorded label is a confusable one
NOISE_STREAM = 5  # the random stream of the label noise (per dataset)
SUBGROUP_STREAM = 3  # the random stream of the planted subgroup effect (per image)
PATIENT_STREAM = 4  # the random stream of CheXpert-like patients' sex and age (per patient)
OLDER_FROM = 60  # [ours] the planted subgroup: patients this old or older are imaged worse
OLDER_CONTRAST = 0.45  # [ours] their images' contrast, as a share of the original
OLDER_NOISE = 0.07  # [ours] and the SD of the noise added to them (images in [0, 1])

# ISIC 2019 training-set counts (MEL NV BCC AK BKL DF VASC SCC) and APTOS 2019 counts (grades 0..4).
ISIC_COUNTS = np.array([4522, 12875, 3323, 867, 2624, 239, 253, 628], dtype=float)
APTOS_COUNTS = np.array([1805, 370, 999, 193, 295], dtype=float)


# ----------------------------------------------------------------------------------- drawing kit
@lru_cache(maxsize=8)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in [-1, 1]: (x to the right, y downwards), float32."""
    c = (np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1
    return np.meshgrid(c, c)


def _smooth_noise(rng, size: int, cells: int) -> np.ndarray:
    """Zero-mean, unit-ish smooth noise: a cells x cells normal grid upsampled bicubically."""
    small = rng.standard_normal((cells, cells)).astype(np.float32)
    return np.asarray(Image.fromarray(small).resize((size, size), Image.BICUBIC))


def _sigmoid(z):
    return 0.5 + 0.5 * np.tanh(0.5 * z)


def _blobs(size: int, cx, cy, radius, amplitude) -> np.ndarray:
    """Sum of isotropic Gaussian blobs (vectorised over blobs)."""
    cx, cy, radius, amplitude = (np.atleast_1d(np.asarray(a, dtype=np.float32)) for a in (cx, cy, radius, amplitude))
    if cx.size == 0:
        return np.zeros((size, size), np.float32)
    x, y = _grid(size)
    d2 = (x[None] - cx[:, None, None]) ** 2 + (y[None] - cy[:, None, None]) ** 2
    return (np.exp(-d2 / (2 * radius[:, None, None] ** 2)) * amplitude[:, None, None]).sum(axis=0)


def _curves(size: int, x0, y0, angle, bend, length, width) -> np.ndarray:
    """Max over thin bent strokes from (x0, y0) along ``angle`` (quadratic bend), in [0, 1]."""
    x0, y0, angle, bend, length, width = (np.atleast_1d(np.asarray(a, dtype=np.float32))[:, None, None]
                                          for a in (x0, y0, angle, bend, length, width))
    if x0.size == 0:
        return np.zeros((size, size), np.float32)
    x, y = _grid(size)
    dx, dy = x[None] - x0, y[None] - y0
    along = dx * np.cos(angle) + dy * np.sin(angle)
    normal = -dx * np.sin(angle) + dy * np.cos(angle) - bend * along ** 2
    inside = _sigmoid(along / 0.02) * _sigmoid((length - along) / 0.02)
    return (np.exp(-(normal / width) ** 2) * inside).max(axis=0)


def _ellipse(x, y, cx, cy, ax, ay, edge):
    """Soft ellipse mask and its normalised radius (1 on the boundary)."""
    r = np.sqrt(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2)
    return _sigmoid((1 - r) / edge), r


def _to_uint8(image) -> np.ndarray:
    return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)


def _exact_labels(rng, counts: np.ndarray, n: int) -> np.ndarray:
    """n class labels with the proportions of ``counts`` (largest remainder), each class >= MIN_PER_CLASS
    when n allows it [ours], in a seeded random order."""
    floor = min(MIN_PER_CLASS, n // (2 * len(counts)))
    share = counts / counts.sum() * n
    low = share < floor
    share[low] = floor
    share[~low] *= (n - floor * low.sum()) / share[~low].sum()
    k = np.floor(share).astype(int)
    k[np.argsort(-(share - k), kind="stable")[: n - k.sum()]] += 1
    return rng.permutation(np.repeat(np.arange(len(counts)), k))


def _image_rng(seed: int, dataset: str, index: int, stream: int = 0) -> np.random.Generator:
    """The generator of item ``index`` (-1: the dataset-level draws), independent of every other item."""
    return np.random.default_rng([seed, DATASET_CODES[dataset], stream, index + 1])


# ----------------------------------------------------------------------------------- dermoscopy
# Per class: core colour, secondary colour, variegation, shape irregularity, border width, texture, size.
_DERM = {
    0: ((0.32, 0.20, 0.15), (0.18, 0.17, 0.26), 0.55, 0.22, 0.10, 0.20, 0.42),  # MEL
    1: ((0.48, 0.32, 0.22), (0.38, 0.25, 0.18), 0.20, 0.08, 0.05, 0.10, 0.33),  # NV
    2: ((0.72, 0.50, 0.50), (0.85, 0.72, 0.72), 0.35, 0.14, 0.08, 0.12, 0.36),  # BCC
    3: ((0.74, 0.46, 0.42), (0.88, 0.80, 0.75), 0.35, 0.16, 0.14, 0.30, 0.34),  # AK
    4: ((0.58, 0.43, 0.30), (0.42, 0.30, 0.22), 0.30, 0.12, 0.04, 0.30, 0.38),  # BKL
    5: ((0.55, 0.40, 0.30), (0.85, 0.78, 0.72), 0.25, 0.06, 0.10, 0.10, 0.25),  # DF
    6: ((0.62, 0.18, 0.25), (0.40, 0.08, 0.18), 0.35, 0.09, 0.04, 0.10, 0.28),  # VASC
    7: ((0.76, 0.48, 0.42), (0.90, 0.85, 0.70), 0.40, 0.18, 0.10, 0.25, 0.36),  # SCC
}
# Odds of dermoscopic structures per class: veil, network, vessels, scale, dots, white centre, lacunae.
_DERM_STRUCTURES = np.array([
    [.50, .30, .10, .05, .40, .10, .05],
    [.05, .60, .05, .02, .20, .05, .02],
    [.10, .02, .70, .10, .20, .20, .10],
    [.02, .05, .20, .60, .10, .10, .02],
    [.05, .15, .05, .30, .60, .05, .02],
    [.02, .30, .05, .05, .05, .70, .02],
    [.05, .00, .10, .02, .05, .02, .80],
    [.05, .02, .40, .50, .10, .50, .05],
])
_DERM_LOOKALIKE = {0: (1, 4), 1: (0, 4, 5), 2: (3, 6, 7), 3: (2, 7), 4: (0, 1), 5: (1, 4), 6: (2, 0), 7: (3, 2)}


def _lesion(label: int, rng) -> dict:
    """The properties of one lesion (shared by all its images)."""
    colour_class = rng.choice(_DERM_LOOKALIKE[label]) if rng.random() < COLOUR_LOOKALIKE else label
    _, _, varieg, irregular, border, texture, radius = _DERM[label]
    core, second = np.asarray(_DERM[colour_class][0]), np.asarray(_DERM[colour_class][1])
    shade = rng.normal(0, 0.06)
    return dict(
        core=np.clip(core + shade + rng.normal(0, 0.05, 3), 0.05, 0.95),
        second=np.clip(second + shade + rng.normal(0, 0.05, 3), 0.05, 0.95),
        variegation=varieg * rng.lognormal(0, 0.35), texture=texture * rng.lognormal(0, 0.35),
        border=border * rng.lognormal(0, 0.3), radius=radius * rng.lognormal(0, 0.2),
        harmonics=irregular * rng.lognormal(0, 0.35) * rng.standard_normal(5) / np.sqrt(np.arange(1, 6)),
        phases=rng.uniform(0, 2 * np.pi, 5), aspect=rng.lognormal(0, 0.12),
        structures=rng.random(7) < _DERM_STRUCTURES[label], seed=int(rng.integers(2**31)),
    )


def render_dermoscopy(lesion: dict, rng, size: int) -> np.ndarray:
    """One dermoscopy-like RGB image (float in [0, 1]) of ``lesion`` under fresh nuisance from ``rng``."""
    x, y = _grid(size)
    own = np.random.default_rng(lesion["seed"])  # the lesion's own texture, the same in all its images
    skin = np.array([0.93, 0.78, 0.68]) * (1 - rng.beta(2, 5)) + np.array([0.50, 0.34, 0.25]) * rng.beta(2, 5)
    image = skin.astype(np.float32)[:, None, None] * (1 + 0.04 * _smooth_noise(rng, size, 6))[None]

    rot, scale = rng.uniform(0, 2 * np.pi), rng.lognormal(0, 0.1)
    cx, cy = rng.normal(0, 0.12, 2)
    dx, dy = x - cx, y - cy
    u = (dx * np.cos(rot) + dy * np.sin(rot)) / lesion["aspect"]
    v = (-dx * np.sin(rot) + dy * np.cos(rot)) * lesion["aspect"]
    theta, rho = np.arctan2(v, u), np.sqrt(u ** 2 + v ** 2)
    k = np.arange(1, 6, dtype=np.float32)[:, None, None]
    boundary = lesion["radius"] * scale * (1 + (lesion["harmonics"][:, None, None]
                                               * np.cos(k * theta[None] + lesion["phases"][:, None, None])).sum(0))
    inside = _sigmoid((np.maximum(boundary, 0.05) - rho) / max(lesion["border"] * lesion["radius"], 0.004))

    mix = np.clip(0.5 + lesion["variegation"] * _smooth_noise(own, size, 5), 0, 1)
    colour = lesion["core"][:, None, None] * (1 - mix) + lesion["second"][:, None, None] * mix
    colour = colour * (1 + lesion["texture"] * 0.5 * _smooth_noise(own, size, max(size // 6, 4)))[None]
    veil, network, vessels, scale_, dots, white, lacunae = lesion["structures"]
    r0 = lesion["radius"] * scale
    if network:
        colour = colour * (1 - 0.12 * (np.cos(u * 60) * np.cos(v * 60) > 0.3))[None]
    if veil:
        colour = colour + (_blobs(size, cx, cy, 0.5 * r0, 0.6)[None] * (np.array([0.45, 0.5, 0.65])[:, None, None] - colour))
    if white:
        colour = colour + (_blobs(size, cx, cy, 0.35 * r0, 0.8)[None] * (np.array([0.9, 0.85, 0.8])[:, None, None] - colour))
    if lacunae:
        m = own.integers(4, 10)
        colour = colour * (1 - _blobs(size, cx + own.normal(0, r0 / 2, m), cy + own.normal(0, r0 / 2, m), r0 / 7, 0.5))[None]
    if dots:
        m = own.integers(5, 15)
        colour = colour * (1 - _blobs(size, cx + own.normal(0, r0 / 1.8, m), cy + own.normal(0, r0 / 1.8, m), 0.03, 0.6))[None]
    if scale_:
        flakes = (_smooth_noise(own, size, max(size // 4, 4)) > 1.0).astype(np.float32) * 0.6
        colour = colour + flakes[None] * (0.92 - colour)
    image = image * (1 - inside)[None] + colour * inside[None]
    if vessels:
        m = own.integers(2, 5)
        lines = _curves(size, cx + own.normal(0, r0 / 2, m), cy + own.normal(0, r0 / 2, m), own.uniform(0, 6.3, m),
                        own.normal(0, 3, m), r0 * 0.9, 0.015) * inside
        image = image + lines[None] * (np.array([0.75, 0.15, 0.2])[:, None, None] - image)

    if rng.random() < 0.45:  # hair
        m = rng.integers(1, 8)
        hair = _curves(size, rng.uniform(-1, 1, m), rng.uniform(-1, 1, m), rng.uniform(0, 6.3, m),
                       rng.normal(0, 0.8, m), rng.uniform(0.6, 2.5, m), rng.uniform(0.008, 0.02, m))
        image = image * (1 - 0.85 * hair)[None] + 0.12 * hair[None]
    gx, gy = rng.normal(0, 0.12, 2)
    image = image * (1 + gx * x + gy * y)[None] * rng.lognormal(0, 0.08, 3)[:, None, None]
    if rng.random() < 0.5:  # dermoscope vignette
        image = image * _sigmoid((rng.uniform(1.05, 1.4) - np.sqrt(x ** 2 + y ** 2)) / 0.05)[None]
    image = image + 0.02 * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(image.transpose(1, 2, 0), 0, 1)


# ----------------------------------------------------------------------------------- fundus
# Poisson means per DR grade 0..4: microaneurysms, haemorrhages, hard exudates, cotton-wool spots.
_FUNDUS_LAMBDA = np.array([[0.5, 0.1, 0.2, 0.0], [5, 0.8, 0.5, 0.0], [9, 4, 6, 0.8], [12, 14, 8, 2.5], [12, 10, 7, 2.5]])
_NEOVASCULAR_P = (0.0, 0.0, 0.02, 0.1, 0.8)
_VITREOUS_HAEMORRHAGE_P = (0.0, 0.0, 0.0, 0.02, 0.35)


def render_fundus(grade: int, rng, size: int) -> np.ndarray:
    """One fundus-like RGB image (float in [0, 1]) of DR ``grade``."""
    x, y = _grid(size)
    side = rng.choice([-1, 1])
    cx, cy, radius = rng.normal(0, 0.03), rng.normal(0, 0.03), rng.uniform(0.82, 0.98)
    disc = _sigmoid((radius - np.sqrt((x - cx) ** 2 + (y - cy) ** 2)) / 0.01)
    if rng.random() < 0.3:  # cropped top and bottom, as many APTOS photographs are
        crop = rng.uniform(0.7, 0.9)
        disc = disc * _sigmoid((crop - np.abs(y - cy)) / 0.01)
    base = (np.array([0.78, 0.36, 0.16]) * rng.lognormal(0, 0.12, 3) * rng.lognormal(0, 0.2)).astype(np.float32)
    falloff = 1 - 0.4 * ((x - cx) ** 2 + (y - cy) ** 2) / radius ** 2
    image = base[:, None, None] * (falloff * (1 + 0.06 * _smooth_noise(rng, size, 8)))[None]

    odx, ody = cx + side * 0.38 * radius, cy + rng.normal(0, 0.05)
    vessels = _curves(size, np.full(6, odx), np.full(6, ody), np.where(np.arange(6) < 3, np.pi * (side > 0), np.pi * (side < 0))
                      + rng.normal(0, 0.5, 6), rng.normal(0, 1.2, 6), rng.uniform(0.6, 1.3, 6), rng.uniform(0.012, 0.022, 6))
    image = image * (1 - 0.35 * vessels)[None]
    image = image + _blobs(size, odx, ody, 0.07 * radius, 1.0)[None] * (np.array([0.98, 0.9, 0.6])[:, None, None] - image)
    image = image * (1 - _blobs(size, cx - side * 0.05, cy, 0.12 * radius, 0.35))[None]

    load = rng.lognormal(0, 0.35)
    n_ma, n_h, n_ex, n_cws = rng.poisson(_FUNDUS_LAMBDA[grade] * load)

    def spots(n, r_lo, r_hi, spread=0.65):
        ang, dist = rng.uniform(0, 2 * np.pi, n), radius * spread * np.sqrt(rng.random(n))
        return cx + dist * np.cos(ang), cy + dist * np.sin(ang), rng.uniform(r_lo, r_hi, n) * radius

    dark = _blobs(size, *spots(n_ma, 0.02, 0.035), 0.9) + _blobs(size, *spots(n_h, 0.04, 0.08), 0.8)
    image = image * (1 - np.clip(dark, 0, 0.85))[None] + np.clip(dark, 0, 1)[None] * np.array([0.18, 0.02, 0.02])[:, None, None]
    bright = np.clip(_blobs(size, *spots(n_ex, 0.02, 0.04, 0.45), 1.0), 0, 1)
    image = image + bright[None] * (np.array([0.95, 0.85, 0.35])[:, None, None] - image)
    cws = np.clip(_blobs(size, *spots(n_cws, 0.04, 0.07, 0.5), 0.7), 0, 1)
    image = image + cws[None] * (np.array([0.9, 0.8, 0.7])[:, None, None] - image)
    if rng.random() < _NEOVASCULAR_P[grade]:
        m = rng.integers(4, 9)
        nv = _curves(size, odx + rng.normal(0, 0.08, m), ody + rng.normal(0, 0.08, m), rng.uniform(0, 6.3, m),
                     rng.normal(0, 6, m), rng.uniform(0.1, 0.25, m), 0.008)
        image = image * (1 - 0.5 * nv)[None] + nv[None] * np.array([0.5, 0.05, 0.05])[:, None, None]
    if rng.random() < _VITREOUS_HAEMORRHAGE_P[grade]:
        image = image * (1 - _blobs(size, *spots(1, 0.25, 0.45, 0.4), 0.6))[None]

    image = gaussian_filter(image, sigma=(0, rng.uniform(0, 1.2) * size / 96, rng.uniform(0, 1.2) * size / 96))
    image = image * disc[None] * np.float32(rng.lognormal(0, 0.15)) + 0.015 * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(image.transpose(1, 2, 0), 0, 1)


# ----------------------------------------------------------------------------------- chest X-ray
# Label indices in CheXpert's order.
(NO_FINDING, ENLARGED_CM, CARDIOMEGALY, LUNG_OPACITY, LUNG_LESION, EDEMA, CONSOLIDATION, PNEUMONIA,
 ATELECTASIS, PNEUMOTHORAX, EFFUSION, PLEURAL_OTHER, FRACTURE, SUPPORT_DEVICES) = range(14)
# Share of -1 among all rows per label (close to CheXpert's train.csv).
_UNCERTAIN_RATE = np.array([0, .056, .036, .025, .006, .058, .125, .084, .15, .015, .05, .01, .003, .005])

# Support devices as strokes in body coordinates: start x, start y, angle, bend, length, width.
_DEVICES = {
    "endotracheal tube": (0.0, -1.0, np.pi / 2, 0.0, 0.85, 0.010),
    "nasogastric tube": (-0.05, -1.0, np.pi / 2 + 0.05, 0.3, 1.9, 0.012),
    "central line": (-0.5, -0.6, 0.9, 0.8, 0.7, 0.010),
    "pacemaker lead": (0.45, -0.55, 2.2, 1.0, 0.6, 0.008),
}
_DEVICE_P = np.array([0.5, 0.4, 0.4, 0.25])

# Acquisition of each hospital: intensity curve, gamma, noise, blur, field scale, collimation, marker corner.
HOSPITALS = {
    "chexpert": dict(curve="linear", gamma=1.0, noise=0.012, blur=0.0, scale=1.0, collimation=0.0, marker=(-0.8, -0.8), ap=0.7),
    "mimic": dict(curve="sigmoid", gamma=0.7, noise=0.035, blur=0.7, scale=0.84, collimation=0.12, marker=(0.75, -0.85), ap=0.55),
}


def cxr_findings(rng, n: int) -> np.ndarray:
    """Severities (n, 14) in [0, 1] (0: absent) from a generator with shared latent causes.

    Heart failure raises cardiomegaly, oedema and effusion; infection raises consolidation and
    pneumonia; a lung opacity accompanies most parenchymal findings; No Finding is 1 exactly when
    nothing but a support device is present. Labels with fewer than :data:`MIN_PER_CLASS` positives
    are topped up at random rows when n allows it [ours, for tiny worlds].
    """
    heart_failure, infection = rng.random(n) < 0.3, rng.random(n) < 0.15
    p = np.zeros((n, 14))
    p[:, CARDIOMEGALY] = np.where(heart_failure, 0.35, 0.07)
    p[:, EDEMA] = np.where(heart_failure, 0.6, 0.08)
    p[:, EFFUSION] = np.where(heart_failure, 0.6, 0.22)
    p[:, CONSOLIDATION] = np.where(infection, 0.4, 0.03)
    p[:, PNEUMONIA] = np.where(infection, 0.35, 0.01)
    p[:, [LUNG_LESION, PNEUMOTHORAX, PLEURAL_OTHER, FRACTURE]] = [0.05, 0.09, 0.03, 0.05]
    present = rng.random((n, 14)) < p
    present[:, ENLARGED_CM] = rng.random(n) < np.where(present[:, CARDIOMEGALY], 0.15, 0.04)
    present[:, ATELECTASIS] = rng.random(n) < np.where(present[:, EFFUSION], 0.3, 0.15)
    present[:, SUPPORT_DEVICES] = rng.random(n) < np.where(heart_failure | present[:, PNEUMOTHORAX], 0.7, 0.45)
    parenchymal = present[:, [LUNG_LESION, EDEMA, CONSOLIDATION, PNEUMONIA, ATELECTASIS]].any(axis=1)
    present[:, LUNG_OPACITY] = np.where(parenchymal, rng.random(n) < 0.85, rng.random(n) < 0.08)
    floor = min(MIN_PER_CLASS, n // 10)
    for label in range(1, 14):
        missing = floor - present[:, label].sum()
        if missing > 0:
            present[rng.choice(np.flatnonzero(~present[:, label]), missing, replace=False), label] = True
    present[:, NO_FINDING] = ~present[:, 1:SUPPORT_DEVICES].any(axis=1)
    return np.where(present, rng.uniform(0.25, 1.0, (n, 14)), 0.0)


def cxr_csv_labels(rng, severity: np.ndarray, *, uncertain: bool = True) -> np.ndarray:
    """The strings a labeller writes: ``1.0``, ``0.0``, blank, or ``-1.0`` (uncertain; borderline findings
    are more often uncertain). With ``uncertain=False`` (CheXpert's valid.csv) only 1.0 / 0.0."""
    present = severity > 0
    if not uncertain:
        return np.where(present, "1.0", "0.0")
    prevalence = present.mean(axis=0).clip(0.02, 0.98)
    p_pos = np.minimum(0.9, _UNCERTAIN_RATE / prevalence * 0.5 * 2 * (1 - severity))
    p_neg = 0.5 * _UNCERTAIN_RATE / (1 - prevalence)
    is_uncertain = rng.random(severity.shape) < np.where(present, p_pos, p_neg)
    out = np.where(present, "1.0", np.where(rng.random(severity.shape) < 0.1, "0.0", ""))
    out[:, NO_FINDING] = np.where(present[:, NO_FINDING], "1.0", "")
    return np.where(is_uncertain & (np.arange(14) != NO_FINDING), "-1.0", out)


def cxr_anatomy(rng) -> dict:
    """A patient's build, shared by all their images."""
    return dict(body=rng.normal(0.86, 0.04), lung_x=rng.normal(0.36, 0.02), lung_w=rng.normal(0.27, 0.02),
                lung_h=rng.normal(0.55, 0.04), ctr=rng.normal(0.44, 0.035), seed=int(rng.integers(2**31)))


def render_cxr(severity: np.ndarray, rng, size: int, *, hospital: str, anatomy: dict, view: str) -> np.ndarray:
    """One chest-radiograph-like grayscale image (float in [0, 1]); ``view`` is PA, AP or LATERAL."""
    acq = HOSPITALS[hospital]
    s = severity
    x, y = _grid(size)
    scale = acq["scale"] * rng.lognormal(0, 0.04)
    X, Y = (x - rng.normal(0, 0.03)) / scale, (y - rng.normal(0, 0.03)) / scale
    body, _ = _ellipse(X, Y, 0, 0.15, anatomy["body"], 1.25, 0.04)
    a = 0.08 + 0.4 * body
    if view == "LATERAL":
        a += 0.25 * _ellipse(X, Y, -0.2, 0.25, 0.25, 0.3, 0.1)[0] - 0.22 * _ellipse(X, Y, 0.05, -0.05, 0.45, 0.6, 0.08)[0]
        a += 0.15 * _sigmoid((0.06 - np.abs(X - 0.5)) / 0.02)
        return _acquire(a, rng, acq, x, y, size)

    own = np.random.default_rng(anatomy["seed"])
    magnify = 1.12 if view == "AP" else 1.0
    lungs, radii, sides = np.zeros_like(X), [], (-1, 1)
    atelectasis_side = rng.choice(sides)
    for side in sides:
        h = anatomy["lung_h"] * (1 - 0.15 * s[ATELECTASIS] * (side == atelectasis_side))
        m, r = _ellipse(X, Y, side * anatomy["lung_x"], -0.05 - (anatomy["lung_h"] - h), anatomy["lung_w"], h, 0.05)
        lungs, radii = np.maximum(lungs, m), radii + [(m, r)]
    heart_w = (anatomy["ctr"] + 0.16 * s[CARDIOMEGALY]) * magnify * (anatomy["lung_x"] + anatomy["lung_w"])
    heart, _ = _ellipse(X, Y, 0.06, 0.33, heart_w, 0.24, 0.08)
    mediastinum = _sigmoid(((0.1 + 0.1 * s[ENLARGED_CM]) * magnify - np.abs(X)) / 0.03) * _sigmoid((0.35 - Y) / 0.05)
    ribs = lungs * (np.cos(2 * np.pi * (Y + 0.35 * (np.abs(X) - 0.4) ** 2) * 5.5) > 0.55)
    markings = lungs * _smooth_noise(own, size, 14)

    ptx = np.zeros_like(X)
    if s[PNEUMOTHORAX]:
        m, r = radii[rng.integers(2)]
        ptx = m * _sigmoid((r - (1 - 0.4 * s[PNEUMOTHORAX])) / 0.03) * _sigmoid((0.15 - Y) / 0.05)
    a = a - 0.3 * lungs + 0.07 * ribs + 0.04 * markings * (1 - ptx) - 0.05 * ptx
    a = a + 0.3 * heart + 0.25 * mediastinum + 0.06 * _sigmoid((0.05 - np.abs(X)) / 0.01)
    if view == "AP":  # scapulae over the upper lungs
        a = a + 0.08 * (_ellipse(X, Y, -0.72, -0.45, 0.14, 0.3, 0.1)[0] + _ellipse(X, Y, 0.72, -0.45, 0.14, 0.3, 0.1)[0])

    for side, (m, r) in zip(sides, radii):
        if s[EFFUSION] and (rng.random() < 0.7 or side == 1):
            level = -0.05 + anatomy["lung_h"] * (1 - 1.3 * s[EFFUSION]) - 0.12 * s[EFFUSION] * np.abs(X - side * anatomy["lung_x"]) / anatomy["lung_w"]
            a = a + 0.12 * (0.5 + s[EFFUSION]) * m * _sigmoid((Y - level) / 0.03)
        if s[PLEURAL_OTHER] and side == atelectasis_side:
            a = a + 0.2 * s[PLEURAL_OTHER] * m * _sigmoid((r - 0.85) / 0.04) * (side * X > side * anatomy["lung_x"])
    if s[EDEMA]:
        a = a + 0.2 * s[EDEMA] * lungs * np.exp(-((np.abs(X) - 0.2) ** 2 + (Y - 0.1) ** 2) / (2 * 0.2 ** 2))
        a = a + 0.05 * s[EDEMA] * lungs * (np.cos(Y * 90) > 0.8) * (np.abs(X) > 0.45)
    patches = [(CONSOLIDATION, 1, 0.14, 0.32), (PNEUMONIA, 4, 0.06, 0.18), (LUNG_OPACITY, 1, 0.12, 0.12)]
    for label, count, radius, amp in patches:
        if s[label]:
            centre_x = rng.choice([-1, 1], count) * anatomy["lung_x"] + rng.normal(0, 0.08, count)
            blob = _blobs(size, centre_x * scale, rng.uniform(-0.3, 0.35, count) * scale, radius * scale, 1.0)
            a = a + amp * s[label] * lungs * np.clip(blob * (1 + 0.5 * _smooth_noise(rng, size, 8)), 0, 1.2)
    if s[ATELECTASIS]:
        band = _curves(size, atelectasis_side * 0.15 * scale, rng.uniform(0.15, 0.3) * scale, 0, 0.3, 0.35 * scale, 0.03)
        a = a + 0.25 * s[ATELECTASIS] * band * lungs * (atelectasis_side * X > 0)
    if s[LUNG_LESION]:
        lx, ly = rng.choice([-1, 1]) * anatomy["lung_x"] + rng.normal(0, 0.08), rng.uniform(-0.4, 0.3)
        a = a + 0.3 * _sigmoid((rng.uniform(0.04, 0.08) - np.sqrt((X - lx) ** 2 + (Y - ly) ** 2)) / 0.01)
    if s[FRACTURE]:
        fx, fy = rng.choice([-1, 1]) * rng.uniform(0.45, 0.6), rng.uniform(-0.4, 0.2)
        a = a + 0.25 * _blobs(size, fx * scale, fy * scale, 0.025 * scale, 1.0) - 0.12 * _blobs(size, (fx + 0.03) * scale, fy * scale, 0.015 * scale, 1.0)
    if s[SUPPORT_DEVICES]:
        chosen = rng.random(len(_DEVICES)) < _DEVICE_P
        chosen[rng.integers(len(_DEVICES))] |= not chosen.any()
        x0, y0, angle, bend, length, width = np.array(list(_DEVICES.values()))[chosen].T
        a = a + 0.5 * _curves(size, x0 * scale, y0 * scale, angle, bend / scale, length * scale, width * scale)
        if chosen[list(_DEVICES).index("pacemaker lead")]:  # the generator box
            a = a + 0.6 * _sigmoid((0.05 - np.maximum(np.abs(X - 0.45) / 1.4, np.abs(Y + 0.55))) / 0.01)
    return _acquire(a, rng, acq, x, y, size)


def _acquire(a, rng, acq, x, y, size) -> np.ndarray:
    """The hospital's acquisition: intensity curve, gamma, blur, noise, collimation and a marker."""
    lo, hi = np.percentile(a, [1, 99.5])
    a = (a - lo) / max(hi - lo, 1e-3) * rng.lognormal(0, 0.06) + rng.normal(0, 0.03)
    if acq["curve"] == "sigmoid":
        a = _sigmoid((a - 0.45) * 6.0)
    a = np.clip(a, 0, 1) ** (acq["gamma"] * rng.lognormal(0, 0.08))
    if acq["blur"]:
        a = gaussian_filter(a, acq["blur"] * size / 96)
    a = a + acq["noise"] * rng.standard_normal(a.shape, dtype=np.float32)
    if acq["collimation"]:
        top, bottom, left, right = rng.uniform(0, acq["collimation"], 4) * 2
        a = a * ((y > -1 + top) & (y < 1 - bottom) & (x > -1 + left) & (x < 1 - right))
    if rng.random() < 0.85:
        mx, my = np.array(acq["marker"]) + rng.normal(0, 0.04, 2)
        bar = ((np.abs(x - mx) < 0.02) & (np.abs(y - my) < 0.08)) | ((np.abs(y - my - 0.06) < 0.02) & (x > mx) & (x < mx + 0.09))
        a = np.where(bar, 0.97, a)
    return np.clip(a, 0, 1)


def _recorded_label(rng, label: int, confusions) -> int:
    """The label a grader writes: ``label``, or at the :data:`LABEL_NOISE` rate one of ``confusions`` [ours]."""
    return int(rng.choice(confusions)) if rng.random() < LABEL_NOISE else label


# ----------------------------------------------------------------------------------- patients
# ISIC 2019's metadata vocabulary and shares (ISIC_2019_Training_Metadata.csv, 25,331 images).
ISIC_AGES = np.arange(0, 90, 5)
ISIC_AGE_COUNTS = np.array([54, 113, 142, 375, 388, 677, 1199, 1651, 2246, 2585, 2489, 2170, 2036, 2075, 2120,
                            1796, 1459, 1319], dtype=float)
ISIC_AGE_MISSING = 437 / 25331
ISIC_SITES = {"anterior torso": 6915, "lower extremity": 4990, "head/neck": 4587, "upper extremity": 2910,
              "posterior torso": 2787, "": 2631, "palms/soles": 398, "oral/genital": 59, "lateral torso": 54}
ISIC_SEXES = {"male": 13286, "female": 11661, "": 384}
# CheXpert's train.csv: 59 % Male; Age mean 60, SD 18, in 18..90 here [ours: a clipped normal].
CHEXPERT_MALE = 0.59
CHEXPERT_AGE = (60.0, 18.0, 18, 90)


def _shares(counts) -> tuple[list, np.ndarray]:
    keys = list(counts)
    values = np.array([counts[k] for k in keys], dtype=float)
    return keys, values / values.sum()


def _isic_patients(rng, n: int) -> tuple[np.ndarray, list, list]:
    """Age (NaN: missing), sex and anatomic site of ``n`` ISIC-like patients, with the release's shares."""
    age = rng.choice(ISIC_AGES, n, p=ISIC_AGE_COUNTS / ISIC_AGE_COUNTS.sum()).astype(float)
    age[rng.random(n) < ISIC_AGE_MISSING] = np.nan
    sexes, p_sex = _shares(ISIC_SEXES)
    sites, p_site = _shares(ISIC_SITES)
    return age, list(rng.choice(sexes, n, p=p_sex)), list(rng.choice(sites, n, p=p_site))


def _age_text(age: float) -> str:
    """``age_approx`` as the release writes it: ``55``, blank when unknown."""
    return "" if np.isnan(age) else str(int(age))


def _chexpert_patient(rng) -> tuple[str, int]:
    """Sex (``Male`` / ``Female``) and Age of one CheXpert-like patient."""
    mean, sd, low, high = CHEXPERT_AGE
    return ("Male" if rng.random() < CHEXPERT_MALE else "Female"), int(np.clip(round(rng.normal(mean, sd)), low, high))


def older_acquisition(image: np.ndarray, rng) -> np.ndarray:
    """The planted subgroup effect: an image of a patient aged >= :data:`OLDER_FROM`, acquired worse.

    Contrast is pulled toward the image mean by :data:`OLDER_CONTRAST` and Gaussian noise of SD
    :data:`OLDER_NOISE` is added [ours], so the same finding is harder to see and AUROC is lower on
    older patients. ``rng`` is the image's own subgroup stream, so the rest of the image is unchanged.
    """
    mean = image.mean(axis=(0, 1), keepdims=True)
    image = mean + OLDER_CONTRAST * (image - mean)
    return np.clip(image + OLDER_NOISE * rng.standard_normal(image.shape, dtype=np.float32), 0, 1)


# ----------------------------------------------------------------------------------- writers
def _gzip_csv(frame: pd.DataFrame, path: Path) -> None:
    """Write a ``.csv.gz`` with a fixed gzip header (mtime 0, no name), so its bytes are reproducible."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as f:
        f.write(frame.to_csv(index=False, lineterminator="\n").encode())
    path.write_bytes(buffer.getvalue())


def _csv(frame: pd.DataFrame, path: Path) -> None:
    path.write_text(frame.to_csv(index=False, lineterminator="\n"))


def _save(image: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pil = Image.fromarray(_to_uint8(image))
    if path.suffix == ".png":
        pil.save(path, format="PNG", optimize=False, compress_level=1)
    else:
        pil.save(path, format="JPEG", quality=JPEG_QUALITY)


def _write_isic(root: Path, n: int, size: int, seed: int, progress: bool) -> None:
    rng = _image_rng(seed, "isic2019", -1)
    labels = _exact_labels(rng, ISIC_COUNTS, n)
    # Lesions: 1-3 images (same class), a fifth without lesion id (then group = image id).
    lesion_of, lesions = [], []
    for i, label in enumerate(labels):
        if lesions and lesions[-1][1] == label and lesions[-1][2] < lesions[-1][3]:
            lesions[-1][2] += 1
        else:
            lesions.append([len(lesions), label, 1, rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1])])
        lesion_of.append(len(lesions) - 1)
    lesion_ids = [("" if rng.random() < 0.2 else f"{'HAM' if rng.random() < 0.6 else 'BCN'}_{1000 + k * 7:07d}")
                  for k in range(len(lesions))]
    numbers = np.cumsum(rng.integers(1, 9, n))
    image_ids = [f"ISIC_{num:07d}" + ("_downsampled" if rng.random() < 0.05 else "") for num in numbers]
    names = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK"]
    # The recorded diagnosis: per lesion, a look-alike class at the LABEL_NOISE rate (rendering uses the true one).
    noise = _image_rng(seed, "isic2019", -1, stream=NOISE_STREAM)
    recorded = np.array([_recorded_label(noise, int(lab), _DERM_LOOKALIKE[int(lab)]) for _, lab, _, _ in lesions])
    gt = pd.DataFrame(np.eye(9)[recorded[lesion_of]], columns=names)
    gt.insert(0, "image", image_ids)
    _csv(gt, root / "ISIC_2019_Training_GroundTruth.csv")
    # Patient metadata per lesion (a lesion is one patient's), in the release's columns and vocabulary.
    lesion_age, lesion_sex, lesion_site = _isic_patients(rng, len(lesions))
    meta = pd.DataFrame({"image": image_ids,
                         "age_approx": [_age_text(lesion_age[k]) for k in lesion_of],
                         "anatom_site_general": [lesion_site[k] for k in lesion_of],
                         "lesion_id": [lesion_ids[k] for k in lesion_of],
                         "sex": [lesion_sex[k] for k in lesion_of]})
    _csv(meta, root / "ISIC_2019_Training_Metadata.csv")
    lesion_params = [_lesion(int(lab), _image_rng(seed, "isic2019", k, stream=1)) for k, (_, lab, _, _) in enumerate(lesions)]
    for i in tqdm(range(n), desc="demo world: isic2019", disable=not progress):
        image = render_dermoscopy(lesion_params[lesion_of[i]], _image_rng(seed, "isic2019", i), size)
        if lesion_age[lesion_of[i]] >= OLDER_FROM:
            image = older_acquisition(image, _image_rng(seed, "isic2019", i, stream=SUBGROUP_STREAM))
        _save(image, root / "ISIC_2019_Training_Input" / f"{image_ids[i]}.jpg")


def _write_aptos(root: Path, n: int, size: int, seed: int, progress: bool) -> None:
    rng = _image_rng(seed, "aptos2019", -1)
    grades = _exact_labels(rng, APTOS_COUNTS, n)
    ids = [rng.bytes(6).hex() for _ in range(n)]
    noise = _image_rng(seed, "aptos2019", -1, stream=NOISE_STREAM)
    recorded = [_recorded_label(noise, int(g), [k for k in (g - 1, g + 1) if 0 <= k < len(APTOS_COUNTS)]) for g in grades]
    _csv(pd.DataFrame({"id_code": ids, "diagnosis": recorded}), root / "train.csv")
    for i in tqdm(range(n), desc="demo world: aptos2019", disable=not progress):
        _save(render_fundus(int(grades[i]), _image_rng(seed, "aptos2019", i), size), root / "train_images" / f"{ids[i]}.png")


def _studies(rng, n_frontal: int) -> np.ndarray:
    """Patient index of each study: 1-4 studies per patient (about 2.5 on average)."""
    per_patient = rng.choice([1, 2, 3, 4], size=n_frontal, p=[0.35, 0.25, 0.2, 0.2])
    return np.repeat(np.arange(n_frontal), per_patient)[:n_frontal]


def _write_chexpert(root: Path, n: int, size: int, seed: int, progress: bool) -> None:
    rng = _image_rng(seed, "chexpert", -1)
    patient = _studies(rng, n)
    severity = cxr_findings(rng, n)
    valid_patients = set(rng.choice(np.unique(patient), max(2, len(np.unique(patient)) // 20), replace=False))
    is_valid = np.isin(patient, list(valid_patients))
    labels = np.where(is_valid[:, None], cxr_csv_labels(rng, severity, uncertain=False), cxr_csv_labels(rng, severity))
    anatomy = {p: cxr_anatomy(_image_rng(seed, "chexpert", int(p), stream=2)) for p in np.unique(patient)}
    patients = {int(p): _chexpert_patient(_image_rng(seed, "chexpert", int(p), stream=PATIENT_STREAM))
                for p in np.unique(patient)}
    release = root / "CheXpert-v1.0-small"
    rows = {"train": [], "valid": []}
    study_no: dict[int, int] = {}
    for i in tqdm(range(n), desc="demo world: chexpert", disable=not progress):
        image_rng = _image_rng(seed, "chexpert", i)
        p = int(patient[i])
        study_no[p] = study_no.get(p, 0) + 1
        split = "valid" if is_valid[i] else "train"
        folder = f"{split}/patient{(64540 if is_valid[i] else 0) + p + 1:05d}/study{study_no[p]}"
        view = "AP" if image_rng.random() < HOSPITALS["chexpert"]["ap"] else "PA"
        views = [("view1_frontal", "Frontal", view)] + ([("view2_lateral", "Lateral", "")] if image_rng.random() < 0.17 else [])
        sex, age = patients[p]
        for name, frontal_lateral, ap_pa in views:
            image = render_cxr(severity[i], image_rng, size, hospital="chexpert", anatomy=anatomy[p], view=ap_pa or "LATERAL")
            if age >= OLDER_FROM:
                image = older_acquisition(image, _image_rng(seed, "chexpert", i, stream=SUBGROUP_STREAM))
            _save(image, release / folder / f"{name}.jpg")
            rows[split].append({"Path": f"CheXpert-v1.0-small/{folder}/{name}.jpg", "Sex": sex, "Age": age,
                                "Frontal/Lateral": frontal_lateral, "AP/PA": ap_pa,
                                **dict(zip(CHEXPERT_LABELS, labels[i]))})
    for split, records in rows.items():
        _csv(pd.DataFrame(records), release / f"{split}.csv")


def _write_mimic(root: Path, n: int, size: int, seed: int, progress: bool) -> None:
    rng = _image_rng(seed, "mimic_cxr", -1)
    n_studies = max(n * 3 // 4, 1)
    study_patient = _studies(rng, n_studies)
    image_study = np.sort(np.concatenate([np.arange(n_studies), rng.choice(n_studies, n - n_studies, replace=False)]))
    severity = cxr_findings(rng, n_studies)
    labels = cxr_csv_labels(rng, severity)
    subjects = 10000000 + np.cumsum(rng.integers(1, 3000, study_patient.max() + 1))
    study_ids = 50000000 + np.cumsum(rng.integers(1, 20000, n_studies))
    # [ours] most subjects are in the official test split, which is the transfer set of the demo world.
    subject_split = rng.choice(["test", "train", "validate"], len(subjects), p=[0.7, 0.25, 0.05])
    anatomy = {p: cxr_anatomy(_image_rng(seed, "mimic_cxr", int(p), stream=2)) for p in np.unique(study_patient)}
    meta, split = [], []
    for i in tqdm(range(n), desc="demo world: mimic_cxr", disable=not progress):
        image_rng = _image_rng(seed, "mimic_cxr", i)
        st = int(image_study[i])
        p = int(study_patient[st])
        subject, study = str(subjects[p]), str(study_ids[st])
        view = "AP" if image_rng.random() < HOSPITALS["mimic"]["ap"] else "PA"
        views = [view] + (["LATERAL"] if image_rng.random() < 0.3 else [])
        for v in views:
            dicom = "-".join(image_rng.bytes(4).hex() for _ in range(5))
            image = render_cxr(severity[st], image_rng, size, hospital="mimic", anatomy=anatomy[p], view=v)
            _save(image, root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}" / f"{dicom}.jpg")
            meta.append({"dicom_id": dicom, "subject_id": subject, "study_id": study,
                         "PerformedProcedureStepDescription": "CHEST (PORTABLE AP)" if v == "AP" else "CHEST (PA AND LAT)",
                         "ViewPosition": v, "Rows": size, "Columns": size, "StudyDate": 21800101 + st % 28,
                         "StudyTime": f"{image_rng.integers(0, 240000):06d}.000",
                         "ProcedureCodeSequence_CodeMeaning": "CHEST (PA AND LAT)",
                         "ViewCodeSequence_CodeMeaning": {"PA": "postero-anterior", "AP": "antero-posterior"}.get(v, "lateral"),
                         "PatientOrientationCodeSequence_CodeMeaning": "Erect"})
            split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject, "split": subject_split[p]})
    _gzip_csv(pd.DataFrame(meta), root / "mimic-cxr-2.0.0-metadata.csv.gz")
    _gzip_csv(pd.DataFrame(split), root / "mimic-cxr-2.0.0-split.csv.gz")
    chexpert = pd.DataFrame(labels, columns=CHEXPERT_LABELS)[sorted(CHEXPERT_LABELS)]  # MIMIC's csv is alphabetical
    chexpert.insert(0, "study_id", study_ids.astype(str))
    chexpert.insert(0, "subject_id", subjects[study_patient].astype(str))
    _gzip_csv(chexpert, root / "mimic-cxr-2.0.0-chexpert.csv.gz")


_WRITERS = {"isic2019": _write_isic, "aptos2019": _write_aptos, "chexpert": _write_chexpert, "mimic_cxr": _write_mimic}


def generate_demo_world(root, *, n_images: dict, image_size: int, seed: int, progress: bool = True) -> None:
    """Write the demo world into ``<root>/<dataset id>/``, in each release's real layout.

    Parameters
    ----------
    root : path
        The data root (a profile's ``data.root``); each dataset goes to its own sub-folder.
    n_images : dict
        Dataset id -> number of images (frontal images for the CXR sets); a profile's
        ``demo_world.n_images``. Only the datasets named are written.
    image_size : int
        Side of the square images, in pixels.
    seed : int
        The world's seed: the same seed gives the same bytes.
    progress : bool
        Show a progress bar per dataset.

    Notes
    -----
    Skipped when ``<root>/.demo_world.json`` records the same parameters and generator version; a
    world with other parameters (or an interrupted one) is replaced. Safe under concurrency (issue 26):
    one process at a time generates, holding the lock ``<root>/.demo_world.lock`` (another waits,
    saying so, then finds the world written); the datasets are written into ``<root>/.demo_world.writing/``
    and moved into place, and the marker is written last, atomically, so a killed generation leaves no
    world that looks complete.
    """
    root = Path(root)
    unknown = set(n_images) - set(_WRITERS)
    if unknown:
        raise ValueError(f"n_images names unknown datasets {sorted(unknown)} (known: {', '.join(_WRITERS)})")
    params = world_params(n_images=n_images, image_size=image_size, seed=seed)
    if _is_written(root, params):
        logger.info("demo world at %s is up to date", root)
        return
    root.mkdir(parents=True, exist_ok=True)
    with _generator_lock(root):
        if _is_written(root, params):  # another process wrote it while this one waited
            logger.info("demo world at %s is up to date", root)
            return
        partial = root / PARTIAL
        shutil.rmtree(partial, ignore_errors=True)  # left by a killed generation
        for name, n in params["n_images"].items():
            (partial / name).mkdir(parents=True)
            _WRITERS[name](partial / name, n, image_size, seed, progress)
        (root / MARKER).unlink(missing_ok=True)
        for name in _WRITERS:
            shutil.rmtree(root / name, ignore_errors=True)
        for name in params["n_images"]:
            (partial / name).rename(root / name)
        partial.rmdir()
        atomic_write(root / MARKER, json.dumps(params, indent=1, sort_keys=True).encode())
    logger.info("wrote the demo world to %s: %s", root, params["n_images"])


def _is_written(root: Path, params: dict) -> bool:
    """Whether ``root`` holds a complete demo world of ``params`` (its marker, written last, says so)."""
    marker = root / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == params


@contextmanager
def _generator_lock(root: Path):
    """Hold ``<root>/.demo_world.lock`` (an exclusive ``flock``, released when the process dies)."""
    import fcntl

    with open(root / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("another process is writing the demo world at %s; waiting for it", root)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_demo_world(profile, *, progress: bool = True) -> Path | None:
    """Write a profile's demo world if it is absent or stale; return its root (None for real data).

    This is what ``crsrepro demo-world`` and :func:`crsrepro.data.prepare_dataset` call.
    """
    if profile.data.source != "demo_world":
        return None
    root = profile.resolve_path(profile.data.root, key="data.root")
    world = profile.demo_world
    generate_demo_world(root, n_images=world.n_images, image_size=world.image_size, seed=world.seed,
                        progress=progress)
    return root


def world_params(*, n_images: dict, image_size: int, seed: int) -> dict:
    """What a demo world is generated from: the generator version and its parameters (the content of
    ``<root>/.demo_world.json``). Every demo image is a pure function of these, so they are the demo
    datasets' content key (:func:`crsrepro.data.content.dataset_content_key`)."""
    return {"version": DEMO_WORLD_VERSION, "seed": int(seed), "image_size": int(image_size),
            "n_images": {k: int(v) for k, v in sorted(n_images.items())}}


def sample_images(dataset: str, n: int, *, seed: int, image_size: int, hospital: str = "chexpert"):
    """Fresh images from the demo world's generators, for pretraining the demo's domain encoders.

    They come from a random stream that :func:`generate_demo_world` never uses, so a pretraining
    corpus never contains a benchmark image.

    Parameters
    ----------
    dataset : {"isic2019", "aptos2019", "chexpert", "mimic_cxr"}
        The modality; ``mimic_cxr`` is ``chexpert`` with ``hospital="mimic"``.
    n, seed, image_size : int
    hospital : {"chexpert", "mimic"}
        The acquisition of the CXR images.

    Returns
    -------
    images : list of numpy.ndarray
        uint8 (image_size, image_size, 3).
    labels : numpy.ndarray
        Class ints (n,) for isic2019/aptos2019; 0/1 floats (n, 14) in CheXpert's order for CXR.

    Examples
    --------
    >>> images, labels = sample_images("aptos2019", 2, seed=0, image_size=32)
    >>> images[0].shape, images[0].dtype, labels.shape
    ((32, 32, 3), dtype('uint8'), (2,))
    """
    if dataset == "mimic_cxr":
        dataset, hospital = "chexpert", "mimic"
    if dataset not in _WRITERS or hospital not in HOSPITALS:
        raise ValueError(f"unknown dataset {dataset!r} or hospital {hospital!r}")
    rng = _image_rng(seed, dataset, -1, stream=PRETRAIN_STREAM)
    rngs = [_image_rng(seed, dataset, i, stream=PRETRAIN_STREAM) for i in range(n)]
    if dataset == "isic2019":
        labels = _exact_labels(rng, ISIC_COUNTS, n)
        images = [render_dermoscopy(_lesion(int(lab), r), r, image_size) for lab, r in zip(labels, rngs)]
    elif dataset == "aptos2019":
        labels = _exact_labels(rng, APTOS_COUNTS, n)
        images = [render_fundus(int(lab), r, image_size) for lab, r in zip(labels, rngs)]
    else:
        severity = cxr_findings(rng, n)
        labels = (severity > 0).astype(float)
        images = [np.repeat(render_cxr(sev, r, image_size, hospital=hospital, anatomy=cxr_anatomy(r),
                                       view="AP" if r.random() < HOSPITALS[hospital]["ap"] else "PA")[..., None], 3, axis=2)
                  for sev, r in zip(severity, rngs)]
    return [_to_uint8(im) for im in images], labels
