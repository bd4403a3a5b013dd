"""The ``crsrepro`` command line (also ``python -m crsrepro``).

::

    crsrepro book [--profile demo]            demo world, every stage (grid, depth, LoRA), notebooks, Jupyter Book
    crsrepro notebook NAME [--profile demo]   execute one notebook with papermill into book/_generated/
    crsrepro demo-world [--profile demo]      write the synthetic datasets in the real layouts
    crsrepro run [--profile demo] [--executor local|dask|serial] [--workers N] [--scheduler ADDRESS]
                                              run the grid (resumes; skips finished runs) -> results.parquet
    crsrepro freeze-frame [--profile demo]    freeze the CRS reference frame from a complete run's results
    crsrepro score --encoder ID --profile P   score a new encoder against the profile's frozen frame
    crsrepro plan [--profile demo]            GPU-hours, CPU-hours and cache disk of a profile, per stage
    crsrepro check-weights [--encoder ID]     load local paper-encoder weights strictly on the CPU, report
    crsrepro recalibrate --scores local.csv --labels COLUMN --out calibrated.csv   recalibrate a local cohort
    crsrepro quality-check --images DIR [--reference DIR]   image-quality statistics and outliers
    crsrepro list {profiles,encoders,notebooks}

User errors (a missing profile, an unknown encoder, a missing dataset root ...) and permission or
disk errors (a read-only or full folder) print one line and exit with status 2; ``-v`` adds the
traceback. The Makefile calls these same commands.

``run`` and ``book`` print each stage's header and progress on stdout, a bar on a terminal or a plain
line every 10 % or 30 s elsewhere, and end with a table of the stages' wall and CPU times
(:mod:`crsrepro.run.progress`, issue 29.1); ``-q``, before or after the command, silences them.

Explicit acts stay explicit: a command that reads never computes and a command that checks never
writes. Each command's ``--help`` lists what it may do (:data:`ACTS`): only ``run``, ``book`` and
``score`` compute, and only ``book`` freezes a frame without being asked (a demo-world profile's, when
it has none).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys
import traceback
from pathlib import Path

from crsrepro.core.errors import CrsreproError

#: What each command may do (its ``--help`` says so): what it reads, computes and writes.
ACTS = {
    "demo-world": "May: write the demo world under the profile's data.root. Computes no result.",
    "run": "May: generate a demo world that is missing, freeze the split manifests on first use, extract and "
           "cache features, fit probes, and write row-sets and results.parquet under the profile's output_dir.",
    "freeze-frame": "May: read the profile's merged results and write data_manifests/crs_reference_<name>.yaml "
                    "(an existing frame only with --overwrite). Never runs the grid: with no run, or an "
                    "incomplete one, it refuses and names the missing cells.",
    "notebook": "May: read the profile's results (never runs a stage), cache analysis pages under its "
                "output_dir, and write book/_generated/<name>.ipynb.",
    "book": "May: do everything run does, for the grid, depth and LoRA stages; freeze a demo-world profile's "
            "frame when it has none (any other profile needs freeze-frame); execute every notebook and write "
            "the HTML book.",
    "score": "May: read the frozen frame and the panel's results (never changes either), and run the "
             "newcomer's grid into <output_dir>/newcomers/<id>/ and the feature cache.",
    "plan": "May: read the profile and the encoder registry. Needs no data and writes nothing.",
    "check-weights": "May: read local weights on the CPU. Never downloads, writes nothing.",
    "dry-run": "May: read the real images; write one encoder's checkpoint of random weights at a time to the "
               "scratch folder (removed after it), then the grid's profile, random checkpoints, features, "
               "results, frame and executed chapter there (--scratch, default a new folder in the temporary "
               "folder; it says which). Never downloads, writes nothing in the checkout or $CRSREPRO_HOME.",
    "recalibrate": "May: read --scores (and --apply) and write --out, its .map.json and its .reliability.png; "
                   "never an input, and an existing file only with --overwrite.",
    "quality-check": "May: read the images (and --reference) and write the --out csv when given.",
    "list": "May: read the shipped profiles, the encoder registry or the checkout's notebooks/. Writes nothing.",
}
#: The OS errors that are the user's to fix (permissions, a read-only or full disk): one line, no traceback.
USER_OS_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _pin_home() -> None:
    """Export this process's ``CRSREPRO_HOME``, so that a notebook kernel, which runs in the book root,
    reads the results this working directory's commands wrote (its default is ``./.crsrepro``)."""
    from crsrepro.profiles import crsrepro_home

    os.environ["CRSREPRO_HOME"] = str(crsrepro_home())


def _cmd_demo_world(args) -> None:
    from crsrepro.data.demo_world import ensure_demo_world
    from crsrepro.profiles import load_profile

    profile = load_profile(args.profile)
    root = ensure_demo_world(profile, progress=not args.quiet)
    if root is None:
        raise CrsreproError(f"profile {profile.name!r} reads real data (data.source: {profile.data.source}); "
                            "demo-world needs a profile with data.source: demo_world, such as demo or smoke")
    print(f"demo world for profile {profile.name!r} is at {root}")


def _cmd_run(args) -> None:
    from crsrepro.profiles import check_devices, load_profile
    from crsrepro.run.grid import run_grid
    from crsrepro.run.progress import Progress

    profile = load_profile(args.profile)
    check_devices(profile)
    progress = Progress(quiet=args.quiet)
    table = run_grid(profile, progress=progress, executor=args.executor, workers=args.workers,
                     scheduler=args.scheduler)
    print(f"{len(table)} result rows in {profile.output_path / 'results.parquet'}")
    progress.say(f"== stage times ==\n{progress.table()}")


def _cmd_freeze_frame(args) -> None:
    from crsrepro.profiles import load_profile
    from crsrepro.score.frame import frame_path, freeze_run_frame

    profile = load_profile(args.profile)
    frame = freeze_run_frame(profile, overwrite=args.overwrite)
    print(f"froze the reference frame of profile {profile.name!r} to {frame_path(profile)} "
          f"(results {frame.results_hash[:12]})")


def _cmd_notebook(args) -> None:
    from crsrepro.present.book import GENERATED, execute_notebook
    from crsrepro.profiles import load_profile

    profile = load_profile(args.profile)  # fail early, with the profile's own error
    _pin_home()
    parameters = dict(args.parameter or [])
    seconds = execute_notebook(args.name, profile=profile.argument, book_root=args.book_root,
                               parameters=parameters, progress=not args.quiet)
    print(f"executed {args.name} for profile {args.profile!r} in {seconds:.1f} s -> "
          f"{Path(args.book_root).absolute() / GENERATED / (args.name + '.ipynb')}")


def _cmd_book(args) -> None:
    from crsrepro.present.book import build_book
    from crsrepro.profiles import check_devices, load_profile
    from crsrepro.run.progress import Progress

    check_devices(load_profile(args.profile))
    _pin_home()
    progress = Progress(quiet=args.quiet)
    index = build_book(profile=args.profile, book_root=args.book_root, output=args.output, progress=progress)
    print(f"The book is built: {index}")
    progress.say(f"== stage times ==\n{progress.table()}")


def _cmd_score(args) -> None:
    from crsrepro.analyse.new_encoder import checked_frame, score_newcomer
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.encoders.user import load_entry_point, load_spec_file
    from crsrepro.present.score_report import score_text, write_report
    from crsrepro.profiles import check_devices, load_profile

    if (args.spec is None) == (args.encoder is None):
        raise CrsreproError("crsrepro score takes one of --spec FILE, --encoder ID or --encoder module:function")
    profile = load_profile(args.profile)
    check_devices(profile)
    if args.encoder is not None and ":" not in args.encoder:
        get_encoder_spec(args.encoder)  # an unknown id is named first
    checked_frame(profile)  # a missing or stale frame is refused before the newcomer is built
    if args.spec is not None:
        encoder = load_spec_file(args.spec, panel=tuple(profile.encoders), device=profile.features.device)
    elif ":" in args.encoder:
        encoder = load_entry_point(args.encoder, device=profile.features.device)
    else:
        encoder = args.encoder
    score = score_newcomer(profile, encoder, weights=args.weights, progress=not args.quiet)
    print(score_text(score))
    if args.report is not None:
        print(f"report: {write_report(score, args.report)}")


def _cmd_check_weights(args) -> None:
    from crsrepro.tools.check_weights import check_weights

    check_weights(args.encoder, require_all=args.all, weights=args.weights)  # raises after the report


def _cmd_dry_run(args) -> None:
    from crsrepro.tools.dry_run import dry_run

    dry_run(args.profile, images_root=args.images, encoders=args.encoder, lora_images=args.lora_images,
            scratch=args.scratch, grid=not args.no_grid, book_root=args.book_root)


def _cmd_recalibrate(args) -> None:
    from crsrepro.tools.recalibrate import apply_map, recalibrate_cohort

    if args.apply is not None:
        report = apply_map(args.scores, args.apply, out=args.out, label_column=args.labels, input_kind=args.input,
                           seed=args.seed, overwrite=args.overwrite)
    elif args.labels is None:
        raise CrsreproError("recalibrate needs --labels COLUMN to fit a map (or --apply MAP.json to reuse one)")
    else:
        report = recalibrate_cohort(args.scores, label_column=args.labels, out=args.out, method=args.method,
                                    calibration_split=args.calibration_split, input_kind=args.input,
                                    classes=args.classes.split(",") if args.classes else None,
                                    id_column=args.id_column, map_path=args.map, tolerance=args.tolerance,
                                    seed=args.seed, overwrite=args.overwrite)
    print("\n".join(report.lines()))


def _cmd_quality_check(args) -> None:
    from crsrepro.tools.quality import quality_check

    print("\n".join(quality_check(args.images, reference=args.reference, out=args.out, threshold=args.threshold,
                                   skip_unreadable=args.skip_unreadable).lines()))


def _cmd_plan(args) -> None:
    from crsrepro.profiles import check_devices, load_profile
    from crsrepro.run.plan import plan

    profile = load_profile(args.profile)
    print(plan(profile).to_text())
    try:
        check_devices(profile)
    except CrsreproError as exc:  # a plan needs no device; say that run would refuse on this machine
        print(f"crsrepro: warning: run would refuse here: {exc}", file=sys.stderr)


def _cmd_list(args) -> None:
    if args.what == "profiles":
        from crsrepro.profiles import list_profiles
        names = list_profiles()
    elif args.what == "encoders":
        from crsrepro.encoders import list_encoders
        names = list_encoders()
    else:
        from crsrepro.present.book import list_notebooks
        root = args.book_root.absolute()
        if not (root / "_config.yml").is_file() or not (root / "notebooks").is_dir():
            raise CrsreproError(f"{root} is not a crsrepro checkout: expected _config.yml and notebooks/ there "
                                "(run from the repository root, or pass --book-root)")
        names = list_notebooks(root)
    print("\n".join(names))


def build_parser() -> argparse.ArgumentParser:
    from crsrepro.run.executor import DEFAULT_EXECUTOR, EXECUTORS

    parser = argparse.ArgumentParser(prog="crsrepro", description=__doc__.split("\n\n")[0])
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress: no stage headers, bars or stage "
                        "times (warnings and errors still show)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what each stage does")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_text, *, book_root=False):
        p = sub.add_parser(name, help=help_text, description=f"{help_text}. {ACTS[name]}")
        p.set_defaults(func=func)
        if name not in ("list", "recalibrate", "quality-check"):
            p.add_argument("--profile", default="demo", help="profile name or YAML path (default: demo)")
        if book_root:
            p.add_argument("--book-root", type=Path, default=Path("."),
                           help="the checkout holding _config.yml and notebooks/ (default: .)")
        return p

    def quiet(p):  # `crsrepro run -q` as well as `crsrepro -q run`; SUPPRESS keeps the top-level one
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="no stage headers, progress bars or stage times (warnings and errors still show)")

    add("demo-world", _cmd_demo_world, "write the demo world's four datasets in their real layouts")
    p = add("run", _cmd_run, "run the grid for a profile (resumes) and merge results.parquet")
    quiet(p)
    p.add_argument("--executor", choices=EXECUTORS, default=DEFAULT_EXECUTOR,
                   help="local: a process pool (default); dask: Dask distributed; serial: this process only")
    p.add_argument("--workers", type=int, default=None, help="worker processes of local and of the Dask "
                                                             "LocalCluster (default: the CPU cores)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="dask: a running scheduler, e.g. tcp://node:8786 (default: a LocalCluster)")
    p = add("freeze-frame", _cmd_freeze_frame, "freeze the profile's CRS reference frame from a complete run "
            "(refuses an incomplete one)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing frozen frame")
    p = add("notebook", _cmd_notebook, "execute one notebook with papermill", book_root=True)
    p.add_argument("name", help="notebook name, e.g. 01_discrimination")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("KEY", "VALUE"),
                   help="an extra papermill parameter (string value)")
    p = add("book", _cmd_book, "run everything and build the Jupyter Book", book_root=True)
    quiet(p)
    p.add_argument("--output", type=Path, default=None, help="build folder (default: <book-root>/book)")
    p = add("score", _cmd_score, "score a new encoder against the profile's frozen reference frame")
    p.epilog = ("Two ways in for your own encoder. (1) --spec my_encoder.yaml: the fields of a registry spec: "
                "builder (timm, open_clip, transformers, torchscript or demo), family (general, medical or "
                "specialist), architecture, weights (a file or folder, relative to the spec file), input_size, "
                "resize_mode (crop or pad), interpolation (bicubic or bilinear), mean, std, pooling (cls, "
                "mean_patch, image_embed or gap), licence; optional name and embed_dim. (2) --encoder "
                "my_package.module:build (or file.py:build): build() returns a torch module mapping [B, 3, S, S] "
                "floats to [B, D], or (module, preprocessing) with a crsrepro.encoders.user.Preprocessing or a "
                "dict of input_size, mean, std, interpolation, resize_mode; a bare module gets 224 px, ImageNet "
                "mean and std, bicubic and a centre crop, and the output says so. Either way the encoder runs "
                "through the panel's feature cache, perturbations and probes under a key derived from its "
                "weights' bytes and its spec. A missing or stale frame, or an output that is not a finite "
                "[B, D], is refused in one line.")
    p.add_argument("--encoder", default=None,
                   help="a registered encoder id, or a Python entry point package.module:function")
    p.add_argument("--spec", type=Path, default=None, help="an encoder spec file (YAML; fields below)")
    p.add_argument("--weights", default=None, help="weights path of a registered id (default: CRSREPRO_WEIGHTS/<id>/)")
    p.add_argument("--report", type=Path, default=None, metavar="DIR",
                   help="write index.html, profile.png, cells.csv and panel.csv to DIR")
    p = sub.add_parser("check-weights", help="check local paper-encoder weights on the CPU (never downloads)",
                       description="Load each paper encoder's local weights strictly on the CPU and print: found "
                       "or not (and where it looked), where to get it, its pinned revision and licence, the file's "
                       "top-level keys, the strict-load result, the parameter count against the spec, one "
                       "embedding's shape and norm, and a summary table. Exit status 2 when an encoder found does "
                       "not load strictly with the spec's parameter count, when an --encoder is not found, or with "
                       f"--all when any of the 15 is not found; else 0. {ACTS['check-weights']}")
    p.set_defaults(func=_cmd_check_weights)
    p.add_argument("--encoder", action="append", default=None, help="a paper encoder id (repeatable; default: all 15)")
    p.add_argument("--weights", default=None, help="weights path for the one --encoder (default: the usual lookup)")
    p.add_argument("--all", action="store_true", help="require all 15 paper encoders (exit 2 when any is missing)")
    p = add("dry-run", _cmd_dry_run, "build the profile's paper architectures at real size with random weights "
            "(nothing downloaded) and run native-size extraction of every depth tap, one LoRA step, a probe, a "
            "recalibrator, the scores and the CRS on a handful of real images per domain; report peak memory, "
            "CPU images/s and the planner's GPU estimate per encoder; then run the grid on two of them and "
            "execute one chapter on its results", book_root=True)
    p.add_argument("--images", type=Path, default=None,
                   help="folder holding nih_cxr14/, kermany/ and isic2017/ (default: $CRSREPRO_DATA)")
    p.add_argument("--encoder", action="append", default=None, help="a subset of the profile's encoders (repeatable)")
    p.add_argument("--lora-images", type=int, default=1, help="images in the one LoRA step (0: no LoRA step)")
    p.add_argument("--scratch", type=Path, default=None,
                   help="where the checkpoints, the grid and the executed chapter go (default: a new temporary folder)")
    p.add_argument("--no-grid", action="store_true", help="leave out the grid on two encoders and the chapter")
    p = add("recalibrate", _cmd_recalibrate, "recalibrate a local cohort's model outputs (multi-class; "
            "multi-label outputs are out of scope) and report ECE and AUROC before and after")
    p.add_argument("--scores", type=Path, required=True, help="csv: one score column per class and a label column")
    p.add_argument("--labels", metavar="COLUMN", help="the label column; its values are score column names")
    p.add_argument("--method", default="auto", choices=["auto", "temperature", "vector", "isotonic", "dirichlet"],
                   help="auto: lowest cross-validated ECE inside the calibration part (default)")
    p.add_argument("--calibration-split", default="0.5", metavar="F|COLUMN",
                   help="share of cases for calibration, stratified (default 0.5), or a column of "
                        "'calibration'/'evaluation'")
    p.add_argument("--input", default="auto", choices=["auto", "probabilities", "logits"],
                   help="auto: rows in [0, 1] summing to 1 are probabilities, scores outside [0, 1] are logits, "
                        "anything else is an error")
    p.add_argument("--classes", help="comma-separated score columns (default: the label column's values)")
    p.add_argument("--id-column", help="a case-id column, carried through; a repeated id is an error")
    p.add_argument("--out", type=Path, required=True, help="the calibrated csv; the map (.map.json) and the "
                                                           "reliability diagram (.reliability.png) go beside it")
    p.add_argument("--map", type=Path, help="where to save the fitted map (default: beside --out)")
    p.add_argument("--apply", type=Path, metavar="MAP.json", help="apply a saved map instead of fitting one")
    p.add_argument("--tolerance", type=float, default=0.02, help="ECE interval half-width for the cases-needed "
                                                                  "estimate (default 0.02)")
    p.add_argument("--seed", type=int, default=0, help="seeds the split, the folds and the bootstraps")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files (never the --scores or --apply file)")
    p = add("quality-check", _cmd_quality_check, "image-quality statistics of a folder of images, with outliers "
            "flagged against a reference folder")
    p.add_argument("--images", type=Path, required=True, help="folder of images (searched recursively)")
    p.add_argument("--reference", type=Path, help="folder of reference images (default: --images itself)")
    p.add_argument("--out", type=Path, help="per-image report csv")
    p.add_argument("--threshold", type=float, default=3.5, help="robust z-score beyond which a statistic is "
                                                                 "flagged (default 3.5)")
    p.add_argument("--skip-unreadable", action="store_true", help="count and list unreadable images instead of "
                                                                  "stopping at the first")
    add("plan", _cmd_plan, "count the images, forward passes, fits and LoRA steps of a profile and print its "
        "GPU-hours, CPU-hours and feature-cache disk (no data needed)")
    p = add("list", _cmd_list, "list profiles, encoders or notebooks", book_root=True)
    p.add_argument("what", choices=["profiles", "encoders", "notebooks"])
    return parser


def os_error_line(exc: OSError) -> str:
    """A permission or disk error in one line that names the folder (and the file it failed on)."""
    if exc.filename is None:
        return f"{exc.strerror or exc}; check the permissions and the free space of the output folders"
    path = Path(exc.filename)
    folder = path if path.is_dir() else path.parent
    return (f"{folder}: {exc.strerror} ({path}); check the folder's permissions and free space, or point "
            "CRSREPRO_HOME or the profile's paths at another folder")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _log_setup(args.verbose):
        try:
            args.func(args)
            return 0
        except CrsreproError as exc:
            error, line = exc, str(exc)
        except OSError as exc:
            if exc.errno not in USER_OS_ERRORS:
                raise
            error, line = exc, os_error_line(exc)
        if args.verbose:
            traceback.print_exception(error)
        print(f"crsrepro: error: {line}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _log_setup(verbose: bool):
    """Log to stderr, INFO with ``-v``, else WARNING with each kind of warning shown once and its repeats
    counted at the end (:class:`crsrepro.run.progress.RepeatedWarnings`). Where logging is already set up
    (a program that calls :func:`main`, pytest), its handlers are left as they are."""
    from crsrepro.run.progress import RepeatedWarnings

    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ours = [h for h in root.handlers if h not in before]
    repeated = RepeatedWarnings()
    if not verbose:
        for handler in ours:
            handler.addFilter(repeated)
    try:
        yield
    finally:
        for line in repeated.summary():
            print(line, file=sys.stderr)
        for handler in ours:
            handler.removeFilter(repeated)
