"""The statistics around the CRS (DESIGN.md section 10): rank agreement and paired bootstraps.

- :func:`rank_agreement` compares two rankings of the same encoders (the paper's AUROC vs CRS
  comparison: Kendall tau-b, Spearman rho, reversed pairs, mean |rank shift|, top-3 overlap).
- :func:`seed_paired_bootstrap` is the paper's 10,000-replicate bootstrap over seeds: every
  replicate draws the seeds with replacement, the *same* draw for every encoder, averages the
  per-seed profiles, re-scores every cell under the fixed frame and ranks the aggregates. It gives
  P(rank 1), P(top 3) and paired CRS differences with percentile intervals.
- :func:`case_paired_bootstrap` (beyond the paper) resamples test images, the same indices for
  every encoder, and recomputes the macro AUROC of each encoder; it runs in torch on any device.
- The paper's analyses, as functions the notebooks call: :func:`insertion_experiment`,
  :func:`external_validity`, :func:`leave_one_dataset_out`, :func:`control_probe_agreement`,
  :func:`recalibration_summary`, :func:`calibration_under_degradation`,
  :func:`absolute_label_efficiency`, :func:`welch_transfer_test` and :func:`aulc_vs_retention`.
  Those that read runs take the runs table of :data:`crsrepro.crs.RUN_COLUMNS` (one row per run,
  with ``family`` where families matter); every per-cell value is the mean over seeds.

Percentile intervals from 5 seeds under-cover: a bootstrap over 5 units sees at most 126 distinct
resamples and underestimates the spread. The coverage test in ``tests/test_stats.py`` uses 40 units.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps
from scipy.stats import rankdata
from tqdm import tqdm

from crsrepro.crs import (DIMENSIONS, ProfileTableError, ReferenceFrame, aggregate_crs, cell_means, cell_profiles,
                          crs_components, crs_scores, is_perturbation, normalise, select_runs)
from crsrepro.metrics import aulc, macro_auroc

logger = logging.getLogger(__name__)


def _as_generator(rng) -> np.random.Generator:
    """``rng`` as a Generator: an int seeds a new one, a Generator is used as is."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be an int or a numpy Generator, got {rng!r}")


def _check_n_resamples(n_resamples):
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")


def _check_level(level):
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
    i, j = np.triu_indices(len(encoders), k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    n_pairs = len(i)
    concordant, discordant = int(np.sum(sx * sy > 0)), int(np.sum(sx * sy < 0))
    untied_x, untied_y = int(np.sum(sx != 0)), int(np.sum(sy != 0))
    tau = (concordant - discordant) / np.sqrt(untied_x * untied_y) if untied_x and untied_y else float("nan")
    rank_x, rank_y = rankdata(-x), rankdata(-y)
    rho = float(np.corrcoef(rank_x, rank_y)[0, 1]) if np.ptp(rank_x) and np.ptp(rank_y) else float("nan")
    top = lambda s: set(sorted(encoders, key=lambda e: (-s[e], e))[:3])  # noqa: E731
    ranks = pd.DataFrame({"score_a": x, "score_b": y, "rank_a": rank_x, "rank_b": rank_y,
                          "shift": rank_x - rank_y}, index=pd.Index(encoders, name="encoder"))
    return RankAgreement(kendall_tau=float(tau), spearman_rho=rho, reversed_pairs=discordant, n_pairs=n_pairs,
                         mean_abs_rank_shift=float(np.mean(np.abs(rank_x - rank_y))),
                         top3_overlap=len(top(a) & top(b)) / min(3, len(encoders)),
                         ranks=ranks.sort_values(["rank_b", "rank_a"], kind="stable"))


# --------------------------------------------------------------------------- bootstrap results

@dataclass(frozen=True)
class PairedDifference:
    """A paired difference ``a - b`` with its percentile bootstrap interval."""

    a: str
    b: str
    estimate: float
    ci_low: float
    ci_high: float
    level: float
    n_resamples: int


@dataclass(frozen=True)
class BootstrapReplicates:
    """Per-encoder estimates and their bootstrap replicates (paired: one resample per row).

    Attributes
    ----------
    estimate : Series
        The statistic on the full sample, by encoder.
    replicates : DataFrame
        One row per replicate, one column per encoder; row r of every column used the same resample.
    """

    estimate: pd.Series
    replicates: pd.DataFrame

    @property
    def n_resamples(self) -> int:
        return len(self.replicates)

    def paired_diff_ci(self, a: str, b: str, level: float = 0.95) -> PairedDifference:
        """The percentile interval of the paired difference ``a - b`` over the replicates.

        Replicates where either value is NaN (e.g. an AUROC with one class in the resample) are
        left out of the interval.
        """
        _check_level(level)
        for e in (a, b):
            if e not in self.replicates.columns:
                raise ValueError(f"no encoder {e!r} in the bootstrap (has {', '.join(self.replicates.columns)})")
        diff = (self.replicates[a] - self.replicates[b]).dropna().to_numpy()
        low, high = np.quantile(diff, [(1 - level) / 2, (1 + level) / 2])
        return PairedDifference(a=a, b=b, estimate=float(self.estimate[a] - self.estimate[b]), ci_low=float(low),
                                ci_high=float(high), level=level, n_resamples=self.n_resamples)


@dataclass(frozen=True)
class SeedBootstrapResult(BootstrapReplicates):
    """The seed-paired bootstrap of aggregate CRS (DESIGN.md section 10).

    Attributes
    ----------
    estimate : Series
        Each encoder's aggregate CRS on the seed-averaged profiles (:func:`crsrepro.crs.aggregate_crs`).
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

def _per_seed_array(per_seed_profiles: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The cells, the seeds and the (cells, seeds, 4) array of raw profiles; every cell needs every seed."""
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


def seed_paired_bootstrap(per_seed_profiles: pd.DataFrame, frame: ReferenceFrame, *, n_resamples: int = 10000,
                          rng=0) -> SeedBootstrapResult:
    """The paper's seed-paired bootstrap of aggregate CRS ranks (DESIGN.md section 10).

    Each replicate draws S seeds with replacement from the S seeds (one draw shared by every cell),
    averages each cell's per-seed profiles with those multiplicities, normalises them with the
    frame's anchors, scores them against the frame's frozen peers (:func:`crsrepro.crs.crs_components`,
    the same code as :func:`crsrepro.crs.crs_scores`), averages each encoder's cells and ranks the
    encoders. All replicates are computed at once as arrays.

    Parameters
    ----------
    per_seed_profiles : DataFrame
        A profiles table with a ``seed`` column; every cell must have every seed.
    frame : ReferenceFrame
        The frozen frame (fixed mode).
    n_resamples : int, default 10000
        The paper's count.
    rng : int or numpy Generator, default 0

    Returns
    -------
    SeedBootstrapResult
        ``p_rank1``, ``p_top3``, ``rank_probabilities``, ``replicates`` and ``paired_diff_ci(a, b)``.
    """
    _check_n_resamples(n_resamples)
    cells, seeds, values = _per_seed_array(per_seed_profiles)
    draws = _as_generator(rng).integers(0, len(seeds), size=(n_resamples, len(seeds)))
    weights = np.zeros((n_resamples, len(seeds)))
    np.add.at(weights, (np.arange(n_resamples)[:, None], draws), 1.0 / len(seeds))
    p = normalise(np.einsum("bs,csk->cbk", weights, values), frame.anchors)  # (cells, replicates, 4)
    crs = np.empty((len(cells), n_resamples))
    for dataset, rows in cells.groupby("dataset", sort=True).indices.items():
        ref_encoders, reference = frame.reference_for(dataset)
        peers = cells["encoder"].to_numpy()[rows, None] != ref_encoders[None, :]
        crs[rows] = crs_components(p[rows], reference, peers, frame.weights)["crs"]
    encoders = np.sort(cells["encoder"].unique())
    membership = (cells["encoder"].to_numpy()[None, :] == encoders[:, None]).astype(float)
    aggregate = (membership / membership.sum(1, keepdims=True)) @ crs  # (encoders, replicates)
    order = np.argsort(-aggregate, axis=0, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, len(encoders) + 1)[:, None], axis=0)
    rank_probabilities = pd.DataFrame((ranks[:, :, None] == np.arange(1, len(encoders) + 1)).mean(axis=1),
                                      index=pd.Index(encoders, name="encoder"),
                                      columns=pd.RangeIndex(1, len(encoders) + 1, name="rank"))
    estimate = aggregate_crs(crs_scores(per_seed_profiles, frame))["crs"].reindex(encoders)
    return SeedBootstrapResult(estimate=estimate, replicates=pd.DataFrame(aggregate.T, columns=encoders),
                               rank_probabilities=rank_probabilities)


# --------------------------------------------------------------------------- case-level bootstrap

def _weighted_macro_auroc(y: torch.Tensor, score: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Macro AUROC for each row of ``counts`` (case multiplicities), one-vs-rest columns.

    ``y`` (N, L) holds 0/1 with NaN for masked entries, ``score`` (N, L), ``counts`` (B, N). Per column,
    cases are sorted once by score and grouped into ties; a replicate's AUROC is
    sum_g P_g (N_<g + N_g / 2) / (P N), with P_g and N_g its positive and negative weight in tie group g.
    A column with no positive or no negative weight is NaN and left out of the mean (as
    :func:`crsrepro.metrics.macro_auroc` skips it).
    """
    per_column = []
    for k in range(y.shape[1]):
        order = torch.argsort(score[:, k])
        s, t = score[order, k], y[order, k]
        group = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long, device=s.device),
                                        (s[1:] != s[:-1]).long()]), 0)
        n_groups = int(group[-1]) + 1
        c = counts[:, order]
        pos = torch.zeros(c.shape[0], n_groups, dtype=c.dtype, device=c.device).index_add_(
            1, group, c * torch.nan_to_num(t, nan=0.0))
        neg = torch.zeros_like(pos).index_add_(1, group, c * torch.nan_to_num(1 - t, nan=0.0))
        below = torch.cumsum(neg, 1) - neg
        total = pos.sum(1) * neg.sum(1)
        per_column.append((pos * (below + neg / 2)).sum(1) / torch.where(total > 0, total, torch.nan))
    return torch.nanmean(torch.stack(per_column, 1), 1)


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
        :mod:`crsrepro.metrics`).
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
        ``estimate`` is :func:`crsrepro.metrics.macro_auroc` on the full test set.
    """
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
    generator = _as_generator(rng)
    out = np.empty((n_resamples, len(encoders)))
    starts = range(0, n_resamples, batch_size)
    for start in tqdm(starts, desc="case bootstrap", disable=not progress):
        b = min(batch_size, n_resamples - start)
        draws = generator.integers(0, n_cases, size=(b, n_cases))
        counts = np.bincount((draws + n_cases * np.arange(b)[:, None]).ravel(), minlength=b * n_cases)
        counts_t = torch.as_tensor(counts.reshape(b, n_cases), dtype=torch.float64, device=dev)
        for j, e in enumerate(encoders):
            out[start:start + b, j] = _weighted_macro_auroc(y_t, score_t[e], counts_t).cpu().numpy()
    return BootstrapReplicates(estimate=estimate, replicates=pd.DataFrame(out, columns=encoders))


# --------------------------------------------------------------------------- analyses

def _seed_means(rows: pd.DataFrame, by: list[str], columns=("auroc", "ece")) -> pd.DataFrame:
    """Mean over seeds of ``columns`` per ``by`` (the paper's cell values are seed averages)."""
    return rows.groupby(by, sort=True)[list(columns)].mean()


@dataclass(frozen=True)
class InsertionResult:
    """The insertion experiment (DESIGN.md section 9).

    Attributes
    ----------
    movements : DataFrame
        One row per trial, mode and published cell: ``trial, mode, encoder, dataset, movement``
        (|CRS after insertion - CRS before|).
    summary : DataFrame
        Indexed by mode: ``mean_movement`` and ``max_movement`` over every published cell of every
        trial (the paper: cohort 0.053 and 0.167, fixed exactly 0), ``panel_size``, ``n_inserted``,
        ``n_trials``.
    """

    movements: pd.DataFrame
    summary: pd.DataFrame


def insertion_experiment(profiles: pd.DataFrame, *, n_trials: int = 30, n_inserted: int = 3, panel_size: int = 12,
                         rng=0) -> InsertionResult:
    """Insert encoders into a panel and measure how far the panel's published CRS move.

    Each trial draws a random panel of ``panel_size`` encoders and ``n_inserted`` others. Under
    ``fixed`` the frame is frozen from the panel alone, the panel is scored, then panel + inserted are
    scored against the same frame; under ``cohort`` both scorings re-normalise over the scored set.
    The movement of a published score is |after - before| per panel cell **[ours: cell level]**.

    Parameters
    ----------
    profiles : DataFrame
        A profiles table (per seed or per cell).
    n_trials, n_inserted, panel_size : int
        The paper's 30 trials inserting 3 into 12. With fewer than ``panel_size + n_inserted``
        encoders (the demo has 10) the panel shrinks to ``n_encoders - n_inserted`` **[ours]**.
    rng : int or numpy Generator

    Returns
    -------
    InsertionResult
    """
    cells = cell_means(profiles)
    encoders = np.sort(cells["encoder"].unique())
    size = min(panel_size, len(encoders) - n_inserted)
    if size < 2 or n_inserted < 1:
        raise ValueError(f"insertion_experiment needs a panel of at least 2 encoders and 1 to insert; "
                         f"{len(encoders)} encoders, n_inserted={n_inserted}")
    if size < panel_size:
        logger.info("insertion experiment: %d encoders available, so panels of %d (not %d) + %d inserted",
                    len(encoders), size, panel_size, n_inserted)
    generator = _as_generator(rng)
    parts = []
    for trial in range(n_trials):
        chosen = generator.permutation(encoders)
        panel = cells[cells["encoder"].isin(chosen[:size])]
        both = cells[cells["encoder"].isin(chosen[:size + n_inserted])]
        frame = ReferenceFrame.freeze(panel)
        for mode, frm in (("fixed", frame), ("cohort", None)):
            before = crs_scores(panel, frm, mode=mode).set_index(["encoder", "dataset"])["crs"]
            after = crs_scores(both, frm, mode=mode).set_index(["encoder", "dataset"])["crs"].reindex(before.index)
            parts.append((after - before).abs().rename("movement").reset_index().assign(trial=trial, mode=mode))
    movements = pd.concat(parts, ignore_index=True)[["trial", "mode", "encoder", "dataset", "movement"]]
    summary = movements.groupby("mode").agg(mean_movement=("movement", "mean"), max_movement=("movement", "max"))
    return InsertionResult(movements=movements,
                           summary=summary.assign(panel_size=size, n_inserted=n_inserted, n_trials=n_trials))


@dataclass(frozen=True)
class ExternalValidity:
    """CRS without the transfer term vs the transfer AUROC (DESIGN.md section 10).

    Attributes
    ----------
    table : DataFrame
        By encoder: ``crs`` (without the transfer drop), ``source_auroc`` (clean CheXpert AUROC) and
        ``target_auroc`` (MIMIC-CXR AUROC of the CheXpert probe).
    rho_crs : float
        Spearman rho of ``crs`` with ``target_auroc`` (the paper: 0.529).
    rho_source_auroc : float
        Spearman rho of ``source_auroc`` with ``target_auroc``: the baseline (the paper: 0.864).
    frame : ReferenceFrame
        The frame frozen from the profiles without the transfer term.
    """

    table: pd.DataFrame
    rho_crs: float
    rho_source_auroc: float
    frame: ReferenceFrame


def external_validity(runs: pd.DataFrame, *, source: str = "chexpert", target: str = "mimic_cxr",
                      crs_level: str = "aggregate") -> ExternalValidity:
    """Does the CRS, computed without the transfer term, predict the transfer AUROC better than AUROC?

    The profiles are rebuilt with ``include_transfer=False`` (robustness without the real drop), a
    frame is frozen from them, and their CRS is compared with the ``target`` AUROC of the probes
    trained on ``source`` (Spearman over encoders), against the clean ``source`` AUROC as baseline.

    Parameters
    ----------
    runs : DataFrame
        A runs table with the transfer condition ``target`` on ``source``.
    source, target : str
        The training dataset and the transfer condition.
    crs_level : {"aggregate", "cell"}, default "aggregate" **[ours]**
        The encoder's aggregate CRS over all its cells (the benchmark-level summary the paper ranks
        by), or its CRS on the ``source`` cell alone.
    """
    if crs_level not in ("aggregate", "cell"):
        raise ValueError(f"crs_level must be 'aggregate' or 'cell', got {crs_level!r}")
    profiles = cell_profiles(runs, include_transfer=False)
    frame = ReferenceFrame.freeze(profiles, description=f"external validity: robustness without the {target} drop")
    scores = crs_scores(profiles, frame)
    on_source = scores[scores["dataset"] == source].set_index("encoder")
    crs = aggregate_crs(scores)["crs"] if crs_level == "aggregate" else on_source["crs"]
    transfer = select_runs(runs, label_fraction=1.0, dataset=source, condition=target)
    if transfer.empty:
        raise ProfileTableError(f"runs table: no primary run on dataset {source} with condition {target}")
    table = pd.DataFrame({"crs": crs, "source_auroc": on_source["auroc"],
                          "target_auroc": _seed_means(transfer, ["encoder"])["auroc"]}).dropna()
    table.index.name = "encoder"
    rho = lambda x: float(sps.spearmanr(table[x], table["target_auroc"]).statistic)  # noqa: E731
    return ExternalValidity(table=table, rho_crs=rho("crs"), rho_source_auroc=rho("source_auroc"), frame=frame)


def leave_one_dataset_out(scores: pd.DataFrame) -> pd.DataFrame:
    """For each dataset d: the mean CRS over the other datasets vs the AUROC on d **[ours]**.

    Parameters
    ----------
    scores : DataFrame
        The output of :func:`crsrepro.crs.crs_scores` (fixed mode: a cell's CRS does not depend on d).

    Returns
    -------
    DataFrame
        Indexed by ``held_out`` dataset: ``n_encoders`` (those with a cell on d and another cell),
        ``spearman_rho`` (the paper: ISIC 0.550, APTOS 0.709, CheXpert 0.271), ``auroc_champion``
        (argmax of AUROC on d), ``crs_champion`` (argmax of the other-dataset CRS) and ``recovered``.
    """
    rows = []
    for held_out in sorted(scores["dataset"].unique()):
        auroc = scores[scores["dataset"] == held_out].set_index("encoder")["auroc"]
        others = scores[scores["dataset"] != held_out].groupby("encoder")["crs"].mean()
        common = auroc.index.intersection(others.index).sort_values()
        auroc, others = auroc[common], others[common]
        rows.append({"held_out": held_out, "n_encoders": len(common),
                     "spearman_rho": float(sps.spearmanr(others, auroc).statistic) if len(common) > 2 else np.nan,
                     "auroc_champion": auroc.idxmax(), "crs_champion": others.idxmax(),
                     "recovered": auroc.idxmax() == others.idxmax()})
    return pd.DataFrame(rows).set_index("held_out")


def control_probe_agreement(runs: pd.DataFrame, *, metric: str = "auroc") -> pd.DataFrame:
    """Rank agreement of each control probe (MLP, k-NN) with the linear probe, per dataset.

    Encoders are ranked by ``metric`` on the clean test split at 100 % labels (mean over seeds),
    where the control probes run (DESIGN.md section 7); only encoders present under both probes count.

    Returns
    -------
    DataFrame
        One row per (dataset, probe): ``n_encoders, kendall_tau, spearman_rho, reversed_pairs,
        n_pairs, top3_overlap``.
    """
    rows = select_runs(runs, probe=None, condition="clean", label_fraction=1.0)
    means = _seed_means(rows, ["dataset", "encoder", "probe"], [metric])[metric]
    out = []
    for dataset, per_dataset in means.groupby(level="dataset"):
        table = per_dataset.droplevel("dataset").unstack("probe")  # encoder x probe
        for probe in [p for p in table.columns if p != "linear" and "linear" in table.columns]:
            both = table[["linear", probe]].dropna()
            if len(both) < 2:
                continue
            r = rank_agreement(both["linear"].to_dict(), both[probe].to_dict())
            out.append({"dataset": dataset, "probe": probe, "n_encoders": len(both), "kendall_tau": r.kendall_tau,
                        "spearman_rho": r.spearman_rho, "reversed_pairs": r.reversed_pairs, "n_pairs": r.n_pairs,
                        "top3_overlap": r.top3_overlap})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class RecalibrationSummary:
    """ECE before and after post-hoc recalibration (DESIGN.md section 8).

    Attributes
    ----------
    cells : DataFrame
        One row per (encoder, dataset, recalibrator): ``ece_before, ece_after, absolute_drop,
        relative_reduction, auroc_change``.
    summary : DataFrame
        By recalibrator: ``n_cells``, ``relative_reduction_min/max`` (the paper: 54-77 %),
        ``mean_absolute_drop`` with its t-interval ``ci_low, ci_high`` over cells (the paper: 0.067
        [0.024; 0.110]) and ``mean_auroc_change`` (the paper: about +0.001).
    """

    cells: pd.DataFrame
    summary: pd.DataFrame


def recalibration_summary(runs: pd.DataFrame, *, cells: list[tuple[str, str]] | None = None,
                          level: float = 0.95) -> RecalibrationSummary:
    """How much each recalibrator reduces ECE, per cell and overall (clean test split, 100 % labels).

    Parameters
    ----------
    runs : DataFrame
        A runs table with ``recalibrator`` rows ``none`` and at least one other.
    cells : list of (encoder, dataset), optional **[ours]**
        The cells that count. The paper reports "six main tests" without naming them; the default
        None counts every cell.
    level : float, default 0.95
        Level of the t-interval of the mean absolute drop over cells **[ours: a t-interval]**.
    """
    _check_level(level)
    rows = select_runs(runs, recalibrator=None, condition="clean", label_fraction=1.0)
    means = _seed_means(rows, ["encoder", "dataset", "recalibrator"]).reset_index()
    if cells is not None:
        chosen = pd.MultiIndex.from_tuples(cells)
        means = means[pd.MultiIndex.from_frame(means[["encoder", "dataset"]]).isin(chosen)]
    before = means[means["recalibrator"] == "none"].set_index(["encoder", "dataset"])
    after = means[means["recalibrator"] != "none"].join(before[["ece", "auroc"]].add_suffix("_before"),
                                                        on=["encoder", "dataset"]).dropna(subset=["ece_before"])
    table = pd.DataFrame({"encoder": after["encoder"], "dataset": after["dataset"],
                          "recalibrator": after["recalibrator"], "ece_before": after["ece_before"],
                          "ece_after": after["ece"], "absolute_drop": after["ece_before"] - after["ece"],
                          "relative_reduction": (after["ece_before"] - after["ece"]) / after["ece_before"],
                          "auroc_change": after["auroc"] - after["auroc_before"]}).reset_index(drop=True)

    def summarise(group):
        drop = group["absolute_drop"].to_numpy()
        half = (sps.t.ppf((1 + level) / 2, len(drop) - 1) * drop.std(ddof=1) / np.sqrt(len(drop))
                if len(drop) > 1 else np.nan)
        return pd.Series({"n_cells": len(drop), "relative_reduction_min": group["relative_reduction"].min(),
                          "relative_reduction_max": group["relative_reduction"].max(),
                          "mean_absolute_drop": drop.mean(), "ci_low": drop.mean() - half,
                          "ci_high": drop.mean() + half, "mean_auroc_change": group["auroc_change"].mean()})

    summary = pd.DataFrame({r: summarise(g) for r, g in table.groupby("recalibrator")}).T.astype({"n_cells": int})
    summary.index.name = "recalibrator"
    return RecalibrationSummary(cells=table, summary=summary)


@dataclass(frozen=True)
class DegradationResult:
    """Calibration under image degradation (DESIGN.md section 10).

    Attributes
    ----------
    cells : DataFrame
        By (encoder, dataset): ``ece_clean``, ``mean_ece_rise`` and ``peak_ece_rise`` (the mean and
        the max over perturbation@severity of ECE - clean ECE; the paper: LLaVA-Med on APTOS +0.128
        and 0.418), ``mean_auroc_drop`` and ``peak_auroc_drop`` (clean AUROC - AUROC, likewise).
    pearson_r, p_value : float
        Pearson r over cells between the discrimination loss (``mean_auroc_drop``) and the
        calibration loss (``mean_ece_rise``) (the paper: r = 0.63 over 43 cells).
    """

    cells: pd.DataFrame
    pearson_r: float
    p_value: float


def calibration_under_degradation(runs: pd.DataFrame) -> DegradationResult:
    """Per-cell ECE rise and AUROC drop under the perturbations, and their correlation over cells.

    Every value is first averaged over seeds per (cell, condition) at 100 % labels; the transfer
    condition is not a perturbation and is left out.
    """
    rows = select_runs(runs, label_fraction=1.0)
    means = _seed_means(rows, ["encoder", "dataset", "condition"]).reset_index()
    clean = means[means["condition"] == "clean"].set_index(["encoder", "dataset"])
    perturbed = means[means["condition"].map(is_perturbation)].join(clean[["auroc", "ece"]].add_suffix("_clean"),
                                                                     on=["encoder", "dataset"])
    perturbed = perturbed.assign(ece_rise=perturbed["ece"] - perturbed["ece_clean"],
                                 auroc_drop=perturbed["auroc_clean"] - perturbed["auroc"])
    grouped = perturbed.groupby(["encoder", "dataset"])
    cells = pd.DataFrame({"ece_clean": grouped["ece_clean"].first(), "mean_ece_rise": grouped["ece_rise"].mean(),
                          "peak_ece_rise": grouped["ece_rise"].max(), "mean_auroc_drop": grouped["auroc_drop"].mean(),
                          "peak_auroc_drop": grouped["auroc_drop"].max()}).dropna()
    if len(cells) < 3:
        raise ProfileTableError(f"runs table: {len(cells)} cells with clean and perturbed runs; a correlation "
                                f"needs at least 3")
    r = sps.pearsonr(cells["mean_auroc_drop"], cells["mean_ece_rise"])
    return DegradationResult(cells=cells, pearson_r=float(r.statistic), p_value=float(r.pvalue))


def absolute_label_efficiency(runs: pd.DataFrame, *, fraction: float = 0.01,
                              reference_encoder: str = "general.vit_b16") -> pd.DataFrame:
    """AUROC at a small label fraction per cell, against a reference encoder's full-label AUROC.

    Parameters
    ----------
    fraction : float, default 0.01
        The label fraction (the paper: 1 %).
    reference_encoder : str, default "general.vit_b16"
        Whose full-label AUROC is the bar per dataset (the paper: ViT-B/16). The demo panel has no
        ViT-B/16, so its notebook names one of its own encoders.

    Returns
    -------
    DataFrame
        By (encoder, dataset): ``auroc_at_fraction``, ``auroc_full``, ``reference_full_auroc`` (NaN on a
        dataset without the reference encoder) and ``reaches_reference`` (AUROC at ``fraction`` >= the
        bar; False where there is no bar).
    """
    rows = select_runs(runs, condition="clean")
    if reference_encoder not in set(rows["encoder"]):
        raise ValueError(f"reference_encoder {reference_encoder!r} has no runs (encoders: "
                         f"{', '.join(sorted(rows['encoder'].unique()))})")
    means = _seed_means(rows, ["encoder", "dataset", "label_fraction"], ["auroc"])["auroc"].unstack("label_fraction")
    if fraction not in means.columns or 1.0 not in means.columns:
        raise ValueError(f"label fractions {fraction} and 1.0 must both have runs (have {list(means.columns)})")
    table = pd.DataFrame({"auroc_at_fraction": means[fraction], "auroc_full": means[1.0]})
    bar = table.xs(reference_encoder, level="encoder")["auroc_full"]
    table["reference_full_auroc"] = table.index.get_level_values("dataset").map(bar).astype(float)
    table["reaches_reference"] = table["auroc_at_fraction"] >= table["reference_full_auroc"]
    return table


@dataclass(frozen=True)
class WelchResult:
    """Welch's t-test of the transfer AUROC, medical-pretrained vs general encoders.

    Attributes
    ----------
    table : DataFrame
        By encoder: ``family``, ``group`` (medical / general) and ``target_auroc``.
    mean_medical, mean_general : float
        The group means (the paper: 0.717 and 0.540).
    statistic, p_value : float
        Welch's t and its two-sided p (the paper: p = 0.0029).
    n_medical, n_general : int
    """

    table: pd.DataFrame
    mean_medical: float
    mean_general: float
    statistic: float
    p_value: float
    n_medical: int
    n_general: int


def welch_transfer_test(runs: pd.DataFrame, *, source: str = "chexpert", target: str = "mimic_cxr",
                        medical_families: tuple[str, ...] = ("medical", "specialist"),
                        general_families: tuple[str, ...] = ("general",)) -> WelchResult:
    """Welch's t-test on the transfer AUROC (probe trained on ``source``, scored on ``target``).

    The groups come from the runs table's ``family`` column (the registry's ``spec.family``): the
    paper's "medical-pretrained" is medical + specialist (9 encoders) against general (6).
    """
    if "family" not in runs.columns:
        raise ProfileTableError("runs table: missing column family (welch_transfer_test groups encoders by family)")
    transfer = select_runs(runs, label_fraction=1.0, dataset=source, condition=target)
    auroc = _seed_means(transfer, ["encoder"], ["auroc"])["auroc"]
    family = transfer.groupby("encoder")["family"].first()
    group = family.map(lambda f: "medical" if f in medical_families else "general" if f in general_families else None)
    table = pd.DataFrame({"family": family, "group": group, "target_auroc": auroc}).dropna(subset=["group"])
    medical = table.loc[table["group"] == "medical", "target_auroc"]
    general = table.loc[table["group"] == "general", "target_auroc"]
    if len(medical) < 2 or len(general) < 2:
        raise ProfileTableError(f"runs table: Welch's test needs 2 encoders per group on {target}, "
                                f"has {len(medical)} medical and {len(general)} general")
    t = sps.ttest_ind(medical, general, equal_var=False)
    return WelchResult(table=table, mean_medical=float(medical.mean()), mean_general=float(general.mean()),
                       statistic=float(t.statistic), p_value=float(t.pvalue), n_medical=len(medical),
                       n_general=len(general))


@dataclass(frozen=True)
class AulcVsRetention:
    """Which label-efficiency measure merely copies full-label AUROC (DESIGN.md section 10).

    Attributes
    ----------
    cells : DataFrame
        By (encoder, dataset): ``auroc_full``, ``aulc`` and ``retention`` (each the mean over seeds).
    correlations : DataFrame
        Spearman rho with ``auroc_full``, index ``aulc`` / ``retention``, columns ``encoder`` (means
        over each encoder's cells) and ``cell`` (the paper: AULC 0.986 / 0.977, retention 0.339 / -0.342).
    """

    cells: pd.DataFrame
    correlations: pd.DataFrame


def aulc_vs_retention(runs: pd.DataFrame) -> AulcVsRetention:
    """Spearman of AULC and of retention with full-label AUROC, at encoder and at cell level."""
    rows = select_runs(runs, condition="clean")
    curves = rows.groupby(["encoder", "dataset", "seed"]).apply(
        lambda c: aulc(c.set_index("label_fraction")["auroc"].astype(float).to_dict()), include_groups=False)
    profiles = cell_means(cell_profiles(runs)).set_index(["encoder", "dataset"])
    cells = pd.DataFrame({"auroc_full": profiles["auroc"], "aulc": curves.groupby(["encoder", "dataset"]).mean(),
                          "retention": profiles["retention"]})
    by_encoder = cells.groupby("encoder").mean()
    correlations = pd.DataFrame({level: {m: float(sps.spearmanr(t[m], t["auroc_full"]).statistic)
                                         for m in ("aulc", "retention")}
                                 for level, t in (("encoder", by_encoder), ("cell", cells))})
    return AulcVsRetention(cells=cells, correlations=correlations)
