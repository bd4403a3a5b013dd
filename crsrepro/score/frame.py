"""The lifecycle of a profile's CRS reference frame: where it lives, freezing it, reading it (DESIGN.md section 9).

The frame (:class:`crsrepro.score.crs.ReferenceFrame`: anchors, weights and the panel's reliability
profiles) is frozen from a complete run by an explicit act, ``crsrepro freeze-frame``
(:func:`freeze_run_frame`, which reads the run's merged results and never computes one: with no run, or
an incomplete one, it refuses and names the missing cells and the command that computes them), and saved
in the manifest folder beside the split manifests; reading it (:func:`reference_frame`) never writes it.
:func:`frame_for_book` is the book's one freezing step, for a demo-world profile only.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import git_hash, manifest_dir as default_manifest_dir
from crsrepro.core.schema import GRID_COLUMNS, PRIMARY, Condition, is_transfer
from crsrepro.core.vocab import EXTRA_PERTURBATIONS
from crsrepro.profiles import Profile, as_profile
from crsrepro.run.grid import GridStage, enumerate_runs
from crsrepro.run.results import results_hash, runs_table
from crsrepro.run.stages import read_stage

log = logging.getLogger(__name__)


def frame_path(profile: Profile, manifest_dir: Path | None = None) -> Path:
    """Where the profile's frozen CRS reference frame lives: ``<data_manifests>/crs_reference_<profile>.yaml``."""
    return default_manifest_dir(manifest_dir) / f"crs_reference_{profile.name}.yaml"


def scored_runs(profile: Profile, results: pd.DataFrame) -> pd.DataFrame:
    """The runs table (:func:`crsrepro.run.results.runs_table`) that the reliability profiles are computed
    from: every run but those of the transfer sets the profile keeps out of robustness
    (``robustness_transfer``: NIH ChestX-ray14 is scored, MIMIC-CXR enters robustness) and those of the
    modality-apt noise models (``noise_model``, beyond the paper: reported beside Rician in chapter 04,
    kept out of the paper-faithful robustness and CRS)."""
    runs = runs_table(results)
    kept = runs["condition"].map(lambda c: (not is_transfer(c) or c in profile.robustness_transfer)
                                 and Condition.parse(c).perturbation not in EXTRA_PERTURBATIONS)
    return runs[kept].reset_index(drop=True)


def missing_runs(profile: Profile | str, results: pd.DataFrame) -> pd.DataFrame:
    """The primary runs of :func:`crsrepro.run.grid.enumerate_runs` that ``results`` lacks (an AUROC row of
    :data:`crsrepro.core.schema.PRIMARY`: the linear, final-layer, frozen, uncalibrated probe), one row per
    missing run."""
    profile = as_profile(profile)
    expected = enumerate_runs(profile)
    have = results[(results[list(PRIMARY)] == pd.Series(PRIMARY)).all(axis=1) & (results["metric"] == "auroc")]
    merged = expected.merge(have[GRID_COLUMNS].drop_duplicates(), how="left", on=GRID_COLUMNS, indicator=True)
    return merged[merged["_merge"] == "left_only"].drop(columns="_merge").reset_index(drop=True)


def freeze_frame(profile: Profile | str, results: pd.DataFrame, *, manifest_dir: Path | None = None,
                 overwrite: bool = False):
    """Freeze the profile's CRS reference frame from a complete run and save it (``crsrepro freeze-frame``).

    The frame (DESIGN.md section 9) holds the anchors, the weights and the reliability profiles of the
    panel (of :func:`scored_runs`), and records the hash of the results it was frozen from
    (:func:`crsrepro.run.results.results_hash`), so that results which change later are noticed
    (:meth:`crsrepro.score.crs.ReferenceFrame.check_results`).

    Raises
    ------
    CrsreproError
        ``results`` lacks runs of the profile's grid (the message names the first missing cells), or a
        frame exists and ``overwrite`` is False.
    """
    from crsrepro.score.crs import ReferenceFrame
    from crsrepro.score.dimensions import reliability_profiles

    profile = as_profile(profile)
    missing = missing_runs(profile, results)
    if len(missing):
        raise CrsreproError(f"profile {profile.name!r}: the run is incomplete ({_missing_cells(missing)}); finish "
                            f"`crsrepro run --profile {profile.argument}` before freezing the frame")
    path = frame_path(profile, manifest_dir)
    if path.is_file() and not overwrite:
        raise CrsreproError(f"{path} exists: a frozen frame is never silently replaced; pass --overwrite to "
                            f"re-freeze it (every published score of this profile then changes)")
    frame = ReferenceFrame.freeze(reliability_profiles(scored_runs(profile, results)),
                                  results_hash=results_hash(results), description=(
        f"profile {profile.name}, panel of {len(profile.encoders)} encoders, frozen from crsrepro "
        f"{__version__} at commit {git_hash()}"))
    frame.save(path)
    log.info("froze the %s reference frame to %s", profile.name, path)
    return frame


def _missing_cells(missing: pd.DataFrame, shown: int = 5) -> str:
    """``missing`` (rows of :func:`missing_runs`) in words: the run count and the first (encoder, dataset)
    cells with the seeds they lack."""
    seeds = missing.groupby(["encoder", "dataset"], sort=False)["seed"].unique()
    named = "; ".join(f"{encoder} on {dataset} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, sorted(s)))})"
                      for (encoder, dataset), s in seeds.head(shown).items())
    return (f"{len(missing)} run{'s' if len(missing) > 1 else ''} missing, in {len(seeds)} "
            f"cell{'s' if len(seeds) > 1 else ''}: {named}"
            f"{f' and {len(seeds) - shown} more' if len(seeds) > shown else ''}")


def freeze_run_frame(profile: Profile | str, *, manifest_dir: Path | None = None, overwrite: bool = False):
    """``crsrepro freeze-frame``: :func:`freeze_frame` from the profile's merged grid results, which are read
    (:func:`crsrepro.run.stages.read_stage`), never computed. Freezing is an explicit, cheap act: on the
    paper profile a run that it started would be a GPU-day.

    Raises
    ------
    CrsreproError
        No grid results (the message names the missing cells: all of them, and ``crsrepro run``), an
        incomplete, corrupt or stale table, or an existing frame without ``overwrite``.
    """
    profile = as_profile(profile)
    stage = GridStage()
    merged = stage.store(profile).merged_path
    if not merged.is_file():
        raise CrsreproError(f"profile {profile.name!r} has no grid results at {merged} "
                            f"({_missing_cells(enumerate_runs(profile))}); freeze-frame never runs the grid: run "
                            f"`crsrepro run --profile {profile.argument}` first")
    return freeze_frame(profile, read_stage(profile, stage), manifest_dir=manifest_dir, overwrite=overwrite)


def frame_for_book(profile: Profile | str, results: pd.DataFrame, *, manifest_dir: Path | None = None) -> Path | None:
    """The frame step of ``crsrepro book``: a demo-world profile without a frozen frame gets one, frozen
    from ``results`` (returns its path); any other profile must have been frozen by ``crsrepro
    freeze-frame`` (an error otherwise), so a book never publishes a frame frozen by accident."""
    profile = as_profile(profile)
    path = frame_path(profile, manifest_dir)
    if path.is_file():
        return None
    if profile.data.source != "demo_world":
        raise CrsreproError(f"{path}: profile {profile.name!r} has no frozen reference frame; after a complete "
                            f"run, freeze it with `crsrepro freeze-frame --profile {profile.name}`")
    freeze_frame(profile, results, manifest_dir=manifest_dir)
    return path


def reference_frame(profile: Profile | str, *, manifest_dir: Path | None = None):
    """The profile's frozen CRS reference frame, read from ``data_manifests/`` (never written here).

    Raises
    ------
    crsrepro.score.crs.FrameError
        No frame has been frozen for the profile (``crsrepro freeze-frame --profile P`` freezes one).
    """
    from crsrepro.score.crs import ReferenceFrame

    return ReferenceFrame.load(frame_path(as_profile(profile), manifest_dir))


__all__ = ["frame_for_book", "frame_path", "freeze_frame", "freeze_run_frame", "missing_runs", "reference_frame",
           "scored_runs"]
