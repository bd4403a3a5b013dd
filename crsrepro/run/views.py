"""Prepared datasets: what every unit of the run grid reads (DESIGN.md sections 3 and 7).

A :class:`DatasetView` is one training dataset as the grid sees it: the non-test pool, the fixed test
split, each seed's own train / val rows into the pool, and its transfer sets (a probe trained on
CheXpert is scored, without retraining, on MIMIC-CXR) with the source labels each is scored on.
:func:`prepare_view` builds one; :func:`view` keeps the views a process has built, so the tasks of a
worker prepare a dataset once. :func:`conditions_for` lists the conditions a probe trained on a
dataset is scored under.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import Profile

log = logging.getLogger(__name__)


def conditions_for(profile: Profile, dataset: str) -> list[str]:
    """The conditions a probe trained on ``dataset`` is scored under (clean, perturbations, the dataset's
    noise model where the profile's ``noise_model`` names one, transfers)."""
    return profile.conditions(dataset) + list(profile.transfer_targets(dataset))


@dataclass
class Split:
    """The images (``image_id``, ``path``) and label matrix of one image set."""

    images: pd.DataFrame
    labels: np.ndarray

    def take(self, rows: np.ndarray) -> "Split":
        return Split(self.images.iloc[rows].reset_index(drop=True), self.labels[rows])


@dataclass
class Transfer:
    """A transfer set: its images and the source probe's columns that its labels are scored on."""

    name: str
    images_key: str
    split: Split  # every image of the transfer set (no probe is trained on it), its shared labels
    columns: np.ndarray  # indices into the source dataset's labels, one per transfer label column


@dataclass
class DatasetView:
    """A prepared dataset: the non-test pool, the fixed test split, each seed's train / val rows into
    the pool, and its transfer sets."""

    name: str
    task: str
    label_names: list[str]
    images_key: str
    pool: Split
    test: Split
    seed_rows: dict[int, tuple[np.ndarray, np.ndarray]]  # seed -> (train rows, val rows) into the pool
    seed_hash: dict[int, str]
    transfers: list[Transfer]


def _images_and_labels(table: pd.DataFrame) -> Split:
    from crsrepro.data import label_matrix

    return Split(table[["image_id", "path"]].reset_index(drop=True), label_matrix(table))


def _transfer_labels(source: list[str], dataset: str, target: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The transfer set's labels that the source probe can be scored on, and where each sits among the
    source's labels: every label when the two share them (CheXpert -> MIMIC-CXR), else the shared
    labels of a documented label map (CheXpert -> NIH ChestX-ray14, :mod:`crsrepro.data.label_maps`)."""
    from crsrepro.data import label_matrix
    from crsrepro.data.label_maps import CHEXPERT_TO_NIH

    names, name = list(target.attrs["label_names"]), target.attrs["dataset"]
    if names == source:
        return label_matrix(target), np.arange(len(source))
    if (dataset, name) == ("chexpert", "nih_cxr14"):
        shared = [(k, v) for k, v in CHEXPERT_TO_NIH.items() if k in source]  # source labels left out stay out
        return (target[[v for _, v in shared]].to_numpy(float), np.array([source.index(k) for k, _ in shared]))
    raise CrsreproError(f"{name}: its labels {names} are not {dataset}'s {source} and no label map joins them; "
                        f"a probe cannot be transferred")


_SAID: set[str] = set()  # the warnings this process has logged (said once, not once per task)


def learnable_labels(table: pd.DataFrame, seeds) -> pd.DataFrame:
    """A multi-label dataset without the labels that lack a positive or a negative in the test split or
    in some seed's train or val split: no probe could learn them, pick C on them or be scored on them
    [ours]. What is left out is logged and kept in ``attrs["labels_left_out"]`` (on a partial download
    of NIH ChestX-ray14, Hernia lies in two patients)."""
    from crsrepro.data.manifests import seed_column

    if table.attrs["task"] != "multilabel":
        return table
    names = list(table.attrs["label_names"])
    parts = [table["split"] == "test"] + [table[seed_column(s)] == split for s in seeds for split in ("train", "val")]
    values = table[names]
    both = np.logical_and.reduce([((values[part] == 1).any() & (values[part] == 0).any()).to_numpy() for part in parts])
    kept = [name for name, ok in zip(names, both) if ok]
    if len(kept) < len(names):
        left = [name for name in names if name not in kept]
        message = (f"{table.attrs['dataset']}: left out {len(left)} of {len(names)} labels that lack a positive "
                   f"or a negative in some split: {', '.join(left)}")
        if message not in _SAID:  # once per process: every task that prepares the dataset finds the same
            _SAID.add(message)
            log.warning(message)
        table = table.copy()
        table.attrs = {**table.attrs, "label_names": kept, "labels_left_out": left}
    return table


def prepare_view(profile: Profile, dataset: str, manifest_dir: Path | None = None, progress: bool = False) -> DatasetView:
    """Prepare ``dataset`` for the grid: its learnable labels, pool and test split, each seed's train /
    val rows and hash, and its transfer sets.

    Raises
    ------
    CrsreproError
        The test split, the pool or a seed's train or val split is empty.
    """
    from crsrepro.data import prepare_dataset
    from crsrepro.data.content import dataset_content_key
    from crsrepro.data.manifests import seed_column, seed_split_hash

    table = learnable_labels(prepare_dataset(profile, dataset, manifest_dir=manifest_dir, progress=progress),
                             profile.seeds)
    attrs = table.attrs
    pool_table = table[table["split"] == "pool"].reset_index(drop=True)
    test_table = table[table["split"] == "test"].reset_index(drop=True)
    for name, part in (("test", test_table), ("train/val pool", pool_table)):
        if part.empty:
            raise CrsreproError(f"{dataset}: the {name} split is empty (profile {profile.name!r})")
    pool_table.attrs = test_table.attrs = attrs
    seed_rows, seed_hash = {}, {}
    for seed in profile.seeds:
        column = pool_table[seed_column(seed)].to_numpy()
        seed_rows[seed] = (np.flatnonzero(column == "train"), np.flatnonzero(column == "val"))
        if not all(len(rows) for rows in seed_rows[seed]):
            raise CrsreproError(f"{dataset}: seed {seed}'s train or val split is empty (profile {profile.name!r})")
        seed_hash[seed] = seed_split_hash(table, seed)
    transfers = []
    for target in profile.transfer_targets(dataset):
        ttable = prepare_dataset(profile, target, manifest_dir=manifest_dir, progress=progress)
        labels, columns = _transfer_labels(list(attrs["label_names"]), dataset, ttable)
        split = Split(ttable[["image_id", "path"]].reset_index(drop=True), labels)
        transfers.append(Transfer(target, dataset_content_key(profile, target, ttable), split, columns))
    return DatasetView(dataset, attrs["task"], list(attrs["label_names"]),
                       dataset_content_key(profile, dataset, table), _images_and_labels(pool_table),
                       _images_and_labels(test_table), seed_rows, seed_hash, transfers)


_VIEWS: dict = {}  # per process: the datasets prepared for the tasks it ran, by what identifies them


def view(profile: Profile, dataset: str, manifest_dir: Path | None = None, images_key: str | None = None) -> DatasetView:
    """:func:`prepare_view`, once per process and dataset; ``images_key``: the images the caller expects.

    Raises
    ------
    CrsreproError
        This process sees other images than ``images_key`` (a worker that reads another data root than
        the process that planned the run).
    """
    name = (profile.fingerprint(), dataset, str(manifest_dir), images_key)
    if name not in _VIEWS:
        prepared = prepare_view(profile, dataset, manifest_dir)
        if images_key is not None and prepared.images_key != images_key:
            raise CrsreproError(f"{dataset}: this worker sees other images than the process that planned the run "
                                f"(images key {prepared.images_key[:12]}, not {images_key[:12]}); every worker must "
                                f"read the same data root, feature cache and output folder")
        while len(_VIEWS) >= 8:  # [ours] a bound for long-lived workers: drop the oldest
            _VIEWS.pop(next(iter(_VIEWS)))
        _VIEWS[name] = _VIEWS[(profile.fingerprint(), dataset, str(manifest_dir), prepared.images_key)] = prepared
    return _VIEWS[name]


def clear_view_cache() -> None:
    """Forget the views this process prepared (the data may have changed since)."""
    _VIEWS.clear()


__all__ = ["DatasetView", "Split", "Transfer", "clear_view_cache", "conditions_for", "learnable_labels",
           "prepare_view", "view"]
