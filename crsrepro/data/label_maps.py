"""Label maps between chest radiograph datasets: CheXpert's 14 labels and NIH ChestX-ray14's findings (issue 12).

A probe trained on CheXpert can be applied to NIH ChestX-ray14 (NIH Clinical Center: a second real
hospital, beyond the paper's CheXpert -> MIMIC-CXR) without retraining, scored on the labels the two
releases share. :data:`CHEXPERT_TO_NIH` is that map [ours, following the mapping commonly used for
CheXpert/NIH harmonisation; torchxrayvision, for one, also renames CheXpert's ``Pleural Effusion`` to
``Effusion``]: seven findings with the same meaning, of which only ``Pleural Effusion`` is spelled
differently, and ``No Finding``.
CheXpert's other labels (Enlarged Cardiomediastinum, Lung Opacity, Lung Lesion, Pleural Other,
Fracture, Support Devices) and NIH's other findings (Infiltration, Mass, Nodule, Emphysema, Fibrosis,
Pleural_Thickening, Hernia) have no counterpart and are not scored. NIH's ``No Finding`` means none of
NIH's 14 findings, CheXpert's means none of its findings (support devices aside); the two are close,
not identical.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.data.common import CHEXPERT_LABELS

# CheXpert label -> NIH ChestX-ray14 column, in CheXpert's column order.
CHEXPERT_TO_NIH = {
    "No Finding": "No Finding",
    "Cardiomegaly": "Cardiomegaly",
    "Edema": "Edema",
    "Consolidation": "Consolidation",
    "Pneumonia": "Pneumonia",
    "Atelectasis": "Atelectasis",
    "Pneumothorax": "Pneumothorax",
    "Pleural Effusion": "Effusion",
}


def align_chexpert_to_nih(proba: np.ndarray, nih: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Score a CheXpert-trained probe on NIH ChestX-ray14: the shared labels' columns, aligned.

    Parameters
    ----------
    proba : array of shape (n, 14)
        A CheXpert probe's probabilities for the n NIH images, columns in CheXpert's order
        (:data:`crsrepro.data.common.CHEXPERT_LABELS`).
    nih : pandas.DataFrame
        The same n images as loaded by :mod:`crsrepro.data.nih_cxr14` (its finding columns and
        ``No Finding``), in the same row order.

    Returns
    -------
    proba_shared : array of shape (n, 8)
        The probabilities of the shared labels, in CheXpert's order.
    labels_shared : array of shape (n, 8)
        NIH's labels for the same labels and order (1.0 / 0.0).
    names : list of str
        The shared labels' CheXpert names (:data:`CHEXPERT_TO_NIH`'s keys).
    """
    proba = np.asarray(proba, dtype=float)
    if proba.ndim != 2 or proba.shape[1] != len(CHEXPERT_LABELS):
        raise ValueError(f"proba must be an (n, {len(CHEXPERT_LABELS)}) matrix in CheXpert's label order, "
                         f"got shape {proba.shape}")
    if len(nih) != len(proba):
        raise ValueError(f"proba has {len(proba)} rows but the NIH table has {len(nih)}")
    missing = [c for c in CHEXPERT_TO_NIH.values() if c not in nih.columns]
    if missing:
        raise ValueError(f"the NIH table lacks the column(s) {missing} (load it with crsrepro.data.load_dataset)")
    names = list(CHEXPERT_TO_NIH)
    columns = [CHEXPERT_LABELS.index(name) for name in names]
    return proba[:, columns], nih[list(CHEXPERT_TO_NIH.values())].to_numpy(dtype=float), names
