"""What a command shows while its stages run, and what each stage cost (issue 29.1, DESIGN.md section 13).

Each stage of ``crsrepro run`` and ``crsrepro book`` (demo world, planning, grid extraction, probe fits,
the coverage profile's grid, depth, LoRA, chapters, HTML) prints one header line,
``== probe fits (demo): 450 tasks ==``, then its progress: on a terminal a tqdm bar of completed / total
tasks with an ETA; where stdout is not a terminal (CI, ``| tee``) a plain line
``[probe fits (demo)] 45/450 (10 %), 1 min 2 s elapsed, ETA 9 min 18 s`` every :data:`EVERY_FRACTION` of
its tasks or every :data:`EVERY_SECONDS`, whichever comes first (a thread says so while one long task
runs), and a last line when it ends. The same :class:`Bar` serves the serial, process-pool and Dask
executors (:mod:`crsrepro.run.executor`). At the end the command prints :meth:`Progress.table`, each
stage's tasks, wall time and CPU time; the book's status page repeats it (:meth:`Progress.markdown`).
Everything goes to stdout, one flushed line at a time; ``quiet`` (``-q``) shows none of it, and the
times are still recorded. Warnings and errors are logging's, on stderr, and always show.

Times
-----
wall
    The time during which at least one of the stage's tasks was running (the union of its tasks'
    intervals): in the serial executor the sum of its tasks' times; on a pool the grid extraction and
    the probe fits overlap (a cell's probes start once its features are cached), and so do their walls.
CPU
    User + system seconds of the processes that ran the stage's tasks (:func:`cpu_seconds`), measured
    where each task runs (a pool or Dask worker, or this process) and summed: a pool's CPU exceeds its
    wall. A pool's scheduling in this process, which mostly waits, is not counted.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, TextIO

#: A plain line each time another tenth of a stage's tasks is done (issue 29.1) ...
EVERY_FRACTION = 0.10
#: ... or when this many seconds passed since the last line, whichever comes first (issue 29.1).
EVERY_SECONDS = 30.0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have ended (a DataLoader's
    workers, a notebook's kernel, the HTML build)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True)
class Spent:
    """What one task cost: its start and end (``time.time()``, comparable across a cluster's machines)
    and its CPU seconds (:func:`cpu_seconds`)."""

    start: float
    end: float
    cpu: float


def timed(func: Callable, args: tuple) -> tuple[object, Spent]:
    """``func(*args)`` and what it cost, measured in the process that runs it (a worker's wrapper)."""
    start, cpu = time.time(), cpu_seconds()
    result = func(*args)
    return result, Spent(start, time.time(), cpu_seconds() - cpu)


def busy_seconds(spent: list[Spent]) -> float:
    """The seconds during which at least one of the tasks was running (the union of their intervals).

    >>> busy_seconds([Spent(0, 2, 0), Spent(1, 3, 0), Spent(5, 6, 0)])
    4
    """
    total, reach = 0, -math.inf
    for s in sorted(spent, key=lambda s: s.start):
        total += max(0, s.end - max(s.start, reach))
        reach = max(reach, s.end)
    return total


def duration(seconds: float) -> str:
    """Seconds as a reader says them.

    >>> duration(12.3), duration(62), duration(3 * 3600 + 125)
    ('12 s', '1 min 2 s', '3 h 2 min')
    """
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@dataclass(frozen=True)
class StageTime:
    """One row of the stage table: a stage, its tasks, its wall and CPU seconds (see the module's Times)."""

    stage: str
    tasks: int
    wall: float
    cpu: float


class Progress:
    """Where one command's headers, bars, plain lines and stage times go.

    Parameters
    ----------
    quiet : bool
        Show nothing (``-q``); the stage times are still recorded.
    stream : file, optional
        Default: ``sys.stdout``.
    tty : bool, optional
        Draw tqdm bars (default: whether ``stream`` is a terminal); else plain lines.
    clock : callable
        Seconds since the epoch, as in :class:`Spent`: the elapsed times, the ETAs and the plain lines'
        throttle (a test passes a fake one).
    heartbeat : bool
        Plain lines only: a thread prints the line that is due while a long task runs (off for a fake clock).
    """

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.time, heartbeat: bool = True):
        self.quiet = quiet
        self.stream = sys.stdout if stream is None else stream
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.heartbeat = heartbeat
        self.started = clock()
        self.times: list[StageTime] = []
        self.lock = threading.RLock()  # a bar's thread and the executor's loop print and count

    @property
    def bars(self) -> bool:
        """Whether tqdm bars are drawn (a terminal, not quiet): where a task's own inner bars may show."""
        return self.tty and not self.quiet

    def say(self, text: str) -> None:
        """Print one line (above any tqdm bar on a terminal) and flush it, unless quiet."""
        if self.quiet:
            return
        with self.lock:
            if self.tty:
                from tqdm import tqdm

                tqdm.write(text, file=self.stream)
            else:
                print(text, file=self.stream)
            self.stream.flush()

    def bar(self, stage: str, total: int, detail: str | None = None) -> "Bar":
        """Print ``stage``'s header (``detail``, default ``<total> tasks``) and start its :class:`Bar`."""
        self.say(f"== {stage}: {detail or _tasks(total)} ==")
        return Bar(self, stage, total)

    def call(self, stage: str, detail: str, func: Callable, *args) -> object:
        """A one-task stage this process runs itself (the demo world, the HTML build): its header, then
        ``func(*args)`` timed; return what it returns."""
        with self.bar(stage, 1, detail) as bar:
            return bar.call(func, *args)

    def table(self) -> str:
        """The stage table as plain text, with a total row (the command's wall so far, the stages' CPU)."""
        width = max([len(t.stage) for t in self.times] + [len("stage")])
        rows = [f"{'stage':<{width}}  {'tasks':>6}  {'wall s':>9}  {'CPU s':>9}"]
        rows += [f"{t.stage:<{width}}  {t.tasks:>6}  {t.wall:>9.1f}  {t.cpu:>9.1f}" for t in self.times]
        rows.append(f"{'total':<{width}}  {'':>6}  {self.clock() - self.started:>9.1f}  "
                    f"{sum(t.cpu for t in self.times):>9.1f}")
        return "\n".join(rows)

    def markdown(self) -> str:
        """The stage table as a Markdown table (the book's status page)."""
        rows = [f"| {t.stage} | {t.tasks} | {t.wall:.1f} | {t.cpu:.1f} |" for t in self.times]
        return "\n".join(["| stage | tasks | wall (s) | CPU (s) |", "|---|---|---|---|", *rows])


def as_progress(progress: "bool | Progress") -> Progress:
    """A :class:`Progress`: ``progress`` itself, or a new one on stdout (``True``) or a quiet one (``False``)."""
    return progress if isinstance(progress, Progress) else Progress(quiet=not progress)


class Bar:
    """One stage's progress: completed / total tasks, shown by its :class:`Progress`; once every task is
    done, its :class:`StageTime` is recorded. Use it as a context manager (its thread stops at exit)."""

    def __init__(self, progress: Progress, stage: str, total: int):
        self.progress, self.stage, self.total = progress, stage, total
        self.done, self.spent = 0, []
        self.started = self.last_line = progress.clock()
        self.steps = 0  # the EVERY_FRACTION steps done at the last plain line
        self.stop = threading.Event()
        self.tqdm = self.beat = None
        if progress.quiet:
            return
        if progress.tty:
            from tqdm import tqdm

            self.tqdm = tqdm(total=total, desc=stage, unit="task", file=progress.stream)
        elif progress.heartbeat:
            self.beat = threading.Thread(target=self._heartbeat, name=f"progress: {stage}", daemon=True)
            self.beat.start()

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, func: Callable, *args) -> object:
        """Run one of the stage's tasks in this process, count it and return what it returns."""
        result, spent = timed(func, args)
        self.advance(spent)
        return result

    def advance(self, spent: Spent) -> None:
        """Count one finished task (``spent``: what it cost); the last one records the stage's time."""
        with self.progress.lock:
            self.done += 1
            self.spent.append(spent)
            if self.tqdm is not None:
                self.tqdm.update(1)
            else:
                self.tick()
            if self.done == self.total:
                self.progress.times.append(StageTime(self.stage, self.total, busy_seconds(self.spent),
                                                     sum(s.cpu for s in self.spent)))
                self.close()

    def tick(self) -> None:
        """Print the plain line if it is due: another :data:`EVERY_FRACTION` done, :data:`EVERY_SECONDS` since the last
        line, or the last task done."""
        with self.progress.lock:
            now, steps = self.progress.clock(), math.floor(self.done / self.total / EVERY_FRACTION + 1e-9)
            due = steps > self.steps or now - self.last_line >= EVERY_SECONDS or self.done == self.total
            if self.stop.is_set() or not due:
                return
            self.last_line, self.steps = now, steps
            self.progress.say(self.line(now - self.started))

    def line(self, elapsed: float) -> str:
        """``[probe fits (demo)] 45/450 (10 %), 1 min 2 s elapsed, ETA 9 min 18 s``: elapsed since the header;
        the ETA at the pace since the stage's first task started (a cell's probes wait for its extraction)."""
        text = (f"[{self.stage}] {self.done}/{self.total} ({100 * self.done // self.total} %), "
                f"{duration(elapsed)} elapsed")
        if 0 < self.done < self.total:
            running = self.progress.clock() - min(s.start for s in self.spent)
            text += f", ETA {duration(running / self.done * (self.total - self.done))}"
        return text

    def _heartbeat(self) -> None:
        """A plain line every :data:`EVERY_SECONDS` without one, while a long task runs."""
        while not self.stop.wait(max(self.last_line + EVERY_SECONDS - self.progress.clock(), 0.0)):
            self.tick()

    def close(self) -> None:
        """Stop the bar (its thread, its tqdm bar); an unfinished stage records no time."""
        self.stop.set()
        if self.tqdm is not None:
            self.tqdm.close()
            self.tqdm = None


class RepeatedWarnings(logging.Filter):
    """A filter for a command's log handler: the first warning of each kind passes, the repeats are counted.

    A kind is the logger and the message before its arguments are filled in (``record.msg``, or
    ``record.template`` for a record a pool worker sent: :mod:`crsrepro.run.executor`), so "labels [7] of
    unit A" and "labels [1] of unit B" are one kind. At the end the command prints
    :meth:`summary`, one line per kind that repeated, with its count. Errors and other levels always
    pass; ``-v`` (every record) does not install the filter.

    >>> shown = RepeatedWarnings()
    >>> [shown.filter(logging.makeLogRecord({"name": "x", "levelno": logging.WARNING, "msg": "label %s", "args": (j,)}))
    ...  for j in range(3)]
    [True, False, False]
    >>> shown.summary()
    ['WARNING x: 2 more warnings like "label 0" were not shown (-v shows each)']
    """

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[tuple[str, str], str] = {}
        self.repeats: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        kind = (record.name, str(getattr(record, "template", record.msg)))
        if kind not in self.first:
            self.first[kind] = record.getMessage()
            return True
        self.repeats[kind] = self.repeats.get(kind, 0) + 1
        return False

    def summary(self) -> list[str]:
        """One line per kind of warning that repeated: how many more were not shown."""
        return [f'WARNING {name}: {n} more warning{"s" if n > 1 else ""} like "{self.first[(name, msg)]}" '
                f'{"were" if n > 1 else "was"} not shown (-v shows each)' for (name, msg), n in self.repeats.items()]


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


__all__ = ["EVERY_FRACTION", "EVERY_SECONDS", "Bar", "Progress", "RepeatedWarnings", "Spent", "StageTime", "as_progress",
           "busy_seconds", "cpu_seconds", "duration", "timed"]
