"""Frozen vs LoRA: the LoRA grid's analyses (chapter 07; DESIGN.md section 11).

:func:`lora_profiles` turns the LoRA grid's tidy rows (:class:`crsrepro.run.lora.LoraStage`) into the four
dimensions of every (encoder, dataset, seed); :func:`compare` sets the LoRA ranking against the frozen one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from crsrepro.core.schema import LORA
from crsrepro.run.lora import LoraError
from crsrepro.run.results import runs_table
from crsrepro.score.dimensions import reliability_profiles


def lora_profiles(results: pd.DataFrame) -> pd.DataFrame:
    """The four dimensions of every LoRA (encoder, dataset, seed): the primary protocol's, on the rows of
    regime ``lora``."""
    return reliability_profiles(runs_table(results), regime=LORA)


@dataclass(frozen=True)
class LoraComparison:
    """Frozen vs LoRA (chapter 07).

    Attributes
    ----------
    per_domain : DataFrame
        Per dataset: ``n_encoders``, ``kendall_tau`` of the AUROC rankings, ``reversed_pairs``,
        ``leader_frozen``, ``leader_lora``, ``leader_changed``, ``auroc_gain`` (mean LoRA - frozen).
    crs : RankAgreement
        The four-dimensional comparison: the encoders' mean CRS, frozen (``a``) vs LoRA (``b``); its
        ``ranks`` feed :func:`crsrepro.present.plots.rank_shift` (``a="frozen", b="LoRA"``).
    movers : DataFrame
        ``crs.ranks`` sorted by the size of the shift (who moves most).
    top3_hold : bool
        Whether the top three by CRS are the same encoders.
    """

    per_domain: pd.DataFrame
    crs: object
    movers: pd.DataFrame
    top3_hold: bool


def compare(frozen: pd.DataFrame, lora: pd.DataFrame, frame=None) -> LoraComparison:
    """Compare the frozen and LoRA reliability profiles on the cells and seeds both have.

    Parameters
    ----------
    frozen, lora : DataFrame
        Per-seed reliability-profiles tables (:func:`crsrepro.score.dimensions.reliability_profiles`, :func:`lora_profiles`).
    frame : ReferenceFrame, optional
        Score both with the frozen frame (the paper's CRS); default [ours] ``mode="cohort"`` over the
        compared encoders, since the LoRA panel may be smaller than the frame's.

    Raises
    ------
    LoraError
        The two tables share no (encoder, dataset, seed).
    """
    from crsrepro.score.crs import aggregate_crs, crs_scores
    from crsrepro.score.stats import rank_agreement

    on = ["encoder", "dataset", "seed"]
    common = frozen[on].merge(lora[on])
    if common.empty:
        raise LoraError("frozen and LoRA profiles share no (encoder, dataset, seed)")
    frozen, lora = frozen.merge(common), lora.merge(common)
    rows = []
    for dataset in dict.fromkeys(common["dataset"]):
        a = frozen[frozen["dataset"] == dataset].groupby("encoder")["auroc"].mean()
        b = lora[lora["dataset"] == dataset].groupby("encoder")["auroc"].mean()
        agreement = rank_agreement(a.to_dict(), b.to_dict()) if len(a) > 1 else None
        rows.append({"dataset": dataset, "n_encoders": len(a),
                     "kendall_tau": agreement.kendall_tau if agreement else np.nan,
                     "reversed_pairs": agreement.reversed_pairs if agreement else 0,
                     "leader_frozen": a.idxmax(), "leader_lora": b.idxmax(), "leader_changed": a.idxmax() != b.idxmax(),
                     "auroc_gain": float((b - a).mean())})
    mode = "cohort" if frame is None else "fixed"
    columns = on + ["auroc", "ece", "retention", "robustness"]
    crs_a = aggregate_crs(crs_scores(frozen[columns], frame, mode=mode))["crs"]
    crs_b = aggregate_crs(crs_scores(lora[columns], frame, mode=mode))["crs"]
    crs = rank_agreement(crs_a.to_dict(), crs_b.to_dict())
    movers = crs.ranks.assign(abs_shift=crs.ranks["shift"].abs()).sort_values("abs_shift", ascending=False, kind="stable")
    return LoraComparison(pd.DataFrame(rows), crs, movers.drop(columns="abs_shift"), crs.top3_overlap == 1.0)


__all__ = ["LoraComparison", "compare", "lora_profiles"]
