"""A newcomer's score as a reviewer reads it: the terminal table and the ``--report DIR`` page (DESIGN.md sections 1, 9 and 10).

:func:`score_text` is what ``crsrepro score`` prints; :func:`write_report` writes the same content to a
folder: ``index.html`` (a self-contained page), ``profile.png`` (the newcomer's four normalised
dimensions beside the panel's, :func:`crsrepro.present.plots.dimension_profiles`), ``cells.csv`` (per
dataset: raw and normalised dimensions, the CRS components, the CRS with its two-level interval, the
members it dominates) and ``panel.csv`` (the panel's published aggregate CRS with intervals from the
same draw, and the newcomer's row among them). Both name the frame's hash and the package version, so
the score can be cited. The numbers come from :func:`crsrepro.analyse.new_encoder.score_newcomer`.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.analyse.new_encoder import NewcomerScore
from crsrepro.core.io import atomic_write

CELL_COLUMNS = ("dataset", "auroc", "ece", "retention", "robustness", "pareto", "proximity", "worst", "crs",
                "crs_ci_low", "crs_ci_high", "dominates")
"""The per-cell columns of the table, the csv and the page, in this order."""


def _number(value, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not np.isfinite(value)) else f"{value:.{digits}f}"


def _interval(low, high) -> str:
    if not (np.isfinite(low) and np.isfinite(high)):
        return "(no interval)"
    return f"[{low:.3f}, {high:.3f}]"


def summary_lines(score: NewcomerScore) -> list[str]:
    """The sentences the table and the page share: the aggregate, its rank, dominance and provenance."""
    a = score.aggregate
    level = int(round(100 * a["level"]))
    lines = [f"{score.encoder} on profile {score.profile}: aggregate CRS {_number(a['crs'])} "
             f"{level} % two-level interval {_interval(a['ci_low'], a['ci_high'])} "
             f"({a['n_resamples']} replicates of seeds x test cases)",
             f"rank {a['rank']} of {a['n_published'] + 1} against the panel's published aggregate CRS"
             + (f"; P(rank 1) {_number(a['p_rank1'], 2)}, P(top 3) {_number(a['p_top3'], 2)}"
                if np.isfinite(a["p_rank1"]) else ""),
             "dominates on every dataset: " + (a["dominates_everywhere"] or "no panel member"),
             f"frame {score.frame_path} (content hash {score.frame_hash[:16]}, frozen from results "
             f"{(score.results_hash or 'unrecorded')[:12]}); crsrepro {score.version} at commit {score.git}"]
    return lines + [f"note: {n}" for n in score.notes]


def cells_table(score: NewcomerScore) -> pd.DataFrame:
    """The per-cell table: :data:`CELL_COLUMNS` of :attr:`NewcomerScore.cells`."""
    return score.cells[list(CELL_COLUMNS)].reset_index(drop=True)


def panel_table(score: NewcomerScore) -> pd.DataFrame:
    """The panel's published aggregate CRS with intervals, best first, and the newcomer's row in its place."""
    panel = score.panel.reset_index().rename(columns={"index": "encoder"})[["encoder", "crs", "ci_low", "ci_high"]]
    a = score.aggregate
    own = pd.DataFrame([{"encoder": f"{score.encoder} (scored)", "crs": a["crs"], "ci_low": a["ci_low"],
                         "ci_high": a["ci_high"]}])
    table = pd.concat([panel[panel["encoder"] != score.encoder], own], ignore_index=True)
    return table.sort_values("crs", ascending=False, kind="stable").reset_index(drop=True)


def score_text(score: NewcomerScore) -> str:
    """What ``crsrepro score`` prints: the summary, the per-cell table and the panel ranking."""
    formats = {c: (lambda v: _number(v)) for c in CELL_COLUMNS if c not in ("dataset", "dominates")}
    parts = summary_lines(score) + ["", "per dataset (CRS interval: two-level bootstrap):",
                                    cells_table(score).to_string(index=False, formatters=formats), "",
                                    "against the panel (published aggregate CRS):",
                                    panel_table(score).to_string(index=False, float_format=lambda v: f"{v:.3f}",
                                                                na_rep="n/a")]
    return "\n".join(parts)


def profile_figure(score: NewcomerScore):
    """The newcomer's normalised profile (thick, black) beside the panel's frozen profiles, one panel per dataset."""
    from crsrepro.present.plots import dimension_profiles
    from crsrepro.present.plots.style import short_name

    table = score.profiles
    order = pd.concat([table[table["encoder"] != score.encoder], table[table["encoder"] == score.encoder]])
    fig = dimension_profiles(order)
    for ax in fig.axes:
        if ax.lines and ax.get_title() in set(table.loc[table["encoder"] == score.encoder, "dataset"]):
            ax.lines[-1].set(color="black", linewidth=2.8, zorder=5)
    for legend in fig.legends:
        for handle in legend.legend_handles:
            if handle.get_label() == short_name(score.encoder):
                handle.set(color="black", linewidth=2.8)
    fig.suptitle(f"{score.encoder} (black) beside the panel of profile {score.profile}")
    return fig


def write_report(score: NewcomerScore, folder: str | Path) -> Path:
    """Write ``index.html``, ``profile.png``, ``cells.csv`` and ``panel.csv`` to ``folder``; returns the page."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fig = profile_figure(score)
    atomic_write(folder / "profile.png", lambda f: fig.savefig(f, format="png"))
    cells, panel = cells_table(score), panel_table(score)
    atomic_write(folder / "cells.csv", cells.to_csv(index=False).encode())
    atomic_write(folder / "panel.csv", panel.to_csv(index=False).encode())
    atomic_write(folder / "index.html", report_html(score, cells, panel).encode())
    return folder / "index.html"


def report_html(score: NewcomerScore, cells: pd.DataFrame, panel: pd.DataFrame) -> str:
    """The page: summary, figure, per-cell table, panel table, provenance (one file, plain HTML)."""
    title = html.escape(f"{score.encoder} scored against the {score.profile} frame")
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(score))
    table_args = {"index": False, "float_format": lambda v: f"{v:.3f}", "na_rep": "n/a", "border": 0}
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.4}}
table{{border-collapse:collapse}}td,th{{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}}
th{{background:#f3f3f3}}</style></head><body>
<h1>{title}</h1>
<ul>{lines}</ul>
<h2>The four dimensions beside the panel's</h2>
<p>Normalised with the frame's fixed anchors (1 = best on every axis, ECE included).</p>
<img src="profile.png" alt="normalised profiles of {html.escape(score.encoder)} and the panel" style="max-width:100%">
<h2>Per dataset</h2>
<p>The CRS interval is the {int(round(100 * score.aggregate['level']))} % two-level bootstrap interval (seeds x
test cases, one draw shared with the panel unless a note above says otherwise), centred on the published
estimate; <i>dominates</i> lists the panel members whose frozen profile this encoder weakly dominates on that
dataset (at least as good on all four dimensions, better on one).</p>
{cells.to_html(**table_args)}
<h2>Against the panel</h2>
{panel.to_html(**table_args)}
<h2>Provenance</h2>
<p>Frame <code>{html.escape(score.frame_path)}</code>, content hash <code>{score.frame_hash}</code>, frozen from
results <code>{html.escape(score.results_hash or 'unrecorded')}</code>; crsrepro {html.escape(score.version)} at
commit <code>{html.escape(score.git)}</code>. The same content is in <code>cells.csv</code> and
<code>panel.csv</code>.</p>
</body></html>
"""


__all__ = ["CELL_COLUMNS", "cells_table", "panel_table", "profile_figure", "report_html", "score_text",
           "summary_lines", "write_report"]
