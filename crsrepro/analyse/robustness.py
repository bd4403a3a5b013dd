"""Chapter 04's tables beyond the paper's figures: how each perturbation's strength was set, and the
modality-apt noise models beside Rician (DESIGN.md section 6).

The paper applies MRI's Rician noise to radiographs, fundus photographs and dermoscopy alike, which its
critics call physically doubtful. A profile's ``noise_model`` runs a modality-apt model beside it on each
dataset it names (:data:`crsrepro.core.vocab.EXTRA_PERTURBATIONS`): Poisson-Gaussian photon and read
noise for radiographs, signal-dependent sensor noise for photographs. Those runs are kept out of the
paper-faithful robustness and CRS; :func:`modality_noise_table` sets them beside Rician's, severity by
severity.
"""

from __future__ import annotations

import pandas as pd

from crsrepro.core.schema import condition_name
from crsrepro.core.vocab import CLEAN, EXTRA_PERTURBATIONS
from crsrepro.score.dimensions import select_runs

RICIAN = "rician_noise"
MODALITY_NOISE_COLUMNS = ["dataset", "noise_model", "severity", "n_cells", "auroc_drop_rician", "auroc_drop_model",
                          "ece_rise_rician", "ece_rise_model"]


def perturbation_strength(analysis) -> pd.DataFrame:
    """How each perturbation of the profile, and each noise model it selects, was set: the parameters at
    severities 1, 2, 3 (:func:`crsrepro.extract.perturb.parameter_table`) and a spatial parameter in pixels
    at the short side the test images are degraded at: the profile's canonical size
    (:func:`crsrepro.run.units.canonical_size`, a cap), or the demo world's stored size where that is smaller."""
    from crsrepro.extract.perturb import parameter_table
    from crsrepro.run.units import canonical_size

    profile = analysis.profile
    short_side = canonical_size(profile)
    if profile.demo_world is not None:
        short_side = min(short_side, profile.demo_world.image_size)
    chosen = (*profile.perturbations, *dict.fromkeys(profile.noise_model[d] for d in profile.datasets
                                                     if d in profile.noise_model))
    return parameter_table(short_side, chosen)


def modality_noise_table(runs: pd.DataFrame, noise_model: dict) -> pd.DataFrame:
    """Rician noise beside each dataset's modality-apt noise model, per severity: the AUROC drop and the
    ECE rise from the clean test split at 100 % labels, averaged over seeds and then over encoders.

    Parameters
    ----------
    runs : DataFrame
        A runs table (:func:`crsrepro.run.results.runs_table`) with the noise models' conditions (they are
        not in :attr:`crsrepro.analyse.run_analysis.RunAnalysis.runs`, the paper-faithful runs).
    noise_model : dict
        ``{dataset: noise model}``, a profile's ``noise_model``.

    Returns
    -------
    DataFrame
        :data:`MODALITY_NOISE_COLUMNS`, one row per (dataset, severity) where both Rician and the dataset's
        noise model were run; ``n_cells`` is the number of encoders averaged. Empty when no dataset has both.

    Examples
    --------
    >>> runs = pd.DataFrame([dict(encoder="e", dataset="chexpert", seed=0, label_fraction=1.0, condition=c,
    ...                           probe="linear", layer="final", regime="frozen", recalibrator="none", auroc=a, ece=e)
    ...                      for c, a, e in [("clean", 0.8, 0.05), ("rician_noise@3", 0.7, 0.15),
    ...                                      ("poisson_gaussian@3", 0.75, 0.10)]])
    >>> modality_noise_table(runs, {"chexpert": "poisson_gaussian"}).iloc[0, 2:].astype(float).round(3).tolist()
    [3.0, 1.0, 0.1, 0.05, 0.1, 0.05]
    """
    unknown = set(noise_model.values()) - set(EXTRA_PERTURBATIONS)
    if unknown:
        raise ValueError(f"unknown noise model(s) {sorted(unknown)} (known: {', '.join(EXTRA_PERTURBATIONS)})")
    full = select_runs(runs, label_fraction=1.0)
    rows = []
    for dataset, model in noise_model.items():
        cells = full[full["dataset"] == dataset].groupby(["encoder", "condition"])[["auroc", "ece"]].mean()
        if cells.empty:
            continue
        by_condition = cells.unstack("condition")
        for severity in sorted({int(c.partition("@")[2]) for c in by_condition["auroc"].columns if "@" in c}):
            rician, modality = condition_name(RICIAN, severity), condition_name(model, severity)
            if not {CLEAN, rician, modality} <= set(by_condition["auroc"].columns):
                continue
            auroc, ece = by_condition["auroc"], by_condition["ece"]
            both = auroc[[CLEAN, rician, modality]].notna().all(axis=1)
            rows.append({"dataset": dataset, "noise_model": model, "severity": severity, "n_cells": int(both.sum()),
                         "auroc_drop_rician": (auroc[CLEAN] - auroc[rician])[both].mean(),
                         "auroc_drop_model": (auroc[CLEAN] - auroc[modality])[both].mean(),
                         "ece_rise_rician": (ece[rician] - ece[CLEAN])[both].mean(),
                         "ece_rise_model": (ece[modality] - ece[CLEAN])[both].mean()})
    return pd.DataFrame(rows, columns=MODALITY_NOISE_COLUMNS)


def modality_noise(analysis) -> pd.DataFrame:
    """:func:`modality_noise_table` of a run: every run of the results (:attr:`RunAnalysis.all_runs`) and the
    profile's ``noise_model``."""
    return modality_noise_table(analysis.all_runs, analysis.profile.noise_model)
