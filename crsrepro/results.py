"""The tidy results store (DESIGN.md section 7, "Results").

Every unit of work of the run grid writes one *row-set*: a small parquet file under
``<output_dir>/runs/`` named by the content hash of everything that changes its numbers (encoder and
weights hash, manifest hash, seed, label fraction, probe and its hyper-parameters, layer, regime,
:data:`CACHE_VERSION`). A unit whose file exists is skipped, so an interrupted run resumes where it
stopped. :func:`merge_results` then concatenates the row-sets into one tidy table,
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
============== ==============================================================================

Each row-set also records the package version, the git hash and the input hashes in its parquet
metadata, so a results file describes itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

from crsrepro.errors import CrsreproError

#: Bump when the meaning of a row-set changes (metrics, probe protocol): old row-sets are then ignored.
CACHE_VERSION = 1

RUN_KEYS = ["encoder", "family", "dataset", "seed", "label_fraction", "condition", "probe", "layer", "regime",
            "recalibrator"]
RUN_INFO = ["probe_C", "converged", "hit_time_cap", "fit_seconds"]
COLUMNS = RUN_KEYS + ["metric", "value"] + RUN_INFO


def content_key(**inputs) -> str:
    """The SHA-256 of ``inputs`` (JSON, sorted keys): the address of a cached result.

    >>> content_key(a=1, b="x") == content_key(b="x", a=1)
    True
    """
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def git_hash(path: str | os.PathLike = ".") -> str:
    """The commit of the checkout holding ``path`` (``unknown`` outside git), ``+dirty`` if modified."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=path, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def atomic_write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` to ``path`` through a temporary file and a rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class ResultStore:
    """Row-sets under ``<root>/runs/``, merged into ``<root>/results.parquet``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"

    def path(self, key: str) -> Path:
        return self.runs_dir / f"{key}.parquet"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def write(self, key: str, rows: pd.DataFrame) -> None:
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise ValueError(f"row-set {key} lacks columns {missing}")
        atomic_write_parquet(rows[COLUMNS], self.path(key))

    def merge(self, keys: list[str]) -> pd.DataFrame:
        """Concatenate the row-sets of ``keys`` into ``results.parquet`` and return the table.

        The merged table records the hash of its keys, so merging the same row-sets again just reads it.
        """
        merged = self.root / "results.parquet"
        keys_hash = content_key(keys=keys)
        if merged.is_file():
            table = pd.read_parquet(merged)
            if table.attrs.get("keys_hash") == keys_hash:
                return table
        missing = [k for k in keys if not self.has(k)]
        if missing:
            raise CrsreproError(f"{len(missing)} row-sets are missing under {self.runs_dir} "
                                f"(first: {missing[0]}); run `crsrepro run` to compute them")
        table = pd.concat([pd.read_parquet(self.path(k)) for k in keys], ignore_index=True)
        table.attrs = {"keys_hash": keys_hash}
        atomic_write_parquet(table, merged)
        return table


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
