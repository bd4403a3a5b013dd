"""The stages of a run and the one runner that executes them (DESIGN.md section 13).

A *stage* produces keyed row-sets into its own :class:`~crsrepro.run.results.ResultStore`: the frozen
linear-probe grid (:class:`crsrepro.run.grid.GridStage`, the profile's results folder), the layer-depth
sweep (:class:`crsrepro.run.depth.DepthStage`, ``depth/``) and the LoRA grid
(:class:`crsrepro.run.lora.LoraStage`, ``lora/``). A stage *plans*: it derives the key of every row-set
it owns, in the order of its merged table, and lists the :class:`~crsrepro.run.executor.Task` of those
not done yet (a finished row-set is never recomputed: that is the resume). :func:`run_stages` plans
every stage it is given, executes each stage's tasks in turn on one executor (serial, a process pool or
Dask, :mod:`crsrepro.run.executor`) and merges each stage's row-sets into its ``results.parquet``.

Producing and reading are apart: :func:`read_stage` reads a stage's merged table and never computes;
a missing or stale table is an error that names the command producing it.
"""

from __future__ import annotations

import logging
from typing import Protocol

import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import Profile
from crsrepro.run.executor import DEFAULT_EXECUTOR, Task, execute
from crsrepro.run.results import ResultStore, load_results, remove_temporaries

log = logging.getLogger(__name__)


class Stage(Protocol):
    """What :func:`run_stages` runs and :func:`read_stage` reads."""

    #: The stage's name, in logs and errors (``grid``, ``depth``, ``lora``).
    name: str
    #: The command that produces its rows (``crsrepro run``), named when they are missing.
    command: str

    def store(self, profile: Profile) -> ResultStore:
        """Where its row-sets and merged table live."""

    def plan(self, profile: Profile, store: ResultStore, *, progress: bool = False) -> tuple[list[str], list[Task]]:
        """The keys of its row-sets, in merged-table order, and the tasks of those ``store`` lacks."""

    def attrs(self, profile: Profile) -> dict:
        """What its merged table records beside its key hash (the profile's fingerprint ...): a table
        whose attrs differ was computed for another version of the profile."""


def holds_gpu(profile: Profile) -> bool:
    """Whether the tasks that run an encoder hold the ``GPU`` resource (:mod:`crsrepro.run.executor`)."""
    return profile.features.device.startswith("cuda")


def run_stages(profile: Profile, stages: list[Stage], *, executor: str = DEFAULT_EXECUTOR, workers: int | None = None,
               scheduler: str | None = None, progress: bool = True) -> list[pd.DataFrame]:
    """Plan every stage, run each stage's tasks in turn on ``executor``, merge each stage's table.

    Every stage is planned before any task runs, so a stage that cannot be planned (an encoder without
    depth taps, a missing dataset) stops the run before any work. The per-process caches of prepared
    datasets and built encoders are cleared first (the data or the weights may have changed since a
    previous run in this process), and so are the temporary files a killed run left in the stores and
    the feature cache.

    Parameters
    ----------
    profile : Profile
    stages : list of Stage
    executor : {"serial", "local", "dask"}
        See :func:`crsrepro.run.executor.execute`.
    workers : int, optional
        Worker processes of ``local`` and of a Dask LocalCluster (default: the CPU cores).
    scheduler : str, optional
        ``dask`` only: the address of a running Dask scheduler.
    progress : bool
        Progress bars (the serial executor's tasks show their own; pools log instead).

    Returns
    -------
    list of DataFrame
        Each stage's merged tidy table (:mod:`crsrepro.run.results`), in the order of ``stages``.
    """
    from crsrepro.run.units import clear_encoder_cache
    from crsrepro.run.views import clear_view_cache

    clear_view_cache()
    clear_encoder_cache()
    stores = [stage.store(profile) for stage in stages]
    for folder in dict.fromkeys([*(store.root for store in stores), profile.feature_cache_path]):
        remove_temporaries(folder)
    plans = [stage.plan(profile, store, progress=progress and executor == "serial") for stage, store in zip(stages, stores)]
    for stage, (keys, tasks) in zip(stages, plans):
        log.info("%s of profile %s: %d row-sets, %d tasks to run (%s executor)", stage.name, profile.name, len(keys),
                 len(tasks), executor)
        execute(tasks, executor=executor, workers=workers, scheduler=scheduler, progress=progress,
                description=f"{stage.name} ({profile.name})")
    return [store.merge(keys, attrs=stage.attrs(profile)) for stage, store, (keys, _) in zip(stages, stores, plans)]


def read_stage(profile: Profile, stage: Stage) -> pd.DataFrame:
    """A stage's merged table, read (never computed).

    Raises
    ------
    CrsreproError
        The table is missing, corrupt, or was merged for another version of the profile; the message names
        the command that brings it up to date.
    """
    store = stage.store(profile)
    command = f"{stage.command} --profile {profile.name}"
    if not store.merged_path.is_file():
        raise CrsreproError(f"no {stage.name} results at {store.merged_path}: run `{command}` first")
    results = load_results(store.root, command=command)
    stale = sorted(k for k, v in stage.attrs(profile).items() if results.attrs.get(k) != v)
    if stale:
        raise CrsreproError(f"{store.merged_path} was merged for another version of profile {profile.name!r} (its "
                            f"{', '.join(stale)} differ); run `{command}` to bring it up to date")
    return results


__all__ = ["Stage", "holds_gpu", "read_stage", "run_stages"]
