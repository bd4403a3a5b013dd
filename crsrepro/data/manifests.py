"""Frozen splits and label subsets (DESIGN.md section 3).

- :func:`make_splits` draws the train / val / test split [ours: 70 / 10 / 20], grouped by ``group``
  (patient, or lesion for ISIC) so that no group crosses splits, and stratified by iterative
  stratification over the groups' label profiles (Sechidis et al., 2011). It is a deterministic
  function of the sorted group ids, their labels and the seed, so the same data gives the same split
  on any machine.
- :func:`draw_manifest` fixes the test split (from ``data.split_seed``) and draws one grouped,
  stratified train / val partition of the rest per run seed (DESIGN.md section 3: a seed varies the
  training sample, the C selection and the calibration subset, never the test set).
- :func:`load_or_create_manifest` writes them once as ``<manifest_dir>/<dataset>[_<profile>].csv``
  (image_id, group, split, seed_<s>...) with a ``.sha256`` beside it, and on every later use checks the
  hash (tampering) and that the manifest lists exactly the images of the data (staleness).
  :func:`seed_split_hash` is the content key of one seed's split, which the run grid's keys carry.
- :func:`label_subsets` draws the nested 1 / 5 / 10 / 25 % label subsets of the train split, with at
  least one positive per class or label; they depend only on the labels and the seed, so every encoder
  gets the same subsets.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core.errors import DataError
from crsrepro.core.io import atomic_write, content_key, sha256_file

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)  # [ours] DESIGN.md section 3
MANIFEST_COLUMNS = ["image_id", "group", "split"]  # then one seed_<s> column per run seed


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


def make_splits(df: pd.DataFrame, *, seed, fractions=DEFAULT_FRACTIONS, task: str, label_names,
                names=SPLIT_NAMES) -> pd.Series:
    """Assign every row to one of ``names`` (``train``, ``val``, ``test``), grouped by ``df["group"]`` and stratified.

    Groups are visited in a seeded random order of their sorted ids, those holding the rarest labels
    first. Each group goes to the split that still most wants its rarest label (Sechidis et al.'s
    iterative stratification), ties broken by the split that most wants images. A split that has no
    example of that label yet is served first [ours], so a label with >= 3 groups reaches every split.

    Parameters
    ----------
    df : pandas.DataFrame
        A loaded dataset: ``group`` and the label column(s).
    seed : int or sequence of int
        The split seed (a profile's ``data.split_seed``; any ``numpy.random.default_rng`` seed).
    fractions : tuple of floats
        The shares of the images, one per name [ours: 0.7, 0.1, 0.2 for train, val, test].
    task, label_names
        As in ``df.attrs``.
    names : tuple of str
        The split names, one per fraction.

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
    if fractions.shape != (len(names),) or (fractions <= 0).any() or not math.isclose(fractions.sum(), 1.0):
        raise ValueError(f"fractions must be {len(names)} positive shares of 1 ({', '.join(names)}), "
                         f"got {fractions.tolist()}")
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
            candidates = np.flatnonzero(first) if first.any() else np.arange(len(names))
            keys = [(wanted[s, label], wanted_size[s], -s) for s in candidates]
        else:
            candidates = np.arange(len(names))
            keys = [(wanted_size[s], -s) for s in candidates]
        s = candidates[max(range(len(candidates)), key=keys.__getitem__)]
        assignment[g] = s
        wanted[s] -= profile[g]
        wanted_size[s] -= size[g]
        seen[s] |= profile[g] > 0
    return pd.Series(np.asarray(names)[assignment[codes]], index=df.index, name="split")


def manifest_hash(path) -> str:
    """The SHA-256 (hex) of a manifest file's bytes."""
    return sha256_file(path)


def manifest_path(manifest_dir, dataset: str, manifests_name: str) -> Path:
    """``<manifest_dir>/<dataset>_<manifests_name>.csv``, or ``<manifest_dir>/<dataset>.csv`` when the name is
    empty (the ``paper`` profile's); the name is a profile's ``manifests.name`` (default: the profile's name).

    >>> manifest_path("m", "isic2019", "demo").as_posix(), manifest_path("m", "isic2019", "").as_posix()
    ('m/isic2019_demo.csv', 'm/isic2019.csv')
    """
    suffix = f"_{manifests_name}" if manifests_name else ""
    return Path(manifest_dir) / f"{dataset}{suffix}.csv"


def seed_column(seed: int) -> str:
    """The manifest column holding run seed ``seed``'s train / val / test assignment."""
    return f"seed_{seed}"


def seed_split_hash(manifest: pd.DataFrame, seed: int) -> str:
    """The content key of one run seed's split (image ids and their train / val / test assignment)."""
    return content_key(ids=manifest["image_id"].tolist(), split=manifest[seed_column(seed)].tolist())


def draw_manifest(df: pd.DataFrame, *, split_seed: int, run_seeds, fractions=DEFAULT_FRACTIONS) -> pd.DataFrame:
    """The fixed test split and one train / val partition of the rest per run seed (DESIGN.md section 3).

    The test split (``fractions[2]``, 20 % [ours]) is drawn once from ``split_seed``: every perturbation
    and the transfer are measured on it. For each run seed, the non-test pool is split into train and val
    (``fractions[0]`` / ``fractions[1]`` of the whole, 70 / 10 [ours], i.e. 7/8 and 1/8 of the pool),
    grouped and stratified like the test split, from the seed ``(split_seed, run seed)``. The same
    partition goes to every encoder, so a seed varies the training sample, the C selection and the
    calibration subset. ``fractions``: a profile's ``data.split_fractions``.

    Returns
    -------
    DataFrame
        ``image_id, group, split`` (``test`` or ``pool``) and one column ``seed_<s>`` per run seed
        (``train``, ``val`` or ``test``), sorted by image id.
    """
    task, label_names = df.attrs["task"], df.attrs["label_names"]
    fixed = make_splits(df, seed=split_seed, fractions=fractions, task=task, label_names=label_names)
    manifest = pd.DataFrame({"image_id": df["image_id"].astype(str), "group": df["group"].astype(str),
                             "split": np.where(fixed == "test", "test", "pool")}, index=df.index)
    pool = df[fixed != "test"]
    train_share = fractions[0] / (fractions[0] + fractions[1])
    for seed in run_seeds:
        column = pd.Series("test", index=df.index)
        column[pool.index] = make_splits(pool, seed=[split_seed, int(seed)], fractions=(train_share, 1 - train_share),
                                         task=task, label_names=label_names, names=("train", "val"))
        manifest[seed_column(seed)] = column
    return manifest.sort_values("image_id", kind="stable").reset_index(drop=True)


def _check_manifest(path: Path, sha_path: Path, df: pd.DataFrame, run_seeds) -> pd.DataFrame:
    rebuild = f"delete {path} and {sha_path.name} to rebuild it (this changes the split)"
    if not sha_path.is_file():
        raise DataError(f"{path}: its checksum file {sha_path.name} is missing; restore it, or {rebuild}")
    recorded = sha_path.read_text().split()[0] if sha_path.read_text().strip() else ""
    actual = manifest_hash(path)
    if recorded != actual:
        raise DataError(f"{path}: SHA-256 {actual[:12]}... does not match {sha_path.name} ({recorded[:12]}...): "
                        f"the manifest was edited; restore it, or {rebuild}")
    manifest = pd.read_csv(path, dtype=str, keep_default_na=False)
    expected = MANIFEST_COLUMNS + [seed_column(s) for s in run_seeds]
    if list(manifest.columns[:3]) != MANIFEST_COLUMNS or not set(expected) <= set(manifest.columns):
        raise DataError(f"{path}: columns {list(manifest.columns)} (expected {expected}, one seed_<s> column per "
                        f"run seed); {rebuild}")
    for column, allowed in [("split", ("test", "pool"))] + [(seed_column(s), SPLIT_NAMES) for s in run_seeds]:
        bad = ~manifest[column].isin(allowed)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(f"{path}: line {i + 2}: column {column} is {manifest[column].iloc[i]!r}, "
                            f"not one of {allowed}")
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
    return manifest[expected]


def load_or_create_manifest(df: pd.DataFrame, *, dataset: str, manifests_name: str, manifest_dir, seed: int,
                            run_seeds=(0,), fractions=DEFAULT_FRACTIONS) -> pd.DataFrame:
    """The frozen splits of ``df``: read and verified if the manifest exists, else drawn and written.

    Parameters
    ----------
    df : pandas.DataFrame
        A table from :func:`crsrepro.data.load_dataset` (uses ``image_id``, ``group``, the labels and
        ``attrs``).
    dataset, manifests_name : str
        Name the file (:func:`manifest_path`): ``<dataset>_<manifests_name>.csv``, or ``<dataset>.csv`` when
        ``manifests_name`` (a profile's ``manifests.name``) is empty.
    manifest_dir : path
        Where manifests live (:func:`crsrepro.core.io.manifest_dir`).
    seed : int
        The split seed of the fixed test split, used only when the manifest is created: an existing
        manifest is frozen.
    run_seeds : sequence of int
        The run seeds; each has its own train / val partition (:func:`draw_manifest`).
    fractions : (train, val, test) shares
        As in :func:`draw_manifest`, used only when the manifest is created.

    Returns
    -------
    pandas.DataFrame
        ``image_id, group, split`` and ``seed_<s>`` per run seed; sorted by image_id.

    Raises
    ------
    DataError
        The manifest's SHA-256 does not match its ``.sha256`` (edited), it does not list exactly the
        images of ``df`` in the same groups (stale), or it lacks a run seed. The message says to delete
        it to rebuild it.
    """
    path = manifest_path(manifest_dir, dataset, manifests_name)
    sha_path = path.with_name(path.name + ".sha256")
    if path.exists():
        manifest = _check_manifest(path, sha_path, df, run_seeds)
        logger.info("%s: using the frozen manifest %s (sha256 %s)", dataset, path, manifest_hash(path)[:12])
        return manifest
    manifest = draw_manifest(df, split_seed=seed, run_seeds=run_seeds, fractions=fractions)
    atomic_write(path, manifest.to_csv(index=False, lineterminator="\n").encode())
    atomic_write(sha_path, f"{manifest_hash(path)}  {path.name}\n".encode())
    logger.info("%s: wrote manifest %s (test %d of %d images, %d run seeds)", dataset, path,
                int((manifest["split"] == "test").sum()), len(manifest), len(run_seeds))
    return manifest


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
