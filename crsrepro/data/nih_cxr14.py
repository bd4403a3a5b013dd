"""NIH ChestX-ray14: 14 findings on adult chest radiographs, multi-label (beyond the paper, DESIGN.md 3).

Release layout read here (the NIH Clinical Center download; its 12 ``images_NNN.tar.gz`` archives
unpack into one ``images/`` folder)::

    <root>/Data_Entry_2017_v2020.csv   Image Index, Finding Labels, Follow-up #, Patient ID, Patient Age,
                                       Patient Gender, View Position, ...
    <root>/images/00000001_000.png ...

``Finding Labels`` is a ``|``-separated list of the 14 findings (:data:`LABEL_NAMES`, spelled as the
release spells them, e.g. ``Pleural_Thickening``), or ``No Finding`` alone. Each finding becomes a
0/1 column (the release has no uncertain or masked labels); ``No Finding`` is kept as its own 0/1
column (not a label: it is 1 exactly when the 14 are 0), so that :mod:`crsrepro.data.label_maps` can
score CheXpert's ``No Finding``. The group is the patient id; the view (PA / AP) is kept. The subgroup
columns (DESIGN.md section 14) are ``sex`` (``Patient Gender``), ``age_group`` (``Patient Age``, binned by
:func:`~crsrepro.data.common.age_groups`) and ``view``.

Every listed image must exist by default; ``images="present-only"`` [ours] reads the listed images
that exist and counts the rest in the log, for a user who has downloaded only some of the archives.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from crsrepro.data.common import check_rows, check_unique, read_csv, select_images, subgroup_columns

# The 14 findings, in the order of Wang et al. (CVPR 2017), spelled as in ``Finding Labels``.
LABEL_NAMES = ["Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia",
               "Pneumothorax", "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia"]
NO_FINDING = "No Finding"
TASK = "multilabel"
CSV_NAME = "Data_Entry_2017_v2020.csv"
IMAGE_DIR = "images"
VIEWS = ("PA", "AP")
COLUMNS = ["Image Index", "Finding Labels", "Follow-up #", "Patient ID", "Patient Age", "Patient Gender",
           "View Position"]


def load(root: Path, *, u_policy: str = "ignore", images: str = "all") -> pd.DataFrame:
    """Read NIH ChestX-ray14 from ``root``; ``u_policy`` is accepted for a uniform signature and unused.

    Returns
    -------
    pandas.DataFrame
        image_id (Image Index without ``.png``), path, group (Patient ID), the 14 finding columns
        (1.0 / 0.0), ``No Finding`` (1.0 / 0.0), view (PA / AP), age, sex, age_group, follow_up.
    """
    csv_path = root / CSV_NAME
    raw = read_csv(csv_path, COLUMNS, "the NIH ChestX-ray14 label file")
    check_unique(raw["Image Index"], csv_path, "Image Index")
    findings = raw["Finding Labels"].str.strip()
    dummies = findings.str.get_dummies(sep="|")
    for token in sorted(set(dummies.columns) - {*LABEL_NAMES, NO_FINDING}):
        check_rows(dummies[token].to_numpy() == 0, csv_path,
                   lambda i: f"Finding Labels {findings.iloc[i]!r} has the unknown finding {token!r} "
                             f"(expected {NO_FINDING!r} or '|'-separated names among {LABEL_NAMES})")
    dummies = dummies.reindex(columns=[*LABEL_NAMES, NO_FINDING], fill_value=0).astype(float)
    n_findings = dummies[LABEL_NAMES].sum(axis=1).to_numpy()
    check_rows((n_findings > 0) != (dummies[NO_FINDING] == 1).to_numpy(), csv_path,
               lambda i: f"Finding Labels {findings.iloc[i]!r} must list findings or be {NO_FINDING!r} alone")
    view = raw["View Position"].str.strip()
    check_rows(view.isin(VIEWS), csv_path, lambda i: f"View Position {view.iloc[i]!r} is not one of {', '.join(VIEWS)}")
    check_rows(raw["Patient ID"].str.strip() != "", csv_path, lambda i: "Patient ID is blank")

    df = pd.DataFrame({
        "image_id": raw["Image Index"].str.replace(r"\.png$", "", regex=True).to_numpy(),
        "path": (str((root / IMAGE_DIR).absolute()) + os.sep + raw["Image Index"]).to_numpy(),  # 112k rows: no Path per row
        "group": raw["Patient ID"].str.strip().to_numpy(),
        **{name: dummies[name].to_numpy() for name in [*LABEL_NAMES, NO_FINDING]},
        "view": view.to_numpy(),
        "age": pd.to_numeric(raw["Patient Age"], errors="coerce").to_numpy(),
        **subgroup_columns(raw, csv_path, sex="Patient Gender", age="Patient Age"),
        "follow_up": pd.to_numeric(raw["Follow-up #"], errors="coerce").to_numpy(),
    })
    return df[select_images(df["path"], csv_path=csv_path, images=images)].reset_index(drop=True)
