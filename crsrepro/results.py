"""The tidy results store (DESIGN.md section 7, "Results").

Every unit of work of the run grid writes one *row-set*: a small parquet file under
``<output_dir>/runs/`` named by a key derived from everything that changes its numbers: the keys of the
feature arrays it reads (which cover the encoder, its weights, the preprocessing, the images and the
condition), the seed's split, the label subsets it fits on (their content), the labels, the probe's
parameters and :data:`CACHE_VERSION`; nothing that cannot change a number (such as
``probe.num_threads``). A unit whose file exists is skipped, so an interrupted run resumes where it
stopped. :meth:`ResultStore.merge` then concatenates the row-sets into one tidy table,
``<output_dir>/results.parquet``, with one row per run and metric:

============== ==============================================================================
column         meaning
============== ==============================================================================
encoder        encoder id (``demo.effnet_lite0``, ``general.dinov2`` ...)
family         the encoder's family (general / medical / specialist)
dataset        the training dataset (``isic2019``, ``aptos2019``, ``chexpert``)
seed           the seed of the label subsets and of the probe
label_fraction fraction of the train split used to fit the probe (0.01 ... 1.0)
condition      ``clean``, ``<perturbation>@<severity>``, or ``mimic_cxr`` (transfer, no retraining)
probe          ``linear`` (primary), ``mlp`` or ``knn`` (controls)
layer          ``final`` or ``depth25`` / ``depth50`` / ``depth75``
regime         ``frozen`` (LoRA rows use ``lora``)
recalibrator   ``none``, ``temperature``, ``vector``, ``isotonic`` or ``dirichlet``
metric         ``auroc``, ``ece``, ``classwise_ece``, ``skipped_labels``, ``n_test``
value          the metric's value (float)
probe_C        the C chosen on the val split (NaN for probes without C)
converged      whether the probe's optimiser converged
hit_time_cap   whether the fit hit the profile's compute-time cap
fit_seconds    wall time of the probe fit (shared by the fractions fitted together)
rowset         the key of the row-set the row came from (and of its per-case probabilities)
============== ==============================================================================

Each row-set also records the package version, the git hash and the input hashes in its parquet
metadata, so a results file describes itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.errors import CrsreproError
from crsrepro.io import atomic_write, atomic_write_parquet, content_key, git_hash  # noqa: F401 (git_hash re-exported)

#: Bump when the meaning of a row-set changes (metrics, probe protocol, its per-case arrays): old
#: row-sets are then ignored.
CACHE_VERSION = 3  # 2: per-seed train/val splits, keys derived from the feature keys they read; 3: cases

CASES_LAYOUT = """The per-case arrays of a full-label linear probe's row-set (``<output_dir>/cases/<rowset>.npz``):

- ``probs|<condition>|none`` for every test condition (clean, each perturbation, each transfer set),
  ``probs|clean|<recalibrator>`` for the four recalibrators, and ``probs|val|none`` on the seed's val
  split (thresholds and calibration maps are chosen there); probabilities are float16;
- ``labels|<set>`` and ``image_id|<set>`` for the sets ``clean`` (the test split, whose images every
  perturbed condition degrades), ``val`` and each transfer set.
"""

RUN_KEYS = ["encoder", "family", "dataset", "seed", "label_fraction", "condition", "probe", "layer", "regime",
            "recalibrator"]
RUN_INFO = ["probe_C", "converged", "hit_time_cap", "fit_seconds", "rowset"]
COLUMNS = RUN_KEYS + ["metric", "value"] + RUN_INFO


class ResultStore:
    """Row-sets under ``<root>/runs/`` merged into ``<root>/results.parquet``, and the per-case test
    probabilities of the full-label probes under ``<root>/cases/`` (DESIGN.md section 10: the
    two-level bootstrap and the reliability diagrams read them)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"
        self.cases_dir = self.root / "cases"

    @property
    def merged_path(self) -> Path:
        return self.root / "results.parquet"

    def path(self, key: str) -> Path:
        return self.runs_dir / f"{key}.parquet"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def write(self, key: str, rows: pd.DataFrame) -> None:
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise ValueError(f"row-set {key} lacks columns {missing}")
        atomic_write_parquet(rows[COLUMNS], self.path(key))

    def cases_path(self, key: str) -> Path:
        return self.cases_dir / f"{key}.npz"

    def write_cases(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Save a row-set's per-case arrays (probabilities as float16 [ours: 3 significant digits is
        more than an AUROC or a 15-bin ECE resolves]); written before the row-set, which marks both done."""
        packed = {name: a.astype(np.float16) if a.dtype.kind == "f" else a for name, a in arrays.items()}
        atomic_write(self.cases_path(key), lambda f: np.savez(f, **packed))

    def read_cases(self, key: str) -> dict[str, np.ndarray]:
        path = self.cases_path(key)
        if not path.is_file():
            raise CrsreproError(f"no per-case probabilities at {path}: rerun `crsrepro run` to compute them")
        with np.load(path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}

    def merge(self, keys: list[str], *, attrs: dict | None = None) -> pd.DataFrame:
        """Concatenate the row-sets of ``keys`` into ``results.parquet`` and return the table.

        The merged table records :func:`keys_hash` of its keys (``attrs["keys_hash"]``), so merging
        the same row-sets again just reads it and a changed key set is noticed and re-merged. ``attrs``
        (the profile's fingerprint, the package version) are stored beside it.
        """
        merged = self.merged_path
        digest = keys_hash(keys)
        if merged.is_file():
            table = pd.read_parquet(merged)
            if table.attrs.get("keys_hash") == digest and all(table.attrs.get(k) == v for k, v in (attrs or {}).items()):
                return table
        missing = [k for k in keys if not self.has(k)]
        if missing:
            raise CrsreproError(f"{len(missing)} row-sets are missing under {self.runs_dir} "
                                f"(first: {missing[0]}); run `crsrepro run` to compute them")
        table = pd.concat([pd.read_parquet(self.path(k)) for k in keys], ignore_index=True)
        table.attrs = {**(attrs or {}), "keys_hash": digest}
        atomic_write_parquet(table, merged)
        return table


def keys_hash(keys: list[str]) -> str:
    """The hash of a results table: the content key of its sorted row-set keys. Every row-set key is a
    function of all the inputs that decide its numbers, so this names the table's content."""
    return content_key(keys=sorted(keys))


def load_results(output_dir: str | os.PathLike) -> pd.DataFrame:
    """Read the merged tidy table of a finished run."""
    path = Path(output_dir) / "results.parquet"
    if not path.is_file():
        raise CrsreproError(f"no results at {path}: run `crsrepro run --profile ...` first")
    return pd.read_parquet(path)


def runs_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per run, one column per metric (``auroc``, ``ece`` ...): the wide view analyses use.

    >>> long = pd.DataFrame({k: ["x"] * 2 for k in RUN_KEYS} | {"metric": ["auroc", "ece"], "value": [0.8, 0.1]})
    >>> runs_table(long)[["auroc", "ece"]].values.tolist()
    [[0.8, 0.1]]
    """
    wide = results.set_index(RUN_KEYS + ["metric"])["value"].unstack("metric")
    wide.columns.name = None
    return wide.reset_index()
