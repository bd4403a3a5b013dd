"""Figures the book shows. Each function returns a matplotlib Figure; the notebooks call one per figure.

Figures are built with :class:`matplotlib.figure.Figure` rather than pyplot, so they are not kept in
pyplot's global state: a notebook displays exactly the figure a call returns, once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from crsrepro.profiles import Profile


def _label_text(table: pd.DataFrame, row: pd.Series) -> str:
    names = table.attrs["label_names"]
    if table.attrs["task"] == "multiclass":
        return names[int(row["label"])]
    positives = [n for n in names if row[n] == 1.0]
    return ", ".join(positives[:2]) + ("..." if len(positives) > 2 else "") if positives else "no positive label"


def example_images(profile: Profile, *, per_dataset: int = 6, manifest_dir=None) -> Figure:
    """A few train images of every dataset (and the transfer set), titled with their labels."""
    from crsrepro.data import prepare_dataset, read_image

    datasets = list(profile.datasets) + list(profile.transfer.values())
    fig = Figure(figsize=(1.9 * per_dataset, 2.1 * len(datasets)))
    axes = fig.subplots(len(datasets), per_dataset, squeeze=False)
    for ax_row, name in zip(axes, datasets):
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        picks = table.iloc[np.linspace(0, len(table) - 1, per_dataset).astype(int)]
        for ax, (_, row) in zip(ax_row, picks.iterrows()):
            ax.imshow(read_image(row["path"]))
            ax.set_title(_label_text(table, row), fontsize=7)
            ax.set_xticks([]), ax.set_yticks([])
        ax_row[0].set_ylabel(name, fontsize=9)
    fig.tight_layout()
    return fig


def perturbation_grid(profile: Profile, dataset: str, *, manifest_dir=None) -> Figure:
    """One test image of ``dataset`` under every perturbation (rows) at every severity (columns).

    The image is degraded at its canonical size, exactly as the features see it (DESIGN.md section 6).
    """
    from crsrepro.data import prepare_dataset, read_image
    from crsrepro.perturb import apply_condition

    table = prepare_dataset(profile, dataset, manifest_dir=manifest_dir)
    test = table[table["split"].isin(["test", "transfer"])]
    row = test.iloc[0]
    image = np.asarray(read_image(row["path"]))
    severities = sorted(profile.severities)
    fig = Figure(figsize=(1.8 * (len(severities) + 1), 1.8 * len(profile.perturbations)))
    axes = fig.subplots(len(profile.perturbations), len(severities) + 1, squeeze=False)
    for ax_row, name in zip(axes, profile.perturbations):
        for ax, condition in zip(ax_row, ["clean"] + [f"{name}@{s}" for s in severities]):
            ax.imshow(apply_condition(image, condition, row["image_id"]))
            ax.set_title(condition, fontsize=7)
            ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle(f"{dataset}: {row['image_id']}", fontsize=9)
    fig.tight_layout()
    return fig


def auroc_by_encoder(runs: pd.DataFrame) -> Figure:
    """Clean full-label AUROC per encoder (points: seeds; bar: mean), one panel per dataset.

    ``runs`` are the wide primary runs (:func:`crsrepro.report.primary_runs`).
    """
    datasets = list(dict.fromkeys(runs["dataset"]))
    order = runs.groupby("encoder")["auroc"].mean().sort_values(ascending=False).index
    fig = Figure(figsize=(4.2 * len(datasets), 0.35 * len(order) + 1.5))
    axes = fig.subplots(1, len(datasets), sharey=True, squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        part = runs[runs["dataset"] == dataset]
        means = part.groupby("encoder")["auroc"].mean().reindex(order)
        y = np.arange(len(order))
        ax.barh(y, means.to_numpy() - 0.5, left=0.5, color="#9ecae1")
        for i, encoder in enumerate(order):
            seeds = part.loc[part["encoder"] == encoder, "auroc"]
            ax.plot(seeds, np.full(len(seeds), i), "k.", ms=3)
        ax.set_yticks(y, order, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xlim(0.45, 1.0)
        ax.set_title(dataset)
        ax.set_xlabel("macro AUROC (clean, 100 % labels)")
    fig.tight_layout()
    return fig
