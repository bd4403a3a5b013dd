"""Chapters executed two at a time: kernels with their default thread count against one thread each, side by side.

``crsrepro book`` executes the chapters on a process pool of one worker per core. Each kernel used to start
torch and BLAS with a thread per core, so on 2 cores two kernels put four threads on two cores, and OpenMP's
waiting threads took the time: in the cold demo book of 6d93a25 chapter 09's subgroup table took 216 s, which
takes 9 s in a process of its own. Every kernel now gets one thread (``crsrepro.present.book._run_chapters``,
as the stages' workers have). This script executes the same chapters on the same pool twice, with every
analysis they keep on disk (``<output_dir>/analysis/``) moved aside each time, so that both runs compute
them, and their executed copies removed, so that both runs execute them: first with the kernels' default
threads (as before), then with one thread each (now); it prints both wall times and their ratio. The kept
analyses are put back at the end.

Usage: ``python benchmarks/chapter_threads.py [--chapters 05_crs_bootstrap 09_deployment] [--profile demo]``
(needs a built book: ``make book``). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def analyses_aside(folders: list[Path]):
    """Move every kept analysis of ``folders`` aside; on exit, drop what the run wrote and put them back."""
    with tempfile.TemporaryDirectory() as aside:
        moved = []
        for i, folder in enumerate(folders):
            for path in folder.glob("*.pkl"):
                target = Path(aside) / f"{i}-{path.name}"
                shutil.move(path, target)
                moved.append((target, path))
        try:
            yield len(moved)
        finally:
            for folder in folders:
                for path in folder.glob("*.pkl"):
                    path.unlink()
            for target, path in moved:
                shutil.move(target, path)


def run(chapters: list[str], profile: str, one_thread: bool) -> float:
    """Wall seconds of executing ``chapters`` on the book's chapter pool."""
    from crsrepro.present.book import _run_chapters
    from crsrepro.profiles import load_profile
    from crsrepro.run.progress import as_progress

    loaded = load_profile(profile)
    for name in chapters:  # executed again, not reused from the last run
        (REPO / "book" / "_generated" / f"{name}.ipynb").unlink(missing_ok=True)
    progress = as_progress(False)
    start = time.perf_counter()
    with progress.bar("chapters", len(chapters), "") as bar:
        _run_chapters(chapters, profile, loaded, REPO, bar, one_thread=one_thread)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", nargs="+", default=["05_crs_bootstrap", "09_deployment"])
    parser.add_argument("--profile", default="demo")
    args = parser.parse_args()
    from crsrepro.profiles import load_profile

    loaded = load_profile(args.profile)
    names = [args.profile] + ([loaded.book.coverage_profile] if loaded.book.coverage_profile else [])
    folders = [load_profile(name).output_path / "analysis" for name in names]
    times = {}
    for label, one_thread in (("default threads per kernel (before)", False), ("one thread per kernel (now)", True)):
        with analyses_aside(folders) as moved:
            times[label] = run(args.chapters, args.profile, one_thread)
    print(f"chapters {', '.join(args.chapters)} on {args.profile}, two at a time; {moved} kept analyses moved "
          f"aside for each run")
    for label, seconds in times.items():
        print(f"{label:40s} {seconds:6.1f} s")
    before, now = times.values()
    print(f"ratio: {before / now:.2f}x")


if __name__ == "__main__":
    main()
