"""Scoring a newcomer against a profile's frozen reference frame (``crsrepro score``; DESIGN.md sections 1, 9 and 10).

The newcomer is a registered encoder id, or a user's own encoder registered from a spec file or a Python
entry point (:mod:`crsrepro.encoders.user`). It runs through the profile's grid
(:func:`crsrepro.run.grid.run_grid` with only its encoder, into ``<output_dir>/newcomers/<id>/``: the
panel's extraction cache, perturbations and probes), its reliability profiles are scored against the
frozen frame (:func:`crsrepro.score.crs.score_encoder`), and the panel is neither recomputed nor moved.

:func:`score_newcomer` adds what a reviewer needs to read the score (:class:`NewcomerScore`): the
two-level (seeds x test cases) intervals of each cell's CRS and of the aggregate
(:func:`crsrepro.score.stats.crs_bootstrap`, one draw shared with the panel, so the newcomer's rank
probabilities are paired with the panel's replicates), the rank it would take, the panel members whose
frozen profile it dominates on each dataset, and the frame's hash and the package version, so that the
score can be cited. :mod:`crsrepro.present.score_report` writes it as a table, a figure and a page.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import git_hash
from crsrepro.profiles import Profile, as_profile
from crsrepro.run.grid import run_grid
from crsrepro.run.results import ResultStore
from crsrepro.score.frame import reference_frame


@dataclass(frozen=True)
class NewcomerScore:
    """A newcomer's score against a frozen frame, with what makes it citable (DESIGN.md sections 9-10).

    :func:`score_newcomer` makes it; :mod:`crsrepro.present.score_report` prints and writes it.

    Attributes
    ----------
    profile : str
        The profile's name.
    encoder : str
        The id it was scored under (``user.<name>``, a registered id, or the panel member a spec is the
        twin of: :func:`crsrepro.encoders.user.panel_twin`).
    cells : DataFrame
        One row per dataset, :func:`crsrepro.score.crs.score_encoder`'s columns (raw and normalised
        dimensions, ``pareto, proximity, worst, crs``, ``aggregate_crs``, ``rank``, ``n_published``) plus
        ``crs_ci_low, crs_ci_high`` (the two-level interval) and ``dominates`` (the panel members whose
        frozen profile on that dataset it dominates, comma-separated).
    aggregate : dict
        ``crs, ci_low, ci_high, rank, n_published, p_rank1, p_top3, level, n_resamples`` and
        ``dominates_everywhere`` (the members it dominates on every dataset it shares with them).
    panel : DataFrame
        By panel member, best first: the published aggregate ``crs`` and its ``ci_low, ci_high`` from the
        same draw (NaN without the panel's results) and ``rank_crs``.
    profiles : DataFrame
        ``encoder, dataset, family, auroc, ece, retention, robustness``: the normalised profiles of the
        frame's panel and of the newcomer (1 = best on every axis), for the figure.
    frame_path, frame_hash, results_hash : str
        The frame file, its content hash, and the hash of the panel results it was frozen from.
    version, git : str
        The package version and the commit that scored it.
    notes : tuple of str
        What the reader must know: defaults used, a twin, intervals that hold the panel fixed.
    """

    profile: str
    encoder: str
    cells: pd.DataFrame
    aggregate: dict
    panel: pd.DataFrame
    profiles: pd.DataFrame
    frame_path: str
    frame_hash: str
    results_hash: str | None
    version: str
    git: str
    notes: tuple = ()


class NewcomerError(CrsreproError, ValueError):
    """A newcomer cannot be scored against the profile: no frame, a stale frame, or results without cells."""


def checked_frame(profile: Profile, manifest_dir: Path | None = None):
    """The profile's frozen frame, refused in one line naming the profile when it is missing, unreadable or
    stale (frozen from other panel results than those now in ``output_dir``)."""
    from crsrepro.score.crs import FrameError

    try:
        frame = reference_frame(profile, manifest_dir=manifest_dir)
    except FrameError as exc:
        raise NewcomerError(f"profile {profile.name!r}: {str(exc).replace('<name>', profile.argument)}") from None
    panel = ResultStore(profile.output_path).merged_path
    if panel.is_file():
        problem = frame.check_results(pd.read_parquet(panel).attrs.get("keys_hash"))
        if problem:
            raise NewcomerError(f"profile {profile.name!r}: {problem}; re-freeze the frame (crsrepro freeze-frame "
                                f"--profile {profile.argument} --overwrite) or restore the results it was frozen from")
    return frame


def score_new_encoder(profile: Profile | str, encoder_id: str, *, weights=None, manifest_dir: Path | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """Run a registered encoder through the profile's grid and score it against the frozen frame: the
    cells of :func:`score_newcomer` without the intervals.

    Raises
    ------
    CrsreproError
        An unknown id, no frame, or the panel's results have changed since the frame was frozen from them.
    """
    return score_newcomer(profile, encoder_id, weights=weights, manifest_dir=manifest_dir, progress=progress,
                          intervals=False).cells


def score_newcomer(profile: Profile | str, encoder, *, weights=None, manifest_dir: Path | None = None,
                   progress: bool = True, intervals: bool = True, level: float = 0.95) -> NewcomerScore:
    """Score a newcomer against the profile's frozen frame (``crsrepro score``; DESIGN.md section 9).

    Parameters
    ----------
    profile : Profile or str
    encoder : str or crsrepro.encoders.user.Newcomer
        A registered id, or a newcomer registered by :func:`crsrepro.encoders.user.load_spec_file` or
        :func:`~crsrepro.encoders.user.load_entry_point`.
    weights : path, optional
        A registered id's weights (default: its usual lookup); a newcomer carries its own.
    intervals : bool, default True
        Compute the two-level intervals (``bootstrap.n_case_resamples`` replicates, seed 0) and the rank
        probabilities; False leaves them NaN.
    level : float, default 0.95

    Raises
    ------
    NewcomerError
        No frame, a stale one (both name the profile), or a cell of the newcomer the frame lacks.
    """
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.run.units import clear_encoder_cache

    profile = as_profile(profile)
    frame = checked_frame(profile, manifest_dir)
    notes = []
    if isinstance(encoder, str):
        encoder_id = get_encoder_spec(encoder).id  # an unknown id fails here, before any work
    else:
        encoder_id, weights = encoder.id, encoder.weights
        if encoder.defaults_used:
            values = {**encoder.spec.preprocessing, "resize_mode": encoder.spec.resize_mode}
            notes.append("the entry point gave no " + ", ".join(encoder.defaults_used) + "; the documented defaults "
                         "were used: " + ", ".join(f"{k} {values[k]}" for k in encoder.defaults_used))
        if encoder.twin_of:
            notes.append(f"{encoder.source} describes panel member {encoder.twin_of} (same builder, architecture, "
                         f"preprocessing, pooling and weights); scored as it, so its peers exclude itself")
    clear_encoder_cache()  # a newcomer re-registered under the same id in this process is rebuilt
    output_dir = profile.output_path / "newcomers" / encoder_id
    results = run_grid(profile, encoders=[encoder_id], weights={encoder_id: weights} if weights else None,
                       output_dir=output_dir, manifest_dir=manifest_dir, progress=progress)
    own = _analysis(dataclasses.replace(profile, output_dir=str(output_dir)), results, manifest_dir)
    cells = _score_cells(own.reliability_profiles, frame)
    panel_table = _panel_table(frame)
    aggregate = {"crs": float(cells["aggregate_crs"].iloc[0]), "rank": int(cells["rank"].iloc[0]),
                 "n_published": int(cells["n_published"].iloc[0]), "level": level,
                 "ci_low": np.nan, "ci_high": np.nan, "p_rank1": np.nan, "p_top3": np.nan, "n_resamples": 0}
    cells = cells.assign(crs_ci_low=np.nan, crs_ci_high=np.nan)
    if intervals:
        cells, aggregate, panel_table, note = _intervals(profile, own, cells, aggregate, panel_table, frame,
                                                         manifest_dir, level)
        notes += [note] if note else []
    dominated = dominated_members(cells, frame)
    cells = cells.assign(dominates=cells["dataset"].map(lambda d: ", ".join(dominated.get(d, []))))
    everywhere = set.intersection(*(set(v) for v in dominated.values())) if dominated else set()
    aggregate["dominates_everywhere"] = ", ".join(sorted(everywhere))
    return NewcomerScore(profile=profile.name, encoder=encoder_id, cells=cells, aggregate=aggregate,
                         panel=panel_table, profiles=_profiles_for_figure(frame, cells, encoder_id),
                         frame_path=str(frame.path), frame_hash=frame.content_hash(),
                         results_hash=frame.results_hash, version=__version__, git=git_hash(), notes=tuple(notes))


def _analysis(profile: Profile, results: pd.DataFrame, manifest_dir):
    from crsrepro.analyse.run_analysis import RunAnalysis

    return RunAnalysis(profile, results, manifest_dir=manifest_dir)


def _score_cells(per_seed_profiles: pd.DataFrame, frame) -> pd.DataFrame:
    """:func:`crsrepro.score.crs.score_encoder` of the newcomer's per-seed profiles (those of
    :func:`crsrepro.score.frame.scored_runs`, as the frame's panel was scored), refusing a dataset the
    frame lacks in one line."""
    from crsrepro.score.crs import FrameError, score_encoder

    try:
        return score_encoder(per_seed_profiles, frame)
    except FrameError as exc:
        raise NewcomerError(str(exc)) from None


def _panel_table(frame) -> pd.DataFrame:
    from crsrepro.score.crs import aggregate_crs

    published = aggregate_crs(frame.published_scores())[["crs", "n_cells", "rank_crs"]]
    return published.assign(ci_low=np.nan, ci_high=np.nan)


def _intervals(profile: Profile, own, cells: pd.DataFrame, aggregate: dict, panel_table: pd.DataFrame, frame,
               manifest_dir, level: float):
    """The two-level CRS bootstrap of the newcomer with the panel (one shared draw of seeds and cases:
    :func:`crsrepro.score.stats.crs_bootstrap`), or of the newcomer alone against the frozen panel when
    the panel's results are not here (then said in the returned note).

    It is kept with the newcomer's results (``own.computed_once``, under a key that also names the panel's
    results and the frame), so that scoring the same newcomer again, or executing chapter 10 again after an
    edit, reads it instead of resampling."""
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.score.stats import crs_bootstrap

    encoder_id = cells["encoder"].iloc[0]
    datasets = sorted(cells["dataset"].unique())
    panel = RunAnalysis.load(profile, manifest_dir=manifest_dir) \
        if ResultStore(profile.output_path).merged_path.is_file() else None

    def compute():
        cases = {d: own.dataset_cases(d) for d in datasets}
        profiles = own.reliability_profiles
        if panel is not None:
            profiles = pd.concat([panel.reliability_profiles[panel.reliability_profiles["encoder"] != encoder_id],
                                  profiles], ignore_index=True)
            cases = {d: _merged_cases(panel.dataset_cases(d), c) for d, c in cases.items()}
        return crs_bootstrap(cases, profiles, frame, n_resamples=profile.bootstrap.n_case_resamples, rng=0)

    result = own.computed_once("newcomer_crs_bootstrap", compute, datasets=datasets, frame=frame.content_hash(),
                               panel=None if panel is None else panel.results_hash)
    note = None if panel is not None else (
        f"the panel's results are not in {profile.output_path}: the intervals hold the panel at its frozen "
        f"profiles (run `crsrepro run --profile {profile.argument}` for intervals paired with the panel)")
    low, high = _cell_intervals(result, frame, level)
    at = pd.MultiIndex.from_frame(cells[["encoder", "dataset"]])
    cells = cells.assign(crs_ci_low=low.reindex(at).to_numpy(), crs_ci_high=high.reindex(at).to_numpy())
    interval = result.interval(level)
    aggregate.update(ci_low=float(interval.loc[encoder_id, "ci_low"]), ci_high=float(interval.loc[encoder_id, "ci_high"]),
                     n_resamples=result.n_resamples)
    if note is None:  # rank probabilities only among the panel's replicates, never of the newcomer alone
        aggregate.update(p_rank1=float(result.p_rank1[encoder_id]), p_top3=float(result.p_top3[encoder_id]))
    members = panel_table.index.intersection(interval.index)
    panel_table.loc[members, ["ci_low", "ci_high"]] = interval.loc[members, ["ci_low", "ci_high"]].to_numpy()
    return cells, aggregate, panel_table, note


def _merged_cases(panel, own):
    """The panel's per-case arrays of one dataset with the newcomer's added (its own replace a twin's)."""
    from crsrepro.score.stats import DatasetCases

    if len(panel.labels) != len(own.labels) or not np.array_equal(np.asarray(panel.labels), np.asarray(own.labels),
                                                                  equal_nan=True):
        raise NewcomerError("the newcomer's test cases are not the panel's (another split or dataset copy); "
                            "rerun the panel or the newcomer on the same data")
    return DatasetCases(task=panel.task, labels=panel.labels, clean={**panel.clean, **own.clean},
                        perturbed={c: {**a, **own.perturbed.get(c, {})} for c, a in panel.perturbed.items()},
                        fractions={f: {**a, **own.fractions.get(f, {})} for f, a in panel.fractions.items()},
                        transfers={t: (labels, {**a, **own.transfers[t][1]}) for t, (labels, a) in panel.transfers.items()})


def _cell_intervals(result, frame, level: float) -> tuple[pd.Series, pd.Series]:
    """Each cell's CRS interval from the bootstrap's replicated raw profiles, scored as the replicates'
    aggregates are (:func:`crsrepro.score.crs.score_by_dataset` with the same replicate's peers) around the
    published plug-in (:func:`crsrepro.score.stats.bootstrap_interval`)."""
    from crsrepro.score.crs import normalise, score_by_dataset
    from crsrepro.score.stats import bootstrap_interval

    replicates = score_by_dataset(result.cells, normalise(result.profile_replicates, frame.anchors), frame,
                                  peers="resampled")["crs"]
    plug_in = score_by_dataset(result.cells, normalise(result.profiles, frame.anchors), frame, peers="frozen")["crs"]
    _, low, high = bootstrap_interval(plug_in, replicates, level)
    index = pd.MultiIndex.from_frame(result.cells[["encoder", "dataset"]])
    return pd.Series(low, index=index), pd.Series(high, index=index)


def dominated_members(cells: pd.DataFrame, frame) -> dict[str, list[str]]:
    """``{dataset: [panel members]}``: the frame's reference encoders whose frozen normalised profile the
    newcomer's cell weakly dominates (>= on all four dimensions, > on one: the Pareto term's dominance,
    :func:`crsrepro.score.crs.pareto_share` against one peer at a time); its own id is no peer."""
    from crsrepro.score.crs import NORMALISED, pareto_share

    out = {}
    for row in cells.itertuples():
        members, reference = frame.reference_for(row.dataset)
        p = np.tile([getattr(row, c) for c in NORMALISED], (len(members), 1))
        alone = np.eye(len(members), dtype=bool) & (members != row.encoder)[:, None]
        keep = alone.any(1)
        if keep.any():
            share = pareto_share(p[keep], reference, alone[keep])
            out[row.dataset] = sorted(str(m) for m, s in zip(members[keep], share) if s > 0)
        else:
            out[row.dataset] = []
    return out


def _profiles_for_figure(frame, cells: pd.DataFrame, encoder_id: str) -> pd.DataFrame:
    from crsrepro.encoders import get_encoder_spec, list_encoders
    from crsrepro.score.crs import DIMENSIONS, NORMALISED

    rename = dict(zip(NORMALISED, DIMENSIONS))
    panel = frame.reference[frame.reference["encoder"] != encoder_id].rename(columns=rename)
    own = cells[["encoder", "dataset", *NORMALISED]].rename(columns=rename)
    table = pd.concat([panel, own], ignore_index=True)
    known = set(list_encoders())
    family = {e: get_encoder_spec(e).family if e in known else None for e in table["encoder"].unique()}
    family[encoder_id] = None  # the newcomer is drawn apart from the families
    return table.assign(family=table["encoder"].map(family))[["encoder", "dataset", "family", *DIMENSIONS]]


__all__ = ["NewcomerError", "NewcomerScore", "checked_frame", "dominated_members", "score_new_encoder",
           "score_newcomer"]
