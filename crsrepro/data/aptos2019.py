"""APTOS 2019 Blindness Detection (train set): 5 ordinal grades of diabetic retinopathy (DESIGN.md section 3).

Release layout read here (as downloaded from Kaggle)::

    <root>/train.csv                 id_code, diagnosis (0..4)
    <root>/train_images/<id_code>.png

The grades are treated as 5 classes. APTOS gives no patient id, so each image is its own group.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from crsrepro.data.common import check_rows, check_unique, read_csv, select_images

LABEL_NAMES = ["No DR", "Mild", "Moderate", "Severe", "Proliferative DR"]
TASK = "multiclass"
TRAIN_CSV = "train.csv"
IMAGE_DIR = "train_images"


def load(root: Path, *, u_policy: str = "ignore", images: str = "all") -> pd.DataFrame:
    """Read APTOS 2019 from ``root``; ``u_policy`` is accepted for a uniform signature and unused.

    Returns
    -------
    pandas.DataFrame
        image_id, path, group (= image_id), label (the grade, 0..4).
    """
    csv_path = root / TRAIN_CSV
    raw = read_csv(csv_path, ["id_code", "diagnosis"], "the APTOS 2019 train.csv")
    grade = pd.to_numeric(raw["diagnosis"].str.strip(), errors="coerce")
    check_rows(grade.isin(range(len(LABEL_NAMES))), csv_path, lambda i: (
        f"diagnosis {raw['diagnosis'].iloc[i]!r} of {raw['id_code'].iloc[i]} is not a grade 0..4"))
    check_unique(raw["id_code"], csv_path, "id_code")
    df = pd.DataFrame({
        "image_id": raw["id_code"].to_numpy(),
        "path": [str((root / IMAGE_DIR / f"{i}.png").absolute()) for i in raw["id_code"]],
        "group": raw["id_code"].to_numpy(),
        "label": grade.astype(int).to_numpy(),
    })
    return df[select_images(df["path"], csv_path=csv_path, images=images)].reset_index(drop=True)
