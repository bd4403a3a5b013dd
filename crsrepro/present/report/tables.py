"""The tables the book shows: inventories of the data and the encoders, and the per-dimension summaries.

Each function takes a profile, the tidy results table (:mod:`crsrepro.run.results`) or a
:class:`crsrepro.analyse.run_analysis.RunAnalysis` and returns a :class:`pandas.DataFrame` ready to
display; the notebooks call one function per table. Where the profile cannot give the table (no
transfer set, no subgroup with enough cases) the function returns a note
(:func:`crsrepro.present.report.html.admonition`) or None (nothing shown) instead, and says which. The
choices a chapter makes for its figures (the example dataset, the reference encoder) are made here too,
so that no cell decides one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.core.schema import LOWER_IS_BETTER
from crsrepro.core.vocab import CLEAN
from crsrepro.present.report.html import admonition, paragraph
from crsrepro.profiles import Profile


def data_inventory(profile: Profile, *, manifest_dir=None) -> pd.DataFrame:
    """One row per dataset: task, classes, images, groups, the size of each split, and the labels the
    grid leaves out (a multi-label label without a positive or a negative in some split, [ours]).

    The test split is fixed; train and val are redrawn per run seed (DESIGN.md section 3), so their
    sizes are those of the profile's first seed (``seed_<s>`` column of the manifest).
    """
    from crsrepro.data import prepare_dataset
    from crsrepro.data.manifests import seed_column
    from crsrepro.run.views import learnable_labels

    column = seed_column(profile.seeds[0])
    rows = []
    for name in profile.all_datasets():
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        counts = table[column if column in table.columns else "split"].value_counts()
        left_out = learnable_labels(table, profile.seeds).attrs.get("labels_left_out", []) if name in profile.datasets else []
        rows.append({"dataset": name, "task": table.attrs["task"], "classes or labels": len(table.attrs["label_names"]),
                     "images": len(table), "groups": table["group"].nunique(),
                     **{split: int(counts.get(split, 0)) for split in ("train", "val", "test", "transfer")},
                     "labels left out": ", ".join(left_out)})
    return pd.DataFrame(rows).set_index("dataset")


def label_prevalence(profile: Profile, *, manifest_dir=None) -> pd.DataFrame:
    """The share of positives per class or label in each dataset (the class imbalance a probe faces), as the
    page prints it: three decimals, and blank where a dataset has no such class or label (not ``NaN``, which
    reads as missing data)."""
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
    return pd.DataFrame(columns).map(lambda share: "" if np.isnan(share) else f"{share:.3f}")


def encoder_inventory(profile: Profile) -> pd.DataFrame:
    """The frozen spec of every encoder in the panel (DESIGN.md section 4)."""
    from crsrepro.encoders import get_encoder_spec

    rows = []
    for encoder_id in profile.encoders:
        spec = get_encoder_spec(encoder_id)
        rows.append({"encoder": spec.id, "family": spec.family, "loader": spec.loader,
                     "architecture": spec.architecture, "input": spec.input_size,
                     "interpolation": spec.interpolation, "pooling": spec.pooling, "dim": spec.embed_dim,
                     "layer taps": ", ".join(spec.layer_taps), "licence": spec.licence,
                     "excluded from": ", ".join(spec.excluded_datasets) or "-"})
    return pd.DataFrame(rows).set_index("encoder")


# --------------------------------------------------------------------------- the dimensions, per encoder

def primary_runs(results: pd.DataFrame, *, condition: str | None = CLEAN,
                 label_fraction: float | None = 1.0) -> pd.DataFrame:
    """The wide per-run rows of the primary protocol (:data:`crsrepro.core.schema.PRIMARY`: frozen linear
    probe, final layer, no recalibration; :func:`crsrepro.score.dimensions.select_runs`).

    ``condition`` and ``label_fraction`` select runs; None keeps every condition or fraction.
    """
    from crsrepro.run.results import runs_table
    from crsrepro.score.dimensions import select_runs

    return select_runs(runs_table(results), condition=condition, label_fraction=label_fraction)


def metric_table(results: pd.DataFrame, metric: str = "auroc") -> pd.DataFrame:
    """A metric of the primary protocol per encoder and dataset (mean ± sd over seeds), ranked by
    its mean over the encoder's available cells (in the metric's direction,
    :data:`crsrepro.core.schema.METRICS`); missing cells are never imputed.

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


def example_dataset(profile: Profile, example_dataset: str | None = None) -> str:
    """The dataset of a chapter's per-dataset figures: ``example_dataset`` (a chapter's parameter), else
    the profile's first.

    >>> from types import SimpleNamespace
    >>> example_dataset(SimpleNamespace(datasets=("isic2019", "chexpert"))), \\
    ...     example_dataset(SimpleNamespace(datasets=("isic2019", "chexpert")), "chexpert")
    ('isic2019', 'chexpert')
    """
    return example_dataset or profile.datasets[0]


def contrast_dataset(profile: Profile, example: str | None = None) -> str | None:
    """The dataset a chapter draws beside its example (:func:`example_dataset` of ``example``) for
    contrast: the profile's last, or None (nothing drawn) when that is the example itself.

    >>> from types import SimpleNamespace
    >>> contrast_dataset(SimpleNamespace(datasets=("isic2019", "chexpert"))), \\
    ...     contrast_dataset(SimpleNamespace(datasets=("isic2019",)))
    ('chexpert', None)
    """
    last = profile.datasets[-1]
    return None if last == example_dataset(profile, example) else last


def absolute_label_efficiency(analysis, reference_encoder: str | None = None) -> pd.DataFrame:
    """Chapter 03's absolute label efficiency: AUROC at the profile's smallest label fraction per cell,
    against a reference encoder's full-label AUROC
    (:meth:`crsrepro.analyse.run_analysis.RunAnalysis.absolute_label_efficiency`).

    The reference is ``reference_encoder`` (a chapter's parameter), else ViT-B/16 when the panel has it
    (the paper's bar, as on the claims page), else the panel's first encoder.
    """
    from crsrepro.present.measurements import VIT_B16

    encoders = analysis.profile.encoders
    reference = reference_encoder or (VIT_B16 if VIT_B16 in encoders else encoders[0])
    return analysis.absolute_label_efficiency(min(analysis.profile.label_fractions), reference)


# --------------------------------------------------------------------------- transfer

def first_transfer(analysis) -> tuple[str, str] | None:
    """The profile's first (source, target) transfer pair (CheXpert -> MIMIC-CXR on the paper's profiles),
    or None when it names no transfer set."""
    return next(((source, targets[0]) for source, targets in analysis.profile.transfer.items() if targets), None)


def _no_transfer(analysis):
    return admonition("note", "No transfer set", paragraph(
        f"Profile {analysis.profile.name} names no transfer set (its key `transfer` is empty), so there is no "
        "institution shift to measure here; the `demo` and `paper` profiles have one."))


def transfer_table(analysis) -> pd.DataFrame | None:
    """Transfer AUROC without retraining, one column per (source -> target) pair of the profile (MIMIC-CXR,
    and NIH ChestX-ray14 when the profile names it), beside each source's clean AUROC; seed means of the
    primary protocol, from :attr:`crsrepro.analyse.run_analysis.RunAnalysis.all_runs` (every transfer target,
    whether or not it enters robustness). A missing cell is ``NaN``, never imputed. None (nothing shown)
    when the profile names no transfer set.
    """
    from crsrepro.score.dimensions import select_runs

    runs = select_runs(analysis.all_runs, label_fraction=1.0)
    columns = {}
    for source, targets in analysis.profile.transfer.items():
        on_source = runs[runs["dataset"] == source]
        columns[f"{source} (clean)"] = on_source[on_source["condition"] == CLEAN].groupby("encoder")["auroc"].mean()
        for target in targets:
            columns[f"{source} -> {target}"] = on_source[on_source["condition"] == target].groupby("encoder")["auroc"].mean()
    if not columns:
        return None  # chapter 04's transfer_figure says why
    table = pd.DataFrame(columns).round(3)
    table.index.name = "encoder"
    return table


def transfer_figure(analysis):
    """Chapter 04's transfer bars (:func:`crsrepro.present.plots.transfer_bars` on the first transfer pair), or a
    note when the profile names no transfer set."""
    from crsrepro.present import plots

    pair = first_transfer(analysis)
    return plots.transfer_bars(analysis.all_runs, source=pair[0], target=pair[1]) if pair else _no_transfer(analysis)


def transfer_welch(analysis):
    """Welch's test of transfer AUROC, medical vs general (:meth:`RunAnalysis.transfer_test` on the first
    transfer pair) as a table of its scalars; None (nothing shown: :func:`transfer_figure` said why) when
    the profile names no transfer set."""
    pair = first_transfer(analysis)
    return scalars(analysis.transfer_test(*pair)) if pair else None


def external_validity(analysis):
    """Chapter 05's external validity (:meth:`RunAnalysis.external_validity` on the first transfer pair):
    rho(CRS, target AUROC), rho(source AUROC, target AUROC) and their difference, each with ``estimate,
    ci_low, ci_high, plug_in`` (encoder bootstrap) and the number of encoders; a note when the profile
    names no transfer set."""
    pair = first_transfer(analysis)
    if pair is None:
        return _no_transfer(analysis)
    result = analysis.external_validity(*pair)
    return result.intervals.assign(n_encoders=len(result.table)).round(3)


def interval_text(estimate: float, low: float, high: float, digits: int = 3) -> str:
    """An estimate and its interval as one cell, ``"estimate [low, high]"``; ``"estimate (no interval)"`` where a
    bound is not finite (one seed: nothing to resample), and ``"n/a"`` where the estimate is not.

    >>> interval_text(0.5, 0.41, 0.6), interval_text(0.333, float("nan"), float("nan")), interval_text(float("nan"), 0, 1)
    ('0.500 [0.410, 0.600]', '0.333 (no interval)', 'n/a')
    """
    if not np.isfinite(estimate):
        return "n/a"
    if not (np.isfinite(low) and np.isfinite(high)):
        return f"{estimate:.{digits}f} (no interval)"
    return f"{estimate:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def with_intervals(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """``table`` with each value that has ``<m>_ci_low`` and ``<m>_ci_high`` columns written as one column by
    :func:`interval_text` and its ``<m>_plug_in`` dropped, so that a table of intervals fits the page.

    >>> t = pd.DataFrame({"a": [0.5], "a_ci_low": [0.41], "a_ci_high": [0.6], "a_plug_in": [0.5], "n": [3]})
    >>> with_intervals(t).to_dict("records")
    [{'a': '0.500 [0.410, 0.600]', 'n': 3}]
    """
    out = table.copy()
    for column in [c for c in table.columns if f"{c}_ci_low" in table.columns and f"{c}_ci_high" in table.columns]:
        low, high = f"{column}_ci_low", f"{column}_ci_high"
        out[column] = [interval_text(v, lo, hi, digits) for v, lo, hi in zip(table[column], table[low], table[high])]
        out = out.drop(columns=[c for c in (low, high, f"{column}_plug_in") if c in out.columns])
    return out


def lora_per_domain(analysis) -> pd.DataFrame:
    """Chapter 07's per-domain table of the frozen-vs-LoRA comparison (:func:`crsrepro.analyse.lora.compare`):
    Kendall tau with its seed-bootstrap interval in one column, ``"(no interval)"`` where the fine-tunes have one
    seed, and the AUROC gain to three decimals."""
    table = analysis.lora.per_domain.rename(columns={"tau_ci_low": "kendall_tau_ci_low",
                                                     "tau_ci_high": "kendall_tau_ci_high"})
    return with_intervals(table).round({"auroc_gain": 3}).set_index("dataset")


def transfer_thresholds(analysis, shifts: pd.DataFrame):
    """The rows of :func:`crsrepro.analyse.operating_points.severity_summary` for the transfer sets (no severity),
    each value with its interval (:func:`with_intervals`), one row per encoder, dataset, operating point and
    transfer set; None (nothing shown) when the profile names no transfer set."""
    if first_transfer(analysis) is None:
        return None
    rows = shifts[shifts["severity"].isna()].drop(columns=["perturbation", "severity"])
    return with_intervals(rows).set_index(["encoder", "dataset", "operating_point", "condition"])


# --------------------------------------------------------------------------- uncertainty

def crs_bootstrap_table(analysis, level: float = 0.95) -> pd.DataFrame:
    """Per encoder, best first: the published CRS, then the two-level bootstrap (seeds x test cases,
    :attr:`crsrepro.analyse.run_analysis.RunAnalysis.crs_bootstrap`: bias-corrected ``estimate`` with its
    ``level`` interval, P(rank 1), P(top 3)) beside the paper's seed-only bootstrap
    (:attr:`~crsrepro.analyse.run_analysis.RunAnalysis.bootstrap`, the same columns prefixed ``seed_``)."""
    two_level = analysis.crs_bootstrap.summary(level).set_index("encoder")
    seed = analysis.bootstrap.interval(level).join(analysis.bootstrap.p_rank1).join(analysis.bootstrap.p_top3)
    table = pd.DataFrame({"published CRS": two_level["plug_in"], "estimate": two_level["estimate"],
                          "ci_low": two_level["ci_low"], "ci_high": two_level["ci_high"],
                          "p_rank1": two_level["p_rank1"], "p_top3": two_level["p_top3"]})
    for column in ("estimate", "ci_low", "ci_high", "p_rank1", "p_top3"):
        table[f"seed_{column}"] = seed[column].reindex(table.index)
    return table.round(3)


def two_level_intervals(analysis, level: float = 0.95) -> pd.DataFrame:
    """Per dataset and encoder, the ``level`` interval of every raw dimension (D, C, L, R) from the same
    two-level draw as the CRS (:meth:`crsrepro.score.stats.CrsBootstrapResult.dimension_intervals`), with
    each interval's width."""
    return analysis.crs_bootstrap.dimension_intervals(level)


def seed_count_coverage(coverage_profile: str | None, n_seeds: int = 5):
    """How often an ``n_seeds``-seed bootstrap interval covers the estimate of a run with many seeds
    (:meth:`crsrepro.analyse.run_analysis.RunAnalysis.seed_count_coverage` on ``coverage_profile``, e.g.
    ``demo-seeds20``): one row for the paper's seed bootstrap and one for the two-level bootstrap; a note
    instead when ``coverage_profile`` is empty (the smoke book skips it).

    The coverage profile's results must exist (``crsrepro book`` runs its grid first).
    """
    from crsrepro.analyse.run_analysis import RunAnalysis

    if not coverage_profile:
        return admonition("note", "Coverage of a few-seed bootstrap: not run here", paragraph(
            "This build sets `coverage_profile` empty, so the coverage check is skipped. Run the chapter with "
            "`-p coverage_profile demo-seeds20` to measure it on a 20-seed run."))
    analysis = RunAnalysis.load(coverage_profile)
    rows = []
    for two_level, n_subsets, n_resamples in ((False, 40, 1000), (True, COVERAGE_TWO_LEVEL_SUBSETS,
                                                                  COVERAGE_TWO_LEVEL_RESAMPLES)):
        table = analysis.seed_count_coverage(n_seeds, n_subsets, two_level=two_level, n_resamples=n_resamples)
        attrs = table.attrs
        rows.append({"bootstrap": attrs["bootstrap"], "profile": coverage_profile, "seeds per interval": attrs["n_seeds"],
                     "seeds of the run": attrs["n_all_seeds"], "subsets": attrs["n_subsets"],
                     "replicates": attrs["n_resamples"], "pairs": len(table), "nominal": attrs["level"],
                     "coverage": round(attrs["coverage"], 3), "mean width": round(float(table["mean_width"].mean()), 3)})
    return pd.DataFrame(rows).set_index("bootstrap")


#: [ours] The two-level coverage check's size: each subset runs a whole CRS bootstrap over the 20-seed run's cases,
#: so it uses fewer subsets and replicates than the seed-only check (40 x 1000); its coverage is correspondingly coarse.
COVERAGE_TWO_LEVEL_SUBSETS = 10
COVERAGE_TWO_LEVEL_RESAMPLES = 100


# --------------------------------------------------------------------------- subgroups

def worst_subgroups(analysis, table: pd.DataFrame):
    """:func:`crsrepro.analyse.subgroups.worst_subgroup` of a :func:`crsrepro.analyse.subgroups.subgroup_table`, or None
    when no subgroup was scored (a small run, e.g. smoke, whose test splits are below ``MIN_CASES`` per
    subgroup): :func:`crsrepro.present.report.numbers.subgroups` and :func:`worst_subgroup_summary` then say so."""
    from crsrepro.analyse.subgroups import worst_subgroup

    return worst_subgroup(analysis, table) if len(table) else None


def worst_subgroup_summary(table: pd.DataFrame, worst):
    """Per encoder, its largest AUROC drop and largest ECE rise over its subgroups, and where
    (``worst.per_encoder``); a note naming the skipped subgroups' count when none was scored."""
    from crsrepro.analyse.subgroups import MIN_CASES

    if worst is None:
        return admonition("note", "No subgroup scored in this run", paragraph(
            f"Every subgroup of this run's test splits has fewer than {MIN_CASES} cases or lacks an outcome "
            f"({len(table.attrs.get('skipped', []))} skipped); the `demo` and `paper` profiles have enough."))
    shown = with_intervals(worst.per_encoder)  # auroc_gap and ece_gap as "estimate [low, high]"
    where = {m: shown[f"{m}_dataset"] + ": " + shown[f"{m}_attribute"] + " = " + shown[f"{m}_subgroup"].astype(str)
             for m in ("auroc", "ece")}
    return pd.DataFrame({"largest AUROC drop [95 % CI]": shown["auroc_gap"], "AUROC drop in": where["auroc"],
                         "p_worst": shown["auroc_p_worst"].round(2),
                         "largest ECE rise [95 % CI]": shown["ece_gap"], "ECE rise in": where["ece"]})


def largest_subgroup_drops(table: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    """The ``n`` subgroups of a :func:`crsrepro.analyse.subgroups.subgroup_table` with the largest AUROC drop,
    each metric and gap written ``estimate [low, high]`` (:func:`with_intervals`), without the
    whole-test-set columns the gaps already use, so that the table fits the page."""
    shown = table.sort_values("auroc_gap").head(n).drop(columns=["auroc_whole", "ece_whole"])
    return with_intervals(shown).set_index(["encoder", "dataset", "attribute", "subgroup"]).round(2)


# --------------------------------------------------------------------------- the CRS

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


def crs_table(analysis) -> pd.DataFrame:
    """Chapter 05's per-cell table: the four normalised dimensions and the CRS with its three terms, by
    (encoder without its namespace, dataset), rounded to 3 digits (the raw dimensions are in chapters 01-04)."""
    from crsrepro.present.plots.style import short_name
    from crsrepro.score.crs import NORMALISED

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


def median_cell(analysis, dataset: str, *, recalibrator: str = "temperature") -> tuple[str, int]:
    """The (encoder, seed) of ``dataset`` whose full-label linear probe has the median relative ECE change
    under ``recalibrator`` on the clean test split (the lower median of an even count) [ours]: the worked
    reliability diagram of chapter 02 shows a typical cell, chosen by this rule, not the first seed of the
    leader (which can be the cell where recalibration hurt)."""
    from crsrepro.core.vocab import NO_RECALIBRATION
    from crsrepro.score.dimensions import select_runs

    rows = select_runs(analysis.runs, recalibrator=None, dataset=dataset, condition=CLEAN, label_fraction=1.0)
    ece = rows.pivot_table(index=["encoder", "seed"], columns="recalibrator", values="ece")
    change = ((ece[NO_RECALIBRATION] - ece[recalibrator]) / ece[NO_RECALIBRATION]).dropna().sort_values(kind="stable")
    if change.empty:
        raise ValueError(f"no {recalibrator} run on {dataset} to choose a cell from")
    encoder, seed = change.index[(len(change) - 1) // 2]
    return str(encoder), int(seed)


def reliability_inputs(analysis, encoder: str | None = None, dataset: str | None = None, *, seed: int | None = None,
                       recalibrator: str = "temperature", condition: str = CLEAN) -> dict:
    """One full-label linear probe's test labels and probabilities, before and after ``recalibrator``,
    as keyword arguments of :func:`crsrepro.present.plots.reliability_diagram`.

    The probabilities are :meth:`crsrepro.analyse.run_analysis.RunAnalysis.case_probabilities` (the row-set's
    case file) of ``encoder``'s ``seed``. ``dataset`` defaults to the profile's first
    (:func:`example_dataset`); with neither ``encoder`` nor ``seed`` given, the cell is
    :func:`median_cell` by temperature scaling (the same cell for every recalibrator's diagram), else
    ``encoder`` defaults to the AUROC leader and ``seed`` to the first.
    """
    from crsrepro.core.vocab import NO_RECALIBRATION
    from crsrepro.data import get_dataset_spec

    dataset = example_dataset(analysis.profile, dataset)
    rule = ""
    if encoder is None and seed is None:
        encoder, seed = median_cell(analysis, dataset)
        rule = "; the median cell by temperature scaling's ECE change"
    encoder = encoder or analysis.aggregate["rank_auroc"].idxmin()
    seed = analysis.profile.seeds[0] if seed is None else seed
    index = list(analysis.profile.seeds).index(seed)
    labels, before = analysis.case_probabilities(dataset, condition=condition, recalibrator=NO_RECALIBRATION)
    _, after = analysis.case_probabilities(dataset, condition=condition, recalibrator=recalibrator)
    return {"y_true": labels, "probs_before": before[encoder][index].astype(float),
            "probs_after": after[encoder][index].astype(float), "task": get_dataset_spec(dataset).task,
            "labels": ("no recalibration", recalibrator),
            "title": f"{encoder} on {dataset} (seed {seed}, {condition}{rule})"}
