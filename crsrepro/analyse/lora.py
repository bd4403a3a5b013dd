"""Frozen vs LoRA: the LoRA grid's analyses (chapter 07; DESIGN.md section 11; issue 23, Deliver 4).

:func:`lora_profiles` turns the LoRA grid's tidy rows (:class:`crsrepro.run.lora.LoraStage`) into the four
dimensions of every (encoder, dataset, seed); :func:`frozen_profiles` gives the frozen profiles of the
same cells with their retention over the *same* label fractions as the LoRA grid trained (a LoRA plan
may train fewer fractions than the frozen grid: the demo's trains 25 % and 100 %, so the frozen
retention compared averages 25 % only, not 1/5/10/25 %); :func:`compare` sets the LoRA ranking against
the frozen one.

Every fine-tune starts as the frozen linear probe and keeps its best val epoch (the recipe of
:mod:`crsrepro.run.lora`, [ours]), so where LoRA does not raise test AUROC the reason is measured, not
guessed: :func:`fine_tunes` sets each fine-tune's test AUROC beside its probe's, with the epoch early
stopping restored (0: the probe was kept) and the val AUROC at epoch 0 and at that epoch, and
:func:`early_stopping_summary` counts per domain the fine-tunes that kept the probe, and those whose val
AUROC rose while their test AUROC fell (the few val rows that choose the epoch were fitted, not the test
split).

The four-dimensional comparison scores each regime **among its own peers** (primary): the LoRA profiles
are normalised with the frame's fixed anchors and their Pareto share and proximity are counted against
the other encoders' LoRA profiles, and the frozen profiles likewise against the frozen profiles of the
same encoders, so that both rankings answer "who is most reliable in this regime". The paper's wording
("微调后的四维比较", the four-dimensional comparison after fine-tuning) reads most naturally so. Beside
it, :attr:`LoraComparison.crs_frozen_peers` is the version in which the LoRA profiles are scored against
the frozen frame's peers (the project's earlier reading, DESIGN.md section 9's fixed mode).

The per-domain Kendall tau of the AUROC rankings gets an interval from a seed bootstrap: one shared
draw of the compared seeds (with replacement) per replicate, the same for every encoder and for both
regimes, and :func:`crsrepro.score.stats.bootstrap_interval` (the book's one interval function, its
centred percentile interval). With one seed there is nothing to resample and the interval is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from crsrepro.core.schema import FINAL, FROZEN, LORA
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION
from crsrepro.run.lora import TRAINING_METRICS, LoraError
from crsrepro.run.results import runs_table
from crsrepro.score.dimensions import reliability_profiles

#: [ours] Seed-bootstrap replicates of the per-domain tau intervals (a 3-seed draw has 10 distinct
#: multisets, so more replicates only refine their frequencies).
N_RESAMPLES = 2000


def lora_profiles(results: pd.DataFrame) -> pd.DataFrame:
    """The four dimensions of every LoRA (encoder, dataset, seed): the primary protocol's, on the rows of
    regime ``lora``."""
    return reliability_profiles(runs_table(results), regime=LORA)


def lora_fractions(results: pd.DataFrame) -> list[float]:
    """The label fractions the LoRA grid trained (read from its rows, not from the plan)."""
    return sorted(float(f) for f in results["label_fraction"].unique())


def frozen_profiles(runs: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """The frozen reliability profiles with retention over the label fractions the LoRA grid trained
    (``results``: its tidy rows), so that frozen and LoRA retention average the same fractions.

    Raises
    ------
    LoraError
        The frozen runs lack one of the LoRA fractions.
    """
    fractions = lora_fractions(results)
    missing = sorted(set(fractions) - set(runs["label_fraction"].astype(float)))
    if missing:
        raise LoraError(f"the frozen runs have no label fraction {missing} that the LoRA grid trained")
    return reliability_profiles(runs[runs["label_fraction"].astype(float).isin(fractions)])


def _clean_runs(runs: pd.DataFrame, regime: str) -> pd.DataFrame:
    """The primary protocol's clean, unrecalibrated runs of ``regime``."""
    return runs[(runs["condition"] == CLEAN) & (runs["recalibrator"] == NO_RECALIBRATION) & (runs["probe"] == LINEAR)
                & (runs["layer"] == FINAL) & (runs["regime"] == regime)]


def fine_tunes(runs: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Every fine-tune beside the frozen probe it started from.

    Parameters
    ----------
    runs : DataFrame
        The frozen grid's runs table.
    results : DataFrame
        The LoRA grid's tidy rows.

    Returns
    -------
    DataFrame
        Per (encoder, dataset, seed, label fraction) that both have: ``auroc_frozen`` and ``auroc_lora``
        (clean test macro AUROC) and ``auroc_gain`` (LoRA - frozen); :data:`crsrepro.run.lora.TRAINING_METRICS`
        (``best_epoch`` 0: early stopping kept the probe) and ``val_auroc_gain`` (val AUROC at the epoch
        restored - at epoch 0, never negative).
    """
    on = ["encoder", "dataset", "seed", "label_fraction"]
    lora = _clean_runs(runs_table(results), LORA)[on + ["auroc", *TRAINING_METRICS]]
    frozen = _clean_runs(runs, FROZEN)[on + ["auroc"]]
    table = frozen.merge(lora, on=on, suffixes=("_frozen", "_lora")).astype({"best_epoch": "Int64",
                                                                           "epochs_trained": "Int64"})
    return table.assign(auroc_gain=table["auroc_lora"] - table["auroc_frozen"],
                        val_auroc_gain=table["val_auroc_best"] - table["val_auroc_start"]).reset_index(drop=True)


def early_stopping_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and label fraction, from :func:`fine_tunes`: ``n_fine_tunes``, the mean ``auroc_gain``
    and ``val_auroc_gain``, ``kept_probe`` (fine-tunes whose best val epoch is 0, so that LoRA is the
    probe) and ``val_up_test_down`` (fine-tunes whose val AUROC rose while their test AUROC fell)."""
    rows = table.assign(kept_probe=table["best_epoch"] == 0,
                        val_up_test_down=(table["val_auroc_gain"] > 0) & (table["auroc_gain"] < 0))
    return (rows.groupby(["dataset", "label_fraction"], sort=False)
            .agg(n_fine_tunes=("encoder", "size"), auroc_gain=("auroc_gain", "mean"),
                 val_auroc_gain=("val_auroc_gain", "mean"), kept_probe=("kept_probe", "sum"),
                 val_up_test_down=("val_up_test_down", "sum"))
            .reset_index())


def peer_scores(profiles: pd.DataFrame, frame=None) -> pd.DataFrame:
    """The CRS of every cell of ``profiles`` scored among the table's own encoders: the frame's fixed
    anchors (the defaults without a frame), Pareto share and proximity counted against the other
    encoders' cells of the same table on the dataset (``peers="panel"``)."""
    from crsrepro.score.crs import DEFAULT_ANCHORS, DIMENSIONS, cell_means, normalise, score_by_dataset

    cells = cell_means(profiles)
    p = normalise(cells[list(DIMENSIONS)].to_numpy(), frame.anchors if frame is not None else DEFAULT_ANCHORS)
    return cells[["encoder", "dataset", *DIMENSIONS]].assign(**score_by_dataset(cells[["encoder", "dataset"]], p,
                                                                                None, peers="panel"))


@dataclass(frozen=True)
class LoraComparison:
    """Frozen vs LoRA (chapter 07).

    Attributes
    ----------
    per_domain : DataFrame
        Per dataset: ``n_encoders``, ``n_seeds``, ``kendall_tau`` of the AUROC rankings with its seed-bootstrap
        interval ``tau_ci_low``, ``tau_ci_high``, ``reversed_pairs``, ``leader_frozen``, ``leader_lora``,
        ``leader_changed``, ``auroc_gain`` (mean LoRA - frozen).
    crs : RankAgreement
        The four-dimensional comparison, each regime scored among its own peers (primary,
        :func:`peer_scores`): the encoders' mean CRS, frozen (``a``) vs LoRA (``b``); its ``ranks`` feed
        :func:`crsrepro.present.plots.rank_shift` (``a="frozen", b="LoRA"``).
    crs_frozen_peers : RankAgreement or None
        The same with both regimes scored against the frozen frame's peers (fixed mode); None without a frame.
    movers : DataFrame
        ``crs.ranks`` sorted by the size of the shift (who moves most).
    top3_hold : bool
        Whether the top three by CRS (primary) are the same encoders.
    seeds : list of int
        The seeds compared (those both tables have).
    """

    per_domain: pd.DataFrame
    crs: object
    crs_frozen_peers: object
    movers: pd.DataFrame
    top3_hold: bool
    seeds: list


def _tau_interval(a: pd.DataFrame, b: pd.DataFrame, weights: np.ndarray, level: float) -> tuple[float, float]:
    """The seed-bootstrap interval of the Kendall tau between the seed-mean rankings of ``a`` and ``b``
    (encoders x seeds), the seeds reweighted by ``weights`` (replicates x seeds)."""
    from crsrepro.score.stats import bootstrap_interval, rank_correlations

    if a.shape[1] < 2:
        return np.nan, np.nan
    tau, _, _ = rank_correlations(a.to_numpy().mean(axis=1), b.to_numpy().mean(axis=1))
    replicates, _, _ = rank_correlations(weights @ a.to_numpy().T, weights @ b.to_numpy().T)
    _, low, high = bootstrap_interval(tau, replicates, level)
    return float(low), float(high)


def compare(frozen: pd.DataFrame, lora: pd.DataFrame, frame=None, *, n_resamples: int = N_RESAMPLES,
            level: float = 0.95, rng=0) -> LoraComparison:
    """Compare the frozen and LoRA reliability profiles on the cells and seeds both have.

    Parameters
    ----------
    frozen, lora : DataFrame
        Per-seed reliability-profiles tables: :func:`frozen_profiles` (retention over the LoRA fractions)
        and :func:`lora_profiles`.
    frame : ReferenceFrame, optional
        Its anchors normalise both regimes; with it, :attr:`LoraComparison.crs_frozen_peers` is computed too.
    n_resamples, level, rng
        The seed bootstrap of the per-domain tau intervals (``rng``: an int or a Generator).

    Raises
    ------
    LoraError
        The two tables share no (encoder, dataset, seed).
    """
    from crsrepro.score.crs import aggregate_crs, crs_scores
    from crsrepro.score.stats import as_generator, rank_agreement, seed_weights

    on = ["encoder", "dataset", "seed"]
    common = frozen[on].merge(lora[on])
    if common.empty:
        raise LoraError("frozen and LoRA profiles share no (encoder, dataset, seed)")
    frozen, lora = frozen.merge(common), lora.merge(common)
    seeds = sorted(int(s) for s in common["seed"].unique())
    weights = seed_weights(as_generator(rng), n_resamples, len(seeds))  # one shared draw for every domain
    rows = []
    for dataset in dict.fromkeys(common["dataset"]):
        by_seed = [t[t["dataset"] == dataset].pivot(index="encoder", columns="seed", values="auroc")
                   .reindex(columns=seeds) for t in (frozen, lora)]
        complete = by_seed[0].notna().all(axis=1) & by_seed[1].notna().all(axis=1)  # the draw needs every seed
        a, b = (t[complete] for t in by_seed)
        mean_a, mean_b = a.mean(axis=1), b.mean(axis=1)
        agreement = rank_agreement(mean_a.to_dict(), mean_b.to_dict()) if len(a) > 1 else None
        low, high = _tau_interval(a, b, weights, level) if agreement else (np.nan, np.nan)
        rows.append({"dataset": dataset, "n_encoders": len(a), "n_seeds": len(seeds),
                     "kendall_tau": agreement.kendall_tau if agreement else np.nan,
                     "tau_ci_low": low, "tau_ci_high": high,
                     "reversed_pairs": agreement.reversed_pairs if agreement else 0,
                     "leader_frozen": mean_a.idxmax(), "leader_lora": mean_b.idxmax(),
                     "leader_changed": mean_a.idxmax() != mean_b.idxmax(),
                     "auroc_gain": float((mean_b - mean_a).mean())})
    columns = on + ["auroc", "ece", "retention", "robustness"]
    crs_a = aggregate_crs(peer_scores(frozen[columns], frame))["crs"]
    crs_b = aggregate_crs(peer_scores(lora[columns], frame))["crs"]
    crs = rank_agreement(crs_a.to_dict(), crs_b.to_dict())
    frozen_peers = None
    if frame is not None:
        fixed_a = aggregate_crs(crs_scores(frozen[columns], frame))["crs"]
        fixed_b = aggregate_crs(crs_scores(lora[columns], frame))["crs"]
        frozen_peers = rank_agreement(fixed_a.to_dict(), fixed_b.to_dict())
    movers = crs.ranks.assign(abs_shift=crs.ranks["shift"].abs()).sort_values("abs_shift", ascending=False, kind="stable")
    return LoraComparison(pd.DataFrame(rows), crs, frozen_peers, movers.drop(columns="abs_shift"),
                          crs.top3_overlap == 1.0, seeds)


__all__ = ["LoraComparison", "N_RESAMPLES", "compare", "early_stopping_summary", "fine_tunes", "frozen_profiles",
           "lora_fractions", "lora_profiles", "peer_scores"]
