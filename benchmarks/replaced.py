"""Each speed-up of issue 29 that changes no number, timed beside the code it replaced, in one run.

1. **The probe's L-BFGS** (:func:`crsrepro.fit.lbfgs.batched_lbfgs`) keeps the state of its running problems
   only, compacted when some stop, instead of gathering every problem's curvature history on every
   iteration (:func:`gathering_lbfgs`, the code it replaced, kept here as the baseline). Timed on the demo's
   costliest kind of fit: an ISIC-like multinomial probe (8 classes, a rare class with too few val cases, so
   C is cross-validated) at ``--dim`` features, five label fractions; the two must give bit-identical probes.
   Then the whole solver (the L-BFGS loop and the logistic objective) at ``--before-lbfgs`` (read from git)
   against now, on the same probe: the two-loop recursion, the curvature pair and the objective's residual now
   write into buffers and in place instead of allocating a temporary for every operation, the line search's first
   try (all running problems) gathers nothing, and the softmax loss picks the target class's logit by index
   instead of summing a product with the one-hot labels. The same operations in the same order: bit-identical.
   Where ``--profile``'s run is built (its features cached), every linear unit of one seed of its grid is fitted and
   scored with both solvers, and the row-sets must be bit-identical.
2. **The reliability profiles** (:func:`crsrepro.score.dimensions.reliability_profiles`, which the multiverse
   calls about 50 times) read one pass of numpy arrays instead of a pandas loop cell by cell
   (:func:`per_cell_profiles`, the code it replaced); on a demo-sized runs table, they must give equal tables.
3. **The dry run's frozen-base check** (:func:`crsrepro.tools.dry_run`'s LoRA step) reads the network's base
   weights once after the step (:func:`crsrepro.run.lora.base_changes`), instead of once per weight
   (:func:`per_key_frozen_check`: a full copy of the network for each of its tensors); on a ViT-B/16 with LoRA adapters (random weights), both must say "frozen".
4. **The multiverse's conclusions** (:mod:`crsrepro.analyse.sensitivity`: ``conclusions``, ``choice_effects``,
   ``level_moves``, ``informative_shares``, which chapter 05b and the claims page call) find each encoder's rank
   shift in one pass over the two ranking columns instead of ``DataFrame.apply`` row by row, and drop the
   table's attrs (its per-combination CRS arrays, which pandas deep-copied into every derived frame). The code
   it replaced is read from git at ``--before`` (``git show REV:crsrepro/analyse/sensitivity.py``) and run on
   the multiverse of a profile whose run is built (``--profile``; skipped when none is): equal outputs.
5. **A process's start** (a pool worker, a chapter's kernel, a command) imports timm and torchvision only when it
   builds a network that needs them (:func:`crsrepro.encoders.demo.build_random_vit`,
   :func:`crsrepro.encoders.registry.resize_to_input`), not whenever it reads the encoder registry; and a chapter's
   kernel imports torch only when it runs a case bootstrap (:mod:`crsrepro.score.stats` imports it in the functions
   that use it), not whenever it reads the run. A fresh Python imports what a worker and what a chapter import
   (:data:`STARTS`) from the package at ``--before`` (``git archive``) and from this checkout: the CPU of each, and
   which of timm and torch it imported.

Usage: ``python benchmarks/replaced.py [--dim 128] [--repeats 2] [--profile smoke] [--before 24eb250] [--before-lbfgs 1954729] [--units-seed 0] [--before-chapter 4e60c9a]`` (one torch
thread, best CPU time; section 5 at least 3 starts each)
"""

import argparse
import time
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch

from crsrepro.analyse import sensitivity
from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.core.errors import CrsreproError
from crsrepro.core.metrics import label_efficiency_retention, robustness_raw
from crsrepro.core.schema import FINAL, FROZEN, PRIMARY, is_perturbation, is_transfer
from crsrepro.core.vocab import CLEAN, LINEAR
from crsrepro.fit import lbfgs
from crsrepro.fit.linear import fit_linear_probes
from crsrepro.run.lora import base_changes, base_state
from crsrepro.score.dimensions import ProfileTableError, reliability_profiles, select_runs

_EPS = lbfgs._EPS


def gathering_lbfgs(objective, theta, *, max_iter, tol, time_cap_s=None, history_size=10, max_line_search=40):
    """:func:`crsrepro.fit.lbfgs.batched_lbfgs` before issue 29: every iteration gathers the running problems'
    state and history by index."""
    start = time.perf_counter()
    theta = theta.clone()
    n_problems, dim = theta.shape
    m = history_size
    S = theta.new_zeros(m, n_problems, dim)
    Y = theta.new_zeros(m, n_problems, dim)
    rho = theta.new_zeros(m, n_problems)
    gamma = theta.new_ones(n_problems)
    has_pair = torch.zeros(n_problems, dtype=torch.bool, device=theta.device)
    f, g = objective(theta, torch.arange(n_problems, device=theta.device))
    converged = g.abs().amax(dim=1) <= tol
    running = ~converged
    n_iter = torch.zeros(n_problems, dtype=torch.long, device=theta.device)
    hit_time_cap = False
    for it in range(max_iter):
        idx = running.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        if time_cap_s is not None and time.perf_counter() - start > time_cap_s:
            hit_time_cap = True
            break
        g_i = g[idx]
        direction = -g_i
        alphas = []
        for j in range(min(it, m)):
            slot = (it - 1 - j) % m
            alpha = rho[slot, idx] * (S[slot, idx] * direction).sum(1)
            direction = direction - alpha[:, None] * Y[slot, idx]
            alphas.append((slot, alpha))
        direction = gamma[idx, None] * direction
        for slot, alpha in reversed(alphas):
            beta = rho[slot, idx] * (Y[slot, idx] * direction).sum(1)
            direction = direction + S[slot, idx] * (alpha - beta)[:, None]
        slope = (g_i * direction).sum(1)
        uphill = slope >= 0
        direction[uphill] = -g_i[uphill]
        slope = torch.where(uphill, -(g_i * g_i).sum(1), slope)
        step = torch.where(has_pair[idx], torch.ones_like(slope), (1.0 / g_i.abs().sum(1)).clamp(max=1.0))
        accepted = torch.zeros_like(uphill)
        f_new, g_new = (f[idx].clone(), g_i.clone())
        for _ in range(max_line_search):
            pending = (~accepted).nonzero().squeeze(1)
            if pending.numel() == 0:
                break
            f_try, g_try = objective(theta[idx[pending]] + step[pending, None] * direction[pending], idx[pending])
            ok = f_try <= f[idx[pending]] + 0.0001 * step[pending] * slope[pending]
            f_new[pending[ok]], g_new[pending[ok]] = (f_try[ok], g_try[ok])
            accepted[pending[ok]] = True
            step[pending[~ok]] *= 0.5
        slot = it % m
        s = step[:, None] * direction * accepted[:, None]
        y = (g_new - g_i) * accepted[:, None]
        sy, yy = ((s * y).sum(1), (y * y).sum(1))
        good = accepted & (sy > _EPS * yy) & (yy > 0)
        S[slot, idx], Y[slot, idx] = (s, y)
        rho[slot, idx] = torch.where(good, 1.0 / torch.where(good, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        gamma[idx] = torch.where(good, sy / yy.clamp(min=1e-300), gamma[idx])
        has_pair[idx] |= good
        theta[idx] += s
        f[idx], g[idx] = (f_new, g_new)
        n_iter[idx] += 1
        converged[idx] = g_new.abs().amax(dim=1) <= tol
        running[idx] = ~converged[idx] & accepted
    return (theta, n_iter.cpu().numpy(), converged.cpu().numpy(), hit_time_cap)


def per_cell_profiles(
    runs: pd.DataFrame,
    *,
    include_transfer: bool = True,
    robustness=robustness_raw,
    retention=label_efficiency_retention,
    ece_metric: str = "ece",
    probe: str = LINEAR,
    layer: str | None = FINAL,
    regime: str | None = FROZEN,
) -> pd.DataFrame:
    """:func:`crsrepro.score.dimensions.reliability_profiles` before issue 29: a pandas loop, cell by cell."""
    primary = select_runs(runs, probe=probe, layer=layer, regime=regime)
    swept = [column for column, value in (("layer", layer), ("regime", regime)) if value is None]
    profile_key = ["encoder", "dataset", "seed", *swept]
    key = profile_key[:3] + ["label_fraction", "condition"] + swept
    dup = primary.duplicated(key, keep=False)
    if dup.any():
        row = primary[dup].iloc[0]
        raise ProfileTableError(
            "runs table: the primary run " + ", ".join((f"{k} {row[k]}" for k in key)) + " appears more than once"
        )
    rows = []
    for values, cell in primary.groupby(profile_key, sort=True):
        at = dict(zip(profile_key, values))
        where = "runs table, " + ", ".join((f"{k} {v}" for k, v in at.items()))
        clean = cell[cell["condition"] == CLEAN].set_index("label_fraction")
        full = cell[cell["label_fraction"] == 1.0].set_index("condition")
        if CLEAN not in full.index or len(clean) < 2:
            raise ProfileTableError(
                f"{where}: needs the clean run at label_fraction 1.0 and at least one smaller fraction, has fractions {sorted(clean.index)}"
            )
        conditions = [c for c in full.index if is_perturbation(c) or (include_transfer and is_transfer(c))]
        if not any((is_perturbation(c) for c in conditions)):
            raise ProfileTableError(f"{where}: no perturbation run (<perturbation>@<severity>) at label_fraction 1.0")
        drops = full.loc[CLEAN, "auroc"] - full.loc[conditions, "auroc"].to_numpy(float)
        row = at | {
            "auroc": full.loc[CLEAN, "auroc"],
            "ece": full.loc[CLEAN, ece_metric],
            "retention": retention(clean["auroc"].astype(float).to_dict()),
            "robustness": robustness(drops),
        }
        if "family" in cell.columns:
            row["family"] = cell["family"].iloc[0]
        rows.append(row)
    if not rows:
        wanted = {**PRIMARY, "probe": probe, "layer": layer or "any", "regime": regime or "any"}
        raise ProfileTableError(
            "runs table: no primary runs (" + ", ".join((f"{k} {v}" for k, v in wanted.items())) + ")"
        )
    return pd.DataFrame(rows)


def vit_b16_with_adapters():
    """A ViT-B/16 at real size (random weights, nothing downloaded) with LoRA adapters on its attention."""
    import timm
    from peft import LoraConfig, inject_adapter_in_model

    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
    return inject_adapter_in_model(LoraConfig(r=8, lora_alpha=16, target_modules=["qkv"]), model)


def per_key_frozen_check(model, base):
    """The dry run's frozen-base check before issue 29: the base state read again for every tensor."""
    return all(torch.equal(v, base_state(model)[k]) for k, v in base.items())


def module_at(revision: str, module):
    """A copy of ``module`` (a :mod:`crsrepro` module) as it was at git ``revision``: the code a speed-up replaced."""
    import subprocess
    import sys
    import types
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = Path(module.__file__).resolve().relative_to(root).as_posix()
    source = subprocess.run(["git", "show", f"{revision}:{path}"], check=True, capture_output=True, text=True,
                            cwd=root).stdout
    copy = types.ModuleType(f"{module.__name__.rsplit('.', 1)[-1]}_at_{revision}")
    copy.__file__ = module.__file__  # sensitivity reads its sensitivity_space.yaml beside it
    sys.modules[copy.__name__] = copy  # its dataclasses look their module up
    exec(compile(source, f"{path}@{revision}", "exec"), copy.__dict__)
    return copy


def multiverse_conclusions(module, table):
    """Everything chapter 05b and the claims page compute from a multiverse table."""
    return (module.conclusions(table), module.choice_effects(table), module.level_moves(table),
            module.informative_shares(table))


#: What a pool worker and a chapter's kernel import before their first task or cell does any work.
STARTS = {"worker": "import crsrepro.encoders, crsrepro.run.grid, crsrepro.run.units",
          "chapter": "import crsrepro.analyse.run_analysis, crsrepro.present.chapters"}


def start_cpu(statement, package_parent, repeats):
    """(best user + system CPU seconds of a fresh Python running the import ``statement`` with the ``crsrepro``
    under ``package_parent`` (run there, so that it is the first on the path), which of timm and torch it
    imported)."""
    import os
    import resource
    import subprocess
    import sys

    best, imported = np.inf, None
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = subprocess.run([sys.executable, "-c", f"{statement}; import sys; "
                              "print(' and '.join(m for m in ('timm', 'torch') if m in sys.modules) or 'neither')"],
                             check=True, capture_output=True, text=True, cwd=package_parent,
                             env={**os.environ, "PYTHONPATH": str(package_parent)})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        imported = run.stdout.strip()
    return best, imported


def package_at(revision, folder):
    """``folder``, holding the ``crsrepro`` package as it was at git ``revision``."""
    import subprocess
    from pathlib import Path

    archive = subprocess.run(["git", "archive", revision, "crsrepro"], check=True, capture_output=True,
                             cwd=Path(__file__).resolve().parents[1]).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def best_cpu(func, repeats):
    best, out = np.inf, None
    for _ in range(repeats):
        start = time.process_time()
        out = func()
        best = min(best, time.process_time() - start)
    return best, out


@contextmanager
def solving_with(solver, objective):
    """Fit every linear probe with ``solver`` and ``objective`` in place of :mod:`crsrepro.fit.lbfgs`'s
    :func:`~crsrepro.fit.lbfgs.batched_lbfgs` and logistic objective (the solve looks both up by name)."""
    original = lbfgs.batched_lbfgs, lbfgs._LogisticObjective
    lbfgs.batched_lbfgs, lbfgs._LogisticObjective = solver, objective
    try:
        yield
    finally:
        lbfgs.batched_lbfgs, lbfgs._LogisticObjective = original


def isic_like_probes(dim, solver, objective=None):
    """Five label fractions of an 8-class probe whose rarest class has 3 val cases (C cross-validated), fitted with
    ``solver`` in place of :func:`crsrepro.fit.lbfgs.batched_lbfgs` (and ``objective`` in place of its objective)."""
    rng = np.random.default_rng(0)
    n_train, n_val, k = 660, 300, 8
    prior = np.array([0.45, 0.2, 0.12, 0.1, 0.06, 0.04, 0.02, 0.01])
    y = rng.choice(k, size=n_train + n_val, p=prior)
    y[:k], y[n_train:n_train + 3] = np.arange(k), k - 1
    centres = rng.normal(size=(k, dim))
    X = centres[y] * 0.4 + rng.normal(size=(len(y), dim))
    subsets = {f: np.arange(max(k, int(f * n_train))) for f in (0.01, 0.05, 0.10, 0.25, 1.0)}
    with solving_with(solver, objective or lbfgs._LogisticObjective):
        return fit_linear_probes(X[:n_train], y[:n_train], subsets, X[n_train:], y[n_train:], task="multiclass",
                                 max_iter=100, progress=False)


def built_linear_units(profile_name, seed):
    """``[(name, unit, features)]``: every linear unit of ``seed`` in the grid of a built run of ``profile_name``,
    with its cached features (a CrsreproError when they are not cached: build the book first)."""
    import tempfile
    from pathlib import Path

    from crsrepro.encoders import get_encoder_spec
    from crsrepro.profiles import load_profile
    from crsrepro.run.grid import GridStage, _ProbeTask, view
    from crsrepro.run.units import Unit, cached_features, feature_requests

    profile = load_profile(profile_name)
    stage = GridStage(output_dir=Path(tempfile.mkdtemp()))  # an empty store: every unit is planned
    units = []
    for task in stage.plan(profile, stage.store(profile))[1]:
        unit_task = task.args[0]
        if isinstance(unit_task, _ProbeTask) and unit_task.seed == seed and unit_task.probe == LINEAR:
            cell = unit_task.cell
            prepared = view(profile, cell.dataset, cell.manifest_dir, cell.images_key)
            units.append((f"{cell.encoder} {cell.dataset}", Unit(profile, get_encoder_spec(cell.encoder), prepared,
                                                                 seed, LINEAR),
                          cached_features(profile, feature_requests(profile, prepared), unit_task.feature_keys)))
    return units


def run_units(units, solver, objective):
    """The row-sets of ``units`` (without their fit times) fitted with ``solver`` and ``objective``."""
    with solving_with(solver, objective):
        return [unit.run(feats)[0].drop(columns="fit_seconds") for _, unit, feats in units]


def bit_identical(old, new):
    """Whether two ``{fraction: LinearProbe}`` chose the same C with bit-identical coefficients."""
    return all(old[f].C_ == new[f].C_ and np.array_equal(old[f].coef_, new[f].coef_)
               and np.array_equal(old[f].intercept_, new[f].intercept_) for f in old)


def demo_sized_runs(n_encoders=10, datasets=("isic2019", "aptos2019", "chexpert"), n_seeds=5):
    rng = np.random.default_rng(0)
    conditions = [CLEAN] + [f"{p}@{s}" for p in ("gaussian_blur", "jpeg", "contrast", "rician_noise", "fov_crop")
                            for s in (1, 2, 3)]
    rows = []
    for e in range(n_encoders):
        for d in datasets:
            for seed in range(n_seeds):
                for f in (0.01, 0.05, 0.10, 0.25, 1.0):
                    for c in (conditions + (["mimic_cxr"] if d == "chexpert" else []) if f == 1.0 else [CLEAN]):
                        rows.append(dict(encoder=f"enc{e}", family="f", dataset=d, seed=seed, label_fraction=f,
                                         condition=c, probe=LINEAR, layer=FINAL, regime=FROZEN, recalibrator="none",
                                         auroc=0.6 + 0.3 * rng.random(), ece=0.2 * rng.random()))
    return pd.DataFrame(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=128, help="feature dimension of the probe (effnet-lite0: 1280)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", default="smoke", help="a profile whose run is built, for the multiverse")
    parser.add_argument("--before", default="24eb250", help="the git revision of the replaced code (sections 4 and 5)")
    parser.add_argument("--before-lbfgs", default="1954729",
                        help="the git revision before the solver's temporaries were cut (section 1)")
    parser.add_argument("--units-seed", type=int, default=0, help="the seed whose linear units of the built "
                        "--profile run are fitted with both solvers (section 1; skipped where none is built)")
    parser.add_argument("--before-chapter", default="4e60c9a",
                        help="the git revision before a chapter's kernel stopped importing torch (section 5)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    before, old = best_cpu(lambda: isic_like_probes(args.dim, gathering_lbfgs), args.repeats)
    after, new = best_cpu(lambda: isic_like_probes(args.dim, lbfgs.batched_lbfgs), args.repeats)
    print(f"linear probe, 8 classes x {args.dim}-d, 5 fractions, C cross-validated: gathering L-BFGS {before:.2f} s, "
          f"compacted {after:.2f} s ({before / after:.2f}x); probes {'bit-identical' if bit_identical(old, new) else 'DIFFER'}")
    solver = module_at(args.before_lbfgs, lbfgs)
    before, old = best_cpu(lambda: isic_like_probes(args.dim, solver.batched_lbfgs, solver._LogisticObjective),
                           args.repeats)
    after, new = best_cpu(lambda: isic_like_probes(args.dim, lbfgs.batched_lbfgs), args.repeats)
    print(f"the same probe, L-BFGS and objective at {args.before_lbfgs} {before:.2f} s, with fewer temporaries "
          f"{after:.2f} s ({before / after:.2f}x); probes {'bit-identical' if bit_identical(old, new) else 'DIFFER'}")
    try:
        units = built_linear_units(args.profile, args.units_seed)
    except CrsreproError as exc:
        print(f"{args.profile}'s linear units: skipped ({exc})")
    else:
        before, old = best_cpu(lambda: run_units(units, solver.batched_lbfgs, solver._LogisticObjective), 1)
        after, new = best_cpu(lambda: run_units(units, lbfgs.batched_lbfgs, lbfgs._LogisticObjective), 1)
        same = all(a.equals(b) for a, b in zip(old, new))
        print(f"{args.profile}'s {len(units)} linear units of seed {args.units_seed} (fit and score): at "
              f"{args.before_lbfgs} {before:.1f} s, now {after:.1f} s ({before / after:.2f}x); row-sets "
              f"{'bit-identical' if same else 'DIFFER'}")

    runs = demo_sized_runs()
    before, old = best_cpu(lambda: per_cell_profiles(runs), args.repeats)
    after, new = best_cpu(lambda: reliability_profiles(runs), args.repeats)
    equal = old.equals(new)
    print(f"reliability profiles, {len(old)} cells x seeds from {len(runs)} runs: per-cell loop {before:.3f} s, "
          f"one pass {after:.3f} s ({before / after:.1f}x); tables {'equal' if equal else 'DIFFER'}")

    model = vit_b16_with_adapters()
    base = base_state(model)
    before, old = best_cpu(lambda: per_key_frozen_check(model, base), 1)
    after, new = best_cpu(lambda: not base_changes(model, base), args.repeats)
    print(f"frozen-base check, ViT-B/16 with adapters ({len(base)} base tensors): per tensor {before:.2f} s, "
          f"once {after:.3f} s ({before / after:.0f}x); both {'frozen' if old and new else 'DIFFER'}")

    try:
        table = RunAnalysis.load(args.profile).multiverse
    except CrsreproError as exc:
        print(f"multiverse conclusions: skipped ({exc})")
    else:
        old_module = module_at(args.before, sensitivity)
        before, old = best_cpu(lambda: multiverse_conclusions(old_module, table), 1)
        after, new = best_cpu(lambda: multiverse_conclusions(sensitivity, table), args.repeats)
        equal = all(a.equals(b) for a, b in zip(old[:3], new[:3])) and old[3] == new[3]
        print(f"multiverse conclusions, {args.profile}'s {len(table):,} combinations: at {args.before} {before:.2f} s, "
              f"now {after:.2f} s ({before / after:.1f}x); outputs {'equal' if equal else 'DIFFER'}")

    import tempfile
    from pathlib import Path

    for (kind, statement), revision in zip(STARTS.items(), (args.before, args.before_chapter)):
        with tempfile.TemporaryDirectory() as folder:
            before, imported_before = start_cpu(statement, package_at(revision, folder), max(args.repeats, 3))
        after, imported_after = start_cpu(statement, Path(__file__).resolve().parents[1], max(args.repeats, 3))
        print(f"a {kind}'s start ({statement.removeprefix('import ')}): at {revision} {before:.2f} s CPU "
              f"({imported_before} imported), now {after:.2f} s ({imported_after}) ({before / after:.2f}x)")


if __name__ == "__main__":
    main()
