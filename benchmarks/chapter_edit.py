"""One edited chapter: its shared analyses computed again (as before) against read from disk, side by side.

Issue 29 asks that a rebuild after editing one chapter take 30 s at most. An edited chapter is executed
again in a new kernel, so what it computes is paid again: chapter 05 ran the two-level CRS bootstrap, the
insertion experiment and the coverage check each time. These now go through
:meth:`crsrepro.analyse.run_analysis.RunAnalysis.computed_once` (kept under ``<output_dir>/analysis/``), as
the claims page, the multiverse, the subgroup table and the operating points already did. This script
executes the chapter (``crsrepro notebook``) on the profile's cached results twice: first with those
files moved aside (what an edit cost before), then with them in place (what it costs now), and prints
both wall times and their ratio. Nothing is lost: the first run writes the same files again.

Usage: ``python benchmarks/chapter_edit.py [--chapter 05_crs_bootstrap] [--profile demo]`` (needs a built
book: ``make book``). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The analyses that chapter 05 computed in its own kernel before they were kept on disk.
NEWLY_KEPT = ("crs_bootstrap-*.pkl", "insertion-*.pkl", "seed_count_coverage-*.pkl")


def execute(chapter: str, profile: str) -> float:
    """Wall seconds of ``crsrepro notebook chapter`` in the checkout."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "crsrepro", "-q", "notebook", chapter, "--profile", profile], cwd=REPO,
                   check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", default="05_crs_bootstrap")
    parser.add_argument("--profile", default="demo")
    args = parser.parse_args()
    from crsrepro.profiles import load_profile

    folders = [load_profile(name).output_path / "analysis" for name in (args.profile, "demo-seeds20")]
    with tempfile.TemporaryDirectory() as aside:
        moved = 0
        for folder in folders:
            for pattern in NEWLY_KEPT:
                for path in folder.glob(pattern):
                    shutil.move(path, Path(aside) / f"{folder.parent.parent.name}-{path.name}")
                    moved += 1
        before = execute(args.chapter, args.profile)
    after = execute(args.chapter, args.profile)
    print(f"chapter {args.chapter} on {args.profile}; {moved} kept analyses moved aside for the first run")
    print(f"analyses computed in the chapter (before)   {before:6.1f} s")
    print(f"analyses read from disk (now)               {after:6.1f} s")
    print(f"ratio: {before / after:.2f}x")


if __name__ == "__main__":
    main()
