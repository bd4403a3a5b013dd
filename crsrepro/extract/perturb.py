"""Test-image perturbations: five types at three severities (DESIGN.md section 6).

The paper degrades test images with Gaussian blur, JPEG compression, contrast reduction, Rician noise
and a field-of-view crop (:data:`crsrepro.core.vocab.PERTURBATIONS`), each at three severities. Its
parameters are not published; ours [ours] are defined on the image's **own** size, the canonical size
it is degraded at: a spatial parameter is a fraction of the image's short side, so a severity does the
same relative damage to a 96-px demo image and to a 512-px one, and an intensity parameter is per pixel
and free of the size (:func:`parameter_table` prints the table below from the constants):

=============== ================================================ ===============================
perturbation    severity 1 / 2 / 3                               unit
=============== ================================================ ===============================
gaussian_blur   sigma = 1/224, 3/224, 6/224 (pixel-integrated)   fraction of the short side
jpeg            quality = 50, 20, 5                              PIL JPEG quality
contrast        x -> mean + k (x - mean), k = 0.7, 0.5, 0.3      per-channel image mean
rician_noise    sigma = 0.02, 0.05, 0.1; y = sqrt((x+n1)^2+n2^2)  of the [0, 1] range
fov_crop        keep the central 0.9, 0.75, 0.6 of each side     then resize back (bicubic)
=============== ================================================ ===============================

The blur is ImageNet-C's (Hendrycks and Dietterich 2019) Gaussian blur at its severities 1, 3 and 5,
sigma = 1, 3 and 6 px at its 224-px images, as fractions of the short side: 0.43, 1.3 and 2.6 px at the
demo's 96 px, 2.3, 6.9 and 13.7 px at 512 px. (Version 1 scaled sigma = 1, 2, 4 px from a 512-px short
side, 0.75 px at severity 3 on a 96-px image: the demo's blur did almost nothing.) JPEG's 8 x 8 blocks
are the codec's, in pixels at any size.

Beyond the paper (:data:`EXTRA_PERTURBATIONS`, reported beside Rician and kept out of the
paper-faithful score): ``poisson_gaussian`` (photon and read noise, apt for radiographs) and
``sensor_noise`` (signal-dependent camera noise in linear light, apt for photographs):

=============== ================================================ ===============================
perturbation    severity 1 / 2 / 3                               unit
=============== ================================================ ===============================
poisson_gaussian photons at full scale = 200, 60, 20;             y = Poisson(x N) / N + n,
                read sigma = 0.01, 0.02, 0.04                    n ~ N(0, read^2), [0, 1] range
sensor_noise    shot gain a = 0.002, 0.008, 0.03;                variance a x + b^2 in linear
                read sigma b = 0.005, 0.01, 0.02                 light (x = sRGB^2.2)
=============== ================================================ ===============================

A profile selects one of them per dataset in ``noise_model`` (:mod:`crsrepro.profiles`).

The pairing rule: each test image is degraded **once**, at its dataset's canonical size, and every
encoder resizes that same degraded image. The random state of a degradation comes from SHA-256 of
(image id, perturbation, severity) [ours: the paper seeds from the image id], so an image gets the
same damage for every encoder and in any batch order.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
from PIL import Image
from scipy import special
from scipy.ndimage import convolve1d

from crsrepro.core.schema import Condition
from crsrepro.core.vocab import EXTRA_PERTURBATIONS, PERTURBATIONS, SEVERITIES

_KNOWN = PERTURBATIONS + EXTRA_PERTURBATIONS
#: Bumped whenever any perturbation's output bytes change: it keys the degraded-image cache
#: (:func:`crsrepro.extract.features.degraded_image_key`) and every perturbed feature array
#: (:func:`crsrepro.extract.features.feature_cache_inputs`), so nothing stale is read. 2: the blur's
#: sigma is a fraction of the image's own short side (ImageNet-C's severities 1, 3, 5).
PERTURBATION_VERSION = 2

# [ours] Parameters per severity 1, 2, 3 (DESIGN.md section 6; the module docstring says why).
BLUR_SIGMA_FRACTION = (1 / 224, 3 / 224, 6 / 224)
JPEG_QUALITY = (50, 20, 5)
CONTRAST_FACTOR = (0.7, 0.5, 0.3)
RICIAN_SIGMA = (0.02, 0.05, 0.10)
FOV_KEEP = (0.90, 0.75, 0.60)
# [ours] Beyond the paper: (photons at full scale, read-noise sigma) and (shot gain a, read sigma b)
# with noise variance a * x + b^2 in linear light.
POISSON_GAUSSIAN = ((200.0, 0.01), (60.0, 0.02), (20.0, 0.04))
SENSOR_NOISE = ((0.002, 0.005), (0.008, 0.01), (0.03, 0.02))
SRGB_GAMMA = 2.2
#: Every parameter above as :func:`parameter_table` shows it: (perturbation, parameter, unit, values at
#: severities 1, 2, 3, whether it is a fraction of the short side).
PARAMETERS = (
    ("gaussian_blur", "sigma (pixel-integrated kernel)", "fraction of the short side", BLUR_SIGMA_FRACTION, True),
    ("jpeg", "quality", "PIL JPEG quality", JPEG_QUALITY, False),
    ("contrast", "k in x -> mean + k (x - mean)", "per-channel image mean", CONTRAST_FACTOR, False),
    ("rician_noise", "sigma in y = sqrt((x+n1)^2 + n2^2)", "of the [0, 1] range", RICIAN_SIGMA, False),
    ("fov_crop", "central share kept, then resized back", "fraction of each side", FOV_KEEP, True),
    ("poisson_gaussian", "photons N at full scale", "count", tuple(n for n, _ in POISSON_GAUSSIAN), False),
    ("poisson_gaussian", "read-noise sigma", "of the [0, 1] range", tuple(r for _, r in POISSON_GAUSSIAN), False),
    ("sensor_noise", "shot gain a (variance a x + b^2)", "linear light", tuple(a for a, _ in SENSOR_NOISE), False),
    ("sensor_noise", "read sigma b", "linear light", tuple(b for _, b in SENSOR_NOISE), False),
)


def parameter_table(short_side: int | None = None, perturbations=_KNOWN):
    """How each perturbation's strength is set: one row per parameter, its values at severities 1, 2, 3
    read from the constants the perturbations apply (DESIGN.md section 6), and whether the paper has it.

    With ``short_side``, a spatial parameter (a fraction of the short side) is also given in pixels at
    that short side (a profile's canonical size, :func:`crsrepro.run.units.canonical_size`).

    >>> table = parameter_table(96, ["gaussian_blur", "jpeg"])
    >>> table[["severity 1", "severity 3", "px at 96"]].values.tolist()
    [['0.00446', '0.0268', '0.43 / 1.29 / 2.57'], ['50', '5', '-']]
    >>> bool(table["paper"].all())
    True
    """
    import pandas as pd

    rows = []
    for name, parameter, unit, values, spatial in PARAMETERS:
        if name not in perturbations:
            continue
        row = {"perturbation": name, "parameter": parameter, "unit": unit, "paper": name in PERTURBATIONS}
        row |= {f"severity {s}": f"{v:.3g}" for s, v in zip(SEVERITIES, values)}
        if short_side is not None:
            row[f"px at {short_side}"] = " / ".join(f"{v * short_side:.2f}" for v in values) if spatial else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def perturbation_rng(image_id: str, name: str, severity: int) -> np.random.Generator:
    """The random generator of one (image id, perturbation, severity): seeded by their SHA-256.

    >>> a = perturbation_rng("ISIC_0000000", "rician_noise", 2).random()
    >>> a == perturbation_rng("ISIC_0000000", "rician_noise", 2).random()
    True
    """
    digest = hashlib.sha256("\0".join((str(image_id), name, str(severity))).encode()).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))


def _to_unit(image: np.ndarray) -> np.ndarray:
    return image.astype(np.float64) / 255.0


def _from_unit(image: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)


def _pil_roundtrip(image: np.ndarray, operation) -> np.ndarray:
    """Apply a PIL operation to an HxW or HxWx3 uint8 array (HxWx1 is handled as HxW)."""
    single = image.ndim == 3 and image.shape[2] == 1
    out = np.asarray(operation(Image.fromarray(image[..., 0] if single else image)))
    return out[..., None] if single else out


def pixel_gaussian_kernel(sigma: float) -> np.ndarray:
    """A 1-D Gaussian integrated over each pixel's footprint [ours].

    Point-sampled kernels vanish for sigma below a pixel, which is where severity 1 lands at small
    canonical sizes (1/224 of a 96-px short side is 0.43 px); integrating over the pixel keeps the blur
    continuous in sigma and reduces to sampling for large sigma.

    >>> pixel_gaussian_kernel(0.2).round(3).tolist()
    [0.0, 0.006, 0.988, 0.006, 0.0]
    """
    radius = int(np.ceil(4 * sigma + 0.5))
    edges = (np.arange(-radius, radius + 2) - 0.5) / sigma
    return np.diff(special.ndtr(edges))


def _gaussian_blur(image, k, rng):
    kernel = pixel_gaussian_kernel(BLUR_SIGMA_FRACTION[k] * min(image.shape[:2]))
    x = _to_unit(image)
    for axis in (0, 1):
        x = convolve1d(x, kernel, axis=axis, mode="reflect")
    return _from_unit(x)


def _jpeg(image, k, rng):
    def compress(pil):
        buffer = io.BytesIO()
        pil.save(buffer, format="JPEG", quality=JPEG_QUALITY[k])
        return Image.open(io.BytesIO(buffer.getvalue())).convert(pil.mode)
    return _pil_roundtrip(image, compress)


def _contrast(image, k, rng):
    x = _to_unit(image)
    mean = x.mean(axis=(0, 1), keepdims=True)
    return _from_unit(mean + CONTRAST_FACTOR[k] * (x - mean))


def _rician_noise(image, k, rng):
    x, sigma = _to_unit(image), RICIAN_SIGMA[k]
    n1, n2 = rng.normal(0.0, sigma, (2, *x.shape))
    return _from_unit(np.sqrt((x + n1) ** 2 + n2 ** 2))


def _fov_crop(image, k, rng):
    h, w = image.shape[:2]
    ch, cw = max(1, round(h * FOV_KEEP[k])), max(1, round(w * FOV_KEEP[k]))
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = np.ascontiguousarray(image[top:top + ch, left:left + cw])
    return _pil_roundtrip(crop, lambda pil: pil.resize((w, h), Image.BICUBIC))


def _poisson_gaussian(image, k, rng):
    photons, read = POISSON_GAUSSIAN[k]
    x = _to_unit(image)
    return _from_unit(rng.poisson(x * photons) / photons + rng.normal(0.0, read, x.shape))


def _sensor_noise(image, k, rng):
    shot, read = SENSOR_NOISE[k]
    linear = _to_unit(image) ** SRGB_GAMMA
    noisy = linear + rng.standard_normal(linear.shape) * np.sqrt(shot * linear + read ** 2)
    return _from_unit(np.clip(noisy, 0, 1) ** (1 / SRGB_GAMMA))


_OPERATIONS = {"gaussian_blur": _gaussian_blur, "jpeg": _jpeg, "contrast": _contrast, "rician_noise": _rician_noise,
               "fov_crop": _fov_crop, "poisson_gaussian": _poisson_gaussian, "sensor_noise": _sensor_noise}


def perturb(image: np.ndarray, name: str, severity: int, image_id: str) -> np.ndarray:
    """Degrade one test image.

    Parameters
    ----------
    image : numpy.ndarray
        uint8, HxW or HxWxC (C = 1 or 3), at the dataset's canonical size.
    name : str
        One of :data:`crsrepro.core.vocab.PERTURBATIONS` or :data:`EXTRA_PERTURBATIONS`.
    severity : int
        1, 2 or 3; damage grows with severity.
    image_id : str
        Seeds the random state with ``name`` and ``severity`` (SHA-256), so every encoder sees the
        same degraded image.

    Returns
    -------
    numpy.ndarray
        A new uint8 array of the same shape.

    Examples
    --------
    >>> image = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (64, 1))
    >>> out = perturb(image, "contrast", 3, "img1")
    >>> out.shape, out.dtype, int(out.max()) < int(image.max())
    ((64, 64), dtype('uint8'), True)
    """
    if name not in _OPERATIONS:
        raise ValueError(f"unknown perturbation {name!r} (known: {', '.join(_KNOWN)})")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be 1, 2 or 3, got {severity!r}")
    image = np.asarray(image)
    if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3))):
        raise ValueError(f"image must be uint8 HxW or HxWxC with C in (1, 3), got {image.dtype} {image.shape}")
    return _OPERATIONS[name](image, severity - 1, perturbation_rng(image_id, name, severity))


def apply_condition(image: np.ndarray, condition: str, image_id: str) -> np.ndarray:
    """The image under a test condition: ``"clean"`` returns ``image`` itself, unchanged; a
    ``<perturbation>@<severity>`` (:class:`crsrepro.core.schema.Condition`, with the paper's
    perturbations or :data:`EXTRA_PERTURBATIONS`) is :func:`perturb`.

    Any other condition (a transfer set such as ``mimic_cxr``, a typo) raises a ValueError.
    """
    try:
        parsed = Condition.parse(condition)
    except ValueError:
        parsed = None
    if parsed is None or parsed.is_transfer:
        raise ValueError(f"bad condition {condition!r}: expected 'clean' or '<perturbation>@<1|2|3>' "
                         f"with a perturbation among {', '.join(_KNOWN)}")
    return image if parsed.is_clean else perturb(image, parsed.perturbation, parsed.severity, image_id)
