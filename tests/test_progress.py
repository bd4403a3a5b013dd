"""Progress on every stage, on every executor (issue 29.1): a header per stage, then a tqdm bar on a terminal or
a plain line every 10 % or 30 s elsewhere, a stage table at the end, and nothing at all with -q. The pool and
Dask executors' progress is tested in tests/test_executor.py."""

import io
import time

import pytest

from crsrepro.cli import build_parser
from crsrepro.run import executor, progress as progress_module
from crsrepro.run.progress import Progress, Spent, StageTime


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plain(clock=None, **kwargs) -> tuple[Progress, io.StringIO]:
    """A Progress writing plain lines (not a terminal) into a string, without its heartbeat thread."""
    stream = io.StringIO()
    return Progress(stream=stream, tty=False, clock=clock or FakeClock(), heartbeat=False, **kwargs), stream


def run_bar(progress: Progress, clock: FakeClock, total: int, seconds_per_task: float) -> list[str]:
    """Finish ``total`` tasks of ``seconds_per_task`` each on one bar; return the lines it printed."""
    with progress.bar("probe fits (demo)", total) as bar:
        for i in range(total):
            clock.now += seconds_per_task
            bar.advance(Spent(i * seconds_per_task, (i + 1) * seconds_per_task, 0.5 * seconds_per_task))
    return progress.stream.getvalue().splitlines()


def counts(lines: list[str]) -> list[int]:
    """The completed counts of the plain progress lines."""
    return [int(line.split("] ")[1].split("/")[0]) for line in lines if line.startswith("[")]


def test_a_plain_line_every_tenth_of_the_tasks_and_a_last_one():
    clock = FakeClock()
    progress, _ = plain(clock)
    lines = run_bar(progress, clock, 450, 0.0625)  # 28.1 s in all: the 30 s throttle never fires
    assert lines[0] == "== probe fits (demo): 450 tasks =="
    assert counts(lines) == list(range(45, 451, 45))
    assert lines[1] == "[probe fits (demo)] 45/450 (10 %), 3 s elapsed, ETA 25 s"
    assert lines[-1] == "[probe fits (demo)] 450/450 (100 %), 28 s elapsed"


def test_a_plain_line_every_30_seconds_between_the_tenths():
    clock = FakeClock()
    progress, _ = plain(clock)
    lines = run_bar(progress, clock, 1000, 1.0)  # a tenth is 100 s
    assert counts(lines)[:8] == [30, 60, 90, 100, 130, 160, 190, 200]
    assert lines[1] == "[probe fits (demo)] 30/1000 (3 %), 30 s elapsed, ETA 16 min 10 s"
    assert counts(lines)[-1] == 1000


def test_a_finished_stage_records_its_tasks_wall_and_cpu():
    clock = FakeClock()
    progress, _ = plain(clock)
    run_bar(progress, clock, 4, 2.0)
    assert progress.times == [StageTime("probe fits (demo)", 4, 8.0, 4.0)]
    clock.now = 10.0
    table = progress.table().splitlines()
    assert table[0].split() == ["stage", "tasks", "wall", "s", "CPU", "s"]
    assert table[1].split() == ["probe", "fits", "(demo)", "4", "8.0", "4.0"]
    assert table[2].split() == ["total", "10.0", "4.0"]
    assert progress.markdown().splitlines()[-1] == "| probe fits (demo) | 4 | 8.0 | 4.0 |"


def test_the_wall_of_overlapping_tasks_is_the_time_any_of_them_ran():
    clock = FakeClock()
    progress, _ = plain(clock)
    with progress.bar("grid extraction (demo)", 3) as bar:
        for spent in (Spent(0.0, 4.0, 4.0), Spent(1.0, 5.0, 4.0), Spent(10.0, 11.0, 1.0)):
            bar.advance(spent)
    assert progress.times == [StageTime("grid extraction (demo)", 3, 6.0, 9.0)]


def test_an_unfinished_stage_records_no_time():
    progress, _ = plain()
    with pytest.raises(RuntimeError):
        with progress.bar("LoRA (demo)", 2) as bar:
            bar.advance(Spent(0.0, 1.0, 1.0))
            raise RuntimeError("a task failed")
    assert progress.times == []


def test_a_long_task_gets_a_line_every_30_seconds(monkeypatch):
    monkeypatch.setattr(progress_module, "EVERY_SECONDS", 0.1)
    stream = io.StringIO()
    progress = Progress(stream=stream, tty=False)
    with progress.bar("LoRA (demo)", 1) as bar:
        time.sleep(0.5)  # one long task: no count moves, the heartbeat speaks
        bar.advance(Spent(0.0, 0.5, 0.5))
    lines = stream.getvalue().splitlines()
    assert sum(line.startswith("[LoRA (demo)] 0/1 (0 %)") for line in lines) >= 2
    assert lines[-1].startswith("[LoRA (demo)] 1/1 (100 %)")


def test_a_terminal_gets_a_tqdm_bar_and_no_plain_lines():
    stream = io.StringIO()
    progress = Progress(stream=stream, tty=True)
    with progress.bar("depth (demo)", 3) as bar:
        for _ in range(3):
            bar.advance(Spent(0.0, 1.0, 1.0))
    text = stream.getvalue()
    assert text.startswith("== depth (demo): 3 tasks ==\n")
    assert "depth (demo): 100%" in text and "3/3" in text and "\r" in text  # tqdm's bar
    assert "[depth (demo)]" not in text


def test_quiet_prints_nothing_and_still_records_the_times():
    stream = io.StringIO()
    progress = Progress(quiet=True, stream=stream, tty=False)
    progress.say("a header")
    assert progress.call("HTML (demo)", "jupyter-book build", sum, (1, 2)) == 3
    assert stream.getvalue() == ""
    assert [(t.stage, t.tasks) for t in progress.times] == [("HTML (demo)", 1)]


def test_the_serial_executor_counts_each_task_on_its_stages_bar():
    progress, stream = plain()
    tasks = [executor.Task("a", sum, ((1, 2),), stage="grid extraction"),
             executor.Task("b", sum, ((3,),), after="a", stage="probe fits"),
             executor.Task("c", sum, ((4,),), after="a", stage="probe fits")]
    executor.execute(tasks, executor="serial", progress=progress, about="toy")
    lines = stream.getvalue().splitlines()
    assert lines[:2] == ["== grid extraction (toy): 1 task ==", "== probe fits (toy): 2 tasks =="]
    assert any(line.startswith("[grid extraction (toy)] 1/1 (100 %), ") for line in lines)
    assert any(line.startswith("[probe fits (toy)] 2/2 (100 %), ") for line in lines)
    assert [(t.stage, t.tasks) for t in progress.times] == [("grid extraction (toy)", 1), ("probe fits (toy)", 2)]


@pytest.mark.parametrize("argv", [["run"], ["book"]])
def test_quiet_goes_before_or_after_the_command(argv):
    parser = build_parser()
    assert parser.parse_args(argv).quiet is False
    assert parser.parse_args(["-q", *argv]).quiet is True
    assert parser.parse_args([*argv, "-q"]).quiet is True
    assert parser.parse_args([*argv, "--quiet"]).quiet is True


@pytest.mark.parametrize("verbose", [False, True])
def test_a_command_shows_each_kind_of_warning_once_and_counts_the_rest(verbose, monkeypatch, capsys):
    import logging

    from crsrepro.cli import _log_setup

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a fresh process: logging not yet set up
    monkeypatch.setattr(root, "level", root.level)
    log = logging.getLogger("crsrepro.fit.calibration")
    with _log_setup(verbose):
        for label in (7, 1, 7):
            log.warning("%s: labels [%d] have a single class", "TemperatureScaling", label)
        log.warning("another kind")
        log.error("an error always shows")
        log.error("an error always shows")
    err = capsys.readouterr().err.splitlines()
    if verbose:
        assert len(err) == 6 and not any("not shown" in line for line in err)
        return
    assert err == ["WARNING crsrepro.fit.calibration: TemperatureScaling: labels [7] have a single class",
                   "WARNING crsrepro.fit.calibration: another kind",
                   "ERROR crsrepro.fit.calibration: an error always shows",
                   "ERROR crsrepro.fit.calibration: an error always shows",
                   'WARNING crsrepro.fit.calibration: 2 more warnings like "TemperatureScaling: labels [7] have a '
                   'single class" were not shown (-v shows each)']
    assert not any(f.__class__.__name__ == "RepeatedWarnings" for h in root.handlers for f in h.filters)


# ------------------------------------------------------------------ a redirected smoke book, end to end
# (tests/conftest.py builds the smoke book as ``crsrepro book --profile smoke`` into a pipe, on the default pool)

BOOK_STAGES = ("demo world (smoke)", "planning (smoke)", "grid extraction (smoke)", "probe fits (smoke)",
               "depth (smoke)", "LoRA (smoke)", "chapters (smoke)", "HTML (smoke)")


@pytest.mark.slow
def test_a_redirected_smoke_book_prints_each_stage_and_the_table(smoke_book):
    book = smoke_book.book
    lines = book.stdout.splitlines()
    for stage in BOOK_STAGES:
        assert any(line.startswith(f"== {stage}: ") for line in lines), stage  # its header
        assert any(line.startswith(f"[{stage}] ") for line in lines), stage  # at least one progress line
        assert sum(line.startswith(f"[{stage}] ") and "(100 %)" in line for line in lines) == 1, stage  # its last
    table = lines[lines.index("== stage times ==") + 1:]
    assert table[0].split() == ["stage", "tasks", "wall", "s", "CPU", "s"] and table[-1].split()[0] == "total"
    rows = {line.rsplit(None, 3)[0]: line.split()[-3:] for line in table[1:-1]}
    assert list(rows) == list(BOOK_STAGES)
    extraction = int(next(line for line in lines if line.startswith("== grid extraction")).split()[-3])
    assert int(rows["grid extraction (smoke)"][0]) == extraction > 0
    for pooled in ("probe fits (smoke)", "depth (smoke)", "LoRA (smoke)"):
        assert float(rows[pooled][2]) > 1.0, pooled  # the pool workers' CPU came back
    assert "\r" not in book.stdout  # no bar drawn into a pipe
    # a warning that many units log is shown once, with a count (its 56 lines buried the progress lines)
    assert sum("have a single class in the calibration subset" in line for line in book.stderr.splitlines()) <= 2


@pytest.mark.slow
def test_quiet_silences_the_headers_bars_and_table(smoke_book):
    quiet = smoke_book.quiet_run
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout.splitlines() == [quiet.stdout.splitlines()[0]]
    assert quiet.stdout.split()[1:3] == ["result", "rows"]


def test_the_status_page_repeats_the_stage_table(tmp_path):
    from crsrepro.present.book import write_status_page

    clock = FakeClock()
    progress, _ = plain(clock)
    run_bar(progress, clock, 4, 2.0)
    text = write_status_page(tmp_path, "demo", {}, progress.markdown()).read_text()
    assert "## Stage times" in text and "| stage | tasks | wall (s) | CPU (s) |\n|---|---|---|---|\n" \
        "| probe fits (demo) | 4 | 8.0 | 4.0 |\n" in text
    assert "## Stage times" not in write_status_page(tmp_path, "demo", {}).read_text()
