"""This run's numbers that each chapter's prose quotes, one function per chapter (DESIGN.md section 12).

Each function takes the run's :class:`crsrepro.analyse.run_analysis.RunAnalysis` and returns
``{glue name: formatted text}``: every value is read from the analysis (or from the chapter's worked
example, :mod:`crsrepro.present.teaching`), never typed, and only formatted here. The chapter glues them
(:func:`crsrepro.present.report.html.glue_numbers`) for ``{glue:text}`name``` in its prose;
:data:`crsrepro.present.chapters.CHAPTERS` says which function is whose. A value that is an
``IPython.display.Markdown`` sentence is for ``{glue:md}`name```.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.present import claims, teaching
from crsrepro.present.plots.style import short_name
from crsrepro.present.report import tables


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


def setup(analysis) -> dict[str, str]:
    """Chapter 00: the size of the run's panel and grid."""
    p, runs = analysis.profile, analysis.all_runs
    return {"n_encoders": _f(len(p.encoders)), "n_datasets": _f(len(p.datasets)), "n_seeds": _f(len(p.seeds)),
            "n_runs": _f(len(runs)), "n_rowsets": _f(analysis.results["rowset"].nunique()),
            "n_conditions": _f(runs["condition"].nunique()), "profile_name": p.name}


def discrimination(analysis) -> dict[str, str]:
    """Chapter 01: the worked AUROC, the AUROC ranking's ends, and the linear-probe fits that did not
    converge (:func:`crsrepro.analyse.probe_health.convergence_table`; the status page repeats them)."""
    from crsrepro.analyse.probe_health import convergence_table

    by_auroc = analysis.aggregate.sort_values("rank_auroc")
    toy = teaching.toy_auroc()
    table = convergence_table(analysis.results)
    fits, per_encoder = table.loc["all"], table.drop(index="all")
    return {"probe_fits": _f(int(fits["fits"])), "probe_unconverged": _f(int(fits["unconverged"])),
            "probe_unconverged_share": f"{100 * fits['unconverged_share']:.1f} %",
            "probe_unconverged_by_encoder": "; ".join(f"{short_name(e)} {100 * r['unconverged_share']:.1f} %"
                                                     for e, r in per_encoder.iterrows()),
            "toy_auroc": _f(toy.attrs["auroc"], 2), "toy_pairs_won": _f(int(toy["ranked above"].sum())),
            "auroc_leader": short_name(by_auroc.index[0]), "auroc_leader_value": _f(by_auroc["auroc"].iloc[0]),
            "auroc_last": short_name(by_auroc.index[-1]), "auroc_last_value": _f(by_auroc["auroc"].iloc[-1]),
            "auroc_spread": _f(by_auroc["auroc"].iloc[0] - by_auroc["auroc"].iloc[-1])}


def calibration(analysis) -> dict[str, str]:
    """Chapter 02: the worked ECE, what the recalibrators do, and the val split sizes they are fitted on."""
    p = analysis.profile
    recal = analysis.recalibration
    cells, summary = recal.cells, recal.summary
    temperature = cells[cells["recalibrator"] == "temperature"]
    val = tables.data_inventory(p).loc[list(p.datasets), "val"]   # the transfer sets have no val split
    return {"toy_ece": _f(teaching.toy_ece().attrs["ece"]),
            "ece_mean_before": _f(temperature["ece_before"].mean()),
            "temperature_mean_drop": _f(summary.loc["temperature", "mean_absolute_drop"]),
            "temperature_share_improved": _pct((temperature["absolute_drop"] > 0).mean()),
            "temperature_share_30": _pct((temperature["relative_reduction"] >= 0.30).mean()),
            "richer_mean_drops": ", ".join(f"{name} {_f(summary.loc[name, 'mean_absolute_drop'])}"
                                           for name in ("vector", "isotonic", "dirichlet") if name in summary.index),
            "worst_relative_change": _pct(cells["relative_reduction"].min()),
            "temperature_auroc_change": _f(summary.loc["temperature", "mean_auroc_change"], 4),
            "n_val_min": _f(int(val.min())), "n_val_max": _f(int(val.max()))}


def subgroups(table: pd.DataFrame, worst) -> dict[str, str]:
    """Chapter 02's subgroup section: ``table`` is a :func:`crsrepro.analyse.subgroups.subgroup_table`,
    ``worst`` its :func:`crsrepro.present.report.tables.worst_subgroups` (``n/a`` when None). The largest
    gaps are chosen by plug-in (as the worst subgroup is) and quoted as estimate and interval; ``p_worst``
    values say how often the worst subgroup stays the worst across the bootstrap replicates."""
    numbers = {"n_subgroups": _f(len(table[["dataset", "attribute", "subgroup"]].drop_duplicates())),
               "n_subgroups_skipped": _f(len(table.attrs.get("skipped", [])))}
    names = ("worst_auroc_gap", "worst_auroc_gap_ci", "worst_auroc_p_worst", "worst_auroc_who", "worst_auroc_where",
             "worst_ece_gap", "worst_ece_gap_ci", "worst_ece_who", "worst_ece_where", "worst_p_worst_median",
             "worst_p_worst_min", "worst_subgroup_tau", "worst_subgroup_reversed")
    if worst is None:
        return numbers | dict.fromkeys(names, "n/a")
    per_encoder = worst.per_encoder
    by_auroc, by_ece = per_encoder.sort_values("auroc_gap_plug_in"), per_encoder.sort_values("ece_gap_plug_in")
    a, e = by_auroc.iloc[0], by_ece.iloc[-1]
    interval = lambda row, m: f"[{_f(float(row[m + '_ci_low']))}, {_f(float(row[m + '_ci_high']))}]"  # noqa: E731
    values = (_f(float(a["auroc_gap"])), interval(a, "auroc_gap"), _pct(float(a["auroc_p_worst"])),
              short_name(by_auroc.index[0]), f"{a['auroc_attribute']} = {a['auroc_subgroup']} on {a['auroc_dataset']}",
              _f(float(e["ece_gap"])), interval(e, "ece_gap"), short_name(by_ece.index[-1]),
              f"{e['ece_attribute']} = {e['ece_subgroup']} on {e['ece_dataset']}",
              _pct(float(worst.cells["p_worst"].median())), _pct(float(worst.cells["p_worst"].min())),
              _f(worst.agreement.kendall_tau), _f(int(worst.agreement.reversed_pairs)))
    return numbers | dict(zip(names, values))


def label_efficiency(analysis) -> dict[str, str]:
    """Chapter 03: the worked AULC and retention, their correlations with full-label AUROC, and the
    range of retention against the chance floor 0.5 / AUROC."""
    toy = teaching.toy_retention_vs_aulc()
    corr = analysis.aulc_vs_retention.correlations
    cells = analysis.cell_means
    return {"toy_aulc_a": _f(toy.loc["A", "AULC"]), "toy_aulc_b": _f(toy.loc["B", "AULC"]),
            "toy_retention_a": _f(toy.loc["A", "retention"]), "toy_retention_b": _f(toy.loc["B", "retention"]),
            "aulc_rho_encoder": _f(corr.loc["aulc", "encoder"]), "aulc_rho_cell": _f(corr.loc["aulc", "cell"]),
            "retention_rho_encoder": _f(corr.loc["retention", "encoder"]),
            "retention_rho_cell": _f(corr.loc["retention", "cell"]),
            "smallest_fraction": _pct(min(analysis.profile.label_fractions)),
            "retention_min": _f(cells["retention"].min()), "retention_max": _f(cells["retention"].max()),
            "retention_chance_low": _f(0.5 / cells["auroc"].max()),
            "retention_chance_high": _f(0.5 / cells["auroc"].min())}


def robustness(analysis) -> dict:
    """Chapter 04: ECE rise and AUROC drop under the perturbations, and the transfer test with the
    sentence that quotes it (``transfer_sentence``, Markdown): on a profile without a transfer set the
    sentence says so and the transfer numbers are absent."""
    degradation = analysis.degradation
    worst = degradation.cells["peak_ece_rise"].idxmax()
    return {"degradation_r": _f(degradation.pearson_r), "degradation_n_cells": _f(len(degradation.cells)),
            "peak_ece_rise": _f(degradation.cells["peak_ece_rise"].max()),
            "peak_ece_cell": f"{short_name(worst[0])} on {worst[1]}",
            "mean_ece_rise": _f(degradation.cells["mean_ece_rise"].mean()),
            "mean_auroc_drop": _f(degradation.cells["mean_auroc_drop"].mean()),
            **_transfer(analysis)}


def _transfer(analysis) -> dict:
    from IPython.display import Markdown

    pair = tables.first_transfer(analysis)
    if pair is None:
        return {"transfer_sentence": Markdown(f"Profile `{analysis.profile.name}` names no transfer set, so it "
                                              "measures no institution shift.")}
    welch = analysis.transfer_test(*pair)
    numbers = {"transfer_medical": _f(welch.mean_medical), "transfer_general": _f(welch.mean_general),
               "transfer_p": _f(welch.p_value), "transfer_n_medical": _f(welch.n_medical),
               "transfer_n_general": _f(welch.n_general),
               "transfer_medical_members": ", ".join(
                   f"{short_name(encoder)} {_f(row['target_auroc'])}"
                   for encoder, row in welch.table[welch.table["group"] == "medical"].iterrows())}
    sentence = (f"After transfer from {pair[0]} to {pair[1]}, medical-pretrained encoders reach "
                f"**{numbers['transfer_medical']}** AUROC (**{numbers['transfer_n_medical']}** encoders) against "
                f"**{numbers['transfer_general']}** for general ones (**{numbers['transfer_n_general']}**), "
                f"Welch p = **{numbers['transfer_p']}**. With a handful of encoders per group a t-test has little "
                "power: a large p here says this run cannot tell, not that the paper is wrong.")
    return {**numbers, "transfer_sentence": Markdown(sentence)}


def crs_bootstrap(analysis) -> dict[str, str]:
    """Chapter 05: the worked Pareto share and paired bootstrap, the CRS range and how much of it the
    clipping fixes, the CRS leader, the AUROC-vs-CRS agreement, the bootstrap, the two-level intervals
    and the agreement under each probe."""
    scores, agreement, bootstrap = analysis.scores, analysis.rank_agreement, analysis.bootstrap
    aggregate = analysis.aggregate
    normalised = scores[[c for c in scores.columns if c.startswith("p_")]].to_numpy()
    toy, pareto = teaching.toy_paired_bootstrap(), teaching.toy_pareto()
    return {"toy_pareto_a": _f(pareto.loc["A", "pareto"], 2), "toy_pareto_c": _f(pareto.loc["C", "pareto"], 2),
            "toy_boot_p_a": _f(toy.attrs["p_rank1_a"], 2), "toy_boot_low": _f(toy.attrs["ci_low"]),
            "toy_boot_high": _f(toy.attrs["ci_high"]),
            "crs_min": _f(scores["crs"].min()), "crs_max": _f(scores["crs"].max()),
            "share_clipped": _pct(np.isin(normalised, (0.0, 1.0)).mean()),
            "share_zero": _pct((normalised == 0.0).mean()),
            "share_no_dominance": _pct((scores["pareto"] == 0.0).mean()),
            "crs_leader": short_name(aggregate.index[0]), "crs_leader_value": _f(aggregate["crs"].iloc[0]),
            "crs_leader_auroc_rank": _f(int(aggregate["rank_auroc"].iloc[0])),
            "kendall_tau": _f(agreement.kendall_tau), "reversed_pairs": _f(int(agreement.reversed_pairs)),
            "n_pairs": _f(int(agreement.n_pairs)), "p_rank1_leader": _f(bootstrap.p_rank1.max(), 2),
            "p_rank1_who": short_name(bootstrap.p_rank1.idxmax()),
            "n_resamples": _f(int(bootstrap.n_resamples)),
            **_two_level(analysis), **_probes(analysis.probe_conclusions)}


def _two_level(analysis) -> dict[str, str]:
    """Chapter 05's lead: the two-level CRS bootstrap (seeds x test cases) beside the paper's seed-only one."""
    boot, seed = analysis.crs_bootstrap, analysis.bootstrap
    dims = tables.two_level_intervals(analysis)
    seed_only = seed.interval()
    two_level = boot.interval()
    leader = boot.p_rank1.idxmax()
    diff = boot.leader_difference()
    return {"two_level_auroc_width": _f(float(dims["auroc_width"].median())),
            "two_level_ece_width": _f(float(dims["ece_width"].median())),
            "n_case_resamples": _f(int(boot.n_resamples)),
            "two_level_leader": short_name(leader), "two_level_p_rank1": _f(float(boot.p_rank1[leader]), 2),
            "two_level_p_rank1_seed": _f(float(seed.p_rank1.get(leader, np.nan)), 2),
            "two_level_diff_a": short_name(diff.a), "two_level_diff_b": short_name(diff.b),
            "two_level_diff": _f(diff.estimate), "two_level_diff_low": _f(diff.ci_low),
            "two_level_diff_high": _f(diff.ci_high),
            "two_level_separable": "separates" if diff.ci_low > 0 else "does not separate",
            "two_level_crs_width": _f(float((two_level["ci_high"] - two_level["ci_low"]).median())),
            "seed_only_crs_width": _f(float((seed_only["ci_high"] - seed_only["ci_low"]).median()))}


def coverage(table) -> dict[str, str]:
    """Chapter 05's coverage of a 5-seed interval (:func:`tables.seed_count_coverage`), glued for the
    chapter and read back by the build status page (``coverage_seeds``, ``coverage_two_level``); dashes when
    the check was skipped (a note instead of a table)."""
    if not isinstance(table, pd.DataFrame):
        return {"coverage_seeds": "-", "coverage_two_level": "-", "coverage_profile": "-"}
    return {"coverage_seeds": _f(float(table.loc["seeds", "coverage"])),
            "coverage_two_level": _f(float(table.loc["seeds x cases", "coverage"])),
            "coverage_profile": str(table["profile"].iloc[0])}


def _probes(conclusions: pd.DataFrame) -> dict[str, str]:
    """AUROC-vs-CRS agreement under each probe (do the conclusions depend on the classifier?)."""
    tau = conclusions["auroc_crs_kendall_tau"]
    return {"n_probes": _f(len(conclusions)), "probe_tau_min": _f(float(tau.min())), "probe_tau_max": _f(float(tau.max())),
            "probe_tau_linear": _f(float(tau.get("linear", np.nan)))}


def sensitivity(analysis) -> dict[str, str]:
    """Chapter 05b: the sentences naming the [ours] choice that matters most over the multiverse and the
    levels that never move any conclusion (:func:`crsrepro.analyse.sensitivity.matters_most` and
    :func:`crsrepro.analyse.sensitivity.inert_sentence` of :attr:`RunAnalysis.multiverse`)."""
    from crsrepro.analyse.sensitivity import choice_effects, inert_sentence, matters_most

    return {"sensitivity_matters_most": matters_most(choice_effects(analysis.multiverse)),
            "sensitivity_inert": inert_sentence(analysis.multiverse)}


def layer_depth(analysis) -> dict[str, str]:
    """Chapter 06: the val-chosen intermediate wins beside the exchangeable-tap null, the largest gain over
    the 100 % tap, the one-sided Holm-corrected paired tests (how many survive, where the intermediate tap
    is worse) and the ranking when the depth is chosen on val, from :mod:`crsrepro.analyse.depth`'s analyses
    of the sweep. Each count is given against ``depth100`` (``depth_*``) and ``final`` (``depth_final_*``)."""
    from crsrepro.analyse import depth

    table = analysis.depth
    best = depth.best_depths(table)
    top = best.loc[best["gain"].idxmax()]
    counts = depth.win_counts(table)
    agreement, _ = depth.val_selected_ranking(table)
    out = {"depth_pairs": _f(int(counts.loc["depth100", "pairs"])), "depth_n_seeds": _f(int(table["seed"].nunique())),
           "depth_alpha": f"{100 * depth.ALPHA:.0f} %", "depth_top_gain_points": _f(100 * float(top["gain"]), 1),
           "depth_top_pair": f"{short_name(top['encoder'])} on {top['dataset']}",
           "depth_top_depth": f"{top['best_depth']:.0f} %",
           "depth_val_tau": _f(agreement.kendall_tau), "depth_val_reversed": _f(int(agreement.reversed_pairs)),
           "depth_val_n_pairs": _f(int(agreement.n_pairs))}
    for reference, prefix in (("depth100", "depth_"), ("final", "depth_final_")):
        tests, row = depth.paired_test(table, reference), counts.loc[reference]
        worse = tests[tests["worse"]]
        out |= {f"{prefix}wins": _f(int(row["wins"])), f"{prefix}wins_null": _f(float(row["expected"]), 2),
                f"{prefix}wins_p": _f(float(row["p_value"])), f"{prefix}n_significant": _f(int(tests["survives"].sum())),
                f"{prefix}n_worse": _f(len(worse)),
                f"{prefix}worse_pairs": "; ".join(f"{short_name(e)} on {d}" for e, d in zip(worse["encoder"], worse["dataset"]))
                or "none"}
    return out


def lora(analysis) -> dict[str, str]:
    """Chapter 07: this run's LoRA plan, the per-domain agreement and gains, the four-dimensional
    comparison (each regime among its own peers, and the frozen-peer version beside it), and the GPU-hours
    of the paper's protocol (:func:`crsrepro.run.plan.paper_gpu_hours`)."""
    from crsrepro.analyse.lora import lora_fractions
    from crsrepro.run.plan import THROUGHPUTS, paper_gpu_hours

    rows, comparison = analysis.lora_results, analysis.lora
    domains, crs = comparison.per_domain, comparison.crs
    mover = comparison.movers.iloc[0]
    return {"lora_epochs": _f(int(rows.attrs["epochs"])), "lora_n_seeds": _f(int(rows["seed"].nunique())),
            "lora_n_encoders": _f(int(rows["encoder"].nunique())), "lora_n_domains": _f(len(domains)),
            "lora_tau_min": _f(float(domains["kendall_tau"].min())), "lora_tau_max": _f(float(domains["kendall_tau"].max())),
            "lora_leader_changes": _f(int(domains["leader_changed"].sum())),
            "lora_gain_min": _f(float(domains["auroc_gain"].min())), "lora_gain_max": _f(float(domains["auroc_gain"].max())),
            "lora_n_domains_below_frozen": _f(int((domains["auroc_gain"] < 0).sum())),
            "lora_tau_ci": "; ".join(f"{r.dataset} {tables.interval_text(r.kendall_tau, r.tau_ci_low, r.tau_ci_high)}"
                                     for r in domains.itertuples()),
            "lora_fractions": ", ".join(f"{100 * f:g} %" for f in lora_fractions(rows)),
            "lora_crs_tau": _f(crs.kendall_tau), "lora_crs_shift": _f(crs.mean_abs_rank_shift, 2),
            "lora_crs_tau_frozen_peers": (_f(comparison.crs_frozen_peers.kendall_tau)
                                          if comparison.crs_frozen_peers is not None else "n/a"),
            "lora_top3_hold": "hold" if comparison.top3_hold else "do not hold",
            "lora_top_mover": (f"The largest mover is {short_name(comparison.movers.index[0])}, from rank "
                               f"{int(mover['rank_a'])} to {int(mover['rank_b'])}." if mover["rank_a"] != mover["rank_b"]
                               else "No encoder changes rank."),
            "paper_gpu_hours": _f(paper_gpu_hours(), 1),
            "lora_gpu_rate": _f(int(THROUGHPUTS["gpu_lora_vit_b16"].value)),
            "lora_gpu_rate_source": THROUGHPUTS["gpu_lora_vit_b16"].source}


def claims_page(analysis) -> dict[str, str]:
    """Chapter 08: how many claims the run's claims page (:func:`crsrepro.present.claims.run_claims`) holds,
    and how many have each status."""
    page = claims.run_claims(analysis)
    counts = page["status"].value_counts()
    return {"n_claims": _f(len(page)),
            **{f"n_{s.replace(' ', '_')}": _f(int(counts.get(s, 0))) for s in claims.STATUSES}}


def score_your_encoder(analysis, score=None) -> dict[str, str]:
    """Chapter 10: the book's profile and the size of its frozen panel; given ``score`` (the worked example's
    :class:`crsrepro.analyse.new_encoder.NewcomerScore`), instead the example's aggregate CRS, its two-level
    interval, its rank and P(rank 1), the members it dominates everywhere, and the frame's hash and the
    package version it cites (other names, so that the chapter glues each once)."""
    if score is None:
        return {"newcomer_profile": analysis.profile.name, "newcomer_n_panel": _f(len(analysis.profile.encoders))}
    a = score.aggregate
    return {"newcomer_id": score.encoder, "newcomer_crs": _f(a["crs"]), "newcomer_ci_low": _f(a["ci_low"]),
            "newcomer_ci_high": _f(a["ci_high"]), "newcomer_level": _pct(a["level"]),
            "newcomer_n_resamples": _f(int(a["n_resamples"])), "newcomer_rank": _f(int(a["rank"])),
            "newcomer_n_ranked": _f(int(a["n_published"]) + 1), "newcomer_p_rank1": _f(a["p_rank1"], 2),
            "newcomer_n_datasets": _f(len(score.cells)),
            "newcomer_dominates": a["dominates_everywhere"] or "no panel member",
            "newcomer_frame_hash": score.frame_hash[:16], "newcomer_version": score.version}
