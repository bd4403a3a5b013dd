"""The data layer: real loaders for the paper's datasets and three more public ones (DESIGN.md section 3).

The paper's four: ISIC 2019, APTOS 2019, CheXpert and MIMIC-CXR. Beyond the paper (DESIGN.md section 3): ISIC
2017 (:mod:`~crsrepro.data.isic2017`), NIH ChestX-ray14 (:mod:`~crsrepro.data.nih_cxr14`, a second
real hospital for CheXpert probes, through :mod:`~crsrepro.data.label_maps`) and Kermany's paediatric
chest radiographs (:mod:`~crsrepro.data.kermany_cxr`).

:func:`load_dataset` reads a release exactly as it is laid out on disk and returns one table per
dataset with the same columns for every dataset:

- ``image_id`` (str), ``path`` (absolute; the file exists), ``group`` (patient id, or lesion id for
  ISIC, so that no group crosses splits);
- ``label`` (int) for the multi-class sets, or one float column per label (1.0 / 0.0 / NaN when
  masked) for the multi-label sets, named as the release names them;
- ``source_split`` where the release defines one (CheXpert's train/valid, MIMIC's, ISIC 2017's and
  Kermany's official splits);
- ``df.attrs["task"]`` (``"multiclass"`` or ``"multilabel"``) and ``df.attrs["label_names"]`` (the
  release's column order); ``df.attrs["duplicates"]`` (dropped image_id -> kept image_id) for the
  releases that hold byte-identical copies of an image (ISIC 2017, Kermany).

:func:`prepare_dataset` adds what a run needs on top: it writes the demo world when the profile asks
for it, attaches the frozen split manifest (:mod:`crsrepro.data.manifests`), and selects MIMIC's
official test split as the transfer set. Bad input raises :class:`~crsrepro.core.errors.DataError` naming
the file and the row; what is left out on purpose is counted in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from crsrepro.data import aptos2019, chexpert, isic2017, isic2019, kermany_cxr, mimic_cxr, nih_cxr14
from crsrepro.core.errors import DataError
from crsrepro.core.vocab import IMAGE_POLICIES

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetSpec:
    """What the rest of the package needs to know about a dataset.

    Attributes
    ----------
    id : str
        The dataset id (``isic2019``, ``aptos2019``, ``chexpert``, ``mimic_cxr``, ``isic2017``,
        ``nih_cxr14``, ``kermany_cxr``).
    task : str
        ``multiclass`` or ``multilabel``.
    label_names : tuple of str
        The classes or labels, in the release's column order (with the loader's default options).
    trainable : bool
        False for a transfer-only dataset (MIMIC-CXR: probes are applied to it, never trained on it).
    loader : module
        The module whose ``load(root, *, u_policy, images, **options)`` reads the release.
    options : tuple of str
        The loader's own keyword options beyond ``u_policy`` and ``images`` (Kermany's ``n_classes``).
    """

    id: str
    task: str
    label_names: tuple[str, ...]
    trainable: bool
    loader: ModuleType
    options: tuple[str, ...] = ()


DATASETS: dict[str, DatasetSpec] = {
    spec.id: spec for spec in (
        DatasetSpec("isic2019", isic2019.TASK, tuple(isic2019.LABEL_NAMES), True, isic2019),
        DatasetSpec("aptos2019", aptos2019.TASK, tuple(aptos2019.LABEL_NAMES), True, aptos2019),
        DatasetSpec("chexpert", chexpert.TASK, tuple(chexpert.LABEL_NAMES), True, chexpert),
        DatasetSpec("mimic_cxr", mimic_cxr.TASK, tuple(mimic_cxr.LABEL_NAMES), False, mimic_cxr),
        DatasetSpec("isic2017", isic2017.TASK, tuple(isic2017.LABEL_NAMES), True, isic2017),
        DatasetSpec("nih_cxr14", nih_cxr14.TASK, tuple(nih_cxr14.LABEL_NAMES), True, nih_cxr14),
        DatasetSpec("kermany_cxr", kermany_cxr.TASK, tuple(kermany_cxr.LABEL_NAMES), True, kermany_cxr,
                    options=("n_classes",)),
    )
}


def get_dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of ``name``; an unknown name raises a ValueError listing the known ones."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    return DATASETS[name]


def label_matrix(df: pd.DataFrame) -> np.ndarray:
    """The labels of a loaded table: an int vector (multiclass) or a float (n, L) matrix with NaN (multilabel)."""
    if df.attrs["task"] == "multiclass":
        return df["label"].to_numpy(dtype=int)
    return df[list(df.attrs["label_names"])].to_numpy(dtype=float)


def load_dataset(name: str, root, *, u_policy: str = "ignore", images: str = "all", **options) -> pd.DataFrame:
    """Read one dataset from its release layout under ``root``.

    Parameters
    ----------
    name : str
        A dataset id (:data:`DATASETS`).
    root : path
        The folder that holds the release as downloaded (see each loader module for the layout).
    u_policy : {"ignore", "ones", "zeros"}
        CheXpert/MIMIC uncertain labels (-1): masked (NaN), set to 1, or set to 0 (DESIGN.md section 3,
        [ours], default ``ignore``). Unused for the other sets.
    images : {"all", "present-only"}
        ``all`` (default): every image the release lists must exist, else a DataError names the csv
        line. ``present-only`` [ours]: read the listed images that exist and count and log the rest,
        for a partial download (NIH ChestX-ray14's 12 archives). Unused by Kermany, whose images are
        found by listing its folders.
    **options
        The loader's own options (``DatasetSpec.options``), e.g. ``n_classes=2`` for ``kermany_cxr``.

    Returns
    -------
    pandas.DataFrame
        One row per image, in the release's order, with the columns described in the module docstring
        and ``attrs["task"]``, ``attrs["label_names"]``, ``attrs["dataset"]``, ``attrs["root"]``.

    Raises
    ------
    DataError
        A file or column is missing, a label value is unknown, an image file is missing, or nothing is
        left after filtering. The message names the file and the line.
    """
    spec = get_dataset_spec(name)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ValueError(f"dataset {name} has no option {', '.join(unknown)} (its options: {', '.join(spec.options) or 'none'})")
    if images not in IMAGE_POLICIES:
        raise ValueError(f"images must be one of {IMAGE_POLICIES}, got {images!r}")
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise DataError(f"{root}: folder not found (expected the {name} release here)")
    df = spec.loader.load(root, u_policy=u_policy, images=images, **options)
    if df.empty:  # every loader already checks its own files; this guards the contract
        raise DataError(f"{root}: no usable {name} images")
    # an option may change the classes (Kermany's n_classes=2); such a loader puts its label_names in attrs
    df.attrs.setdefault("label_names", list(spec.label_names))
    df.attrs.update(task=spec.task, dataset=name, root=str(root))
    logger.info("%s: %d images, %d groups from %s", name, len(df), df["group"].nunique(), root)
    return df


def read_image(path) -> Image.Image:
    """Open an image file as an RGB PIL image (grayscale radiographs are replicated to 3 channels).

    A 16-bit grayscale image (PIL modes ``I;16*`` and ``I``, as 16-bit PNG radiographs open) is scaled
    to 8 bits by its bit depth, ``value // 257`` [ours: no windowing], instead of PIL's clipping at
    255, which would turn it white. CMYK, palette and alpha images are converted by PIL.

    Raises
    ------
    DataError
        The file is missing, truncated or not an image; the message names the file.
    """
    try:
        with Image.open(path) as image:
            if image.mode.startswith("I"):
                pixels = np.clip(np.asarray(image, dtype=np.int64), 0, 65535) // 257
                return Image.fromarray(pixels.astype(np.uint8)).convert("RGB")
            return image.convert("RGB")
    except FileNotFoundError:
        raise DataError(f"{path}: image file not found") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"{path}: corrupt or unreadable image ({exc})") from None


def subsample_groups(df: pd.DataFrame, n_images: int) -> pd.DataFrame:
    """Whole groups (patients, lesions) in the order of the SHA-256 of their ids, until ``n_images``
    images are kept [ours: ``data.subsample``, for a small profile on a large release]. Deterministic
    and independent of the row order; the count kept and left out is logged."""
    import hashlib

    groups = df["group"].astype(str)
    order = sorted(groups.unique(), key=lambda g: hashlib.sha256(g.encode()).hexdigest())
    sizes = groups.value_counts()
    kept, total = [], 0
    for group in order:
        if total >= n_images:
            break
        kept.append(group)
        total += int(sizes[group])
    out = df[groups.isin(set(kept))]
    out.attrs = dict(df.attrs)
    logger.info("%s: data.subsample kept %d of %d images (%d of %d groups)", df.attrs.get("dataset"), len(out),
                len(df), len(kept), len(order))
    return out


def prepare_dataset(profile, name: str, *, manifest_dir=None, progress: bool = True) -> pd.DataFrame:
    """Load ``name`` as a run of ``profile`` needs it: with a ``split`` column, rows sorted by image_id.

    - With ``data.source: demo_world``, the demo world is written first if it is absent or stale
      (:func:`crsrepro.data.demo_world.generate_demo_world`, into the profile's ``data.root``).
    - A trainable dataset gets its frozen splits from the manifest
      ``<manifest_dir>/<dataset>[_<profile>].csv`` (created on first use; see
      :func:`crsrepro.data.manifests.load_or_create_manifest`): ``split`` is ``test`` or ``pool``, and
      ``seed_<s>`` is run seed s's ``train`` / ``val`` / ``test`` assignment.
    - MIMIC-CXR (transfer only) keeps its official ``test`` split, with ``split = "transfer"``.
    - ``data.subsample`` keeps whole groups of a dataset up to a number of images (:func:`subsample_groups`).

    Parameters
    ----------
    profile : crsrepro.profiles.Profile
    name : str
        A dataset id.
    manifest_dir : path, optional
        Default: :func:`crsrepro.core.io.manifest_dir`.
    progress : bool
        Show progress bars while the demo world is written.
    """
    from crsrepro.data.demo_world import ensure_demo_world
    from crsrepro.data.manifests import load_or_create_manifest

    spec = get_dataset_spec(name)
    ensure_demo_world(profile, progress=progress)
    df = load_dataset(name, profile.dataset_root(name), u_policy=profile.data.u_policy, images=profile.data.images)
    if name in profile.data.subsample:
        df = subsample_groups(df, profile.data.subsample[name])
    attrs = dict(df.attrs)
    if spec.trainable:
        from crsrepro.core.io import manifest_dir as default_manifest_dir
        manifest = load_or_create_manifest(df, dataset=name, manifests_name=profile.manifests.name,
                                           manifest_dir=default_manifest_dir(manifest_dir),
                                           seed=profile.data.split_seed, run_seeds=profile.seeds,
                                           fractions=profile.data.split_fractions)
        df = df.merge(manifest.drop(columns="group"), on="image_id", how="left", validate="one_to_one")
    else:
        test = df["source_split"] == "test"
        logger.info("%s: the transfer set is the official test split: %d of %d frontal images", name, int(test.sum()), len(df))
        if not test.any():
            raise DataError(f"{profile.dataset_root(name)}: no image in the official test split (the transfer set)")
        df = df[test].assign(split="transfer")
    df = df.sort_values("image_id", kind="stable").reset_index(drop=True)
    df.attrs = attrs
    return df
