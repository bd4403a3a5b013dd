"""Label maps between chest radiograph datasets: CheXpert's 14 labels and NIH ChestX-ray14's findings (DESIGN.md 3).

A probe trained on CheXpert can be applied to NIH ChestX-ray14 (NIH Clinical Center: a second real
hospital, beyond the paper's CheXpert -> MIMIC-CXR) without retraining, scored on the labels the two
releases share. :data:`CHEXPERT_TO_NIH` is that map (the run grid scores the transfer set through it)
[ours, following the mapping commonly used for CheXpert/NIH harmonisation; torchxrayvision, for one,
also renames CheXpert's ``Pleural Effusion`` to ``Effusion``]: seven findings with the same meaning, of which only ``Pleural Effusion`` is spelled
differently, and ``No Finding``.
CheXpert's other labels (Enlarged Cardiomediastinum, Lung Opacity, Lung Lesion, Pleural Other,
Fracture, Support Devices) and NIH's other findings (Infiltration, Mass, Nodule, Emphysema, Fibrosis,
Pleural_Thickening, Hernia) have no counterpart and are not scored. NIH's ``No Finding`` means none of
NIH's 14 findings, CheXpert's means none of its findings (support devices aside); the two are close,
not identical.
"""

from __future__ import annotations

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

