"""A fixed reference workload that says how fast this machine is right now.

The project's VMs of one kind differ by up to 2x, and one VM drifted by 1.45x within an hour (issue 29's
note: the same code's ``make test`` took 7 min 59.7 s, then 11 min 35 s). A wall time of the book or of the
suite means little without the machine's speed in the same minutes, so every timing in the README's speed
section is given beside this script's figures, run just before and just after it.

The workload does not import ``crsrepro``, so a change to the package cannot change it. It has one part
for each kind of work the cold book does, each timed in CPU seconds, best of ``--repeats``, on one thread:

- ``forward``: a small convolutional network's forward pass on 96-pixel images (grid extraction, depth
  and LoRA are mostly this);
- ``lbfgs``: float64 L-BFGS on an 8-class softmax regression at 7 C values (the probe fits);
- ``start``: a fresh Python importing numpy, pandas, scipy and sklearn (every worker and chapter kernel
  pays this before its first task; torch is left out as the chapters no longer import it).

Usage: ``python benchmarks/machine.py [--repeats 3]``. It prints one line per part and a ``total``; compare
a figure with another only together with the totals measured beside each.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import numpy as np
import torch


def forward_work():
    """Forward 512 images of 96 x 96 through a fixed 4-block CNN, batch 64."""
    torch.manual_seed(0)
    blocks, width = [], 3
    for out in (32, 64, 128, 256):
        blocks += [torch.nn.Conv2d(width, out, 3, padding=1), torch.nn.BatchNorm2d(out), torch.nn.ReLU(),
                   torch.nn.MaxPool2d(2)]
        width = out
    net = torch.nn.Sequential(*blocks).eval()
    images = torch.rand(512, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return float(sum(net(batch).sum() for batch in images.split(64)))


def lbfgs_work():
    """An 8-class softmax probe on 900 x 256 float64 features, fitted at 7 C values, 100 iterations each."""
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(900, 256, dtype=torch.float64, generator=generator)
    y = (X[:, :8] + 0.5 * torch.randn(900, 8, dtype=torch.float64, generator=generator)).argmax(1)
    total = 0.0
    for C in (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0):
        W = torch.zeros(256, 8, dtype=torch.float64, requires_grad=True)
        b = torch.zeros(8, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([W, b], max_iter=100, tolerance_grad=0.0, tolerance_change=0.0,
                                      history_size=10, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(X @ W + b, y, reduction="sum") + (W * W).sum() / (2 * C)
            loss.backward()
            return loss

        total += float(optimizer.step(closure).detach())
    return total


def start_work():
    """A fresh Python importing the scientific stack (CPU of the child process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import numpy, pandas, scipy.stats, sklearn.linear_model"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def best_cpu(work, repeats):
    """The least CPU seconds of ``repeats`` runs of ``work`` (``start`` reports its child's CPU itself)."""
    best = np.inf
    for _ in range(repeats):
        start = time.process_time()
        child = work()
        spent = child if work is start_work else time.process_time() - start
        best = min(best, spent)
    return best


PARTS = {"forward": forward_work, "lbfgs": lbfgs_work, "start": start_work}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    forward_work()  # the first call pays for torch's lazy set-up, not the machine's speed
    total = 0.0
    print(time.strftime("%Y-%m-%d %H:%M:%S %Z"), f"load average {open('/proc/loadavg').read().split()[0]}")
    for name, work in PARTS.items():
        seconds = best_cpu(work, args.repeats)
        total += seconds
        print(f"{name:8s} {seconds:6.2f} CPU-s (best of {args.repeats})")
    print(f"{'total':8s} {total:6.2f} CPU-s")


if __name__ == "__main__":
    main()
