"""Execute the notebooks with papermill and build the Jupyter Book (DESIGN.md section 12).

The notebooks in ``notebooks/`` are thin and output-free. papermill executes them, for one profile,
into ``book/_generated/`` (git-ignored), and Jupyter Book renders the HTML with notebook execution
off, since papermill already ran them. A status page records what ran, for which profile, how long it
took, and from which commit. Before the chapters, :func:`build_book` runs the profile's stages (the
grid, the depth sweep and the LoRA grid: :mod:`crsrepro.run.stages`), so the chapters only read.

A rebuild re-executes only the chapters whose inputs changed (DESIGN.md section 13): each executed copy records
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
from crsrepro.core.io import content_key, folder_digest, git_hash, manifest_dir, package_digest, sha256_file
from crsrepro.present.chapters import CHAPTERS
from crsrepro.profiles import Profile
from crsrepro.run.progress import Progress, as_progress

log = logging.getLogger(__name__)

GENERATED = Path("book") / "_generated"


def list_notebooks(book_root: Path) -> list[str]:
    """The chapters' notebook names, in book order (:data:`crsrepro.present.chapters.CHAPTERS`), checked
    against ``<book_root>/notebooks``: a registered chapter without its notebook, or a notebook that no
    chapter registers, is an error naming it.

    >>> from crsrepro.core.io import PACKAGE_ROOT
    >>> list_notebooks(PACKAGE_ROOT.parent)[:2]
    ['00_setup', '01_discrimination']
    """
    on_disk = {p.stem for p in (Path(book_root) / "notebooks").glob("[0-9][0-9]*_*.ipynb")}
    missing, unregistered = sorted(set(CHAPTERS) - on_disk), sorted(on_disk - set(CHAPTERS))
    if missing or unregistered:
        raise CrsreproError(f"{Path(book_root) / 'notebooks'}: the notebooks differ from the chapter registry "
                            f"(crsrepro.present.chapters.CHAPTERS): missing {missing or 'none'}, "
                            f"not registered {unregistered or 'none'}")
    return list(CHAPTERS)


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


#: The chapters' kernels log only what is critical to the build's stderr: ipykernel 7 warns at every start that
#: its local TCP transport is unencrypted (twelve lines a book) and logs the interrupt of its own shutdown; an
#: error in a cell still fails the build, through papermill.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]
#: How many times a chapter's kernel is started before its failure to start fails the build **[ours]**. Starting
#: several kernels at once races for ports: jupyter_client chooses free ports, closes them and writes them to the
#: connection file, and another process can take one before the kernel binds it (jupyter/jupyter_client#154,
#: nteract/papermill#511); the kernel then never answers. Nothing of the chapter ran, so starting it again is safe.
#: Seen once on 2026-12-07, in the smoke book that `make test` builds beside other tests that start kernels.
KERNEL_START_TRIES = 3
#: What nbclient raises when a kernel did not start (a RuntimeError, as for other faults, so matched by its text).
KERNEL_START_FAILURES = ("Kernel didn't respond", "Kernel died before replying")


def execute_notebook(name: str, *, profile: str, book_root: Path = Path("."), parameters: dict | None = None,
                     progress: bool = True, inputs_key: str | None = None, output: Path | None = None) -> float:
    """Execute ``notebooks/<name>.ipynb`` for ``profile`` into ``book/_generated/`` (or to ``output``, a
    notebook path outside the book: the dry run's chapter); return seconds taken.

    The notebook runs with ``book_root`` as its working directory, so relative profile paths
    (``.crsrepro/...``, ``data_manifests/``) resolve as they do for the CLI. ``inputs_key`` (from
    :func:`execution_inputs`) is recorded in the executed copy's metadata, with the seconds taken, so that
    a later build can reuse it (:func:`reusable_seconds`).
    """
    import papermill as pm

    book_root = _check_book_root(book_root)
    source = _source(book_root, name)
    target = Path(output) if output is not None else book_root / GENERATED / f"{name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for attempt in range(1, KERNEL_START_TRIES + 1):
        try:
            pm.execute_notebook(str(source), str(target), parameters={"profile": profile, **(parameters or {})},
                                cwd=str(book_root), kernel_name="python3", progress_bar=progress,
                                extra_arguments=KERNEL_ARGUMENTS)
            break
        except RuntimeError as exc:  # a cell's error is papermill's own exception, never retried
            if attempt == KERNEL_START_TRIES or not any(text in str(exc) for text in KERNEL_START_FAILURES):
                raise
            log.warning("%s: its kernel did not start (%s, try %d of %d); starting another", name, exc, attempt,
                        KERNEL_START_TRIES)
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
    folder (split manifests, frozen frames, the claims ledger); every file of ``book/examples/`` (the stand-in
    encoder chapter 10 scores); every file of the package; the Python and
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
        "examples": folder_digest(book_root / "book" / "examples"),  # the files a chapter scores (chapter 10's encoder)
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


def chapter_parameters(name: str, profile: Profile) -> dict:
    """The papermill parameters ``build_book`` passes to chapter ``name`` beside the profile's name: chapter
    05's ``coverage_profile``, the profile's ``book.coverage_profile`` (``""``: the chapter shows a note)."""
    return {"coverage_profile": profile.book.coverage_profile or ""} if name == "05_crs_bootstrap" else {}


def _shows_nothing(cell) -> bool:
    """Whether an executed code cell displays nothing: no output, or only glued values (``scrapbook``
    display data, which the book quotes in the prose and never shows where they were glued)."""
    return all(o.get("output_type") == "display_data" and "scrapbook" in o.get("metadata", {})
               for o in cell.get("outputs", []))


def _finish_executed_copy(path: Path, record: dict) -> None:
    """Collapse papermill's injected-parameters cell in the executed copy, like every other code cell; a code
    cell that displays nothing (parameters, imports, loading, gluing) loses its collapsed source too, so the
    page shows no row of empty "Show code cell source" toggles; record how the chapter was executed
    (``metadata.crsrepro``: inputs key, seconds, time)."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "hide-input" not in tags:
            tags.append("hide-input")
        if _shows_nothing(cell) and "hide-input" in tags:
            tags[tags.index("hide-input")] = "remove-input"
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


def glued_values(notebook: Path, names) -> dict[str, str]:
    """The text of each value glued under ``names`` in an executed notebook (``{name: text}``; a name that
    was not glued is absent): how the status page repeats what a chapter measured without measuring it again."""
    import json

    if not Path(notebook).is_file():
        return {}
    found = {}
    for cell in json.loads(Path(notebook).read_text()).get("cells", []):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name in names:
                text = next((v for k, v in output.get("data", {}).items() if k.endswith("text/plain")), "")
                found[name] = "".join(text).strip().strip("'\"")
    return found


def _coverage_section(book_root: Path) -> str:
    """The status page's coverage of a 5-seed interval, as chapter 05 measured it (empty when it did not)."""
    values = glued_values(Path(book_root) / GENERATED / "05_crs_bootstrap.ipynb",
                          ("coverage_seeds", "coverage_two_level", "coverage_profile"))
    if values.get("coverage_seeds", "-") == "-":
        return ""
    return ("## Coverage of a 5-seed interval\n\n"
            f"Measured by chapter 05 on the `{values.get('coverage_profile', '?')}` run (nominal 0.95; the target is the "
            "all-seed estimate on the same test set).\n\n"
            "| bootstrap | coverage |\n|---|---|\n"
            f"| the paper's: seeds only | {values['coverage_seeds']} |\n"
            f"| seeds x test cases | {values.get('coverage_two_level', '-')} |\n\n")


def _convergence_section(book_root: Path) -> str:
    """The status page's unconverged share of linear-probe fits, as chapter 01 measured it (empty when it did not)."""
    values = glued_values(Path(book_root) / GENERATED / "01_discrimination.ipynb",
                          ("probe_fits", "probe_unconverged", "probe_unconverged_share", "probe_unconverged_by_encoder"))
    if "probe_fits" not in values:
        return ""
    return ("## Linear-probe convergence\n\n"
            f"{values['probe_unconverged']} of {values['probe_fits']} linear-probe fits "
            f"({values['probe_unconverged_share']}) stopped before their optimiser converged. Per encoder: "
            f"{values.get('probe_unconverged_by_encoder', '-')}.\n\n")


def _stage_section(stage_times: str) -> str:
    """The status page's table of this build's stage times (empty when none was given)."""
    if not stage_times:
        return ""
    return ("## Stage times\n\n"
            "Each stage this build ran before the HTML, its tasks, wall and CPU seconds (`crsrepro book` prints the same "
            "table at its end). Wall: while at least one of the stage's tasks ran; CPU: summed over the processes that "
            "ran them, so a process pool's exceeds its wall. A stage with nothing left to run is not listed.\n\n"
            f"{stage_times}\n\n")


def write_status_page(book_root: Path, profile: str, timings: dict[str, ChapterRun], stage_times: str = "") -> Path:
    """Write ``book/_generated/status.md``: per chapter its execution time, profile and whether this build
    executed it, the table of this build's stage times (``stage_times``, :meth:`crsrepro.run.progress.Progress.markdown`),
    the coverage of a 5-seed bootstrap interval as chapter 05 measured it (both bootstraps),
    the unconverged share of linear-probe fits as chapter 01 measured it, then the commit and the versions of the packages that produced the numbers (DESIGN.md section 12)."""
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
        f"{_stage_section(stage_times)}"
        f"{_coverage_section(book_root)}"
        f"{_convergence_section(book_root)}"
        "## Software\n\n"
        f"Git commit: `{git_hash(book_root)}`\n\n"
        "| package | version |\n|---|---|\n"
        f"{versions}\n"
    )
    path = Path(book_root) / GENERATED / "status.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _chapter_run(name: str, profile: str, loaded: Profile, book_root: Path, bars: bool) -> ChapterRun:
    """Chapter ``name`` of the book: reused when its inputs are unchanged, else executed (papermill's bar of
    cells with ``bars``)."""
    parameters = chapter_parameters(name, loaded)
    key = content_key(**execution_inputs(name, profile=profile, book_root=book_root, parameters=parameters))
    seconds = reusable_seconds(name, key, book_root=book_root)
    if seconds is not None:
        log.info("reused %s: its inputs are unchanged", name)
        return ChapterRun(seconds, reused=True)
    return ChapterRun(execute_notebook(name, profile=profile, book_root=book_root, progress=bars,
                                       parameters=parameters, inputs_key=key))


#: The chapters that compute the most, started first so that the pool's workers finish together (measured on
#: the demo, 2 cores, 2026-12-03: chapter 10 scores a newcomer through the grid, about 4 CPU-minutes in one
#: kernel; 09 about 75 s, 05 about 55 s; the others 10-30 s). Started last, chapter 10 alone made the tail.
LONGEST_CHAPTERS = ("10_score_your_encoder", "09_deployment", "05_crs_bootstrap")


def _run_chapters(names: list[str], profile: str, loaded: Profile, book_root: Path, bar, *,
                  one_thread: bool = True) -> dict:
    """Every chapter (:func:`_chapter_run`), on a spawn-context process pool of one worker per CPU core:
    the chapters only read what the stages wrote, so they are independent, and one kernel keeps one core
    busy (run one after the other, they were the cold demo book's longest single-core phase), the
    :data:`LONGEST_CHAPTERS` first. Each worker
    measures its chapter's wall and CPU time (its kernel's included) for ``bar``; the first error stops
    the build. Returns ``{name: ChapterRun}`` in ``names`` order.

    With ``one_thread`` (the default) every kernel gets one torch and one BLAS/OpenMP thread
    (:func:`crsrepro.run.executor.one_thread` in the worker, whose environment the kernel inherits), as the
    stages' workers do: a pool of one kernel per core whose kernels each start a thread per core puts two
    threads on every core, and OpenMP's waiting threads then spend the time. On the demo, 2 cores, chapters
    05 and 09 at once took 209.6 s that way and 84.3 s with one thread each (``benchmarks/chapter_threads.py``). False leaves the kernels
    their default (the benchmark's baseline)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from crsrepro.run.executor import default_workers
    from crsrepro.run.executor import one_thread as one_thread_each
    from crsrepro.run.progress import timed

    context = multiprocessing.get_context("spawn")
    first = [name for name in LONGEST_CHAPTERS if name in names]
    with ProcessPoolExecutor(min(default_workers(), len(names)), mp_context=context,
                             initializer=one_thread_each if one_thread else None) as pool:
        futures = {pool.submit(timed, _chapter_run, (name, profile, loaded, book_root, False)): name
                   for name in first + [n for n in names if n not in first]}
        runs = {}
        for future in as_completed(futures):
            runs[futures[future]], spent = future.result()
            bar.advance(spent)
    return {name: runs[name] for name in names}


def build_book(*, profile: str = "demo", book_root: Path = Path("."), output: Path | None = None,
               progress: bool | Progress = True) -> Path:
    """Run every stage of ``profile`` where needed (the grid, the depth sweep and the LoRA grid, on a
    process pool: :func:`crsrepro.run.stages.run_stages`) and the grid of its ``book.coverage_profile``,
    freeze a demo-world profile's frame if it has none (the one explicit freezing step of the book,
    :func:`crsrepro.score.frame.frame_for_book`), execute every notebook for ``profile`` and build the
    HTML; return the path of ``index.html``. The chapters only read what the stages wrote.

    ``progress`` (:func:`crsrepro.run.progress.as_progress`) shows every stage's header and bar, the
    coverage profile's, the chapters' (one task a notebook) and the HTML build's (issue 29.1); the status
    page gets the table of the stages' times."""
    from crsrepro.profiles import load_profile
    from crsrepro.run.depth import DepthStage
    from crsrepro.run.grid import GridStage
    from crsrepro.run.lora import LoraStage
    from crsrepro.run.stages import run_stages
    from crsrepro.score.frame import frame_for_book

    progress = as_progress(progress)
    book_root = _check_book_root(book_root)
    loaded = load_profile(profile)
    results, _, _ = run_stages(loaded, [GridStage(), DepthStage(), LoraStage()], progress=progress)
    frozen = frame_for_book(loaded, results)
    if frozen:
        print(f"froze the {loaded.name} reference frame to {frozen} (crsrepro freeze-frame)")
    if loaded.book.coverage_profile:  # before the chapters, so that their inputs (its results digest) are settled
        progress.say(f"== coverage profile ({loaded.name}): the grid of {loaded.book.coverage_profile}, "
                     "for chapter 05 ==")
        run_stages(load_profile(loaded.book.coverage_profile), [GridStage()], progress=progress)
    names = list_notebooks(book_root)
    with progress.bar(f"chapters ({loaded.name})", len(names), f"{len(names)} notebooks") as bar:
        timings = _run_chapters(names, profile, loaded, book_root, bar)
    write_status_page(book_root, profile, timings, progress.markdown())
    output = Path(output).absolute() if output else book_root / "book"
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book), "build", str(book_root), "--path-output", str(output), "--warningiserror"]
    result = progress.call(f"HTML ({loaded.name})", "jupyter-book build",
                           lambda: subprocess.run(command, capture_output=True, text=True))
    if result.returncode != 0:
        raise CrsreproError(f"jupyter-book build failed (exit {result.returncode}):\n{result.stdout[-4000:]}\n"
                            f"{result.stderr[-4000:]}")
    index = output / "_build" / "html" / "index.html"
    if not index.is_file():
        raise CrsreproError(f"jupyter-book finished but {index} does not exist")
    return index
