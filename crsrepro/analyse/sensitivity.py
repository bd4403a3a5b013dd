"""How much of the ranking is the protocol? The multiverse of the [ours] choices (DESIGN.md section 14).

The CRS rests on choices the paper does not publish (DESIGN.md sections 8 and 9): the normalisation
anchors, the proximity formula, the R_raw aggregate, weak or strict dominance, the multi-label ECE,
the weights, the C budget. :func:`load_space` reads the declared alternatives
(``crsrepro/analyse/sensitivity_space.yaml``, each choice a small documented set whose first level is the
package's own), :func:`multiverse` recomputes the scores and rankings of every combination from the
stored results, and :func:`conclusions` says, for each conclusion of the paper that depends on the
CRS, in what share of the multiverse it holds for this run.

How a combination is scored
---------------------------
- The raw dimensions are rebuilt once per (R_raw aggregate, multi-label ECE, C budget) from the runs
  table (:func:`crsrepro.score.dimensions.reliability_profiles`); no probe is refitted and no feature is
  extracted. The multi-label ECE only changes the multi-label datasets (CheXpert).
- Every combination is scored by the CRS's own code, :mod:`crsrepro.score.crs`, with its [ours]
  choices as arguments; nothing of the score is re-implemented here.
- ``anchors: fixed`` normalises with the frozen frame's anchors (:func:`crsrepro.score.crs.normalise`)
  and scores against the frame's frozen peer profiles, as the book's CRS does; when the raw
  dimensions are not the default ones the peers are the run's own profiles normalised with the
  frame's anchors (a frame re-frozen from them). ``minmax`` and ``zscore`` re-normalise against the
  current panel, dataset by dataset (:func:`crsrepro.score.crs.cohort_normalise`), and count
  dominance within it (``peers="panel"`` of :func:`crsrepro.score.crs.score_by_dataset`): they are
  *cohort-style* scores (the paper's insertion experiment shows what that costs), offered as
  alternatives, not as a recommendation.
- Every level of every other choice is an array axis: one pass computes all combinations at once
  (numpy broadcasting over combinations, replicates, cells and peers).
- The combination of first levels reproduces ``analysis.scores["crs"]`` and
  ``analysis.aggregate["crs"]`` bit for bit (``tests/test_sensitivity.py``): the same functions, and
  the encoder means of :func:`crsrepro.score.crs.aggregate_crs` (:func:`crsrepro.score.crs.encoder_means`).
- ``P(rank 1)`` comes from a seed bootstrap inside each combination: ``n_resamples`` (default 200
  **[ours]**, cheap and enough for a share to 0.05) draws of the seeds with replacement, shared by
  every combination (common random numbers, so differences between combinations are not draw noise),
  each replicate scored against its own resampled peers as in :func:`crsrepro.score.stats.seed_paired_bootstrap`.
- The external-validity rho is :func:`crsrepro.analyse.findings.external_validity` under each combination:
  the profiles are rebuilt without the transfer drop, scored against the panel itself, and the
  encoders' aggregate CRS is compared (Spearman) with their transfer AUROC. Kendall tau, the reversed
  pairs and Spearman rho come from :func:`crsrepro.score.stats.rank_correlations`, the core of
  :func:`crsrepro.score.stats.rank_agreement`.

Examples
--------
>>> from crsrepro.analyse.run_analysis import RunAnalysis           # doctest: +SKIP
>>> analysis = RunAnalysis.load("demo")                  # doctest: +SKIP
>>> table = multiverse(analysis, load_space())           # doctest: +SKIP
>>> conclusions(table, analysis)                         # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from crsrepro.core.errors import CrsreproError
from crsrepro.core.metrics import chance_corrected_retention, label_efficiency_retention, robustness_raw
from crsrepro.data import get_dataset_spec
from crsrepro.score.crs import (COHORT_NORMALISATIONS, COMPONENTS, DIMENSIONS, DOMINANCE, PROXIMITY, cell_means,
                                cohort_normalise, encoder_means, normalise, proximity_to_ideal, score_by_dataset,
                                weighted_crs)
from crsrepro.score.dimensions import ProfileTableError, reliability_profiles
from crsrepro.score.stats import as_generator, per_seed_array, rank_correlations, seed_weights

logger = logging.getLogger(__name__)

SPACE_PATH = Path(__file__).parent / "sensitivity_space.yaml"
"""The shipped sensitivity space."""

LEVELS = {
    "anchors": ("fixed", *COHORT_NORMALISATIONS),
    "anchor_values": ("frozen",),  # and "<dimension>=<value>": see ANCHOR_VALUE
    "proximity": PROXIMITY,
    "robustness": ("mean_max", "mean", "worst"),
    "retention": ("ratio", "chance_corrected"),
    "dominance": DOMINANCE,
    "multilabel_ece": ("top_label", "classwise"),
    "seed_averaging": ("profiles", "scores"),
    "c_budget": ("nested_val", "full_val"),
}
"""Every level a choice may take; the first is the package's own (documented in the space file). The
normalisations, proximities and dominances are those :mod:`crsrepro.score.crs` implements."""
CHOICES = ("anchors", "anchor_values", "proximity", "robustness", "retention", "dominance", "multilabel_ece",
           "seed_averaging", "weights", "c_budget")
"""The choices of the space, in the order of the table's columns."""
ANCHOR_VALUE = re.compile(r"^(auroc|ece|retention|robustness)=(\d+(?:\.\d+)?)$")
"""A non-default level of ``anchor_values``: one dimension's worst-end anchor (the value mapped to 0)
moved to another value, under ``anchors: fixed``."""
RETENTION = {"ratio": label_efficiency_retention, "chance_corrected": chance_corrected_retention}
"""L from a cell's ``{label fraction: clean AUROC}``, per level of ``retention``."""
ROBUSTNESS = {"mean_max": robustness_raw,
              "mean": lambda drops: float(1.0 - np.mean(drops)),
              "worst": lambda drops: float(1.0 - np.max(drops))}
"""R_raw from a cell's AUROC drops, per level of ``robustness``."""
ECE_METRIC = {"top_label": "ece", "classwise": "classwise_ece"}
"""The runs-table column read as C of a multi-label dataset, per level of ``multilabel_ece``."""

ROBUST, FRAGILE = 0.90, 0.50
"""A conclusion holding in >= 90 % of the multiverse is *robust*, in < 50 % *fragile* **[ours]**."""
TAU_TOLERANCE = 0.10
"""Kendall tau "holds" within this distance of the default's **[ours]**."""
REVERSAL_TOLERANCE = 0.25
"""Reversed pairs "hold" within this share of the default's count (at least 1) **[ours]**."""
N_MOVES = 4
"""How many rank moves (the largest |rank_AUROC - rank_CRS| of the default) are followed, as the paper names four."""


class SensitivityError(CrsreproError, ValueError):
    """A sensitivity-space file has an unknown or missing key or a bad value, or a table lacks its default."""


# --------------------------------------------------------------------------- the space

@dataclass(frozen=True)
class Space:
    """A validated sensitivity space (:func:`load_space`).

    Attributes
    ----------
    levels : dict
        ``{choice: tuple of levels}`` for every choice but ``weights``; the first level is the default.
    weights : tuple of (pareto, proximity, worst)
        The weight grid, the default first.
    requires : dict
        ``{choice: text}``: what a choice's non-default levels need (``c_budget``).
    path : Path
    """

    levels: dict
    weights: tuple
    requires: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def size(self) -> int:
        """The number of declared combinations (before levels without rows are skipped); ``anchor_values``
        moves only under ``anchors: fixed``."""
        others = [len(v) for k, v in self.levels.items() if k not in ("anchors", "anchor_values")]
        return len(_anchor_pairs(self)) * int(np.prod(others)) * len(self.weights)


def _weight_grid(default, step, radius) -> tuple:
    """The simplex points on a ``step`` lattice around ``default`` with every weight within ``radius`` of it."""
    reach = int(np.floor(radius / step + 1e-9))
    grid = [tuple(default)]
    for i, j in itertools.product(range(-reach, reach + 1), repeat=2):
        w = (round(default[0] + i * step, 10), round(default[1] + j * step, 10),
             round(default[2] - (i + j) * step, 10))
        if (i, j) != (0, 0) and abs(i + j) <= reach and min(w) >= 0:
            grid.append(w)
    return tuple(grid)


def load_space(path: str | Path | None = None) -> Space:
    """Read and validate a sensitivity space (default: the shipped ``crsrepro/analyse/sensitivity_space.yaml``).

    Raises
    ------
    SensitivityError
        An unknown or missing key, an unknown level, a first level that is not the package's own,
        or bad weights; the message names the file and the key.
    """
    path = Path(path) if path is not None else SPACE_PATH
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SensitivityError(f"{path}: cannot read the sensitivity space ({error})") from error
    if not isinstance(data, dict):
        raise SensitivityError(f"{path}: the sensitivity space must be a mapping of choices")
    for key in data:
        if key not in CHOICES:
            raise SensitivityError(f"{path}: unknown key {key!r} (choices: {', '.join(CHOICES)})")
    for key in CHOICES:
        if not isinstance(data.get(key), dict):
            raise SensitivityError(f"{path}: key {key!r} is missing or not a mapping")
    levels, requires = {}, {}
    for choice, allowed in LEVELS.items():
        entry = data[choice]
        for key in entry:
            if key not in ("levels", "requires"):
                raise SensitivityError(f"{path}: unknown key {choice}.{key} (expected levels, requires)")
        values = entry.get("levels")
        if not isinstance(values, list) or not values or len(set(values)) != len(values):
            raise SensitivityError(f"{path}: {choice}.levels must be a non-empty list without repeats")
        for value in values:
            if value not in allowed and not (choice == "anchor_values" and ANCHOR_VALUE.match(str(value))):
                also = " or <dimension>=<value>" if choice == "anchor_values" else ""
                raise SensitivityError(f"{path}: {choice}.levels: unknown level {value!r} (one of {', '.join(allowed)}{also})")
        if values[0] != allowed[0]:
            raise SensitivityError(f"{path}: {choice}.levels must start with the package's own choice {allowed[0]!r}")
        levels[choice] = tuple(values)
        if "requires" in entry:
            requires[choice] = str(entry["requires"])
    weights = data["weights"]
    for key in weights:
        if key not in ("default", "step", "radius"):
            raise SensitivityError(f"{path}: unknown key weights.{key} (expected default, step, radius)")
    default, step, radius = weights.get("default"), weights.get("step"), weights.get("radius")
    if (not isinstance(default, list) or len(default) != 3 or not all(isinstance(w, (int, float)) and w >= 0
                                                                      for w in default)
            or abs(sum(default) - 1) > 1e-9):
        raise SensitivityError(f"{path}: weights.default must be three non-negative numbers summing to 1")
    if not (isinstance(step, (int, float)) and step > 0 and isinstance(radius, (int, float)) and radius >= 0):
        raise SensitivityError(f"{path}: weights.step must be positive and weights.radius non-negative")
    return Space(levels=levels, weights=_weight_grid([float(w) for w in default], float(step), float(radius)),
                 requires=requires, path=path)


# --------------------------------------------------------------------------- the raw dimensions

def _runs_with_budget(analysis, level: str):
    """The runs under C budget ``level``: the run's own for its profile's ``probe.c_selection``; for
    ``full_val`` on a ``nested_val`` run, :func:`_runs_with_full_val`; None when the runs hold neither."""
    from crsrepro.run.units import FULL_VAL_AUROC

    runs = analysis.runs
    if level == analysis.profile.probe.c_selection:
        return runs
    if level == "full_val" and FULL_VAL_AUROC in runs.columns:
        return _runs_with_full_val(runs)
    return None


def _runs_with_full_val(runs):
    """The runs with each smaller fraction's clean AUROC replaced by the one whose C was chosen on the
    whole val split (:data:`crsrepro.run.units.FULL_VAL_AUROC`, computed by the grid from the same solve)."""
    from crsrepro.run.units import FULL_VAL_AUROC

    chosen = runs[FULL_VAL_AUROC].notna()
    return runs.assign(auroc=runs["auroc"].where(~chosen, runs[FULL_VAL_AUROC]))


def _variant_profiles(runs, robustness: str, ece: str, retention: str, *, include_transfer: bool):
    """Per-seed reliability profiles under one R_raw aggregate, one multi-label ECE and one retention."""
    profiles = reliability_profiles(runs, include_transfer=include_transfer, robustness=ROBUSTNESS[robustness],
                                    retention=RETENTION[retention])
    if ece != "top_label":
        other = reliability_profiles(runs, include_transfer=include_transfer, ece_metric=ECE_METRIC[ece])
        multilabel = profiles["dataset"].map(lambda d: get_dataset_spec(d).task == "multilabel").to_numpy()
        profiles = profiles.assign(ece=np.where(multilabel, other["ece"].to_numpy(), profiles["ece"].to_numpy()))
    return profiles


# --------------------------------------------------------------------------- scoring every level at once

def _anchor_pairs(space: Space) -> list[tuple[str, str]]:
    """The (anchors, anchor_values) levels that differ: each anchors level with the frozen values, and
    ``fixed`` with each moved value (the values mean nothing to the cohort normalisations)."""
    pairs = [(a, "frozen") for a in space.levels["anchors"]]
    if "fixed" in space.levels["anchors"]:
        pairs += [("fixed", v) for v in space.levels["anchor_values"][1:]]
    return pairs


def moved_anchors(anchors: dict, level: str) -> dict:
    """The frame's ``anchors`` with one worst-end anchor moved (an ``anchor_values`` level).

    >>> moved_anchors({"auroc": (0.5, 1.0), "ece": (0.25, 0.0)}, "ece=0.15")
    {'auroc': (0.5, 1.0), 'ece': (0.15, 0.0)}
    """
    if level == "frozen":
        return anchors
    dimension, value = ANCHOR_VALUE.match(level).groups()
    return {**anchors, dimension: (float(value), anchors[dimension][1])}


def _normalise_all(raw: np.ndarray, datasets: np.ndarray, pairs, frame) -> np.ndarray:
    """``raw`` (V, R, cells, 4) normalised under every (anchors, anchor_values) pair: (V, A, R, cells, 4)."""
    return np.stack([normalise(raw, moved_anchors(frame.anchors, v)) if a == "fixed"
                     else cohort_normalise(raw, datasets, a) for a, v in pairs], axis=1)


def _components(p: np.ndarray, cells: pd.DataFrame, space: Space, frozen=None) -> dict:
    """The components of every cell of ``p`` (..., cells, 4) under every level of the space:
    ``{dominance level: pareto, proximity level: proximity, "worst": worst}``, arrays (..., cells).

    Every cell is compared with the panel's other encoders on its dataset, replicate by replicate
    (:func:`crsrepro.score.crs.score_by_dataset`, ``peers="panel"``); ``frozen`` optionally gives
    ``(index, frame)``: the cells of ``p[index]`` (one replicate) are scored against the frame's frozen
    reference profiles instead, as the book's CRS is.
    """
    parts = {}
    for level in space.levels["dominance"]:
        scored = score_by_dataset(cells, p, peers="panel", dominance=level)
        if frozen is not None:
            index, frame = frozen
            scored["pareto"][index] = score_by_dataset(cells, p[index], frame, dominance=level)["pareto"]
        parts[level], parts["worst"] = scored["pareto"], scored["worst"]
    for level in space.levels["proximity"]:
        parts[level] = proximity_to_ideal(p, level)
    return parts


def _crs(parts: dict, space: Space) -> np.ndarray:
    """The CRS (:func:`crsrepro.score.crs.weighted_crs`) for every dominance level, proximity level and
    weight of the space: array (dominance, proximity, weights, *shape of the parts)."""
    worst = parts["worst"]
    pareto = np.stack([parts[k] for k in space.levels["dominance"]])[:, None, None]
    proximity = np.stack([parts[k] for k in space.levels["proximity"]])[None, :, None]
    w = np.array(space.weights).T.reshape((3, 1, 1, len(space.weights)) + (1,) * worst.ndim)
    return weighted_crs({"pareto": pareto, "proximity": proximity, "worst": worst}, dict(zip(COMPONENTS, w)))


def _choices_first(values: np.ndarray) -> np.ndarray:
    """(D, P, K, V, A, ...) -> (V, A, D, P, K, ...): the axes in the order of the table's loop."""
    return np.moveaxis(values, (0, 1, 2), (2, 3, 4))


# --------------------------------------------------------------------------- the multiverse

def multiverse(analysis, space: Space | None = None, *, n_resamples: int = 200, rng=0) -> pd.DataFrame:
    """Scores and rankings of every combination of the space (see the module docstring).

    Parameters
    ----------
    analysis : crsrepro.analyse.run_analysis.RunAnalysis
        Its runs, per-seed reliability profiles and frozen frame are read; nothing is refitted.
    space : Space, optional
        Default :func:`load_space` ().
    n_resamples : int, default 200 **[ours]**
        Seed-bootstrap replicates per combination for ``p_rank1_leader`` and ``p_rank1_top``.
    rng : int or numpy Generator, default 0

    Returns
    -------
    DataFrame
        One row per combination: the choices (:data:`CHOICES`; ``weights`` as ``"0.60/0.25/0.15"``),
        ``is_default``, ``ranking`` (tuple of encoders, best first; ties broken by encoder id),
        ``leader``, ``top3`` (sorted tuple), ``auroc_ranking``, ``kendall_tau`` and
        ``reversed_pairs`` (against the AUROC order), ``p_rank1_leader``, ``p_rank1_top`` (the
        P(rank 1) of the combination's top three, as text), ``rho_crs`` and ``rho_auroc`` (external
        validity; NaN without transfer runs). ``attrs``: ``encoders``, ``cells`` (encoder, dataset),
        ``aggregate_crs`` (combinations x encoders), ``cell_crs`` (combinations x cells) and ``notes``
        (what was skipped, and why).
    """
    space = space or load_space()
    notes = []
    budgets = {}
    for level in space.levels["c_budget"]:
        runs = _runs_with_budget(analysis, level)
        if runs is None:
            notes.append(f"c_budget {level} skipped: it needs {space.requires.get('c_budget', 'rows computed with it')}, "
                         "and the runs table holds none")
        else:
            budgets[level] = runs
    eces = list(space.levels["multilabel_ece"])
    if "classwise" in eces and "classwise_ece" not in analysis.runs.columns:
        eces.remove("classwise")
        notes.append("multilabel_ece classwise skipped: the runs table has no classwise_ece metric")
    if tuple(space.weights[0]) != tuple(analysis.frame.weights[c] for c in ("pareto", "proximity", "worst")):
        notes.append(f"the frame's weights {analysis.frame.weights} differ from the space's default {space.weights[0]}: "
                     "no combination is the book's CRS")
    variants = [(c, r, e, t) for c in budgets for r in space.levels["robustness"] for e in eces
                for t in space.levels["retention"]]
    default_variant = (space.levels["c_budget"][0], "mean_max", "top_label", "ratio")

    def profiles_of(variant, include_transfer):
        if variant == default_variant and include_transfer and budgets[variant[0]] is analysis.runs:
            return analysis.reliability_profiles
        return _variant_profiles(budgets[variant[0]], *variant[1:], include_transfer=include_transfer)

    per_seed = [profiles_of(v, True) for v in variants]
    cells, seeds, _ = per_seed_array(per_seed[0])
    tables = [cell_means(t) for t in per_seed]
    if any(not t[["encoder", "dataset"]].equals(cells) for t in tables):
        raise SensitivityError("the variants of the reliability profiles cover different cells")
    means = np.stack([t[list(DIMENSIONS)].to_numpy(float) for t in tables])             # (V, cells, 4)
    seed_values = np.stack([per_seed_array(t)[2] for t in per_seed])                    # (V, cells, S, 4)
    draws = seed_weights(as_generator(rng), n_resamples, len(seeds))                    # (B, S)
    pairs = _anchor_pairs(space)
    datasets = cells["dataset"].to_numpy()
    frozen = None
    if default_variant in variants:  # the book's CRS: the frame's anchors and its frozen peers
        frozen = ((variants.index(default_variant), 0, 0), analysis.frame)
    point, boot = [], []
    for order in space.levels["seed_averaging"]:
        cell_crs, replicates = _scores(order, means, seed_values, draws, datasets, pairs, cells, space,
                                       analysis.frame, frozen if order == "profiles" else None)
        point.append(_choices_first(cell_crs))                                           # (V, A, D, P, K, cells)
        boot.append(replicates)                                                          # (D, P, K, V, A, B, E)
    point_cells = np.stack(point)                                                       # (O, V, A, D, P, K, cells)
    encoders, auroc = encoder_means(means[..., 0], cells["encoder"])                    # (V, E)
    aggregate = encoder_means(point_cells, cells["encoder"])[1]                          # (O, V, A, D, P, K, E)
    p_rank1 = np.stack([_choices_first((b.argmax(-1)[..., None] == np.arange(len(encoders))).mean(-2))
                        for b in boot])                                                  # (O, V, A, D, P, K, E)
    tau, _, reversed_pairs = rank_correlations(auroc[None, :, None, None, None, None], aggregate)
    rho_crs, rho_auroc = _external_validity(analysis, space, variants, budgets, profiles_of, pairs, notes)

    rows = []
    for index in np.ndindex(aggregate.shape[:-1]):
        o, v, a, d, q, k = index
        order = np.lexsort((encoders, -aggregate[index]))
        ranking = tuple(encoders[order])
        budget, robustness, ece, retention = variants[v]
        averaging = space.levels["seed_averaging"][o]
        rows.append({"anchors": pairs[a][0], "anchor_values": pairs[a][1], "proximity": space.levels["proximity"][q],
                     "robustness": robustness, "retention": retention, "dominance": space.levels["dominance"][d],
                     "multilabel_ece": ece, "seed_averaging": averaging,
                     "weights": "/".join(f"{w:.2f}" for w in space.weights[k]), "c_budget": budget,
                     "is_default": variants[v] == default_variant and o == a == d == q == k == 0,
                     "ranking": ranking, "leader": ranking[0], "top3": tuple(sorted(ranking[:3])),
                     "auroc_ranking": tuple(encoders[np.lexsort((encoders, -auroc[v]))]),
                     "kendall_tau": float(tau[index]), "reversed_pairs": int(reversed_pairs[index]),
                     "p_rank1_leader": float(p_rank1[index][order[0]]),
                     "p_rank1_top": ", ".join(f"{e} {p_rank1[index][i]:.2f}" for e, i in zip(ranking[:3], order[:3])),
                     "rho_crs": float(rho_crs[index]), "rho_auroc": float(rho_auroc[v])})
    table = pd.DataFrame(rows)
    table.attrs.update(encoders=list(encoders), cells=list(cells.itertuples(index=False, name=None)),
                       aggregate_crs=aggregate.reshape(len(table), len(encoders)),
                       cell_crs=point_cells.reshape(len(table), len(cells)), notes=notes)
    for note in notes:
        logger.info(note)
    logger.info("multiverse: %d combinations of %d declared, %d cells, %d replicates each",
                len(table), space.size, len(cells), n_resamples)
    return table


def _scores(order, means, seed_values, draws, datasets, pairs, cells, space, frame, frozen):
    """The cell CRS of every combination, (D, P, K, V, A, cells), and the encoders' aggregate CRS under
    every seed draw, (D, P, K, V, A, B, E), under one ``seed_averaging`` level:

    ``profiles``
        Each cell's raw profile is averaged over the seeds (each draw's weights), then normalised and
        scored: the book's CRS (``frozen``: its frozen peers for the default).
    ``scores``
        Each seed's profiles are normalised and scored against that seed's panel, then the CRS is
        averaged over the seeds.
    """
    if order == "profiles":
        # replicate 0 is the point estimate (the seed means), replicates 1..B the seed draws: (V, R, cells, 4)
        raw = np.concatenate([means[:, None], np.einsum("bs,vcsk->vbck", draws, seed_values)], axis=1)
        parts = _components(_normalise_all(raw, datasets, pairs, frame), cells, space, frozen=frozen)
        by_encoder = {k: encoder_means(v[..., 1:, :], cells["encoder"])[1] for k, v in parts.items()}
        return _crs({k: v[..., 0, :] for k, v in parts.items()}, space), _crs(by_encoder, space)
    raw = np.moveaxis(seed_values, 2, 1)                                                   # (V, S, cells, 4)
    crs = _crs(_components(_normalise_all(raw, datasets, pairs, frame), cells, space), space)  # (D, P, K, V, A, S, cells)
    per_seed = encoder_means(crs, cells["encoder"])[1]                                    # (D, P, K, V, A, S, E)
    return crs.mean(-2), np.einsum("bs,...se->...be", draws, per_seed)


def _external_validity(analysis, space, variants, budgets, profiles_of, pairs, notes):
    """rho(CRS without the transfer term, transfer AUROC) per combination (O, V, A, D, P, K), and
    rho(source AUROC, transfer AUROC) per variant; NaN (with a note) without transfer runs."""
    from crsrepro.analyse.findings import external_validity

    orders = space.levels["seed_averaging"]
    shape = (len(orders), len(variants), len(pairs), len(space.levels["dominance"]),
             len(space.levels["proximity"]), len(space.weights))
    try:
        reference = {level: external_validity(runs) for level, runs in budgets.items()}
    except ProfileTableError as error:
        notes.append(f"external validity skipped: {error}")
        return np.full(shape, np.nan), np.full(len(variants), np.nan)
    rho_crs, rho_auroc = np.empty(shape), np.empty(len(variants))
    for i, variant in enumerate(variants):
        table = reference[variant[0]].table
        profiles = profiles_of(variant, False)
        cells, _, values = per_seed_array(profiles)
        mean = cell_means(profiles)[list(DIMENSIONS)].to_numpy(float)
        for o, order in enumerate(orders):
            raw = mean[None, None] if order == "profiles" else np.moveaxis(values, 1, 0)[None]  # (1, R, cells, 4)
            p = _normalise_all(raw, cells["dataset"].to_numpy(), pairs, analysis.frame)[0]     # (A, R, cells, 4)
            crs = _crs(_components(p, cells, space), space).mean(-2)                          # (D, P, K, A, cells)
            names, by_encoder = encoder_means(np.moveaxis(crs, 3, 0), cells["encoder"])       # (A, D, P, K, E)
            rho_crs[o, i] = rank_correlations(by_encoder[..., np.searchsorted(names, table.index.to_numpy())],
                                              table["target_auroc"].to_numpy())[1]
        rho_auroc[i] = reference[variant[0]].rho_source_auroc
    return rho_crs, rho_auroc


# --------------------------------------------------------------------------- the conclusions

def _default_row(table: pd.DataFrame) -> pd.Series:
    default = table[table["is_default"]]
    if len(default) != 1:
        raise SensitivityError(f"the multiverse table has {len(default)} default combinations, expected 1 "
                               "(see its attrs['notes'])")
    return default.iloc[0]


INFORMATIVE = ("leader", "top3", "kendall_tau", "reversed_pairs")
"""The conclusions that can fail under another combination (the claims page's multiverse column):
the same leader, the same top-three set, Kendall tau within :data:`TAU_TOLERANCE` of the default's and
the reversed pairs within :data:`REVERSAL_TOLERANCE`. (tau < 1 and reversals > 0 hold for any two
different rankings, so they cannot.)"""


def _without_attrs(table: pd.DataFrame) -> pd.DataFrame:
    """A shallow copy of ``table`` without its attrs: pandas deep-copies a frame's attrs into every frame
    derived from it, and the multiverse's hold its per-combination CRS arrays (4 of the 7.5 s that chapter
    05b's numbers took on the smoke book's 49,248 combinations)."""
    plain = table.copy(deep=False)
    plain.attrs = {}
    return plain


def rank_shift(auroc_ranking, ranking, encoder: str) -> int:
    """The encoder's rank under AUROC minus its rank under the CRS: positive = it rises under the CRS."""
    return auroc_ranking.index(encoder) - ranking.index(encoder)


def rank_shifts(table: pd.DataFrame, encoder: str) -> pd.Series:
    """:func:`rank_shift` of ``encoder`` in every combination (row) of a multiverse table, in one pass over
    its two ranking columns (``DataFrame.apply`` row by row took 6 of the smoke chapter's 16 s,
    ``benchmarks/replaced.py``)."""
    return pd.Series([rank_shift(a, r, encoder) for a, r in zip(table["auroc_ranking"], table["ranking"])],
                     index=table.index, dtype=int)


def _holds(table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per combination (rows) and conclusion (columns): whether it holds as in the default; and
    ``{conclusion: the default's value, as text}``. ``attrs["kinds"]`` names the column of each of the
    :data:`INFORMATIVE` conclusions and, when the default has it, of ``external_validity``."""
    table = _without_attrs(table)
    d = _default_row(table)
    holds, values = {}, {}
    kinds = dict(zip(INFORMATIVE, (f"the leader is {d['leader']}", "the top-three set is the default's",
                                   f"Kendall tau vs AUROC within {TAU_TOLERANCE} of the default's",
                                   f"reversed pairs within {REVERSAL_TOLERANCE:.0%} of the default's")))
    holds[kinds["leader"]], values[kinds["leader"]] = table["leader"] == d["leader"], d["leader"]
    holds[kinds["top3"]] = table["top3"].map(lambda t: t == d["top3"])
    values[kinds["top3"]] = ", ".join(d["top3"])
    key = kinds["kendall_tau"]
    holds[key], values[key] = (table["kendall_tau"] - d["kendall_tau"]).abs() <= TAU_TOLERANCE + 1e-12, f"{d['kendall_tau']:.3f}"
    key = kinds["reversed_pairs"]
    tolerance = max(1.0, REVERSAL_TOLERANCE * d["reversed_pairs"])
    holds[key], values[key] = (table["reversed_pairs"] - d["reversed_pairs"]).abs() <= tolerance, str(d["reversed_pairs"])

    moves = sorted(((rank_shift(d["auroc_ranking"], d["ranking"], e), e) for e in d["ranking"]),
                   key=lambda m: (-abs(m[0]), m[1]))
    for move, encoder in [m for m in moves if m[0] != 0][:N_MOVES]:
        key = f"{encoder} {'rises' if move > 0 else 'falls'} under the CRS"
        holds[key] = np.sign(rank_shifts(table, encoder)) == np.sign(move)
        values[key] = f"{move:+d} ranks"
    if np.isfinite(d["rho_crs"]):
        better = d["rho_crs"] > d["rho_auroc"]
        key = f"rho(CRS, transfer AUROC) {'>' if better else '<='} rho(AUROC, transfer AUROC)"
        holds[key] = (table["rho_crs"] > table["rho_auroc"]) == better
        values[key] = f"{d['rho_crs']:.3f} vs {d['rho_auroc']:.3f}"
        kinds["external_validity"] = key
    frame = pd.DataFrame(holds)
    frame.attrs["kinds"] = kinds
    return frame, values


def informative_shares(table: pd.DataFrame) -> dict:
    """``{conclusion: share of the multiverse in which it holds as in the default}`` for the
    :data:`INFORMATIVE` conclusions, plus ``external_validity`` (the CRS predicts the transfer AUROC
    better, or not, as in the default) when the default has it. Unweighted shares of the combinations:
    not probabilities."""
    holds, _ = _holds(table)
    return {kind: float(holds[column].mean()) for kind, column in holds.attrs["kinds"].items()}


def _matched(table: pd.DataFrame, choice: str) -> pd.Series:
    """The rows whose other choices occur with every level of ``choice``, so that its levels are compared
    like for like (``anchor_values`` moves only under ``anchors: fixed``)."""
    others = [c for c in CHOICES if c != choice]
    return table.groupby(others, sort=False)[choice].transform("nunique") == table[choice].nunique()


def choice_effects(table: pd.DataFrame) -> pd.DataFrame:
    """How much each choice splits each conclusion: max - min over its levels of the share that holds,
    over the combinations where every level of the choice occurs with the same other choices.

    Returns
    -------
    DataFrame
        One row per choice with more than one level in ``table``, one column per conclusion, and
        ``mean_spread`` (their mean); sorted by ``mean_spread``, the choice that matters most first.
    """
    table = _without_attrs(table)
    holds, _ = _holds(table)
    rows = {}
    for choice in CHOICES:
        if table[choice].nunique() > 1:
            matched = _matched(table, choice)
            shares = holds[matched].groupby(table.loc[matched, choice].to_numpy()).mean()
            rows[choice] = shares.max() - shares.min()
    effects = pd.DataFrame(rows).T
    effects["mean_spread"] = effects.mean(axis=1)
    return effects.sort_values("mean_spread", ascending=False)


def conclusions(table: pd.DataFrame, analysis=None) -> pd.DataFrame:
    """For each conclusion of the paper that depends on the CRS, the share of the multiverse where it
    holds *for this run* (as in the default combination), with a verdict.

    The conclusions: the leader, the top-three set, Kendall tau against AUROC (within
    :data:`TAU_TOLERANCE`), the reversed pairs (within :data:`REVERSAL_TOLERANCE`), the
    :data:`N_MOVES` largest rank moves (each keeps its direction) and the external validity (the CRS
    beats AUROC or not, as in the default). Verdict: ``robust`` when the share is >= :data:`ROBUST`,
    ``fragile`` below :data:`FRAGILE`, otherwise ``depends on X``, X the choice whose levels split it most.

    Parameters
    ----------
    table : DataFrame
        The output of :func:`multiverse`.
    analysis : RunAnalysis, optional
        Not read: the default combination in ``table`` stands for this run (kept for the chapter's call).

    Returns
    -------
    DataFrame
        Indexed by conclusion: ``default`` (its value in the default), ``share``, ``splits_most``,
        ``spread`` (that choice's max - min share over its levels) and ``verdict``.
    """
    holds, values = _holds(table)
    effects = choice_effects(table)
    rows = []
    for name in holds.columns:
        share = float(holds[name].mean())
        splits = effects[name].idxmax() if len(effects) else None
        verdict = "robust" if share >= ROBUST else "fragile" if share < FRAGILE else f"depends on {splits}"
        rows.append({"conclusion": name, "default": values[name], "share": share, "splits_most": splits,
                     "spread": float(effects[name].max()) if len(effects) else 0.0, "verdict": verdict})
    return pd.DataFrame(rows).set_index("conclusion")


def level_moves(table: pd.DataFrame) -> pd.DataFrame:
    """For every non-default level of every choice, how often it moves a conclusion: over the combinations
    at the default's level of the choice, the share in which putting this level in its place (the other
    choices unchanged) makes at least one conclusion of :func:`conclusions` hold where it failed, or fail
    where it held.

    Returns
    -------
    DataFrame
        Columns ``choice``, ``level``, ``pairs`` (the matched combinations) and ``moved`` (the share),
        sorted by ``moved``, the level that moves least first.
    """
    table = _without_attrs(table)
    holds, _ = _holds(table)
    default = _default_row(table)
    rows = []
    for choice in CHOICES:
        others = [c for c in CHOICES if c != choice]
        at = {level: holds[table[choice] == level].set_axis(pd.MultiIndex.from_frame(table.loc[table[choice] == level, others]))
              for level in table[choice].unique()}
        base = at.pop(default[choice])
        for level, moved in at.items():
            common = base.index.intersection(moved.index)
            changed = (base.loc[common] != moved.loc[common]).to_numpy().any(axis=1)
            rows.append({"choice": choice, "level": str(level), "pairs": len(common),
                         "moved": float(changed.mean()) if len(common) else np.nan})
    return pd.DataFrame(rows).sort_values(["moved", "choice"], kind="stable").reset_index(drop=True)


def inert_levels(table: pd.DataFrame) -> list[tuple[str, str]]:
    """The (choice, level) pairs that never move any conclusion (:func:`level_moves` share 0)."""
    moves = level_moves(table)
    return list(moves.loc[moves["moved"] == 0, ["choice", "level"]].itertuples(index=False, name=None))


def inert_sentence(table: pd.DataFrame) -> str:
    """Sentences naming the levels that never move any conclusion (:func:`inert_levels`), or, when every
    level moves one somewhere, the level that moves conclusions least often, for the chapter."""
    moves = level_moves(table)
    inert = moves[moves["moved"] == 0]
    if len(inert):
        names = "; ".join(f"{c} {level}" for c, level in zip(inert["choice"], inert["level"]))
        return (f"{len(inert)} of the {len(moves)} non-default levels never move any conclusion in any combination: "
                f"{names}. Every other level moves at least one.")
    least = moves.iloc[0]
    return (f"Every one of the {len(moves)} non-default levels moves at least one conclusion in some combination. "
            f"The one that moves conclusions least often is {least['choice']} {least['level']}, in "
            f"{100 * least['moved']:.1f} % of the {least['pairs']:,} combinations where it can replace the default's level.")


def matters_most(effects: pd.DataFrame) -> str:
    """One sentence naming the choice that matters most (:func:`choice_effects`), for the chapter."""
    first, spread = effects.index[0], effects["mean_spread"].iloc[0]
    runner_up = (f"; next is {effects.index[1]} ({effects['mean_spread'].iloc[1]:.0%})" if len(effects) > 1 else "")
    return (f"The choice that matters most is {first}: between its levels, the share of the multiverse in which "
            f"a conclusion holds differs by {spread:.0%} on average{runner_up}.")
