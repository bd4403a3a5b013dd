"""Execute the notebooks with papermill and build the Jupyter Book (DESIGN.md section 12).

The notebooks in ``notebooks/`` are thin and output-free. papermill executes them, for one profile,
into ``book/_generated/`` (git-ignored), and Jupyter Book renders the HTML with notebook execution
off, since papermill already ran them. A status page records what ran, for which profile, how long it
took, and from which commit.
"""

from __future__ import annotations

import datetime as dt
import logging
import subprocess
import sys
import time
from pathlib import Path

from crsrepro.errors import CrsreproError
from crsrepro.results import git_hash

log = logging.getLogger(__name__)

GENERATED = Path("book") / "_generated"


def list_notebooks(book_root: Path) -> list[str]:
    """The notebook names (``NN_section`` or ``NNb_section``) in ``<book_root>/notebooks``, in chapter order.

    >>> sorted(["06_layer_depth", "05b_sensitivity", "05_crs_bootstrap"])
    ['05_crs_bootstrap', '05b_sensitivity', '06_layer_depth']
    """
    return sorted(p.stem for p in (Path(book_root) / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def _check_book_root(book_root: Path) -> Path:
    book_root = Path(book_root).absolute()
    if not (book_root / "_config.yml").is_file() or not (book_root / "notebooks").is_dir():
        raise CrsreproError(f"{book_root} is not a crsrepro checkout: expected _config.yml and notebooks/ there "
                            "(run from the repository root, or pass --book-root)")
    return book_root


def execute_notebook(name: str, *, profile: str, book_root: Path = Path("."), parameters: dict | None = None,
                     progress: bool = True) -> float:
    """Execute ``notebooks/<name>.ipynb`` for ``profile`` into ``book/_generated/``; return seconds taken.

    The notebook runs with ``book_root`` as its working directory, so relative profile paths
    (``.crsrepro/...``, ``data_manifests/``) resolve as they do for the CLI.
    """
    import papermill as pm

    book_root = _check_book_root(book_root)
    source = book_root / "notebooks" / f"{name}.ipynb"
    if not source.is_file():
        raise CrsreproError(f"no notebook {name!r}: expected {source} "
                            f"(available: {', '.join(list_notebooks(book_root))})")
    target = book_root / GENERATED / f"{name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    pm.execute_notebook(str(source), str(target), parameters={"profile": profile, **(parameters or {})},
                        cwd=str(book_root), kernel_name="python3", progress_bar=progress)
    seconds = time.perf_counter() - start
    _hide_injected_parameters(target)
    log.info("executed %s in %.1f s -> %s", name, seconds, target)
    return seconds


#: The many-seed profile whose run tells chapter 05 how much a 5-seed bootstrap under-covers, per
#: profile; a profile without one (smoke, real-mini, paper) shows a note instead.
COVERAGE_PROFILES = {"demo": "demo-seeds20"}


def chapter_parameters(name: str, profile: str) -> dict:
    """The papermill parameters ``build_book`` passes to chapter ``name`` beside ``profile``."""
    return {"coverage_profile": COVERAGE_PROFILES.get(profile, "")} if name == "05_crs_bootstrap" else {}


def _hide_injected_parameters(path: Path) -> None:
    """Collapse papermill's injected-parameters cell in the executed copy, like every other code cell."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "hide-input" not in tags:
            tags.append("hide-input")
    nbformat.write(notebook, path)


#: The distributions whose versions the status page records (their numbers can change a result).
STATUS_PACKAGES = ("crsrepro", "torch", "numpy", "pandas", "scikit-learn", "timm")


def package_versions(names=STATUS_PACKAGES) -> dict[str, str]:
    """The installed version of each distribution in ``names`` (``not installed`` where absent)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in names:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def write_status_page(book_root: Path, profile: str, timings: dict[str, float]) -> Path:
    """Write ``book/_generated/status.md``: per chapter its execution time and profile, then the commit
    and the versions of the packages that produced the numbers (DESIGN.md section 12)."""
    chapters = "\n".join(f"| {name} | `{profile}` | {seconds:.1f} |" for name, seconds in timings.items())
    versions = "\n".join(f"| {name} | {v} |" for name, v in
                         {"python": sys.version.split()[0], **package_versions()}.items())
    text = (
        "# Build status\n\n"
        f"Built on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC for profile `{profile}`.\n\n"
        "Every chapter is a notebook executed by papermill before the book was rendered.\n\n"
        "| chapter | profile | execution time (s) |\n|---|---|---|\n"
        f"{chapters}\n| **total** | | {sum(timings.values()):.1f} |\n\n"
        "## Software\n\n"
        f"Git commit: `{git_hash(book_root)}`\n\n"
        "| package | version |\n|---|---|\n"
        f"{versions}\n"
    )
    path = Path(book_root) / GENERATED / "status.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def build_book(*, profile: str = "demo", book_root: Path = Path("."), output: Path | None = None,
               progress: bool = True) -> Path:
    """Run the grid where needed, freeze a demo-world profile's frame if it has none (the one explicit
    freezing step of the book, :func:`crsrepro.grid.frame_for_book`), execute every notebook for
    ``profile`` and build the HTML; return the path of ``index.html``."""
    from crsrepro.analysis import RunAnalysis
    from crsrepro.grid import frame_for_book

    book_root = _check_book_root(book_root)
    analysis = RunAnalysis.load(profile, run=True, progress=progress)  # the grid: computes only what is missing
    frozen = frame_for_book(analysis.profile, analysis.results)
    if frozen:
        print(f"froze the {analysis.profile.name} reference frame to {frozen} (crsrepro freeze-frame)")
    timings = {name: execute_notebook(name, profile=profile, book_root=book_root, progress=progress,
                                      parameters=chapter_parameters(name, analysis.profile.name))
               for name in list_notebooks(book_root)}
    write_status_page(book_root, profile, timings)
    output = Path(output).absolute() if output else book_root / "book"
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book), "build", str(book_root), "--path-output", str(output), "--warningiserror"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CrsreproError(f"jupyter-book build failed (exit {result.returncode}):\n{result.stdout[-4000:]}\n"
                            f"{result.stderr[-4000:]}")
    index = output / "_build" / "html" / "index.html"
    if not index.is_file():
        raise CrsreproError(f"jupyter-book finished but {index} does not exist")
    return index
