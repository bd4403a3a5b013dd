"""Kermany et al. paediatric chest radiographs: normal, bacterial and viral pneumonia (beyond the paper, DESIGN.md 3).

Release layout read here (Mendeley Data "Labeled OCT and Chest X-Ray Images", ``ChestXRay2017.zip``)::

    <root>/chest_xray/train/NORMAL/IM-0115-0001.jpeg, NORMAL2-IM-0381-0001-0002.jpeg, ...
    <root>/chest_xray/train/PNEUMONIA/person1000_bacteria_2931.jpeg, person1000_virus_1681.jpeg, ...
    <root>/chest_xray/test/...                   (the same two folders)
    <root>/chest_xray/val/...                    (optional: the 16 images of the Kaggle copy)

There is no csv: the class is the folder, and for PNEUMONIA ``bacteria`` or ``virus`` in the file
name. Three classes by default (:data:`LABEL_NAMES`); ``n_classes=2`` [ours, option] merges the two
pneumonias into one class (:data:`LABEL_NAMES_TWO`), as in the two-class task of the paper that
released the data. The official split folder is kept in ``source_split``. Hidden files (``.DS_Store``)
are skipped and counted; any other file whose name does not follow the release's pattern is an error.

Groups [ours]: the patient id is ``personNNN`` for PNEUMONIA files. NORMAL files carry no person
number; their ``IM-NNNN`` (with the ``NORMAL2-`` batch prefix where present, since the two batches reuse
numbers) is taken as the patient, so that ``IM-0429-0001-0001`` and ``IM-0429-0001-0002`` stay
together. The same ``personNNN`` appears in train and test, and under both bacteria and virus; it is
one group wherever it appears, so a re-split can never separate images that may be of one patient
(at worst two patients share a group). Byte-identical files (30 groups in the release) are detected by
content hash and only the first, in path order, is kept (``attrs["duplicates"]``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.data.common import drop_byte_duplicates, log_filtered, log_small_images
from crsrepro.core.errors import DataError

LABEL_NAMES = ["NORMAL", "BACTERIA", "VIRUS"]
LABEL_NAMES_TWO = ["NORMAL", "PNEUMONIA"]
TASK = "multiclass"
RELEASE_DIR = "chest_xray"
SPLITS = ("train", "val", "test")
REQUIRED_SPLITS = ("train", "test")
PATTERNS = {  # file name -> (group, kind), per class folder
    "NORMAL": re.compile(r"(?P<group>(?:NORMAL2-)?IM-\d+)-\d+(?:-\d+)?\.jpe?g", re.IGNORECASE),
    "PNEUMONIA": re.compile(r"(?P<group>person\d+)_(?P<kind>bacteria|virus)_\d+(?:_\d+)?\.jpe?g", re.IGNORECASE),
}


def _list_split(folder: Path, split: str) -> list[dict]:
    rows, hidden = [], 0
    for class_dir in PATTERNS:
        if not (folder / class_dir).is_dir():
            raise DataError(f"{folder / class_dir}: folder not found (expected the Kermany {split} {class_dir} images)")
        for path in sorted((folder / class_dir).iterdir()):
            if path.name.startswith("."):
                hidden += 1
                continue
            match = PATTERNS[class_dir].fullmatch(path.name)
            if match is None:
                raise DataError(f"{path}: file name does not follow the release's pattern "
                                f"({PATTERNS[class_dir].pattern})")
            kind = match.groupdict().get("kind")
            rows.append({"image_id": f"{split}/{class_dir}/{path.stem}", "path": str(path.absolute()),
                         "group": match["group"], "label": 0 if kind is None else 1 + (kind.lower() == "virus"),
                         "source_split": split})
    log_filtered(folder, hidden, hidden + len(rows), "hidden files (not images)")
    return rows


def load(root: Path, *, u_policy: str = "ignore", images: str = "all", n_classes: int = 3) -> pd.DataFrame:
    """Read the Kermany chest radiographs (every official split present) from ``root``.

    ``u_policy`` and ``images`` are accepted for a uniform signature and unused (every image found is
    read). ``n_classes``: 3 (normal / bacterial / viral, default) or 2 (normal / pneumonia).

    Returns
    -------
    pandas.DataFrame
        image_id (``<split>/<class folder>/<file stem>``), path, group (see the module docstring),
        label (int, index into ``attrs["label_names"]``), source_split; one row per distinct image file.
    """
    if n_classes not in (2, 3):
        raise ValueError(f"n_classes must be 2 or 3, got {n_classes!r}")
    release = root / RELEASE_DIR
    missing = [s for s in REQUIRED_SPLITS if not (release / s).is_dir()]
    if missing:
        raise DataError(f"{release / missing[0]}: folder not found (expected the Kermany chest_xray/{missing[0]} split)")
    rows = [row for split in SPLITS if (release / split).is_dir() for row in _list_split(release / split, split)]
    df = pd.DataFrame(rows)
    if df.empty:
        raise DataError(f"{release}: no images in {', '.join(REQUIRED_SPLITS)}")
    df = drop_byte_duplicates(df, what=f"{release} (Kermany)")
    log_small_images(df["path"], what=f"{release} (Kermany)")
    if n_classes == 2:
        df["label"] = np.minimum(df["label"], 1)
    df.attrs["label_names"] = list(LABEL_NAMES if n_classes == 3 else LABEL_NAMES_TWO)
    return df
