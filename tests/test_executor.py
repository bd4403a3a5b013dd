"""DESIGN.md section 13: the grid's keyed tasks give the same table, row-set by row-set and feature by
feature, in this process (serial, the reference), on a 2-process pool and on a 2-worker Dask
LocalCluster (one torch/BLAS thread per task), each from a cold cache; a pool's workers die with their
parent and log through it (issue 26)."""

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crsrepro.run import executor, grid
from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import load_profile

pytestmark = pytest.mark.slow  # minutes of grids, processes or training: the full suite runs it, test-fast does not


@pytest.fixture(scope="module")
def reference(micro_world):
    micro_world.clear()
    grid.run_grid(micro_world.profile(), progress=False, executor="serial")
    return micro_world.state()


def test_the_local_pool_gives_the_serial_table(micro_world, reference):
    micro_world.clear()
    table = grid.run_grid(micro_world.profile(), progress=False, executor="local", workers=2)
    assert table["rowset"].nunique() == 2 * 2 * 2  # cells x seeds x probes (linear, knn)
    micro_world.assert_state(reference)


def test_a_dask_local_cluster_gives_the_serial_table(micro_world, reference):
    """Beside another cluster (port 8787 taken, as on a shared machine), without a warning."""
    import socket
    import warnings

    pytest.importorskip("distributed")
    micro_world.clear()
    with socket.socket() as taken, warnings.catch_warnings():
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("", 8787))
        taken.listen()
        warnings.filterwarnings("error", message="Port .* is already in use")
        grid.run_grid(micro_world.profile(), progress=False, executor="dask", workers=2)
    micro_world.assert_state(reference)


def test_probe_tasks_follow_their_extraction_task_and_gpu_tasks_hold_the_gpu(micro_world, reference):
    from crsrepro.run.results import ResultStore

    profile = micro_world.profile()
    store = ResultStore(profile.output_path)
    keys, tasks = grid.GridStage().plan(profile, store)
    assert len(keys) == 8 and tasks == []  # everything is done
    victim = keys[3]
    store.path(victim).unlink()
    _, tasks = grid.GridStage().plan(profile, store)
    extract, probe = tasks
    assert probe.after == extract.key and probe.args[0].key == victim and not extract.gpu and not probe.gpu
    assert (extract.stage, probe.stage) == ("grid extraction", "probe fits")  # two headers, two bars (issue 29.1)
    on_gpu = load_profile(micro_world.profile_path, overrides={"features": {"device": "cuda"}})
    _, tasks = grid.GridStage().plan(on_gpu, store)
    assert [t.gpu for t in tasks] == [True, False]  # only extraction holds the GPU


def test_bad_executor_options_are_one_line_errors():
    task = executor.Task("t", print, ())
    with pytest.raises(CrsreproError, match="unknown executor 'ray'"):
        executor.execute([task], executor="ray")
    with pytest.raises(CrsreproError, match="--workers must be at least 1"):
        executor.execute([task], executor="local", workers=0)
    with pytest.raises(CrsreproError, match="--scheduler .* needs --executor dask"):
        executor.execute([task], executor="local", scheduler="tcp://x:8786")


@pytest.mark.parametrize("name", ["local", "dask"])
def test_a_warning_logged_in_a_worker_task_is_shown_once_by_the_parent(name, caplog):
    if name == "dask":
        pytest.importorskip("distributed")
    from crsrepro.run.progress import RepeatedWarnings

    log = logging.getLogger("crsrepro.tasktest")
    tasks = [executor.Task("warn", log.warning, ("a warning from a task",)),
             executor.Task("inform", log.info, ("a note below the level",)),
             executor.Task("label 7", log.warning, ("labels [%d] have a single class", 7)),
             executor.Task("label 1", log.warning, ("labels [%d] have a single class", 1))]
    with caplog.at_level(logging.WARNING):
        executor.execute(tasks, executor=name, workers=2)
    shown = [r for r in caplog.records if r.name == "crsrepro.tasktest"]
    assert sorted((r.levelname, r.getMessage()) for r in shown) == [
        ("WARNING", "a warning from a task"), ("WARNING", "labels [1] have a single class"),
        ("WARNING", "labels [7] have a single class")]
    assert all(r.process != os.getpid() for r in shown)  # each was logged in a worker
    if name == "local":  # a command shows one of the two labels' warnings and counts the other
        once = RepeatedWarnings()
        assert [once.filter(r) for r in shown].count(True) == 2


BURN = 2_000_000  # sum(range(BURN)): a task that spends CPU in its worker


@pytest.mark.parametrize("name", ["local", "dask"])
def test_a_pool_shows_each_stage_s_progress_and_brings_its_workers_cpu_back(name):
    """Issue 29.1: a pool's tasks are counted on their stage's bar as they end, and the CPU a task spent
    in its worker is the stage's CPU (this process only waits)."""
    import io
    import time as clock

    from crsrepro.run.progress import Progress

    if name == "dask":
        pytest.importorskip("distributed")
    start = clock.process_time()
    sum(range(BURN))
    one_task = clock.process_time() - start
    tasks = [executor.Task(f"burn-{i}", sum, (range(BURN),), stage="grid extraction") for i in range(3)]
    tasks += [executor.Task(f"fit-{i}", sum, (range(BURN),), after=f"burn-{i % 3}", stage="probe fits")
              for i in range(6)]
    stream = io.StringIO()
    progress = Progress(stream=stream, tty=False)
    executor.execute(tasks, executor=name, workers=2, progress=progress, about="toy")
    lines = stream.getvalue().splitlines()
    assert lines[:2] == ["== grid extraction (toy): 3 tasks ==", "== probe fits (toy): 6 tasks =="]
    assert any(line.startswith("[grid extraction (toy)] 3/3 (100 %), ") for line in lines)
    assert [line for line in lines if line.startswith("[probe fits (toy)] ")][-1].startswith("[probe fits (toy)] 6/6 (100 %)")
    times = {t.stage: t for t in progress.times}
    assert (times["grid extraction (toy)"].tasks, times["probe fits (toy)"].tasks) == (3, 6)
    assert times["probe fits (toy)"].cpu > 6 * one_task / 2  # counted in the workers, not in this process
    assert 0 < times["probe fits (toy)"].wall


PARENT = """
import time
from crsrepro.run import executor
executor.execute([executor.Task(str(i), time.sleep, (300,)) for i in range(2)], executor="local", workers=2)
"""


def _children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is ``pid``."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            _, rest = stat.read_text().rsplit(")", 1)
        except OSError:  # it ended meanwhile
            continue
        state, ppid = rest.split()[:2]
        if int(ppid) == pid and state != "Z":
            children.append(int(stat.parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_no_pool_worker_outlives_a_sigkilled_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    deadline = time.monotonic() + 240
    while len(_children(parent.pid)) < 3 and time.monotonic() < deadline:  # two workers and the resource tracker
        assert parent.poll() is None
        time.sleep(0.2)
    workers = _children(parent.pid)
    assert len(workers) >= 3, workers
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    orphans = [pid for pid in workers if _alive(pid)]
    for pid in orphans:  # this test's own processes: leave none behind when it fails
        os.kill(pid, signal.SIGKILL)
    assert not orphans, "a worker outlived its parent"
