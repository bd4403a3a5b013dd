"""Generic statistics around the CRS (DESIGN.md section 10): rank agreement and paired bootstraps.

- :func:`rank_agreement` compares two rankings of the same encoders (the paper's AUROC vs CRS
  comparison: Kendall tau-b, Spearman rho, reversed pairs, mean |rank shift|, top-3 overlap); its
  core, :func:`rank_correlations`, compares many rankings at once (the multiverse's).
- :func:`seed_paired_bootstrap` is the paper's 10,000-replicate bootstrap over seeds: every
  replicate draws the seeds with replacement, the *same* draw for every encoder, averages the
  per-seed reliability profiles, re-scores every cell under the frame's anchors and weights against
  the replicate's own profiles of its peers, and ranks the aggregates. It gives P(rank 1), P(top 3)
  and paired CRS differences with percentile intervals.
- :func:`case_paired_bootstrap` (beyond the paper) resamples test images, the same indices for
  every encoder, and recomputes the macro AUROC of each encoder; it runs in torch on any device.
- :func:`two_level_bootstrap` (beyond the paper) resamples seeds *and* test cases from stored per-case
  probabilities and gives intervals of D (macro AUROC) and C (ECE) that include test-set noise.
- :func:`seed_variance` and :func:`has_seed_variance` check that the seeds vary D, C and R at all,
  the condition for the seed bootstrap to be comparable with the paper's.

The paper's analyses (insertion experiment, external validity, recalibration summary, ...) are in
:mod:`crsrepro.analyse.findings`, one layer up; they use the validators and draws of this module
(:func:`as_generator`, :func:`check_level`, :func:`per_seed_array`, :func:`seed_weights`), as do the
multiverse (:mod:`crsrepro.analyse.sensitivity`) and ``crsrepro recalibrate``.

Percentile intervals from 5 seeds under-cover: a bootstrap over 5 units sees at most 126 distinct
resamples and underestimates the spread. The coverage test in ``tests/test_stats.py`` uses 40 units.

torch is imported by the functions that compute with it (the case and two-level bootstraps), not by the
module: every chapter reads the run through this module, and most never bootstrap cases (issue 29).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from tqdm import tqdm

from crsrepro.core.metrics import (expected_calibration_error, label_efficiency_retention, macro_auroc,
                                   robustness_raw)
from crsrepro.score.crs import (DIMENSIONS, ReferenceFrame, aggregate_crs, cell_means, crs_scores, normalise,
                                score_by_dataset)
from crsrepro.score.dimensions import ProfileTableError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def as_generator(rng) -> np.random.Generator:
    """``rng`` as a numpy Generator: an int seeds a new one, a Generator is used as is.

    Every bootstrap and every random draw of the analyses takes its ``rng`` argument through here.

    Raises
    ------
    ValueError
        ``rng`` is neither an int nor a Generator (a bool is refused).
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be an int or a numpy Generator, got {rng!r}")


def _check_n_resamples(n_resamples):
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")


def check_level(level):
    """Raise ValueError unless ``level``, the coverage of an interval, lies strictly between 0 and 1."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")


# --------------------------------------------------------------------------- rank agreement

@dataclass(frozen=True)
class RankAgreement:
    """How two rankings of the same encoders agree (DESIGN.md section 10).

    Attributes
    ----------
    kendall_tau : float
        Kendall tau-b (ties corrected).
    spearman_rho : float
        Pearson correlation of the average ranks.
    reversed_pairs : int
        Pairs ordered strictly one way by ``a`` and strictly the other way by ``b``.
    n_pairs : int
        n (n - 1) / 2.
    mean_abs_rank_shift : float
        Mean over encoders of |rank in a - rank in b| (rank 1 = best, ties share the average rank).
    top3_overlap : float
        |top 3 of a  and  top 3 of b| / 3 (ties at the cut are broken by encoder id).
    ranks : DataFrame
        Indexed by encoder: ``score_a, score_b, rank_a, rank_b, shift`` (shift = rank_a - rank_b:
        positive means the encoder rises under ``b``), sorted by ``rank_b``.
    """

    kendall_tau: float
    spearman_rho: float
    reversed_pairs: int
    n_pairs: int
    mean_abs_rank_shift: float
    top3_overlap: float
    ranks: pd.DataFrame


def rank_correlations(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kendall tau-b, Spearman rho and the reversed pairs of the rankings ``x`` and ``y``, many at once.

    The core of :func:`rank_agreement`, vectorised: the last axis holds the n encoders' scores (the
    same encoders in the same order in both), and leading axes, broadcast between ``x`` and ``y``,
    hold rankings to compare (the multiverse compares every combination with the AUROC order).

    - Kendall tau-b: (concordant - discordant) / sqrt(pairs untied in x * pairs untied in y); NaN
      when either ranking ties every pair.
    - Spearman rho: the Pearson correlation of the average ranks, computed as
      ``numpy.corrcoef(rank_x, rank_y)[0, 1]`` computes it, to the last bit (the ranks' sums are
      exact, and the scaling and divisions come in numpy's order); NaN when either ranking is constant.
    - Reversed pairs: the pairs ordered strictly one way by ``x`` and strictly the other way by ``y``.

    Parameters
    ----------
    x, y : arrays of shape (..., n)
        Finite scores (the direction does not matter as long as both share it).

    Returns
    -------
    kendall_tau, spearman_rho : float arrays of the broadcast leading shape
    reversed_pairs : int array of the broadcast leading shape

    Examples
    --------
    >>> tau, rho, reversed_pairs = rank_correlations(np.array([3, 2, 1]), np.array([[3, 1, 2], [1, 2, 3]]))
    >>> tau.round(3).tolist(), rho.tolist(), reversed_pairs.tolist()
    ([0.333, -1.0], [0.5, -1.0], [1, 3])
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = x.shape[-1]
    i, j = np.triu_indices(n, k=1)
    sx, sy = np.sign(x[..., i] - x[..., j]), np.sign(y[..., i] - y[..., j])
    concordant, discordant = (sx * sy > 0).sum(-1), (sx * sy < 0).sum(-1)
    untied = np.sqrt((sx != 0).sum(-1) * (sy != 0).sum(-1))
    tau = np.divide(concordant - discordant, untied, out=np.full(untied.shape, np.nan), where=untied > 0)
    rank_x, rank_y = rankdata(x, axis=-1), rankdata(y, axis=-1)
    dx, dy = rank_x - rank_x.mean(-1, keepdims=True), rank_y - rank_y.mean(-1, keepdims=True)
    scale = 1.0 / (n - 1)  # numpy.cov's normalisation: with it, rho is numpy.corrcoef's to the last bit
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (dx * dy).sum(-1) * scale / np.sqrt((dx ** 2).sum(-1) * scale) / np.sqrt((dy ** 2).sum(-1) * scale)
    return tau, np.clip(rho, -1.0, 1.0), discordant


def rank_agreement(a: Mapping[str, float], b: Mapping[str, float]) -> RankAgreement:
    """Compare the rankings given by two ``{encoder: score}`` maps (higher is better).

    Parameters
    ----------
    a, b : mapping of encoder id to score
        The same encoders in both, at least two, finite scores.

    Returns
    -------
    RankAgreement

    Raises
    ------
    ValueError
        The encoders differ, there are fewer than two, or a score is not finite.

    Examples
    --------
    >>> r = rank_agreement({"x": 3, "y": 2, "z": 1}, {"x": 3, "y": 1, "z": 2})
    >>> r.reversed_pairs, r.n_pairs, round(r.kendall_tau, 3), r.mean_abs_rank_shift
    (1, 3, 0.333, 0.6666666666666666)
    """
    if set(a) != set(b):
        raise ValueError(f"rank_agreement needs the same encoders in both maps; only in a: "
                         f"{sorted(set(a) - set(b))}, only in b: {sorted(set(b) - set(a))}")
    encoders = sorted(a)
    if len(encoders) < 2:
        raise ValueError("rank_agreement needs at least two encoders")
    x = np.array([a[e] for e in encoders], float)
    y = np.array([b[e] for e in encoders], float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("rank_agreement: every score must be a finite number")
    tau, rho, reversed_pairs = rank_correlations(x, y)
    rank_x, rank_y = rankdata(-x), rankdata(-y)
    top = lambda s: set(sorted(encoders, key=lambda e: (-s[e], e))[:3])  # noqa: E731
    ranks = pd.DataFrame({"score_a": x, "score_b": y, "rank_a": rank_x, "rank_b": rank_y,
                          "shift": rank_x - rank_y}, index=pd.Index(encoders, name="encoder"))
    return RankAgreement(kendall_tau=float(tau), spearman_rho=float(rho), reversed_pairs=int(reversed_pairs),
                         n_pairs=len(encoders) * (len(encoders) - 1) // 2,
                         mean_abs_rank_shift=float(np.mean(np.abs(rank_x - rank_y))),
                         top3_overlap=len(top(a) & top(b)) / min(3, len(encoders)),
                         ranks=ranks.sort_values(["rank_b", "rank_a"], kind="stable"))


# --------------------------------------------------------------------------- bootstrap results

INTERVAL_METHODS = ("percentile", "basic")


def bootstrap_interval(estimate, replicates, level: float = 0.95, *, method: str = "percentile",
                       floor: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The book's bootstrap interval (DESIGN.md section 10): an interval that always holds its estimate.

    With the plug-in estimate ``t`` and the replicates' quantiles ``q_lo, q_med, q_hi`` (at
    ``(1 - level) / 2``, 0.5 and ``(1 + level) / 2``):

    - ``method="percentile"`` (every statistic but the ECE): the estimate is the plug-in ``t`` and the
      interval the percentile interval of the replicates *centred on it*,
      ``[t + q_lo - q_med, t + q_hi - q_med]`` **[ours]**. It keeps the replicates' shape (a
      lopsided or two-humped spread, as a paired CRS difference has when the Pareto term flips) and
      equals the plain percentile interval when the replicates' median is the plug-in; when resampling
      shifts them (a resample of the test cases lowers every encoder's calibration a little, and with
      it the CRS), the shift is not mistaken for uncertainty about ``t``.
    - ``method="basic"`` (the ECE and ECE gaps, which resampling inflates: a binned ECE on a resample
      with duplicated cases sits above the plug-in in most replicates): the estimate is the
      bias-corrected ``2 t - q_med`` and the interval the basic (reverse-percentile) interval
      ``[2 t - q_hi, 2 t - q_lo]`` (Davison & Hinkley 1997, section 5.2), a debiased ECE with its
      interval **[ours: the median, not the mean, estimates the bias, so the estimate always lies in
      its interval]**.

    Both intervals contain their estimate by construction (``q_lo <= q_med <= q_hi``). A statistic that
    cannot fall below ``floor`` (an ECE value, not an ECE change: ``floor=0``) has its estimate and bounds
    raised to it, which keeps the estimate inside: the bias correction of a small, well-calibrated ECE can
    otherwise print a negative one.

    Parameters
    ----------
    estimate : float or array (...)
        The plug-in estimate(s) ``t``.
    replicates : array (B, ...)
        One bootstrap replicate per row, one column per estimate; NaN replicates (an AUROC with one
        class in the resample) are left out.
    level : float, default 0.95
    method : {"percentile", "basic"}, default "percentile"
    floor : float or None, default None
        The statistic's smallest possible value (0 for an ECE); None: no floor.

    Returns
    -------
    estimate, ci_low, ci_high : arrays of the shape of ``estimate``

    Examples
    --------
    >>> reps = np.array([0.12, 0.13, 0.14, 0.15, 0.16])
    >>> [round(float(v), 3) for v in bootstrap_interval(0.10, reps, level=0.5)]
    [0.1, 0.09, 0.11]
    >>> [round(float(v), 3) for v in bootstrap_interval(0.10, reps, level=0.5, method="basic")]
    [0.06, 0.05, 0.07]
    >>> [round(float(v), 3) for v in bootstrap_interval(0.01, reps, level=0.5, method="basic", floor=0)]
    [0.0, 0.0, 0.0]
    """
    check_level(level)
    if method not in INTERVAL_METHODS:
        raise ValueError(f"method must be one of {', '.join(INTERVAL_METHODS)}, got {method!r}")
    t = np.asarray(estimate, float)
    reps = np.asarray(replicates, float).reshape(-1, *t.shape)
    q_lo, q_med, q_hi = np.nanquantile(reps, [(1 - level) / 2, 0.5, (1 + level) / 2], axis=0)
    if method == "basic":
        out = 2 * t - q_med, 2 * t - q_hi, 2 * t - q_lo
    else:
        out = t, t + q_lo - q_med, t + q_hi - q_med
    return out if floor is None else tuple(np.maximum(part, floor) for part in out)


def interval_table(estimate: pd.Series, replicates: pd.DataFrame, level: float = 0.95, *,
                   method: str = "percentile", floor: float | None = None) -> pd.DataFrame:
    """By index of ``estimate``: ``estimate, ci_low, ci_high`` (:func:`bootstrap_interval`) and the
    ``plug_in`` (the same as ``estimate`` unless ``method="basic"``); ``replicates`` has one column per
    index entry."""
    columns = estimate.index
    est, low, high = bootstrap_interval(estimate.to_numpy(float), replicates[columns].to_numpy(float), level,
                                        method=method, floor=floor)
    return pd.DataFrame({"estimate": est, "ci_low": low, "ci_high": high, "plug_in": estimate.to_numpy(float)},
                        index=columns)


@dataclass(frozen=True)
class PairedDifference:
    """A paired difference ``a - b`` with its bootstrap interval (:func:`bootstrap_interval`)."""

    a: str
    b: str
    estimate: float
    ci_low: float
    ci_high: float
    level: float
    n_resamples: int
    plug_in: float


@dataclass(frozen=True)
class BootstrapReplicates:
    """Per-encoder estimates and their bootstrap replicates (paired: one resample per row).

    Attributes
    ----------
    estimate : Series
        The statistic on the full sample, by encoder (the plug-in).
    replicates : DataFrame
        One row per replicate, one column per encoder; row r of every column used the same resample.
    """

    estimate: pd.Series
    replicates: pd.DataFrame

    @property
    def n_resamples(self) -> int:
        return len(self.replicates)

    def paired_diff_ci(self, a: str, b: str, level: float = 0.95) -> PairedDifference:
        """The paired difference ``a - b`` and its interval (:func:`bootstrap_interval`) over the replicates.

        Replicates where either value is NaN (e.g. an AUROC with one class in the resample) are
        left out of the interval.
        """
        for e in (a, b):
            if e not in self.replicates.columns:
                raise ValueError(f"no encoder {e!r} in the bootstrap (has {', '.join(self.replicates.columns)})")
        plug_in = float(self.estimate[a] - self.estimate[b])
        diff = (self.replicates[a] - self.replicates[b]).dropna().to_numpy()
        est, low, high = bootstrap_interval(plug_in, diff, level)
        return PairedDifference(a=a, b=b, estimate=float(est), ci_low=float(low), ci_high=float(high), level=level,
                                n_resamples=self.n_resamples, plug_in=plug_in)

    def interval(self, level: float = 0.95, *, method: str = "percentile", floor: float | None = None) -> pd.DataFrame:
        """By encoder: ``estimate, ci_low, ci_high, plug_in`` (:func:`interval_table`)."""
        return interval_table(self.estimate, self.replicates, level, method=method, floor=floor)


@dataclass(frozen=True)
class SeedBootstrapResult(BootstrapReplicates):
    """The seed-paired bootstrap of aggregate CRS (DESIGN.md section 10).

    Attributes
    ----------
    estimate : Series
        Each encoder's aggregate CRS on the seed-averaged profiles (:func:`crsrepro.score.crs.aggregate_crs`).
    replicates : DataFrame
        Aggregate CRS per replicate (rows) and encoder (columns).
    rank_probabilities : DataFrame
        P(rank = r) per encoder (rows) and rank r = 1..n (columns); rows and columns sum to 1.
        Ties within a replicate are broken by encoder id **[ours]** (with continuous scores they
        do not occur unless two profiles are identical).
    """

    rank_probabilities: pd.DataFrame

    @property
    def p_rank1(self) -> pd.Series:
        """P(rank 1) by encoder; sums to 1."""
        return self.rank_probabilities[1].rename("p_rank1")

    @property
    def p_top3(self) -> pd.Series:
        """P(rank <= 3) by encoder; sums to min(3, number of encoders)."""
        return self.rank_probabilities.loc[:, :3].sum(axis=1).rename("p_top3")


# --------------------------------------------------------------------------- seed-paired bootstrap

def per_seed_array(per_seed_profiles: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """A per-seed reliability-profiles table as arrays, for the seed bootstraps.

    Returns
    -------
    cells : DataFrame
        Columns ``encoder, dataset``, one row per cell, sorted.
    seeds : array
        The seeds, sorted.
    values : array of shape (cells, seeds, 4)
        The raw profiles, last axis in :data:`crsrepro.score.crs.DIMENSIONS` order.

    Raises
    ------
    ProfileTableError
        No ``seed`` column, a bad table (:func:`crsrepro.score.crs.cell_means`), or a cell that lacks a
        seed: every cell needs every seed, as one draw of the seeds is shared by all encoders.
    """
    if "seed" not in per_seed_profiles.columns:
        raise ProfileTableError("per-seed profiles: missing column seed (the seed-paired bootstrap resamples seeds)")
    cell_means(per_seed_profiles, where="per-seed profiles")  # validates columns, values and duplicates
    seeds = np.sort(per_seed_profiles["seed"].unique())
    wide = per_seed_profiles.pivot(index=["encoder", "dataset"], columns="seed", values=list(DIMENSIONS))
    wide = wide.sort_index()
    if wide.isna().any().any():
        encoder, dataset = wide.index[wide.isna().any(axis=1)][0]
        have = sorted(per_seed_profiles.loc[(per_seed_profiles["encoder"] == encoder)
                                            & (per_seed_profiles["dataset"] == dataset), "seed"])
        raise ProfileTableError(f"per-seed profiles: cell (encoder {encoder}, dataset {dataset}) has seeds {have}, "
                                f"expected every seed {seeds.tolist()} (the draw is shared by all encoders)")
    values = np.stack([wide[d].to_numpy(float) for d in DIMENSIONS], axis=-1)  # (cells, seeds, 4)
    return wide.index.to_frame(index=False), seeds, values


SEED_VARYING = ("auroc", "ece", "robustness")
"""The dimensions a run seed must move for the seed bootstrap to mean what the paper says (DESIGN.md section 10):
D, C and R. Retention moves with the label-subset draw alone."""


def seed_variance(per_seed_profiles: pd.DataFrame) -> pd.DataFrame:
    """The spread over seeds of every dimension, per cell.

    Parameters
    ----------
    per_seed_profiles : DataFrame
        A reliability-profiles table with a ``seed`` column.

    Returns
    -------
    DataFrame
        One row per (encoder, dataset): ``n_seeds`` and ``sd_auroc, sd_ece, sd_retention,
        sd_robustness``, the sample SD over seeds (ddof 1; NaN with one seed).
    """
    if "seed" not in per_seed_profiles.columns:
        raise ProfileTableError("per-seed profiles: missing column seed (the seed variance is a spread over seeds)")
    cell_means(per_seed_profiles, where="per-seed profiles")  # validates columns, values and duplicates
    grouped = per_seed_profiles.groupby(["encoder", "dataset"], sort=True)
    sd = grouped[list(DIMENSIONS)].std(ddof=1).add_prefix("sd_")
    return grouped.size().rename("n_seeds").to_frame().join(sd).reset_index()


def has_seed_variance(per_seed_profiles: pd.DataFrame, *, atol: float = 1e-12) -> bool:
    """Whether the SD over seeds of D, C and R (:data:`SEED_VARYING`) exceeds ``atol`` in every cell.

    The claims page marks the seed-bootstrap claims comparable with the paper only when this holds:
    a bootstrap over seeds that change no D, C or R gives P(rank 1) of 0 or 1 and near-empty intervals.

    Parameters
    ----------
    per_seed_profiles : DataFrame
        A reliability-profiles table with a ``seed`` column.
    atol : float, default 1e-12 **[ours]**
        An SD at or below this counts as zero (identical runs differ by rounding only).
    """
    table = seed_variance(per_seed_profiles)
    flat = ~(table[[f"sd_{d}" for d in SEED_VARYING]] > atol).all(axis=1)  # NaN (one seed) counts as flat
    if flat.any():
        first = table[flat].iloc[0]
        logger.info("%d of %d cells have no seed variance in D, C or R (first: encoder %s, dataset %s)",
                    int(flat.sum()), len(table), first["encoder"], first["dataset"])
    return not flat.any()


def seed_weights(generator: np.random.Generator, n_resamples: int, n_seeds: int) -> np.ndarray:
    """(n_resamples, n_seeds) weights: how often each seed was drawn (with replacement) / n_seeds.

    One draw of ``n_seeds`` seeds per replicate; the seed-paired and the two-level bootstraps and the
    multiverse draw seeds with this function, so the same ``rng`` gives them all the same seed draws.
    """
    draws = generator.integers(0, n_seeds, size=(n_resamples, n_seeds))
    weights = np.zeros((n_resamples, n_seeds))
    np.add.at(weights, (np.arange(n_resamples)[:, None], draws), 1.0 / n_seeds)
    return weights


def seed_paired_bootstrap(per_seed_profiles: pd.DataFrame, frame: ReferenceFrame, *, n_resamples: int = 10000,
                          rng=0, peers: str = "resampled") -> SeedBootstrapResult:
    """The paper's seed-paired bootstrap of aggregate CRS ranks (DESIGN.md section 10).

    Each replicate draws S seeds with replacement from the S seeds (one draw shared by every cell),
    averages each cell's per-seed reliability profiles with those multiplicities, normalises them
    with the frame's anchors, scores every cell against the *same replicate's* profiles of its peers
    (:func:`crsrepro.score.crs.score_by_dataset`, the code of :func:`crsrepro.score.crs.crs_scores`, with the
    frame's weights), averages each encoder's cells and ranks the encoders. All replicates are
    computed at once as arrays.

    What each number estimates:

    - ``estimate`` is the published point estimate: each encoder's aggregate CRS of its seed-mean
      profiles against the frozen frame (:func:`crsrepro.score.crs.crs_scores`, what the book and the
      claims page print). When the frame was frozen from these same profiles it is also the
      replicate of the identity draw (every seed once).
    - ``replicates`` (``peers="resampled"``, the default) are the aggregate CRS the panel would have
      published had its seeds been the drawn ones: the frame's anchors and weights, with the panel
      re-run together. Their spread is the seed-to-seed variability of the published scores, and a
      seed effect shared by every encoder (an easy split) cancels in the Pareto term of a paired
      difference, as the pairing intends. The frozen frame stays the reference for newcomers
      (:func:`crsrepro.score.crs.score_encoder`) and for ``estimate``.
    - ``peers="frozen"`` scores each replicate against the frame's frozen peer profiles instead:
      the spread of an encoder's score against a fixed panel when only its own seeds vary. It breaks
      the pairing of the Pareto term and is offered for comparison only (DESIGN.md section 10).

    Parameters
    ----------
    per_seed_profiles : DataFrame
        A reliability-profiles table with a ``seed`` column; every cell must have every seed.
    frame : ReferenceFrame
        The frozen frame (fixed mode). A reference encoder without rows in ``per_seed_profiles``
        keeps its frozen profile as a peer in every replicate (logged).
    n_resamples : int, default 10000
        The paper's count.
    rng : int or numpy Generator, default 0
    peers : {"resampled", "frozen"}, default "resampled"
        Whose profiles a replicate is compared with (see above; the paper: resampled, DESIGN.md 10).

    Returns
    -------
    SeedBootstrapResult
        ``p_rank1``, ``p_top3``, ``rank_probabilities``, ``replicates`` and ``paired_diff_ci(a, b)``.
    """
    _check_n_resamples(n_resamples)
    if peers not in ("resampled", "frozen"):
        raise ValueError(f"peers must be one of resampled, frozen, got {peers!r}")
    cells, seeds, values = per_seed_array(per_seed_profiles)
    weights = seed_weights(as_generator(rng), n_resamples, len(seeds))
    raw = np.einsum("bs,csk->bck", weights, values)  # (replicates, cells, 4)
    replicates, rank_probabilities = rank_replicates(cells, raw, frame, peers=peers)
    estimate = aggregate_crs(crs_scores(per_seed_profiles, frame))["crs"].reindex(replicates.columns)
    return SeedBootstrapResult(estimate=estimate, replicates=replicates, rank_probabilities=rank_probabilities)


def rank_replicates(cells: pd.DataFrame, raw: np.ndarray, frame: ReferenceFrame, *,
                    peers: str = "resampled") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Aggregate CRS and rank probabilities of replicated raw profiles: the common end of both CRS bootstraps.

    ``raw`` (replicates, cells, 4) holds each replicate's seed-averaged raw profiles of the ``cells``
    (``encoder, dataset``); they are normalised with the frame's anchors, scored against the same
    replicate's peers (:func:`crsrepro.score.crs.score_by_dataset`) and averaged per encoder.

    Returns
    -------
    replicates : DataFrame
        Aggregate CRS, one row per replicate, one column per encoder (sorted).
    rank_probabilities : DataFrame
        P(rank = r) per encoder (rows) and rank (columns); ties broken by encoder id **[ours]**.
    """
    p = normalise(raw, frame.anchors)
    crs = score_by_dataset(cells, p, frame, peers=peers)["crs"]  # (replicates, cells)
    encoders = np.sort(cells["encoder"].unique())
    membership = (cells["encoder"].to_numpy()[None, :] == encoders[:, None]).astype(float)
    aggregate = (membership / membership.sum(1, keepdims=True)) @ crs.T  # (encoders, replicates)
    order = np.argsort(-aggregate, axis=0, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, len(encoders) + 1)[:, None], axis=0)
    rank_probabilities = pd.DataFrame((ranks[:, :, None] == np.arange(1, len(encoders) + 1)).mean(axis=1),
                                      index=pd.Index(encoders, name="encoder"),
                                      columns=pd.RangeIndex(1, len(encoders) + 1, name="rank"))
    return pd.DataFrame(aggregate.T, columns=encoders), rank_probabilities


# --------------------------------------------------------------------------- case-level bootstrap

def _weighted_aurocs(y: torch.Tensor, score: torch.Tensor, counts: torch.Tensor,
                     max_elements: int = 20_000_000) -> torch.Tensor:
    """The AUROC of many binary score columns for each row of ``counts`` (case multiplicities).

    ``y`` (L, N) holds 0/1 targets with NaN for masked entries, ``score`` (G, N) the scores, G a multiple
    of L, column g scored against the targets ``y[g mod L]`` (so seeds and conditions can be stacked over
    one label matrix); ``counts`` (B, N) one replicate per row; returns (G, B). Per column, cases are sorted once
    by score and grouped into ties; a replicate's AUROC is sum_g P_g (N_<g + N_g / 2) / (P N), with P_g
    and N_g its positive and negative weight in tie group g. A column with no positive or no negative
    weight is NaN. Columns are processed in chunks of at most ``max_elements`` (columns x B x N).
    """
    import torch

    n_columns, n_cases = score.shape
    out = torch.empty(n_columns, counts.shape[0], dtype=torch.float64, device=score.device)
    step = max(1, max_elements // max(1, counts.shape[0] * n_cases))
    counts_t = counts.T.contiguous()  # (N, B): a column's cases in its sorted order are rows of it
    for start in range(0, n_columns, step):
        sc = score[start:start + step].double()
        tg = y[torch.arange(start, start + len(sc), device=y.device) % y.shape[0]]
        order = torch.argsort(sc, dim=1)
        s, t = torch.gather(sc, 1, order), torch.gather(tg, 1, order)
        c = counts_t[order]  # (g, N, B), contiguous over the replicates
        pos = c * torch.nan_to_num(t, nan=0.0).to(c.dtype)[:, :, None]
        neg = c * torch.nan_to_num(1 - t, nan=0.0).to(c.dtype)[:, :, None]
        neg_through = torch.cumsum(neg, 1)  # negative weight at or below each position
        if bool((s[:, 1:] != s[:, :-1]).all()):  # no ties: a case's tie group is itself
            credit = neg_through - neg / 2
        else:  # N_<g and N_g of each case's tie group g, read at the group's first and last position
            position = torch.arange(n_cases, device=s.device).expand_as(s)
            new_group = torch.cat([torch.ones_like(s[:, :1], dtype=torch.bool), s[:, 1:] != s[:, :-1]], 1)
            first = torch.cummax(torch.where(new_group, position, 0), 1).values
            last_of_next = torch.cat([new_group[:, 1:], torch.ones_like(s[:, :1], dtype=torch.bool)], 1)
            last = torch.flip(torch.cummin(torch.flip(torch.where(last_of_next, position, n_cases - 1), [1]), 1).values,
                              [1])
            expand = (-1, -1, c.shape[2])
            below = torch.gather(neg_through - neg, 1, first[:, :, None].expand(*expand))
            tied = torch.gather(neg_through, 1, last[:, :, None].expand(*expand)) - below
            credit = below + tied / 2
        total = pos.sum(1) * neg.sum(1)
        out[start:start + step] = ((pos * credit).sum(1, dtype=torch.float64)
                                   / torch.where(total > 0, total, torch.nan).double())
    return out


def weighted_macro_auroc(y: torch.Tensor, score: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Macro AUROC for each row of ``counts`` (case multiplicities), one-vs-rest columns.

    ``y`` (N, L) holds 0/1 with NaN for masked entries, ``score`` (N, L), ``counts`` (B, N); the
    columns' AUROCs are :func:`_weighted_aurocs`. A column with no positive or no negative weight is
    NaN and left out of the mean (as :func:`crsrepro.core.metrics.macro_auroc` skips it).
    """
    import torch

    return torch.nanmean(_weighted_aurocs(y.T, score.T, counts), 0)


def _case_counts(generator: np.random.Generator, n_replicates: int, n_cases: int) -> np.ndarray:
    """(n_replicates, n_cases) multiplicities of N test cases drawn with replacement, one draw per row.

    The case-level and the two-level bootstraps draw cases with this function, batch by batch.
    """
    draws = generator.integers(0, n_cases, size=(n_replicates, n_cases))
    counts = np.bincount((draws + n_cases * np.arange(n_replicates)[:, None]).ravel(),
                         minlength=n_replicates * n_cases)
    return counts.reshape(n_replicates, n_cases)


def case_paired_bootstrap(y_true: np.ndarray, scores: Mapping[str, np.ndarray], *, task: str,
                          n_resamples: int = 1000, rng=0, device: str = "cpu", batch_size: int = 250,
                          progress: bool = True) -> BootstrapReplicates:
    """Case-level paired bootstrap of macro AUROC over test images (beyond the paper, DESIGN.md 10).

    Every replicate draws N test cases with replacement; the same draw is used for every encoder, so
    differences between encoders are paired. Replicates are computed in batches as tensors on
    ``device`` (a GPU when given; the CPU otherwise). The draws come from numpy, so a seed gives the
    same replicates on any device.

    Parameters
    ----------
    y_true : array
        Class ids (N,) for ``task="multiclass"``; 0/1/NaN (N, L) for ``"multilabel"`` (see
        :mod:`crsrepro.core.metrics`).
    scores : mapping of encoder id to array of shape (N, K)
        Each encoder's scores on the same N test cases, in the same order.
    task : {"multiclass", "multilabel"}
    n_resamples : int, default 1000 **[ours]**
    rng : int or numpy Generator, default 0
    device : str, default "cpu"
        A torch device, e.g. ``"cuda"``.
    batch_size : int, default 250 **[ours]**
        Replicates per batch: bounds memory at about ``batch_size x N x 8`` bytes per tensor.
    progress : bool, default True
        Show a progress bar over batches.

    Returns
    -------
    BootstrapReplicates
        ``estimate`` is :func:`crsrepro.core.metrics.macro_auroc` on the full test set.
    """
    import torch

    _check_n_resamples(n_resamples)
    if not scores:
        raise ValueError("scores must map at least one encoder id to its scores")
    encoders = sorted(scores)
    estimate = pd.Series({e: macro_auroc(y_true, scores[e], task=task) for e in encoders})  # validates shapes
    n_cases = len(y_true)
    if task == "multiclass":
        k = np.asarray(scores[encoders[0]]).shape[1]
        y = np.eye(k)[np.asarray(y_true, int)]
    else:
        y = np.asarray(y_true, float)
    dev = torch.device(device)
    y_t = torch.as_tensor(y, dtype=torch.float64, device=dev)
    score_t = {e: torch.as_tensor(np.asarray(scores[e], float), device=dev) for e in encoders}
    generator = as_generator(rng)
    out = np.empty((n_resamples, len(encoders)))
    starts = range(0, n_resamples, batch_size)
    for start in tqdm(starts, desc="case bootstrap", disable=not progress):
        b = min(batch_size, n_resamples - start)
        counts_t = torch.as_tensor(_case_counts(generator, b, n_cases), dtype=torch.float64, device=dev)
        for j, e in enumerate(encoders):
            out[start:start + b, j] = weighted_macro_auroc(y_t, score_t[e], counts_t).cpu().numpy()
    return BootstrapReplicates(estimate=estimate, replicates=pd.DataFrame(out, columns=encoders))


# --------------------------------------------------------------------------- two-level bootstrap

def weighted_ece(y: torch.Tensor, prob: torch.Tensor, counts: torch.Tensor, *, task: str,
                  n_bins: int) -> torch.Tensor:
    """ECE for each row of ``counts`` (case multiplicities), as :func:`crsrepro.core.metrics.expected_calibration_error`.

    Multi-class: ``y`` (N,) class ids, top-label confidence ``max_k p_k`` and correctness ``argmax == y``.
    Multi-label: ``y`` (N, L) 0/1 with NaN masked, per label ``conf = max(p, 1 - p)`` and correctness
    ``(p > 0.5) == y``, then the mean over the labels that keep an unmasked case in the resample. Bins
    are ``(m-1)/M < conf <= m/M``; a case counted c times weighs c, so a bin's ``|acc - conf| * n_m / N``
    is ``|sum_i c_i (correct_i - conf_i)| / sum_i c_i`` over its cases.
    """
    import torch

    edges = torch.arange(n_bins + 1, dtype=torch.float64, device=prob.device) / n_bins

    def binned_error(conf, correct, weights):  # weights (B, N) -> (B,)
        index = torch.clamp(torch.searchsorted(edges, conf) - 1, 0, n_bins - 1)
        gaps = torch.zeros(weights.shape[0], n_bins, dtype=weights.dtype, device=weights.device).index_add_(
            1, index, weights * (correct - conf))
        total = weights.sum(1)
        return gaps.abs().sum(1) / torch.where(total > 0, total, torch.nan)

    if task == "multiclass":
        conf, predicted = prob.max(1)
        return binned_error(conf, (predicted == y).double(), counts)
    per_label = []
    for k in range(y.shape[1]):
        seen = ~torch.isnan(y[:, k])
        p = prob[:, k]
        correct = ((p > 0.5) == (y[:, k] == 1)).double()
        per_label.append(binned_error(torch.maximum(p, 1 - p), correct, counts * seen))
    return torch.nanmean(torch.stack(per_label, 1), 1)


@dataclass(frozen=True)
class TwoLevelBootstrapResult:
    """The two-level (seeds x test cases) paired bootstrap of D and C (beyond the paper, DESIGN.md 10).

    Attributes
    ----------
    auroc, ece : BootstrapReplicates
        By encoder, the point estimate (the mean over seeds of the per-seed macro AUROC / ECE on the
        whole test set: the D and C of the reliability profile) and one replicate per row; row r of
        every encoder used the same seed draw and the same case draw, so differences are paired.
    n_seeds, n_cases : int
    resample_cases : bool
        False when only seeds were resampled (the seed-only bootstrap of D and C).
    """

    auroc: BootstrapReplicates
    ece: BootstrapReplicates
    n_seeds: int
    n_cases: int
    resample_cases: bool

    def summary(self, level: float = 0.95) -> pd.DataFrame:
        """By encoder: ``auroc, auroc_ci_low, auroc_ci_high, auroc_plug_in`` and the same for ``ece`` (:func:`bootstrap_interval`)."""
        parts = [self.auroc.interval(level).add_prefix("auroc_"),
                 self.ece.interval(level, method="basic", floor=0.0).add_prefix("ece_")]
        out = pd.concat(parts, axis=1).rename(columns={"auroc_estimate": "auroc", "ece_estimate": "ece"})
        out.index.name = "encoder"
        return out


def two_level_bootstrap(y_true: np.ndarray, probs: Mapping[str, np.ndarray], *, task: str, n_resamples: int = 1000,
                        rng=0, device: str = "cpu", resample_cases: bool = True, n_bins: int = 15,
                        batch_size: int = 250, progress: bool = False) -> TwoLevelBootstrapResult:
    """Paired bootstrap over seeds *and* test cases of the macro AUROC and the ECE (beyond the paper).

    Each replicate draws S seeds with replacement (the draw of :func:`seed_paired_bootstrap` with
    the same ``rng``) and N test cases with replacement (as :func:`case_paired_bootstrap` draws
    them), one draw shared by every encoder. For each drawn seed the metric is computed on the drawn
    cases from that seed's probabilities, and the replicate is the mean over the drawn seeds (with
    their multiplicities), just as a reliability profile's D and C are means over seeds of per-seed
    metrics **[ours: not the metric of seed-averaged probabilities]**. The intervals therefore
    include the test-set sampling noise that the seed-only bootstrap leaves out. AUROC is
    :func:`crsrepro.core.metrics.macro_auroc` and ECE :func:`crsrepro.core.metrics.expected_calibration_error`
    (15 bins, top-label; macro of the binary top-label ECE for multi-label), computed with case
    weights in torch on ``device``; the draws come from numpy, so a seed gives the same replicates
    on any device.

    Parameters
    ----------
    y_true : array
        Class ids (N,) for ``task="multiclass"``; 0/1/NaN (N, L) for ``"multilabel"``.
    probs : mapping of encoder id to array of shape (S, N, K)
        Each encoder's per-case test probabilities of the full-label probe, one slice per run seed:
        the same S seeds in the same order and the same N cases in the same order for every encoder.
        Any float dtype is accepted; values are computed in float64.
    task : {"multiclass", "multilabel"}
    n_resamples : int, default 1000 **[ours]**
    rng : int or numpy Generator, default 0
    device : str, default "cpu"
        A torch device, e.g. ``"cuda"``; the same code runs on either.
    resample_cases : bool, default True
        False keeps every case once: the seed-only bootstrap of D and C. With one seed there is
        nothing to draw for seeds, and the replicates are those of :func:`case_paired_bootstrap`.
    n_bins : int, default 15
        ECE bins (the paper's 15).
    batch_size : int, default 250 **[ours]**
        Replicates per batch: bounds memory at about ``batch_size x N x 8`` bytes per tensor.
    progress : bool, default False
        Show a progress bar over batches.

    Returns
    -------
    TwoLevelBootstrapResult
        ``auroc`` and ``ece`` (estimate and replicates by encoder) and ``summary(level)``.

    Raises
    ------
    ValueError
        No encoder, an array that is not (S, N, K) with N = len(y_true), encoders with different
        shapes, or (from :mod:`crsrepro.core.metrics`) labels or probabilities out of range.
    """
    import torch

    _check_n_resamples(n_resamples)
    if not probs:
        raise ValueError("probs must map at least one encoder id to its (seeds, cases, classes) probabilities")
    encoders = sorted(probs)
    arrays = {e: np.asarray(probs[e]) for e in encoders}
    shape = arrays[encoders[0]].shape
    for e in encoders:
        if arrays[e].ndim != 3 or arrays[e].shape[1] != len(y_true):
            raise ValueError(f"probs[{e!r}] has shape {arrays[e].shape}, expected (seeds, {len(y_true)} cases, "
                             f"classes or labels)")
        if arrays[e].shape != shape:
            raise ValueError(f"probs[{e!r}] has shape {arrays[e].shape}, probs[{encoders[0]!r}] has {shape}: every "
                             f"encoder needs the same seeds and cases")
    n_seeds, n_cases = shape[0], shape[1]
    auroc = {e: np.mean([macro_auroc(y_true, a, task=task) for a in arrays[e]]) for e in encoders}
    ece = {e: np.mean([expected_calibration_error(y_true, a, task=task, n_bins=n_bins) for a in arrays[e]])
           for e in encoders}  # the point estimates; they also validate labels, shapes and probabilities
    generator = as_generator(rng)
    seed_draws = (seed_weights(generator, n_resamples, n_seeds) if n_seeds > 1
                  else np.ones((n_resamples, 1)))  # one seed: nothing to draw
    dev = torch.device(device)
    y, y_auroc = _one_hot(y_true, task, shape[2], dev)  # class ids for the ECE, one-vs-rest columns for the AUROC
    stored = {e: torch.as_tensor(arrays[e], device=dev) for e in encoders}  # kept in their (compact) dtype
    out = {m: np.empty((n_resamples, len(encoders))) for m in ("auroc", "ece")}
    for start in tqdm(range(0, n_resamples, batch_size), desc="two-level bootstrap", disable=not progress):
        b = min(batch_size, n_resamples - start)
        counts = (_case_counts(generator, b, n_cases) if resample_cases else np.ones((b, n_cases)))
        counts_t = torch.as_tensor(counts, dtype=torch.float64, device=dev)
        w = torch.as_tensor(seed_draws[start:start + b], dtype=torch.float64, device=dev)  # (b, S)
        for j, e in enumerate(encoders):
            per_seed = {"auroc": [], "ece": []}
            for s in range(n_seeds):
                prob = stored[e][s].double()
                per_seed["auroc"].append(weighted_macro_auroc(y_auroc, prob, counts_t))
                per_seed["ece"].append(weighted_ece(y, prob, counts_t, task=task, n_bins=n_bins))
            for m in out:
                out[m][start:start + b, j] = (w * torch.stack(per_seed[m], 1)).sum(1).cpu().numpy()
    return TwoLevelBootstrapResult(
        auroc=BootstrapReplicates(estimate=pd.Series(auroc), replicates=pd.DataFrame(out["auroc"], columns=encoders)),
        ece=BootstrapReplicates(estimate=pd.Series(ece), replicates=pd.DataFrame(out["ece"], columns=encoders)),
        n_seeds=n_seeds, n_cases=n_cases, resample_cases=resample_cases)



# --------------------------------------------------------------------------- the CRS bootstrap over seeds and cases

@dataclass(frozen=True)
class DatasetCases:
    """One dataset's per-case test probabilities, the input of :func:`crs_bootstrap`.

    Every array is ``(seeds, cases, classes or labels)``, the same seeds in the same order for every
    encoder, and keyed by encoder id.

    Attributes
    ----------
    task : {"multiclass", "multilabel"}
    labels : array
        The test split's labels: class ids (N,) or 0/1/NaN (N, L).
    clean : dict
        The full-label probe on the clean test split (D, C, and the reference of R and L).
    perturbed : dict
        ``{condition: {encoder: array}}``: the full-label probe on each perturbed copy of the same N
        test cases (R).
    fractions : dict
        ``{label fraction < 1: {encoder: array}}``: the probe fitted on that fraction, on the clean
        test split (L).
    transfers : dict
        ``{transfer set: (labels (M, ...), {encoder: array (seeds, M, shared labels)})}``: the full-label
        probe scored without retraining on another hospital's cases (one more drop of R).
    """

    task: str
    labels: np.ndarray
    clean: dict
    perturbed: dict
    fractions: dict
    transfers: dict

    def take_seeds(self, index) -> "DatasetCases":
        """The same cases for the seeds at positions ``index`` of the seed axis."""
        def take(arrays: dict) -> dict:
            return {e: np.asarray(a)[index] for e, a in arrays.items()}

        return DatasetCases(task=self.task, labels=self.labels, clean=take(self.clean),
                            perturbed={c: take(a) for c, a in self.perturbed.items()},
                            fractions={f: take(a) for f, a in self.fractions.items()},
                            transfers={t: (labels, take(a)) for t, (labels, a) in self.transfers.items()})


@dataclass(frozen=True)
class CrsBootstrapResult(SeedBootstrapResult):
    """The two-level (seeds x test cases) bootstrap of the CRS (DESIGN.md section 10).

    Attributes
    ----------
    estimate, replicates, rank_probabilities
        As :class:`SeedBootstrapResult`: the published aggregate CRS, one replicate per row, P(rank).
    cells : DataFrame
        ``encoder, dataset``: the rows of the profile arrays.
    profiles : array (cells, 4)
        The seed-mean raw profiles (D, C, L, R in :data:`crsrepro.score.crs.DIMENSIONS` order) of the
        published table: the plug-in of every dimension's interval.
    profile_replicates : array (replicates, cells, 4)
        Each replicate's seed-mean raw profiles, recomputed from the per-case probabilities.
    resample_cases : bool
        False for the seed-only variant (every case once: the paper's bootstrap, from the same cases).
    """

    cells: pd.DataFrame
    profiles: np.ndarray
    profile_replicates: np.ndarray
    resample_cases: bool

    def summary(self, level: float = 0.95) -> pd.DataFrame:
        """One row per encoder, best estimate first: ``encoder, estimate, ci_low, ci_high, plug_in``
        (:func:`interval_table` of the aggregate CRS), ``p_rank1`` and ``p_top3``."""
        table = self.interval(level).join(self.p_rank1).join(self.p_top3)
        table.index.name = "encoder"
        return table.sort_values("plug_in", ascending=False).reset_index()

    def leader_difference(self, level: float = 0.95) -> PairedDifference:
        """The paired difference leader minus runner-up (by the published CRS) with its interval."""
        order = self.estimate.sort_values(ascending=False).index
        if len(order) < 2:
            raise ValueError("a leader-minus-runner-up difference needs at least two encoders")
        return self.paired_diff_ci(order[0], order[1], level)

    def dimension_intervals(self, level: float = 0.95) -> pd.DataFrame:
        """By (dataset, encoder): each raw dimension with ``<dim>_ci_low, <dim>_ci_high, <dim>_plug_in``
        (:func:`bootstrap_interval` of the seed-mean profiles; the ECE's ``basic``, so ``ece`` is the
        bias-corrected estimate) and ``<dim>_width``."""
        index = pd.MultiIndex.from_frame(self.cells[["dataset", "encoder"]])
        out = pd.DataFrame(index=index)
        for k, dim in enumerate(DIMENSIONS):
            est, low, high = bootstrap_interval(self.profiles[:, k], self.profile_replicates[:, :, k], level,
                                                method="basic" if dim == "ece" else "percentile",
                                                floor=0.0 if dim == "ece" else None)
            out[dim], out[f"{dim}_ci_low"], out[f"{dim}_ci_high"] = est, low, high
            out[f"{dim}_plug_in"], out[f"{dim}_width"] = self.profiles[:, k], high - low
        return out.sort_index()


def _where_finite(function, values: np.ndarray) -> np.ndarray:
    """``function`` of the last axis of ``values`` where that axis is finite, NaN elsewhere (a dimension
    of a replicate whose cases leave an AUROC undefined)."""
    finite = np.isfinite(values).all(axis=-1)
    out = np.asarray(function(np.where(np.isfinite(values), values, 0.5)), float)
    return np.where(finite, out, np.nan)


def _replicate_retention(fractions: list, curve: np.ndarray) -> np.ndarray:
    """Label-efficiency retention of each replicate's AUROC curve (last axis: the ``fractions``, then 1.0), NaN
    where the drawn cases leave it undefined: an AUROC that is not finite, or a full-label AUROC of 0 (every
    positive ranked below every negative, which a resample of a few cases can draw; the ratio has no meaning).

    Examples
    --------
    >>> _replicate_retention([0.1], np.array([[0.4, 0.8], [0.5, 0.0], [np.nan, 0.7]])).round(2).tolist()
    [0.5, nan, nan]
    """
    curve = np.where(curve[..., -1:] > 0, curve, np.nan)
    return _where_finite(lambda v: label_efficiency_retention(
        {**dict(zip(fractions, np.moveaxis(v[..., :-1], -1, 0))), 1.0: v[..., -1]}), curve)


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``: where the case bootstraps run by default."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_cases(dataset: str, cases: DatasetCases, encoders: list[str]) -> tuple[int, int]:
    """(seeds, cases) of one dataset's arrays, checked: every array is (S, N, K) for the same S and N."""
    n_cases = len(cases.labels)
    if not cases.perturbed:
        raise ValueError(f"{dataset}: no perturbed condition: robustness needs at least one")
    if not cases.fractions:
        raise ValueError(f"{dataset}: no smaller label fraction: retention needs at least one")
    groups = [("clean", cases.clean, n_cases)]
    groups += [(c, arrays, n_cases) for c, arrays in cases.perturbed.items()]
    groups += [(f"fraction {f:g}", arrays, n_cases) for f, arrays in cases.fractions.items()]
    groups += [(t, arrays, len(labels)) for t, (labels, arrays) in cases.transfers.items()]
    n_seeds = None
    for name, arrays, n in groups:
        missing = [e for e in encoders if e not in arrays]
        if missing:
            raise ValueError(f"{dataset}, {name}: no per-case probabilities for {', '.join(missing)}")
        for e in encoders:
            shape = np.shape(arrays[e])
            if len(shape) != 3 or shape[1] != n or (n_seeds is not None and shape[0] != n_seeds):
                raise ValueError(f"{dataset}, {name}, {e}: probabilities of shape {shape}, expected "
                                 f"({n_seeds or 'seeds'}, {n} cases, classes)")
            n_seeds = shape[0]
    return n_seeds, n_cases


def _one_hot(labels: np.ndarray, task: str, n_classes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels for the weighted ECE (class ids or 0/1/NaN) and for the weighted AUROC (one column per class)."""
    import torch

    y = torch.as_tensor(np.asarray(labels, float), dtype=torch.float64, device=device)
    if task == "multiclass":
        return y.long(), torch.nn.functional.one_hot(y.long(), n_classes).double()
    return y, y


def crs_bootstrap(cases: Mapping[str, DatasetCases], per_seed_profiles: pd.DataFrame, frame: ReferenceFrame, *,
                  n_resamples: int = 1000, rng=0, device: str | None = None, resample_cases: bool = True,
                  n_bins: int = 15, batch_size: int | None = None, progress: bool = False) -> CrsBootstrapResult:
    """The two-level bootstrap of the CRS: seeds *and* test cases in one shared draw (DESIGN.md section 10).

    Beyond the paper, whose bootstrap resamples only the seeds (:func:`seed_paired_bootstrap`), so
    that its P(rank 1) and CRS intervals are conditional on one test set. Each replicate draws

    - S seeds with replacement (the draw of :func:`seed_weights`, shared by every dataset and encoder,
      the same stream as :func:`seed_paired_bootstrap` with the same ``rng``), and
    - per dataset, N test cases with replacement, shared by every encoder, seed and perturbed
      condition (the perturbed conditions degrade the same images), and per transfer set its M cases.

    For every encoder, dataset and drawn seed it recomputes, on the drawn cases, the four dimensions
    from the per-case probabilities as :func:`crsrepro.score.dimensions.reliability_profiles` does from
    the whole test set: D (:func:`crsrepro.core.metrics.macro_auroc`) and C
    (:func:`crsrepro.core.metrics.expected_calibration_error`) on the clean cases, R
    (:func:`crsrepro.core.metrics.robustness_raw`) from the drops to every perturbed condition and
    transfer set, and L (:func:`crsrepro.core.metrics.label_efficiency_retention`) from the smaller
    fractions. The replicate's profile of a cell is the mean over the drawn seeds, and the replicates
    end as the seed bootstrap's do (:func:`rank_replicates`: the frame's anchors and weights, peers
    from the same replicate). Seeds and cases are crossed factors resampled independently, which is
    known to be mildly conservative (Owen 2007, the "pigeonhole" bootstrap).

    All replicates of a batch are tensors on ``device`` (a GPU when there is one, the CPU
    otherwise); the draws come from numpy, so a seed gives the same replicates on either.

    Parameters
    ----------
    cases : mapping of dataset to DatasetCases
    per_seed_profiles : DataFrame
        The run's per-seed reliability profiles (the published table): the point estimates. The
        profiles recomputed from the cases with every case and seed once must match them (checked,
        to 1e-4), so the cases cannot belong to another run.
    frame : ReferenceFrame
    n_resamples : int, default 1000 **[ours]**
    rng : int or numpy Generator, default 0
    device : str, optional
        A torch device; default :func:`default_device`.
    resample_cases : bool, default True
        False keeps every case once: the seed-only bootstrap, the paper's, from the same code.
    n_bins : int, default 15
    batch_size : int, optional
        Replicates per batch; default: as many as keep a batch's case counts near 4 million entries per
        dataset (the AUROC kernel chunks its columns to bound memory on its own).
    progress : bool, default False

    Returns
    -------
    CrsBootstrapResult
    """
    import torch

    _check_n_resamples(n_resamples)
    cells, seeds, values = per_seed_array(per_seed_profiles)
    datasets = sorted(cells["dataset"].unique())
    missing = [d for d in datasets if d not in cases]
    if missing:
        raise ValueError(f"no per-case probabilities for dataset(s) {', '.join(missing)}")
    encoders_of = {d: cells.loc[cells["dataset"] == d, "encoder"].tolist() for d in datasets}
    shapes = {d: _check_cases(d, cases[d], encoders_of[d]) for d in datasets}
    n_seeds = {s for s, _ in shapes.values()}
    if n_seeds != {len(seeds)}:
        raise ValueError(f"the per-case arrays hold {sorted(n_seeds)} seeds, the profiles {len(seeds)}")
    dev = torch.device(device or default_device())
    generator = as_generator(rng)
    seed_draws = seed_weights(generator, n_resamples, len(seeds))
    row_of = {(e, d): i for i, (e, d) in enumerate(zip(cells["encoder"], cells["dataset"]))}
    def stacked(arrays: list[np.ndarray]) -> torch.Tensor:  # n x (S, N, K) -> (n S K, N) float64 on the device
        a = np.stack(arrays).astype(np.float64)
        return torch.as_tensor(a.transpose(0, 1, 3, 2).reshape(-1, a.shape[2]), device=dev)

    inputs = {}  # per dataset: label tensors, and per encoder its stacked scores (moved to the device once)
    for d in datasets:
        c = cases[d]
        n_classes = np.shape(c.clean[encoders_of[d][0]])[2]
        y_ece, y_auroc = _one_hot(c.labels, c.task, n_classes, dev)
        same_cases = {e: [c.clean[e], *(a[e] for a in c.perturbed.values()), *(a[e] for a in c.fractions.values())]
                      for e in encoders_of[d]}
        inputs[d] = {"y_ece": y_ece, "y_auroc": y_auroc.T.contiguous(),
                     "clean": {e: torch.as_tensor(np.asarray(c.clean[e], float), device=dev) for e in encoders_of[d]},
                     "scores": {e: stacked(arrays) for e, arrays in same_cases.items()},
                     "transfers": {t: (_one_hot(labels, c.task, np.shape(next(iter(a.values())))[2], dev)[1].T.contiguous(),
                                       {e: stacked([a[e]]) for e in encoders_of[d]})
                                   for t, (labels, a) in c.transfers.items()}}

    def macro(aurocs: torch.Tensor, n_sets: int, n_labels: int) -> np.ndarray:  # (n S L, b) -> (n, S, b)
        return torch.nanmean(aurocs.view(n_sets, len(seeds), n_labels, -1), 2).cpu().numpy()

    def cell_profiles(d: str, e: str, counts, transfer_counts) -> np.ndarray:  # (b, S, 4)
        x, c = inputs[d], cases[d]
        n_labels = x["y_auroc"].shape[0]
        sets = macro(_weighted_aurocs(x["y_auroc"], x["scores"][e], counts), 1 + len(c.perturbed) + len(c.fractions),
                     n_labels)
        auroc, perturbed, fractions = sets[0], sets[1:1 + len(c.perturbed)], sets[1 + len(c.perturbed):]
        transfer = [macro(_weighted_aurocs(y_t, scores[e], transfer_counts[t]), 1, y_t.shape[0])[0]
                    for t, (y_t, scores) in x["transfers"].items()]
        drops = np.moveaxis(auroc[None] - np.concatenate([perturbed, np.array(transfer).reshape(-1, *auroc.shape)]), 0, -1)
        counts64 = counts.double()
        ece = np.stack([weighted_ece(x["y_ece"], x["clean"][e][s], counts64, task=c.task, n_bins=n_bins).cpu().numpy()
                        for s in range(len(seeds))])
        parts = {"auroc": auroc, "ece": ece, "robustness": _where_finite(robustness_raw, drops),
                 "retention": _replicate_retention(list(c.fractions),
                                                   np.concatenate([np.moveaxis(fractions, 0, -1), auroc[..., None]], -1))}
        return np.stack([parts[k] for k in DIMENSIONS], axis=-1).transpose(1, 0, 2)  # (S, b, 4) -> (b, S, 4)

    def replicate_batch(weights: np.ndarray, b: int, draw_cases: bool) -> np.ndarray:  # (b, cells, 4)
        out = np.empty((b, len(cells), 4))
        for d in datasets:
            def draw(n):
                return torch.as_tensor(_case_counts(generator, b, n) if draw_cases else np.ones((b, n)),
                                       dtype=torch.float32, device=dev)  # multiplicities: exact in float32
            counts = draw(shapes[d][1])
            transfer_counts = {t: draw(len(labels)) for t, (labels, _) in cases[d].transfers.items()}
            for e in encoders_of[d]:
                out[:, row_of[(e, d)]] = np.einsum("bs,bsk->bk", weights, cell_profiles(d, e, counts, transfer_counts))
        return out

    identity = replicate_batch(np.full((1, len(seeds)), 1.0 / len(seeds)), 1, draw_cases=False)[0]
    published = values.mean(axis=1)
    gap = np.abs(identity - published)
    if np.nanmax(gap) > 1e-4:
        i, k = np.unravel_index(np.nanargmax(gap), gap.shape)
        raise ValueError(f"the per-case probabilities do not reproduce the profiles: {DIMENSIONS[k]} of "
                         f"{cells['encoder'].iloc[i]} on {cells['dataset'].iloc[i]} is {identity[i, k]:.6f} from the "
                         f"cases, {published[i, k]:.6f} in the table (cases from another run?)")
    raw = np.empty((n_resamples, len(cells), 4))
    if batch_size is None:
        batch_size = max(1, min(n_resamples, 4_000_000 // max(n for _, n in shapes.values())))
    for start in tqdm(range(0, n_resamples, batch_size), desc="CRS bootstrap", disable=not progress):
        b = min(batch_size, n_resamples - start)
        raw[start:start + b] = replicate_batch(seed_draws[start:start + b], b, resample_cases)
    valid = np.isfinite(raw).all(axis=(1, 2))
    if not valid.all():  # a resample with no positive (or no negative) case of every label of a set
        logger.info("CRS bootstrap: %d of %d replicates left out (a dimension undefined on the drawn cases)",
                    int((~valid).sum()), n_resamples)
        raw = raw[valid]
    replicates, rank_probabilities = rank_replicates(cells, raw, frame)
    estimate = aggregate_crs(crs_scores(per_seed_profiles, frame))["crs"].reindex(replicates.columns)
    return CrsBootstrapResult(estimate=estimate, replicates=replicates, rank_probabilities=rank_probabilities,
                              cells=cells, profiles=published, profile_replicates=raw, resample_cases=resample_cases)
