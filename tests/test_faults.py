"""Faults (DESIGN.md section 13): a run interrupted anywhere resumes to the table, per-case files, feature arrays and
reference frame of an uninterrupted run, bit for bit, with no half-written file; a corrupt store file
is noticed on read and recomputed; two runs are identical (seeds come from the profile only).

20 seeded interruptions are injected in-process (an exception at the k-th call of the feature
extraction, a probe fit, a write of a feature entry, a per-case file, a row-set, its digest, the merged
table, or the frame; for a write, either half-way through it or just after it), and 2 real SIGKILLs hit
a ``python -m crsrepro run`` subprocess at a seeded moment."""

import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import crsrepro.core.io
import crsrepro.extract.features
import crsrepro.fit.controls
import crsrepro.fit.linear
import crsrepro.run.results
import crsrepro.score.crs
from crsrepro.core.errors import CrsreproError
from crsrepro.run import grid
from crsrepro.run.results import ResultStore, load_results
from crsrepro.score.frame import frame_path, freeze_frame

pytestmark = pytest.mark.slow  # minutes of grids, processes or training: the full suite runs it, test-fast does not

N_INJECTED = 20
SEED = 17  # [ours] the seed of the interruption points and of the kill moments


class InjectedFault(Exception):
    """The fault a test injects."""


# (name, module or class, attribute, is a writer: atomic_write(path, data))
POINTS = [("feature extraction", crsrepro.extract.features, "_extract_chunk", False),
          ("feature cache write", crsrepro.extract.features, "atomic_write", True),
          ("linear probe fit", crsrepro.fit.linear, "fit_linear_probes", False),
          ("kNN probe fit", crsrepro.fit.controls.KNNProbe, "fit", False),
          ("per-case file or digest write", crsrepro.run.results, "atomic_write", True),
          ("row-set or merged table write", crsrepro.core.io, "atomic_write", True),
          ("frame freeze", crsrepro.score.crs, "atomic_write", True)]


def _run_and_freeze(world):
    """What ``crsrepro run`` then ``crsrepro freeze-frame`` do; a frame left by a run interrupted after
    writing it is kept (a frozen frame is never replaced)."""
    profile = world.profile()
    results = grid.run_grid(profile, progress=False, executor="serial")
    if not frame_path(profile).is_file():
        freeze_frame(profile, results)
    return frame_path(profile).read_bytes()


def _clear(world):
    world.clear()
    frame_path(world.profile()).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def reference(micro_world):
    """A cold, uninterrupted run: its state and frame, and how often each point is called in it (after
    a first run has written the demo world and the manifests, which every later run finds)."""
    _clear(micro_world)
    grid.run_grid(micro_world.profile(), progress=False, executor="serial")
    calls = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, owner, attribute, _ in POINTS:
            real = getattr(owner, attribute)

            def counted(*args, _real=real, _name=name, **kwargs):
                calls[_name] = calls.get(_name, 0) + 1
                return _real(*args, **kwargs)
            patch.setattr(owner, attribute, counted)
        _clear(micro_world)
        frame = _run_and_freeze(micro_world)
    return micro_world.state(), frame, calls


def _faulty(real, k, writer, half_way, counter):
    """``real`` that raises :class:`InjectedFault` at its k-th call: a writer either half-way through
    writing its file or just after it."""
    def wrapper(*args, **kwargs):
        counter[0] += 1
        if counter[0] != k:
            return real(*args, **kwargs)
        if not writer:
            raise InjectedFault
        if half_way:
            path, data = args

            def half(f):
                f.write(b"half a file")
                raise InjectedFault
            return real(path, half)
        real(*args, **kwargs)
        raise InjectedFault
    return wrapper


def test_two_runs_are_identical(micro_world, reference):
    state, frame, _ = reference
    _clear(micro_world)
    assert _run_and_freeze(micro_world) == frame
    micro_world.assert_state(state)


def test_a_run_interrupted_at_20_seeded_points_resumes_to_the_same_results(micro_world, reference):
    state, frame, calls = reference
    assert all(calls.get(name) for name, *_ in POINTS), calls  # every point is reached by a run
    rng = np.random.default_rng(SEED)
    for trial in range(N_INJECTED):
        name, owner, attribute, writer = POINTS[rng.integers(len(POINTS))]
        k, half_way = int(rng.integers(1, calls[name] + 1)), bool(rng.integers(2))
        _clear(micro_world)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(owner, attribute, _faulty(getattr(owner, attribute), k, writer, half_way, [0]))
            try:
                _run_and_freeze(micro_world)
            except InjectedFault:
                pass
            else:
                pytest.fail(f"trial {trial}: no fault at call {k} of the {name}")
        assert _run_and_freeze(micro_world) == frame, (trial, name, k, half_way)
        micro_world.assert_state(state)


def _kill_at(world, executor, wait_for, delay, rng):
    """Start ``crsrepro run`` (in its own process group), wait until ``wait_for`` exists, sleep a
    seeded moment up to ``delay`` s and SIGKILL the group (the run and its workers)."""
    command = [sys.executable, "-m", "crsrepro", "-q", "run", "--profile", str(world.profile_path),
               "--executor", executor, "--workers", "2"]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not any(world.root.glob(wait_for)) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(rng.uniform(0, delay))
    assert process.poll() is None, f"the run ended before it was killed: {process.stderr.read().decode()[-500:]}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_two_sigkills_then_a_resume_give_the_same_results(micro_world, reference):
    state, _, _ = reference
    rng = np.random.default_rng(SEED)
    # one kill while features are extracted (serial), one while probes are fitted (a 2-process pool)
    for executor, wait_for in (("serial", ".crsrepro/cache/features/*"), ("local", ".crsrepro/micro/results/runs/*")):
        _clear(micro_world)
        _kill_at(micro_world, executor, wait_for, 0.5, rng)
        assert not ResultStore(micro_world.profile().output_path).merged_path.is_file()
        grid.run_grid(micro_world.profile(), progress=False, executor="serial")  # the resume
        micro_world.assert_state(state)


def test_a_corrupt_store_file_is_recomputed_with_a_warning(micro_world, reference, caplog):
    state, _, _ = reference
    _clear(micro_world)
    grid.run_grid(micro_world.profile(), progress=False, executor="serial")
    store = ResultStore(micro_world.profile().output_path)
    rowset = sorted(store.runs_dir.glob("*.parquet"))[0]
    cases = sorted(store.cases_dir.glob("*.npz"))[-1]
    for path in (rowset, cases, store.merged_path):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    with pytest.raises(CrsreproError, match=f"{cases.name} is corrupt.*rerun `crsrepro run`"):
        store.read_cases(cases.stem)
    with pytest.raises(CrsreproError, match="results.parquet is corrupt"):
        load_results(store.root)
    with caplog.at_level(logging.WARNING, logger="crsrepro.run.results"):
        grid.run_grid(micro_world.profile(), progress=False, executor="serial")
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"{rowset.name} is corrupt" in warned and f"{cases.name} is corrupt" in warned
    assert "results.parquet is corrupt" in warned and "merged again" in warned
    micro_world.assert_state(state)


def test_a_corrupt_feature_entry_is_recomputed_with_one_warning_on_a_process_pool(micro_world, reference, caplog):
    """The warning is logged in a pool worker and shown by the parent, once (issue 26)."""
    state, _, _ = reference
    profile = micro_world.profile()
    _clear(micro_world)
    grid.run_grid(profile, progress=False, executor="serial")
    entry = sorted(profile.feature_cache_path.rglob("*.npy"))[0]
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF  # in the array, after the header
    entry.write_bytes(bytes(data))
    shutil.rmtree(profile.output_path)  # every row-set to compute again, from the cached features
    with caplog.at_level(logging.WARNING, logger="crsrepro"):
        grid.run_grid(profile, progress=False, executor="local", workers=2)
    warned = [r for r in caplog.records if "feature cache entry" in r.getMessage()]
    assert len(warned) == 1 and entry.name in warned[0].getMessage() and "recomputing" in warned[0].getMessage()
    assert warned[0].process != os.getpid()  # logged in a worker
    micro_world.assert_state(state)
