"""The parametric recalibrators fitted for every label at once, beside one fit per label, in one run.

A multi-label probe (CheXpert: 14 labels) is recalibrated per label as a two-class problem. The run grid
fits the four recalibrators on a seed's val split and scores them by 5-fold cross-validated ECE inside it
(``crsrepro.run.units``): 24 fits per method and row-set, each over 14 labels. Temperature, vector and
Dirichlet scaling now fit every label of a fit at once, in one :func:`crsrepro.fit.lbfgs.batched_lbfgs`
(:meth:`crsrepro.fit.calibration._LogLinearScaling._fit_maps`); before, each label was its own
``torch.optim.LBFGS`` with a strong Wolfe line search (:func:`per_label_fit_maps`, the code it replaced, kept
here as the baseline; a multi-class map is still fitted that way). The two solve the same convex problems to
the same gradient tolerance with different line searches, so their maps agree to the tolerance, not bit for
bit: the script prints the largest difference of the recalibrated probabilities and of the cross-validated ECE.

The workload is the demo's own: the val split of the first CheXpert linear row-set under ``--cases`` (a built
demo's ``.crsrepro/demo/results/cases``), or, without it, a CheXpert-like synthetic one (``--n`` cases x 14
labels, about 10 % of the labels masked, an over-confident probe: logits x 3). One torch thread.

Usage: ``python benchmarks/recalibration.py [--cases .crsrepro/demo/results/cases] [--n 300] [--repeats 3]``
(best CPU time of the repeats)
"""

import argparse
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from scipy.special import expit

from crsrepro.fit import calibration
from crsrepro.fit.calibration import cross_validated_ece, make_recalibrator

PARAMETRIC = ("temperature", "vector", "dirichlet")


def per_label_fit_maps(self, problems):
    """The replaced fit: one ``torch.optim.LBFGS`` (strong Wolfe) per problem, as a multi-class map still is."""
    start = self._start(problems[0][0].shape[1])
    return [self._fit_strong_wolfe(start, *self._padded([problem])) for problem in problems]


@contextmanager
def replaced_fit():
    batched = calibration._LogLinearScaling._fit_maps
    calibration._LogLinearScaling._fit_maps = per_label_fit_maps
    try:
        yield
    finally:
        calibration._LogLinearScaling._fit_maps = batched


def chexpert_like(n, rng):
    z = rng.normal(size=(n, 14)) * 1.5 + rng.normal(size=14) * 0.5 - 1.0
    y = (rng.uniform(size=z.shape) < expit(z)).astype(float)
    y[rng.uniform(size=y.shape) < 0.1] = np.nan
    return expit(3.0 * z), y


def demo_val_split(folder):
    """The val probabilities and labels of the first multi-label row-set's per-case arrays in ``folder``."""
    for path in sorted(Path(folder).glob("*.npz")):
        with np.load(path) as arrays:
            if arrays["labels|val"].ndim == 2:
                probs, y = arrays["probs|val|none"], arrays["labels|val"]
                return probs, y, f"demo CheXpert val split {path.name[:12]}: {len(y)} cases x {y.shape[1]} labels"
    raise SystemExit(f"no multi-label row-set's per-case arrays in {folder}")


def workload(probs, y):
    """What a CheXpert row-set of the grid does: each parametric recalibrator fitted on val and applied,
    and their 5-fold cross-validated ECE."""
    mapped = {name: make_recalibrator(name).fit(probs, y).predict_proba(probs) for name in PARAMETRIC}
    return mapped, cross_validated_ece(probs, y, methods=PARAMETRIC, task="multilabel")


def best_cpu_seconds(repeats, fn):
    times, result = [], None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, help="a built demo's per-case arrays (<output_dir>/cases)")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cases:
        probs, y, source = demo_val_split(args.cases)
    else:
        probs, y = chexpert_like(args.n, np.random.default_rng(0))
        source = f"CheXpert-like synthetic val split, {args.n} cases x 14 labels"
    with replaced_fit():
        before, (mapped_before, ece_before) = best_cpu_seconds(args.repeats, lambda: workload(probs, y))
    now, (mapped_now, ece_now) = best_cpu_seconds(args.repeats, lambda: workload(probs, y))
    print(f"{source}: 3 parametric recalibrators fitted and 5-fold cross-validated "
          f"(best CPU s of {args.repeats}, one thread)")
    print(f"  one L-BFGS per label (before): {before:7.2f} s")
    print(f"  every label at once (now):     {now:7.2f} s   x{before / now:.1f}")
    for name in PARAMETRIC:
        print(f"  {name:<11} largest probability difference {np.abs(mapped_before[name] - mapped_now[name]).max():.1e}, "
              f"cross-validated ECE {ece_before[name]:.6f} -> {ece_now[name]:.6f}")


if __name__ == "__main__":
    main()
