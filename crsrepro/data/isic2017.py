"""ISIC 2017 Part 3: melanoma, seborrheic keratosis and nevus in dermoscopic images (beyond the paper, DESIGN.md 3).

Release layout read here (the ISIC 2017 challenge downloads, Part 3, unpacked side by side)::

    <root>/ISIC-2017_Training_Part3_GroundTruth.csv   image_id, melanoma, seborrheic_keratosis (0/1)
    <root>/ISIC-2017_Training_Data_metadata.csv       image_id, age_approximate, sex
    <root>/ISIC-2017_Training_Data/<image_id>.jpg
    ... the same for ISIC-2017_Validation and ISIC-2017_Test_v2

A metadata csv may also sit inside its ``*_Data`` folder (as in the challenge zips); where a split has
none, its age and sex are unknown (logged). The subgroup columns (DESIGN.md section 14) are ``sex`` and
``age_group`` (from ``age_approximate``, :func:`~crsrepro.data.common.age_groups`); ISIC 2017 has no
anatomic site and no skin-tone labels. The two ground-truth columns are one-hot or both 0:
neither is a nevus, so there are three classes (:data:`LABEL_NAMES`). The three official splits are
read in the order Training, Validation, Test and kept in ``source_split`` (``train`` / ``validation``
/ ``test``). ISIC 2017 gives no lesion id, so each image is its own group.

The release holds byte-identical images under two ids (six pairs, four of them across splits); they
are detected by content hash and only the first copy in that order is kept [ours], so that no image
can be in train and test at once (:func:`~crsrepro.data.common.drop_byte_duplicates`; the dropped
ids are in ``attrs["duplicates"]``). Other files in the image folders (the ``*_superpixels.png`` of
Part 1/2) are not read.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.data.common import (UNKNOWN, check_rows, check_unique, drop_byte_duplicates, read_csv, select_images,
                                   subgroup_columns)
from crsrepro.core.errors import DataError

logger = logging.getLogger(__name__)

LABEL_NAMES = ["melanoma", "seborrheic_keratosis", "nevus"]
TASK = "multiclass"
SPLITS = {"train": "ISIC-2017_Training", "validation": "ISIC-2017_Validation", "test": "ISIC-2017_Test_v2"}


def _metadata(root: Path, prefix: str, image_ids: pd.Series, gt_path: Path) -> pd.DataFrame:
    """age_approx, sex and age_group for ``image_ids`` from the split's metadata csv (NaN / ``unknown``
    where it is absent)."""
    name = f"{prefix}_Data_metadata.csv"
    found = [p for p in (root / name, root / f"{prefix}_Data" / name) if p.is_file()]
    if not found:
        logger.info("%s: not found (nor in %s_Data/): age and sex of the %d images unknown", root / name, prefix, len(image_ids))
        return pd.DataFrame({"age_approx": np.nan, "sex": UNKNOWN, "age_group": UNKNOWN}, index=range(len(image_ids)))
    meta_path = found[0]
    meta = read_csv(meta_path, ["image_id"], "the ISIC 2017 metadata csv")
    check_unique(meta["image_id"], meta_path, "image_id")
    meta = meta.set_index("image_id")
    check_rows(image_ids.isin(meta.index), gt_path, lambda i: f"image {image_ids.iloc[i]} has no row in {meta_path}")
    meta = meta.loc[image_ids]
    age = meta.get("age_approximate", pd.Series(np.nan, index=meta.index))
    return pd.DataFrame({"age_approx": pd.to_numeric(age, errors="coerce").to_numpy(),  # "unknown" -> NaN
                         **subgroup_columns(meta, meta_path, sex="sex", age="age_approximate")})


def _load_split(root: Path, split: str, prefix: str, images: str) -> pd.DataFrame:
    gt_path = root / f"{prefix}_Part3_GroundTruth.csv"
    gt = read_csv(gt_path, ["image_id", "melanoma", "seborrheic_keratosis"], f"the ISIC 2017 {split} Part 3 ground truth")
    onehot = np.empty((len(gt), 2))
    for j, name in enumerate(LABEL_NAMES[:2]):
        values = pd.to_numeric(gt[name], errors="coerce")
        check_rows(values.isin([0.0, 1.0]), gt_path,
                   lambda i: f"column {name!r} has value {gt[name].iloc[i]!r} (expected 0 or 1)")
        onehot[:, j] = values
    check_rows(onehot.sum(axis=1) <= 1, gt_path,
               lambda i: f"image {gt['image_id'].iloc[i]} is both melanoma and seborrheic_keratosis")
    check_unique(gt["image_id"], gt_path, "image_id")
    label = np.where(onehot[:, 0] == 1, 0, np.where(onehot[:, 1] == 1, 1, 2))
    df = pd.DataFrame({
        "image_id": gt["image_id"].to_numpy(),
        "path": [str((root / f"{prefix}_Data" / f"{i}.jpg").absolute()) for i in gt["image_id"]],
        "group": gt["image_id"].to_numpy(),
        "label": label.astype(int),
        "source_split": split,
    })
    df = pd.concat([df, _metadata(root, prefix, gt["image_id"], gt_path)], axis=1)
    return df[select_images(df["path"], csv_path=gt_path, images=images)].reset_index(drop=True)


def load(root: Path, *, u_policy: str = "ignore", images: str = "all") -> pd.DataFrame:
    """Read ISIC 2017 Part 3 (all three official splits) from ``root``; ``u_policy`` is unused.

    Returns
    -------
    pandas.DataFrame
        image_id, path, group (= image_id), label (int, index into :data:`LABEL_NAMES`), source_split,
        age_approx, sex, age_group; one row per distinct image file (``attrs["duplicates"]``: dropped -> kept id).
    """
    df = pd.concat([_load_split(root, split, prefix, images) for split, prefix in SPLITS.items()], ignore_index=True)
    repeated = df["image_id"][df["image_id"].duplicated()]
    if len(repeated):
        splits = df.loc[df["image_id"] == repeated.iloc[0], "source_split"].tolist()
        raise DataError(f"{root}: image {repeated.iloc[0]} is listed in the ground truth of more than one split ({', '.join(splits)})")
    return drop_byte_duplicates(df, what=f"{root} (ISIC 2017)")
