"""CheXpert v1.0: 14 findings on chest radiographs, multi-label, frontal views only (DESIGN.md section 3).

Release layout read here (the "small" or the full download)::

    <root>/CheXpert-v1.0-small/train.csv     Path, Sex, Age, Frontal/Lateral, AP/PA, then the 14 labels
    <root>/CheXpert-v1.0-small/valid.csv
    <root>/CheXpert-v1.0-small/train/patient00001/study1/view1_frontal.jpg ...

(or the same under ``CheXpert-v1.0``). Kaggle's flattened copy (train.csv, valid.csv, train/ and valid/
directly in the download folder) is refused with the command that restores this layout. The ``Path``
column is relative to ``<root>``. train.csv and valid.csv are merged and their origin kept in
``source_split`` (``train`` / ``valid``). Lateral views are left out on purpose [ours: the paper's
191,229 images equal the frontal train + valid images] and counted in the log. A blank label is 0;
an uncertain -1 follows ``u_policy``. The group is the patient id taken from the path (``patient00001``).
The subgroup columns (DESIGN.md section 14) are ``sex`` (``Sex``), ``age_group`` (``Age``, binned by
:func:`~crsrepro.data.common.age_groups`) and ``view`` (``AP/PA``); a csv without ``Sex`` or ``Age``
gives ``unknown`` (logged).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.data.common import (CHEXPERT_LABELS, check_rows, check_unique, log_filtered, parse_chexpert_labels,
                                   read_csv, select_images, subgroup_columns)
from crsrepro.core.errors import DataError

logger = logging.getLogger(__name__)

LABEL_NAMES = list(CHEXPERT_LABELS)
TASK = "multilabel"
SMALL = "CheXpert-v1.0-small"  # the 320-px release (Kaggle's copy is this one)
RELEASE_DIRS = ("CheXpert-v1.0", SMALL)  # the full release first (DESIGN.md section 3)
SPLIT_FILES = {"train": "train.csv", "valid": "valid.csv"}
COLUMNS = ["Path", "Frontal/Lateral", "AP/PA", *LABEL_NAMES]  # Sex and Age are read when present


def find_release(root: Path) -> Path:
    """The release folder under ``root``: the full ``CheXpert-v1.0`` if present (clean images reach each
    encoder at their stored resolution, so the 320-px small release would cap the resolution), else
    ``CheXpert-v1.0-small``. The release read is logged and kept in ``attrs["release"]``."""
    for name in RELEASE_DIRS:
        if (root / name / SPLIT_FILES["train"]).is_file():
            return root / name
    flat = root / SPLIT_FILES["train"]
    if flat.is_file() and "Frontal/Lateral" in flat.open(errors="replace").readline():
        raise DataError(f"{flat}: Kaggle's flattened CheXpert copy (train.csv directly in the download folder, "
                        f"while its Path column starts with {SMALL}/); put it back in the release "
                        f"layout: cd {root} && mkdir {SMALL} && mv train.csv valid.csv train valid {SMALL}/")
    raise DataError(f"{root}: no CheXpert release found (expected "
                    f"{' or '.join(str(root / d / 'train.csv') for d in RELEASE_DIRS)})")


def _load_split(root: Path, csv_path: Path, split: str, u_policy: str, images: str) -> pd.DataFrame:
    raw = read_csv(csv_path, COLUMNS, f"the CheXpert {split} csv")
    view = raw["Frontal/Lateral"].str.strip()
    check_rows(view.isin(["Frontal", "Lateral"]), csv_path,
               lambda i: f"column 'Frontal/Lateral' has value {view.iloc[i]!r} (expected Frontal or Lateral)")
    frontal = np.flatnonzero((view == "Frontal").to_numpy())
    log_filtered(csv_path, len(raw) - len(frontal), len(raw), "lateral views (frontal views only)")
    if len(frontal) == 0:
        raise DataError(f"{csv_path}: no frontal views among its {len(raw)} rows")
    raw = raw.iloc[frontal].reset_index(drop=True)

    patient = raw["Path"].str.extract(r"/(patient\d+)/", expand=False)
    check_rows(patient.notna(), csv_path, rows=frontal,
               describe=lambda i: f"Path {raw['Path'].iloc[i]!r} has no patientNNNNN folder")
    relative = raw["Path"].str.replace(r"^[^/]*CheXpert-v1\.0[^/]*/", "", regex=True)
    labels = parse_chexpert_labels(raw, LABEL_NAMES, path=csv_path, u_policy=u_policy, rows=frontal)
    df = pd.DataFrame({
        "image_id": relative.str.replace(r"\.jpg$", "", regex=True).to_numpy(),
        "path": [str((root / p).absolute()) for p in raw["Path"]],
        "group": patient.to_numpy(),
        **{name: labels[name].to_numpy() for name in LABEL_NAMES},
        "source_split": split,
        "age": pd.to_numeric(raw.get("Age", pd.Series(np.nan, index=raw.index)), errors="coerce").to_numpy(),
        **subgroup_columns(raw, csv_path, sex="Sex", age="Age", view="AP/PA"),
    })
    check_unique(df["image_id"], csv_path, "Path")
    return df[select_images(df["path"], csv_path=csv_path, rows=frontal, images=images)].reset_index(drop=True)


def load(root: Path, *, u_policy: str = "ignore", images: str = "all") -> pd.DataFrame:
    """Read CheXpert (train + valid, frontal views) from ``root``.

    Returns
    -------
    pandas.DataFrame
        image_id (the path inside the release without ``.jpg``), path, group (patient id), the 14 label
        columns (1.0 / 0.0 / NaN when masked), source_split, age (years, NaN where unknown), sex,
        age_group, view (AP / PA, ``unknown`` where blank).
    """
    release = find_release(root)
    parts = [_load_split(root, release / name, split, u_policy, images) for split, name in SPLIT_FILES.items()]
    logger.info("CheXpert: reading the %s release under %s", release.name, root)
    table = pd.concat(parts, ignore_index=True)
    table.attrs["release"] = release.name
    return table
