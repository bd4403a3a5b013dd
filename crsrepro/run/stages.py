"""The stages of a run and the one runner that executes them (DESIGN.md section 13).

A *stage* produces keyed row-sets into its own :class:`~crsrepro.run.results.ResultStore`: the frozen
linear-probe grid (:class:`crsrepro.run.grid.GridStage`, the profile's results folder), the layer-depth
sweep (:class:`crsrepro.run.depth.DepthStage`, ``depth/``) and the LoRA grid
(:class:`crsrepro.run.lora.LoraStage`, ``lora/``). A stage *plans*: it derives the key of every row-set
it owns, in the order of its merged table, and lists the :class:`~crsrepro.run.executor.Task` of those
not done yet (a finished row-set is never recomputed: that is the resume). :func:`run_stages` plans
every stage it is given, executes each stage's tasks in turn on one executor (serial, a process pool or
Dask, :mod:`crsrepro.run.executor`) and merges each stage's row-sets into its ``results.parquet``, holding
the lock of the profile's output folder throughout (:func:`output_lock`: one run writes a folder at a time).
Its progress (issue 29.1, :mod:`crsrepro.run.progress`): a header and a time for the demo world and the
planning, then a header and a bar per task stage (grid extraction, probe fits, depth, LoRA).

Producing and reading are apart: :func:`read_stage` reads a stage's merged table and never computes;
a missing or stale table is an error that names the command producing it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol

import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import Profile
from crsrepro.run.executor import DEFAULT_EXECUTOR, Task, execute
from crsrepro.run.progress import Progress, as_progress
from crsrepro.run.results import ResultStore, load_results, remove_temporaries

log = logging.getLogger(__name__)

RUN_LOCK = ".crsrepro-run.lock"  # in a profile's output folder, held by the run writing it
CACHE_LOCK = ".crsrepro-cache.lock"  # in the feature cache, shared by the runs using it


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
               scheduler: str | None = None, progress: bool | Progress = True) -> list[pd.DataFrame]:
    """Plan every stage, run each stage's tasks in turn on ``executor``, merge each stage's table.

    Every stage is planned before any task runs, so a stage that cannot be planned (an encoder without
    depth taps, a missing dataset) stops the run before any work. The whole run holds the lock of the
    profile's output folder (:func:`output_lock`; every stage's store lies under it), so a second run
    on the folder waits and then finds the work done, and shares the feature cache with the runs of
    other profiles. The per-process caches of prepared datasets and built encoders are cleared first
    (the data or the weights may have changed since a previous run in this process), and so are the
    temporary files a killed run left in the stores and, when no other run uses it, the feature cache.

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
    progress : bool or Progress
        Where the headers, bars and stage times go (:func:`~crsrepro.run.progress.as_progress`: ``True``
        stdout, ``False`` nothing; a command passes its own to print the stage table at its end). The
        demo world's and the serial executor's tasks add their own inner bars on a terminal.

    Returns
    -------
    list of DataFrame
        Each stage's merged tidy table (:mod:`crsrepro.run.results`), in the order of ``stages``.
    """
    from crsrepro.data.demo_world import ensure_demo_world
    from crsrepro.run.units import clear_encoder_cache
    from crsrepro.run.views import clear_view_cache

    progress = as_progress(progress)
    with output_lock(profile.output_path), sharing_feature_cache(profile.feature_cache_path):
        clear_view_cache()
        clear_encoder_cache()
        stores = [stage.store(profile) for stage in stages]
        for root in dict.fromkeys(store.root for store in stores):
            remove_temporaries(root)
        if profile.data.source == "demo_world":  # written here, under its own header, not inside the planning
            progress.call(f"demo world ({profile.name})", f"{sum(profile.demo_world.n_images.values())} images",
                          lambda: ensure_demo_world(profile, progress=progress.bars))
        inner = progress.bars and executor == "serial"
        plans = progress.call(f"planning ({profile.name})", ", ".join(stage.name for stage in stages),
                              lambda: [stage.plan(profile, store, progress=inner) for stage, store in zip(stages, stores)])
        for stage, (keys, tasks) in zip(stages, plans):
            log.info("%s of profile %s: %d row-sets, %d tasks to run (%s executor)", stage.name, profile.name,
                     len(keys), len(tasks), executor)
            if not tasks:
                progress.say(f"== {stage.name} ({profile.name}): all {len(keys)} row-sets done, nothing to run ==")
            execute(tasks, executor=executor, workers=workers, scheduler=scheduler, progress=progress,
                    about=profile.name)
        return [store.merge(keys, attrs=stage.attrs(profile)) for stage, store, (keys, _) in zip(stages, stores, plans)]


@contextmanager
def output_lock(folder: Path) -> Iterator[None]:
    """Hold the lock of a run's output folder, ``<folder>/.crsrepro-run.lock``, for the whole run (issue 26).

    One run writes a folder at a time: a second run on the same folder logs a warning that names the
    run holding it (process id, host, start time) and waits; once it holds the lock it plans, and finds
    the first run's row-sets done. The lock is an ``flock``, so the kernel releases it when its holder
    dies, even by SIGKILL (no stale lock to remove by hand).
    """
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / RUN_LOCK, "a+") as handle:
        if not _try_flock(handle, fcntl.LOCK_EX):
            handle.seek(0)
            holder = handle.read().strip() or "a process that has not said which"
            log.warning("another crsrepro run is writing %s (%s); waiting for it to finish", folder, holder)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)


@contextmanager
def sharing_feature_cache(folder: Path) -> Iterator[None]:
    """Use the feature cache beside other runs (it is shared by every profile of a ``CRSREPRO_HOME``).

    Every run holds a shared ``flock`` on ``<folder>/.crsrepro-cache.lock``; only a run that finds no
    other one there (it gets the lock exclusively) removes the temporary files a killed writer left,
    so a run never removes a file that another run is writing.
    """
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CACHE_LOCK, "a") as handle:
        if _try_flock(handle, fcntl.LOCK_EX):
            remove_temporaries(folder)
        else:
            log.info("another run uses the feature cache %s; its temporary files are left alone", folder)
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


def _try_flock(handle, kind: int) -> bool:
    """Take the ``flock`` ``kind`` on ``handle`` if no other holder prevents it; never wait."""
    import fcntl

    try:
        fcntl.flock(handle, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


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


__all__ = ["Stage", "holds_gpu", "output_lock", "read_stage", "run_stages", "sharing_feature_cache"]
