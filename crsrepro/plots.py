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

    datasets = profile.all_datasets()
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


def _panels(n: int, *, width: float = 4.2, height: float = 3.4, sharey: bool = False):
    fig = Figure(figsize=(width * n, height))
    return fig, fig.subplots(1, n, sharey=sharey, squeeze=False)[0]


def ece_vs_auroc(runs: pd.DataFrame) -> Figure:
    """ECE against AUROC per encoder (clean, 100 % labels; seed means), one panel per dataset:
    discrimination and calibration are different dimensions."""
    means = runs.groupby(["dataset", "encoder"])[["auroc", "ece"]].mean().reset_index()
    datasets = list(dict.fromkeys(means["dataset"]))
    fig, axes = _panels(len(datasets))
    for ax, dataset in zip(axes, datasets):
        part = means[means["dataset"] == dataset]
        ax.scatter(part["auroc"], part["ece"], s=18)
        for row in part.itertuples():
            ax.annotate(row.encoder.split(".")[-1], (row.auroc, row.ece), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
        ax.set_title(dataset)
        ax.set_xlabel("macro AUROC")
        ax.set_ylabel("ECE (15 bins)")
    fig.tight_layout()
    return fig


def recalibration_effect(cells: pd.DataFrame) -> Figure:
    """ECE before (grey) and after (colour) each recalibrator, per cell.

    ``cells`` is :attr:`crsrepro.stats.RecalibrationSummary.cells`.
    """
    recalibrators = list(dict.fromkeys(cells["recalibrator"]))
    fig, axes = _panels(len(recalibrators), width=3.4, height=3.4, sharey=True)
    for ax, name in zip(axes, recalibrators):
        part = cells[cells["recalibrator"] == name]
        ax.scatter(part["ece_before"], part["ece_after"], s=14, c=part["dataset"].astype("category").cat.codes,
                   cmap="viridis")
        top = float(max(part["ece_before"].max(), part["ece_after"].max(), 0.01)) * 1.05
        ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--")
        ax.plot([0, top], [0, top / 2], color="grey", lw=0.6, ls=":")
        ax.set_title(name)
        ax.set_xlabel("ECE before")
    axes[0].set_ylabel("ECE after (dotted: halved)")
    fig.tight_layout()
    return fig


def label_efficiency_curves(runs: pd.DataFrame) -> Figure:
    """Clean AUROC against the label fraction (log scale) per encoder, one panel per dataset.

    ``runs`` are the primary runs on the clean test split at every fraction.
    """
    means = runs.groupby(["dataset", "encoder", "label_fraction"])["auroc"].mean().reset_index()
    datasets = list(dict.fromkeys(means["dataset"]))
    fig, axes = _panels(len(datasets), height=3.8)
    for ax, dataset in zip(axes, datasets):
        for encoder, part in means[means["dataset"] == dataset].groupby("encoder"):
            ax.plot(part["label_fraction"] * 100, part["auroc"], marker="o", ms=3, lw=1,
                    label=encoder.split(".")[-1])
        ax.set_xscale("log")
        ax.set_title(dataset)
        ax.set_xlabel("labels used (% of train, log scale)")
        ax.set_ylabel("macro AUROC")
    axes[-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return fig


def robustness_heatmap(runs: pd.DataFrame, dataset: str) -> Figure:
    """AUROC drop (clean - condition) per encoder and test condition on ``dataset`` (100 % labels)."""
    part = runs[(runs["dataset"] == dataset) & np.isclose(runs["label_fraction"], 1.0)]
    means = part.groupby(["encoder", "condition"])["auroc"].mean().unstack("condition")
    drops = means.drop(columns="clean").rsub(means["clean"], axis=0)
    drops = drops[sorted(drops.columns, key=lambda c: ("@" not in c, c))]
    fig = Figure(figsize=(0.42 * drops.shape[1] + 2.5, 0.32 * drops.shape[0] + 1.6))
    ax = fig.subplots()
    limit = float(np.nanmax(np.abs(drops.to_numpy()))) or 0.01
    image = ax.imshow(drops.to_numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(drops.shape[1]), drops.columns, rotation=90, fontsize=7)
    ax.set_yticks(range(drops.shape[0]), drops.index, fontsize=7)
    ax.set_title(f"{dataset}: AUROC drop under each condition")
    fig.colorbar(image, ax=ax, label="AUROC drop")
    fig.tight_layout()
    return fig


def transfer_scatter(table: pd.DataFrame, families: pd.Series, *, source: str = "chexpert",
                     target: str = "mimic_cxr") -> Figure:
    """AUROC on the transfer target against AUROC on the source, per encoder, coloured by family.

    ``table`` is :attr:`crsrepro.stats.ExternalValidity.table` (``source_auroc``, ``target_auroc`` by
    encoder) and ``families`` maps encoder to family (e.g. ``WelchResult.table["family"]``).
    """
    table = table.join(families.rename("family"))
    fig = Figure(figsize=(4.6, 4.2))
    ax = fig.subplots()
    for family, part in table.groupby("family"):
        ax.scatter(part["source_auroc"], part["target_auroc"], s=20, label=family)
        for encoder, row in part.iterrows():
            ax.annotate(str(encoder).split(".")[-1], (row["source_auroc"], row["target_auroc"]), fontsize=6,
                        xytext=(2, 2), textcoords="offset points")
    low = float(min(table["source_auroc"].min(), table["target_auroc"].min(), 0.5))
    ax.plot([low, 1], [low, 1], color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"AUROC on {source} (clean test)")
    ax.set_ylabel(f"AUROC on {target} (no retraining)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def rank_shift(ranks: pd.DataFrame, *, a: str = "AUROC", b: str = "CRS") -> Figure:
    """A slope chart from each encoder's rank under ``a`` to its rank under ``b``.

    ``ranks`` is :attr:`crsrepro.stats.RankAgreement.ranks` (columns ``rank_a``, ``rank_b``).
    """
    fig = Figure(figsize=(4.8, 0.3 * len(ranks) + 1.4))
    ax = fig.subplots()
    for encoder, row in ranks.iterrows():
        colour = "#d62728" if row["rank_b"] < row["rank_a"] else "#1f77b4" if row["rank_b"] > row["rank_a"] else "grey"
        ax.plot([0, 1], [row["rank_a"], row["rank_b"]], color=colour, marker="o", ms=3)
        ax.annotate(str(encoder), (0, row["rank_a"]), xytext=(-4, 0), textcoords="offset points", ha="right",
                    va="center", fontsize=7)
        ax.annotate(str(encoder), (1, row["rank_b"]), xytext=(4, 0), textcoords="offset points", ha="left",
                    va="center", fontsize=7)
    ax.set_xlim(-0.9, 1.9)
    ax.invert_yaxis()
    ax.set_xticks([0, 1], [f"rank by {a}", f"rank by {b}"])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def rank_probabilities(probabilities: pd.DataFrame) -> Figure:
    """P(rank = r) per encoder from the seed-paired bootstrap, as a heat map.

    ``probabilities`` is :attr:`crsrepro.stats.SeedBootstrapResult.rank_probabilities`.
    """
    order = probabilities.mul(probabilities.columns.to_numpy(), axis=1).sum(axis=1).sort_values().index
    table = probabilities.loc[order]
    fig = Figure(figsize=(0.38 * table.shape[1] + 2.8, 0.32 * table.shape[0] + 1.4))
    ax = fig.subplots()
    image = ax.imshow(table.to_numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(table.shape[1]), table.columns, fontsize=7)
    ax.set_yticks(range(table.shape[0]), table.index, fontsize=7)
    ax.set_xlabel("rank by aggregate CRS")
    fig.colorbar(image, ax=ax, label="bootstrap probability")
    fig.tight_layout()
    return fig
