"""The run grid: what is fitted and scored, and in which order (DESIGN.md section 7).

One *run* is (encoder, dataset, seed, label fraction, test condition). The conditions are ``clean``,
the perturbations ``<name>@<severity>``, and, for a dataset with transfer targets (CheXpert), each
transfer set (``mimic_cxr``) scored without retraining (:func:`crsrepro.run.views.conditions_for`).
:func:`enumerate_runs` lists them; for the ``paper`` profile that is the paper's 17,575 runs = 3,515
seed-aggregated rows x 5 seeds over 43 encoder-dataset cells.

:class:`GridStage` is the grid as a stage of :func:`crsrepro.run.stages.run_stages` (DESIGN.md section
13, :mod:`crsrepro.run.executor`): one extraction task per (encoder, dataset) cell, which writes the
cell's feature arrays to the content-addressed feature cache, and one probe task per unit, after it, in
this process, on a process pool or on a Dask cluster, with the same table from each. The unit of work,
and of resume, is a :class:`crsrepro.run.units.Unit` (cell, seed, probe), which writes one row-set to the
:class:`~crsrepro.run.results.ResultStore` under a key derived from its inputs
(:meth:`~crsrepro.run.units.Unit.key`). A unit whose row-set exists (and matches its digest) is skipped.

Beyond the paper's linear-probe grid, the same units also write

- the control probes (``mlp``, ``knn``) at ``control_probes.label_fractions`` and
  ``control_probes.conditions`` (default: every fraction and condition, DESIGN.md section 7);
- the four recalibrators (DESIGN.md section 8), fitted on the seed's val split (the calibration
  subset) of the full-label linear probe and scored under every condition, in rows whose
  ``recalibrator`` is not ``none``;
- the per-case test probabilities of the full-label linear probe (clean, each recalibrator, each
  transfer set), for the two-level bootstrap and the reliability diagrams.

The reference frame is never written here: :func:`crsrepro.score.frame.freeze_frame` is an explicit act
(``crsrepro freeze-frame``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import git_hash
from crsrepro.core.schema import GRID_COLUMNS
from crsrepro.core.vocab import CLEAN, LINEAR
from crsrepro.profiles import Profile, as_profile
from crsrepro.run.executor import Task
from crsrepro.run.results import CACHE_VERSION, ResultStore
from crsrepro.run.stages import holds_gpu, run_stages
from crsrepro.run.units import (Unit, cached_features, case_arrays, encoder, extract, feature_requests,
                                layer_feature_keys, probe_threads)
from crsrepro.run.views import conditions_for, view

log = logging.getLogger(__name__)


def cells(profile: Profile | str, encoders: list[str] | None = None) -> list[tuple[str, str]]:
    """The (encoder, dataset) cells of a profile (or of ``encoders`` on its datasets), without the
    datasets an encoder is excluded from.

    >>> len(cells("paper"))  # BioViL and CheXzero have no APTOS cell
    43
    """
    from crsrepro.encoders import get_encoder_spec

    profile = as_profile(profile)
    return [(encoder_id, dataset) for dataset in profile.datasets for encoder_id in encoders or profile.encoders
            if dataset not in get_encoder_spec(encoder_id).excluded_datasets]


def enumerate_runs(profile: Profile | str) -> pd.DataFrame:
    """Every run of the frozen linear-probe grid: one row per (encoder, dataset, seed, fraction, condition).

    >>> runs = enumerate_runs("paper")
    >>> len(runs), len(runs.drop(columns="seed").drop_duplicates()), len(runs[["encoder", "dataset"]].drop_duplicates())
    (17575, 3515, 43)
    """
    profile = as_profile(profile)
    rows = [(encoder_id, dataset, seed, fraction, condition)
            for encoder_id, dataset in cells(profile)
            for seed in profile.seeds
            for fraction in profile.label_fractions
            for condition in conditions_for(profile, dataset)]
    return pd.DataFrame(rows, columns=GRID_COLUMNS)


# --------------------------------------------------------------------------- the grid as keyed tasks

@dataclass(frozen=True)
class _Cell:
    """The inputs of one extraction task: an (encoder, dataset) cell of a run. ``images_key`` is what
    the planning process saw of the dataset: a worker that sees other data refuses to go on."""

    profile: Profile
    encoder: str
    dataset: str
    weights: str | None
    manifest_dir: Path | None
    images_key: str
    progress: bool = False


@dataclass(frozen=True)
class _ProbeTask:
    """The inputs of one probe task: a :class:`~crsrepro.run.units.Unit` (cell, seed, probe), the key its
    row-set gets and the keys of the feature arrays it reads (written by its cell's extraction task)."""

    cell: _Cell
    seed: int
    probe: str
    key: str
    feature_keys: dict
    weights_hash: str
    output_dir: Path


def _extract_task(cell: _Cell) -> str:
    """Extraction task: the cell's feature arrays, into the feature cache (runs where the encoder's
    device is; a cuda profile's extraction tasks hold the ``GPU`` resource, :mod:`crsrepro.run.executor`)."""
    profile = cell.profile
    prepared = view(profile, cell.dataset, cell.manifest_dir, cell.images_key)
    extract(profile, encoder(cell.encoder, cell.weights, profile.features.device), feature_requests(profile, prepared),
            cell.progress)
    return f"{cell.encoder} {cell.dataset}"


def _probe_task(task: _ProbeTask) -> str:
    """Probe task: fit and score one unit on its cell's cached features, write its row-set (and per-case
    file) to the store, and return its key. Pure: the row-set is a function of the key's inputs."""
    from crsrepro.encoders import get_encoder_spec

    cell, profile = task.cell, task.cell.profile
    prepared = view(profile, cell.dataset, cell.manifest_dir, cell.images_key)
    unit = Unit(profile, get_encoder_spec(cell.encoder), prepared, task.seed, task.probe)
    if unit.key(task.feature_keys) != task.key:
        raise CrsreproError(f"{cell.encoder} {cell.dataset} seed {task.seed} {task.probe}: this worker derives "
                            f"another row-set key than the planning process (other data or code?)")
    feats = cached_features(profile, feature_requests(profile, prepared), task.feature_keys)
    with probe_threads(profile.probe.num_threads):
        rows, cases = unit.run(feats)
    rows["rowset"] = task.key
    rows.attrs = {"crsrepro": __version__, "git": git_hash(), "key": task.key, "weights": task.weights_hash}
    store = ResultStore(task.output_dir)
    if cases:  # the per-case file first: the row-set marks the unit done
        store.write_cases(task.key, case_arrays(prepared, cases))
    store.write(task.key, rows)
    log.info("wrote %s %s seed %d %s (%d rows)", cell.encoder, cell.dataset, task.seed, task.probe, len(rows))
    return task.key


@dataclass(frozen=True)
class GridStage:
    """The frozen linear-probe grid as a stage (:class:`crsrepro.run.stages.Stage`).

    Parameters
    ----------
    encoders : tuple of str, optional
        Only these encoders (default: the profile's panel). Used to score a newcomer.
    weights : dict, optional
        ``{encoder id: weights path}`` overriding where an encoder's weights are read from.
    output_dir : path, optional
        The results folder (default: the profile's ``output_dir``).
    manifest_dir : path, optional
        Where split manifests live (default: :func:`crsrepro.core.io.manifest_dir`).
    """

    encoders: tuple | None = None
    weights: dict | None = None
    output_dir: Path | None = None
    manifest_dir: Path | None = None
    name: ClassVar[str] = "grid"
    command: ClassVar[str] = "crsrepro run"

    def store(self, profile: Profile) -> ResultStore:
        return ResultStore(self.output_dir or profile.output_path)

    def plan(self, profile: Profile, store: ResultStore, *, progress: bool = False) -> tuple[list[str], list[Task]]:
        """The grid's keys (in :func:`cells` order: the merged table's row order) and the tasks of the units
        without a row-set: per cell with work left, one extraction task and, after it, one probe task per
        pending (seed, probe) unit. Tasks come encoder by encoder, so a worker rebuilds encoders rarely."""
        from crsrepro.encoders import get_encoder_spec

        probes = [LINEAR] + list(profile.control_probes.probes)
        all_cells = cells(profile, list(self.encoders) if self.encoders else None)
        weights = self.weights or {}
        keys: dict[tuple[str, str], list[str]] = {}
        tasks = []
        for encoder_id in dict.fromkeys(e for e, _ in all_cells):
            built = encoder(encoder_id, weights.get(encoder_id), "cpu")  # keys need the weights hash only
            for dataset in [d for e, d in all_cells if e == encoder_id]:
                prepared = view(profile, dataset, self.manifest_dir)
                feature_keys = layer_feature_keys(built, feature_requests(profile, prepared))
                cell = _Cell(profile, encoder_id, dataset, weights.get(encoder_id), self.manifest_dir,
                             prepared.images_key, progress)
                units = [Unit(profile, get_encoder_spec(encoder_id), prepared, seed, probe)
                         for seed in profile.seeds for probe in probes]
                keys[(encoder_id, dataset)] = [unit.key(feature_keys) for unit in units]
                pending = [(unit, key) for unit, key in zip(units, keys[(encoder_id, dataset)]) if not store.has(key)]
                if not pending:
                    continue
                extract_task = Task(f"extract-{encoder_id}-{dataset}-{feature_keys['pool'][CLEAN][:12]}", _extract_task,
                                    (cell,), gpu=holds_gpu(profile), stage="grid extraction")
                tasks.append(extract_task)
                tasks += [Task(f"probe-{key[:16]}", _probe_task,
                               (_ProbeTask(cell, unit.seed, unit.probe, key, feature_keys, built.weights_hash,
                                           store.root),), after=extract_task.key, stage="probe fits")
                          for unit, key in pending]
        return [key for cell_ in all_cells for key in keys[cell_]], tasks

    def attrs(self, profile: Profile) -> dict:
        return {"profile": profile.name, "profile_fingerprint": profile.fingerprint(),
                "rowset_version": str(CACHE_VERSION)}


def run_grid(profile: Profile | str, *, encoders: list[str] | None = None, weights: dict | None = None,
             output_dir: Path | None = None, manifest_dir: Path | None = None, progress: bool = True,
             executor: str = "serial", workers: int | None = None, scheduler: str | None = None) -> pd.DataFrame:
    """Run every unit of the profile's grid that has no row-set yet, then merge the tidy table: the one
    stage :class:`GridStage` through :func:`crsrepro.run.stages.run_stages`. Every executor runs the same
    tasks and gives the same table (DESIGN.md section 13).

    Parameters
    ----------
    profile : Profile or str
    encoders, weights, output_dir, manifest_dir
        See :class:`GridStage`.
    progress : bool
        Print each stage's header and progress (a bar on a terminal, a line every 10 % or 30 s otherwise:
        :mod:`crsrepro.run.progress`), on every executor.
    executor : {"serial", "local", "dask"}
        ``serial``: the tasks in this process, in order (the reference); ``local``: a process pool
        (``crsrepro run``'s default); ``dask``: Dask distributed. See :mod:`crsrepro.run.executor`.
    workers : int, optional
        Worker processes of ``local`` and of a Dask LocalCluster (default: the CPU cores).
    scheduler : str, optional
        ``dask`` only: the address of a running Dask scheduler (default: a LocalCluster).

    Returns
    -------
    pandas.DataFrame
        The merged tidy table (see :mod:`crsrepro.run.results`), also written to ``results.parquet``.
    """
    profile = as_profile(profile)
    stage = GridStage(tuple(encoders) if encoders else None, weights, output_dir, manifest_dir)
    return run_stages(profile, [stage], executor=executor, workers=workers, scheduler=scheduler, progress=progress)[0]


__all__ = ["GridStage", "cells", "enumerate_runs", "run_grid"]
