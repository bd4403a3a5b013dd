"""The measurements of the claims page, read from one :class:`~crsrepro.analyse.run_analysis.RunAnalysis`.

:func:`measure` returns ``{measurement name: value}`` for every quantity the claims file
(:mod:`crsrepro.present.claims`) names and this run supports. Each value is read from the same analysis
object the chapters read (its cached tables and analyses), so a chapter and the claims page always
show the same number. Measurement names are described in :mod:`crsrepro.present.claims`, which sets them
beside the paper's (:func:`crsrepro.present.claims.run_claims`). An analysis that the results cannot support
(too few encoders, no transfer set, no encoder with depth taps ...) is left out and logged, never filled in.
The layer-depth and LoRA measurements read :attr:`RunAnalysis.depth` and :attr:`RunAnalysis.lora`: the tables
the depth sweep and the LoRA grid stored.
"""

from __future__ import annotations

import inspect
import logging
from itertools import permutations

import numpy as np
import pandas as pd

from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import manifest_dir as default_manifest_dir
from crsrepro.core.vocab import CLEAN, MEDICAL_FAMILIES
from crsrepro.profiles import Profile, load_profile

logger = logging.getLogger(__name__)

# The paper's reference encoders in its label-efficiency sentence (section "Results").
VIT_B16, MAE, RESNET50 = "general.vit_b16", "general.mae", "general.resnet50"
CHEXPERT = "chexpert"
CLAIMS_RECALIBRATOR = "temperature"
"""[ours] The recalibrator whose results stand for the paper's recalibration figures: the review gives
one range (54-77 %) and one mean over "six main tests" without naming the method or the tests."""


def _robustness_transfers(a: RunAnalysis) -> list[tuple[str, str]]:
    """The (source, target) transfer pairs whose drop enters robustness (the paper: CheXpert -> MIMIC-CXR)."""
    return [(source, target) for source, targets in a.profile.transfer.items() for target in targets
            if target in a.profile.robustness_transfer]


def _worked_examples() -> dict:
    """The review's illustrations, measured with the library's own metrics."""
    from crsrepro.core.metrics import expected_calibration_error, macro_auroc

    # "when the model says 90 % it is right about 75 % of the time": 20 cases at confidence 0.9, 15 right
    y = np.array([0] * 15 + [1] * 5)
    says_90 = np.tile([0.9, 0.1], (20, 1))
    labels = np.array([0, 1] * 10)
    return {"ece_worked_example": expected_calibration_error(y, says_90, task="multiclass"),
            "auroc_perfect_ranking": macro_auroc(labels, np.eye(2)[labels], task="multiclass"),
            "auroc_constant_score": macro_auroc(labels, np.full((20, 2), 0.5), task="multiclass")}


def _protocol_measures() -> dict:
    """What the paper's protocol fixes, read from the paper profile (its grid), the run grid and the
    library's defaults (LoRA's rank and alpha; the epochs and seeds LoRA trained are measured from its
    results, :func:`_lora_trained_measures`)."""
    from crsrepro.core.metrics import expected_calibration_error
    from crsrepro.data import DATASETS
    from crsrepro.fit.controls import KNNProbe
    from crsrepro.run.grid import cells, enumerate_runs
    from crsrepro.run.lora import LoraParams
    from crsrepro.score.crs import DEFAULT_WEIGHTS

    paper = load_profile("paper")
    runs = enumerate_runs(paper)
    n = len(paper.encoders)
    below_full = [f for f in paper.label_fractions if f < 1]
    return {
        "paper_grid_runs": len(runs), "paper_grid_rows": len(runs.drop(columns="seed").drop_duplicates()),
        "paper_grid_cells": len(cells(paper)), "paper_grid_possible_cells": n * len(paper.datasets),
        "paper_panel_encoders": n, "paper_panel_pairs": n * (n - 1) // 2,
        "paper_training_datasets": len(paper.datasets),
        "paper_datasets": len(paper.all_datasets()),
        "paper_transfer_pairs": len(paper.transfer), "paper_seeds": len(paper.seeds),
        "paper_label_fraction_range": (min(below_full), max(below_full)),
        "paper_perturbations": len(paper.perturbations), "paper_severities": len(paper.severities),
        "paper_bootstrap_resamples": paper.bootstrap.n_resamples,
        "paper_control_probes": len(paper.control_probes.probes),
        "knn_k": inspect.signature(KNNProbe).parameters["k"].default,
        "ece_bins": inspect.signature(expected_calibration_error).parameters["n_bins"].default,
        "lora_rank": LoraParams().rank, "lora_alpha": LoraParams().alpha,
        **{f"crs_weight:{component}": weight for component, weight in DEFAULT_WEIGHTS.items()},
        **{f"n_labels:{name}": len(spec.label_names) for name, spec in DATASETS.items()},
        **_worked_examples(),
    }


def _image_counts(profile: Profile, manifest_dir) -> dict:
    """Images per dataset, counted in the frozen split manifests (written when a dataset is first used)."""
    from crsrepro.data.manifests import manifest_path

    out = {}
    for dataset in profile.all_datasets():
        path = manifest_path(default_manifest_dir(manifest_dir), dataset, profile.manifests.name)
        if path.is_file():
            out[f"n_images:{dataset}"] = len(pd.read_csv(path, dtype=str, keep_default_na=False))
    return out


def _leaders(values: pd.Series, prefix: str, k: int = 3, suffix: str = "") -> dict:
    """``{prefix:rank1<suffix>: best value, ...}`` for the ``k`` largest values (ties by index order)."""
    best = values.sort_values(ascending=False, kind="stable").head(k)
    return {f"{prefix}:rank{i}{suffix}": float(v) for i, v in enumerate(best, start=1)}


def _ranking_measures(a: RunAnalysis) -> dict:
    """Aggregate AUROC and CRS, their ranks and their agreement (05_crs_bootstrap)."""
    agg = a.aggregate
    out = {}
    for encoder, row in agg.iterrows():
        out |= {f"aggregate_auroc:{encoder}": row["auroc"], f"aggregate_crs:{encoder}": row["crs"],
                f"rank_auroc:{encoder}": row["rank_auroc"], f"rank_crs:{encoder}": row["rank_crs"]}
    out |= _leaders(agg["auroc"], "aggregate_auroc") | _leaders(agg["crs"], "aggregate_crs")
    for x, y in permutations(agg.index, 2):
        out[f"crs_gap:{x}-{y}"] = agg.loc[x, "crs"] - agg.loc[y, "crs"]
    if len(agg) >= 2:
        out["crs_gap:rank1-rank2"] = agg["crs"].iloc[0] - agg["crs"].iloc[1]
        agreement = a.rank_agreement
        out |= {"auroc_crs_kendall_tau": agreement.kendall_tau, "auroc_crs_spearman_rho": agreement.spearman_rho,
                "auroc_crs_reversed_pairs": agreement.reversed_pairs, "auroc_crs_n_pairs": agreement.n_pairs,
                "auroc_crs_mean_abs_rank_shift": agreement.mean_abs_rank_shift,
                "auroc_crs_top3_overlap": agreement.top3_overlap}
    return out


def _bootstrap_measures(a: RunAnalysis) -> dict:
    """The seed-paired bootstrap: P(rank 1), P(top 3) and paired CRS intervals (05_crs_bootstrap)."""
    return {"has_seed_variance": float(a.has_seed_variance)} | _rank_measures(a.bootstrap, a.aggregate.index)


#: The paper's bootstrap draws only the seeds; beside each of its measures the claims page quotes the same
#: quantity from the bootstrap over seeds and test cases (:attr:`RunAnalysis.crs_bootstrap`), named with
#: this prefix (``two_level_p_rank1:<encoder>`` ...).
TWO_LEVEL_PREFIX = "two_level_"


def _two_level_measures(a: RunAnalysis) -> dict:
    """The same measures from the bootstrap over seeds and test cases, named with :data:`TWO_LEVEL_PREFIX`."""
    return {TWO_LEVEL_PREFIX + k: v for k, v in _rank_measures(a.crs_bootstrap, a.aggregate.index).items()}


def _rank_measures(boot, order) -> dict:
    """P(rank 1), P(top 3) and paired CRS intervals of a CRS bootstrap; ``order`` is the published ranking."""
    out = {f"p_rank1:{e}": p for e, p in boot.p_rank1.items()} | {f"p_top3:{e}": p for e, p in boot.p_top3.items()}
    out |= {f"p_rank1:rank{i}": boot.p_rank1[e] for i, e in enumerate(order[:3], start=1)}
    out |= {f"p_top3:rank{i}": boot.p_top3[e] for i, e in enumerate(order[:3], start=1)}
    out |= {"p_rank1_sum": boot.p_rank1.sum(), "p_top3_sum": boot.p_top3.sum(),
            "n_p_top3_zero": int((boot.p_top3 == 0).sum())}
    for x, y in permutations(order, 2):
        ci = boot.paired_diff_ci(x, y)
        out[f"crs_diff_ci:{x}-{y}"] = (ci.ci_low, ci.ci_high)
    if len(order) >= 2:
        out["crs_diff_ci:rank1-rank2"] = out[f"crs_diff_ci:{order[0]}-{order[1]}"]
    return out


def _insertion_measures(a: RunAnalysis) -> dict:
    """The insertion experiment: movement of published scores, cohort vs fixed anchors (05_crs_bootstrap),
    per cell (``insertion_movement_*``) and per encoder's aggregate (``insertion_aggregate_movement_*``)."""
    summary = a.insertion.summary
    out = {}
    for (level, mode), row in summary.iterrows():
        name = "insertion_movement" if level == "cell" else f"insertion_{level}_movement"
        out |= {f"{name}_{stat}:{mode}": row[f"{stat}_movement"] for stat in ("mean", "max")}
    return out | {"insertion_n_trials": summary["n_trials"].iloc[0],
                  "insertion_n_inserted": summary["n_inserted"].iloc[0],
                  "insertion_panel_size": summary["panel_size"].iloc[0]}


def _validity_measures(a: RunAnalysis) -> dict:
    """External validity on the transfer set and leave-one-dataset-out (05_crs_bootstrap): the plug-in rhos,
    the paper's statistics (their intervals are in the chapter's tables)."""
    out = {}
    for source, target in _robustness_transfers(a):
        validity = a.external_validity(source, target)
        out |= {"external_validity_rho:crs": validity.rho_crs, "external_validity_rho:auroc": validity.rho_source_auroc}
    if a.scores["dataset"].nunique() >= 2:
        lodo = a.leave_one_dataset_out
        out |= {f"lodo_rho:{dataset}": rho for dataset, rho in lodo["spearman_rho_plug_in"].items()}
        out["lodo_champions_recovered"] = int(lodo["recovered"].sum())
    return out


def _calibration_measures(a: RunAnalysis) -> dict:
    """Clean ECE per cell and what recalibration does to it (02_calibration)."""
    out = {f"ece:{r.encoder}:{r.dataset}": r.ece for r in a.cell_means.itertuples()}
    result = a.recalibration
    if CLAIMS_RECALIBRATOR not in result.summary.index:
        logger.info("claims: no %s recalibration rows in this run", CLAIMS_RECALIBRATOR)
        return out
    summary = result.summary.loc[CLAIMS_RECALIBRATOR]
    cells = result.cells[result.cells["recalibrator"] == CLAIMS_RECALIBRATOR]
    out |= {f"ece_recalibrated:{r.encoder}:{r.dataset}": r.ece_after for r in cells.itertuples()}
    return out | {"recalibration_n_cells": summary["n_cells"],
                  "recalibration_relative_reduction_range": (summary["relative_reduction_min"],
                                                             summary["relative_reduction_max"]),
                  "recalibration_mean_absolute_drop": summary["mean_absolute_drop"],
                  "recalibration_mean_absolute_drop_ci": (summary["ci_low"], summary["ci_high"]),
                  "recalibration_mean_auroc_change": summary["mean_auroc_change"]}


def _degradation_measures(a: RunAnalysis) -> dict:
    """ECE rise and AUROC drop under the perturbations, and their correlation over cells (04_robustness)."""
    result = a.degradation
    cells = result.cells.assign(ece_peak=result.cells["ece_clean"] + result.cells["peak_ece_rise"])
    out = {}
    for (encoder, dataset), row in cells.iterrows():
        out |= {f"ece_mean_rise:{encoder}:{dataset}": row["mean_ece_rise"],
                f"ece_peak:{encoder}:{dataset}": row["ece_peak"]}
    largest = cells["mean_ece_rise"].idxmax()
    return out | {"ece_mean_rise:largest": cells.loc[largest, "mean_ece_rise"],
                  "ece_peak:largest": cells.loc[largest, "ece_peak"],
                  "degradation_pearson_r": result.pearson_r, "degradation_n_cells": len(cells)}


def _transfer_measures(a: RunAnalysis) -> dict:
    """Transfer AUROC per encoder and Welch's test, medical-pretrained vs general (04_robustness)."""
    out = {}
    for source, target in _robustness_transfers(a):
        welch = a.transfer_test(source, target)
        table = welch.table
        out |= {f"transfer_auroc:{e}": v for e, v in table["target_auroc"].items()}
        out |= {"transfer_auroc_mean:medical": welch.mean_medical, "transfer_auroc_mean:general": welch.mean_general,
                "transfer_welch_p": welch.p_value,
                "transfer_auroc:lowest_medical": table.loc[table["group"] == "medical", "target_auroc"].min()}
    return out


def _label_efficiency_measures(a: RunAnalysis) -> dict:
    """AUROC at 1 % labels, the ViT-B/16 bar on CheXpert, and AULC vs retention (03_label_efficiency)."""
    from crsrepro.score.dimensions import select_runs

    correlations = a.aulc_vs_retention.correlations
    out = {f"{m}_rho:{level}": correlations.loc[m, level] for m in ("aulc", "retention") for level in ("encoder", "cell")}
    clean = select_runs(a.runs, condition=CLEAN)
    curve = clean.groupby(["encoder", "dataset", "label_fraction"])["auroc"].mean()
    if 0.01 not in curve.index.get_level_values("label_fraction"):
        return out
    at_1pct = curve.xs(0.01, level="label_fraction")
    out |= {f"auroc_at_1pct:{e}:{d}": v for (e, d), v in at_1pct.items()}
    for dataset, values in at_1pct.groupby(level="dataset"):
        out |= _leaders(values.droplevel("dataset"), "auroc_at_1pct", suffix=f":{dataset}")
    on_chexpert = set(clean.loc[clean["dataset"] == CHEXPERT, "encoder"])
    if VIT_B16 in on_chexpert:
        table = a.absolute_label_efficiency(fraction=0.01, reference_encoder=VIT_B16).xs(CHEXPERT, level="dataset")
        family = clean.groupby("encoder")["family"].first()
        medical = [e for e in table.index if family[e] in MEDICAL_FAMILIES]
        out["chexpert_1pct_reaching_vit_b16:medical"] = int(table.loc[medical, "reaches_reference"].sum())
        if {MAE, RESNET50} <= on_chexpert:
            best = curve.xs(CHEXPERT, level="dataset").groupby("encoder").max()
            bar = table.loc[VIT_B16, "auroc_full"]
            out["chexpert_reaching_vit_b16:mae_resnet50"] = int((best[[MAE, RESNET50]] >= bar).sum())
    return out


def _depth_measures(a: RunAnalysis) -> dict:
    """The layer-depth sweep (06_layer_depth): how often the tap chosen on val is an intermediate one, the
    count exchangeable taps would give, how many one-sided Holm-corrected paired tests survive, and per
    encoder its best depth and the gain of each intermediate depth over the 100 % tap. Each count against
    ``depth100`` is also given against ``final`` (suffix ``:final``; :data:`crsrepro.analyse.depth.REFERENCES`).

    ``depth_best:<encoder>`` is the depth (a fraction: 0.5 for 50 %) chosen most often on val over the
    datasets the encoder is swept on (the mean val AUROC over them; :func:`crsrepro.analyse.depth.best_depths`
    picks on val, never on test), and ``depth_gain_points_range:<encoder>:depth<d>`` the (lowest, highest)
    over those datasets of the seed-mean test AUROC at depth d minus at 100 %, in AUROC points [ours: the
    paper gives one best depth and one range of gains per encoder, without saying over what they range].
    """
    from crsrepro.analyse.depth import curve, paired_test, win_counts

    table = a.depth
    counts = win_counts(table)
    out = {"depth_n_sweeps": int(counts.loc["depth100", "pairs"])}
    for reference, row in counts.iterrows():
        suffix = "" if reference == "depth100" else f":{reference}"
        out |= {f"depth_intermediate_wins{suffix}": int(row["wins"]),
                f"depth_intermediate_wins_null{suffix}": float(row["expected"]),
                f"depth_intermediate_wins_p{suffix}": float(row["p_value"]),
                f"depth_holm_survivors{suffix}": int(paired_test(table, reference)["survives"].sum())}
    means = curve(table).groupby(["encoder", "dataset", "depth"])[["auroc", "val_auroc"]].mean()
    for encoder, per_dataset in means.groupby(level="encoder"):
        val = per_dataset["val_auroc"].unstack("depth")
        out[f"depth_best:{encoder}"] = val.mean().idxmax() / 100
        test = per_dataset["auroc"].unstack("depth")
        points = 100 * test.drop(columns=100).sub(test[100], axis=0)
        out |= {f"depth_gain_points_range:{encoder}:depth{depth:.0f}": (points[depth].min(), points[depth].max())
                for depth in points.columns}
    return out


def _lora_measures(a: RunAnalysis) -> dict:
    """Frozen vs LoRA (07_lora): per domain the AUROC gain and the Kendall tau of the AUROC rankings,
    the leader changes, and the four-dimensional comparison (tau, mean rank shift, top-3 overlap and
    each encoder's CRS rank after LoRA)."""
    comparison = a.lora
    out = {}
    for row in comparison.per_domain.itertuples():
        out |= {f"lora_auroc_gain:{row.dataset}": row.auroc_gain, f"lora_kendall_tau:{row.dataset}": row.kendall_tau}
    crs = comparison.crs
    out |= {"lora_leader_changes": int(comparison.per_domain["leader_changed"].sum()),
            "lora_crs_kendall_tau": crs.kendall_tau, "lora_crs_mean_abs_rank_shift": crs.mean_abs_rank_shift,
            "lora_crs_top3_overlap": crs.top3_overlap}
    return out | {f"lora_rank:{encoder}": rank for encoder, rank in crs.ranks["rank_b"].items()}


def _lora_trained_measures(a: RunAnalysis) -> dict:
    """The epochs and seeds the LoRA grid actually trained (07_lora), read from its results, not from the plan:
    the distinct seeds of its rows, and the budget (epochs over the full-label train split) that the merged
    table records. Every row-set's key derives from its budget (:func:`crsrepro.run.lora.rowset_key`) and the
    table is merged from the keys of one budget, so every row of it trained for that many epochs."""
    rows = a.lora_results
    return {"lora_epochs": int(rows.attrs["epochs"]), "lora_seeds": int(rows["seed"].nunique())}


MEASURES = (_ranking_measures, _bootstrap_measures, _two_level_measures, _insertion_measures, _validity_measures,
            _calibration_measures, _degradation_measures, _transfer_measures, _label_efficiency_measures,
            _depth_measures, _lora_measures, _lora_trained_measures)
"""The analyses of the run that the claims page reads, each a function of its :class:`RunAnalysis`
(the claims file's ``notebook`` field says which chapter shows each claim)."""


def _plain(value):
    """numpy scalars as Python floats, pairs as tuples of floats."""
    if isinstance(value, tuple):
        return tuple(float(v) for v in value)
    return float(value)


def measure(a: RunAnalysis) -> dict:
    """Everything the library can measure that the claims file names, from one run's analysis.

    Returns
    -------
    dict
        ``{measurement name: float or (low, high)}``. The protocol counts (the paper grid's 17,575 runs,
        3,515 rows and 43 cells, from :func:`crsrepro.run.grid.enumerate_runs`) are always there.
    """
    measured = _protocol_measures() | _image_counts(a.profile, a.manifest_dir)
    for analysis in MEASURES:
        try:
            measured |= analysis(a)
        except CrsreproError as exc:  # the results cannot support this analysis: say so, measure the rest
            logger.warning("claims: %s measured nothing on profile %s: %s", analysis.__name__.strip("_"),
                           a.profile.name, exc)
    return {name: _plain(value) for name, value in measured.items()}


MULTIVERSE_CONCLUSIONS = {"auroc_crs_kendall_tau": "kendall_tau", "auroc_crs_reversed_pairs": "reversed_pairs",
                          "auroc_crs_top3_overlap": "top3", "p_rank1:": "leader", "p_top3:": "top3",
                          "external_validity_rho:crs": "external_validity",
                          "external_validity_rho:auroc": "external_validity"}
"""Which conclusion of :func:`crsrepro.analyse.sensitivity.informative_shares` stands behind a claim's
measurement (exact names, or prefixes ending in ``:``)."""


def multiverse_shares(table: pd.DataFrame) -> dict:
    """``{measurement name or prefix: share of the multiverse in which the conclusion behind it holds as
    in this run's default}`` (DESIGN.md section 14: the claims page's multiverse column; issue 24). The
    conclusions can fail: the same leader, the same top three, tau within 0.10, reversals within 25 %,
    the external validity's direction (:data:`MULTIVERSE_CONCLUSIONS`)."""
    from crsrepro.analyse.sensitivity import informative_shares

    shares = informative_shares(table)
    return {measure: shares[c] for measure, c in MULTIVERSE_CONCLUSIONS.items() if c in shares}
