"""Where the time of a book build goes: profile it with py-spy, then summarise the samples by stage.

Record (every process of the build: the grid's workers and the notebook kernels included)::

    py-spy record --subprocesses --format raw --rate 20 -o book.folded -- \\
        .venv/bin/python -m crsrepro book --profile demo

Summarise::

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


def summarise(path: Path) -> list[tuple[str, int, float]]:
    """``(stage, samples, share)`` for every stage with samples, largest first."""
    counts: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack)] += int(count)
    total = sum(counts.values()) or 1
    return [(stage, n, n / total) for stage, n in counts.most_common()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folded", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--rate", type=float, default=20.0, help="the py-spy sampling rate (Hz) it was recorded at")
    args = parser.parse_args(argv)
    rows = summarise(args.folded)
    total = sum(n for _, n, _ in rows)
    print(f"{'stage':45s} {'samples':>8s} {'share':>7s} {'thread-min':>10s}")
    for stage, n, share in rows:
        print(f"{stage:45s} {n:8d} {share:7.1%} {n / args.rate / 60:10.1f}")
    print(f"{'total':45s} {total:8d} {1:7.0%} {total / args.rate / 60:10.1f}")


if __name__ == "__main__":
    main()
