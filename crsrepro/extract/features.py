"""Feature extraction with a content-addressed cache (DESIGN.md sections 5 and 6).

:func:`extract_features` turns a table of images into one ``(N, D)`` array per (test condition, layer
tap), rows in the table's order. Each image is decoded once; it is first brought to the dataset's
canonical size (short side to ``canonical_size``, or kept as stored), then each requested condition is
applied to it **once** at that size (:func:`crsrepro.extract.perturb.apply_condition`; ``clean`` is the image
itself), and only then does the encoder resize it with its own preprocessing. So every encoder sees the
same degraded image (DESIGN.md section 6). All layer taps come from the same forward pass.

The cache
---------
An entry is ``<cache_dir>/<key[:2]>/<key>.npy`` plus ``<key>.meta.json``. The key is a SHA-256 over
everything that changes the bytes (:func:`feature_cache_inputs`): encoder id, weights hash, the spec's
preprocessing and pooling, dataset, what the images are (the images key: the demo world's
generator parameters or a real release's file sizes and mtimes, :mod:`crsrepro.data.content`), the
hash of the image ids in order, canonical size, condition, layer, for a perturbed condition
:data:`crsrepro.extract.perturb.PERTURBATION_VERSION`, and :data:`CACHE_VERSION` (bumped when
this stage's semantics change; never the package version). The sidecar records those inputs with the versions of torch/timm/transformers/
open_clip/crsrepro, the git hash, the shape and the time. Every file is written to a temporary name in
the same folder and renamed (``os.replace``); the ``.meta.json`` is written last and marks the entry
complete, so a half-written entry is never read. The sidecar also records the array's SHA-256
(:func:`array_sha256`), recomputed on every read: an entry that fails it is recomputed with a warning
(measured: about 2 ms per 128 x 1280 float32 entry on the shared 2-core VM, against 0.1 ms for the
bare ``np.load``; some 0.4 s over the whole demo cache, about 116 MB).

Long extractions are cut into chunks of ``chunk_size`` images [ours]; each finished chunk is saved
(atomically) under ``<cache_dir>/partial/<key>/``, so a run killed mid-way resumes at the first missing
chunk and gives identical features. The partial files are removed once the entry is complete.

The degraded-image cache
------------------------
With ``image_cache_dir`` set [ours], the decoded and degraded images themselves (uint8, at the
canonical size) are stored once per (dataset, image set, condition), keyed by the images key, the
ids hash, the canonical size, the condition and :data:`crsrepro.extract.perturb.PERTURBATION_VERSION`, in
chunks of :data:`IMAGE_CHUNK_SIZE` images (:class:`_DegradedImageStore`). The first encoder fills it;
every later encoder reads the same bytes (memory-mapped) instead of decoding and degrading again, so
its features are bit-identical to a run without the cache.

Devices
-------
On a CPU: a ``DataLoader`` with ``num_workers`` workers that decode, perturb and resize, and an fp32
forward. On a GPU (``encoder.device`` is CUDA; not runnable in this repository's CI, which has none):
pinned memory, non-blocking copies, bf16 autocast and a channels-last input. Decode and perturbation
stay in the CPU workers, which prefetch (``prefetch_factor``) while the GPU runs: the perturbations are
numpy functions of the data layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from crsrepro.core.io import atomic_write, content_key, git_hash
from crsrepro.core.schema import FINAL
from crsrepro.core.vocab import CLEAN
from crsrepro.encoders.registry import Encoder, EncoderSpec, resize_to_input

logger = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: keyed by the images' content, not the split manifest
DEFAULT_CHUNK_SIZE = 4096


# --------------------------------------------------------------------------------------------------
# Cache keys and atomic files
# --------------------------------------------------------------------------------------------------

def image_ids_hash(image_ids: Sequence[str]) -> str:
    """SHA-256 of the image ids in order (the order is the row order of the features).

    >>> image_ids_hash(["a", "b"]) != image_ids_hash(["b", "a"])
    True
    """
    return hashlib.sha256("\n".join(map(str, image_ids)).encode()).hexdigest()


def feature_cache_inputs(encoder: Encoder, *, dataset: str, images_key: str, ids_hash: str,
                         canonical_size: int | None, condition: str, layer: str) -> dict:
    """Everything that decides the bytes of one feature array; its JSON is what the key hashes.

    ``images_key`` says what the images are (:func:`crsrepro.data.content.dataset_content_key`: the
    demo world's generator parameters, or a real release's file sizes and mtimes), ``ids_hash`` which
    of them, in which order. A perturbed condition's array also depends on the perturbation code,
    :data:`crsrepro.extract.perturb.PERTURBATION_VERSION`; a clean one does not, so a new perturbation
    version leaves the clean features cached.
    """
    from crsrepro.extract.perturb import PERTURBATION_VERSION

    spec = encoder.spec
    inputs = {"encoder": spec.id, "weights_hash": encoder.weights_hash, "preprocessing": spec.preprocessing,
              "pooling": spec.pooling_at(layer), "feature_layer": spec.feature_layer, "dataset": dataset,
              "images_key": images_key, "image_ids_hash": ids_hash, "canonical_size": canonical_size,
              "condition": condition, "layer": layer, "cache_version": CACHE_VERSION}
    return inputs if condition == CLEAN else inputs | {"perturbation_version": PERTURBATION_VERSION}


def _cache_inputs(encoder: Encoder, ids: list[str], *, dataset, images_key, conditions, layers,
                  canonical_size) -> dict:
    ids_hash = image_ids_hash(ids)
    return {(c, layer): feature_cache_inputs(encoder, dataset=dataset, images_key=images_key, ids_hash=ids_hash,
                                             canonical_size=canonical_size, condition=c, layer=layer)
            for c in conditions for layer in layers}


def feature_keys(encoder: Encoder, images: pd.DataFrame, *, dataset: str, images_key: str,
                 conditions: Sequence[str], layers: Sequence[str], canonical_size: int | None) -> dict:
    """The cache keys :func:`extract_features` reads and writes, ``{(condition, layer): key}``, computed
    without extracting anything (the run grid derives its row-set keys from them)."""
    ids = images["image_id"].astype(str).tolist()
    inputs = _cache_inputs(encoder, ids, dataset=dataset, images_key=images_key, conditions=conditions,
                           layers=layers, canonical_size=canonical_size)
    return {pair: cache_key(value) for pair, value in inputs.items()}


def cache_key(inputs: dict) -> str:
    """The cache key of one feature array: :func:`crsrepro.core.io.content_key` of its inputs.

    >>> cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})
    True
    """
    return content_key(**inputs)


def _save_array(path: Path, array: np.ndarray) -> None:
    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False))


def _entry_paths(cache_dir: Path, key: str) -> tuple[Path, Path]:
    folder = cache_dir / key[:2]
    return folder / f"{key}.npy", folder / f"{key}.meta.json"


def array_sha256(array: np.ndarray) -> str:
    """SHA-256 of an array's bytes in C order (what an entry's ``.meta.json`` records as ``sha256``).

    >>> array_sha256(np.zeros(2, np.float32)) == array_sha256(np.zeros(2, np.float32))
    True
    """
    return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def read_entry(cache_dir: Path, key: str, n_rows: int) -> np.ndarray | None:
    """The cached ``(n_rows, D)`` array of ``key`` (:func:`feature_keys`) in ``cache_dir``, or None if it is
    absent, incomplete or fails its check (then it is recomputed: a warning names the file). The check recomputes the array's SHA-256 and compares it
    with the sidecar's. An entry written before the check existed (its sidecar has no ``sha256``; it was
    still written atomically, the sidecar last) gets its digest recorded on this first read, so a cache
    built by an earlier version is checked from then on instead of being recomputed."""
    array_path, meta_path = _entry_paths(cache_dir, key)
    if not meta_path.is_file() or not array_path.is_file():
        return None  # absent, or killed before the meta file that marks it complete
    try:
        meta = json.loads(meta_path.read_text())
        array = np.load(array_path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        logger.warning("feature cache entry %s is unreadable (%s); recomputing", array_path, exc)
        return None
    if array.ndim != 2 or array.shape[0] != n_rows:
        logger.warning("feature cache entry %s has shape %s, expected %d rows; recomputing",
                       array_path, array.shape, n_rows)
        return None
    digest = array_sha256(array)
    if "sha256" not in meta:
        logger.info("feature cache entry %s: recording its sha256 (written before entries were checked)", array_path)
        atomic_write(meta_path, json.dumps({**meta, "sha256": digest}, indent=1, sort_keys=True).encode())
    elif digest != meta["sha256"]:
        logger.warning("feature cache entry %s does not match the sha256 of %s; recomputing", array_path,
                       meta_path.name)
        return None
    return array


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("crsrepro", "torch", "torchvision", "timm", "transformers", "open_clip_torch", "numpy"):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    return found


def _write_entry(cache_dir: Path, key: str, inputs: dict, array: np.ndarray, *, extra: dict) -> None:
    array_path, meta_path = _entry_paths(cache_dir, key)
    _save_array(array_path, array)
    meta = {"key": key, "inputs": inputs, "shape": list(array.shape), "dtype": str(array.dtype),
            "sha256": array_sha256(array),
            "versions": _versions(), "git_hash": git_hash(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    atomic_write(meta_path, json.dumps(meta, indent=1, sort_keys=True).encode())


# --------------------------------------------------------------------------------------------------
# Decode once, degrade once at the canonical size, resize for the encoder
# --------------------------------------------------------------------------------------------------

def to_canonical_size(image: Image.Image, canonical_size: int | None) -> Image.Image:
    """Shrink so the short side is at most ``canonical_size`` (bicubic, [ours]); a smaller image, or
    ``None``, keeps the stored size (DESIGN.md section 6: the stored size capped at the panel's largest
    input size).

    >>> to_canonical_size(Image.new("RGB", (40, 20)), 10).size
    (20, 10)
    >>> to_canonical_size(Image.new("RGB", (40, 20)), 30).size
    (40, 20)
    """
    if canonical_size is None or min(image.size) <= canonical_size:
        return image
    w, h = image.size
    scale = canonical_size / min(w, h)
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)


def degraded_views(image: Image.Image, image_id: str, conditions: Sequence[str]) -> list[np.ndarray]:
    """The image under each condition, as ``uint8 [H, W, 3]`` arrays (``clean`` is the image itself)."""
    array = np.asarray(image, dtype=np.uint8)
    if any(c != CLEAN for c in conditions):
        from crsrepro.extract.perturb import apply_condition
    return [array if c == CLEAN else apply_condition(array, c, image_id) for c in conditions]


class ConditionedImages(Dataset):
    """Item ``i``: image ``i`` under every condition, resized for ``spec``: ``uint8 [C, 3, S, S]``.

    The images an encoder sees: decoded, brought to ``canonical_size``, degraded once per condition
    (:func:`degraded_views`) and resized with ``spec``'s preprocessing (:func:`resize_to_input`). The
    degraded images come from ``store`` (a :class:`_DegradedImageStore`) when given, else they are
    decoded and degraded here. :func:`extract_features` batches it through a ``DataLoader``; so does
    LoRA fine-tuning, which trains on the same images (DESIGN.md section 11).
    """

    def __init__(self, image_ids, paths, *, conditions, canonical_size, spec: EncoderSpec, store=None):
        self.image_ids, self.paths = list(image_ids), list(paths)
        self.conditions, self.spec, self.store = tuple(conditions), spec, store
        self.decoded = _DegradedViews(self.image_ids, self.paths, self.conditions, canonical_size)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        if self.store is not None:
            views = [self.store.view(c, i) for c in self.conditions]
        else:
            views = self.decoded[i]
        batch = torch.stack([torch.from_numpy(np.require(v, requirements=["C", "W"])).permute(2, 0, 1) for v in views])
        return resize_to_input(self.spec, batch)


class _DegradedViews(Dataset):
    """Item ``i``: image ``i`` decoded, at the canonical size, under every condition (``uint8 [H, W, 3]``)."""

    def __init__(self, image_ids, paths, conditions, canonical_size):
        self.image_ids, self.paths, self.conditions, self.canonical_size = image_ids, paths, conditions, canonical_size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from crsrepro.data import read_image

        image = to_canonical_size(read_image(self.paths[i]), self.canonical_size)
        return degraded_views(image, self.image_ids[i], self.conditions)


# --------------------------------------------------------------------------------------------------
# The degraded-image cache: degrade once for every encoder
# --------------------------------------------------------------------------------------------------

IMAGE_CACHE_VERSION = 1  # bumped when decoding or the canonical resize changes (perturbations: their own version)
#: [ours] Images per chunk file of the degraded-image cache. Filling one chunk holds
#: ``IMAGE_CHUNK_SIZE x conditions`` images in memory (16 conditions at 96 px: 113 MB; at 320 px: 1.2 GB).
IMAGE_CHUNK_SIZE = 256


def degraded_image_key(*, dataset: str, images_key: str, ids_hash: str, canonical_size: int | None,
                       condition: str) -> str:
    """The key of one degraded-image cache entry: the images, which of them in which order, the size
    they are degraded at, the condition and the version of the perturbation code."""
    from crsrepro.extract.perturb import PERTURBATION_VERSION

    return content_key(kind="degraded_images", dataset=dataset, images_key=images_key, image_ids_hash=ids_hash,
                       canonical_size=canonical_size, condition=condition,
                       perturbation_version=PERTURBATION_VERSION, image_cache_version=IMAGE_CACHE_VERSION)


def _as_is(item):
    """A DataLoader ``collate_fn`` that keeps an item's numpy arrays as they are."""
    return item


class _DegradedImageStore:
    """The degraded images of one image set, per condition, in a content-addressed folder.

    An entry (one condition) is ``<root>/<key[:2]>/<key>/`` with chunks of :data:`IMAGE_CHUNK_SIZE`
    images: ``<chunk>.pixels.npy`` (the uint8 pixels, flat, image after image) and ``<chunk>.shapes.npy``
    (``(n, 2)``: height and width; 3 channels), each written atomically, shapes last, which marks the
    chunk complete. Images keep their own size (the canonical size caps only the short side). Reads
    are memory-mapped, so a data-loader worker touches only the images it needs.
    """

    def __init__(self, root, *, dataset, images_key, ids, canonical_size, conditions):
        self.root, self.n_images = Path(root), len(ids)
        ids_hash = image_ids_hash(ids)
        self.keys = {c: degraded_image_key(dataset=dataset, images_key=images_key, ids_hash=ids_hash,
                                           canonical_size=canonical_size, condition=c) for c in conditions}
        self._open = {}  # condition -> (chunk, pixels memmap, offsets, shapes): the last chunk read, per process

    def _paths(self, condition, chunk):
        key = self.keys[condition]
        folder = self.root / key[:2] / key
        return folder / f"{chunk:06d}.pixels.npy", folder / f"{chunk:06d}.shapes.npy"

    def n_chunks(self) -> int:
        return -(-self.n_images // IMAGE_CHUNK_SIZE)

    def has(self, condition, chunk) -> bool:
        return self._paths(condition, chunk)[1].is_file()

    def write(self, condition, chunk, views) -> None:
        pixels_path, shapes_path = self._paths(condition, chunk)
        shapes = np.array([v.shape[:2] for v in views], dtype=np.int64)
        pixels = np.concatenate([np.ascontiguousarray(v, dtype=np.uint8).ravel() for v in views])
        _save_array(pixels_path, pixels)
        _save_array(shapes_path, shapes)

    def view(self, condition, i) -> np.ndarray:
        """Image ``i`` under ``condition``: a read-only ``uint8 [H, W, 3]`` view of the mapped file."""
        chunk, j = divmod(i, IMAGE_CHUNK_SIZE)
        if self._open.get(condition, (None,))[0] != chunk:
            pixels_path, shapes_path = self._paths(condition, chunk)
            shapes = np.load(shapes_path, allow_pickle=False)
            offsets = np.concatenate([[0], np.cumsum(shapes.prod(axis=1) * 3)])
            self._open[condition] = (chunk, np.load(pixels_path, mmap_mode="r"), offsets, shapes)
        _, pixels, offsets, shapes = self._open[condition]
        return pixels[offsets[j]:offsets[j + 1]].reshape(int(shapes[j, 0]), int(shapes[j, 1]), 3)

    def fill(self, image_ids, paths, conditions, canonical_size, *, num_workers, bar) -> None:
        """Decode and degrade the chunks some condition lacks, once, and store them."""
        todo = [k for k in range(self.n_chunks()) if not all(self.has(c, k) for c in conditions)]
        if not todo:
            return
        missing = [c for c in conditions if not all(self.has(c, k) for k in todo)]
        rows = [i for k in todo for i in range(k * IMAGE_CHUNK_SIZE, min((k + 1) * IMAGE_CHUNK_SIZE, self.n_images))]
        loader = DataLoader(torch.utils.data.Subset(_DegradedViews(image_ids, paths, missing, canonical_size), rows),
                            batch_size=None, collate_fn=_as_is, num_workers=num_workers,
                            prefetch_factor=4 if num_workers > 0 else None)
        buffers, position = {c: [] for c in missing}, 0
        for views in loader:
            for c, view in zip(missing, views):
                buffers[c].append(view)
            position += 1
            chunk = rows[position - 1] // IMAGE_CHUNK_SIZE
            if position == len(rows) or rows[position] // IMAGE_CHUNK_SIZE != chunk:
                for c in missing:
                    if not self.has(c, chunk):
                        self.write(c, chunk, buffers[c])
                buffers = {c: [] for c in missing}
            bar.update(1)


def forward_batch(encoder: Encoder, batch: torch.Tensor, layers: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """``uint8 [B, 3, S, S]`` to ``{layer: float32 [B, D]}``; bf16 autocast and channels-last on a GPU."""
    x = encoder.preprocess(batch)
    if encoder.device.type != "cuda":
        return encoder.forward_features(x, layers=layers)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return encoder.forward_features(x, layers=layers)


# --------------------------------------------------------------------------------------------------
# The extractor
# --------------------------------------------------------------------------------------------------

def extract_features(encoder: Encoder, images: pd.DataFrame, *, dataset: str, images_key: str,
                     conditions: Sequence[str] = (CLEAN,), layers: Sequence[str] = (FINAL,),
                     cache_dir, canonical_size: int | None = None, batch_size: int = 64,
                     num_workers: int = 0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                     image_cache_dir=None, progress: bool = True) -> dict[tuple[str, str], np.ndarray]:
    """Features of ``images`` for every (condition, layer), from the cache where present.

    Parameters
    ----------
    encoder : Encoder
        From :func:`crsrepro.encoders.create_encoder`.
    images : DataFrame
        Columns ``image_id`` and ``path``; the rows of every returned array follow its order.
    dataset, images_key : str
        Name the image set in the cache key: the dataset id and what its images are
        (:func:`crsrepro.data.content.dataset_content_key`).
    conditions : sequence of str
        ``clean`` and/or ``<perturbation>@<severity>`` (DESIGN.md section 6).
    layers : sequence of str
        Layer taps among ``encoder.spec.layer_taps``.
    cache_dir : path
        Root of the content-addressed cache.
    canonical_size : int or None
        The cap on the short side at which images are degraded (larger images are shrunk to it once);
        None keeps the stored size.
    batch_size, num_workers : int
        Forward batch size and DataLoader workers (decode, perturb and resize run in the workers).
    chunk_size : int
        [ours] Images per resumable chunk (see the module docstring).
    image_cache_dir : path or None
        Root of the degraded-image cache (:class:`_DegradedImageStore`) [ours]: the images are decoded
        and degraded once per (image set, condition) and stored there, and every later encoder reads
        them instead of decoding and degrading again. The features are bit-identical with and without
        it. None (the default) decodes and degrades in the data loader, for every encoder.
    progress : bool
        Show a tqdm bar with the throughput in img/s.

    Returns
    -------
    dict
        ``{(condition, layer): float32 array (N, D)}``.
    """
    conditions, layers = tuple(dict.fromkeys(conditions)), tuple(dict.fromkeys(layers))
    missing_cols = {"image_id", "path"} - set(images.columns)
    if missing_cols:
        raise ValueError(f"images needs columns image_id and path; missing {sorted(missing_cols)}")
    if len(images) == 0 or not conditions or not layers:
        raise ValueError("extract_features needs at least one image, one condition and one layer")
    unknown = [name for name in layers if name not in encoder.spec.layer_taps]
    if unknown:
        raise ValueError(f"{encoder.spec.id}: layers {unknown} not among {list(encoder.spec.layer_taps)}")
    if batch_size < 1 or chunk_size < 1 or num_workers < 0:
        raise ValueError("batch_size and chunk_size must be positive and num_workers non-negative")
    cache_dir = Path(cache_dir)
    ids = images["image_id"].astype(str).tolist()
    inputs = _cache_inputs(encoder, ids, dataset=dataset, images_key=images_key, conditions=conditions,
                           layers=layers, canonical_size=canonical_size)
    keys = {pair: cache_key(value) for pair, value in inputs.items()}
    out = {pair: read_entry(cache_dir, key, len(ids)) for pair, key in keys.items()}
    todo = [c for c in conditions if any(out[(c, layer)] is None for layer in layers)]
    if not todo:
        logger.info("%s on %s: all %d feature arrays from the cache", encoder.spec.id, dataset, len(out))
        return out

    # one resumable run over the conditions still missing; its chunks are named by all their keys
    run_id = cache_key({"keys": [keys[(c, layer)] for c in todo for layer in layers]})
    partial_dir = cache_dir / "partial" / run_id
    paths = images["path"].astype(str).tolist()
    started = time.time()
    store = None
    if image_cache_dir is not None:
        store = _DegradedImageStore(image_cache_dir, dataset=dataset, images_key=images_key, ids=ids,
                                    canonical_size=canonical_size, conditions=todo)
        with tqdm(total=len(ids), unit="img", disable=not progress, desc=f"degrade {dataset} x{len(todo)} cond") as bar:
            store.fill(ids, paths, todo, canonical_size, num_workers=num_workers, bar=bar)
    dataset_ = ConditionedImages(ids, paths, conditions=todo, canonical_size=canonical_size, spec=encoder.spec,
                                  store=store)
    chunks = []
    with tqdm(total=len(ids), unit="img", disable=not progress,
              desc=f"{encoder.spec.id} {dataset} x{len(todo)} cond") as bar:
        for chunk_index, start in enumerate(range(0, len(ids), chunk_size)):
            rows = range(start, min(start + chunk_size, len(ids)))
            chunk_path = partial_dir / f"{chunk_index:06d}.npz"
            if chunk_path.is_file():  # finished by an earlier, interrupted run
                with np.load(chunk_path, allow_pickle=False) as saved:
                    chunk = {name: saved[name] for name in saved.files}
                bar.update(len(rows))
            else:
                chunk = _extract_chunk(encoder, dataset_, rows, todo, layers, batch_size, num_workers, bar)
                atomic_write(chunk_path, lambda f: np.savez(f, **chunk))
            chunks.append(chunk)
    elapsed = time.time() - started
    for c in todo:
        for layer in layers:
            array = np.concatenate([chunk[f"{c}|{layer}"] for chunk in chunks]).astype(np.float32)
            _write_entry(cache_dir, keys[(c, layer)], inputs[(c, layer)], array,
                         extra={"n_images": len(ids), "extraction_seconds": round(elapsed, 3),
                                "device": str(encoder.device)})
            out[(c, layer)] = array
    shutil.rmtree(partial_dir, ignore_errors=True)
    logger.info("%s on %s: %d images x %d conditions in %.1f s", encoder.spec.id, dataset, len(ids),
                len(todo), elapsed)
    return out


def _extract_chunk(encoder, dataset_, rows, conditions, layers, batch_size, num_workers, bar) -> dict:
    """Features of ``rows`` of ``dataset_`` as ``{"condition|layer": (n, D) float32}``."""
    on_gpu = encoder.device.type == "cuda"
    loader = DataLoader(torch.utils.data.Subset(dataset_, list(rows)), batch_size=batch_size,
                        num_workers=num_workers, pin_memory=on_gpu,
                        prefetch_factor=4 if num_workers > 0 else None,
                        persistent_workers=False)
    parts = {f"{c}|{layer}": [] for c in conditions for layer in layers}
    for batch in loader:  # uint8 [B, C, 3, S, S]
        for j, c in enumerate(conditions):
            feats = forward_batch(encoder, batch[:, j], layers)
            for layer in layers:
                parts[f"{c}|{layer}"].append(feats[layer].float().cpu().numpy())
        bar.update(len(batch))
    return {name: np.concatenate(arrays).astype(np.float32) for name, arrays in parts.items()}
