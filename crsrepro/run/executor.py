"""Running the stages' keyed tasks: in this process, on a process pool, or on Dask (DESIGN.md section 13).

Every stage (:mod:`crsrepro.run.stages`) plans its work as a list of :class:`Task`. The grid
(:class:`crsrepro.run.grid.GridStage`): per (encoder, dataset) cell with work left, one *extraction task*
(the cell's feature arrays into the content-addressed feature cache) and, after it, one *probe task* per
(seed, probe) unit (fit, score, write its row-set); the depth sweep and the LoRA grid: one task per pair
or cell. A task is a pure function of its arguments whose effect is a keyed file, so running it twice, in
any order or on any machine, writes the same bytes; a task depends on at most one other (a probe task on
its cell's extraction task) and returns nothing the next task needs: it reads the files.

Executors
---------
``serial``
    Every task in this process, in the plan's order, with one thread as on a worker: the reference.
``local`` (``crsrepro run``'s default)
    A :class:`concurrent.futures.ProcessPoolExecutor` of ``workers`` processes (default: the CPU
    cores), each with one torch / BLAS thread [ours: one single-threaded task per core beats threads
    inside a task for these small fits]. A task is submitted once the task it depends on is done; on a
    cuda profile one extraction task runs at a time (one GPU). The workers die with the process that
    started them (on Linux, even when it is SIGKILLed), and their log records are handled by it.
``dask``
    Dask distributed: a ``LocalCluster`` of ``workers`` single-threaded processes, or the scheduler
    at ``scheduler`` (any cluster: dask-jobqueue's ``SLURMCluster``, see the README). The dependency
    is a Dask dependency. On a cuda profile the extraction tasks ask for the worker resource ``GPU``
    (``resources={"GPU": 1}``), so give each GPU worker ``--resources GPU=1``: a worker then never
    runs two extraction tasks at once. Dask does the distribution; nothing here schedules, queues or
    sends anything itself. The workers' ``crsrepro`` log records are forwarded to this process.

Every worker must see the same data root, feature cache and output folder (a shared filesystem).
A failed task stops the run with its error; what finished is kept, and the next run resumes.

Progress (issue 29.1): every executor counts each finished task on its stage's :class:`~crsrepro.run.progress.Bar`
(a header, then a bar or plain lines, :mod:`crsrepro.run.progress`); each task runs under
:func:`~crsrepro.run.progress.timed` where it runs, so its wall interval and CPU seconds come back with it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from logging.handlers import QueueHandler, QueueListener
from typing import Callable

from crsrepro.core.errors import CrsreproError
from crsrepro.run.progress import Progress, Spent, as_progress, timed

EXECUTORS = ("serial", "local", "dask")
DEFAULT_EXECUTOR = "local"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies


@dataclass(frozen=True)
class Task:
    """One keyed task: ``func(*args)``, after the task named ``after``; ``gpu``: it holds a GPU; ``stage``:
    the stage whose bar and time it counts in (``grid extraction``, ``probe fits``, ``depth``, ``LoRA``)."""

    key: str
    func: Callable
    args: tuple
    after: str | None = None
    gpu: bool = False
    stage: str = "tasks"


def default_workers() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def execute(tasks: list[Task], *, executor: str = DEFAULT_EXECUTOR, workers: int | None = None,
            scheduler: str | None = None, progress: bool | Progress = False, about: str = "") -> None:
    """Run ``tasks`` (each after the one it depends on) with ``executor``; raise the first task's error.

    Each task stage among ``tasks`` gets a header and a bar, named ``<stage> (<about>)``, e.g.
    ``probe fits (demo)``, on ``progress`` (:func:`~crsrepro.run.progress.as_progress`: ``False`` shows
    nothing), which records each stage's time once its last task is done.

    Raises
    ------
    CrsreproError
        An unknown executor, a bad worker count, or ``scheduler`` without ``executor="dask"``.
    """
    if executor not in EXECUTORS:
        raise CrsreproError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise CrsreproError(f"--workers must be at least 1, not {workers}")
    if scheduler and executor != "dask":
        raise CrsreproError(f"--scheduler {scheduler} needs --executor dask (not {executor})")
    if not tasks:
        return
    workers = workers or default_workers()
    progress = as_progress(progress)
    stages = [f"{task.stage} ({about})" if about else task.stage for task in tasks]
    with ExitStack() as bars:
        bar = {name: bars.enter_context(progress.bar(name, count)) for name, count in Counter(stages).items()}
        bar_of = {task.key: bar[name] for task, name in zip(tasks, stages)}

        def finished(task: Task, spent: Spent) -> None:
            bar_of[task.key].advance(spent)

        if executor == "serial":
            _serial(tasks, finished)
        elif executor == "local":
            _local(tasks, workers, finished)
        else:
            _dask(tasks, workers, scheduler, finished)


def one_thread() -> None:
    """Give this process one torch thread and one thread in every BLAS/OpenMP pool (threadpoolctl)."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)


def _call(func: Callable, args: tuple, *_after) -> tuple[object, Spent]:
    """A task on a Dask worker, with one thread, :func:`~crsrepro.run.progress.timed` (``_after``: the
    result of the task it waited for)."""
    one_thread()
    return timed(func, args)


def _serial(tasks: list[Task], finished: Callable[[Task, Spent], None]) -> None:
    """Every task in this process with one torch and one BLAS/OpenMP thread, as on a worker, then the
    process's own counts back: a task's numbers must not depend on the executor, and a multi-threaded
    product rounds differently (a cross-validated C choice or a long solve can turn that last bit into
    another C)."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            for task in tasks:
                finished(task, timed(task.func, task.args)[1])
    finally:
        torch.set_num_threads(threads)


def _local(tasks: list[Task], workers: int, finished: Callable[[Task, Spent], None]) -> None:
    """A spawn-context process pool (a forked torch is not safe); each task is submitted when the task
    it depends on is done, and at most one GPU task runs at a time. The workers die with this process
    and log through it (:func:`_worker_init`)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")
    records = context.Queue()
    listener = QueueListener(records, _ToThisProcess())
    listener.start()
    levels = {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "crsrepro")}
    waiting, done, running = list(tasks), set(), {}
    try:
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                 initargs=(os.getpid(), records, levels)) as pool:
            try:
                while waiting or running:
                    gpu_busy = any(t.gpu for t in running.values())
                    for task in [t for t in waiting if t.after is None or t.after in done]:
                        if task.gpu and gpu_busy:
                            continue
                        gpu_busy = gpu_busy or task.gpu
                        waiting.remove(task)
                        running[pool.submit(timed, task.func, task.args)] = task
                    ended, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in ended:
                        task = running.pop(future)
                        _, spent = future.result()  # a task's error stops the run here
                        done.add(task.key)
                        finished(task, spent)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # what is running finishes and is kept
                raise
    finally:
        listener.stop()  # after the workers have exited: every record they sent is handled first


def _worker_init(parent: int, records, levels: dict) -> None:
    """A pool worker's start: it dies with its parent, logs through it, and runs one thread.

    - **No orphans** (issue 26): on Linux the kernel sends the worker SIGKILL when the process that
      started it dies (``prctl(PR_SET_PDEATHSIG)``), even by SIGKILL; a worker whose parent died before
      that call exits at once. Elsewhere a worker outlives a killed parent, as before.
    - **No lost warnings**: the worker's log records go, through ``records``, to the parent, which hands
      each to its own logger of that name (:class:`_ToThisProcess`), so a warning a task logs is shown
      once, by the parent's handlers, as if the parent had logged it. ``levels``: the parent's levels
      of the root and ``crsrepro`` loggers, so a worker sends only what the parent would show.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    root = logging.getLogger()
    root.handlers[:] = [_ToParent(records)]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    one_thread()


class _ToParent(QueueHandler):
    """Send a worker's record to the parent (the logging cookbook's sending side), keeping the message as
    it was before its arguments were filled in (``record.template``): the parent counts the repeats of a
    warning by it (:class:`crsrepro.run.progress.RepeatedWarnings`)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        template = record.msg
        record = super().prepare(record)
        record.template = template
        return record


class _ToThisProcess(logging.Handler):
    """Hand a record that a worker logged to this process's logger of the same name (what the parent's
    levels and handlers then show): the logging cookbook's receiving side of a ``QueueHandler``."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def _dask(tasks: list[Task], workers: int, scheduler: str | None, finished: Callable[[Task, Spent], None]) -> None:
    """Dask distributed: submit every task with its dependency and ``GPU`` resource, count each as it ends."""
    try:
        import dask
        from distributed import Client, LocalCluster, as_completed
    except ImportError as exc:
        raise CrsreproError("--executor dask needs Dask distributed: pip install 'crsrepro[scale]'") from exc

    # DataLoader workers (features.num_workers) are child processes: a daemonic worker may not have any
    with dask.config.set({"distributed.worker.daemon": False}):
        if scheduler:
            cluster, client = None, Client(scheduler)
        else:
            gpu = any(t.gpu for t in tasks)
            if gpu and workers > 1:
                raise CrsreproError(f"a LocalCluster of {workers} workers on a cuda profile would put {workers} "
                                    f"extraction tasks on one GPU: use --executor local, --workers 1, or a "
                                    f"cluster whose GPU workers declare --resources GPU=1 (--scheduler ADDRESS)")
            # no dashboard; the scheduler's HTTP routes on a free local port, not on 8787, where a second
            # cluster on a shared machine found it taken and warned
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   resources={"GPU": 1} if gpu else None, dashboard_address=None,
                                   scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
            client = Client(cluster)
        try:
            client.forward_logging("crsrepro")  # a task's log records are handled here, as on the local pool
            futures = {}
            for task in tasks:
                after = (futures[task.after],) if task.after else ()
                futures[task.key] = client.submit(_call, task.func, task.args, *after, key=task.key, pure=False,
                                                  resources={"GPU": 1} if task.gpu else None)
            by_key = {task.key: task for task in tasks}
            for future in as_completed(list(futures.values())):
                _, spent = future.result()  # a task's error stops the run here
                finished(by_key[future.key], spent)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
