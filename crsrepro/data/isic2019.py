"""ISIC 2019 (training set): 8 diagnostic classes of dermoscopic images (DESIGN.md section 3).

Release layout read here (as downloaded from the ISIC archive)::

    <root>/ISIC_2019_Training_GroundTruth.csv   image, MEL, NV, BCC, AK, BKL, DF, VASC, SCC, UNK (one-hot)
    <root>/ISIC_2019_Training_Metadata.csv      image, age_approx, anatom_site_general, lesion_id, sex
    <root>/ISIC_2019_Training_Input/<image>.jpg

The ground truth is one-hot over nine columns; UNK is never used in the training set, so a row whose
label is UNK, or that is not exactly one-hot over the eight classes, is an error. Some image ids end in
``_downsampled``; they are ordinary ids. The group is the lesion id, so that images of one lesion stay
in one split; where the lesion id is blank, the group is the image's own id.

The subgroup columns (DESIGN.md section 14) come from the metadata csv: ``sex``, ``age_group`` (from
``age_approx``, :func:`~crsrepro.data.common.age_groups`) and ``site`` (``anatom_site_general``);
blanks, and columns the csv lacks, are ``unknown`` (counted in the log). ISIC 2019 has no skin-tone
(Fitzpatrick) labels, so the subgroup question that matters most for dermoscopy cannot be asked of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.data.common import check_rows, check_unique, read_csv, select_images, subgroup_columns

LABEL_NAMES = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"]
TASK = "multiclass"
GROUND_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
METADATA = "ISIC_2019_Training_Metadata.csv"
IMAGE_DIR = "ISIC_2019_Training_Input"


def load(root: Path, *, u_policy: str = "ignore", images: str = "all") -> pd.DataFrame:
    """Read ISIC 2019 from ``root``; ``u_policy`` is accepted for a uniform signature and unused.

    Returns
    -------
    pandas.DataFrame
        image_id, path, group (lesion id, or the image id where blank), label (int, index into
        :data:`LABEL_NAMES`), age_approx (years, NaN where unknown), sex, age_group, site.
    """
    gt_path, meta_path = root / GROUND_TRUTH, root / METADATA
    gt = read_csv(gt_path, ["image", *LABEL_NAMES, "UNK"], "the ISIC 2019 one-hot ground truth csv")
    meta = read_csv(meta_path, ["image", "lesion_id"], "the ISIC 2019 metadata csv")

    onehot = np.empty((len(gt), len(LABEL_NAMES) + 1))
    for j, name in enumerate([*LABEL_NAMES, "UNK"]):
        values = pd.to_numeric(gt[name], errors="coerce")
        check_rows(values.isin([0.0, 1.0]), gt_path,
                   lambda i: f"column {name!r} has value {gt[name].iloc[i]!r} (expected 0 or 1)")
        onehot[:, j] = values
    check_rows(onehot[:, -1] == 0, gt_path,
               lambda i: f"image {gt['image'].iloc[i]} is labelled UNK, which the ISIC 2019 training set never uses")
    check_rows(onehot[:, :-1].sum(axis=1) == 1, gt_path, lambda i: (
        f"image {gt['image'].iloc[i]} has {int(onehot[i, :-1].sum())} positive classes "
        f"(expected exactly one of {LABEL_NAMES})"))
    check_unique(gt["image"], gt_path, "image")

    check_unique(meta["image"], meta_path, "image")
    meta = meta.set_index("image")
    check_rows(gt["image"].isin(meta.index), gt_path,
               lambda i: f"image {gt['image'].iloc[i]} has no row in {meta_path}")
    meta = meta.loc[gt["image"]]

    lesion = meta["lesion_id"].str.strip().to_numpy()
    df = pd.DataFrame({
        "image_id": gt["image"].to_numpy(),
        "path": [str((root / IMAGE_DIR / f"{i}.jpg").absolute()) for i in gt["image"]],
        "group": np.where(lesion == "", gt["image"].to_numpy(), lesion),
        "label": onehot[:, :-1].argmax(axis=1).astype(int),
        "age_approx": pd.to_numeric(meta.get("age_approx", pd.Series(np.nan, index=meta.index)),
                                    errors="coerce").to_numpy(),
        **subgroup_columns(meta, meta_path, sex="sex", age="age_approx", site="anatom_site_general"),
    })
    return df[select_images(df["path"], csv_path=gt_path, images=images)].reset_index(drop=True)
