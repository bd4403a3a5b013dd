"""Pure-forward vs end-to-end feature-extraction throughput, measured side by side (DESIGN.md section 5).

Pure forward: batches already decoded, resized and on the device; only ``forward_batch`` (the same call the
extractor makes: bf16 autocast and channels-last on a GPU, fp32 on a CPU). End to end:
:func:`crsrepro.extract.features.extract_features` on JPEG files with an empty cache (decode, canonical resize,
perturbation, encoder resize, forward, cache write). The ratio end-to-end / pure says how much of the
network's speed the pipeline keeps (the goal on a GPU is >= 0.8).

``--demo-panel`` times every demo encoder on a demo-like test split (96-px JPEGs, the demo profile's
16 test conditions) side by side: end to end without the degraded-image cache (decode and degrade for
this encoder), with a cold image cache (the first encoder: decode, degrade, store, read back), with a
warm one (a later encoder: read the degraded images), and the pure forward; then the cost of the
sha256 check on reading the feature cache entries it wrote.

Usage::

    python benchmarks/extract.py --encoder demo.effnet_lite0 --n-images 512 --device cpu
    python benchmarks/extract.py --encoder general.vit_b16 --n-images 20000 --device cuda \\
        --batch-size 512 --num-workers 14 --weights /path/to/weights
    python benchmarks/extract.py --demo-panel --n-images 128 --threads 1
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

from crsrepro.encoders import create_encoder, get_encoder_spec
from crsrepro.extract.features import _entry_paths, extract_features, forward_batch, read_entry


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


def demo_conditions() -> tuple[str, ...]:
    """The demo profile's test conditions: clean and every paper perturbation at every severity."""
    from crsrepro.core.vocab import PERTURBATIONS, SEVERITIES

    return ("clean",) + tuple(f"{p}@{s}" for p in PERTURBATIONS for s in SEVERITIES)


def timed_extract(encoder, images, cache_dir, conditions, size, args, image_cache_dir=None) -> float:
    """Image-conditions per second of one :func:`extract_features` call on an empty feature cache."""
    sync(encoder.device)
    started = time.perf_counter()
    extract_features(encoder, images, dataset="benchmark", images_key="benchmark", conditions=conditions,
                     cache_dir=cache_dir, canonical_size=size, batch_size=args.batch_size,
                     num_workers=args.num_workers, image_cache_dir=image_cache_dir, progress=False)
    sync(encoder.device)
    return len(images) * len(conditions) / (time.perf_counter() - started)


def verify_overhead(cache_dir: Path, n_rows: int) -> tuple[int, float, float]:
    """(entries, ms per entry read with the sha256 check, ms per bare ``np.load``) over ``cache_dir``."""
    keys = [meta.name.removesuffix(".meta.json") for meta in cache_dir.glob("*/*.meta.json")]
    started = time.perf_counter()
    for key in keys:
        assert read_entry(cache_dir, key, n_rows) is not None
    checked = (time.perf_counter() - started) / len(keys) * 1e3
    started = time.perf_counter()
    for key in keys:
        np.load(_entry_paths(cache_dir, key)[0], allow_pickle=False)
    bare = (time.perf_counter() - started) / len(keys) * 1e3
    return len(keys), checked, bare


def demo_panel(args) -> None:
    from crsrepro.encoders.demo import DEMO_ENCODERS

    conditions = demo_conditions()
    print(f"demo panel on {args.device} ({torch.get_num_threads()} threads): {args.n_images} images at 96 px x "
          f"{len(conditions)} conditions, batch {args.batch_size}, workers {args.num_workers}; img/s = "
          f"image-conditions per second")
    print(f"{'encoder':22s} {'no cache':>9s} {'cold':>9s} {'warm':>9s} {'pure':>9s} {'warm/pure':>10s} "
          f"{'warm/no cache':>14s}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images = write_jpegs(tmp, args.n_images, 96)
        for spec, builder in DEMO_ENCODERS:
            encoder = builder(spec, weights=None, device=args.device)
            run = tmp / spec.id
            rates = {"no cache": timed_extract(encoder, images, run / "a", conditions, 96, args),
                     "cold": timed_extract(encoder, images, run / "b", conditions, 96, args, run / "images"),
                     "warm": timed_extract(encoder, images, run / "c", conditions, 96, args, run / "images"),
                     "pure": pure_forward_rate(encoder, args.n_images * len(conditions), args.batch_size)}
            print(f"{spec.id:22s} " + " ".join(f"{rate:9.0f}" for rate in rates.values())
                  + f" {rates['warm'] / rates['pure']:10.2f} {rates['warm'] / rates['no cache']:14.2f}", flush=True)
        n, checked, bare = verify_overhead(tmp / DEMO_ENCODERS[0][0].id / "a", args.n_images)
        print(f"feature cache read ({n} entries of {args.n_images} rows, {DEMO_ENCODERS[0][0].id}): "
              f"{checked:.2f} ms per entry with the sha256 check, {bare:.2f} ms for np.load alone")


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
    parser.add_argument("--demo-panel", action="store_true",
                        help="every demo encoder, with and without the image cache")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.demo_panel:
        demo_panel(args)
        return

    spec = get_encoder_spec(args.encoder)
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
