"""What issue 27's changes to the demo cost in its cold build, measured side by side in one run.

The run grid (feature extraction and every probe fit, cold: empty feature cache, new manifests) on a
slice of the demo profile, once as shipped and once with each change undone:

- ``as shipped``: the demo profile;
- ``without the noise models`` (27.3): ``noise_model: {}``, so each dataset runs the paper's 15
  perturbed conditions without its modality-apt noise model at 3 severities;
- ``70/10/20 split`` (27.1): ``data.split_fractions: [0.7, 0.1, 0.2]``, the default split, which gives the
  demo's 1,200-image datasets a 120-image val split instead of 300 (the earlier demo also had fewer
  images: 700-1,200 per dataset).

The other changes cost nothing here or are their own stage: size-relative perturbation strengths (27.3)
change the parameters of the same operations; LoRA's probe-then-fine-tune recipe (27.2) is the book's
LoRA stage, whose line in the stage table ``crsrepro book`` prints is its whole cost; the teaching
tests (27.4) read the cached results; the tables (27.5) are layout.

All variants share one demo world (generated first, not timed) and run serially in this process, so
their wall and CPU times are comparable; the ratio is each variant's CPU time over the shipped one's
(the mean of its two runs, first and last).

Usage: ``python benchmarks/demo_costs.py [--encoders demo.med_cnn demo.pixel_pca] [--seeds 0]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

VARIANTS = {"as shipped": {},
            "without the noise models": {"noise_model": {}},
            "70/10/20 split": {"data": {"split_fractions": [0.7, 0.1, 0.2]}},
            "as shipped, again": {}}
"""The shipped profile runs first and last, so that what the first run pays once (imports, building the
encoders) shows as the difference between the two; the ratio's base is their mean."""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoders", nargs="+", default=["demo.med_cnn", "demo.pixel_pca"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = parser.parse_args()
    torch.set_num_threads(1)

    scratch = Path(tempfile.mkdtemp(prefix="crsrepro-demo-costs-"))
    os.environ["CRSREPRO_HOME"] = str(scratch / "home")
    from crsrepro.data.demo_world import ensure_demo_world
    from crsrepro.profiles import load_profile
    from crsrepro.run.grid import run_grid

    world = scratch / "world"
    ensure_demo_world(load_profile("demo", overrides={"data": {"root": str(world)}}), progress=False)
    print(f"slice: {', '.join(args.encoders)} x {', '.join(load_profile('demo').datasets)} x seeds "
          f"{args.seeds}, serial, one torch thread; demo world in {world}")
    rows = []
    for name, change in VARIANTS.items():
        folder = scratch / name.replace(" ", "_").replace("/", "-")
        overrides = {"encoders": args.encoders, "seeds": args.seeds,
                     "features": {"cache_dir": str(folder / "features")}, "output_dir": str(folder / "results"),
                     **change, "data": {"root": str(world), **change.get("data", {})}}
        profile = load_profile("demo", overrides=overrides)
        wall, cpu = time.perf_counter(), time.process_time()
        results = run_grid(profile, manifest_dir=folder / "manifests", progress=False)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows.append((name, results["rowset"].nunique(), results["condition"].nunique(), wall, cpu))
    base = (rows[0][4] + rows[-1][4]) / 2
    print(f"{'variant':26} {'row-sets':>8} {'conditions':>10} {'wall s':>8} {'CPU s':>8} {'CPU / shipped':>13}")
    # conditions: clean, the perturbed ones (each noise model at 3 severities among them) and the transfer set
    for name, n_rowsets, n_conditions, wall, cpu in rows:
        print(f"{name:26} {n_rowsets:8d} {n_conditions:10d} {wall:8.1f} {cpu:8.1f} {cpu / base:13.2f}")


if __name__ == "__main__":
    main()
