"""Time the sensitivity multiverse on a synthetic panel the size of the demo (DESIGN.md section 14).

10 encoders x 3 datasets x 5 seeds, every perturbation at three severities and the CheXpert ->
MIMIC-CXR transfer; the shipped space (24,624 combinations without the C budget's full_val level, which
needs the grid's auroc_full_val rows).
Goal: at least 1,000 combinations in under 60 s on 2 cores. Prints combinations per second.

Usage: ``python benchmarks/sensitivity.py [--encoders 10] [--seeds 5] [--resamples 200]``
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.analyse.sensitivity import load_space, multiverse
from crsrepro.core.schema import PRIMARY, RUN_KEYS, condition_name
from crsrepro.core.vocab import CLEAN, PERTURBATIONS
from crsrepro.score.crs import ReferenceFrame
from crsrepro.score.frame import frame_path


def demo_sized_analysis(manifest_dir: Path, n_encoders=10, n_seeds=5, rng=0) -> RunAnalysis:
    """A RunAnalysis of the demo profile over synthetic runs, with its frame frozen from them."""
    rng = np.random.default_rng(rng)
    conditions = [condition_name(p, s) for p in PERTURBATIONS for s in (1, 2, 3)]
    rows = []
    for i in range(n_encoders):
        quality = i / max(1, n_encoders - 1)
        for dataset in ("isic2019", "aptos2019", "chexpert"):
            for seed in range(n_seeds):
                base = dict(PRIMARY, encoder=f"enc{i:02d}", family="general", dataset=dataset, seed=seed)
                auroc = 0.65 + 0.3 * quality + rng.normal(0, 0.01)
                ece = 0.15 - 0.1 * quality + rng.normal(0, 0.01)
                run = lambda **kw: rows.append(base | dict(ece=ece, classwise_ece=ece * rng.uniform(0.6, 1.0)) | kw)  # noqa: E731
                for fraction in (0.01, 0.05, 0.1, 0.25):
                    run(label_fraction=fraction, condition=CLEAN, auroc=auroc * rng.uniform(0.8, 1.0))
                run(label_fraction=1.0, condition=CLEAN, auroc=auroc)
                for condition in conditions:
                    run(label_fraction=1.0, condition=condition, auroc=auroc - rng.uniform(0.0, 0.15))
                if dataset == "chexpert":
                    run(label_fraction=1.0, condition="mimic_cxr", auroc=auroc - rng.uniform(0.05, 0.25))
    runs = pd.DataFrame(rows)
    results = runs.melt(id_vars=RUN_KEYS, value_vars=["auroc", "ece", "classwise_ece"], var_name="metric")
    analysis = RunAnalysis("demo", results.assign(rowset="synthetic"), manifest_dir=manifest_dir)
    ReferenceFrame.freeze(analysis.reliability_profiles).save(frame_path(analysis.profile, manifest_dir))
    return analysis


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoders", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--resamples", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        analysis = demo_sized_analysis(Path(tmp), args.encoders, args.seeds)
        analysis.reliability_profiles  # built once, as the book's analysis object holds them
        start = time.perf_counter()
        table = multiverse(analysis, load_space(), n_resamples=args.resamples)
        seconds = time.perf_counter() - start
    print(f"{len(table)} combinations ({args.encoders} encoders x 3 datasets x {args.seeds} seeds, "
          f"{args.resamples} seed replicates each) in {seconds:.1f} s: {len(table) / seconds:.0f} combinations/s")


if __name__ == "__main__":
    main()
