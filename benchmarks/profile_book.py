"""Where the time of a book build goes: profile it with py-spy, then summarise the samples by stage.

Record (every process of the build: the grid's workers and the notebook kernels included)::

    py-spy record --subprocesses --format raw --rate 20 -o book.folded -- \\
        .venv/bin/python -m crsrepro book --profile demo

Summarise, by stage (what the CPU did) and by task (which part of the build did it)::

    python benchmarks/profile_book.py book.folded

py-spy's ``raw`` format is one collapsed stack per line (``frame;frame;...;frame count``). Each
sample is assigned to the stage of the *innermost* frame that names one (:data:`STAGES`, matched on
the frame's function and file), so a probe fitted inside a notebook counts as probe fitting, not as
notebook execution. A sample is one busy thread of one process at one instant (py-spy drops idle threads unless given
``--idle``), so the shares are shares of the CPU time, not of the wall clock. Stacks that name no
stage are "other" (imports, start-up, pandas glue).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

#: (stage, regular expression on one frame "function (file:line)"), innermost match wins; the order
#: only breaks ties within one frame.
STAGES = [
    ("demo world: generating images", r"generate_demo_world|_write_(isic|aptos|chexpert|mimic)"),
    ("features: decode and degrade", r"degraded_views|_DegradedImageStore|apply_condition|perturb\.py"),
    ("features: encoder forward", r"forward_batch|forward_features"),
    ("features: other", r"extract_features|_extract_chunk"),
    ("linear probe: L-BFGS", r"batched_lbfgs|_solve_torch|_LogisticObjective|fit_linear_probes"),
    ("control probes: MLP and k-NN", r"MLPProbe|KNNProbe|mlp|knn"),
    ("recalibration", r"_recalibrated|calibration\.py"),
    ("scoring: AUROC, ECE", r"metrics\.py"),
    ("result store: write and verify", r"results\.py|atomic_write|sha256_file"),
    ("depth sweep", r"depth\.py"),
    ("LoRA fine-tuning", r"lora\.py"),
    ("bootstrap and statistics", r"stats\.py|two_level_bootstrap|seed_count_coverage"),
    ("multiverse (sensitivity)", r"sensitivity\.py"),
    ("figures (matplotlib)", r"matplotlib|seaborn|plots.*\.py"),
    ("notebook execution: papermill, kernel", r"papermill|ipykernel|nbclient"),
    ("Jupyter Book: Sphinx", r"sphinx|jupyter_book|myst_nb|docutils"),
    ("waiting (idle threads)", r"\b(wait|select|poll|epoll_wait|sleep|_wait_for_tstate_lock|acquire)\b"),
]
_COMPILED = [(stage, re.compile(pattern)) for stage, pattern in STAGES]

#: (task, regular expression on the whole stack): which of the build's tasks a sample belongs to, by the
#: first pattern that matches anywhere in its stack.
TASKS = [
    ("depth sweep (stage tasks)", r"_pair_task"),
    ("LoRA fine-tuning (stage tasks)", r"_cell_task"),
    ("grid probe tasks", r"_probe_task"),
    ("grid extraction tasks", r"_extract_task"),
    ("chapters (notebook kernels)", r"ipykernel"),
    ("Jupyter Book", r"jupyter_book|sphinx"),
]
_TASKS = [(task, re.compile(pattern)) for task, pattern in TASKS]


def stage_of(stack: str) -> str:
    """The stage of one collapsed stack (frames root first, ``;``-separated): its innermost named frame.

    >>> stage_of("<module> (x.py:1);run_grid (grid.py:9);batched_lbfgs (probes.py:200);mm (t.py:3)")
    'linear probe: L-BFGS'
    >>> stage_of("<module> (x.py:1);import (y.py:2)")
    'other'
    """
    for frame in reversed(stack.split(";")):
        for stage, pattern in _COMPILED:
            if pattern.search(frame):
                return stage
    return "other"


def task_of(stack: str) -> str:
    """The build task a collapsed stack belongs to (:data:`TASKS`); "planning, merging, start-up" otherwise.

    >>> task_of("spawn_main (spawn.py:1);_call (executor.py:2);_pair_task (depth.py:3);fit (linear.py:4)")
    'depth sweep (stage tasks)'
    """
    return next((task for task, pattern in _TASKS if pattern.search(stack)), "planning, merging, start-up")


def summarise(path: Path, classify=stage_of) -> list[tuple[str, int, float]]:
    """``(name, samples, share)`` for every class of ``classify`` (:func:`stage_of` or :func:`task_of`)
    with samples, largest first."""
    counts: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[classify(stack)] += int(count)
    total = sum(counts.values()) or 1
    return [(name, n, n / total) for name, n in counts.most_common()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folded", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--rate", type=float, default=20.0, help="the py-spy sampling rate (Hz) it was recorded at")
    args = parser.parse_args(argv)
    for title, classify in (("stage", stage_of), ("task", task_of)):
        rows = summarise(args.folded, classify)
        total = sum(n for _, n, _ in rows)
        print(f"{'by ' + title:45s} {'samples':>8s} {'share':>7s} {'CPU-min':>8s}")
        for name, n, share in rows:
            print(f"{name:45s} {n:8d} {share:7.1%} {n / args.rate / 60:8.1f}")
        print(f"{'total':45s} {total:8d} {1:7.0%} {total / args.rate / 60:8.1f}\n")


if __name__ == "__main__":
    main()
