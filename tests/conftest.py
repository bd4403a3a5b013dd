"""Shared fixtures: a scratch CRSREPRO_HOME so tests never write into the checkout."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).parents[1]


def pytest_configure(config):
    """Under pytest-xdist each worker computes with its share of the cores (torch's and BLAS's threads), unless
    ``OMP_NUM_THREADS`` says otherwise: two workers of two threads each on 2 cores oversubscribe them, and small
    torch ops then wait on each other (``benchmarks/suite.py``: the fast lane 1.3x faster with one thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers and "OMP_NUM_THREADS" not in os.environ:
        import torch
        from threadpoolctl import threadpool_limits

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        threadpool_limits(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Order the slow tests first and group the tests for pytest-xdist (``make test`` and ``make test-fast`` run
    ``-n auto --dist loadgroup --no-loadscope-reorder``, which hands out the groups in this order).

    - The tests that use a session-scoped fixture of ours (the smoke book) form one group, so it is built once.
    - A slow test that uses none is a group of its own, so the long ones (the reduced dry run, the grid on two
      real-size encoders) run side by side; started first, they do not trail at the end.
    - Every other test is grouped with its file, so its module-scoped fixtures are built once.

    Without xdist only the order applies."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: files keep their order
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        ours = {name: defs[-1].scope for name, defs in (fixtures.name2fixturedefs.items() if fixtures else ())
                if defs[-1].baseid}
        session = sorted(name for name, scope in ours.items() if scope == "session")
        if session:
            item.add_marker(pytest.mark.xdist_group("+".join(session)))
        elif not (item.get_closest_marker("slow") and "module" not in ours.values()):
            item.add_marker(pytest.mark.xdist_group(item.path.name))


def _copy_book_sources(target: Path) -> Path:
    """Copy the book sources (config, toc, stylesheet, pages, notebooks) into ``target``."""
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO / name, target / name)
    shutil.copytree(REPO / "_static", target / "_static")
    shutil.copytree(REPO / "notebooks", target / "notebooks")
    shutil.copytree(REPO / "book", target / "book", ignore=shutil.ignore_patterns("_build", "_generated"))
    shutil.copytree(REPO / "data_manifests", target / "data_manifests",
                    ignore=shutil.ignore_patterns("*_smoke.csv*", "crs_reference_smoke.yaml"))
    return target


@dataclass(frozen=True)
class BuiltBook:
    """The smoke book built once per test run: its checkout, its ``CRSREPRO_HOME`` and its HTML, and two
    commands run as a user runs them, with stdout a pipe: ``book``, ``crsrepro book --profile smoke`` from a
    cold home (every stage, on the default pool of one worker per core), then ``quiet_run``, ``crsrepro run
    --profile smoke -q`` (everything done by then)."""

    checkout: Path
    home: Path
    html: Path
    book: subprocess.CompletedProcess
    quiet_run: subprocess.CompletedProcess

    def pages(self) -> list[Path]:
        """Every page a reader reads: Sphinx's search and index pages and Jupyter Book's root
        ``index.html`` (a one-line redirect to the intro) left out."""
        return sorted(p for p in self.html.rglob("*.html")
                      if p.name not in {"search.html", "genindex.html"} and "_static" not in p.parts
                      and 'http-equiv="Refresh"' not in p.read_text()[:200])


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> BuiltBook:
    """Build the smoke book once per test run, shared by every slow book test.

    It runs as a user runs it, ``crsrepro book --profile smoke`` with stdout a pipe, so that the progress
    tests read its output instead of running the stages a second time."""
    checkout = _copy_book_sources(tmp_path_factory.mktemp("smoke_book"))
    home = checkout / ".crsrepro"
    env = {**os.environ, "CRSREPRO_HOME": str(home), "CRSREPRO_MANIFESTS": str(checkout / "data_manifests")}
    book = subprocess.run([sys.executable, "-m", "crsrepro", "book", "--profile", "smoke"], capture_output=True,
                          text=True, cwd=checkout, env=env)
    assert book.returncode == 0, book.stderr[-2000:]
    quiet_run = subprocess.run([sys.executable, "-m", "crsrepro", "run", "--profile", "smoke", "-q"],
                               capture_output=True, text=True, cwd=checkout, env=env)
    index = checkout / "book" / "_build" / "html" / "index.html"
    assert f"The book is built: {index}" in book.stdout, book.stdout[-2000:]
    return BuiltBook(checkout=checkout, home=home, html=index.parent, book=book, quiet_run=quiet_run)


# ------------------------------------------------------------------ the micro grid (test_executor, test_faults)

MICRO_YAML = """# One small dataset, two fast encoders, two seeds, one perturbation, the linear probe and a kNN control.
include: smoke
name: micro
datasets: [aptos2019]
transfer: {}
encoders: [demo.color_histogram, demo.pixel_pca]
seeds: [0, 1]
label_fractions: [0.25, 1.0]
perturbations: [jpeg]
severities: [3]
control_probes: {probes: [knn]}
demo_world: {n_images: {aptos2019: 120}}
output_dir: .crsrepro/micro/results
"""


@dataclass(frozen=True)
class MicroWorld:
    """The micro grid's profile file and scratch home (its demo world and manifests are kept across runs)."""

    root: Path
    profile_path: Path

    def profile(self):
        from crsrepro.profiles import load_profile

        return load_profile(self.profile_path)

    def clear(self) -> None:
        """Remove the results and the feature cache (a cold run follows)."""
        profile = self.profile()
        shutil.rmtree(profile.output_path, ignore_errors=True)
        shutil.rmtree(profile.feature_cache_path, ignore_errors=True)

    def state(self) -> dict:
        """What a run leaves: the merged table (``fit_seconds``, a clock reading, left out), every
        feature array's bytes and every per-case array, by key."""
        import numpy as np
        import pandas as pd

        from crsrepro.run.results import ResultStore

        profile = self.profile()
        store = ResultStore(profile.output_path)
        table = pd.read_parquet(store.merged_path)
        cases = {p.stem: {k: v.tobytes() for k, v in store.read_cases(p.stem).items()}
                 for p in sorted(store.cases_dir.glob("*.npz"))}
        features = {p.stem: np.load(p).tobytes() for p in sorted(profile.feature_cache_path.rglob("*.npy"))}
        return {"table": table.drop(columns="fit_seconds"), "attrs": table.attrs, "cases": cases,
                "features": features}

    def assert_state(self, reference: dict) -> None:
        """The run left exactly ``reference`` (a :meth:`state`), bit for bit, and no temporary file."""
        import pandas as pd

        state = self.state()
        pd.testing.assert_frame_equal(state["table"], reference["table"], check_exact=True)
        assert state["attrs"] == reference["attrs"]
        assert state["cases"].keys() == reference["cases"].keys() and state["cases"] == reference["cases"]
        assert state["features"].keys() == reference["features"].keys() and state["features"] == reference["features"]
        assert not list(self.root.rglob("*.tmp")), "a half-written file was left behind"


@pytest.fixture(scope="module")
def micro_world(tmp_path_factory) -> MicroWorld:
    root = tmp_path_factory.mktemp("micro")
    path = root / "micro.yaml"
    path.write_text(MICRO_YAML)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CRSREPRO_HOME", str(root / ".crsrepro"))
        patch.setenv("CRSREPRO_MANIFESTS", str(root / "manifests"))
        yield MicroWorld(root, path)


def tiny_analysis(tmp_path_factory, name: str, overrides: dict, *, freeze: bool = False):
    """Run a tiny smoke-derived grid in its own CRSREPRO_HOME and manifest folder and yield its
    RunAnalysis (optionally with a frozen frame): the shared body of the module-scoped tiny-grid
    fixtures of the subgroup and operating-point tests."""
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.run import grid
    from crsrepro.score.frame import freeze_frame
    from crsrepro.profiles import load_profile

    home = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CRSREPRO_HOME", str(home / ".crsrepro"))
        mp.setenv("CRSREPRO_MANIFESTS", str(home / "manifests"))
        profile = load_profile("smoke", overrides=overrides)
        results = grid.run_grid(profile, progress=False)
        if freeze:
            freeze_frame(profile, results)
        yield RunAnalysis(profile, results)


@pytest.fixture(scope="module")
def tiny_grid():
    """:func:`tiny_analysis`, for module fixtures (test modules are imported by path, not as a package)."""
    return tiny_analysis


@pytest.fixture
def cli(monkeypatch):
    """``cli(*args, cwd=..., env={...})`` runs ``crsrepro -q *args`` in this process (:func:`crsrepro.cli.main`)
    in ``cwd``, as the shell would, and returns its ``returncode`` and ``stderr``; ``env`` sets variables
    (``CRSREPRO_HOME`` is unset otherwise). The working folder and the environment, which the CLI changes (it
    exports ``CRSREPRO_HOME``), are restored afterwards. For the error cases: a subprocess would spend 4-6 s
    importing torch for each; the entry points themselves are tested as subprocesses in ``test_cli``."""
    from crsrepro.cli import main

    def run(*args, cwd, env=None):
        monkeypatch.chdir(cwd)
        monkeypatch.delenv("CRSREPRO_HOME", raising=False)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, str(value))
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            returncode = main(["-q", *args])
        return SimpleNamespace(returncode=returncode, stderr=stderr.getvalue())
    return run
