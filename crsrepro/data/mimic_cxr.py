"""MIMIC-CXR-JPG v2.0.0: the unseen hospital for probes trained on CheXpert (DESIGN.md section 3).

Release layout read here (as downloaded from PhysioNet)::

    <root>/mimic-cxr-2.0.0-metadata.csv.gz   dicom_id, subject_id, study_id, ..., ViewPosition, ...
    <root>/mimic-cxr-2.0.0-split.csv.gz      dicom_id, study_id, subject_id, split (train/validate/test)
    <root>/mimic-cxr-2.0.0-chexpert.csv.gz   subject_id, study_id, then the 14 labels ALPHABETICALLY
    <root>/files/p10/p10000032/s50414267/<dicom_id>.jpg

Labels are per study and joined on (subject_id, study_id). The 14 label columns come in alphabetical
order in MIMIC's csv; they are reordered here into CheXpert's order, so that a CheXpert probe applied
to MIMIC can never be silently misaligned. Frontal views only (ViewPosition PA or AP) [ours]; other
views, and images whose study has no label row, are left out on purpose and counted in the log. A
blank label is 0 and -1 follows ``u_policy``, as for CheXpert. The group is the subject id, and
``source_split`` is MIMIC's official split; MIMIC is never trained on (its test split is the transfer
set, selected by :func:`crsrepro.data.prepare_dataset`).

Subgroups (DESIGN.md section 14): only ``view`` (``ViewPosition``) is kept. MIMIC-CXR-JPG carries no sex or age;
those are in MIMIC-IV's ``patients`` table (a separate credentialed release joined on subject_id),
which is out of this package's scope, so MIMIC has no ``sex`` or ``age_group`` subgroups here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.data.common import (CHEXPERT_LABELS, check_rows, check_unique, log_filtered, parse_chexpert_labels,
                                   read_csv, select_images, subgroup_columns)
from crsrepro.core.errors import DataError

LABEL_NAMES = list(CHEXPERT_LABELS)
TASK = "multilabel"
METADATA = "mimic-cxr-2.0.0-metadata.csv.gz"
SPLIT = "mimic-cxr-2.0.0-split.csv.gz"
LABELS = "mimic-cxr-2.0.0-chexpert.csv.gz"
FRONTAL_VIEWS = ("PA", "AP")
SPLITS = ("train", "validate", "test")


def image_path(root: Path, subject_id: str, study_id: str, dicom_id: str) -> Path:
    """``files/p<first 2 digits>/p<subject>/s<study>/<dicom_id>.jpg`` under ``root``."""
    return root / "files" / f"p{subject_id[:2]}" / f"p{subject_id}" / f"s{study_id}" / f"{dicom_id}.jpg"


def load(root: Path, *, u_policy: str = "ignore", images: str = "all") -> pd.DataFrame:
    """Read MIMIC-CXR-JPG (frontal views, all official splits) from ``root``.

    Returns
    -------
    pandas.DataFrame
        image_id (dicom_id), path, group (subject_id), the 14 label columns in CheXpert's order
        (1.0 / 0.0 / NaN when masked), source_split (train / validate / test), study_id, view.
    """
    meta_path, split_path, label_path = root / METADATA, root / SPLIT, root / LABELS
    meta = read_csv(meta_path, ["dicom_id", "subject_id", "study_id", "ViewPosition"], "the MIMIC-CXR metadata csv")
    split = read_csv(split_path, ["dicom_id", "study_id", "subject_id", "split"], "the MIMIC-CXR split csv")
    labels = read_csv(label_path, ["subject_id", "study_id", *LABEL_NAMES], "the MIMIC-CXR chexpert label csv")
    check_unique(meta["dicom_id"], meta_path, "dicom_id")
    check_unique(split["dicom_id"], split_path, "dicom_id")
    check_rows(split["split"].isin(SPLITS), split_path,
               lambda i: f"split {split['split'].iloc[i]!r} is not one of {', '.join(SPLITS)}")
    check_unique(labels["subject_id"] + "/" + labels["study_id"], label_path, "study (subject_id/study_id)")

    view = meta["ViewPosition"].str.strip()
    frontal = np.flatnonzero(view.isin(FRONTAL_VIEWS).to_numpy())
    log_filtered(meta_path, len(meta) - len(frontal), len(meta), f"views other than {'/'.join(FRONTAL_VIEWS)}")
    meta = meta.iloc[frontal]

    split_of = split.set_index("dicom_id")["split"]
    has_split = meta["dicom_id"].isin(split_of.index).to_numpy()
    check_rows(has_split, meta_path, rows=frontal,
               describe=lambda i: f"dicom_id {meta['dicom_id'].iloc[i]} has no row in {split_path}")

    parsed = parse_chexpert_labels(labels, LABEL_NAMES, path=label_path, u_policy=u_policy)
    parsed[["subject_id", "study_id"]] = labels[["subject_id", "study_id"]]
    meta = meta.assign(row=frontal).merge(parsed, on=["subject_id", "study_id"], how="left", indicator=True)
    labelled = (meta.pop("_merge") == "both").to_numpy()
    log_filtered(meta_path, int((~labelled).sum()), len(meta), f"frontal images whose study has no row in {label_path.name}")
    meta = meta[labelled]
    if meta.empty:
        raise DataError(f"{meta_path}: no frontal image with a label row in {label_path}")

    df = pd.DataFrame({
        "image_id": meta["dicom_id"].to_numpy(),
        "path": [str(image_path(root, s, t, d).absolute())
                 for s, t, d in zip(meta["subject_id"], meta["study_id"], meta["dicom_id"])],
        "group": meta["subject_id"].to_numpy(),
        **{name: meta[name].to_numpy(dtype=float) for name in LABEL_NAMES},  # CheXpert's order
        "source_split": split_of.loc[meta["dicom_id"]].to_numpy(),
        "study_id": meta["study_id"].to_numpy(),
        **subgroup_columns(meta, meta_path, view="ViewPosition"),
    })
    return df[select_images(df["path"], csv_path=meta_path, rows=meta["row"], images=images)].reset_index(drop=True)
