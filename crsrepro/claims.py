"""The paper's claims set beside this run's measurements (DESIGN.md section 12, the claims page).

``data_manifests/claims.yaml`` lists every number the paper reports, as the seed review gives them:
its value, the sentence it comes from (Chinese, verbatim) with an English gloss, the chapter that
measures it, the name of the measurement, and its *scope*:

- ``any``: the quantity is defined on any panel and profile (the paper grid's 17,575 runs, the
  CRS weights, P(top 3) summing to 3, zero movement under fixed anchors ...), so this run's value is
  compared with the paper's;
- ``paper``: it names the paper's encoders or datasets (MedGemma's AUROC 0.909 ...), so it is
  compared only on the ``paper`` profile. On other profiles the table shows this run's *analogue*
  (e.g. the AUROC of this run's leader), labelled as such and never compared.

Three functions make the page:

- :func:`load_claims` reads and validates the file;
- :func:`measure_claims` computes every measurement the library can make today from the tidy results
  table (:mod:`crsrepro.results`), with :mod:`crsrepro.crs` and :mod:`crsrepro.stats`;
- :func:`claims_table` sets the two side by side, with a status per claim. It never invents a value:
  a measurement that this run did not produce is shown empty, with the chapter that would produce it.

Measurement names
-----------------
A measurement is a key of the dict :func:`measure_claims` returns. Per-encoder and per-cell values are
keyed ``<quantity>:<encoder>`` or ``<quantity>:<encoder>:<dataset>`` (``aggregate_auroc:medical.medgemma``,
``ece:general.dinov2:aptos2019``); pairs ``<quantity>:<a>-<b>``; this run's own leaders ``rank1``,
``rank2`` ... (``aggregate_crs:rank1``: the aggregate CRS of this run's CRS leader). Ranges and
intervals are ``(low, high)`` tuples. The layer-depth and LoRA measurements (``depth_*``, ``lora_*``)
are named in the claims file but not produced yet: no chapter computes them.
"""

from __future__ import annotations

import inspect
import logging
import re
from dataclasses import dataclass
from functools import cached_property
from itertools import permutations
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from crsrepro.errors import CrsreproError
from crsrepro.profiles import Profile, load_profile

logger = logging.getLogger(__name__)

CLAIMS_PATH = Path(__file__).resolve().parents[1] / "data_manifests" / "claims.yaml"
"""The claims file of the checkout (the package is installed editable from it)."""
CLAIMS_VERSION = 1
REQUIRED = ("id", "value", "kind", "source", "gloss", "section", "notebook", "measure", "scope")
OPTIONAL = ("analogue", "note")
SCOPES = ("any", "paper")
KINDS = ("auroc", "ece", "tau", "rho", "r", "probability", "p_value", "count", "rank", "crs", "weight",
         "fraction", "movement", "overlap", "rank_shift", "auroc_change", "ece_change", "auroc_points")
NOTEBOOKS = ("00_setup", "01_discrimination", "02_calibration", "03_label_efficiency", "04_robustness",
             "05_crs_bootstrap", "06_layer_depth", "07_lora")
STATUSES = ("measured", "paper profile only", "not measured")
_ID = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")

# The paper's reference encoders in its label-efficiency sentence (section "Results").
VIT_B16, MAE, RESNET50 = "general.vit_b16", "general.mae", "general.resnet50"
CHEXPERT = "chexpert"
MEDICAL_FAMILIES = ("medical", "specialist")
"""The paper's "medical-pretrained" encoders: medical + specialist families (DESIGN.md section 4)."""


class ClaimsError(CrsreproError, ValueError):
    """The claims file is missing, or one of its entries lacks a field or has a bad one."""


# --------------------------------------------------------------------------- the claims file

def _check_value(value, where: str):
    """A claim's value as a float, or a (low, high) tuple of floats for a range or an interval."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if number(value):
        return float(value)
    if isinstance(value, list) and len(value) == 2 and all(number(v) for v in value) and value[0] <= value[1]:
        return (float(value[0]), float(value[1]))
    raise ClaimsError(f"{where}: value must be a number or [low, high] with low <= high, got {value!r}")


def _check_entry(entry, index: int, path: Path) -> dict:
    """Validate one entry of the claims file; every error names the file, the entry and the field."""
    label = entry.get("id") if isinstance(entry, dict) else None
    where = f"{path}: claim {index + 1}" + (f" (id {label!r})" if label else "")
    if not isinstance(entry, dict):
        raise ClaimsError(f"{where}: must be a mapping of fields, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ClaimsError(f"{where}: unknown field(s) {', '.join(unknown)} "
                          f"(expected {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)})")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise ClaimsError(f"{where}: missing field(s) {', '.join(missing)}")
    for key in ("id", "source", "gloss", "section"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise ClaimsError(f"{where}: {key} must be a non-empty string, got {entry[key]!r}")
    if not _ID.match(entry["id"]):
        raise ClaimsError(f"{where}: id must be snake_case (a-z, 0-9, single underscores), got {entry['id']!r}")
    choices = {"kind": KINDS, "notebook": NOTEBOOKS, "scope": SCOPES}
    for key, allowed in choices.items():
        if entry[key] not in allowed:
            raise ClaimsError(f"{where}: {key} must be one of {', '.join(allowed)}, got {entry[key]!r}")
    for key in ("measure", "analogue", "note"):
        value = entry.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ClaimsError(f"{where}: {key} must be a non-empty string or null, got {value!r}")
    if entry.get("analogue") is not None and entry["scope"] != "paper":
        raise ClaimsError(f"{where}: analogue is only for scope paper (a scope-any claim is compared directly)")
    return {**{k: entry.get(k) for k in REQUIRED + OPTIONAL}, "value": _check_value(entry["value"], where)}


def load_claims(path: str | Path | None = None) -> pd.DataFrame:
    """Read and validate the claims file.

    Parameters
    ----------
    path : path, optional
        Default :data:`CLAIMS_PATH` (``data_manifests/claims.yaml`` of the checkout).

    Returns
    -------
    DataFrame
        One row per claim, in file order, with the columns ``id, value, kind, source, gloss, section,
        notebook, measure, scope, analogue, note`` (absent optional fields are None). ``value`` is a
        float or a ``(low, high)`` tuple.

    Raises
    ------
    ClaimsError
        The file is missing or not YAML; its version differs; an entry has an unknown or missing
        field, a bad value, kind, notebook or scope, or repeats an id. The message names the entry.

    Examples
    --------
    >>> claims = load_claims()
    >>> claims.set_index("id").loc["n_runs", ["value", "scope", "measure"]].tolist()
    [17575.0, 'any', 'paper_grid_runs']
    """
    path = Path(path) if path is not None else CLAIMS_PATH
    if not path.is_file():
        raise ClaimsError(f"no claims file at {path} (expected data_manifests/claims.yaml of the checkout)")
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ClaimsError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(content, dict) or not isinstance(content.get("claims"), list):
        raise ClaimsError(f"{path}: expected a mapping with keys version and claims (a list of entries)")
    if content.get("version") != CLAIMS_VERSION:
        raise ClaimsError(f"{path}: version {content.get('version')!r}, this crsrepro reads version {CLAIMS_VERSION}")
    rows = [_check_entry(entry, i, path) for i, entry in enumerate(content["claims"])]
    seen = set()
    for i, row in enumerate(rows):
        if row["id"] in seen:
            raise ClaimsError(f"{path}: claim {i + 1} repeats the id {row['id']!r}")
        seen.add(row["id"])
    table = pd.DataFrame(rows, columns=list(REQUIRED + OPTIONAL), dtype=object)
    table = table.where(table.notna(), None)  # absent optional fields stay None, not NaN
    table.attrs["path"] = str(path)
    return table


# --------------------------------------------------------------------------- the claims table

def format_value(value) -> str:
    """A number as the claims page prints it: integers with thousands separators, others to 4
    significant digits, ranges as ``[low, high]``; None as the empty string.

    Examples
    --------
    >>> format_value(17575.0), format_value(0.0029), format_value((-0.097, 0.017)), format_value(None)
    ('17,575', '0.0029', '[-0.097, 0.017]', '')
    """
    if value is None:
        return ""
    if isinstance(value, tuple):
        return f"[{format_value(value[0])}, {format_value(value[1])}]"
    value = float(value)
    if np.isnan(value):
        return "nan"
    return f"{int(value):,}" if value.is_integer() else f"{value:.4g}"


def _status(claim, measured: dict, profile_name: str) -> tuple[str, object, str]:
    """(status, this run's value or None, note) of one claim; see :func:`claims_table`."""
    note = [claim.note] if claim.note else []
    if claim.scope == "paper" and profile_name != "paper":
        value = measured.get(claim.analogue) if claim.analogue else None
        if value is not None:
            note.insert(0, f"analogue `{claim.analogue}`: this run's own, not compared")
        elif claim.analogue:
            note.insert(0, f"the analogue `{claim.analogue}` is not measured (needs {claim.notebook})")
        return "paper profile only", value, "; ".join(note)
    if claim.measure is not None and measured.get(claim.measure) is not None:
        return "measured", measured[claim.measure], "; ".join(note)
    if claim.measure is None:
        return "not measured", None, "; ".join(["no measurement is defined"] + note)
    return "not measured", None, "; ".join([f"needs {claim.notebook}: this run has no `{claim.measure}`"] + note)


def claims_table(claims: pd.DataFrame, measured: dict, *, profile_name: str) -> pd.DataFrame:
    """The claims page: each paper number beside this run's value, with a status.

    Parameters
    ----------
    claims : DataFrame
        From :func:`load_claims`.
    measured : dict
        ``{measurement name: value}`` from :func:`measure_claims` (a value may be a float, a
        ``(low, high)`` tuple, or None for "not available").
    profile_name : str
        The profile the measurements come from; ``paper``-scope claims are compared only on ``paper``.

    Returns
    -------
    DataFrame
        One row per claim: ``id, claim`` (the English gloss), ``source`` (the review's sentence),
        ``paper value``, ``this run``, ``notebook``, ``status`` and ``note``. Values are printed with
        :func:`format_value`; ``this run`` is empty whenever nothing was measured. ``status`` is

        - ``measured``: the measurement is available, and the claim is comparable here (scope ``any``,
          or scope ``paper`` on the paper profile);
        - ``paper profile only``: a ``paper``-scope claim on another profile; ``this run`` holds the
          claim's analogue when one is named and measured, and is never compared;
        - ``not measured``: the measurement is not available (the note names the chapter that
          would produce it) or none is defined.

    Examples
    --------
    >>> claims = load_claims()
    >>> claims = claims[claims["id"].isin(["n_runs", "auroc_medgemma", "lora_rank"])]
    >>> table = claims_table(claims, {"paper_grid_runs": 17575, "aggregate_auroc:rank1": 0.87},
    ...                      profile_name="demo")
    >>> table[["id", "paper value", "this run", "status"]].values.tolist()  # doctest: +NORMALIZE_WHITESPACE
    [['n_runs', '17,575', '17,575', 'measured'], ['auroc_medgemma', '0.909', '0.87', 'paper profile only'],
     ['lora_rank', '8', '', 'not measured']]
    """
    rows = []
    for claim in claims.itertuples(index=False):
        status, value, note = _status(claim, measured, profile_name)
        rows.append({"id": claim.id, "claim": claim.gloss, "source": claim.source,
                     "paper value": format_value(claim.value), "this run": format_value(value),
                     "notebook": claim.notebook, "status": status, "note": note})
    return pd.DataFrame(rows, columns=["id", "claim", "source", "paper value", "this run", "notebook", "status",
                                       "note"])


# --------------------------------------------------------------------------- measurements

def reversed_pairs_for_tau(tau: float, n_encoders: int, *, decimals: int = 3) -> int:
    """The number of reversed pairs among ``n_encoders`` untied encoders whose Kendall tau-b is ``tau``.

    For every possible count r of reversed pairs it builds a ranking with exactly r inversions and
    asks :func:`crsrepro.stats.rank_agreement` for its tau-b; it returns the only r whose tau-b rounds
    to ``tau`` at ``decimals`` places (the paper's check: tau = 0.600 over 15 encoders is 21 of 105).

    Raises
    ------
    ValueError
        No count, or more than one, gives that tau.

    Examples
    --------
    >>> reversed_pairs_for_tau(0.600, 15)
    21
    """
    from crsrepro.stats import rank_agreement

    names = [f"e{i:03d}" for i in range(n_encoders)]
    reference = {name: float(-i) for i, name in enumerate(names)}
    found = []
    for target in range(n_encoders * (n_encoders - 1) // 2 + 1):
        remaining, left, order = list(range(n_encoders)), target, []
        for _ in range(n_encoders):  # Lehmer code: each pick jumps over `skip` smaller elements
            skip = min(left, len(remaining) - 1)
            order.append(remaining.pop(skip))
            left -= skip
        agreement = rank_agreement(reference, {name: float(-order[i]) for i, name in enumerate(names)})
        if round(agreement.kendall_tau, decimals) == round(tau, decimals):
            found.append(agreement.reversed_pairs)
    if len(found) != 1:
        raise ValueError(f"{len(found)} counts of reversed pairs among {n_encoders} encoders give tau-b {tau}: {found}")
    return found[0]


def _paper_value(claim_id: str) -> float:
    return load_claims().set_index("id").loc[claim_id, "value"]


def _worked_examples() -> dict:
    """The review's illustrations, measured with the library's own metrics."""
    from crsrepro.metrics import expected_calibration_error, macro_auroc

    # "when the model says 90 % it is right about 75 % of the time": 20 cases at confidence 0.9, 15 right
    y = np.array([0] * 15 + [1] * 5)
    says_90 = np.tile([0.9, 0.1], (20, 1))
    labels = np.array([0, 1] * 10)
    return {"ece_worked_example": expected_calibration_error(y, says_90, task="multiclass"),
            "auroc_perfect_ranking": macro_auroc(labels, np.eye(2)[labels], task="multiclass"),
            "auroc_constant_score": macro_auroc(labels, np.full((20, 2), 0.5), task="multiclass")}


def _protocol_measures() -> dict:
    """What the paper's protocol fixes, read from the paper profile, the run grid and the library."""
    from crsrepro.crs import DEFAULT_WEIGHTS
    from crsrepro.data import DATASETS
    from crsrepro.grid import cells, enumerate_runs
    from crsrepro.metrics import expected_calibration_error
    from crsrepro.probes import KNNProbe

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
        "paper_bootstrap_resamples": paper.bootstrap["n_resamples"],
        "paper_control_probes": len(paper.control_probes["probes"]),
        "knn_k": inspect.signature(KNNProbe).parameters["k"].default,
        "ece_bins": inspect.signature(expected_calibration_error).parameters["n_bins"].default,
        "reversed_pairs_for_paper_tau": reversed_pairs_for_tau(_paper_value("auroc_crs_kendall_tau"), n),
        **{f"crs_weight:{component}": weight for component, weight in DEFAULT_WEIGHTS.items()},
        **{f"n_labels:{name}": len(spec.label_names) for name, spec in DATASETS.items()},
        **_worked_examples(),
    }


def _image_counts(profile: Profile, manifest_dir) -> dict:
    """Images per dataset, counted in the frozen split manifests (written when a dataset is first used)."""
    from crsrepro.data.manifests import manifest_path

    out = {}
    for dataset in profile.all_datasets():
        path = manifest_path(manifest_dir or Path("data_manifests"), dataset, profile.name)
        if path.is_file():
            out[f"n_images:{dataset}"] = len(pd.read_csv(path, dtype=str, keep_default_na=False))
    return out


def _leaders(values: pd.Series, prefix: str, k: int = 3, suffix: str = "") -> dict:
    """``{prefix:rank1<suffix>: best value, ...}`` for the ``k`` largest values (ties by index order)."""
    best = values.sort_values(ascending=False, kind="stable").head(k)
    return {f"{prefix}:rank{i}{suffix}": float(v) for i, v in enumerate(best, start=1)}


@dataclass
class _Run:
    """One run's results and what the analyses share (the cell profiles, the frozen frame, the scores)."""

    profile: Profile
    results: pd.DataFrame  # the tidy table
    runs: pd.DataFrame  # its wide view, one row per run
    manifest_dir: Path | None
    recalibrator: str
    rng: int

    @cached_property
    def profiles(self) -> pd.DataFrame:
        from crsrepro.crs import cell_profiles
        return cell_profiles(self.runs)

    @cached_property
    def frame(self):
        from crsrepro.grid import reference_frame
        return reference_frame(self.profile, self.results, manifest_dir=self.manifest_dir)

    @cached_property
    def scores(self) -> pd.DataFrame:
        from crsrepro.crs import crs_scores
        return crs_scores(self.profiles, self.frame)

    @cached_property
    def aggregate(self) -> pd.DataFrame:
        from crsrepro.crs import aggregate_crs
        return aggregate_crs(self.scores)


def _ranking_measures(run: _Run) -> dict:
    """Aggregate AUROC and CRS, their ranks and their agreement (05_crs_bootstrap)."""
    from crsrepro.stats import rank_agreement

    agg = run.aggregate
    out = {}
    for encoder, row in agg.iterrows():
        out |= {f"aggregate_auroc:{encoder}": row["auroc"], f"aggregate_crs:{encoder}": row["crs"],
                f"rank_auroc:{encoder}": row["rank_auroc"], f"rank_crs:{encoder}": row["rank_crs"]}
    out |= _leaders(agg["auroc"], "aggregate_auroc") | _leaders(agg["crs"], "aggregate_crs")
    for a, b in permutations(agg.index, 2):
        out[f"crs_gap:{a}-{b}"] = agg.loc[a, "crs"] - agg.loc[b, "crs"]
    if len(agg) >= 2:
        out["crs_gap:rank1-rank2"] = agg["crs"].iloc[0] - agg["crs"].iloc[1]
        agreement = rank_agreement(agg["auroc"].to_dict(), agg["crs"].to_dict())
        out |= {"auroc_crs_kendall_tau": agreement.kendall_tau, "auroc_crs_spearman_rho": agreement.spearman_rho,
                "auroc_crs_reversed_pairs": agreement.reversed_pairs, "auroc_crs_n_pairs": agreement.n_pairs,
                "auroc_crs_mean_abs_rank_shift": agreement.mean_abs_rank_shift,
                "auroc_crs_top3_overlap": agreement.top3_overlap}
    return out


def _bootstrap_measures(run: _Run) -> dict:
    """The seed-paired bootstrap: P(rank 1), P(top 3) and paired CRS intervals (05_crs_bootstrap)."""
    from crsrepro.stats import seed_paired_bootstrap

    boot = seed_paired_bootstrap(run.profiles, run.frame, n_resamples=run.profile.bootstrap["n_resamples"],
                                 rng=run.rng)
    order = run.aggregate.index  # this run's CRS ranking, best first
    out = {f"p_rank1:{e}": p for e, p in boot.p_rank1.items()} | {f"p_top3:{e}": p for e, p in boot.p_top3.items()}
    out |= {f"p_rank1:rank{i}": boot.p_rank1[e] for i, e in enumerate(order[:3], start=1)}
    out |= {f"p_top3:rank{i}": boot.p_top3[e] for i, e in enumerate(order[:3], start=1)}
    out |= {"p_rank1_sum": boot.p_rank1.sum(), "p_top3_sum": boot.p_top3.sum(),
            "n_p_top3_zero": int((boot.p_top3 == 0).sum())}
    for a, b in permutations(order, 2):
        ci = boot.paired_diff_ci(a, b)
        out[f"crs_diff_ci:{a}-{b}"] = (ci.ci_low, ci.ci_high)
    if len(order) >= 2:
        out["crs_diff_ci:rank1-rank2"] = out[f"crs_diff_ci:{order[0]}-{order[1]}"]
    return out


def _insertion_measures(run: _Run) -> dict:
    """The insertion experiment: movement of published scores, cohort vs fixed anchors (05_crs_bootstrap)."""
    from crsrepro.stats import insertion_experiment

    n_inserted = 3  # the paper's protocol: insert 3 into a panel of 12, 30 trials (the function's defaults)
    if run.profiles["encoder"].nunique() < n_inserted + 2:
        logger.info("claims: the insertion experiment needs at least %d encoders", n_inserted + 2)
        return {}
    result = insertion_experiment(run.profiles, n_inserted=n_inserted, rng=run.rng)
    summary = result.summary
    out = {f"insertion_movement_{stat}:{mode}": summary.loc[mode, f"{stat}_movement"]
           for mode in summary.index for stat in ("mean", "max")}
    return out | {"insertion_n_trials": summary["n_trials"].iloc[0],
                  "insertion_n_inserted": summary["n_inserted"].iloc[0],
                  "insertion_panel_size": summary["panel_size"].iloc[0]}


def _validity_measures(run: _Run) -> dict:
    """External validity on the transfer set and leave-one-dataset-out (05_crs_bootstrap)."""
    from crsrepro.stats import external_validity, leave_one_dataset_out

    out = {}
    for source, target in run.profile.transfer.items():
        validity = external_validity(run.runs, source=source, target=target)
        out |= {"external_validity_rho:crs": validity.rho_crs, "external_validity_rho:auroc": validity.rho_source_auroc}
    if run.scores["dataset"].nunique() >= 2:
        lodo = leave_one_dataset_out(run.scores)
        out |= {f"lodo_rho:{dataset}": rho for dataset, rho in lodo["spearman_rho"].items()}
        out["lodo_champions_recovered"] = int(lodo["recovered"].sum())
    return out


def _calibration_measures(run: _Run) -> dict:
    """Clean ECE per cell and what recalibration does to it (02_calibration)."""
    from crsrepro.crs import cell_means
    from crsrepro.stats import recalibration_summary

    out = {f"ece:{r.encoder}:{r.dataset}": r.ece for r in cell_means(run.profiles).itertuples()}
    result = recalibration_summary(run.runs)
    if run.recalibrator not in result.summary.index:
        logger.info("claims: no %s recalibration rows in this run", run.recalibrator)
        return out
    summary = result.summary.loc[run.recalibrator]
    cells = result.cells[result.cells["recalibrator"] == run.recalibrator]
    out |= {f"ece_recalibrated:{r.encoder}:{r.dataset}": r.ece_after for r in cells.itertuples()}
    return out | {"recalibration_n_cells": summary["n_cells"],
                  "recalibration_relative_reduction_range": (summary["relative_reduction_min"],
                                                             summary["relative_reduction_max"]),
                  "recalibration_mean_absolute_drop": summary["mean_absolute_drop"],
                  "recalibration_mean_absolute_drop_ci": (summary["ci_low"], summary["ci_high"]),
                  "recalibration_mean_auroc_change": summary["mean_auroc_change"]}


def _degradation_measures(run: _Run) -> dict:
    """ECE rise and AUROC drop under the perturbations, and their correlation over cells (04_robustness)."""
    from crsrepro.stats import calibration_under_degradation

    result = calibration_under_degradation(run.runs)
    cells = result.cells.assign(ece_peak=result.cells["ece_clean"] + result.cells["peak_ece_rise"])
    out = {}
    for (encoder, dataset), row in cells.iterrows():
        out |= {f"ece_mean_rise:{encoder}:{dataset}": row["mean_ece_rise"],
                f"ece_peak:{encoder}:{dataset}": row["ece_peak"]}
    largest = cells["mean_ece_rise"].idxmax()
    return out | {"ece_mean_rise:largest": cells.loc[largest, "mean_ece_rise"],
                  "ece_peak:largest": cells.loc[largest, "ece_peak"],
                  "degradation_pearson_r": result.pearson_r, "degradation_n_cells": len(cells)}


def _transfer_measures(run: _Run) -> dict:
    """Transfer AUROC per encoder and Welch's test, medical-pretrained vs general (04_robustness)."""
    from crsrepro.stats import welch_transfer_test

    out = {}
    for source, target in run.profile.transfer.items():
        welch = welch_transfer_test(run.runs, source=source, target=target, medical_families=MEDICAL_FAMILIES)
        table = welch.table
        out |= {f"transfer_auroc:{e}": v for e, v in table["target_auroc"].items()}
        out |= {"transfer_auroc_mean:medical": welch.mean_medical, "transfer_auroc_mean:general": welch.mean_general,
                "transfer_welch_p": welch.p_value,
                "transfer_auroc:lowest_medical": table.loc[table["group"] == "medical", "target_auroc"].min()}
    return out


def _label_efficiency_measures(run: _Run) -> dict:
    """AUROC at 1 % labels, the ViT-B/16 bar on CheXpert, and AULC vs retention (03_label_efficiency)."""
    from crsrepro.crs import select_runs
    from crsrepro.stats import absolute_label_efficiency, aulc_vs_retention

    correlations = aulc_vs_retention(run.runs).correlations
    out = {f"{m}_rho:{level}": correlations.loc[m, level] for m in ("aulc", "retention") for level in ("encoder", "cell")}
    clean = select_runs(run.runs, condition="clean")
    curve = clean.groupby(["encoder", "dataset", "label_fraction"])["auroc"].mean()
    if 0.01 not in curve.index.get_level_values("label_fraction"):
        return out
    at_1pct = curve.xs(0.01, level="label_fraction")
    out |= {f"auroc_at_1pct:{e}:{d}": v for (e, d), v in at_1pct.items()}
    for dataset, values in at_1pct.groupby(level="dataset"):
        out |= _leaders(values.droplevel("dataset"), "auroc_at_1pct", suffix=f":{dataset}")
    on_chexpert = set(clean.loc[clean["dataset"] == CHEXPERT, "encoder"])
    if VIT_B16 in on_chexpert:
        table = absolute_label_efficiency(run.runs, fraction=0.01, reference_encoder=VIT_B16).xs(CHEXPERT, level="dataset")
        family = clean.groupby("encoder")["family"].first()
        medical = [e for e in table.index if family[e] in MEDICAL_FAMILIES]
        out["chexpert_1pct_reaching_vit_b16:medical"] = int(table.loc[medical, "reaches_reference"].sum())
        if {MAE, RESNET50} <= on_chexpert:
            best = curve.xs(CHEXPERT, level="dataset").groupby("encoder").max()
            bar = table.loc[VIT_B16, "auroc_full"]
            out["chexpert_reaching_vit_b16:mae_resnet50"] = int((best[[MAE, RESNET50]] >= bar).sum())
    return out


MEASURES = (
    (_ranking_measures, "05_crs_bootstrap"), (_bootstrap_measures, "05_crs_bootstrap"),
    (_insertion_measures, "05_crs_bootstrap"), (_validity_measures, "05_crs_bootstrap"),
    (_calibration_measures, "02_calibration"), (_degradation_measures, "04_robustness"),
    (_transfer_measures, "04_robustness"), (_label_efficiency_measures, "03_label_efficiency"),
)
"""The analyses of the results table, with the chapter each belongs to."""


def measure_claims(profile: Profile | str, results: pd.DataFrame, *, manifest_dir: str | Path | None = None,
                   recalibrator: str = "temperature", rng: int = 0) -> dict:
    """Everything the library can measure today that the claims file names, from a run's results.

    Parameters
    ----------
    profile : Profile or str
        The profile that produced ``results``.
    results : DataFrame
        The tidy results table (:mod:`crsrepro.results`; from :func:`crsrepro.grid.run_grid`).
    manifest_dir : path, optional
        Where the split manifests and the frozen CRS reference frame live (default ``data_manifests/``
        in the working directory). The frame is frozen from ``results`` if the profile has none yet
        (:func:`crsrepro.grid.reference_frame`).
    recalibrator : str, default "temperature" **[ours]**
        The recalibrator whose results stand for the paper's recalibration figures: the review gives
        one range (54-77 %) and one mean over "six main tests" without naming the method or the tests,
        so the page reports one method over every cell.
    rng : int, default 0
        Seed of the bootstrap and of the insertion experiment.

    Returns
    -------
    dict
        ``{measurement name: float or (low, high)}`` (see the module docstring). The protocol counts
        (the paper grid's 17,575 runs, 3,515 rows and 43 cells, from
        :func:`crsrepro.grid.enumerate_runs`) are always there. An analysis that these results cannot
        support (too few encoders, no transfer set ...) is left out and logged, never filled in.
    """
    from crsrepro.results import runs_table

    profile = profile if isinstance(profile, Profile) else load_profile(profile)
    measured = _protocol_measures() | _image_counts(profile, manifest_dir)
    run = _Run(profile, results, runs_table(results), Path(manifest_dir) if manifest_dir else None, recalibrator, rng)
    for analysis, chapter in MEASURES:
        try:
            measured |= analysis(run)
        except CrsreproError as exc:  # the results cannot support this analysis: say so, measure the rest
            logger.warning("claims: %s (%s) measured nothing on profile %s: %s", analysis.__name__.strip("_"),
                           chapter, profile.name, exc)
    return {name: _plain(value) for name, value in measured.items()}


def _plain(value):
    """numpy scalars as Python floats, pairs as tuples of floats."""
    if isinstance(value, tuple):
        return tuple(float(v) for v in value)
    return float(value)
