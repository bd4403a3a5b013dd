"""Recalibrate a local cohort's model outputs: ``crsrepro recalibrate`` (DESIGN.md section 14).

The paper's most actionable finding for a deployment team is that post-hoc recalibration on a few
hundred local labelled cases cuts the ECE by 54-77 % and leaves the AUROC where it was (paper,
Results; DESIGN.md section 8). This module turns it into a recipe for a team that has its own model's
outputs on a local cohort:

1. :func:`read_cohort` reads a csv with one column of scores per class and a label column whose
   values are class (column) names; the classes are, by default, the label column's values, so any
   other column (a case id, a site) is carried through without a flag. Scores are probabilities or
   logits (``input``, below). A cohort with one class only, or an id column (``--id-column``) with a
   repeated id, is refused, naming the rows.
2. :func:`split_cohort` splits the cases into a calibration part and an evaluation part, stratified
   by label (or reads a split column whose values are ``calibration`` / ``evaluation``).
3. :func:`recalibrate_cohort` fits one recalibrator of :mod:`crsrepro.fit.calibration` on the
   calibration part (``method="auto"`` picks the lowest cross-validated ECE there, with
   :func:`crsrepro.fit.calibration.select_recalibrator`), then reports on the evaluation part the ECE and
   the macro AUROC before and after, with paired case-bootstrap intervals, a reliability diagram and
   :func:`cases_for_ece_precision`, the number of labelled cases at which the interval of the ECE
   becomes as narrow as a stated tolerance.
4. The fitted map is saved as JSON (:func:`save_map`; no pickle) and :func:`apply_map` reuses it on
   new outputs with the same columns; it gives the same probabilities as the fit run.

Only multi-class outputs (one column per class, rows of probabilities or logits) are handled;
multi-label outputs (one binary column per label) are out of scope here, although the recalibrators
support them in the library.

Input kinds (``input``): ``probabilities`` rows must lie in [0, 1] and sum to 1 within
:data:`SUM_TOLERANCE` (they are then renormalised exactly); ``logits`` rows are turned into
probabilities by a softmax; ``auto`` reads the whole file one way, and only when every row agrees,
so that no single value changes how a file is read: every row in [0, 1] and summing to 1 is
probabilities, every row with a score outside [0, 1] is logits, and anything else (rows in [0, 1]
that do not sum to 1, or a mix of rows in [0, 1] and rows outside it) is an error that names a row
and asks for ``--input``.

Outputs never replace an input: an ``--out`` (or the map or diagram beside it) that is the
``--scores`` file is refused, and so is any existing file unless ``overwrite``.

Intervals come from a paired case bootstrap (the same resampled cases before and after,
:func:`crsrepro.score.stats.two_level_bootstrap` with one seed) and are the book's bootstrap
interval, :func:`crsrepro.score.stats.bootstrap_interval`, so each interval contains its estimate:
for the AUROC and its change the plug-in with the percentile interval centred on it; for the ECE and
its change (:data:`ECE_INTERVAL`) the basic interval about an estimate corrected for the bootstrap's
median bias. The binned ECE is biased upward in small samples (a resample with duplicated cases looks
more miscalibrated), so its printed estimate lies below the plug-in ECE of the evaluation part.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import softmax

from crsrepro.fit.calibration import (RECALIBRATORS, TooFewCasesError, make_recalibrator, recalibrator_from_dict,
                                  select_recalibrator)
from crsrepro.core.errors import CrsreproError
from crsrepro.core.metrics import expected_calibration_error, reliability_curve
from crsrepro.score.stats import as_generator, bootstrap_interval, two_level_bootstrap

logger = logging.getLogger(__name__)

INPUT_KINDS = ("auto", "probabilities", "logits")
METHODS = ("auto", *RECALIBRATORS)
SPLIT_VALUES = ("calibration", "evaluation")

#: A probability row may sum to 1 within this, for probabilities rounded in a csv **[ours]**.
SUM_TOLERANCE = 1e-3
#: Share of the cohort in the calibration part when none is given **[ours]**.
CALIBRATION_FRACTION = 0.5
#: Calibration cases a method needs per fitted parameter **[ours]**; see :func:`required_cases`.
CASES_PER_PARAMETER = 10
#: Target half-width of the ECE interval for :func:`cases_for_ece_precision` **[ours]**.
ECE_TOLERANCE = 0.02
#: Case-bootstrap resamples for every interval here **[ours]**.
N_RESAMPLES = 1000
#: Level of every interval here.
LEVEL = 0.95
#: The :func:`crsrepro.score.stats.bootstrap_interval` method of the ECE and its change: ``basic``,
#: the one for statistics that resampling inflates (the AUROC's is ``percentile``).
ECE_INTERVAL = "basic"
#: Version tag of a saved local map.
LOCAL_MAP_FORMAT = "crsrepro-local-map-v1"


class CohortError(CrsreproError, ValueError):
    """A local cohort's csv or saved map is unusable (names the file and the row or column)."""


# ----------------------------------------------------------------------------------------------
# Reading and splitting the cohort


@dataclass(frozen=True)
class Cohort:
    """A local cohort as read from its csv.

    Attributes
    ----------
    path : Path
    table : DataFrame
        The csv as strings, every column kept.
    classes : list of str
        The score columns, in order; class id k is ``classes[k]``.
    probs : ndarray of shape (N, K)
        Probabilities (after a softmax when the scores are logits).
    labels : ndarray of shape (N,) or None
        Class ids, or None when no label column was asked for.
    input_kind : {"probabilities", "logits"}
    """

    path: Path
    table: pd.DataFrame
    classes: list
    probs: np.ndarray
    labels: np.ndarray | None
    input_kind: str


def _row(index) -> int:
    """The csv line number of a 0-based data row (line 1 is the header)."""
    return int(index) + 2


def _read_scores(path, table, classes):
    values = np.empty((len(table), len(classes)))
    for k, column in enumerate(classes):
        numbers = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(numbers))
        if bad.size:
            raise CohortError(f"{path}: row {_row(bad[0])}, column {column!r}: {table[column].iat[bad[0]]!r} is not a "
                              f"finite number (name the score columns with --classes if {column!r} is not one)")
        values[:, k] = numbers
    return values


def _as_probabilities(path, values, input_kind, classes, hint=""):
    """Probabilities from the score columns, by ``input_kind`` (see the module docstring); ``hint``
    ends the messages about sums (how the score columns were chosen)."""
    outside = (values < 0) | (values > 1)
    in_range = ~outside.any(axis=1)
    sums = values.sum(axis=1)
    off = np.flatnonzero(np.abs(sums - 1) > SUM_TOLERANCE)
    if input_kind == "auto":
        if in_range.all() and off.size == 0:
            input_kind = "probabilities"
        elif not in_range.any():
            input_kind = "logits"
        elif in_range.all():
            raise CohortError(f"{path}: row {_row(off[0])}: the scores lie in [0, 1] but sum to {sums[off[0]]:.6g}, "
                              f"not 1, so they are neither clearly probabilities nor clearly logits; pass --input "
                              f"logits, or normalise them and pass --input probabilities{hint}")
        else:
            n_in, n = int(in_range.sum()), len(values)
            if n_in >= n - n_in:  # name a row of the minority: here one with a score outside [0, 1]
                i = int(np.flatnonzero(~in_range)[0])
                k = int(np.flatnonzero(outside[i])[0])
                what = (f"row {_row(i)}, column {classes[k]!r}: {values[i, k]:g} lies outside [0, 1], but "
                        f"{n_in} of {n} rows lie in [0, 1]")
            else:
                i = int(np.flatnonzero(in_range)[0])
                what = (f"row {_row(i)}: every score lies in [0, 1], but {n - n_in} of {n} rows have scores "
                        f"outside [0, 1]")
            raise CohortError(f"{path}: {what}; --input auto reads a file one way only when every row agrees, so "
                              f"pass --input logits if the scores are logits, or correct the row and pass "
                              f"--input probabilities")
    if input_kind == "logits":
        return softmax(values, axis=1), input_kind
    if not in_range.all():
        i = int(np.flatnonzero(~in_range)[0])
        k = int(np.flatnonzero(outside[i])[0])
        raise CohortError(f"{path}: row {_row(i)}, column {classes[k]!r}: {values[i, k]:g} is not a probability "
                          f"in [0, 1] (pass --input logits if the scores are logits)")
    if off.size:
        raise CohortError(f"{path}: row {_row(off[0])}: probabilities sum to {sums[off[0]]:.6g}, not 1 "
                          f"(tolerance {SUM_TOLERANCE}; pass --input logits if the scores are logits){hint}")
    return values / sums[:, None], input_kind


def _rows(indices, limit=5) -> str:
    """``rows 2, 5, 9`` (csv lines) of 0-based data rows, at most ``limit`` named."""
    named = ", ".join(str(_row(i)) for i in indices[:limit])
    return f"row{'s' if len(indices) > 1 else ''} {named}{' ...' if len(indices) > limit else ''}"


def _check_ids(path, table, id_column):
    """Refuse a repeated case id, naming its rows."""
    ids = table[id_column].str.strip()
    repeated = ids[ids.duplicated(keep=False)]
    if len(repeated):
        first = repeated.iat[0]
        rows = np.flatnonzero((ids == first).to_numpy())
        raise CohortError(f"{path}: column {id_column!r}: id {first!r} is on {_rows(rows)} ({repeated.nunique()} "
                          f"id(s) repeated in all); every case needs its own id")


def check_classes(path, labels, classes, rows=None, what="the cohort"):
    """Refuse labels of fewer than two classes, naming their rows (0-based data rows; default: all):
    neither a recalibrator nor an AUROC can use them."""
    present = np.unique(labels)
    if present.size < 2:
        rows = np.arange(len(labels)) if rows is None else np.asarray(rows)
        name = classes[present[0]] if present.size else "none"
        raise CohortError(f"{path}: every one of the {len(labels)} cases of {what} ({_rows(rows)}) has label "
                          f"{name!r}; recalibrating and the AUROC need cases of at least two classes")


def read_cohort(path, *, label_column=None, classes=None, input_kind="auto", exclude=(), id_column=None) -> Cohort:
    """Read a local cohort's csv of per-class scores and (optionally) labels.

    Parameters
    ----------
    path : path
        A csv with a header row.
    label_column : str, optional
        The column whose values are class names (score column names); None reads no labels.
    classes : list of str, optional
        The score columns. Default: the label column's values, in the csv's column order; without a
        label column, every column other than ``exclude`` and ``id_column``.
    input_kind : {"auto", "probabilities", "logits"}, default "auto"
        See the module docstring.
    exclude : sequence of str
        Columns that are neither scores nor the label (a split column).
    id_column : str, optional
        A case-id column: never a score, and a repeated id is an error.

    Returns
    -------
    Cohort

    Raises
    ------
    CohortError
        Naming the file and the row or column: a missing file or column, a score that is not a
        number, probabilities that do not sum to 1, scores that are not all of one kind (auto), an
        empty label or a label that is no class, labels of one class only, a repeated id.
    """
    path = Path(path)
    if input_kind not in INPUT_KINDS:
        raise CohortError(f"input must be one of {', '.join(INPUT_KINDS)}, got {input_kind!r}")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise CohortError(f"{path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CohortError(f"{path}: not a readable csv ({str(exc).strip().splitlines()[0]})") from None
    other = [c for c in [label_column, id_column, *exclude] if c is not None]
    missing = [c for c in [*other, *(classes or [])] if c not in table.columns]
    if missing:
        raise CohortError(f"{path}: no column {missing[0]!r} (columns: {', '.join(table.columns)})")
    if len(table) == 0:
        raise CohortError(f"{path}: no data rows")
    hint = ""
    if classes is None:
        if label_column is None:
            classes = [c for c in table.columns if c not in other]
        else:
            values = set(table[label_column].str.strip())
            classes = [c for c in table.columns if c in values and c not in other]
            hint = (f" (the score columns are the label column's values, {', '.join(classes)}; name every score "
                    f"column with --classes if a class has no labelled case)")
    classes = list(classes)
    labels = None
    if label_column is not None:
        names = table[label_column].str.strip()
        unknown = np.flatnonzero(~names.isin(classes).to_numpy())
        if unknown.size:
            i = unknown[0]
            known = (f"is not one of the score columns ({', '.join(classes)})" if not hint else
                     f"names no score column (the classes are the label column's values, each a column; columns: "
                     f"{', '.join(table.columns)})")
            raise CohortError(f"{path}: row {_row(i)}, column {label_column!r}: label {table[label_column].iat[i]!r} "
                              f"{known}")
        labels = names.map({c: k for k, c in enumerate(classes)}).to_numpy(dtype=int)
    if len(classes) < 2:
        if labels is not None:
            check_classes(path, labels, classes)
        raise CohortError(f"{path}: {len(classes)} score column(s) {classes}; a multi-class map needs at least 2")
    probs, input_kind = _as_probabilities(path, _read_scores(path, table, classes), input_kind, classes, hint)
    if labels is not None:
        check_classes(path, labels, classes)
    if id_column is not None:
        _check_ids(path, table, id_column)
    return Cohort(path=path, table=table, classes=classes, probs=probs, labels=labels, input_kind=input_kind)


def split_cohort(cohort: Cohort, calibration_split=CALIBRATION_FRACTION, *, seed=0) -> np.ndarray:
    """Which cases form the calibration part: a stratified random share, or a split column.

    Parameters
    ----------
    cohort : Cohort
        With labels.
    calibration_split : float or str, default :data:`CALIBRATION_FRACTION`
        A share in (0, 1) of the cases for calibration, drawn stratified by label; or the name of a
        column of the csv whose values are ``calibration`` or ``evaluation``.
    seed : int, default 0
        Seeds the random split.

    Returns
    -------
    ndarray of bool, shape (N,)
        True for a calibration case.
    """
    column = split_column_name(calibration_split)
    if column is not None:
        return _split_column(cohort, column)
    calibration_split = float(calibration_split)
    if not 0 < calibration_split < 1:
        raise CohortError(f"--calibration-split must be a share in (0, 1) or a column name, got {calibration_split!r}")
    rng = np.random.default_rng(seed)
    is_calibration = np.zeros(len(cohort.labels), dtype=bool)
    for k in np.unique(cohort.labels):
        members = rng.permutation(np.flatnonzero(cohort.labels == k))
        is_calibration[members[:round(calibration_split * members.size)]] = True
    return is_calibration


def split_column_name(calibration_split):
    """The split column named by ``calibration_split``, or None when it is a share (a number)."""
    if not isinstance(calibration_split, str):
        return None
    try:
        float(calibration_split)
    except ValueError:
        return calibration_split
    return None


def _split_column(cohort, column):
    if column not in cohort.table.columns:
        raise CohortError(f"{cohort.path}: no column {column!r} for --calibration-split "
                          f"(columns: {', '.join(cohort.table.columns)})")
    values = cohort.table[column].str.strip()
    bad = np.flatnonzero(~values.isin(SPLIT_VALUES).to_numpy())
    if bad.size:
        raise CohortError(f"{cohort.path}: row {_row(bad[0])}, column {column!r}: {cohort.table[column].iat[bad[0]]!r} "
                          f"is neither {SPLIT_VALUES[0]!r} nor {SPLIT_VALUES[1]!r}")
    return (values == "calibration").to_numpy()


def required_cases(method: str, n_classes: int) -> int:
    """The fewest calibration cases a method needs: :data:`CASES_PER_PARAMETER` per parameter **[ours]**.

    Parameters count 1 for temperature, 2K for vector scaling, K (K + 1) for Dirichlet, and 2K for
    isotonic regression (a non-parametric map, counted like vector scaling).

    >>> required_cases("temperature", 8), required_cases("vector", 8), required_cases("dirichlet", 8)
    (10, 160, 720)
    """
    parameters = {"temperature": 1, "vector": 2 * n_classes, "isotonic": 2 * n_classes,
                  "dirichlet": n_classes * (n_classes + 1)}
    return CASES_PER_PARAMETER * parameters[method]


# ----------------------------------------------------------------------------------------------
# Intervals and the sample-size rule


@dataclass(frozen=True)
class Interval:
    """A printed estimate and its interval, as :func:`crsrepro.score.stats.bootstrap_interval` gives them."""

    estimate: float
    ci_low: float
    ci_high: float

    @classmethod
    def of(cls, plug_in, replicates, method, level=LEVEL, floor=None) -> "Interval":
        """:func:`crsrepro.score.stats.bootstrap_interval` of a plug-in estimate and its replicates."""
        return cls(*map(float, bootstrap_interval(plug_in, replicates, level, method=method, floor=floor)))

    def __str__(self):
        return f"{self.estimate:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}]"

    def signed(self) -> str:
        """As ``str``, with signs: for a change."""
        return f"{self.estimate:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}]"


@dataclass(frozen=True)
class SampleSizeEstimate:
    """How many labelled cases make the ECE interval as narrow as ``tolerance`` (:func:`cases_for_ece_precision`).

    Attributes
    ----------
    half_widths : dict[int, float]
        Subsample size -> bootstrap half-width of the ECE interval at that size.
    n_needed : int
        The estimated number of labelled cases.
    tolerance, level : float
    """

    half_widths: dict
    n_needed: int
    tolerance: float
    level: float


def cases_for_ece_precision(labels, probs, *, tolerance=ECE_TOLERANCE, level=LEVEL, n_resamples=N_RESAMPLES,
                            rng=0) -> SampleSizeEstimate:
    """The number of labelled cases at which the ECE interval's half-width falls to ``tolerance`` [ours].

    The rule: draw ``n_resamples`` subsamples (with replacement) of m = N/4, N/2 and N of the given
    cases, take the half-width h(m) of the ``level`` interval of the ECE at each m
    (:func:`crsrepro.score.stats.bootstrap_interval`, whose width is that of the percentile interval), fit
    ``h(m) = c / sqrt(m)`` (least squares on log h with the slope fixed at -1/2, the rate of a
    bootstrap standard error) and solve ``c / sqrt(n) = tolerance``. It answers "how many labelled
    cases does a team need to know its ECE to within +-tolerance"; sizes below 10 are left out.

    Parameters
    ----------
    labels : array of shape (N,)
        Class ids.
    probs : array of shape (N, K)
        Probabilities (for the recipe: the recalibrated ones on the evaluation part).
    tolerance : float, default :data:`ECE_TOLERANCE`
    level : float, default :data:`LEVEL`
    n_resamples : int, default :data:`N_RESAMPLES`
    rng : int or numpy Generator, default 0

    Returns
    -------
    SampleSizeEstimate
    """
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must lie in (0, 1), got {tolerance!r}")
    generator = as_generator(rng)
    labels, probs = np.asarray(labels), np.asarray(probs, dtype=float)
    n = len(labels)
    sizes = sorted({m for m in (n // 4, n // 2, n) if m >= 10})
    if not sizes:
        raise TooFewCasesError(f"{n} evaluation cases; the sample-size rule needs at least 10")
    plug_in = expected_calibration_error(labels, probs, task="multiclass")
    half_widths = {}
    for m in sizes:
        draws = generator.integers(0, n, size=(n_resamples, m))
        replicates = [expected_calibration_error(labels[d], probs[d], task="multiclass") for d in draws]
        interval = Interval.of(plug_in, replicates, ECE_INTERVAL, level)
        half_widths[m] = (interval.ci_high - interval.ci_low) / 2
    log_c = np.mean([np.log(h) + 0.5 * np.log(m) for m, h in half_widths.items()])
    return SampleSizeEstimate(half_widths=half_widths, n_needed=math.ceil(np.exp(2 * log_c) / tolerance**2),
                              tolerance=tolerance, level=level)


# ----------------------------------------------------------------------------------------------
# The recipe


@dataclass(frozen=True)
class RecalibrationReport:
    """What ``crsrepro recalibrate`` found; :meth:`lines` is what it prints.

    Attributes
    ----------
    path : Path
        The cohort's csv.
    method : str
        The fitted recalibrator.
    chosen_by : str
        ``"auto"`` (lowest cross-validated ECE) or ``"given"`` (fitted as asked) or ``"map"`` (applied).
    n_calibration, n_evaluation : int
    cv_ece : dict[str, float] or None
        Cross-validated ECE per method in the calibration part (auto only).
    ece_before, ece_after, ece_change, auroc_before, auroc_after, auroc_change : Interval or None
        On the evaluation part, paired case-bootstrap intervals (None without labels).
    sample_size : SampleSizeEstimate or None
    written : list of Path
    """

    path: Path
    method: str
    chosen_by: str
    n_calibration: int
    n_evaluation: int
    input_kind: str
    cv_ece: dict | None
    ece_before: Interval | None
    ece_after: Interval | None
    ece_change: Interval | None
    auroc_before: Interval | None
    auroc_after: Interval | None
    auroc_change: Interval | None
    sample_size: SampleSizeEstimate | None
    written: list

    def lines(self) -> list[str]:
        """The printed summary, one string per line."""
        out = [f"{self.path}: {self.n_calibration + self.n_evaluation} cases, scores read as {self.input_kind}"]
        if self.chosen_by == "map":
            out.append(f"applied the saved {self.method} map to every case")
        else:
            out.append(f"calibration part {self.n_calibration} cases, evaluation part {self.n_evaluation} cases")
        if self.cv_ece is not None:
            scores = ", ".join(f"{m} {v:.4f}" for m, v in self.cv_ece.items())
            out.append(f"cross-validated ECE in the calibration part: {scores}")
        if self.chosen_by != "map":
            how = "lowest cross-validated ECE" if self.chosen_by == "auto" else "as asked"
            out.append(f"method: {self.method} ({how}), fitted on the calibration part")
        if self.ece_before is not None:
            where = "every case" if self.chosen_by == "map" else "the evaluation part"
            relative = -self.ece_change.estimate / self.ece_before.estimate if self.ece_before.estimate else np.nan
            out += [f"on {where}, {LEVEL:.0%} case-bootstrap intervals ({N_RESAMPLES} resamples, paired; ECE "
                    f"estimates corrected for the bootstrap's median bias):",
                    f"  ECE   before {self.ece_before}  after {self.ece_after}  change {self.ece_change.signed()} "
                    f"({relative:.0%} lower)",
                    f"  AUROC before {self.auroc_before}  after {self.auroc_after}  "
                    f"change {self.auroc_change.signed()}"]
        if self.sample_size is not None:
            s = self.sample_size
            widths = ", ".join(f"+-{h:.3f} at {m}" for m, h in s.half_widths.items())
            out.append(f"labelled cases for a {s.level:.0%} ECE interval of +-{s.tolerance:g}: about {s.n_needed} "
                       f"(half-widths {widths}; h ~ c/sqrt(n))")
        out.append("wrote " + ", ".join(str(p) for p in self.written))
        return out


def _before_after(labels, before, after, *, seed):
    """ECE and AUROC before/after and their changes, with paired case-bootstrap intervals: one
    :func:`crsrepro.score.stats.two_level_bootstrap` over one seed, so the same draws serve both."""
    boot = two_level_bootstrap(labels, {"before": before[None], "after": after[None]}, task="multiclass",
                               n_resamples=N_RESAMPLES, rng=seed)
    out = {}
    for metric, result, method in (("ece", boot.ece, ECE_INTERVAL), ("auroc", boot.auroc, "percentile")):
        t, reps = result.estimate, result.replicates
        for name in ("before", "after"):
            out[f"{metric}_{name}"] = Interval.of(t[name], reps[name], method, floor=0.0 if metric == "ece" else None)
        out[f"{metric}_change"] = Interval.of(t["after"] - t["before"], reps["after"] - reps["before"], method)
    return out


def plot_reliability(labels, before, after, path, *, title="") -> Path:
    """A reliability diagram (15 bins, top-label) of the probabilities before and after, saved as PNG.

    Uses :func:`crsrepro.core.metrics.reliability_curve`; markers are sized by bin count.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    for name, probs, colour in (("before", before, "tab:red"), ("after", after, "tab:blue")):
        curve = reliability_curve(labels, probs, task="multiclass")
        ece = curve.calibration_error()
        filled = curve.counts > 0
        ax.plot(curve.confidence[filled], curve.accuracy[filled], marker="o", color=colour,
                label=f"{name} (ECE {ece:.3f})")
        ax.scatter(curve.confidence[filled], curve.accuracy[filled], s=8 + 200 * curve.counts[filled] / len(labels),
                   color=colour, alpha=0.4)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top-label probability)", ylabel="accuracy",
           title=title or "reliability diagram")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _write_calibrated(cohort, probs, out, extra=None):
    table = cohort.table.copy()
    for k, column in enumerate(cohort.classes):
        table[column] = [repr(float(v)) for v in probs[:, k]]
    for column, values in (extra or {}).items():
        table[column] = values
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    return out


def save_map(path, recalibrator, cohort: Cohort) -> Path:
    """Save a fitted map as JSON: the recalibrator's :meth:`to_dict`, the class columns and the input kind."""
    data = {"format": LOCAL_MAP_FORMAT, "classes": cohort.classes, "input": cohort.input_kind,
            "fitted_on": str(cohort.path), "recalibrator": recalibrator.to_dict()}
    path = Path(path)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_map(path):
    """Read a map saved by :func:`save_map`: ``(recalibrator, classes, input_kind)``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        if data.get("format") != LOCAL_MAP_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {LOCAL_MAP_FORMAT!r}")
        return recalibrator_from_dict(data["recalibrator"]), list(data["classes"]), data["input"]
    except FileNotFoundError:
        raise CohortError(f"{path}: no such file") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CohortError(f"{path}: not a map saved by crsrepro recalibrate ({exc})") from None


def beside(out, suffix) -> Path:
    """``calibrated.csv`` -> ``calibrated<suffix>`` in the same folder (the map and the diagram)."""
    out = Path(out)
    return out.with_name(out.stem + suffix)


def check_outputs(outputs, inputs, *, overwrite=False) -> None:
    """Refuse to write over an input, ever, or over an existing file unless ``overwrite``.

    Parameters
    ----------
    outputs : sequence of path
        The files the command would write (the calibrated csv, the map, the diagram).
    inputs : sequence of path
        The files it reads (``--scores``, ``--apply``).
    overwrite : bool, default False
        ``--overwrite``: replace existing outputs that are not inputs.
    """
    read = {Path(p).resolve() for p in inputs}
    for path in map(Path, outputs):
        if path.resolve() in read:
            raise CohortError(f"{path}: is an input of this command; recalibrate never writes over its input, so "
                              f"name another --out (or --map)")
        if path.exists() and not overwrite:
            raise CohortError(f"{path} exists: pass --overwrite to replace it, or name another --out (or --map)")


def recalibrate_cohort(scores, *, label_column, out, method="auto", calibration_split=CALIBRATION_FRACTION,
                       input_kind="auto", classes=None, id_column=None, map_path=None, n_folds=5,
                       tolerance=ECE_TOLERANCE, seed=0, overwrite=False) -> RecalibrationReport:
    """Fit a recalibrator on a local cohort's calibration part and report on its evaluation part.

    Parameters
    ----------
    scores : path
        The cohort's csv (:func:`read_cohort`).
    label_column : str
    out : path
        The calibrated csv: every row of the input, score columns replaced by recalibrated
        probabilities, plus a ``calibration_split`` column when the split was drawn here. The
        reliability diagram goes to ``<out stem>.reliability.png`` beside it.
    method : {"auto", "temperature", "vector", "isotonic", "dirichlet"}, default "auto"
        ``auto`` picks by cross-validated ECE among the methods whose :func:`required_cases` the
        calibration part meets.
    calibration_split : float or str, default :data:`CALIBRATION_FRACTION`
        See :func:`split_cohort`.
    input_kind : {"auto", "probabilities", "logits"}
    classes : list of str, optional
        The score columns (default: the label column's values, :func:`read_cohort`).
    id_column : str, optional
        A case-id column, carried through unchanged; a repeated id is an error.
    map_path : path, optional
        Where the map goes (default ``<out stem>.map.json`` beside ``out``).
    n_folds : int, default 5
        Folds of the cross-validation of ``auto``.
    tolerance : float, default :data:`ECE_TOLERANCE`
        For :func:`cases_for_ece_precision`.
    seed : int, default 0
        Seeds the split, the folds and the bootstraps.
    overwrite : bool, default False
        Replace existing output files (:func:`check_outputs`; an input is never replaced).

    Returns
    -------
    RecalibrationReport
    """
    if method not in METHODS:
        raise CohortError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    map_path = map_path or beside(out, ".map.json")
    diagram = beside(out, ".reliability.png")
    check_outputs([out, map_path, diagram], [scores], overwrite=overwrite)
    split_column = split_column_name(calibration_split)
    cohort = read_cohort(scores, label_column=label_column, classes=classes, input_kind=input_kind,
                         exclude=[split_column] if split_column else [], id_column=id_column)
    is_calibration = split_cohort(cohort, calibration_split, seed=seed)
    calib, evaluation = np.flatnonzero(is_calibration), np.flatnonzero(~is_calibration)
    for part, rows in (("calibration", calib), ("evaluation", evaluation)):
        if rows.size:
            check_classes(cohort.path, cohort.labels[rows], cohort.classes, rows, what=f"the {part} part")
    n_classes = len(cohort.classes)
    candidates = list(RECALIBRATORS) if method == "auto" else [method]
    allowed = [m for m in candidates if required_cases(m, n_classes) <= calib.size]
    if not allowed:
        needs = ", ".join(f"{m} {required_cases(m, n_classes)}" for m in candidates)
        raise TooFewCasesError(f"{cohort.path}: {calib.size} calibration cases for {n_classes} classes; the method "
                               f"needs at least ({CASES_PER_PARAMETER} per parameter): {needs}")
    if evaluation.size < 10:
        raise TooFewCasesError(f"{cohort.path}: {evaluation.size} evaluation cases; the report needs at least 10")
    skipped = sorted(set(candidates) - set(allowed))
    if skipped:
        logger.warning("%s: %d calibration cases are too few for %s; auto chooses among %s", cohort.path,
                       calib.size, ", ".join(skipped), ", ".join(allowed))
    cv_ece = None
    chosen = allowed[0]
    if method == "auto":
        try:
            chosen, cv_ece = select_recalibrator(cohort.probs[calib], cohort.labels[calib], methods=allowed,
                                                 task="multiclass", n_folds=n_folds, seed=seed, return_scores=True)
        except TooFewCasesError as exc:
            raise TooFewCasesError(f"{cohort.path}: {exc}") from None
    recalibrator = make_recalibrator(chosen).fit(cohort.probs[calib], cohort.labels[calib])
    calibrated = recalibrator.predict_proba(cohort.probs)
    labels = cohort.labels[evaluation]
    before, after = cohort.probs[evaluation], calibrated[evaluation]
    intervals = _before_after(labels, before, after, seed=seed)
    sample_size = cases_for_ece_precision(labels, after, tolerance=tolerance, rng=seed)
    extra = None if split_column else {"calibration_split": np.where(is_calibration, *SPLIT_VALUES)}
    written = [_write_calibrated(cohort, calibrated, out, extra), save_map(map_path, recalibrator, cohort),
               plot_reliability(labels, before, after, diagram,
                                title=f"{Path(scores).name}: evaluation part, {chosen}")]
    return RecalibrationReport(path=cohort.path, method=chosen, chosen_by="auto" if method == "auto" else "given",
                               n_calibration=calib.size, n_evaluation=evaluation.size, input_kind=cohort.input_kind,
                               cv_ece=cv_ece, sample_size=sample_size, written=written, **intervals)


def apply_map(scores, map_path, *, out, label_column=None, input_kind="auto", seed=0,
              overwrite=False) -> RecalibrationReport:
    """Apply a saved map to every case of a csv with the same score columns (``--apply``).

    With ``label_column`` it also reports ECE and AUROC before and after on every case, with their
    intervals and the diagram; without it, it only writes the calibrated csv. ``overwrite``: as for
    :func:`recalibrate_cohort`.
    """
    outputs = [out] + ([beside(out, ".reliability.png")] if label_column is not None else [])
    check_outputs(outputs, [scores, map_path], overwrite=overwrite)
    recalibrator, classes, saved_kind = load_map(map_path)
    if input_kind not in ("auto", saved_kind):
        raise CohortError(f"{map_path}: the map was fitted on {saved_kind}, not {input_kind} (--input)")
    cohort = read_cohort(scores, label_column=label_column, classes=classes, input_kind=saved_kind)
    calibrated = recalibrator.predict_proba(cohort.probs)
    written = [_write_calibrated(cohort, calibrated, out)]
    intervals = dict.fromkeys(["ece_before", "ece_after", "ece_change", "auroc_before", "auroc_after",
                               "auroc_change"])
    if cohort.labels is not None:
        intervals = _before_after(cohort.labels, cohort.probs, calibrated, seed=seed)
        written.append(plot_reliability(cohort.labels, cohort.probs, calibrated, beside(out, ".reliability.png"),
                                        title=f"{Path(scores).name}: saved map"))
    return RecalibrationReport(path=cohort.path, method=recalibrator.to_dict()["method"], chosen_by="map",
                               n_calibration=0, n_evaluation=len(cohort.probs), input_kind=cohort.input_kind,
                               cv_ece=None, sample_size=None, written=written, **intervals)

