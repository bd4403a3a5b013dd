"""Forward throughput of each demo encoder on this machine: ``python benchmarks/demo_encoders.py``.

Measures the pure forward pass (``forward_features(..., layers=("final",))`` on preprocessed inputs)
at batch 64, the demo profile's batch size, as the best of a few timed repeats after a warm-up (other
processes on a shared machine only ever slow a repeat down). Prints img/s per encoder and the time
the demo profile's extraction would spend in the forward pass for ``--images`` image-conditions
per encoder.
"""

import argparse
import time

import torch

from crsrepro.encoders.demo import DEMO_ENCODERS


def forward_images_per_second(encoder, *, batch_size: int = 64, repeats: int = 5, batches: int = 2) -> float:
    """Best-of-``repeats`` img/s of ``batches`` forward passes at ``batch_size`` (inputs preprocessed once)."""
    size = encoder.spec.input_size
    x = encoder.preprocess(torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8))
    encoder.forward_features(x)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batches):
            encoder.forward_features(x)
        best = max(best, batch_size * batches / (time.perf_counter() - start))
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--images", type=int, default=14_200,
                        help="image-conditions per encoder in the demo profile (for the time estimate): 2,720 clean train+val, 680 test x 16 conditions, 600 MIMIC")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    total = 0.0
    print(f"{'encoder':22s} {'img/s':>8s} {'s per ' + str(args.images):>12s}   (batch {args.batch_size}, "
          f"{args.threads} threads, torch {torch.__version__})")
    for spec, builder in DEMO_ENCODERS:
        rate = forward_images_per_second(builder(spec, weights=None, device="cpu"), batch_size=args.batch_size)
        total += args.images / rate
        print(f"{spec.id:22s} {rate:8.0f} {args.images / rate:12.1f}")
    print(f"{'panel':22s} {'':8s} {total:12.1f}")


if __name__ == "__main__":
    main()
