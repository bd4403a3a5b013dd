"""Layer-depth sweeps: linear probes on the 25 / 50 / 75 / 100 % taps (DESIGN.md section 11, issue 13).

The paper's primary protocol probes the final layer; its sharpest self-criticism is that intermediate
layers often do better (5 of 8 sweeps; RAD-DINO best near 50 % depth, DINOv2 at 75 %). This module
measures that on a profile's (encoder, dataset) *pairs*.

For each pair and seed, the linear probe of the run grid (:class:`crsrepro.run.grid._Unit`: the seed's own
train / val split, its label subsets and the same C selection) is fitted on the
features of each depth tap, all taken in the forward pass that gives the ``final`` features and cached
like them (:func:`crsrepro.extract.features.extract_features`). Its rows go, in the tidy schema of
:mod:`crsrepro.run.results` with ``layer`` set to the tap, to a separate :class:`~crsrepro.run.results.ResultStore`
at ``<output_dir>/depth/``; each row-set's key is the grid unit's key (which names the tap's feature
keys) wrapped with the stage and the layer. Besides the grid's metrics, the clean rows carry
``val_auroc``: the probe's AUROC on the seed's val split, the only number a depth may be *chosen* on.
The sweep scores no recalibrator [ours]: the four dimensions use the probe's own probabilities, and the
recalibrators (with their cross-validated choice inside val) were most of its CPU time.

The taps: ``depth25/50/75`` and ``depth100`` (the last block's tokens, pooled like the other depth
taps: the like-for-like 100 % point). An encoder without a ``depth100`` tap (the demo networks, whose
``final`` *is* the pooled last stage, :data:`crsrepro.encoders.registry.NETWORK_TAPS`) has ``final``
at depth 100. ``final`` is always swept too: the primary protocol's row, for comparison.

Analyses (chapter 06): :func:`best_depths`, :func:`intermediate_wins`, :func:`paired_test` and
:func:`val_selected_ranking`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core import __version__
from crsrepro.score.dimensions import reliability_profiles
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import content_key, git_hash
from crsrepro.profiles import Profile
from crsrepro.run.results import ResultStore, runs_table
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION

log = logging.getLogger(__name__)

DEPTHS = {"depth25": 25, "depth50": 50, "depth75": 75, "depth100": 100}
"""The depth taps and their depth in % of the network."""

PAPER_PAIRS = [
    ("specialist.rad_dino", "chexpert"), ("specialist.rad_dino", "isic2019"),
    ("general.dinov2", "chexpert"), ("general.dinov2", "isic2019"), ("general.dinov2", "aptos2019"),
    ("general.vit_b16", "isic2019"), ("medical.biomedclip", "chexpert"), ("specialist.retfound", "aptos2019"),
]
"""[ours] The paper sweeps 8 (encoder, dataset) pairs and names RAD-DINO and DINOv2 among them, not the
rest. Ours: RAD-DINO on its own domain and off it, DINOv2 on all three datasets (the paper's "DINOv2
prefers 75 %"), the supervised ViT-B/16 baseline, a CLIP-style medical encoder (BiomedCLIP, whose
``final`` is a projection, so its ``depth100`` differs from it) and the fundus specialist RETFound."""

STAGE = "depth"
PROFILE_COLUMNS = ["encoder", "family", "dataset", "seed", "layer", "depth", "auroc", "ece", "retention",
                   "robustness", "val_auroc"]


class DepthError(CrsreproError, ValueError):
    """A depth sweep was asked for an encoder without depth taps, or a table lacks what it needs."""


def taps(spec) -> list[str]:
    """The layers swept for an encoder: its depth taps, then ``final``.

    >>> from crsrepro.encoders import get_spec
    >>> taps(get_spec("demo.random_cnn")), taps(get_spec("general.dinov2"))[-2:]
    (['depth25', 'depth50', 'depth75', 'final'], ['depth100', 'final'])
    """
    return [t for t in DEPTHS if t in spec.layer_taps] + ["final"]


def tap_depth(spec, layer: str) -> float:
    """The depth (%) of ``layer``: :data:`DEPTHS`, and 100 for ``final`` when the encoder has no
    ``depth100`` tap (its final features are the pooled last block); NaN for a ``final`` that is a
    projection beside a ``depth100`` tap."""
    if layer in DEPTHS:
        return float(DEPTHS[layer])
    return np.nan if "depth100" in spec.layer_taps else 100.0


def default_pairs(profile: Profile) -> list[tuple[str, str]]:
    """The pairs a profile sweeps: :data:`PAPER_PAIRS` for the paper's panel; otherwise every cell of an
    encoder with depth taps (the demo and smoke profiles: every demo network on every dataset)."""
    from crsrepro.encoders import get_spec
    from crsrepro.run.grid import cells

    if profile.name == "paper":
        return list(PAPER_PAIRS)
    return [(e, d) for e, d in cells(profile) if len(taps(get_spec(e))) > 1]


def _tap_features(feats_by_layer: dict, layer: str) -> dict:
    """The grid's feats dict (``{"pool": X, "test": {condition: X}, <transfer>: X}``) for one tap."""
    return {name: ({c: a[layer] for c, a in value.items()} if name == "test" else value[layer])
            for name, value in feats_by_layer.items()}


def _tap_keys(encoder, requests: dict, layer: str) -> dict[str, dict[str, str]]:
    """The grid's ``{request: {condition: feature key}}`` for one tap."""
    from crsrepro.extract.features import feature_keys

    return {name: {c: key for (c, _), key in feature_keys(encoder, r.images, dataset=r.dataset, images_key=r.images_key,
                                                          conditions=r.conditions, layers=(layer,),
                                                          canonical_size=r.canonical_size).items()}
            for name, r in requests.items()}


def _unit_rows(unit, feats: dict, layer: str) -> pd.DataFrame:
    """The grid unit's rows on one tap, with ``layer`` set and the val AUROC of each fraction's probe."""
    from crsrepro.run.grid import _score

    rows, cases = [], {}
    for fraction, probe in unit._fit(feats).items():
        scored = unit._scored(fraction, probe, feats, cases, recalibrate=False)
        val = _score(unit.view.task, unit.val.labels, probe.predict_proba(feats["pool"][unit.val_rows]))["auroc"]
        clean = next(r for r in scored if r["condition"] == CLEAN and r["recalibrator"] == NO_RECALIBRATION)
        rows += scored + [{**clean, "metric": "val_auroc", "value": float(val)}]
    return pd.DataFrame(rows).assign(layer=layer)


def sweep(profile: Profile | str, pairs: list[tuple[str, str]] | None = None, *, output_dir: Path | None = None,
          manifest_dir: Path | None = None, progress: bool = False, merge: bool = True) -> pd.DataFrame | None:
    """Run the depth sweep of ``pairs`` (default :func:`default_pairs`) and return its profiles.

    Row-sets already in ``<output_dir>/depth/`` are reused; the merged tidy table is written to
    ``<output_dir>/depth/results.parquet``.

    Parameters
    ----------
    profile : Profile or str
    pairs : list of (encoder id, dataset), optional
    output_dir : path, optional
        The profile's results folder (default: its ``output_dir``); the sweep writes under ``depth/``.
    manifest_dir : path, optional
        Where the split manifests live.
    progress : bool
        Show progress bars.
    merge : bool, default True
        Merge the row-sets into ``results.parquet`` and return the profiles. False only writes the
        row-sets and returns None: for tasks that run in parallel (the book's precompute step), which
        must not all rewrite one merged file while the others read it.

    Returns
    -------
    DataFrame or None
        :func:`depth_profiles` of the merged rows: one row per (encoder, dataset, seed, layer).

    Raises
    ------
    DepthError
        A pair's encoder has no depth taps, or its dataset is not in the profile.
    """
    import torch

    from crsrepro.encoders import get_spec
    from crsrepro.run.grid import _as_profile, _encoder, _feature_requests, _features, _Unit, _view

    profile = _as_profile(profile)
    pairs = default_pairs(profile) if pairs is None else list(pairs)
    for encoder_id, dataset in pairs:
        if len(taps(get_spec(encoder_id))) < 2:
            raise DepthError(f"depth pair ({encoder_id}, {dataset}): {encoder_id} has no depth taps "
                             f"(its layer_taps are {list(get_spec(encoder_id).layer_taps)})")
        if dataset not in profile.datasets:
            raise DepthError(f"depth pair ({encoder_id}, {dataset}): {dataset} is not among profile "
                             f"{profile.name!r}'s datasets {profile.datasets}")
    store = ResultStore(Path(output_dir or profile.output_path) / STAGE)
    provenance = {"crsrepro": __version__, "git": git_hash()}
    keys = []
    for encoder_id, dataset in pairs:
        view, spec = _view(profile, dataset, manifest_dir), get_spec(encoder_id)
        encoder = _encoder(encoder_id, None, profile.features.device)
        requests, layers = _feature_requests(profile, view), taps(spec)
        units = [_Unit(profile, spec, view, seed, LINEAR) for seed in profile.seeds]
        todo = []
        for layer in layers:
            tap_keys = _tap_keys(encoder, requests, layer)
            for unit in units:
                key = content_key(stage=STAGE, layer=layer, unit=unit.key(tap_keys), metrics=["val_auroc"],
                                  recalibrators=[])
                keys.append(key)
                if not store.has(key):
                    todo.append((layer, unit, key))
        if not todo:
            continue
        feats = _features(profile, encoder, requests, progress, layers=tuple(layers))
        threads = torch.get_num_threads()
        torch.set_num_threads(profile.probe.num_threads)
        try:
            for layer, unit, key in todo:
                rows = _unit_rows(unit, _tap_features(feats, layer), layer).assign(rowset=key)
                rows.attrs = {**provenance, "key": key, "weights": encoder.weights_hash}
                store.write(key, rows)
                log.info("depth: wrote %s %s seed %d %s (%d rows)", encoder_id, dataset, unit.seed, layer, len(rows))
        finally:
            torch.set_num_threads(threads)
    if not merge:
        return None
    results = store.merge(keys, attrs={"profile": profile.name, "profile_fingerprint": profile.fingerprint()})
    return depth_profiles(results)


def depth_profiles(results: pd.DataFrame) -> pd.DataFrame:
    """The four dimensions of every (encoder, dataset, seed, layer) of a depth sweep's tidy rows.

    Each layer's rows are scored by :func:`crsrepro.score.dimensions.reliability_profiles` as if they were
    the primary ones; ``depth`` is :func:`tap_depth` and ``val_auroc`` the clean full-label probe's val AUROC.
    """
    from crsrepro.encoders import get_spec

    if results.empty:
        raise DepthError("depth sweep: the results table has no rows")
    runs = runs_table(results)
    runs = runs[(runs["probe"] == LINEAR) & (runs["recalibrator"] == NO_RECALIBRATION)]
    parts = []
    for layer, rows in runs.groupby("layer", sort=False):
        profiles = reliability_profiles(rows.assign(layer="final"))
        val = rows[(rows["condition"] == CLEAN) & (rows["label_fraction"] == 1.0)]
        profiles = profiles.merge(val[["encoder", "dataset", "seed", "val_auroc"]], on=["encoder", "dataset", "seed"])
        parts.append(profiles.assign(layer=layer))
    table = pd.concat(parts, ignore_index=True)
    table["depth"] = [tap_depth(get_spec(e), layer) for e, layer in zip(table["encoder"], table["layer"])]
    order = {t: i for i, t in enumerate([*DEPTHS, "final"])}
    table = table.iloc[np.lexsort((table["layer"].map(order), table["seed"], table["dataset"], table["encoder"]))]
    return table[[c for c in PROFILE_COLUMNS if c in table.columns]].reset_index(drop=True)


# --------------------------------------------------------------------------- analyses

def curve(table: pd.DataFrame) -> pd.DataFrame:
    """The rows on the depth axis (depth 25 ... 100), for :func:`crsrepro.present.plots.depth_curves`."""
    return table[table["depth"].notna()].reset_index(drop=True)


def best_depths(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair, the depth of the best seed-mean clean AUROC, and its gain over the 100 % tap.

    Returns
    -------
    DataFrame
        One row per (encoder, dataset): ``best_depth``, ``best_auroc``, ``auroc_100``, ``gain``
        (best - 100 %, in AUROC units), ``auroc_final`` (the primary protocol's) and ``n_seeds``.
    """
    on_axis = curve(table)
    means = on_axis.groupby(["encoder", "dataset", "depth"])["auroc"].mean().reset_index()
    rows = []
    for (encoder, dataset), pair in means.groupby(["encoder", "dataset"], sort=True):
        best = pair.loc[pair["auroc"].idxmax()]
        at_100 = pair.loc[pair["depth"] == 100, "auroc"]
        if at_100.empty:
            raise DepthError(f"depth sweep: {encoder} on {dataset} has no 100 % tap")
        final = table[(table["encoder"] == encoder) & (table["dataset"] == dataset) & (table["layer"] == "final")]
        rows.append({"encoder": encoder, "dataset": dataset, "best_depth": int(best["depth"]),
                     "best_auroc": best["auroc"], "auroc_100": float(at_100.iloc[0]),
                     "gain": best["auroc"] - float(at_100.iloc[0]), "auroc_final": final["auroc"].mean(),
                     "n_seeds": on_axis.loc[(on_axis["encoder"] == encoder) & (on_axis["dataset"] == dataset), "seed"].nunique()})
    return pd.DataFrame(rows)


def intermediate_wins(table: pd.DataFrame) -> tuple[int, int]:
    """``(pairs whose best depth is below 100 %, pairs)``: the paper's "5 of 8"."""
    best = best_depths(table)
    return int((best["best_depth"] < 100).sum()), len(best)


def paired_test(table: pd.DataFrame) -> pd.DataFrame:
    """Best intermediate tap vs the 100 % tap, paired across seeds, per pair.

    The best intermediate tap is the one of the best seed-mean clean AUROC among 25 / 50 / 75 %. The
    test is a two-sided paired t-test over seeds of the AUROC differences [ours: with 5 seeds a
    Wilcoxon signed-rank test cannot go below p = 0.0625, so it could never reject at 5 %; the
    paired t assumes roughly normal seed differences]. NaN where fewer than two seeds.

    Returns
    -------
    DataFrame
        ``encoder, dataset, depth`` (the best intermediate), ``mean_diff``, ``sd_diff``, ``t``, ``p``, ``n_seeds``.
    """
    from scipy.stats import ttest_rel

    on_axis = curve(table)
    rows = []
    for (encoder, dataset), pair in on_axis.groupby(["encoder", "dataset"], sort=True):
        wide = pair.pivot_table(index="seed", columns="depth", values="auroc")
        inner = [d for d in wide.columns if d < 100]
        if not inner or 100 not in wide.columns:
            raise DepthError(f"depth sweep: {encoder} on {dataset} lacks an intermediate or the 100 % tap")
        depth = wide[inner].mean().idxmax()
        diff = (wide[depth] - wide[100]).dropna()
        t, p = ttest_rel(wide.loc[diff.index, depth], wide.loc[diff.index, 100]) if len(diff) > 1 else (np.nan, np.nan)
        rows.append({"encoder": encoder, "dataset": dataset, "depth": int(depth), "mean_diff": diff.mean(),
                     "sd_diff": diff.std(ddof=1) if len(diff) > 1 else np.nan, "t": float(t), "p": float(p),
                     "n_seeds": len(diff)})
    return pd.DataFrame(rows)


def val_choices(table: pd.DataFrame) -> pd.DataFrame:
    """Per (encoder, dataset, seed), the profile of the layer with the best *val* AUROC (never test)."""
    best = table.loc[table.groupby(["encoder", "dataset", "seed"])["val_auroc"].idxmax()]
    return best.reset_index(drop=True)


def val_selected_ranking(table: pd.DataFrame, frame=None):
    """What choosing each cell's depth on val would change in the CRS ranking of the swept encoders.

    The CRS of the final-layer profiles is compared with that of the val-chosen layers' profiles, by
    :func:`crsrepro.score.stats.rank_agreement` of the encoders' mean CRS.

    Parameters
    ----------
    table : DataFrame
        :func:`sweep`'s output.
    frame : ReferenceFrame, optional
        Score with the frozen frame (the paper's CRS); default [ours]: ``mode="cohort"`` over the swept
        encoders, since a sweep need not cover the frame's panel.

    Returns
    -------
    (RankAgreement, DataFrame)
        The agreement (``a`` = final layer, ``b`` = val-chosen depth) and the chosen layer per cell and seed.
    """
    from crsrepro.score.crs import aggregate_crs, crs_scores
    from crsrepro.score.stats import rank_agreement

    columns = ["encoder", "dataset", "seed", "auroc", "ece", "retention", "robustness"]
    mode = "cohort" if frame is None else "fixed"
    final = table[table["layer"] == "final"][columns]
    chosen = val_choices(table)
    a = aggregate_crs(crs_scores(final, frame, mode=mode))["crs"]
    b = aggregate_crs(crs_scores(chosen[columns], frame, mode=mode))["crs"]
    return rank_agreement(a.to_dict(), b.to_dict()), chosen[["encoder", "dataset", "seed", "layer", "val_auroc", "auroc"]]


__all__ = ["DEPTHS", "PAPER_PAIRS", "DepthError", "best_depths", "curve", "default_pairs", "depth_profiles",
           "intermediate_wins", "paired_test", "sweep", "tap_depth", "taps", "val_choices", "val_selected_ranking"]
