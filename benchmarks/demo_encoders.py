"""Forward throughput of each demo encoder on this machine: ``python benchmarks/demo_encoders.py``.

Measures the pure forward pass (``forward_features(..., layers=("final",))`` on preprocessed inputs)
at batch 64, the demo profile's batch size, after a warm-up. Two figures per encoder, because a shared
CPU is bursty:

- ``img/s``: images per wall-clock second, the best of a few timed repeats (other processes only ever
  slow a repeat down);
- ``img/cpu-s``: images per CPU-second of this process (all its threads), over all repeats. On an
  otherwise idle machine with ``T`` cores, wall throughput is at most ``T`` times this.

It then prints the time the demo profile's extraction would spend in the forward pass, from the best
wall figure, for ``--images`` image-conditions per encoder.
"""

import argparse
import time

import torch

from crsrepro.encoders.demo import DEMO_ENCODERS


def forward_throughput(encoder, *, batch_size: int = 64, repeats: int = 5, batches: int = 2) -> tuple[float, float]:
    """``(best wall img/s, img per CPU-second)`` of ``repeats`` x ``batches`` forward passes at ``batch_size``."""
    size = encoder.spec.input_size
    x = encoder.preprocess(torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8))
    encoder.forward_features(x)
    best, cpu_start = 0.0, time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batches):
            encoder.forward_features(x)
        best = max(best, batch_size * batches / (time.perf_counter() - start))
    return best, batch_size * batches * repeats / (time.process_time() - cpu_start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--images", type=int, default=14_200,
                        help="image-conditions per encoder in the demo profile (for the time estimate): "
                             "2,720 clean train+val, 680 test x 16 conditions, 600 MIMIC")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    total = 0.0
    print(f"{'encoder':22s} {'img/s':>8s} {'img/cpu-s':>10s} {'s per ' + str(args.images):>12s}   "
          f"(batch {args.batch_size}, {args.threads} threads, torch {torch.__version__})")
    for spec, builder in DEMO_ENCODERS:
        wall, cpu = forward_throughput(builder(spec, weights=None, device="cpu"), batch_size=args.batch_size)
        total += args.images / wall
        print(f"{spec.id:22s} {wall:8.0f} {cpu:10.0f} {args.images / wall:12.1f}")
    print(f"{'panel':22s} {'':8s} {'':10s} {total:12.1f}")


if __name__ == "__main__":
    main()
