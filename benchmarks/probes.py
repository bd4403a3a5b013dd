"""Speed of the linear-probe backends, measured side by side (DESIGN.md section 7).

Three measurements on the same synthetic, real-like features (a low-rank latent signal with a
decaying spectrum, non-negative and offset like pooled CNN/ViT embeddings, so ill-conditioned):

1. CheXpert scale (190,000 x 768, 14 labels) and ISIC scale (20,000 x 768, 8 classes). The torch
   backend fits the whole C grid (x labels) as one batched L-BFGS; scikit-learn is timed on one
   (label, C) fit and extrapolated to the grid by iterations (its seconds per iteration x the
   iterations the torch grid took), which keeps the script under 10 minutes. This is done for the C
   the grid chose (it converges) and for C = 1 (on these features neither backend converges there in
   200 iterations). Agreement is the largest probability difference between the two backends on that
   (label, C) problem; the torch grid's convergence is listed per C.
2. ``--demo-cell``: the probe stage of the demo's heaviest cell-seed (CheXpert-like: 840 train x 14
   labels x 7 C x 5 label fractions, nested train and val subsets as the grid uses), side by side
   in one run: the torch backend's two solves (one batched L-BFGS per fraction, and the masked solve
   of every fraction at once) and scikit-learn (every fit, not extrapolated), with the chosen C per
   fraction and the largest probability difference to the per-fraction solve.
3. ``--cv``: the cross-validated C choice of a small label fraction (MIN_VAL_CASES), side by side in
   one run: the folds solved one by one (the former code, ``LinearProbe._fold_by_fold``) and as one
   masked batched L-BFGS (``LinearProbe._solve_folds``), on APTOS-like (5 classes) and CheXpert-like
   (14 labels) labelled subsets of demo size, with the chosen C and the largest probability difference.
4. The demo profile's probe stage: every (dataset, embedding size) of the demo panel is timed once
   per seed-cell (all label fractions) with the torch backend, and scikit-learn is timed on one
   (label, C) fit per cell and extrapolated by iterations; both are scaled to the whole grid.

Usage::

    python benchmarks/probes.py                 # a quarter of the paper-scale rows (the default)
    python benchmarks/probes.py --scale 1       # full scale (about 15 minutes on a 2-core CPU)
    python benchmarks/probes.py --device cuda   # the torch backend on a GPU
    python benchmarks/probes.py --threads 1     # on a machine shared with other jobs
    python benchmarks/probes.py --demo-cell --threads 1 --skip-paper-scale --skip-demo
    python benchmarks/probes.py --cv --threads 1 --skip-paper-scale --skip-demo
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import Counter

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from crsrepro.data import get_dataset_spec
from crsrepro.encoders import get_encoder_spec
from crsrepro.fit.linear import C_GRID, LinearProbe, fit_linear_probes
from crsrepro.profiles import load_profile

PAPER_SCALES = {  # name: (train+val rows, feature dim, task, classes or labels)
    "chexpert": (190_000, 768, "multilabel", 14),
    "isic2019": (20_000, 768, "multiclass", 8),
}
VAL_SHARE = 0.1  # of the rows, held out to choose C
SINGLE_C = 1.0  # the (label, C) problem timed with scikit-learn


def real_like_features(n, dim, n_out, task, rng, *, rank=48):
    """Features ``relu(latent @ mixing) + noise + offset`` with a decaying spectrum, and labels."""
    latent = rng.normal(size=(n, rank))
    mixing = rng.normal(size=(rank, dim)) * np.logspace(0, -2.5, rank)[:, None]
    X = np.maximum(latent @ mixing, 0) + 0.02 * rng.normal(size=(n, dim)) + 0.5
    signal = latent[:, :n_out] + rng.normal(size=(n, n_out))
    if task == "multiclass":
        return X, signal.argmax(axis=1)
    return X, (signal > 1.0).astype(float)  # prevalences around 20 %, as CheXpert's


def nested_subsets(y, fractions, task, rng):
    """Nested random row subsets with at least one example of every class (both classes per label)."""
    order = rng.permutation(y.shape[0])
    if task == "multiclass":
        required = [order[np.argmax(y[order] == k)] for k in np.unique(y)]
    else:
        required = [order[np.argmax(y[order, j] == v)] for j in range(y.shape[1]) for v in (0, 1)]
    subsets = {}
    for f in sorted(fractions):
        first = order[: max(1, math.ceil(f * y.shape[0]))]
        subsets[f] = np.union1d(first, required)
    return subsets


def split(X, y):
    n_val = int(VAL_SHARE * X.shape[0])
    return X[n_val:], y[n_val:], X[:n_val], y[:n_val]


def single_problem(y, task):
    """The labels of the one (label, C) problem scikit-learn is timed on: label 0, or the multinomial."""
    return y[:, :1] if task == "multilabel" else y


def grid_iterations(probe, n_columns):
    """L-BFGS iterations a probe's grid took: per C the slowest label's count, times the labels."""
    return int(probe.n_iter_by_c_.sum()) * n_columns


def sklearn_estimate(reference, iterations):
    """scikit-learn's time for ``iterations`` L-BFGS iterations, at the timed fit's seconds per iteration."""
    return reference.fit_seconds_ / max(reference.n_iter_, 1) * iterations


def paper_scale(name, *, scale, device, max_iter, rng):
    n, dim, task, n_out = PAPER_SCALES[name]
    n = int(n * scale)
    X, y = real_like_features(n, dim, n_out, task, rng)
    X_train, y_train, X_val, y_val = split(X, y)
    problems = len(C_GRID) * (n_out if task == "multilabel" else 1)
    print(f"\n== {name} scale: {X_train.shape[0]:,} train + {X_val.shape[0]:,} val rows x {dim}, "
          f"{n_out} {'labels' if task == 'multilabel' else 'classes'}; {problems} (label, C) problems")

    grid = LinearProbe(task=task, backend="torch", device=device, max_iter=max_iter).fit(
        X_train, y_train, X_val=X_val, y_val=y_val)
    print(f"torch ({device}), whole grid in one batched L-BFGS: {grid.fit_seconds_:8.1f} s "
          f"({grid.fit_seconds_ / problems:.2f} s per (label, C) problem); chosen C = {grid.C_:g}")
    for C, ok, iters in zip(C_GRID, grid.converged_by_c_, grid.n_iter_by_c_):
        print(f"    C = {C:<7g} converged = {bool(ok)!s:5}  iterations (max over labels) = {iters}")

    y_one, y_val_one = single_problem(y_train, task), single_problem(y_val, task)
    for C in (grid.C_, SINGLE_C):
        fits = {backend: LinearProbe(task=task, c_grid=(C,), backend=backend, device=device,
                                     max_iter=max_iter).fit(X_train, y_one, X_val=X_val, y_val=y_val_one)
                for backend in ("sklearn", "torch")}
        reference = fits["sklearn"]
        estimate = sklearn_estimate(reference, grid_iterations(grid, problems // len(C_GRID)))
        difference = np.abs(fits["torch"].predict_proba(X_val) - reference.predict_proba(X_val)).max()
        print(f"one (label 0, C={C:g}) fit: sklearn {reference.fit_seconds_:.1f} s ({reference.n_iter_} iterations, "
              f"converged = {reference.converged_}), torch {fits['torch'].fit_seconds_:.1f} s "
              f"({fits['torch'].n_iter_} iterations, converged = {fits['torch'].converged_}); "
              f"max |p_torch - p_sklearn| = {difference:.1e}")
        print(f"    sklearn for the whole grid ~{estimate:,.0f} s (its s/iteration x the grid's iterations) "
              f"-> torch speed-up x{estimate / grid.fit_seconds_:.1f}")


def demo_grid(profile_name, *, device, rng):
    profile = load_profile(profile_name)
    probe = profile.probe
    dims = Counter(get_encoder_spec(e).embed_dim for e in profile.encoders)
    cells_per_dim = {dim: count * len(profile.seeds) for dim, count in dims.items()}
    print(f"\n== {profile_name} grid probe stage: {len(profile.encoders)} encoders x {len(profile.datasets)} datasets "
          f"x {len(profile.seeds)} seeds x {len(profile.label_fractions)} fractions; "
          f"embedding sizes {dict(sorted(dims.items()))}")
    totals = {"torch": 0.0, "sklearn": 0.0}
    n_probes = n_problems = 0
    for dataset in profile.datasets:
        spec = get_dataset_spec(dataset)
        n_out = len(spec.label_names)
        n_images = profile.demo_world.n_images[dataset]
        n_train, n_val = round(0.7 * n_images), round(0.1 * n_images)  # the 70/10/20 split
        per_probe = len(probe["c_grid"]) * (n_out if spec.task == "multilabel" else 1)
        for dim, cells in sorted(cells_per_dim.items()):
            X, y = real_like_features(n_train + n_val, dim, n_out, spec.task, rng)
            X_train, y_train, X_val, y_val = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
            subsets = nested_subsets(y_train, profile.label_fractions, spec.task, rng)
            start = time.perf_counter()
            probes = fit_linear_probes(X_train, y_train, subsets, X_val, y_val, task=spec.task,
                                       c_grid=probe["c_grid"], backend="torch", device=device,
                                       max_iter=probe["max_iter"], time_cap_s=probe["time_cap_s"], progress=False)
            torch_seconds = time.perf_counter() - start
            reference = LinearProbe(task=spec.task, c_grid=(SINGLE_C,), backend="sklearn",
                                    max_iter=probe["max_iter"]).fit(
                X_train, single_problem(y_train, spec.task), X_val=X_val, y_val=single_problem(y_val, spec.task))
            n_columns = per_probe // len(probe["c_grid"])
            sklearn_seconds = sklearn_estimate(reference, sum(grid_iterations(p, n_columns) for p in probes.values()))
            converged = sum(p.converged_ for p in probes.values())
            print(f"{dataset:9} dim {dim:5}: torch {torch_seconds / len(subsets):6.2f} s per probe fit "
                  f"({per_probe} problems; chosen C converged in {converged}/{len(subsets)}), "
                  f"sklearn ~{sklearn_seconds / len(subsets):6.2f} s per probe fit (extrapolated); x{cells} cells")
            totals["torch"] += torch_seconds * cells
            totals["sklearn"] += sklearn_seconds * cells
            n_probes += len(subsets) * cells
            n_problems += len(subsets) * cells * per_probe
    print(f"whole probe stage: {n_probes:,} probe fits = {n_problems:,} (label, C) problems; "
          f"torch ~{totals['torch'] / 60:.1f} min ({totals['torch'] / n_probes:.2f} s per fit), "
          f"sklearn ~{totals['sklearn'] / 60:.1f} min ({totals['sklearn'] / n_problems:.3f} s per problem); "
          f"ratio x{totals['sklearn'] / totals['torch']:.1f}")


def demo_cell(*, dims, device, max_iter, rng, sklearn=True):
    """Per-fraction vs masked torch solves vs scikit-learn on one demo-sized CheXpert-like cell-seed."""
    fractions, n_train, n_val, n_labels = (0.01, 0.05, 0.10, 0.25, 1.0), 840, 120, 14
    print(f"\n== demo cell-seed: {n_train} train + {n_val} val x {n_labels} labels x {len(C_GRID)} C x "
          f"{len(fractions)} fractions, max_iter {max_iter}")
    for dim in dims:
        X, y = real_like_features(n_train + n_val, dim, n_labels, "multilabel", rng)
        X_train, y_train, X_val, y_val = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
        subsets = nested_subsets(y_train, fractions, "multilabel", rng)
        val_subsets = nested_subsets(y_val, fractions, "multilabel", rng)
        fits, seconds = {}, {}
        runs = [("torch", "per_fraction"), ("torch", "masked")] + ([("sklearn", "per_fraction")] if sklearn else [])
        for backend, solve in runs:
            start = time.perf_counter()
            fits[backend, solve] = fit_linear_probes(X_train, y_train, subsets, X_val, y_val, task="multilabel",
                                                     backend=backend, device=device, max_iter=max_iter,
                                                     val_subsets=val_subsets, solve=solve, progress=False)
            seconds[backend, solve] = time.perf_counter() - start
        reference = fits["torch", "per_fraction"]
        base = seconds["torch", "per_fraction"]
        for (backend, solve), probes in fits.items():
            same_c = all(probes[f].C_ == reference[f].C_ for f in fractions)
            diff = {f: np.abs(probes[f].predict_proba(X_val) - reference[f].predict_proba(X_val)).max()
                    for f in fractions}
            print(f"dim {dim:5}  {backend:7} {solve:12} {seconds[backend, solve]:7.2f} s  "
                  f"x{seconds[backend, solve] / base:5.2f} of per-fraction  "
                  f"C {[probes[f].C_ for f in fractions]} (same C: {same_c}); max |p - p_per_fraction| = "
                  f"{max(diff.values()):.1e} (at 100 %: {diff[1.0]:.1e}; converged at the chosen C: "
                  f"{sum(probes[f].converged_ for f in fractions)}/{len(fractions)})")


class FoldByFold(LinearProbe):
    """The probe with its cross-validation folds solved one by one (the code before the masked solve)."""

    def _solve_folds(self, Z, targets, masks, grid, init):
        return self._fold_by_fold(Z, targets, masks, grid, init)


def cv_choice(*, device, max_iter, rng, repeats=20):
    """Fold-by-fold vs one masked solve of the cross-validated C choice, on demo-sized labelled subsets."""
    cases = {"aptos2019-like, 10 % labels": (70, 7, 256, "multiclass", 5),
             "chexpert-like, 5 % labels": (60, 6, 256, "multilabel", 14)}
    print(f"\n== cross-validated C choice ({repeats} subsets per case, max_iter {max_iter})")
    for name, (n_train, n_val, dim, task, n_out) in cases.items():
        seconds = {"fold by fold": 0.0, "masked": 0.0}
        same_c, diff = 0, 0.0
        for _ in range(repeats):
            X, y = real_like_features(n_train + n_val, dim, n_out, task, rng)
            fitted = {}
            for label, kind in (("fold by fold", FoldByFold), ("masked", LinearProbe)):
                start = time.perf_counter()
                fitted[label] = kind(task=task, backend="torch", device=device, max_iter=max_iter).fit(
                    X[:n_train], y[:n_train], X_val=X[n_train:], y_val=y[n_train:])
                seconds[label] += time.perf_counter() - start
            a, b = fitted["fold by fold"], fitted["masked"]
            same_c += a.C_ == b.C_ and a.c_rule_ == b.c_rule_ == "cv"
            diff = max(diff, float(np.abs(a.predict_proba(X) - b.predict_proba(X)).max()))
        print(f"{name:28} fold by fold {seconds['fold by fold']:6.2f} s, masked {seconds['masked']:6.2f} s "
              f"(x{seconds['fold by fold'] / seconds['masked']:.1f}); same C by cv in {same_c}/{repeats}; "
              f"max |p_masked - p_fold_by_fold| = {diff:.1e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.25,
                        help="share of the paper-scale rows (default 0.25, which keeps the script under 10 min)")
    parser.add_argument("--device", default="cpu", help="torch device of the torch backend")
    parser.add_argument("--max-iter", type=int, default=200, help="L-BFGS budget at paper scale")
    parser.add_argument("--profile", default="demo", help="profile whose probe stage is estimated")
    parser.add_argument("--skip-paper-scale", action="store_true")
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--demo-cell", action="store_true",
                        help="also time one demo-sized CheXpert-like cell-seed: per-fraction vs masked vs sklearn")
    parser.add_argument("--demo-cell-dims", type=int, nargs="+", default=[128, 1280],
                        help="embedding sizes of the demo cell-seed (the demo panel has 48..1280)")
    parser.add_argument("--demo-cell-max-iter", type=int, default=100, help="the demo profile's L-BFGS budget")
    parser.add_argument("--cv", action="store_true",
                        help="also time the cross-validated C choice: folds one by one vs one masked solve")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch and BLAS (default: the libraries' own); 1 is much faster "
                             "when other jobs share the cores")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else "")
          + f"; load average {os.getloadavg()[0]:.1f} (other work on the machine slows both backends)")
    start = time.perf_counter()
    if not args.skip_paper_scale:
        for name in PAPER_SCALES:
            paper_scale(name, scale=args.scale, device=args.device, max_iter=args.max_iter, rng=rng)
    if args.demo_cell:
        demo_cell(dims=args.demo_cell_dims, device=args.device, max_iter=args.demo_cell_max_iter, rng=rng)
    if args.cv:
        cv_choice(device=args.device, max_iter=args.demo_cell_max_iter, rng=rng)
    if not args.skip_demo:
        demo_grid(args.profile, device=args.device, rng=rng)
    print(f"\nbenchmark wall time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
