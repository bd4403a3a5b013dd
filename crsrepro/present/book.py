"""Execute the notebooks with papermill and build the Jupyter Book (DESIGN.md section 12).

The notebooks in ``notebooks/`` are thin and output-free. papermill executes them, for one profile,
into ``book/_generated/`` (git-ignored), and Jupyter Book renders the HTML with notebook execution
off, since papermill already ran them. A status page records what ran, for which profile, how long it
took, and from which commit.

A rebuild re-executes only the chapters whose inputs changed (issue 18): each executed copy records
the key of its inputs (:func:`execution_inputs`: the notebook, its parameters, the profile and the
digest of its results, the manifests and frames, every file of the package, the package versions), and
:func:`build_book` reuses a copy whose key still matches. Editing one chapter's prose re-executes that
chapter; changing any code, result or frame re-executes all of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import subprocess
import sys
import time
from pathlib import Path

from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import content_key, folder_digest, manifest_dir, package_digest, sha256_file
from crsrepro.core.io import git_hash

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


def _source(book_root: Path, name: str) -> Path:
    source = book_root / "notebooks" / f"{name}.ipynb"
    if not source.is_file():
        raise CrsreproError(f"no notebook {name!r}: expected {source} "
                            f"(available: {', '.join(list_notebooks(book_root))})")
    return source


def execute_notebook(name: str, *, profile: str, book_root: Path = Path("."), parameters: dict | None = None,
                     progress: bool = True, inputs_key: str | None = None) -> float:
    """Execute ``notebooks/<name>.ipynb`` for ``profile`` into ``book/_generated/``; return seconds taken.

    The notebook runs with ``book_root`` as its working directory, so relative profile paths
    (``.crsrepro/...``, ``data_manifests/``) resolve as they do for the CLI. ``inputs_key`` (from
    :func:`execution_inputs`) is recorded in the executed copy's metadata, with the seconds taken, so that
    a later build can reuse it (:func:`reusable_seconds`).
    """
    import papermill as pm

    book_root = _check_book_root(book_root)
    source = _source(book_root, name)
    target = book_root / GENERATED / f"{name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    pm.execute_notebook(str(source), str(target), parameters={"profile": profile, **(parameters or {})},
                        cwd=str(book_root), kernel_name="python3", progress_bar=progress)
    seconds = time.perf_counter() - start
    _finish_executed_copy(target, {"inputs": inputs_key, "seconds": round(seconds, 1),
                                   "executed_at": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"})
    log.info("executed %s in %.1f s -> %s", name, seconds, target)
    return seconds


def _profile_inputs(profile_name: str) -> dict:
    """A profile's fingerprint and the digest of its merged results (None before its first run)."""
    from crsrepro.profiles import load_profile
    from crsrepro.run.results import ResultStore

    profile = load_profile(profile_name)
    digest = ResultStore(profile.output_path).merged_path
    digest = digest.with_name(digest.name + ".sha256")
    return {"fingerprint": profile.fingerprint(), "results": digest.read_text() if digest.is_file() else None}


def execution_inputs(name: str, *, profile: str, book_root: Path = Path("."), parameters: dict | None = None) -> dict:
    """Everything an executed chapter's outputs depend on [ours: a conservative list].

    The notebook's bytes and its parameters; the fingerprint and the results digest of ``profile`` and of
    every profile a ``*_profile`` parameter names (chapter 05's coverage run); every file in the manifest
    folder (split manifests, frozen frames, the claims ledger); every file of the package; the Python and
    package versions. :func:`~crsrepro.core.io.content_key` of this dict is the key a build compares.
    """
    parameters = dict(parameters or {})
    book_root = _check_book_root(book_root)
    profiles = [profile] + [value for key, value in sorted(parameters.items()) if key.endswith("_profile") and value]
    return {
        "notebook": sha256_file(_source(book_root, name)),
        "parameters": parameters,
        "profiles": {p: _profile_inputs(p) for p in profiles},
        "manifests": folder_digest(manifest_dir()),
        "package": package_digest(),
        "versions": {"python": sys.version.split()[0], **package_versions()},
    }


def reusable_seconds(name: str, inputs_key: str, *, book_root: Path = Path(".")) -> float | None:
    """The recorded execution time of ``book/_generated/<name>.ipynb`` if it was executed from inputs with
    this key (so re-executing it would give the same page), else None."""
    import nbformat

    target = Path(book_root) / GENERATED / f"{name}.ipynb"
    if not target.is_file():
        return None
    record = nbformat.read(target, as_version=4).metadata.get("crsrepro", {})
    return record.get("seconds") if record.get("inputs") == inputs_key else None


#: The many-seed profile whose run tells chapter 05 how much a 5-seed bootstrap under-covers, per
#: profile; a profile without one (smoke, real-mini, paper) shows a note instead.
COVERAGE_PROFILES = {"demo": "demo-seeds20"}


def chapter_parameters(name: str, profile: str) -> dict:
    """The papermill parameters ``build_book`` passes to chapter ``name`` beside ``profile``."""
    return {"coverage_profile": COVERAGE_PROFILES.get(profile, "")} if name == "05_crs_bootstrap" else {}


def _finish_executed_copy(path: Path, record: dict) -> None:
    """Collapse papermill's injected-parameters cell in the executed copy, like every other code cell, and
    record how it was executed (``metadata.crsrepro``: inputs key, seconds, time)."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "hide-input" not in tags:
            tags.append("hide-input")
    notebook.metadata["crsrepro"] = record
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


@dataclasses.dataclass(frozen=True)
class ChapterRun:
    """How a build got one chapter: the seconds its execution took, and whether this build reused an
    executed copy whose inputs had not changed (then ``seconds`` is that earlier execution's)."""

    seconds: float
    reused: bool = False


def write_status_page(book_root: Path, profile: str, timings: dict[str, ChapterRun]) -> Path:
    """Write ``book/_generated/status.md``: per chapter its execution time, profile and whether this build
    executed it, then the commit and the versions of the packages that produced the numbers (DESIGN.md
    section 12)."""
    chapters = "\n".join(f"| {name} | `{profile}` | {run.seconds:.1f} | "
                         f"{'reused (inputs unchanged)' if run.reused else 'executed'} |" for name, run in timings.items())
    versions = "\n".join(f"| {name} | {v} |" for name, v in
                         {"python": sys.version.split()[0], **package_versions()}.items())
    text = (
        "# Build status\n\n"
        f"Built on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC for profile `{profile}`.\n\n"
        "Every chapter is a notebook executed by papermill before the book was rendered.\n\n"
        "A chapter whose inputs (notebook, parameters, results, frames, package code and versions) are unchanged\n"
        "since its last execution is reused rather than executed again.\n\n"
        "| chapter | profile | execution time (s) | this build |\n|---|---|---|---|\n"
        f"{chapters}\n| **total** | | {sum(r.seconds for r in timings.values()):.1f} | "
        f"{sum(not r.reused for r in timings.values())} executed |\n\n"
        "## Software\n\n"
        f"Git commit: `{git_hash(book_root)}`\n\n"
        "| package | version |\n|---|---|\n"
        f"{versions}\n"
    )
    path = Path(book_root) / GENERATED / "status.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _depth_task(profile, pair: tuple[str, str]) -> None:
    from crsrepro.run.depth import sweep

    sweep(profile, pairs=[pair], merge=False)


def _lora_task(profile, cell: tuple[str, str]) -> None:
    from crsrepro.run.lora import lora_grid

    lora_grid(profile, cells=[cell], merge=False)


def precompute_depth_and_lora(profile, *, executor: str = "local", workers: int | None = None,
                              progress: bool = True) -> None:
    """Run the depth sweep and the LoRA grid of ``profile`` as keyed tasks on the cores (issue 18).

    Chapters 06 and 07, and every chapter's "paper vs this run" box (through the claims page's
    measurements), read both; computed inside the first chapter that asks, they ran on one core while
    the other idled. Here each (encoder, dataset) pair of the sweep and each cell of the LoRA grid is one
    task (:mod:`crsrepro.run.executor`) that writes its row-sets and merges nothing (parallel tasks rewriting
    one merged file raced each other's reads), so the chapters only merge them. A task holds the GPU when
    the profile extracts on one.
    """
    from crsrepro.run.depth import default_pairs
    from crsrepro.run.executor import Task, execute
    from crsrepro.run.lora import default_cells

    gpu = profile.features.device != "cpu"
    tasks = [Task(f"lora:{e}:{d}", _lora_task, (profile, (e, d)), gpu=gpu) for e, d in default_cells(profile)]
    tasks += [Task(f"depth:{e}:{d}", _depth_task, (profile, (e, d)), gpu=gpu) for e, d in default_pairs(profile)]
    log.info("depth and LoRA: %d tasks", len(tasks))
    execute(tasks, executor=executor, workers=workers, progress=progress, description="depth and LoRA")


def build_book(*, profile: str = "demo", book_root: Path = Path("."), output: Path | None = None,
               progress: bool = True) -> Path:
    """Run the grid where needed, freeze a demo-world profile's frame if it has none (the one explicit
    freezing step of the book, :func:`crsrepro.run.grid.frame_for_book`), execute every notebook for
    ``profile`` and build the HTML; return the path of ``index.html``."""
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.run.grid import frame_for_book

    book_root = _check_book_root(book_root)
    analysis = RunAnalysis.load(profile, run=True, progress=progress)  # the grid: computes only what is missing
    frozen = frame_for_book(analysis.profile, analysis.results)
    if frozen:
        print(f"froze the {analysis.profile.name} reference frame to {frozen} (crsrepro freeze-frame)")
    coverage = COVERAGE_PROFILES.get(analysis.profile.name)
    if coverage:  # before the chapters, so that their inputs (its results digest) are settled
        RunAnalysis.load(coverage, run=True, progress=progress)
    precompute_depth_and_lora(analysis.profile, progress=progress)
    timings = {}
    for name in list_notebooks(book_root):
        parameters = chapter_parameters(name, analysis.profile.name)
        key = content_key(**execution_inputs(name, profile=profile, book_root=book_root, parameters=parameters))
        seconds = reusable_seconds(name, key, book_root=book_root)
        if seconds is not None:
            log.info("reused %s: its inputs are unchanged", name)
            timings[name] = ChapterRun(seconds, reused=True)
        else:
            timings[name] = ChapterRun(execute_notebook(name, profile=profile, book_root=book_root, progress=progress,
                                                        parameters=parameters, inputs_key=key))
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
