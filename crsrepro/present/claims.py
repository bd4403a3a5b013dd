"""The paper's claims set beside this run's measurements (DESIGN.md section 12, the claims page).

``data_manifests/claims.yaml`` lists every number the paper reports, as the seed review gives them:
its value, the sentence it comes from (Chinese, verbatim) with an English gloss, the chapter that
measures it, the name of the measurement, and its *scope*:

- ``any``: the quantity is defined on any panel and profile (the paper grid's 17,575 runs, the
  CRS weights, P(top 3) summing to 3, zero movement under fixed anchors ...), so this run's value is
  compared with the paper's;
- ``paper``: it names the paper's encoders or datasets (MedGemma's AUROC 0.909 ...), so it is
  compared only on a profile that runs the paper's protocol (profile key ``claims.paper_scope``). On
  other profiles the table shows this run's *analogue* (e.g. the AUROC of this run's leader), labelled
  as such and never compared.

Three functions make the page:

- :func:`load_claims` reads and validates the file;
- :func:`crsrepro.present.measurements.measure` gives every measurement the library can make from a
  run's :class:`crsrepro.analyse.run_analysis.RunAnalysis`, the object the chapters read;
- :func:`claims_table` sets the two side by side, with a status per claim. It never invents a value:
  a measurement that this run did not produce is shown empty, with the chapter that would produce it.

:func:`run_claims` is the page of one run, the three put together and kept on disk; each chapter's
"paper vs this run" box shows its rows (:func:`crsrepro.present.chapters.paper_vs_run`).

Measurement names
-----------------
A measurement is a key of the dict :func:`~crsrepro.present.measurements.measure` returns. Per-encoder and per-cell values are
keyed ``<quantity>:<encoder>`` or ``<quantity>:<encoder>:<dataset>`` (``aggregate_auroc:medical.medgemma``,
``ece:general.dinov2:aptos2019``); pairs ``<quantity>:<a>-<b>``; this run's own leaders ``rank1``,
``rank2`` ... (``aggregate_crs:rank1``: the aggregate CRS of this run's CRS leader). Ranges and
intervals are ``(low, high)`` tuples. The layer-depth measurements (``depth_*``) come from the depth
sweep of chapter 06 and the LoRA ones (``lora_*``) from the frozen-vs-LoRA comparison of chapter 07
(:attr:`crsrepro.analyse.run_analysis.RunAnalysis.depth`, :attr:`~crsrepro.analyse.run_analysis.RunAnalysis.lora`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from crsrepro.analyse.findings import PAPER_SIX_TESTS
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import PACKAGE_ROOT
from crsrepro.present.measurements import TWO_LEVEL_PREFIX, measure, multiverse_shares

CLAIMS_PATH = PACKAGE_ROOT.parent / "data_manifests" / "claims.yaml"
"""The claims file of the checkout (the package is installed editable from it)."""
CLAIMS_VERSION = 1
REQUIRED = ("id", "value", "kind", "source", "gloss", "section", "notebook", "measure", "scope")
OPTIONAL = ("analogue", "note", "evidence")
SCOPES = ("any", "paper")
KINDS = ("auroc", "ece", "tau", "rho", "r", "probability", "p_value", "count", "rank", "crs", "weight",
         "fraction", "movement", "overlap", "rank_shift", "auroc_change", "ece_change", "auroc_points")
STATUSES = ("measured", "protocol", "paper profile only", "not comparable", "not measured")
EVIDENCE = ("measured", "protocol")
"""What a claim's measurement is (the claims file's ``evidence`` field, default ``measured``): an empirical
result of the run, or ``protocol``: an echo of the profile or of a library default, an identity true by
construction, or a worked example (issue 24; DESIGN.md section 15). A protocol row is never ``measured``."""
RECALIBRATION_MEASURES = ("recalibration_",)
"""Measurements of the paper's recalibration summaries over its "six main tests" (the range of
reductions, the mean drop and its interval, the AUROC change, the test count): not comparable on any
profile while the six are unknown (:data:`crsrepro.analyse.findings.PAPER_SIX_TESTS` is None)."""
SEED_BOOTSTRAP_MEASURES = ("p_rank1", "p_top3", "crs_diff_ci", "n_p_top3_zero")
"""Measurements that the seed-paired bootstrap produces: comparable only when seeds vary D, C and R."""
NULL_MEASURES = {"depth_intermediate_wins": ("depth_intermediate_wins_null", "depth_intermediate_wins_p")}
"""Counts that chance alone makes large, with the measurements of their null reference: the count
exchangeable taps would give on this run's pairs and the one-sided p of this run's count
(:func:`crsrepro.analyse.depth.win_counts`); their claims' notes quote it."""
_ID = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")



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
    for key in ("id", "source", "gloss", "section", "notebook"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise ClaimsError(f"{where}: {key} must be a non-empty string, got {entry[key]!r}")
    if not _ID.match(entry["id"]):
        raise ClaimsError(f"{where}: id must be snake_case (a-z, 0-9, single underscores), got {entry['id']!r}")
    choices = {"kind": KINDS, "scope": SCOPES}
    for key, allowed in choices.items():
        if entry[key] not in allowed:
            raise ClaimsError(f"{where}: {key} must be one of {', '.join(allowed)}, got {entry[key]!r}")
    for key in ("measure", "analogue", "note", "evidence"):
        value = entry.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ClaimsError(f"{where}: {key} must be a non-empty string or null, got {value!r}")
    if entry.get("evidence") is not None and entry["evidence"] not in EVIDENCE:
        raise ClaimsError(f"{where}: evidence must be one of {', '.join(EVIDENCE)}, got {entry['evidence']!r}")
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
        field, a bad value, kind or scope, or repeats an id. The message names the entry. (That every
        ``notebook`` is a chapter of :data:`crsrepro.present.chapters.CHAPTERS` is a test of the file.)

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


def _null_note(name, measured: dict) -> list[str]:
    """The note of a count with a null reference (:data:`NULL_MEASURES`) that this run measured."""
    if name not in NULL_MEASURES or measured.get(name) is None:
        return []
    expected, p = (measured.get(key) for key in NULL_MEASURES[name])
    return [f"exchangeable taps would give {format_value(expected)} on this run's pairs "
            f"(one-sided p = {format_value(p)} for this run's {format_value(measured[name])})"]


def _two_level_note(name, measured: dict) -> list[str]:
    """The note quoting the two-level bootstrap's value of a seed-bootstrap measure, when measured."""
    value = measured.get(TWO_LEVEL_PREFIX + name) if name else None
    return [] if value is None else [f"seeds x test cases: {format_value(value)}"]


def _status(claim, measured: dict, paper_scope: bool) -> tuple[str, object, str]:
    """(status, this run's value or None, note) of one claim; see :func:`claims_table`."""
    compared = claim.analogue if claim.scope == "paper" and not paper_scope else claim.measure
    note = ([claim.note] if claim.note else []) + _null_note(compared, measured) + _two_level_note(compared, measured)
    if PAPER_SIX_TESTS is None and compared is not None and compared.startswith(RECALIBRATION_MEASURES):
        return "not comparable", measured.get(compared), "; ".join(
            ["the paper does not name its six main tests of recalibration, so no recalibration figure of any "
             "profile can be compared with the paper's"] + note)
    if claim.scope == "paper" and not paper_scope:
        value = measured.get(claim.analogue) if claim.analogue else None
        if value is not None:
            note.insert(0, f"analogue `{claim.analogue}`: this run's own, not compared")
        elif claim.analogue:
            note.insert(0, f"the analogue `{claim.analogue}` is not measured (needs {claim.notebook})")
        return "paper profile only", value, "; ".join(note)
    if claim.measure is not None and measured.get(claim.measure) is not None:
        if claim.evidence == "protocol":  # an identity such as P(rank 1) summing to 1 holds on any seeds
            return "protocol", measured[claim.measure], "; ".join(note)
        if claim.measure.startswith(SEED_BOOTSTRAP_MEASURES) and not measured.get("has_seed_variance", 1):
            return "not comparable", measured[claim.measure], "; ".join(
                ["the seeds of this run do not vary D, C and R in every cell, so a seed bootstrap cannot be "
                 "compared with the paper's"] + note)
        return "measured", measured[claim.measure], "; ".join(note)
    if claim.measure is None:
        return "not measured", None, "; ".join(["no measurement is defined"] + note)
    return "not measured", None, "; ".join([f"needs {claim.notebook}: this run has no `{claim.measure}`"] + note)


def claims_table(claims: pd.DataFrame, measured: dict, *, paper_scope: bool,
                 multiverse: dict | None = None) -> pd.DataFrame:
    """The claims page: each paper number beside this run's value, with a status.

    Parameters
    ----------
    claims : DataFrame
        From :func:`load_claims`.
    measured : dict
        ``{measurement name: value}`` from :func:`crsrepro.present.measurements.measure` and
        :func:`paper_checks` (a value may be a float, a ``(low, high)`` tuple, or None for "not available").
    paper_scope : bool
        Whether the measurements come from a run of the paper's protocol (the profile's
        ``claims.paper_scope``): ``paper``-scope claims are compared only then.
    multiverse : dict, optional
        ``{measurement name: share}`` (:func:`crsrepro.present.measurements.multiverse_shares`): for a claim that
        depends on an [ours] choice of the CRS, the share of the multiverse of those choices in which the
        conclusion behind it holds as in this run's default (a key ending in ``:`` covers every measurement
        with that prefix); shown in a ``multiverse`` column when given.

    Returns
    -------
    DataFrame
        One row per claim: ``id, claim`` (the English gloss), ``source`` (the review's sentence),
        ``paper value``, ``this run``, ``notebook``, ``status`` and ``note``. Values are printed with
        :func:`format_value`; ``this run`` is empty whenever nothing was measured. ``status`` is

        - ``measured``: an empirical result of this run is available, and the claim is comparable here
          (scope ``any``, or scope ``paper`` with ``paper_scope``);
        - ``protocol``: the same, for a claim whose ``evidence`` is ``protocol`` (:data:`EVIDENCE`): an
          echo of the profile or of a default, an identity or a worked example, not a result of the run;
        - ``paper profile only``: a ``paper``-scope claim without ``paper_scope``; ``this run`` holds the
          claim's analogue when one is named and measured, and is never compared;
        - ``not comparable``: a recalibration claim (:data:`RECALIBRATION_MEASURES`) on any profile while
          the paper's six main tests are unknown, or a seed-bootstrap claim (P(rank 1), P(top 3), paired CRS intervals) on a
          run whose seeds do not vary discrimination, calibration and robustness in every cell
          (``measured["has_seed_variance"]`` is 0): its intervals would be artefacts of the protocol;
        - ``not measured``: the measurement is not available (the note names the chapter that
          would produce it) or none is defined.

    Examples
    --------
    >>> claims = load_claims()
    >>> claims = claims[claims["id"].isin(["n_runs", "auroc_medgemma", "lora_rank"])]
    >>> table = claims_table(claims, {"paper_grid_runs": 17575, "aggregate_auroc:rank1": 0.87},
    ...                      paper_scope=False)
    >>> table[["id", "paper value", "this run", "status"]].values.tolist()  # doctest: +NORMALIZE_WHITESPACE
    [['n_runs', '17,575', '17,575', 'protocol'], ['auroc_medgemma', '0.909', '0.87', 'paper profile only'],
     ['lora_rank', '8', '', 'not measured']]
    """
    rows = []
    for claim in claims.itertuples(index=False):
        status, value, note = _status(claim, measured, paper_scope)
        row = {"id": claim.id, "claim": claim.gloss, "source": claim.source,
               "paper value": format_value(claim.value), "this run": format_value(value),
               "notebook": claim.notebook, "status": status, "note": note}
        if multiverse is not None:
            share = (None if not claim.measure else multiverse.get(claim.measure,
                                                                   multiverse.get(claim.measure.split(":")[0] + ":")))
            row["multiverse"] = "" if share is None else f"{share:.0%}"
        rows.append(row)
    columns = ["id", "claim", "source", "paper value", "this run", "notebook", "status", "note"]
    return pd.DataFrame(rows, columns=columns + (["multiverse"] if multiverse is not None else []))


def reversed_pairs_for_tau(tau: float, n_encoders: int, *, decimals: int = 3) -> int:
    """The number of reversed pairs among ``n_encoders`` untied encoders whose Kendall tau-b is ``tau``.

    For every possible count r of reversed pairs it builds a ranking with exactly r inversions and
    asks :func:`crsrepro.score.stats.rank_agreement` for its tau-b; it returns the only r whose tau-b rounds
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
    from crsrepro.score.stats import rank_agreement

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


def paper_checks(claims: pd.DataFrame) -> dict:
    """The measurements that check the paper's numbers against each other rather than against a run:
    the reversed pairs that the paper's Kendall tau implies over its panel (DESIGN.md section 10:
    tau = 0.600 over 15 encoders means exactly 21 of 105 pairs reversed).

    >>> paper_checks(load_claims())
    {'reversed_pairs_for_paper_tau': 21}
    """
    from crsrepro.profiles import load_profile

    tau = claims.set_index("id").loc["auroc_crs_kendall_tau", "value"]
    return {"reversed_pairs_for_paper_tau": reversed_pairs_for_tau(tau, len(load_profile("paper").encoders))}


def run_claims(analysis) -> pd.DataFrame:
    """The claims page of one run: :func:`claims_table` of the claims file and the run's measurements
    (:func:`crsrepro.present.measurements.measure`, with :func:`paper_checks`), compared with the paper
    when the profile's ``claims.paper_scope`` says so, with the multiverse share of the claims that depend
    on an [ours] choice of the CRS (:attr:`~crsrepro.analyse.run_analysis.RunAnalysis.multiverse`).

    Every chapter's "paper vs this run" box reads it, in its own kernel, and measuring every claim takes
    minutes (the bootstrap, the multiverse, the insertion experiment ...). So it is computed once for all
    of them (:meth:`~crsrepro.analyse.run_analysis.RunAnalysis.computed_once`, under a key that names the
    claims ledger with the manifests).
    """
    def compute() -> pd.DataFrame:
        claims = load_claims()
        return claims_table(claims, measure(analysis) | paper_checks(claims),
                            paper_scope=analysis.profile.claims.paper_scope,
                            multiverse=multiverse_shares(analysis.multiverse))

    return analysis.computed_once("claims", compute)


def status_counts(table: pd.DataFrame) -> pd.DataFrame:
    """How many claims of a claims table (:func:`run_claims`) each chapter has in each status.

    >>> table = pd.DataFrame({"notebook": ["00_setup", "00_setup", "02_calibration"],
    ...                       "status": ["measured", "not measured", "measured"]})
    >>> status_counts(table).to_dict("index")
    {'00_setup': {'measured': 1, 'not measured': 1}, '02_calibration': {'measured': 1, 'not measured': 0}}
    """
    return table.groupby(["notebook", "status"]).size().unstack(fill_value=0)
