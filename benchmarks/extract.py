"""Pure-forward vs end-to-end feature-extraction throughput, measured side by side (issue 4).

Pure forward: batches already decoded, resized and on the device; only ``forward_batch`` (the same call the
extractor makes: bf16 autocast and channels-last on a GPU, fp32 on a CPU). End to end:
:func:`crsrepro.features.extract_features` on JPEG files with an empty cache (decode, canonical resize,
perturbation, encoder resize, forward, cache write). The ratio end-to-end / pure says how much of the
network's speed the pipeline keeps (the goal on a GPU is >= 0.8).

Usage::

    python benchmarks/extract.py --encoder demo.effnet_lite0 --n-images 512 --device cpu
    python benchmarks/extract.py --encoder general.vit_b16 --n-images 20000 --device cuda \\
        --batch-size 512 --num-workers 14 --weights /path/to/weights
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

from crsrepro.encoders import create_encoder, get_spec
from crsrepro.features import extract_features, forward_batch


def write_jpegs(folder: Path, n: int, size: int, seed: int = 0) -> pd.DataFrame:
    """``n`` synthetic JPEGs (smooth gradients plus noise) of ``size`` x ``size`` px."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    rows = []
    for i in range(n):
        base = np.stack([xx, yy, (xx + yy) / 2], axis=-1) * rng.uniform(100, 255, 3)
        image = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        path = folder / f"{i:06d}.jpg"
        Image.fromarray(image).save(path, quality=90)
        rows.append({"image_id": f"{i:06d}", "path": str(path)})
    return pd.DataFrame(rows)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def pure_forward_rate(encoder, n: int, batch_size: int) -> float:
    """Images per second of ``forward_batch`` on device-resident uint8 batches."""
    size = encoder.spec.input_size
    batch = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, device=encoder.device)
    forward_batch(encoder, batch, ("final",))  # warm-up
    sync(encoder.device)
    started, done = time.perf_counter(), 0
    while done < n:
        forward_batch(encoder, batch, ("final",))["final"].cpu()
        done += batch_size
    sync(encoder.device)
    return done / (time.perf_counter() - started)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="demo.effnet_lite0")
    parser.add_argument("--weights", default=None, help="weights path (default: the registry's lookup)")
    parser.add_argument("--n-images", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=None, help="stored JPEG size (default: input size)")
    parser.add_argument("--conditions", nargs="+", default=["clean"])
    args = parser.parse_args(argv)

    spec = get_spec(args.encoder)
    encoder = create_encoder(args.encoder, weights=args.weights, device=args.device)
    size = args.image_size or spec.input_size
    with tempfile.TemporaryDirectory() as tmp:
        images = write_jpegs(Path(tmp), args.n_images, size)
        pure = pure_forward_rate(encoder, args.n_images * len(args.conditions), args.batch_size)
        sync(encoder.device)
        started = time.perf_counter()
        extract_features(encoder, images, dataset="benchmark", images_key="benchmark",
                         conditions=tuple(args.conditions), cache_dir=Path(tmp) / "cache",
                         canonical_size=size, batch_size=args.batch_size, num_workers=args.num_workers,
                         progress=False)
        end_to_end = args.n_images * len(args.conditions) / (time.perf_counter() - started)
    print(f"encoder {args.encoder} on {encoder.device} ({torch.get_num_threads()} threads), "
          f"{args.n_images} images at {size}px -> {spec.input_size}px, conditions {args.conditions}, "
          f"batch {args.batch_size}, workers {args.num_workers}")
    print(f"pure forward   {pure:10.1f} img/s")
    print(f"end to end     {end_to_end:10.1f} img/s")
    print(f"ratio          {end_to_end / pure:10.2f}")


if __name__ == "__main__":
    main()
