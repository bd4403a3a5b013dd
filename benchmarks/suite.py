"""The test suite on one core against every core (issue 29: ``make test-fast`` <= 90 s), side by side in one run.

``make test`` and ``make test-fast`` run pytest-xdist (the Makefile's ``XDIST``, which ``PARALLEL`` repeats);
``tests/conftest.py`` groups the tests so that each shared fixture is built once and the long slow tests
start first. This script runs the same lane serially (what the Makefile ran before) and on every core, in
that order, and prints each wall time and their ratio. Run it on an otherwise idle machine.

Usage: ``python benchmarks/suite.py [--lane fast|full]`` (``full`` takes about 45 minutes on 2 cores)
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


def run(args: list[str]) -> tuple[float, str]:
    """Wall seconds of ``pytest -q`` with ``args`` in the checkout, and its summary line."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO,
                          capture_output=True, text=True)
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
    print(f"serial         {serial:7.1f} s   {serial_summary}")
    parallel, parallel_summary = run(PARALLEL + lane)
    print(f"every core     {parallel:7.1f} s   {parallel_summary}")
    print(f"ratio serial / every core: {serial / parallel:.2f}x")


if __name__ == "__main__":
    main()
