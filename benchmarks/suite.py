"""The test suite on one core against every core (issue 29: ``make test-fast`` <= 90 s), side by side in one run.

``make test`` and ``make test-fast`` run pytest-xdist (the Makefile's ``XDIST``, which ``PARALLEL`` repeats);
``tests/conftest.py`` groups the tests so that each shared fixture is built once and the long slow tests
start first, and gives each worker its share of the cores' threads. This script runs the same lane serially
(what the Makefile ran before), on every core with each worker on torch's default threads (one per core:
before the share; ``OMP_NUM_THREADS`` set to the core count keeps it), and on every core as the Makefile
runs it, in that order, and prints each wall time and the ratios. Run it on an otherwise idle machine.

Usage: ``python benchmarks/suite.py [--lane fast|full]`` (``full`` runs the whole suite three times: about 35 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARALLEL = ["-n", "auto", "--dist", "loadgroup", "--no-loadscope-reorder"]


def run(args: list[str], env: dict | None = None) -> tuple[float, str]:
    """Wall seconds of ``pytest -q`` with ``args`` (and ``env`` added to the environment) in the checkout, and its
    summary line."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]
    if done.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed (exit {done.returncode}): {summary}")
    return seconds, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", choices=["fast", "full"], default="fast")
    lane = ["-m", "not slow"] if parser.parse_args().lane == "fast" else []
    name = 'fast (-m "not slow")' if lane else "full"
    print(f"{os.cpu_count()} cores; lane: {name}")
    serial, serial_summary = run(lane)
    print(f"serial                                                    {serial:7.1f} s   {serial_summary}")
    shared, shared_summary = run(PARALLEL + lane, env={"OMP_NUM_THREADS": str(os.cpu_count())})
    print(f"every core, each worker on every core's threads (before)  {shared:7.1f} s   {shared_summary}")
    parallel, parallel_summary = run(PARALLEL + lane)
    print(f"every core, each worker on its share of the threads (now) {parallel:7.1f} s   {parallel_summary}")
    print(f"ratios: serial / now {serial / parallel:.2f}x, before / now {shared / parallel:.2f}x")


if __name__ == "__main__":
    main()
