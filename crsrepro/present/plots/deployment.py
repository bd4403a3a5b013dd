"""Figures of the deployment analyses (DESIGN.md section 14, beyond the paper), in the book's style
(:mod:`crsrepro.present.plots.style`).

:func:`sensitivity_vs_severity` shows what a threshold chosen on clean val images does on degraded
test images: the achieved sensitivity at a fixed threshold (:mod:`crsrepro.analyse.operating_points`) against
the severity of each perturbation.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from crsrepro.analyse.operating_points import OPERATING_POINTS, severity_summary
from crsrepro.core.vocab import CLEAN
from crsrepro.present.plots.style import NEUTRAL, PAGE_WIDTH, encoder_styles, grid_shape, short_name, styled


@styled
def sensitivity_vs_severity(table: pd.DataFrame, *, dataset: str | None = None,
                            operating_point: str = "sens@spec90", value: str | None = None):
    """Achieved sensitivity (or specificity) at the val-chosen threshold vs severity, one panel per perturbation.

    Parameters
    ----------
    table : DataFrame
        An operating-point table (:func:`crsrepro.analyse.operating_points.operating_point_table`).
    dataset : str, optional
        The dataset drawn (default: the first in the table).
    operating_point : str, default "sens@spec90"
        A key of :data:`crsrepro.analyse.operating_points.OPERATING_POINTS`.
    value : {"sensitivity", "specificity"}, optional
        The achieved quantity drawn; default: the one the operating point does not fix (sensitivity
        for ``sens@spec*``, specificity for ``spec@sens*``).

    Returns
    -------
    matplotlib.figure.Figure
        Severity 0 is the clean test split; each line is one encoder (mean over seeds and classes or
        labels), coloured by family. When ``value`` is the quantity fixed on val, a dotted line marks
        its target.
    """
    if operating_point not in OPERATING_POINTS:
        raise ValueError(f"operating_point must be one of {', '.join(OPERATING_POINTS)}, got {operating_point!r}")
    fixed, target = OPERATING_POINTS[operating_point]
    value = value or ("specificity" if fixed == "sensitivity" else "sensitivity")
    dataset = dataset or table["dataset"].iloc[0]
    rows = table[(table["dataset"] == dataset) & (table["operating_point"] == operating_point)]
    if rows.empty:
        raise ValueError(f"no operating-point rows for dataset {dataset!r}")
    summary = severity_summary(rows)
    perturbations = sorted(p for p in summary.loc[summary["severity"] > 0, "perturbation"].unique())
    families = rows.groupby("encoder")["family"].first().to_dict()
    styles = encoder_styles(families)
    n_rows, n_cols = grid_shape(len(perturbations))
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(PAGE_WIDTH, 2.3 * n_rows + 0.6), sharey=True, squeeze=False)
    for ax, perturbation in zip(axes.flat, perturbations):
        for encoder, cell in summary.groupby("encoder"):
            curve = cell[cell["perturbation"].isin([perturbation, CLEAN]) & cell["severity"].notna()]
            curve = curve.sort_values("severity")
            ax.plot(curve["severity"], curve[value], label=short_name(encoder), **styles[encoder])
        ax.set_title(perturbation)
        ax.set_xlabel("severity (0 = clean)")
        ax.set_xticks(sorted(summary["severity"].dropna().unique()))
    for ax in axes[:, 0]:
        ax.set_ylabel(f"achieved {value}")
    if value == fixed:  # the quantity fixed on val: how far it drifts from its target
        for ax in axes.flat[:len(perturbations)]:
            ax.axhline(target, color=NEUTRAL, ls=":", lw=1)
    for ax in axes.flat[len(perturbations):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(f"{dataset}: {operating_point}, threshold chosen on clean val")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    plt.close(fig)  # the notebook displays the returned figure once
    return fig
