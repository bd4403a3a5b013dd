"""Time the seed-paired bootstrap at the paper's size, and the case-level and two-level bootstraps per device.

The paper's bootstrap (DESIGN.md section 10): 10,000 replicates, 15 encoders x 3 datasets x 5 seeds, in
seconds, not minutes, with resampled peers (the default) beside frozen peers. The
case-level and the two-level (seeds x cases) bootstraps (beyond the paper) resample test images; they
are timed side by side on the CPU and, when one is present, on the GPU, at a CheXpert-like size given
by ``--cases``.

Usage: ``python benchmarks/bootstrap.py [--cases 2000] [--case-resamples 1000] [--seeds 5]``
"""

import argparse
import time

import numpy as np
import pandas as pd
import torch

from crsrepro.score.crs import ReferenceFrame
from crsrepro.score.stats import case_paired_bootstrap, seed_paired_bootstrap, two_level_bootstrap


def paper_sized_profiles(n_encoders=15, datasets=("isic2019", "aptos2019", "chexpert"), n_seeds=5, rng=0):
    rng = np.random.default_rng(rng)
    quality = np.linspace(0, 1, n_encoders)
    rows = [dict(encoder=f"enc{i:02d}", dataset=d, seed=s,
                 auroc=0.65 + 0.3 * quality[i] + rng.normal(0, 0.01), ece=0.15 - 0.1 * quality[i] + rng.normal(0, 0.01),
                 retention=0.8 + 0.15 * rng.random(), robustness=0.85 + 0.1 * rng.random())
            for d in datasets for s in range(n_seeds) for i in range(n_encoders)]
    return pd.DataFrame(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resamples", type=int, default=10000)
    parser.add_argument("--cases", type=int, default=2000, help="test cases for the case-level bootstrap")
    parser.add_argument("--labels", type=int, default=14, help="labels (multi-label) for the case-level bootstrap")
    parser.add_argument("--encoders", type=int, default=15)
    parser.add_argument("--case-resamples", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()

    profiles = paper_sized_profiles(args.encoders, n_seeds=args.seeds)
    frame = ReferenceFrame.freeze(profiles)
    for peers in ("resampled", "frozen"):
        t0 = time.perf_counter()
        result = seed_paired_bootstrap(profiles, frame, n_resamples=args.resamples, rng=0, peers=peers)
        seconds = time.perf_counter() - t0
        print(f"seed-paired bootstrap, {peers} peers: {args.resamples} replicates x {args.encoders} encoders x "
              f"3 datasets x {args.seeds} seeds: {seconds:.2f} s (P(rank 1) of the leader {result.p_rank1.max():.3f})")

    rng = np.random.default_rng(0)
    y = (rng.random((args.cases, args.labels)) < 0.3).astype(float)
    y[rng.random(y.shape) < 0.1] = np.nan
    scores = {f"enc{i:02d}": np.nan_to_num(y) * (0.2 + 0.05 * i) + rng.random(y.shape) for i in range(args.encoders)}
    probs = {e: np.clip(s[None] / 1.8 + rng.normal(0, 0.02, (args.seeds, *y.shape)), 0, 1).astype(np.float16)
             for e, s in scores.items()}  # per-seed probabilities in the compact float16 store
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    size = f"{args.case_resamples} replicates x {args.encoders} encoders x {args.cases} cases x {args.labels} labels"
    for device in devices:
        t0 = time.perf_counter()
        case_paired_bootstrap(y, scores, task="multilabel", n_resamples=args.case_resamples, rng=0, device=device,
                              progress=False)
        case_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        two_level_bootstrap(y, probs, task="multilabel", n_resamples=args.case_resamples, rng=0, device=device)
        two_seconds = time.perf_counter() - t0
        print(f"on {device}, {size}: case-level (AUROC, 1 seed) {case_seconds:.2f} s | two-level (AUROC + ECE, "
              f"{args.seeds} seeds) {two_seconds:.2f} s ({two_seconds / case_seconds:.1f}x)")


if __name__ == "__main__":
    main()
