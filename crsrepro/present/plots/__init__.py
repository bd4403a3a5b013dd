"""Figures the book shows. Each function returns a matplotlib Figure; the notebooks call one per figure.

Figures are built with :class:`matplotlib.figure.Figure` rather than pyplot, so they are not kept in
pyplot's global state: a notebook displays exactly the figure a call returns, once. No function
writes a file. Every function draws with the book's style (:mod:`crsrepro.present.plots.style`): colour-blind-safe
colours, one colour per encoder family in every figure, and sizes legible at page width.

Where a table holds several seeds per point, lines show the seed mean and bands the seed range
(min to max) **[ours: the range, since three seeds make a standard deviation unstable]**.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from crsrepro.core.schema import LOWER_IS_BETTER, Condition, condition_name, is_perturbation
from crsrepro.core.vocab import CLEAN
from crsrepro.profiles import Profile
from crsrepro.score.crs import DIMENSIONS
from crsrepro.score.dimensions import select_runs
from crsrepro.present.plots.style import (
    CYCLE,
    DIVERGING,
    FONT_SIZE,
    NEUTRAL,
    OKABE_ITO,
    PAGE_WIDTH,
    SEQUENTIAL,
    encoder_styles,
    family_color,
    family_legend_handles,
    grid_shape,
    short_name,
    styled,
)

# --------------------------------------------------------------------------- helpers


def _families(table: pd.DataFrame) -> dict[str, str | None]:
    """encoder -> family from a ``family`` column (None where the table has none: drawn in grey)."""
    if "family" in table.columns:
        return table.groupby("encoder")["family"].first().to_dict()
    return {encoder: None for encoder in table["encoder"].unique()}


def _panels(n: int, *, height: float = 3.0, sharex: bool = False, sharey: bool = False, max_columns: int = 3):
    """A page-wide figure with ``n`` panels, at most ``max_columns`` across; the unused ones removed."""
    rows, columns = grid_shape(n, max_columns=max_columns)
    fig = Figure(figsize=(PAGE_WIDTH, height * rows), layout="constrained")
    axes = fig.subplots(rows, columns, sharex=sharex, sharey=sharey, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.remove()
    return fig, list(axes[:n])


def _encoder_legend(fig: Figure, styles: dict[str, dict], *, columns: int = 5) -> None:
    """One legend under the figure: every encoder with its family colour and marker."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], label=short_name(e), **style) for e, style in styles.items()]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(columns, len(handles)))


def _seed_lines(ax, table: pd.DataFrame, x: str, y: str, styles: dict[str, dict]) -> None:
    """Per encoder: the seed mean of ``y`` against ``x`` as a line, the seed range as a band."""
    stats = table.groupby(["encoder", x])[y].agg(["mean", "min", "max"]).reset_index()
    for encoder, part in stats.groupby("encoder"):
        style = styles[encoder]
        ax.plot(part[x], part["mean"], ms=4, label=short_name(encoder), **style)
        ax.fill_between(part[x], part["min"], part["max"], color=style["color"], alpha=0.15, lw=0)


#: The longest label name a thumbnail's title shows whole (a sixth of the page is about 20 characters wide).
TITLE_CHARS = 20


def _label_text(table: pd.DataFrame, row: pd.Series) -> str:
    """An image's title: its class, or its first two positive labels one per line and how many more.

    >>> table = pd.DataFrame({"Edema": [1.0], "Enlarged Cardiomediastinum": [1.0], "Fracture": [1.0]})
    >>> table.attrs = {"label_names": list(table.columns), "task": "multilabel"}
    >>> print(_label_text(table, table.iloc[0]))
    Edema
    Enlarged Cardiomedi… +1
    """
    names = table.attrs["label_names"]
    if table.attrs["task"] == "multiclass":
        return names[int(row["label"])]
    positives = [n if len(n) <= TITLE_CHARS else n[:TITLE_CHARS - 1] + "…" for n in names if row[n] == 1.0]
    if not positives:
        return "no positive label"
    more = f" +{len(positives) - 2}" if len(positives) > 2 else ""
    return "\n".join(positives[:2]) + more


# --------------------------------------------------------------------------- the data


@styled
def example_images(profile: Profile, *, per_dataset: int = 6, manifest_dir=None) -> Figure:
    """A few train images of every dataset (and the transfer set), titled with their labels."""
    from crsrepro.data import prepare_dataset, read_image

    datasets = profile.all_datasets()
    side = PAGE_WIDTH / per_dataset
    fig = Figure(figsize=(PAGE_WIDTH, (side + 0.5) * len(datasets)), layout="constrained")  # room for two-line titles
    axes = fig.subplots(len(datasets), per_dataset, squeeze=False)
    for ax_row, name in zip(axes, datasets):
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        picks = table.iloc[np.linspace(0, len(table) - 1, per_dataset).astype(int)]
        for ax, (_, row) in zip(ax_row, picks.iterrows()):
            ax.imshow(read_image(row["path"]))
            ax.set_title(_label_text(table, row), fontsize=FONT_SIZE - 2)
            ax.set_xticks([]), ax.set_yticks([])
            ax.grid(False)
        ax_row[0].set_ylabel(name)
    return fig


@styled
def perturbation_grid(profile: Profile, dataset: str | None, *, manifest_dir=None) -> Figure | None:
    """One test image of ``dataset`` under every perturbation (rows) at every severity (columns).

    The image is degraded at its canonical size, exactly as the features see it (DESIGN.md section 6).
    ``dataset`` None draws nothing (None): a one-dataset profile has no contrast dataset
    (:func:`crsrepro.present.report.tables.contrast_dataset`).
    """
    if dataset is None:
        return None
    from crsrepro.data import prepare_dataset, read_image
    from crsrepro.extract.perturb import apply_condition

    table = prepare_dataset(profile, dataset, manifest_dir=manifest_dir)
    test = table[table["split"].isin(["test", "transfer"])]
    row = test.iloc[0]
    image = np.asarray(read_image(row["path"]))
    severities = sorted(profile.severities)
    side = min(PAGE_WIDTH / (len(severities) + 1), 1.8)
    fig = Figure(figsize=(side * (len(severities) + 1), (side + 0.3) * len(profile.perturbations) + 0.4),
                 layout="constrained")
    axes = fig.subplots(len(profile.perturbations), len(severities) + 1, squeeze=False)
    for ax_row, name in zip(axes, profile.perturbations):
        for ax, condition in zip(ax_row, [CLEAN] + [condition_name(name, s) for s in severities]):
            ax.imshow(apply_condition(image, condition, row["image_id"]))
            ax.set_title(condition, fontsize=FONT_SIZE - 1)
            ax.set_xticks([]), ax.set_yticks([])
            ax.grid(False)
    fig.suptitle(f"{dataset}: {row['image_id']}")
    return fig


# --------------------------------------------------------------------------- discrimination, calibration


@styled
def auroc_by_encoder(runs: pd.DataFrame) -> Figure:
    """Clean full-label AUROC per encoder (points: seeds; bar: mean, coloured by family), one panel per
    dataset.

    ``runs`` are the wide primary runs (:func:`crsrepro.present.report.tables.primary_runs`).
    """
    datasets = list(dict.fromkeys(runs["dataset"]))
    order = runs.groupby("encoder")["auroc"].mean().sort_values(ascending=False).index
    families = _families(runs)
    fig, axes = _panels(len(datasets), height=0.28 * len(order) + 1.4, sharey=True)
    y = np.arange(len(order))
    for ax, dataset in zip(axes, datasets):
        part = runs[runs["dataset"] == dataset]
        means = part.groupby("encoder")["auroc"].mean().reindex(order)
        ax.barh(y, means.to_numpy() - 0.5, left=0.5, color=[family_color(families[e]) for e in order], alpha=0.8)
        for i, encoder in enumerate(order):
            seeds = part.loc[part["encoder"] == encoder, "auroc"]
            ax.plot(seeds, np.full(len(seeds), i), "k.", ms=3)
        ax.set_yticks(y, [short_name(e) for e in order])
        ax.axvline(0.5, color=NEUTRAL, lw=0.8, ls="--")
        ax.set_xlim(0.45, 1.0)
        ax.set_title(dataset)
        ax.set_xlabel("macro AUROC")
        ax.grid(axis="y", visible=False)
    axes[0].invert_yaxis()
    fig.legend(handles=family_legend_handles(families.values()), loc="outside lower center", ncols=3)
    return fig


@styled
def ece_vs_auroc(runs: pd.DataFrame) -> Figure:
    """ECE against AUROC per encoder (clean, 100 % labels; seed means), one panel per dataset:
    discrimination and calibration are different dimensions."""
    means = runs.groupby(["dataset", "encoder"])[["auroc", "ece"]].mean().reset_index()
    styles = encoder_styles(_families(runs))
    datasets = list(dict.fromkeys(means["dataset"]))
    fig, axes = _panels(len(datasets))
    for ax, dataset in zip(axes, datasets):
        for row in means[means["dataset"] == dataset].itertuples():
            ax.plot(row.auroc, row.ece, ls="none", ms=6, **styles[row.encoder])
        ax.set_title(dataset)
        ax.set_xlabel("macro AUROC")
    axes[0].set_ylabel("ECE (15 bins)")
    _encoder_legend(fig, styles)
    return fig


@styled
def reliability_diagram(y_true, probs_before, probs_after, *, task: str, n_bins: int = 15,
                        labels: tuple[str, str] = ("before recalibration", "after recalibration"),
                        title: str | None = None) -> Figure:
    """The reliability diagram of one cell before and after recalibration (DESIGN.md section 8).

    Top: accuracy against confidence per bin (:func:`crsrepro.core.metrics.reliability_curve`; empty bins
    are skipped by the line), the diagonal being perfect calibration, with each curve's ECE in the
    legend. Bottom: how many predictions fall in each bin, since a bin with few predictions says little.

    Parameters
    ----------
    y_true, probs_before, probs_after : arrays
        Labels and the probe's test probabilities before and after recalibration, as for
        :func:`crsrepro.core.metrics.reliability_curve`.
    task : {"multiclass", "multilabel"}
    n_bins : int, default 15
        The paper's 15 equal-width bins.
    labels : (str, str)
        The legend names of the two curves.
    title : str, optional
    """
    from crsrepro.core.metrics import expected_calibration_error, reliability_curve

    fig = Figure(figsize=(PAGE_WIDTH * 0.6, 5.2), layout="constrained")
    curve_ax, count_ax = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    curve_ax.plot([0, 1], [0, 1], color=NEUTRAL, lw=0.8, ls="--", label="perfect calibration")
    width = 1.0 / n_bins
    for offset, (probs, label, colour) in enumerate(zip((probs_before, probs_after), labels,
                                                        (OKABE_ITO["orange"], OKABE_ITO["blue"]))):
        curve = reliability_curve(y_true, probs, task=task, n_bins=n_bins)
        ece = expected_calibration_error(y_true, probs, task=task, n_bins=n_bins)
        filled = curve.counts > 0
        curve_ax.plot(curve.confidence[filled], curve.accuracy[filled], marker="o", ms=4, color=colour,
                      label=f"{label} (ECE {ece:.3f})")
        count_ax.bar(curve.bin_edges[:-1] + width * (0.25 + 0.5 * offset), curve.counts, width=width / 2,
                     color=colour, align="center")
    curve_ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy in bin", title=title)
    curve_ax.legend(loc="upper left")
    count_ax.set(xlabel="confidence", ylabel="predictions")
    return fig


@styled
def recalibration_effect(cells: pd.DataFrame) -> Figure:
    """ECE before and after each recalibrator, one point per cell, coloured by dataset.

    ``cells`` is :attr:`crsrepro.analyse.findings.RecalibrationSummary.cells`. Points under the dashed diagonal
    improved; under the dotted line ECE was at least halved.
    """
    recalibrators = list(dict.fromkeys(cells["recalibrator"]))
    datasets = list(dict.fromkeys(cells["dataset"]))
    colours = dict(zip(datasets, CYCLE))
    fig, axes = _panels(len(recalibrators), height=2.8, sharey=True, max_columns=4)
    top = float(max(cells["ece_before"].max(), cells["ece_after"].max(), 0.01)) * 1.05
    for ax, name in zip(axes, recalibrators):
        part = cells[cells["recalibrator"] == name]
        for dataset, points in part.groupby("dataset", sort=False):
            ax.scatter(points["ece_before"], points["ece_after"], s=16, color=colours[dataset], label=dataset)
        ax.plot([0, top], [0, top], color=NEUTRAL, lw=0.8, ls="--")
        ax.plot([0, top], [0, top / 2], color=NEUTRAL, lw=0.6, ls=":")
        ax.set(xlim=(0, top), ylim=(0, top), title=name, xlabel="ECE before")
    axes[0].set_ylabel("ECE after")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=len(datasets))
    return fig


# --------------------------------------------------------------------------- label efficiency, robustness


@styled
def label_efficiency_curves(runs: pd.DataFrame, *, metric: str = "auroc") -> Figure:
    """Clean ``metric`` against the label fraction (log scale) per encoder, one panel per dataset;
    lines are seed means, bands the seed range.

    ``runs`` is a runs table (:func:`crsrepro.run.results.runs_table`); its primary clean runs at every
    label fraction are drawn.
    """
    part = select_runs(runs, condition=CLEAN).assign(percent=lambda t: t["label_fraction"] * 100)
    styles = encoder_styles(_families(part))
    datasets = list(dict.fromkeys(part["dataset"]))
    fig, axes = _panels(len(datasets), height=3.0)
    for ax, dataset in zip(axes, datasets):
        _seed_lines(ax, part[part["dataset"] == dataset], "percent", metric, styles)
        ax.set_xscale("log")
        percents = sorted(part["percent"].unique())
        ax.set_xticks(percents, [f"{p:g}" for p in percents])
        ax.minorticks_off()
        ax.set_title(dataset)
        ax.set_xlabel("labels used (% of train, log scale)")
    axes[0].set_ylabel(f"macro {metric.upper()}" if metric == "auroc" else metric)
    _encoder_legend(fig, styles)
    return fig


@styled
def robustness_heatmap(runs: pd.DataFrame, dataset: str) -> Figure:
    """AUROC drop (clean - condition) per encoder and test condition on ``dataset`` (100 % labels)."""
    part = runs[(runs["dataset"] == dataset) & np.isclose(runs["label_fraction"], 1.0)]
    means = part.groupby(["encoder", "condition"])["auroc"].mean().unstack("condition")
    drops = means.drop(columns=CLEAN).rsub(means[CLEAN], axis=0)
    drops = drops[sorted(drops.columns, key=lambda c: (not is_perturbation(c), c))]   # perturbations, then transfer sets
    drops.index = [short_name(e) for e in drops.index]
    fig = Figure(figsize=(PAGE_WIDTH, 0.3 * drops.shape[0] + 2.2), layout="constrained")
    ax = fig.subplots()
    limit = float(np.nanmax(np.abs(drops.to_numpy()))) or 0.01
    image = ax.imshow(drops.to_numpy(), cmap=DIVERGING, vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(drops.shape[1]), drops.columns, rotation=90)
    ax.set_yticks(range(drops.shape[0]), drops.index)
    ax.grid(False)
    ax.set_title(f"{dataset}: AUROC drop under each condition")
    fig.colorbar(image, ax=ax, label="AUROC drop")
    return fig


@styled
def severity_curves(runs: pd.DataFrame, dataset: str | None) -> Figure | None:
    """AUROC (top row) and ECE (bottom row) against severity, one column per perturbation, on
    ``dataset`` at 100 % labels; severity 0 is the clean test split. Lines are seed means per encoder.

    ``runs`` is a runs table (:func:`crsrepro.run.results.runs_table`). ``dataset`` None draws nothing
    (None): a one-dataset profile has no contrast dataset (:func:`crsrepro.present.report.tables.contrast_dataset`).
    """
    if dataset is None:
        return None
    part = select_runs(runs, dataset=dataset, label_fraction=1.0)
    clean = part[part["condition"] == CLEAN]
    perturbed = part[part["condition"].map(is_perturbation)]
    conditions = perturbed["condition"].map(Condition.parse)
    perturbed = perturbed.assign(perturbation=conditions.map(lambda c: c.perturbation),
                                 severity=conditions.map(lambda c: float(c.severity)))
    perturbations = list(dict.fromkeys(perturbed["perturbation"]))
    styles = encoder_styles(_families(part))
    fig = Figure(figsize=(PAGE_WIDTH, 4.8), layout="constrained")
    axes = fig.subplots(2, len(perturbations), sharex=True, sharey="row", squeeze=False)
    for column, name in enumerate(perturbations):
        curve = pd.concat([clean.assign(severity=0.0), perturbed[perturbed["perturbation"] == name]])
        for row, metric in enumerate(("auroc", "ece")):
            ax = axes[row, column]
            means = curve.groupby(["encoder", "severity"])[metric].mean().reset_index()
            for encoder, line in means.groupby("encoder"):
                ax.plot(line["severity"], line[metric], ms=3, lw=1.2, **styles[encoder])
        axes[0, column].set_title(name, fontsize=FONT_SIZE - 1)
        axes[1, column].set(xlabel="severity", xticks=[0.0, *sorted(perturbed["severity"].unique())])
    axes[0, 0].set_ylabel("macro AUROC")
    axes[1, 0].set_ylabel("ECE")
    fig.suptitle(f"{dataset}: discrimination and calibration as images degrade")
    _encoder_legend(fig, styles)
    return fig


@styled
def transfer_scatter(table: pd.DataFrame, families: pd.Series, *, source: str = "chexpert",
                     target: str = "mimic_cxr") -> Figure:
    """AUROC on the transfer target against AUROC on the source, per encoder, coloured by family.

    ``table`` is :attr:`crsrepro.analyse.findings.ExternalValidity.table` (``source_auroc``, ``target_auroc`` by
    encoder) and ``families`` maps encoder to family (e.g. ``WelchResult.table["family"]``).
    """
    table = table.join(families.rename("family"))
    fig = Figure(figsize=(PAGE_WIDTH * 0.7, PAGE_WIDTH * 0.6), layout="constrained")
    ax = fig.subplots()
    for family, part in table.groupby("family"):
        ax.scatter(part["source_auroc"], part["target_auroc"], s=28, color=family_color(family), label=family)
        for encoder, row in part.iterrows():
            ax.annotate(short_name(encoder), (row["source_auroc"], row["target_auroc"]), fontsize=FONT_SIZE - 2,
                        xytext=(3, 3), textcoords="offset points")
    low = float(min(table["source_auroc"].min(), table["target_auroc"].min(), 0.5))
    ax.plot([low, 1], [low, 1], color=NEUTRAL, lw=0.8, ls="--")
    ax.set_xlabel(f"AUROC on {source} (clean test)")
    ax.set_ylabel(f"AUROC on {target} (no retraining)")
    ax.legend()
    return fig


@styled
def transfer_bars(runs: pd.DataFrame, *, source: str = "chexpert", target: str = "mimic_cxr") -> Figure:
    """Transfer AUROC per encoder, medical-pretrained (medical + specialist) beside general, with the
    source AUROC as a black tick above each bar and each group's mean as a dashed line.

    The groups and the test are :func:`crsrepro.analyse.findings.welch_transfer_test`'s (its p-value is in the
    title); ``runs`` is a runs table with a ``family`` column.
    """
    from crsrepro.analyse.findings import welch_transfer_test

    welch = welch_transfer_test(runs, source=source, target=target)
    source_auroc = select_runs(runs, dataset=source, condition=CLEAN, label_fraction=1.0) \
        .groupby("encoder")["auroc"].mean()
    table = welch.table.assign(source_auroc=source_auroc).sort_values(["group", "target_auroc"],
                                                                      ascending=[False, False])
    fig = Figure(figsize=(PAGE_WIDTH, 3.6), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(table)) + (table["group"] == "general").to_numpy() * 0.8   # a gap between the groups
    ax.bar(x, table["target_auroc"], color=[family_color(f) for f in table["family"]], width=0.7)
    ax.plot(x, table["source_auroc"], ls="none", marker="_", ms=14, mew=2, color="black",
            label=f"AUROC on {source}")
    for group, mean in (("medical", welch.mean_medical), ("general", welch.mean_general)):
        at = x[(table["group"] == group).to_numpy()]
        ax.hlines(mean, at.min() - 0.4, at.max() + 0.4, colors=NEUTRAL, linestyles="--")
        ax.annotate(f"{group} mean {mean:.3f}", (at.mean(), mean), xytext=(0, 4), textcoords="offset points",
                    ha="center", fontsize=FONT_SIZE - 1)
    ax.set_xticks(x, [short_name(e) for e in table.index], rotation=45, ha="right")
    ax.set_ylim(max(0.0, float(min(table["target_auroc"].min(), table["source_auroc"].min())) - 0.05), 1.0)
    ax.set_ylabel(f"AUROC on {target}")
    ax.grid(axis="x", visible=False)
    ax.set_title(f"{source} -> {target} without retraining (Welch p = {welch.p_value:.3g})")
    fig.legend(handles=[*family_legend_handles(table["family"]), *ax.get_legend_handles_labels()[0]],
               loc="outside lower center", ncols=4)
    return fig


@styled
def depth_curves(table: pd.DataFrame) -> Figure:
    """Clean AUROC against the depth of the tapped layer (% of the network), per encoder, one panel per
    dataset; lines are seed means, bands the seed range.

    ``table`` has the columns ``encoder, dataset, seed, depth, auroc`` (depth in 25, 50, 75, 100) and
    optionally ``family``.
    """
    styles = encoder_styles(_families(table))
    datasets = list(dict.fromkeys(table["dataset"]))
    fig, axes = _panels(len(datasets), height=3.0, sharex=True)
    for ax, dataset in zip(axes, datasets):
        _seed_lines(ax, table[table["dataset"] == dataset], "depth", "auroc", styles)
        ax.set_xticks(sorted(table["depth"].unique()))
        ax.set_title(dataset)
        ax.set_xlabel("layer depth (% of the network)")
    axes[0].set_ylabel("macro AUROC")
    _encoder_legend(fig, styles)
    return fig


# --------------------------------------------------------------------------- the CRS


@styled
def dimension_profiles(table: pd.DataFrame) -> Figure:
    """Parallel coordinates of the four normalised dimensions, one line per encoder, one panel per
    dataset: 1 is best on every axis (ECE included, as the CRS normalises it).

    ``table`` has the columns ``encoder, dataset`` and ``auroc, ece, retention, robustness`` in [0, 1]
    (the normalised profile p, e.g. :func:`crsrepro.score.crs.crs_scores`' ``p_*`` columns renamed), and
    optionally ``family``.
    """
    styles = encoder_styles(_families(table))
    datasets = list(dict.fromkeys(table["dataset"]))
    fig, axes = _panels(len(datasets), height=3.0, sharey=True)
    x = np.arange(len(DIMENSIONS))
    for ax, dataset in zip(axes, datasets):
        part = table[table["dataset"] == dataset]
        for row in part.itertuples():
            ax.plot(x, [getattr(row, d) for d in DIMENSIONS], ms=4, lw=1.2, alpha=0.85, **styles[row.encoder])
        ax.set_xticks(x, list(DIMENSIONS), rotation=30)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(axis="y", visible=False)
        ax.grid(axis="x", color=NEUTRAL, lw=0.6)   # the four vertical axes of the coordinates
        ax.set_title(dataset)
    axes[0].set_ylabel("normalised value (1 = best)")
    _encoder_legend(fig, styles)
    return fig


def _pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which points no other point weakly dominates (both coordinates higher is better).

    >>> _pareto_front(np.array([1.0, 0.5, 0.4]), np.array([0.2, 0.9, 0.1])).tolist()
    [True, True, False]
    """
    better_or_equal = (x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])
    strictly = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    return ~(better_or_equal & strictly).any(axis=1)


@styled
def pareto_scatter(table: pd.DataFrame, *, x: str = "auroc", y: str = "ece") -> Figure:
    """Two dimensions of every cell, one panel per dataset, with the Pareto front of the two drawn:
    a filled point is dominated by no other encoder on these two dimensions (an open one is).

    ``table`` has ``encoder, dataset`` and the columns ``x`` and ``y`` (e.g.
    :func:`crsrepro.score.dimensions.reliability_profiles`, seeds averaged here); ECE counts lower as better, so its axis
    is inverted and "better" is up and to the right on both axes.
    """
    means = table.groupby(["dataset", "encoder"])[[x, y]].mean().reset_index()
    styles = encoder_styles(_families(table))
    sign = {c: -1.0 if c in LOWER_IS_BETTER else 1.0 for c in (x, y)}
    datasets = list(dict.fromkeys(means["dataset"]))
    fig, axes = _panels(len(datasets), height=3.0)
    for ax, dataset in zip(axes, datasets):
        part = means[means["dataset"] == dataset]
        front = _pareto_front(sign[x] * part[x].to_numpy(), sign[y] * part[y].to_numpy())
        for row, on_front in zip(part.itertuples(), front):
            style = styles[row.encoder]
            ax.plot(getattr(row, x), getattr(row, y), ls="none", ms=7, mfc=style["color"] if on_front else "white",
                    **style)
        edge = part[front].sort_values(x)
        ax.plot(edge[x], edge[y], color=NEUTRAL, lw=0.8, ls="--", zorder=0)
        if sign[y] < 0:
            ax.invert_yaxis()
        ax.set_title(dataset)
        ax.set_xlabel(x)
    axes[0].set_ylabel(y + (" (lower is better)" if sign[y] < 0 else ""))
    _encoder_legend(fig, styles)
    return fig


@styled
def rank_shift(ranks: pd.DataFrame, *, a: str = "AUROC", b: str = "CRS", families: pd.Series | None = None) -> Figure:
    """A slope chart from each encoder's rank under ``a`` to its rank under ``b``.

    ``ranks`` is :attr:`crsrepro.score.stats.RankAgreement.ranks` (columns ``rank_a``, ``rank_b``). The
    same chart compares frozen with LoRA ranks (``a="frozen", b="LoRA"``). Lines take the encoder's
    family colour when ``families`` (encoder -> family) is given; encoders that moved are drawn solid,
    the others dotted.
    """
    fig = Figure(figsize=(PAGE_WIDTH * 0.7, 0.3 * len(ranks) + 1.4), layout="constrained")
    ax = fig.subplots()
    for encoder, row in ranks.iterrows():
        colour = family_color(families.get(encoder)) if families is not None else NEUTRAL
        moved = row["rank_b"] != row["rank_a"]
        ax.plot([0, 1], [row["rank_a"], row["rank_b"]], color=colour, marker="o", ms=4, ls="-" if moved else ":")
        for side, rank, align, offset in ((0, row["rank_a"], "right", -5), (1, row["rank_b"], "left", 5)):
            ax.annotate(short_name(encoder), (side, rank), xytext=(offset, 0), textcoords="offset points",
                        ha=align, va="center")
    ax.set_xlim(-0.9, 1.9)
    ax.invert_yaxis()
    ax.set_xticks([0, 1], [f"rank by {a}", f"rank by {b}"])
    ax.set_yticks([])
    ax.grid(False)
    ax.spines["left"].set_visible(False)
    if families is not None:
        ax.legend(handles=family_legend_handles(families.reindex(ranks.index)), loc="lower center",
                  bbox_to_anchor=(0.5, 1.0), ncols=3)
    return fig


@styled
def rank_probabilities(probabilities: pd.DataFrame) -> Figure:
    """P(rank = r) per encoder from the seed-paired bootstrap, as a heat map with the probabilities
    written in the cells (those of at least 0.05).

    ``probabilities`` is :attr:`crsrepro.score.stats.SeedBootstrapResult.rank_probabilities`.
    """
    order = probabilities.mul(probabilities.columns.to_numpy(), axis=1).sum(axis=1).sort_values().index
    table = probabilities.loc[order]
    fig = Figure(figsize=(PAGE_WIDTH, 0.32 * table.shape[0] + 1.6), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(table.to_numpy(), cmap=SEQUENTIAL, vmin=0, vmax=1, aspect="auto")
    for (i, j), value in np.ndenumerate(table.to_numpy()):
        if value >= 0.05:
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=FONT_SIZE - 2,
                    color="black" if value > 0.6 else "white")
    ax.set_xticks(range(table.shape[1]), table.columns)
    ax.set_yticks(range(table.shape[0]), [short_name(e) for e in table.index])
    ax.grid(False)
    ax.set_xlabel("rank by aggregate CRS")
    fig.colorbar(image, ax=ax, label="bootstrap probability")
    return fig


@styled
def insertion_movements(movements: pd.DataFrame) -> Figure:
    """How far published CRS move when encoders are inserted: the fixed frame against cohort scoring.

    ``movements`` is :attr:`crsrepro.analyse.findings.InsertionResult.movements` (``trial, mode, level,
    encoder, dataset, movement``). Left: every published score's |change| per mode and level (``cell``:
    each cell CRS; ``aggregate``: each encoder's mean CRS), box and points. Right: the largest movement
    in each trial (solid: cell, dashed: aggregate), so a reader sees that fixed is zero in every trial,
    not only on average.
    """
    modes = [m for m in ("fixed", "cohort") if m in set(movements["mode"])] + \
        sorted(set(movements["mode"]) - {"fixed", "cohort"})
    levels = [level for level in ("cell", "aggregate") if level in set(movements["level"])]
    colours = dict(zip(modes, (OKABE_ITO["blue"], OKABE_ITO["orange"], *CYCLE[2:])))
    fig = Figure(figsize=(PAGE_WIDTH, 3.2), layout="constrained")
    cells_ax, trials_ax = fig.subplots(1, 2, width_ratios=[1, 2])
    groups = [(m, level) for level in levels for m in modes]
    values = [movements.loc[(movements["mode"] == m) & (movements["level"] == level), "movement"].to_numpy()
              for m, level in groups]
    cells_ax.boxplot(values, positions=range(len(groups)), widths=0.5, showfliers=False)
    jitter = np.random.default_rng(0)  # fixed jitter: the figure is the same on every build
    for i, ((mode, _), v) in enumerate(zip(groups, values)):
        cells_ax.scatter(i + jitter.uniform(-0.15, 0.15, len(v)), v, s=6, alpha=0.4, color=colours[mode])
    cells_ax.set_xticks(range(len(groups)), [f"{m}\n{level}" for m, level in groups])
    cells_ax.set_ylabel("|CRS after - CRS before|")
    cells_ax.set_title("every published score")
    worst = movements.groupby(["level", "mode", "trial"])["movement"].max().reset_index()
    for level, style in zip(levels, ("-", "--")):
        for mode in modes:
            part = worst[(worst["mode"] == mode) & (worst["level"] == level)]
            trials_ax.plot(part["trial"], part["movement"], ls=style, marker="o", ms=3, color=colours[mode],
                           label=f"{mode}, {level}")
    trials_ax.set(xlabel="trial", ylabel="largest movement", title="worst score per trial")
    trials_ax.legend()
    return fig
