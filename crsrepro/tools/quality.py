"""Image-quality statistics for a folder of images: ``crsrepro quality-check`` (DESIGN.md section 14).

The paper finds that image degradation distorts a model's probabilities before it moves its ranking
(paper, Results; DESIGN.md section 10), so a deployment team should watch the quality of its incoming
images. This module measures, per image, one statistic for each of the paper's five perturbations
(:mod:`crsrepro.extract.perturb`) **[ours: the statistics and their parameters]**. All are computed on the
luminance ``L`` in [0, 1] (PIL's ITU-R 601 ``"L"`` conversion) at the image's own resolution:

=================== ========================================================== ======================
statistic           definition                                                 moves under
=================== ========================================================== ======================
``laplacian_var``   variance of the 4-neighbour Laplacian of L (sharpness)      ``gaussian_blur``: down
``blockiness``      mean |horizontal and vertical step| across the 8x8 block    ``jpeg``: up
                    boundaries / the mean |step| inside the blocks (1 if none)
``rms_contrast``    standard deviation of L                                     ``contrast``: down
``noise_sigma``     Immerkaer's (1996) estimate of the noise's standard        ``rician_noise``: up
                    deviation on L: sqrt(pi / 2) / 6 x the mean |high-pass
                    residual| (a kernel blind to linear ramps); a mean,
                    not a median, because the residual of 8-bit images
                    takes few values and its median jumps between them
``field_of_view``   share of pixels brighter than :data:`BACKGROUND_LEVEL`      ``fov_crop``: up
                    after a 5x5 median filter, on a copy at most
                    :data:`FOV_SIDE` pixels wide (non-background share)
=================== ========================================================== ======================

The statistics are not independent (blur also lowers ``noise_sigma``, noise also raises
``laplacian_var`` and lifts a black background into the field of view); each is only the one most
sensitive to its perturbation.

Images are read as the loaders read them (:func:`crsrepro.data.read_image`): a 16-bit image is scaled
to 8 bits by its bit depth, not clipped to white. An image whose shorter side is below
:data:`crsrepro.data.common.MIN_IMAGE_SIDE` pixels is flagged ``small``, the size the loaders warn about.

Outliers: against a reference folder (the team's accepted images, or a reference dataset's images;
by default the folder itself), each statistic of each image gets the robust (modified) z-score of
Iglewicz and Hoaglin, ``0.6745 (x - median) / MAD`` over the reference, on the log scale for the two
scale-like statistics ``laplacian_var`` and ``noise_sigma`` (:data:`LOG_STATISTICS`). An image is
flagged for a statistic when ``|z|`` exceeds ``threshold`` (default :data:`Z_THRESHOLD` = 3.5, their
recommended cut-off). Where the MAD is 0 the mean absolute deviation times 1.2533 is used instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from scipy.ndimage import convolve, laplace, median_filter

from crsrepro.core.errors import CrsreproError, DataError
from crsrepro.data import read_image
from crsrepro.data.common import MIN_IMAGE_SIDE

logger = logging.getLogger(__name__)

STATISTICS = ("laplacian_var", "blockiness", "rms_contrast", "noise_sigma", "field_of_view")
#: Statistics scored on the log scale: they scale with the image's content by orders of magnitude.
LOG_STATISTICS = ("laplacian_var", "noise_sigma")
#: The perturbation of :mod:`crsrepro.extract.perturb` that each statistic tracks, and the direction it moves.
TRACKS = {"laplacian_var": ("gaussian_blur", "down"), "blockiness": ("jpeg", "up"),
          "rms_contrast": ("contrast", "down"), "noise_sigma": ("rician_noise", "up"),
          "field_of_view": ("fov_crop", "up")}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
#: The flag of an image smaller than :data:`crsrepro.data.common.MIN_IMAGE_SIDE` on its shorter side.
SMALL = "small"

#: The |robust z| beyond which a statistic is flagged (Iglewicz and Hoaglin 1993).
Z_THRESHOLD = 3.5
#: JPEG's block size.
BLOCK = 8
#: Luminance at or below which a pixel counts as background **[ours]**.
BACKGROUND_LEVEL = 0.04
#: Longest side of the copy the field of view is measured on **[ours]**.
FOV_SIDE = 256
#: Immerkaer's (1996) noise-estimation kernel: zero response to linear intensity ramps.
_NOISE_KERNEL = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=float)


class ImageQualityError(CrsreproError, ValueError):
    """A folder holds no images, or an image cannot be read (names the file)."""


def _blockiness(lum: np.ndarray) -> float:
    steps = []
    for axis in (0, 1):
        diff = np.abs(np.diff(lum, axis=axis))
        position = np.arange(diff.shape[axis]) % BLOCK == BLOCK - 1  # the step between pixel 8k+7 and 8k+8
        if position.any() and (~position).any():
            take = (lambda m: diff[m]) if axis == 0 else (lambda m: diff[:, m])
            steps.append((take(position).mean(), take(~position).mean()))
    if not steps:
        return 1.0
    boundary, interior = np.mean(steps, axis=0)
    return float(boundary / interior) if interior > 0 else 1.0


def image_statistics(image) -> dict:
    """The five quality statistics of one image (see the module docstring).

    Parameters
    ----------
    image : PIL.Image.Image or numpy.ndarray
        An 8-bit image of any mode (a file read by :func:`crsrepro.data.read_image`, which scales a
        16-bit one); an array is uint8 HxW or HxWx3.

    Returns
    -------
    dict[str, float]
        Keyed by :data:`STATISTICS`.

    Examples
    --------
    >>> flat = np.full((64, 64), 128, dtype=np.uint8)
    >>> {k: round(v, 3) for k, v in image_statistics(flat).items()}
    {'laplacian_var': 0.0, 'blockiness': 1.0, 'rms_contrast': 0.0, 'noise_sigma': 0.0, 'field_of_view': 1.0}
    """
    pil = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
    gray = pil.convert("L")
    lum = np.asarray(gray, dtype=np.float64) / 255.0
    residual = convolve(lum, _NOISE_KERNEL, mode="reflect")
    small = gray.copy()
    small.thumbnail((FOV_SIDE, FOV_SIDE), Image.BOX)
    small = median_filter(np.asarray(small, dtype=np.float64) / 255.0, size=5, mode="nearest")
    return {"laplacian_var": float(laplace(lum, mode="reflect").var()),
            "blockiness": _blockiness(lum),
            "rms_contrast": float(lum.std()),
            "noise_sigma": float(np.sqrt(np.pi / 2) * np.abs(residual).mean() / 6.0),
            "field_of_view": float((small > BACKGROUND_LEVEL).mean())}


def _scale(values: pd.DataFrame) -> pd.DataFrame:
    out = values.astype(float).copy()
    for name in set(LOG_STATISTICS) & set(out.columns):
        out[name] = np.log(np.maximum(out[name], 1e-12))
    return out


def robust_z(values: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Modified z-scores ``0.6745 (x - median) / MAD`` of ``values`` against ``reference``, per statistic.

    Both frames have one column per statistic; :data:`LOG_STATISTICS` are log-transformed first.
    A zero MAD falls back to 1.2533 x the mean absolute deviation; a reference without spread gives
    z = 0 where the value equals its median and +-inf elsewhere.

    Here the MAD is 0 and the mean absolute deviation 0.04 is used: z = 0.3 / (1.2533 x 0.04).

    >>> ref = pd.DataFrame({"rms_contrast": [0.1, 0.2, 0.3, 0.2, 0.2]})
    >>> robust_z(pd.DataFrame({"rms_contrast": [0.2, 0.5]}), ref)["rms_contrast"].round(2).tolist()
    [0.0, 5.98]
    """
    x, ref = _scale(values), _scale(reference)
    median = ref.median()
    mad = (ref - median).abs().median()
    fallback = 0.6745 * 1.2533 * (ref - median).abs().mean()  # z = (x - median) / (1.2533 mean deviation)
    scale = mad.where(mad > 1e-12 * (1 + median.abs()), fallback)  # a MAD at rounding level counts as 0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = 0.6745 * (x - median) / scale
    return z.where((x - median) != 0, 0.0)


def list_images(folder) -> list[Path]:
    """The image files under ``folder``, recursively, by suffix (:data:`IMAGE_SUFFIXES`), sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageQualityError(f"{folder}: not a folder")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ImageQualityError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in it or below it")
    return files


def folder_statistics(folder, *, skip_unreadable=False) -> tuple[pd.DataFrame, list[Path]]:
    """:func:`image_statistics` of every image under ``folder``: ``(table, unreadable files)``.

    The table has ``file`` (relative to ``folder``), ``width``, ``height`` and :data:`STATISTICS`.
    Each image is read by :func:`crsrepro.data.read_image`, as the loaders read it. An unreadable
    image raises :class:`ImageQualityError` naming it, unless ``skip_unreadable``: then it is counted,
    logged and returned in the list.
    """
    folder = Path(folder)
    rows, unreadable = [], []
    for path in list_images(folder):
        try:
            pil = read_image(path)
        except DataError as exc:
            if not skip_unreadable:
                raise ImageQualityError(f"{path}: not a readable image ({str(exc).removeprefix(f'{path}: ')}); "
                                        f"pass --skip-unreadable to count and list such files instead") from None
            unreadable.append(path)
            continue
        rows.append({"file": str(path.relative_to(folder)), "width": pil.width, "height": pil.height,
                     **image_statistics(pil)})
    if unreadable:
        logger.warning("%s: skipped %d unreadable image(s): %s", folder, len(unreadable),
                       ", ".join(str(p) for p in unreadable))
    if not rows:
        raise ImageQualityError(f"{folder}: none of its {len(unreadable)} image file(s) could be read")
    return pd.DataFrame(rows), unreadable


@dataclass(frozen=True)
class QualityReport:
    """What ``crsrepro quality-check`` found; :meth:`lines` is what it prints.

    Attributes
    ----------
    folder, reference : Path
    table : DataFrame
        Per image: ``file, width, height``, the statistics, ``z_<statistic>`` and ``flagged`` (the
        flagged statistics joined by ``;``, then :data:`SMALL` for an image smaller than
        :data:`crsrepro.data.common.MIN_IMAGE_SIDE`; empty if none).
    reference_median : Series
        The reference's median per statistic.
    n_reference : int
    unreadable : list of Path
    threshold : float
    """

    folder: Path
    reference: Path
    table: pd.DataFrame
    reference_median: pd.Series
    n_reference: int
    unreadable: list
    threshold: float

    def flag_counts(self) -> pd.Series:
        """Images flagged per statistic, and :data:`SMALL`."""
        counts = {name: int((self.table[f"z_{name}"].abs() > self.threshold).sum()) for name in STATISTICS}
        return pd.Series({**counts, SMALL: int(self.table["flagged"].str.split(";").map(lambda f: SMALL in f).sum())})

    def lines(self, *, n_listed=10) -> list[str]:
        """The printed summary; at most ``n_listed`` flagged files are named."""
        n = len(self.table)
        against = "itself" if self.reference == self.folder else f"{self.reference} ({self.n_reference} images)"
        out = [f"{self.folder}: {n} images, against {against}; flagged where |robust z| > {self.threshold:g}"]
        if self.unreadable:
            out.append(f"skipped {len(self.unreadable)} unreadable: " + ", ".join(str(p) for p in self.unreadable))
        counts = self.flag_counts()
        out.append(f"  {'statistic':<14} {'tracks':<22} {'reference median':>16} {'median here':>12} "
                   f"{'median z':>9} {'flagged':>8}")
        for name in STATISTICS:
            perturbation, direction = TRACKS[name]
            out.append(f"  {name:<14} {perturbation + ' (' + direction + ')':<22} {self.reference_median[name]:>16.4g} "
                       f"{self.table[name].median():>12.4g} {self.table[f'z_{name}'].median() + 0.0:>9.2f} "
                       f"{counts[name]:>5}/{n}")
        out.append(f"  {SMALL:<14} {'a side < ' + str(MIN_IMAGE_SIDE) + ' px':<22} {'':>16} {'':>12} {'':>9} "
                   f"{counts[SMALL]:>5}/{n}")
        flagged = self.table[self.table["flagged"] != ""]
        out.append(f"{len(flagged)} of {n} images flagged" + (":" if len(flagged) else ""))
        for _, row in flagged.head(n_listed).iterrows():
            out.append(f"  {row['file']}: {row['flagged']}")
        if len(flagged) > n_listed:
            out.append(f"  ... and {len(flagged) - n_listed} more (see the report csv)")
        return out


def quality_check(images, *, reference=None, out=None, threshold=Z_THRESHOLD, skip_unreadable=False) -> QualityReport:
    """Quality statistics of a folder of images, with outliers flagged against a reference folder.

    Parameters
    ----------
    images : path
        A folder; images are found recursively.
    reference : path, optional
        A folder of reference images (default: ``images`` itself, which flags outliers within it).
    out : path, optional
        Where to write the per-image table as csv.
    threshold : float, default :data:`Z_THRESHOLD`
    skip_unreadable : bool, default False
        Count and list unreadable images instead of stopping at the first.

    Returns
    -------
    QualityReport
    """
    if not threshold > 0:
        raise ImageQualityError(f"threshold must be positive, got {threshold!r}")
    images = Path(images)
    table, unreadable = folder_statistics(images, skip_unreadable=skip_unreadable)
    reference = images if reference is None else Path(reference)
    ref_table = table if reference == images else folder_statistics(reference, skip_unreadable=skip_unreadable)[0]
    z = robust_z(table[list(STATISTICS)], ref_table[list(STATISTICS)])
    for name in STATISTICS:
        table[f"z_{name}"] = z[name]
    small = np.minimum(table["width"], table["height"]).to_numpy() < MIN_IMAGE_SIDE
    table["flagged"] = [";".join([name for name in STATISTICS if abs(row[name]) > threshold]
                                 + ([SMALL] if tiny else []))
                        for (_, row), tiny in zip(z.iterrows(), small)]
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
    return QualityReport(folder=images, reference=reference, table=table, n_reference=len(ref_table),
                         reference_median=ref_table[list(STATISTICS)].median(), unreadable=unreadable,
                         threshold=threshold)
