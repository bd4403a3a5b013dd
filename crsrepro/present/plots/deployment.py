"""Figures of the deployment analyses (DESIGN.md section 14, beyond the paper), in the book's style
(:mod:`crsrepro.present.plots.style`).

:func:`sensitivity_vs_severity` shows what a threshold chosen on clean val images does on degraded
test images: the achieved sensitivity at a fixed threshold (:mod:`crsrepro.analyse.operating_points`) against
the severity of each perturbation, with its test-case bootstrap interval as a band.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from crsrepro.analyse.operating_points import OPERATING_POINTS, OperatingPointTable, severity_summary
from crsrepro.core.vocab import CLEAN
from crsrepro.present.plots.style import NEUTRAL, PAGE_WIDTH, encoder_styles, grid_shape, short_name, styled


@styled
def sensitivity_vs_severity(points: OperatingPointTable, *, dataset: str | None = None,
                            operating_point: str = "sens@spec90", value: str | None = None):
    """Achieved sensitivity (or specificity) at the val-chosen threshold vs severity, one panel per perturbation.

    Parameters
    ----------
    points : OperatingPointTable
        :func:`crsrepro.analyse.operating_points.operating_point_table`.
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
        labels, :func:`crsrepro.analyse.operating_points.severity_summary`), coloured by family, with
        its interval as a light band. When ``value`` is the quantity fixed on val, a dotted line marks
        its target.
    """
    if operating_point not in OPERATING_POINTS:
        raise ValueError(f"operating_point must be one of {', '.join(OPERATING_POINTS)}, got {operating_point!r}")
    fixed, target = OPERATING_POINTS[operating_point]
    value = value or ("specificity" if fixed == "sensitivity" else "sensitivity")
    table = points.table
    dataset = dataset or table["dataset"].iloc[0]
    summary = severity_summary(points)
    summary = summary[(summary["dataset"] == dataset) & (summary["operating_point"] == operating_point)]
    if summary.empty:
        raise ValueError(f"no operating-point rows for dataset {dataset!r}")
    perturbations = sorted(p for p in summary.loc[summary["severity"] > 0, "perturbation"].unique())
    families = table.groupby("encoder")["family"].first().to_dict()
    styles = encoder_styles(families)
    n_rows, n_cols = grid_shape(len(perturbations))
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(PAGE_WIDTH, 2.3 * n_rows + 0.6), sharey=True, squeeze=False)
    for ax, perturbation in zip(axes.flat, perturbations):
        for encoder, cell in summary.groupby("encoder"):
            curve = cell[cell["perturbation"].isin([perturbation, CLEAN]) & cell["severity"].notna()]
            curve = curve.sort_values("severity")
            ax.plot(curve["severity"], curve[value], label=short_name(encoder), **styles[encoder])
            ax.fill_between(curve["severity"], curve[f"{value}_ci_low"], curve[f"{value}_ci_high"],
                            color=styles[encoder]["color"], alpha=0.12, lw=0)
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
