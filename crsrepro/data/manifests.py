"""Frozen splits and label subsets (DESIGN.md section 3).

- :func:`make_splits` draws the train / val / test split [ours: 70 / 10 / 20], grouped by ``group``
  (patient, or lesion for ISIC) so that no group crosses splits, and stratified by iterative
  stratification over the groups' label profiles (Sechidis et al., 2011). It is a deterministic
  function of the sorted group ids, their labels and the seed, so the same data gives the same split
  on any machine.
- :func:`load_or_create_manifest` writes the split once as ``<manifest_dir>/<dataset>[_<profile>].csv``
  (image_id, split, group) with a ``.sha256`` beside it, and on every later use checks the hash
  (tampering) and that the manifest lists exactly the images of the data (staleness).
- :func:`label_subsets` draws the nested 1 / 5 / 10 / 25 % label subsets of the train split, with at
  least one positive per class or label; they depend only on the labels and the seed, so every encoder
  gets the same subsets.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.errors import DataError

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)  # [ours] DESIGN.md section 3
MANIFEST_COLUMNS = ["image_id", "split", "group"]


def _positives(labels: np.ndarray, task: str, n_labels: int) -> np.ndarray:
    """A boolean (n, n_labels) matrix: one-hot classes (multiclass) or label == 1 (multilabel; NaN is False)."""
    labels = np.asarray(labels)
    if task == "multiclass":
        if labels.ndim != 1 or labels.min(initial=0) < 0 or labels.max(initial=0) >= n_labels:
            raise ValueError(f"multiclass labels must be a vector of ints in 0..{n_labels - 1}")
        return np.eye(n_labels, dtype=bool)[labels.astype(int)]
    if task == "multilabel":
        if labels.ndim != 2 or labels.shape[1] != n_labels:
            raise ValueError(f"multilabel labels must be an (n, {n_labels}) matrix, got shape {labels.shape}")
        return labels == 1
    raise ValueError(f"task must be 'multiclass' or 'multilabel', got {task!r}")


def _frame_labels(df: pd.DataFrame, task: str, label_names) -> np.ndarray:
    if task == "multiclass":
        return df["label"].to_numpy(dtype=int)
    return df[list(label_names)].to_numpy(dtype=float)


def make_splits(df: pd.DataFrame, *, seed: int, fractions=DEFAULT_FRACTIONS, task: str, label_names) -> pd.Series:
    """Assign every row to ``train``, ``val`` or ``test``, grouped by ``df["group"]`` and stratified.

    Groups are visited in a seeded random order of their sorted ids, those holding the rarest labels
    first. Each group goes to the split that still most wants its rarest label (Sechidis et al.'s
    iterative stratification), ties broken by the split that most wants images. A split that has no
    example of that label yet is served first [ours], so a label with >= 3 groups reaches every split.

    Parameters
    ----------
    df : pandas.DataFrame
        A loaded dataset: ``group`` and the label column(s).
    seed : int
        The split seed (a profile's ``data.split_seed``).
    fractions : tuple of 3 floats
        Train, val and test shares of the images [ours: 0.7, 0.1, 0.2].
    task, label_names
        As in ``df.attrs``.

    Returns
    -------
    pandas.Series
        ``"train"`` / ``"val"`` / ``"test"``, indexed like ``df``.

    Examples
    --------
    >>> df = pd.DataFrame({"group": np.arange(200) // 2, "label": [0, 0, 1, 1, 0, 0, 0, 0] * 25})
    >>> split = make_splits(df, seed=0, task="multiclass", label_names=["x", "y"])
    >>> pd.crosstab(split, df["label"]).loc[["train", "val", "test"]].to_numpy().tolist()
    [[104, 36], [16, 4], [30, 10]]
    >>> bool(split.groupby(df["group"]).nunique().eq(1).all())
    True
    """
    fractions = np.asarray(fractions, dtype=float)
    if fractions.shape != (3,) or (fractions <= 0).any() or not math.isclose(fractions.sum(), 1.0):
        raise ValueError(f"fractions must be three positive shares of 1 (train, val, test), got {fractions.tolist()}")
    if df.empty:
        raise ValueError("cannot split an empty table")
    positive = _positives(_frame_labels(df, task, label_names), task, len(label_names))

    groups, codes = np.unique(df["group"].astype(str).to_numpy(), return_inverse=True)
    profile = np.zeros((len(groups), positive.shape[1]))
    np.add.at(profile, codes, positive)
    size = np.bincount(codes, minlength=len(groups)).astype(float)

    label_total = profile.sum(axis=0)
    rarity = np.argsort(np.argsort(np.where(label_total > 0, label_total, np.inf), kind="stable"), kind="stable")
    masked_rarity = np.where(profile > 0, rarity[None, :], profile.shape[1])
    rarest = masked_rarity.argmin(axis=1)
    has_label = masked_rarity.min(axis=1) < profile.shape[1]

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(groups))
    order = order[np.argsort(np.where(has_label, rarity[rarest], profile.shape[1])[order], kind="stable")]

    wanted = fractions[:, None] * label_total[None, :]  # remaining wish per split and label
    wanted_size = fractions * size.sum()
    seen = np.zeros_like(wanted, dtype=bool)
    assignment = np.empty(len(groups), dtype=int)
    for g in order:
        if has_label[g]:
            label = rarest[g]
            first = ~seen[:, label]
            candidates = np.flatnonzero(first) if first.any() else np.arange(3)
            keys = [(wanted[s, label], wanted_size[s], -s) for s in candidates]
        else:
            candidates = np.arange(3)
            keys = [(wanted_size[s], -s) for s in candidates]
        s = candidates[max(range(len(candidates)), key=keys.__getitem__)]
        assignment[g] = s
        wanted[s] -= profile[g]
        wanted_size[s] -= size[g]
        seen[s] |= profile[g] > 0
    return pd.Series(np.asarray(SPLIT_NAMES)[assignment[codes]], index=df.index, name="split")


def manifest_hash(path) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_path(manifest_dir, dataset: str, profile_name: str) -> Path:
    """``<manifest_dir>/<dataset>.csv`` for the paper profile, else ``<manifest_dir>/<dataset>_<profile>.csv``."""
    suffix = "" if profile_name == "paper" else f"_{profile_name}"
    return Path(manifest_dir) / f"{dataset}{suffix}.csv"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _check_manifest(path: Path, sha_path: Path, df: pd.DataFrame) -> pd.DataFrame:
    rebuild = f"delete {path} and {sha_path.name} to rebuild it (this changes the split)"
    if not sha_path.is_file():
        raise DataError(f"{path}: its checksum file {sha_path.name} is missing; restore it, or {rebuild}")
    recorded = sha_path.read_text().split()[0] if sha_path.read_text().strip() else ""
    actual = manifest_hash(path)
    if recorded != actual:
        raise DataError(f"{path}: SHA-256 {actual[:12]}... does not match {sha_path.name} ({recorded[:12]}...): "
                        f"the manifest was edited; restore it, or {rebuild}")
    manifest = pd.read_csv(path, dtype=str, keep_default_na=False)
    if list(manifest.columns) != MANIFEST_COLUMNS:
        raise DataError(f"{path}: columns {list(manifest.columns)} (expected {MANIFEST_COLUMNS}); {rebuild}")
    bad = ~manifest["split"].isin(SPLIT_NAMES)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{path}: line {i + 2}: split {manifest['split'].iloc[i]!r} is not one of {SPLIT_NAMES}")
    data_ids, manifest_ids = set(df["image_id"]), set(manifest["image_id"])
    if data_ids != manifest_ids:
        new, gone = sorted(data_ids - manifest_ids), sorted(manifest_ids - data_ids)
        raise DataError(f"{path}: stale manifest: {len(new)} images of the data are not in it (e.g. {new[:3]}) and "
                        f"{len(gone)} of its images are not in the data (e.g. {gone[:3]}); {rebuild}")
    group_of = dict(zip(df["image_id"], df["group"].astype(str)))
    moved = manifest["group"].to_numpy() != manifest["image_id"].map(group_of).to_numpy()
    if moved.any():
        i = int(np.flatnonzero(moved)[0])
        raise DataError(f"{path}: stale manifest: line {i + 2}: image {manifest['image_id'].iloc[i]} is in group "
                        f"{manifest['group'].iloc[i]} there but in {group_of[manifest['image_id'].iloc[i]]} in the data; "
                        f"{rebuild}")
    return manifest


def load_or_create_manifest(df: pd.DataFrame, *, dataset: str, profile_name: str, manifest_dir, seed: int) -> pd.DataFrame:
    """The frozen split of ``df``: read and verified if it exists, else drawn and written.

    Parameters
    ----------
    df : pandas.DataFrame
        A table from :func:`crsrepro.data.load_dataset` (uses ``image_id``, ``group``, the labels and
        ``attrs``).
    dataset, profile_name : str
        Name the file ``<dataset>[_<profile>].csv`` (no suffix for the ``paper`` profile).
    manifest_dir : path
        Where manifests live (``data_manifests/`` by default in :func:`crsrepro.data.prepare_dataset`).
    seed : int
        The split seed, used only when the manifest is created: an existing manifest is frozen.

    Returns
    -------
    pandas.DataFrame
        image_id, split, group; sorted by image_id.

    Raises
    ------
    DataError
        The manifest's SHA-256 does not match its ``.sha256`` (edited), or it does not list exactly
        the images of ``df`` in the same groups (stale). The message says to delete it to rebuild it.
    """
    path = manifest_path(manifest_dir, dataset, profile_name)
    sha_path = path.with_name(path.name + ".sha256")
    if path.exists():
        manifest = _check_manifest(path, sha_path, df)
        logger.info("%s: using the frozen manifest %s (sha256 %s)", dataset, path, manifest_hash(path)[:12])
        return manifest
    split = make_splits(df, seed=seed, task=df.attrs["task"], label_names=df.attrs["label_names"])
    manifest = pd.DataFrame({"image_id": df["image_id"].astype(str), "split": split,
                             "group": df["group"].astype(str)}).sort_values("image_id", kind="stable")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, manifest.to_csv(index=False, lineterminator="\n").encode())
    _write_atomic(sha_path, f"{manifest_hash(path)}  {path.name}\n".encode())
    logger.info("%s: wrote manifest %s (%s)", dataset, path, manifest["split"].value_counts().to_dict())
    return manifest.reset_index(drop=True)


def label_subsets(y, *, fractions, seed: int, task: str) -> dict[float, np.ndarray]:
    """Nested, stratified label subsets of the train split with at least one positive per class or label.

    One seeded order of the train rows is drawn and every fraction takes a prefix of it, so the
    subsets are nested (1 % is inside 5 % ...). The order starts with one positive of each class or
    label (rarest first, fewest rows), then interleaves the strata (each row's rarest positive label)
    so that every prefix keeps the class proportions.

    Parameters
    ----------
    y : array
        Train labels: ints (multiclass) or an (n, L) float matrix with NaN for masked (multilabel).
    fractions : iterable of float
        Fractions in (0, 1]; 1.0 gives every row. A fraction f keeps max(ceil(f n), #classes) rows.
    seed : int or numpy.random.Generator
        The run seed.
    task : {"multiclass", "multilabel"}

    Returns
    -------
    dict
        fraction -> sorted row indices into ``y``.

    Raises
    ------
    DataError
        A class or label has no positive row (it could not be learned at any fraction).

    Examples
    --------
    >>> y = np.array([0] * 90 + [1] * 9 + [2])
    >>> subsets = label_subsets(y, fractions=[0.01, 0.1, 1.0], seed=0, task="multiclass")
    >>> [len(subsets[f]) for f in (0.01, 0.1, 1.0)], y[subsets[0.01]].tolist()
    ([3, 10, 100], [0, 1, 2])
    >>> bool(np.isin(subsets[0.01], subsets[0.1]).all())
    True
    """
    y = np.asarray(y)
    n_labels = int(y.max()) + 1 if task == "multiclass" and y.size else (y.shape[1] if y.ndim == 2 else 0)
    positive = _positives(y, task, n_labels)
    counts = positive.sum(axis=0)
    if (counts == 0).any():
        raise DataError(f"the train split has no positive example of label index {int(np.flatnonzero(counts == 0)[0])}; "
                        f"label subsets need at least one per class or label")
    fractions = sorted({float(f) for f in fractions})
    if not fractions or fractions[0] <= 0 or fractions[-1] > 1:
        raise ValueError(f"fractions must lie in (0, 1], got {fractions}")
    rng = np.random.default_rng(seed)
    n = len(y)

    rarity = np.argsort(np.argsort(counts, kind="stable"), kind="stable")
    masked = np.where(positive, rarity[None, :], n_labels)
    stratum = np.where(masked.min(axis=1) < n_labels, masked.argmin(axis=1), n_labels)
    shuffled = rng.permutation(n)
    rank = np.empty(n)
    for s in np.unique(stratum):
        members = shuffled[stratum[shuffled] == s]
        rank[members] = (np.arange(len(members)) + rng.random(len(members))) / len(members)
    order = np.argsort(rank, kind="stable")

    seeds: list[int] = []
    for label in np.argsort(counts, kind="stable"):
        if not positive[seeds, label].any():
            seeds.append(int(order[np.flatnonzero(positive[order, label])[0]]))
    order = np.concatenate([seeds, order[~np.isin(order, seeds)]]).astype(int)
    return {f: np.arange(n) if f == 1.0 else np.sort(order[:max(math.ceil(f * n), len(seeds))]) for f in fractions}
