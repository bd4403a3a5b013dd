"""Tables the book shows: inventories of the data and the encoders, and the per-dimension summaries.

Each function takes a profile or the tidy results table (:mod:`crsrepro.run.results`) and returns a
:class:`pandas.DataFrame` ready to display; the notebooks call one function per table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.profiles import Profile


def data_inventory(profile: Profile, *, manifest_dir=None) -> pd.DataFrame:
    """One row per dataset: task, classes, images, groups, the size of each split, and the labels the
    grid leaves out (a multi-label label without a positive or a negative in some split, [ours]).

    The test split is fixed; train and val are redrawn per run seed (DESIGN.md section 3), so their
    sizes are those of the profile's first seed (``seed_<s>`` column of the manifest).
    """
    from crsrepro.data import prepare_dataset
    from crsrepro.data.manifests import seed_column
    from crsrepro.run.grid import _learnable_labels

    column = seed_column(profile.seeds[0])
    rows = []
    for name in profile.all_datasets():
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        counts = table[column if column in table.columns else "split"].value_counts()
        left_out = _learnable_labels(table, profile.seeds).attrs.get("labels_left_out", []) if name in profile.datasets else []
        rows.append({"dataset": name, "task": table.attrs["task"], "classes or labels": len(table.attrs["label_names"]),
                     "images": len(table), "groups": table["group"].nunique(),
                     **{split: int(counts.get(split, 0)) for split in ("train", "val", "test", "transfer")},
                     "labels left out": ", ".join(left_out)})
    return pd.DataFrame(rows).set_index("dataset")


def label_prevalence(profile: Profile, *, manifest_dir=None) -> pd.DataFrame:
    """The share of positives per class or label in each dataset (the class imbalance a probe faces)."""
    from crsrepro.data import label_matrix, prepare_dataset

    columns = {}
    for name in profile.all_datasets():
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        y = label_matrix(table)
        names = table.attrs["label_names"]
        if table.attrs["task"] == "multiclass":
            prevalence = np.bincount(y, minlength=len(names)) / len(y)
        else:
            prevalence = np.nanmean(y, axis=0)
        columns[name] = pd.Series(prevalence, index=names)
    return pd.DataFrame(columns).round(3)


def encoder_inventory(profile: Profile) -> pd.DataFrame:
    """The frozen spec of every encoder in the panel (DESIGN.md section 4)."""
    from crsrepro.encoders import get_spec

    rows = []
    for encoder_id in profile.encoders:
        spec = get_spec(encoder_id)
        rows.append({"encoder": spec.id, "family": spec.family, "loader": spec.loader,
                     "architecture": spec.architecture, "input": spec.input_size,
                     "interpolation": spec.interpolation, "pooling": spec.pooling, "dim": spec.embed_dim,
                     "layer taps": ", ".join(spec.layer_taps), "licence": spec.licence,
                     "excluded from": ", ".join(spec.excluded_datasets) or "-"})
    return pd.DataFrame(rows).set_index("encoder")


def primary_runs(results: pd.DataFrame, *, condition: str | None = "clean",
                 label_fraction: float | None = 1.0) -> pd.DataFrame:
    """The wide per-run rows of the primary protocol: frozen linear probe, final layer, no recalibration.

    ``condition`` and ``label_fraction`` select runs; None keeps every condition or fraction.
    """
    from crsrepro.run.results import runs_table

    return _primary(runs_table(results), condition=condition, label_fraction=label_fraction)


def _primary(runs: pd.DataFrame, *, condition: str | None, label_fraction: float | None) -> pd.DataFrame:
    """The rows of a runs table that :func:`primary_runs` keeps."""
    keep = ((runs["probe"] == "linear") & (runs["regime"] == "frozen") & (runs["layer"] == "final")
            & (runs["recalibrator"] == "none"))
    if condition is not None:
        keep &= runs["condition"] == condition
    if label_fraction is not None:
        keep &= np.isclose(runs["label_fraction"], label_fraction)
    return runs[keep]


#: Metrics where lower is better; every other metric ranks higher-is-better.
LOWER_IS_BETTER = {"ece", "classwise_ece"}


def metric_table(results: pd.DataFrame, metric: str = "auroc") -> pd.DataFrame:
    """A metric of the primary protocol per encoder and dataset (mean ± sd over seeds), ranked by
    its mean over the encoder's available cells; missing cells are never imputed.

    ``metric="auroc"`` is the paper's discrimination ranking, ``metric="ece"`` its calibration one.
    """
    runs = primary_runs(results)
    stats = runs.groupby(["encoder", "dataset"])[metric].agg(["mean", "std"])
    mean = stats["mean"].unstack("dataset")
    table = mean.map(lambda v: f"{v:.3f}" if pd.notna(v) else "-")
    sd = stats["std"].unstack("dataset")
    table = table.where(sd.isna(), table + " ± " + sd.map(lambda v: f"{v:.3f}"))
    table.insert(0, "family", runs.drop_duplicates("encoder").set_index("encoder")["family"])
    aggregate = mean.mean(axis=1)
    table[f"mean {metric.upper()}"] = aggregate.map(lambda v: f"{v:.3f}")
    table["rank"] = aggregate.rank(ascending=metric in LOWER_IS_BETTER, method="min").astype(int)
    table.columns.name = None
    return table.sort_values("rank")


def transfer_table(analysis) -> pd.DataFrame:
    """Transfer AUROC without retraining, one column per (source -> target) pair of the profile (MIMIC-CXR,
    and NIH ChestX-ray14 when the profile names it), beside each source's clean AUROC; seed means of the
    primary protocol, from :attr:`crsrepro.analyse.run_analysis.RunAnalysis.all_runs` (every transfer target,
    whether or not it enters robustness). A missing cell is ``NaN``, never imputed. None (nothing shown)
    when the profile names no transfer set.
    """
    runs = _primary(analysis.all_runs, condition=None, label_fraction=1.0)
    columns = {}
    for source, targets in analysis.profile.transfer.items():
        on_source = runs[runs["dataset"] == source]
        columns[f"{source} (clean)"] = on_source[on_source["condition"] == "clean"].groupby("encoder")["auroc"].mean()
        for target in targets:
            columns[f"{source} -> {target}"] = on_source[on_source["condition"] == target].groupby("encoder")["auroc"].mean()
    if not columns:
        return None  # chapter 04's transfer_figure says why
    table = pd.DataFrame(columns).round(3)
    table.index.name = "encoder"
    return table


def _first_transfer(analysis) -> tuple[str, str] | None:
    """The profile's first (source, target) transfer pair (CheXpert -> MIMIC-CXR on the paper's profiles)."""
    return next(((source, targets[0]) for source, targets in analysis.profile.transfer.items() if targets), None)


def _no_transfer(analysis):
    return _admonition("note", "No transfer set", _html(
        f"Profile {analysis.profile.name} names no transfer set (its key `transfer` is empty), so there is no "
        "institution shift to measure here; the `demo` and `paper` profiles have one."))


def transfer_figure(analysis):
    """Chapter 04's transfer bars (:func:`crsrepro.present.plots.transfer_bars` on the first transfer pair), or a
    note when the profile names no transfer set."""
    from crsrepro.present import plots

    pair = _first_transfer(analysis)
    return plots.transfer_bars(analysis.all_runs, source=pair[0], target=pair[1]) if pair else _no_transfer(analysis)


def transfer_welch(analysis):
    """Welch's test of transfer AUROC, medical vs general (:meth:`RunAnalysis.transfer_test` on the first
    transfer pair) as a table of its scalars; None (nothing shown: :func:`transfer_figure` said why) when
    the profile names no transfer set."""
    pair = _first_transfer(analysis)
    return scalars(analysis.transfer_test(*pair)) if pair else None


def external_validity(analysis):
    """Chapter 05's external validity (:meth:`RunAnalysis.external_validity` on the first transfer pair) as
    a table of its scalars, or a note when the profile names no transfer set."""
    pair = _first_transfer(analysis)
    return scalars(analysis.external_validity(*pair)) if pair else _no_transfer(analysis)


def transfer_thresholds(analysis, shifts: pd.DataFrame):
    """The rows of :func:`crsrepro.analyse.operating_points.severity_summary` for the transfer sets (no severity);
    None (nothing shown) when the profile names no transfer set."""
    if _first_transfer(analysis) is None:
        return None
    return shifts[shifts["severity"].isna()].round(3)


def two_level_intervals(analysis, level: float = 0.95) -> pd.DataFrame:
    """Per dataset and encoder, the ``level`` intervals of D (AUROC) and C (ECE) from the two-level
    bootstrap over seeds x test cases (:attr:`crsrepro.analyse.run_analysis.RunAnalysis.two_level_bootstrap`,
    ``summary(level)``), with each interval's width."""
    parts = {dataset: result.summary(level) for dataset, result in analysis.two_level_bootstrap.items()}
    table = pd.concat(parts, names=["dataset"])
    return table.assign(auroc_width=table["auroc_ci_high"] - table["auroc_ci_low"],
                        ece_width=table["ece_ci_high"] - table["ece_ci_low"])


def seed_count_coverage(coverage_profile: str, n_seeds: int = 5):
    """How often an ``n_seeds``-seed bootstrap interval covers the estimate of a run with many seeds
    (:meth:`crsrepro.analyse.run_analysis.RunAnalysis.seed_count_coverage` on ``coverage_profile``, e.g. ``demo-seeds20``),
    as a one-row table; a note instead when ``coverage_profile`` is empty (the smoke book skips it).

    The coverage profile's results are loaded (its grid runs when they are missing).
    """
    from crsrepro.analyse.run_analysis import RunAnalysis

    if not coverage_profile:
        return _admonition("note", "Coverage of a few-seed bootstrap: not run here", _html(
            "This build sets `coverage_profile` empty, so the coverage check is skipped. Run the chapter with "
            "`-p coverage_profile demo-seeds20` to measure it on a 20-seed run."))
    table = RunAnalysis.load(coverage_profile).seed_count_coverage(n_seeds)
    attrs = table.attrs
    return pd.DataFrame([{"profile": coverage_profile, "seeds per interval": attrs["n_seeds"],
                          "seeds of the run": attrs["n_all_seeds"], "subsets": attrs["n_subsets"],
                          "pairs": len(table), "nominal": attrs["level"], "coverage": round(attrs["coverage"], 3),
                          "mean width": round(float(table["mean_width"].mean()), 3)}]).set_index("profile")


def worst_subgroups(analysis, table: pd.DataFrame):
    """:func:`crsrepro.analyse.subgroups.worst_subgroup` of a :func:`crsrepro.analyse.subgroups.subgroup_table`, or None
    when no subgroup was scored (a small run, e.g. smoke, whose test splits are below ``MIN_CASES`` per
    subgroup): :func:`subgroup_numbers` and :func:`worst_subgroup_summary` then say so."""
    from crsrepro.analyse.subgroups import worst_subgroup

    return worst_subgroup(analysis, table) if len(table) else None


def subgroup_numbers(table: pd.DataFrame, worst) -> dict[str, str]:
    """The subgroup section's numbers for the prose (chapter 02): ``table`` is a
    :func:`crsrepro.analyse.subgroups.subgroup_table`, ``worst`` its :func:`worst_subgroups` (``n/a`` when None)."""
    from crsrepro.present.plots.style import short_name

    numbers = {"n_subgroups": _f(len(table[["dataset", "attribute", "subgroup"]].drop_duplicates())),
               "n_subgroups_skipped": _f(len(table.attrs.get("skipped", [])))}
    names = ("worst_auroc_gap", "worst_auroc_who", "worst_auroc_where", "worst_ece_gap", "worst_ece_who",
             "worst_ece_where", "worst_subgroup_tau", "worst_subgroup_reversed")
    if worst is None:
        return numbers | dict.fromkeys(names, "n/a")
    by_auroc, by_ece = worst.per_encoder.sort_values("auroc_gap"), worst.per_encoder.sort_values("ece_gap")
    a, e = by_auroc.iloc[0], by_ece.iloc[-1]
    values = (_f(float(a["auroc_gap"])), short_name(by_auroc.index[0]),
              f"{a['auroc_attribute']} = {a['auroc_subgroup']} on {a['auroc_dataset']}",
              _f(float(e["ece_gap"])), short_name(by_ece.index[-1]),
              f"{e['ece_attribute']} = {e['ece_subgroup']} on {e['ece_dataset']}",
              _f(worst.agreement.kendall_tau), _f(int(worst.agreement.reversed_pairs)))
    return numbers | dict(zip(names, values))


def worst_subgroup_summary(table: pd.DataFrame, worst):
    """Per encoder, its largest AUROC drop and largest ECE rise over its subgroups, and where
    (``worst.per_encoder``); a note naming the skipped subgroups' count when none was scored."""
    from crsrepro.analyse.subgroups import MIN_CASES

    if worst is None:
        return _admonition("note", "No subgroup scored in this run", _html(
            f"Every subgroup of this run's test splits has fewer than {MIN_CASES} cases or lacks an outcome "
            f"({len(table.attrs.get('skipped', []))} skipped); the `demo` and `paper` profiles have enough."))
    return worst.per_encoder.round(3)


def scalars(result, **extra) -> pd.DataFrame:
    """The scalar fields of an analysis result (a dataclass from :mod:`crsrepro.score.stats`) as a table.

    >>> from crsrepro.score.stats import rank_agreement
    >>> scalars(rank_agreement({"a": 3, "b": 2, "c": 1}, {"a": 1, "b": 2, "c": 3})).loc["kendall_tau", "value"]
    -1.0
    """
    values = {name: value for name, value in vars(result).items()
              if isinstance(value, (int, float, np.integer, np.floating, str, bool))}
    values.update(extra)
    return pd.DataFrame({"value": pd.Series(values, dtype=object)})


# --------------------------------------------------------------------------- what a chapter says about its run
#
# The helpers below shape what the chapters show beside the tables: the frame's warning, the
# "paper vs this run" box, this run's numbers for the prose (glued with myst-nb), the per-case
# probabilities of a reliability diagram, and the worked examples on toy numbers. Each reads a
# :class:`crsrepro.analyse.run_analysis.RunAnalysis` (or nothing) and computes nothing the analysis does not.

#: Columns of the claims table that a chapter's "paper vs this run" box shows.
CLAIM_COLUMNS = ["claim", "paper value", "this run", "status"]
#: A "paper vs this run" box with more rows than this starts folded, so the chapter stays readable.
LONG_BOX = 10
#: The column widths of the box's table (claim, paper, this run, status); the table takes 90 % of the box, whose
#: children carry side margins, so that it fits inside.
_BOX_COLUMNS = ('<colgroup><col style="width: 52%"><col style="width: 14%"><col style="width: 14%">'
                '<col style="width: 20%"></colgroup>')


def _html(text: str) -> str:
    """Plain text with ``code`` spans as HTML.

    >>> _html("run `crsrepro freeze-frame` <now>")
    '<p>run <code>crsrepro freeze-frame</code> &lt;now&gt;</p>'
    """
    import html
    import re

    return "<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False)) + "</p>"


def _admonition(kind: str, title: str, body: str):
    """A box styled as the book's own admonitions (the theme's ``admonition <kind>`` classes), as an
    IPython HTML object: the notebook's Markdown outputs are read as CommonMark, which has no directives.

    >>> _admonition("note", "Title", "<p>Body</p>").data
    '<div class="admonition note"><p class="admonition-title">Title</p><p>Body</p></div>'
    """
    from IPython.display import HTML

    return HTML(f'<div class="admonition {kind}"><p class="admonition-title">{title}</p>{body}</div>')


def notes_list(notes, *, empty: str = "Nothing."):
    """Short notes (a list of strings) as an HTML bullet list, ``empty`` when there are none; for the
    "what was skipped, and why" cells, which would otherwise print a raw, clipped Python list.

    >>> notes_list(["a `b`", "c"]).data
    '<ul><li>a <code>b</code></li><li>c</li></ul>'
    >>> notes_list([]).data
    '<p>Nothing.</p>'
    """
    from IPython.display import HTML

    if not notes:
        return HTML(_html(empty))
    return HTML("<ul>" + "".join(f"<li>{_html(note)[3:-4]}</li>" for note in notes) + "</ul>")


def frame_note(analysis):
    """A warning box when the frozen frame was frozen from other results than the run's, else None
    (a cell that returns None shows nothing); DESIGN.md section 9, issue 9 "freezing is an act"."""
    if analysis.frame_warning is None:
        return None
    return _admonition("warning", "The reference frame does not match these results", _html(analysis.frame_warning))


def chapter_claims(claims: pd.DataFrame, notebook: str) -> pd.DataFrame:
    """The rows of a claims table (:attr:`crsrepro.analyse.run_analysis.RunAnalysis.claims`) that ``notebook``
    measures, with the columns the chapter's box shows, indexed by claim id.

    >>> table = pd.DataFrame({"id": ["a", "b"], "claim": ["x", "y"], "paper value": ["1", "2"],
    ...                       "this run": ["1", ""], "notebook": ["00_setup", "01_discrimination"],
    ...                       "status": ["measured", "not measured"]})
    >>> chapter_claims(table, "00_setup").to_dict("index")
    {'a': {'claim': 'x', 'paper value': '1', 'this run': '1', 'status': 'measured'}}
    """
    return claims.loc[claims["notebook"] == notebook].set_index("id")[CLAIM_COLUMNS]


def paper_vs_run(analysis, notebook: str):
    """The chapter's closing box: each of its claims, the paper's value beside this run's.

    Claims that this run measures (status ``measured``) are compared; ``paper profile only`` rows
    show this run's analogue, which illustrates the analysis and checks nothing; claims this run
    cannot measure are counted, not listed.
    """
    table = chapter_claims(analysis.claims, notebook)
    shown = table[table["this run"] != ""].rename(columns={"paper value": "paper"})
    body = (shown.to_html(index=False, border=0, classes="table").replace(
        "<table", '<table style="width: 90%; table-layout: fixed"', 1).replace("<thead>", _BOX_COLUMNS + "<thead>", 1)
            if len(shown) else _html("This run measures none of this chapter's claims."))
    missing = len(table) - len(shown)
    if missing:
        body += _html(f"{missing} more claim(s) of this chapter are not measured by this run (see the claims page).")
    if analysis.profile.name != "paper":
        body += _html("On this profile, `paper profile only` rows hold this run's analogue (its own leader, its own "
                      "cells): they illustrate the analysis and do not check the paper.")
    kind = "tip dropdown" if len(shown) > LONG_BOX else "tip"   # a long box starts folded (sphinx-togglebutton)
    return _admonition(kind, f"Paper vs this run (profile {analysis.profile.name})", body)


def crs_table(analysis) -> pd.DataFrame:
    """Chapter 05's per-cell table: the four normalised dimensions and the CRS with its three terms, by
    (encoder without its namespace, dataset), rounded to 3 digits (the raw dimensions are in chapters 01-04)."""
    from crsrepro.score.crs import NORMALISED
    from crsrepro.present.plots.style import short_name

    columns = [*NORMALISED, "pareto", "proximity", "worst", "crs"]
    table = analysis.scores.assign(encoder=analysis.scores["encoder"].map(short_name))
    return table.set_index(["encoder", "dataset"])[columns].round(3)


def encoder_families(analysis) -> pd.Series:
    """encoder -> family, for figures that colour encoders by family (e.g. :func:`crsrepro.present.plots.rank_shift`)."""
    return analysis.results.groupby("encoder")["family"].first()


def normalised_profiles(analysis) -> pd.DataFrame:
    """The normalised profile p of every cell (``p_*`` columns of the CRS scores, renamed to the four
    dimensions) with the encoder's family, as :func:`crsrepro.present.plots.dimension_profiles` draws it."""
    from crsrepro.score.crs import DIMENSIONS

    scores = analysis.scores
    table = scores[["encoder", "dataset"]].assign(**{d: scores[f"p_{d}"] for d in DIMENSIONS})
    return table.assign(family=table["encoder"].map(encoder_families(analysis)))


def reliability_inputs(analysis, encoder: str | None = None, dataset: str | None = None, *, seed: int | None = None,
                       recalibrator: str = "temperature", condition: str = "clean") -> dict:
    """One full-label linear probe's test labels and probabilities, before and after ``recalibrator``,
    as keyword arguments of :func:`crsrepro.present.plots.reliability_diagram`.

    The probabilities are :meth:`crsrepro.analyse.run_analysis.RunAnalysis.case_probabilities` (the row-set's
    case file) of ``encoder``'s ``seed``. ``encoder`` defaults to the AUROC leader, ``dataset`` to the
    profile's first, ``seed`` to its first.
    """
    from crsrepro.data import get_spec
    from crsrepro.core.vocab import NO_RECALIBRATION

    encoder = encoder or analysis.aggregate["rank_auroc"].idxmin()
    dataset = dataset or analysis.profile.datasets[0]
    seed = analysis.profile.seeds[0] if seed is None else seed
    index = list(analysis.profile.seeds).index(seed)
    labels, before = analysis.case_probabilities(dataset, condition=condition, recalibrator=NO_RECALIBRATION)
    _, after = analysis.case_probabilities(dataset, condition=condition, recalibrator=recalibrator)
    return {"y_true": labels, "probs_before": before[encoder][index].astype(float),
            "probs_after": after[encoder][index].astype(float), "task": get_spec(dataset).task,
            "labels": ("no recalibration", recalibrator), "title": f"{encoder} on {dataset} (seed {seed}, {condition})"}


# --------------------------------------------------------------------------- this run's numbers, for the prose

def _f(value, digits: int = 3) -> str:
    """A number as the prose quotes it.

    >>> _f(0.12345), _f(3), _f(float("nan")), _f(-0.5, 2)
    ('0.123', '3', 'n/a', '-0.50')
    """
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    return "n/a" if not np.isfinite(value) else f"{value:.{digits}f}"


def _pct(value) -> str:
    """A share as a percentage.

    >>> _pct(0.256)
    '26 %'
    """
    return "n/a" if not np.isfinite(value) else f"{100 * value:.0f} %"


#: The chapters whose prose quotes this run's numbers (:func:`chapter_numbers`).
CHAPTERS = ("00_setup", "01_discrimination", "02_calibration", "03_label_efficiency", "04_robustness",
            "05_crs_bootstrap", "06_layer_depth", "07_lora", "08_claims")


def chapter_numbers(analysis, notebook: str) -> dict[str, str]:
    """This run's numbers that ``notebook``'s prose quotes, formatted, keyed by their glue name.

    Every value is computed by the analysis (or by the worked example of the chapter), never typed;
    :func:`glue_numbers` hands them to myst-nb.
    """
    from crsrepro.present.plots.style import short_name

    from crsrepro.present.claims import STATUSES

    if notebook not in CHAPTERS:
        raise ValueError(f"no numbers are defined for notebook {notebook!r} (chapters: {', '.join(CHAPTERS)})")
    p = analysis.profile
    aggregate = analysis.aggregate
    if notebook == "00_setup":
        runs = analysis.all_runs
        return {"n_encoders": _f(len(p.encoders)), "n_datasets": _f(len(p.datasets)), "n_seeds": _f(len(p.seeds)),
                "n_runs": _f(len(runs)), "n_rowsets": _f(analysis.results["rowset"].nunique()),
                "n_conditions": _f(runs["condition"].nunique()), "profile_name": p.name}
    if notebook == "01_discrimination":
        by_auroc = aggregate.sort_values("rank_auroc")
        toy = toy_auroc()
        return {"toy_auroc": _f(toy.attrs["auroc"], 2), "toy_pairs_won": _f(int(toy["ranked above"].sum())),
                "auroc_leader": short_name(by_auroc.index[0]), "auroc_leader_value": _f(by_auroc["auroc"].iloc[0]),
                "auroc_last": short_name(by_auroc.index[-1]), "auroc_last_value": _f(by_auroc["auroc"].iloc[-1]),
                "auroc_spread": _f(by_auroc["auroc"].iloc[0] - by_auroc["auroc"].iloc[-1])}
    if notebook == "02_calibration":
        recal = analysis.recalibration
        cells, summary = recal.cells, recal.summary
        temperature = cells[cells["recalibrator"] == "temperature"]
        val = data_inventory(p).loc[list(p.datasets), "val"]   # the transfer sets have no val split
        return {"toy_ece": _f(toy_ece().attrs["ece"]),
                "ece_mean_before": _f(temperature["ece_before"].mean()),
                "temperature_mean_drop": _f(summary.loc["temperature", "mean_absolute_drop"]),
                "temperature_share_improved": _pct((temperature["absolute_drop"] > 0).mean()),
                "dirichlet_mean_drop": _f(summary.loc["dirichlet", "mean_absolute_drop"]),
                "worst_relative_change": _pct(cells["relative_reduction"].min()),
                "temperature_auroc_change": _f(summary.loc["temperature", "mean_auroc_change"], 4),
                "n_val_min": _f(int(val.min())), "n_val_max": _f(int(val.max()))}
    if notebook == "03_label_efficiency":
        toy = toy_retention_vs_aulc()
        corr = analysis.aulc_vs_retention.correlations
        cells = analysis.cell_means
        return {"toy_aulc_a": _f(toy.loc["A", "AULC"]), "toy_aulc_b": _f(toy.loc["B", "AULC"]),
                "toy_retention_a": _f(toy.loc["A", "retention"]), "toy_retention_b": _f(toy.loc["B", "retention"]),
                "aulc_rho_encoder": _f(corr.loc["aulc", "encoder"]), "aulc_rho_cell": _f(corr.loc["aulc", "cell"]),
                "retention_rho_encoder": _f(corr.loc["retention", "encoder"]),
                "retention_rho_cell": _f(corr.loc["retention", "cell"]),
                "smallest_fraction": _pct(min(p.label_fractions)),
                "retention_min": _f(cells["retention"].min()), "retention_max": _f(cells["retention"].max()),
                "retention_chance_low": _f(0.5 / cells["auroc"].max()),
                "retention_chance_high": _f(0.5 / cells["auroc"].min())}
    if notebook == "04_robustness":
        degradation = analysis.degradation
        worst = degradation.cells["peak_ece_rise"].idxmax()
        return {"degradation_r": _f(degradation.pearson_r), "degradation_n_cells": _f(len(degradation.cells)),
                "peak_ece_rise": _f(degradation.cells["peak_ece_rise"].max()),
                "peak_ece_cell": f"{short_name(worst[0])} on {worst[1]}",
                "mean_ece_rise": _f(degradation.cells["mean_ece_rise"].mean()),
                "mean_auroc_drop": _f(degradation.cells["mean_auroc_drop"].mean()),
                **_transfer_numbers(analysis)}
    if notebook == "05_crs_bootstrap":
        scores, agreement, bootstrap = analysis.scores, analysis.rank_agreement, analysis.bootstrap
        normalised = scores[[c for c in scores.columns if c.startswith("p_")]].to_numpy()
        leader = aggregate.index[0]
        toy = toy_paired_bootstrap()
        pareto = toy_pareto()
        return {"toy_pareto_a": _f(pareto.loc["A", "pareto"], 2), "toy_pareto_c": _f(pareto.loc["C", "pareto"], 2),
                "toy_boot_p_a": _f(toy.attrs["p_rank1_a"], 2), "toy_boot_low": _f(toy.attrs["ci_low"]),
                "toy_boot_high": _f(toy.attrs["ci_high"]),
                "crs_min": _f(scores["crs"].min()), "crs_max": _f(scores["crs"].max()),
                "share_clipped": _pct(np.isin(normalised, (0.0, 1.0)).mean()),
                "share_zero": _pct((normalised == 0.0).mean()),
                "share_no_dominance": _pct((scores["pareto"] == 0.0).mean()),
                "crs_leader": short_name(leader), "crs_leader_value": _f(aggregate["crs"].iloc[0]),
                "crs_leader_auroc_rank": _f(int(aggregate["rank_auroc"].iloc[0])),
                "kendall_tau": _f(agreement.kendall_tau), "reversed_pairs": _f(int(agreement.reversed_pairs)),
                "n_pairs": _f(int(agreement.n_pairs)), "p_rank1_leader": _f(bootstrap.p_rank1.max(), 2),
                "p_rank1_who": short_name(bootstrap.p_rank1.idxmax()),
                "n_resamples": _f(int(bootstrap.n_resamples)),
                **_two_level_numbers(analysis), **_probe_numbers(analysis.probe_conclusions)}
    if notebook == "06_layer_depth":
        return _depth_numbers(analysis.depth)
    if notebook == "07_lora":
        return _lora_numbers(analysis)
    if notebook == "08_claims":
        counts = analysis.claims["status"].value_counts()
        return {"n_claims": _f(len(analysis.claims)), **{f"n_{s.replace(' ', '_')}": _f(int(counts.get(s, 0)))
                                                        for s in STATUSES}}
    raise AssertionError(f"CHAPTERS lists {notebook!r} but no numbers are defined for it")


def _transfer_numbers(analysis) -> dict:
    """Chapter 04's transfer numbers and the sentence that quotes them (Markdown, ``{glue:md}``); on a
    profile without a transfer set the sentence says so and the numbers are absent."""
    from IPython.display import Markdown

    pair = _first_transfer(analysis)
    if pair is None:
        return {"transfer_sentence": Markdown(f"Profile `{analysis.profile.name}` names no transfer set, so it "
                                              "measures no institution shift.")}
    welch = analysis.transfer_test(*pair)
    numbers = {"transfer_medical": _f(welch.mean_medical), "transfer_general": _f(welch.mean_general),
               "transfer_p": _f(welch.p_value), "transfer_n_medical": _f(welch.n_medical),
               "transfer_n_general": _f(welch.n_general)}
    sentence = (f"After transfer from {pair[0]} to {pair[1]}, medical-pretrained encoders reach "
                f"**{numbers['transfer_medical']}** AUROC (**{numbers['transfer_n_medical']}** encoders) against "
                f"**{numbers['transfer_general']}** for general ones (**{numbers['transfer_n_general']}**), "
                f"Welch p = **{numbers['transfer_p']}**. With a handful of encoders per group a t-test has little "
                "power: a large p here says this run cannot tell, not that the paper is wrong.")
    return {**numbers, "transfer_sentence": Markdown(sentence)}


def _two_level_numbers(analysis) -> dict[str, str]:
    """The two-level bootstrap's typical interval widths (chapter 05), with the seed-only CRS intervals' for contrast."""
    table = two_level_intervals(analysis)
    seed_only = analysis.bootstrap.percentile_interval()
    return {"two_level_auroc_width": _f(float(table["auroc_width"].median())),
            "two_level_ece_width": _f(float(table["ece_width"].median())),
            "n_case_resamples": _f(int(analysis.profile.bootstrap.n_case_resamples)),
            "seed_only_crs_width": _f(float((seed_only["ci_high"] - seed_only["ci_low"]).median()))}


def _probe_numbers(conclusions: pd.DataFrame) -> dict[str, str]:
    """AUROC-vs-CRS agreement under each probe (chapter 05: do the conclusions depend on the classifier?)."""
    tau = conclusions["auroc_crs_kendall_tau"]
    return {"n_probes": _f(len(conclusions)), "probe_tau_min": _f(float(tau.min())), "probe_tau_max": _f(float(tau.max())),
            "probe_tau_linear": _f(float(tau.get("linear", np.nan)))}


def _depth_numbers(table: pd.DataFrame) -> dict[str, str]:
    """Chapter 06: the intermediate wins, the largest gain over the 100 % tap, the paired tests and the
    ranking when the depth is chosen on val, from :mod:`crsrepro.run.depth`'s analyses of the sweep."""
    from crsrepro.run import depth
    from crsrepro.present.plots.style import short_name

    best = depth.best_depths(table)
    wins, pairs = depth.intermediate_wins(table)
    top = best.loc[best["gain"].idxmax()]
    tests = depth.paired_test(table)
    agreement, _ = depth.val_selected_ranking(table)
    return {"depth_pairs": _f(pairs), "depth_wins": _f(wins), "depth_n_seeds": _f(int(table["seed"].nunique())),
            "depth_top_gain_points": _f(100 * float(top["gain"]), 1),
            "depth_top_pair": f"{short_name(top['encoder'])} on {top['dataset']}",
            "depth_top_depth": f"{int(top['best_depth'])} %",
            "depth_n_significant": _f(int((tests["p"] < 0.05).sum())),
            "depth_val_tau": _f(agreement.kendall_tau), "depth_val_reversed": _f(int(agreement.reversed_pairs)),
            "depth_val_n_pairs": _f(int(agreement.n_pairs))}


def _lora_numbers(analysis) -> dict[str, str]:
    """Chapter 07: this run's LoRA plan, the per-domain agreement and gains, the four-dimensional
    comparison, and the GPU-hours of the paper's protocol (:func:`crsrepro.run.lora.paper_gpu_hours`)."""
    from crsrepro.run.lora import paper_gpu_hours
    from crsrepro.run.plan import THROUGHPUTS
    from crsrepro.present.plots.style import short_name

    rows, comparison = analysis.lora_results, analysis.lora
    domains, crs = comparison.per_domain, comparison.crs
    mover = comparison.movers.iloc[0]
    return {"lora_epochs": _f(int(rows.attrs["epochs"])), "lora_n_seeds": _f(int(rows["seed"].nunique())),
            "lora_n_encoders": _f(int(rows["encoder"].nunique())), "lora_n_domains": _f(len(domains)),
            "lora_tau_min": _f(float(domains["kendall_tau"].min())), "lora_tau_max": _f(float(domains["kendall_tau"].max())),
            "lora_leader_changes": _f(int(domains["leader_changed"].sum())),
            "lora_gain_min": _f(float(domains["auroc_gain"].min())), "lora_gain_max": _f(float(domains["auroc_gain"].max())),
            "lora_n_domains_below_frozen": _f(int((domains["auroc_gain"] < 0).sum())),
            "lora_crs_tau": _f(crs.kendall_tau), "lora_crs_shift": _f(crs.mean_abs_rank_shift, 2),
            "lora_top3_hold": "hold" if comparison.top3_hold else "do not hold",
            "lora_top_mover": short_name(comparison.movers.index[0]),
            "lora_top_mover_from": _f(int(mover["rank_a"])), "lora_top_mover_to": _f(int(mover["rank_b"])),
            "paper_gpu_hours": _f(paper_gpu_hours(), 1),
            "lora_gpu_rate": _f(int(THROUGHPUTS["gpu_lora_vit_b16"].value)),
            "lora_gpu_rate_source": THROUGHPUTS["gpu_lora_vit_b16"].source}


def glue_numbers(numbers: dict) -> None:
    """Glue each formatted number with myst-nb (not displayed here), for ``{glue:text}`name``` in the prose;
    a value that is an ``IPython.display.Markdown`` sentence is for ``{glue:md}`name```."""
    from myst_nb import glue

    for name, text in numbers.items():
        glue(name, text, display=False)


# --------------------------------------------------------------------------- worked examples on toy numbers

def toy_auroc() -> pd.DataFrame:
    """AUROC as a ranking probability on four cases (two positives, two negatives).

    One row per (positive, negative) pair: whether the positive is scored above the negative. The
    share of such pairs is the AUROC, as :func:`crsrepro.core.metrics.binary_auroc` computes it
    (``attrs["auroc"]``).

    >>> table = toy_auroc()
    >>> int(table["ranked above"].sum()), table.attrs["auroc"]
    (3, 0.75)
    """
    from crsrepro.core.metrics import binary_auroc

    cases = pd.DataFrame({"case": ["a", "b", "c", "d"], "label": [1, 1, 0, 0], "score": [0.9, 0.4, 0.6, 0.2]})
    positives, negatives = cases[cases["label"] == 1], cases[cases["label"] == 0]
    rows = [{"positive": f"{p.case} ({p.score})", "negative": f"{n.case} ({n.score})",
             "ranked above": p.score > n.score} for p in positives.itertuples() for n in negatives.itertuples()]
    table = pd.DataFrame(rows)
    table.attrs["auroc"] = float(binary_auroc(cases["label"].to_numpy(), cases["score"].to_numpy()))
    return table


def toy_ece(n_bins: int = 5) -> pd.DataFrame:
    """ECE on a dozen two-class predictions, bin by bin (``n_bins`` bins for readability; the paper uses 15).

    One row per non-empty bin: its predictions, mean confidence, accuracy and gap;
    ``attrs["ece"]`` is :func:`crsrepro.core.metrics.expected_calibration_error` of the twelve, which
    equals the count-weighted mean gap.

    >>> table = toy_ece()
    >>> round(table.attrs["ece"], 3) == round(float((table["n"] * table["gap"]).sum() / table["n"].sum()), 3)
    True
    """
    from crsrepro.core.metrics import expected_calibration_error, reliability_curve

    p1 = np.array([0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05])
    y = np.array([1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0])
    probs = np.column_stack([1 - p1, p1])
    curve = reliability_curve(y, probs, task="multiclass", n_bins=n_bins)
    filled = curve.counts > 0
    table = pd.DataFrame({"bin": [f"({lo:.1f}, {hi:.1f}]" for lo, hi in zip(curve.bin_edges[:-1], curve.bin_edges[1:])],
                          "n": curve.counts, "mean confidence": curve.confidence, "accuracy": curve.accuracy})[filled]
    table = table.assign(gap=(table["accuracy"] - table["mean confidence"]).abs()).round(3).reset_index(drop=True)
    table.attrs["ece"] = float(expected_calibration_error(y, probs, task="multiclass", n_bins=n_bins))
    return table


def toy_retention_vs_aulc() -> pd.DataFrame:
    """Two encoders' AUROC per label fraction, with their AULC (:func:`crsrepro.core.metrics.aulc`) and
    retention (:func:`crsrepro.core.metrics.label_efficiency_retention`): A is better with all labels but
    loses much of it with few; AULC still ranks A first, retention ranks B first.

    >>> table = toy_retention_vs_aulc()
    >>> table["AULC"].idxmax(), table["retention"].idxmax()
    ('A', 'B')
    """
    from crsrepro.core.metrics import aulc, label_efficiency_retention

    curves = {"A": {0.01: 0.70, 0.05: 0.80, 0.10: 0.85, 0.25: 0.88, 1.0: 0.92},
              "B": {0.01: 0.76, 0.05: 0.78, 0.10: 0.79, 0.25: 0.80, 1.0: 0.80}}
    rows = {name: {**{f"{f:.0%}": v for f, v in curve.items()}, "AULC": aulc(curve),
                   "retention": label_efficiency_retention(curve)} for name, curve in curves.items()}
    return pd.DataFrame(rows).T.round(3)


def toy_pareto() -> pd.DataFrame:
    """Pareto dominance on three encoders' normalised profiles: A dominates B (at least as good on
    every dimension, better on one); C trades AUROC for calibration and dominates no one. The CRS
    components come from :func:`crsrepro.score.crs.crs_components`, each encoder against the two others.

    >>> table = toy_pareto()
    >>> table["pareto"].tolist(), table["dominates"].tolist()
    ([0.5, 0.0, 0.0], ['B', '-', '-'])
    """
    from crsrepro.score.crs import DIMENSIONS, crs_components

    names = ["A", "B", "C"]
    p = np.array([[0.9, 0.8, 0.7, 0.6], [0.8, 0.7, 0.7, 0.5], [0.5, 0.9, 0.8, 0.4]])
    peers = ~np.eye(3, dtype=bool)
    parts = crs_components(p, p, peers)
    dominated = (p[:, None, :] >= p[None]).all(-1) & (p[:, None, :] > p[None]).any(-1)
    table = pd.DataFrame(p, index=names, columns=list(DIMENSIONS))
    table["dominates"] = [", ".join(n for n, d in zip(names, row) if d) or "-" for row in dominated]
    for name in ("pareto", "proximity", "worst", "crs"):
        table[name] = np.round(parts[name], 3)
    return table


def toy_paired_bootstrap(n_resamples: int = 2000) -> pd.DataFrame:
    """A seed-paired bootstrap on two encoders over five seeds of one dataset
    (:func:`crsrepro.score.stats.seed_paired_bootstrap`, against a frame frozen from the same profiles).

    A beats B on four seeds of five, by a little; seed 2 is hard for both, and B wins it. Returns the per-seed profiles;
    ``attrs`` holds A's P(rank 1) and the 95 % interval of the paired CRS difference A - B.

    >>> table = toy_paired_bootstrap(500)
    >>> table.attrs["p_rank1_a"] > 0.5, table.attrs["ci_low"] <= table.attrs["ci_high"]
    (True, True)
    """
    from crsrepro.score.crs import ReferenceFrame
    from crsrepro.score.stats import seed_paired_bootstrap

    auroc_a = [0.86, 0.88, 0.78, 0.84, 0.85]
    auroc_b = [0.84, 0.85, 0.80, 0.83, 0.84]
    rows = [{"encoder": name, "dataset": "toy", "seed": seed, "auroc": auroc, "ece": 0.06,
             "retention": 0.9, "robustness": 0.9}
            for name, aurocs in (("A", auroc_a), ("B", auroc_b)) for seed, auroc in enumerate(aurocs)]
    profiles = pd.DataFrame(rows)
    result = seed_paired_bootstrap(profiles, ReferenceFrame.freeze(profiles), n_resamples=n_resamples, rng=0)
    diff = result.paired_diff_ci("A", "B")
    table = profiles.pivot(index="seed", columns="encoder", values="auroc").add_prefix("AUROC ")
    table.attrs.update(p_rank1_a=float(result.p_rank1["A"]), ci_low=diff.ci_low, ci_high=diff.ci_high,
                       estimate=diff.estimate)
    return table
