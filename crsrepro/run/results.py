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
metric         ``auroc``, ``ece``, ``classwise_ece``, ``skipped_labels``, ``n_test``; ``auroc_full_val`` (the clean
               rows of a smaller fraction: C chosen on the whole val split), ``val_cv_ece``
value          the metric's value (float)
probe_C        the C chosen on the val split (NaN for probes without C)
converged      whether the probe's optimiser converged
c_rule         how C was chosen: ``val`` (on the val cases) or ``cv`` (cross-validation inside the labelled
               subset, below ``crsrepro.fit.linear.MIN_VAL_CASES``); empty for probes without C
c_tie          whether several C shared the best AUROC, so that the log-loss decided
hit_time_cap   whether the fit hit the profile's compute-time cap
fit_seconds    wall time of the probe fit (shared by the fractions fitted together)
rowset         the key of the row-set the row came from (and of its per-case probabilities)
============== ==============================================================================

Each row-set also records the package version, the git hash and the input hashes in its parquet
metadata, so a results file describes itself.

Integrity
---------
Every file of the store is written atomically (:func:`crsrepro.core.io.atomic_write`) and gets a *digest*
beside it, ``<file>.sha256``: the SHA-256 of its bytes, written after it. A row-set's digest also
records the digest of its per-case file (written before the row-set), so the row-set's digest marks
the whole unit done. Every read recomputes the hashes: a row-set whose digest is absent (a run killed
between the two writes) is not done; one whose bytes or per-case file do not match is corrupt, logged
with a warning and recomputed by the next ``crsrepro run``; a corrupt merged table is re-merged.
:func:`remove_temporaries` clears the temporary files a killed writer leaves behind.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import atomic_write, atomic_write_parquet, content_key, sha256_file
from crsrepro.core.schema import COLUMNS, RUN_KEYS

log = logging.getLogger(__name__)

#: Bump when the meaning of a row-set changes (metrics, probe protocol, its per-case arrays): old
#: row-sets are then ignored.
CACHE_VERSION = 8  # 2: per-seed train/val splits, keys derived from the feature keys they read; 3: cases;
#                    4: float64 cases, and the smaller fractions' clean test probabilities;
#                    5: c_rule and c_tie, and auroc_full_val on the smaller fractions' clean rows;
#                    6: meant the chosen C's finishing to 50x max_iter, but a merge left the code at 10x;
#                    7: the chosen C finishes to 50x max_iter (crsrepro.fit.linear.FINISH_FACTOR, was 10x);
#                    8: the parametric recalibrators fit the labels of a multi-label fit at once (batched_lbfgs)

CASES_LAYOUT = """The per-case arrays of a full-label linear probe's row-set (``<output_dir>/cases/<rowset>.npz``):

- ``probs|<condition>|none`` for every test condition (clean, each perturbation, each transfer set),
  ``probs|clean|<recalibrator>`` for the four recalibrators, and ``probs|val|none`` on the seed's val
  split (thresholds and calibration maps are chosen there);
- ``fraction|<f>`` for every smaller label fraction f: the clean test probabilities of the probe
  fitted on f (the CRS bootstrap recomputes retention from them);
- ``labels|<set>`` and ``image_id|<set>`` for the sets ``clean`` (the test split, whose images every
  perturbed condition degrades), ``val`` and each transfer set.

Probabilities are stored as the probe computed them (float64), so that every metric recomputed from
them is the table's: float16 moved AUROC by up to 5e-3, and float32 still by up to 0.02 where a
degraded image leaves a probe's probabilities nearly constant (ties appear that float64 tells apart).
Each key is :func:`crsrepro.core.schema.case_key` of its kind, set and recalibrator.
"""


class ResultStore:
    """Row-sets under ``<root>/runs/`` merged into ``<root>/results.parquet``, and the per-case test
    probabilities of the full-label probes under ``<root>/cases/`` (DESIGN.md section 10: the
    two-level bootstrap and the reliability diagrams read them). Every file is verified on read (see
    "Integrity" in the module docstring)."""

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
        """Whether the unit ``key`` is done: its row-set and per-case file exist and match their digest
        (a corrupt one is logged with a warning and reported as not done, so it is recomputed)."""
        problem = self._problem(key)
        if problem and problem != "absent":
            log.warning("%s; it is recomputed", problem)
        return problem is None

    def write(self, key: str, rows: pd.DataFrame) -> None:
        """Save a unit's row-set, then its digest (with the digest of the per-case file written before
        it, if any), which marks the unit done."""
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise ValueError(f"row-set {key} lacks columns {missing}")
        path, cases = self.path(key), self.cases_path(key)
        atomic_write_parquet(rows[COLUMNS], path)
        _write_digest(path, cases=_verified_digest(cases) if cases.is_file() else None)

    def cases_path(self, key: str) -> Path:
        return self.cases_dir / f"{key}.npz"

    def write_cases(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Save a row-set's per-case arrays as they are (probabilities in float64: see :data:`CASES_LAYOUT`);
        written before the row-set, which marks both done."""
        path = self.cases_path(key)
        atomic_write(path, lambda f: np.savez(f, **arrays))
        _write_digest(path)

    def read_cases(self, key: str) -> dict[str, np.ndarray]:
        path = self.cases_path(key)
        if not path.is_file():
            raise CrsreproError(f"no per-case probabilities at {path}: rerun `crsrepro run` to compute them")
        problem = _check(path)
        if problem:
            raise CrsreproError(f"{problem}: rerun `crsrepro run`, which recomputes it")
        with np.load(path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}

    def merge(self, keys: list[str], *, attrs: dict | None = None) -> pd.DataFrame:
        """Concatenate the row-sets of ``keys`` into ``results.parquet`` and return the table.

        The merged table records :func:`keys_hash` of its keys (``attrs["keys_hash"]``), so merging
        the same row-sets again just reads it (after checking its digest) and a changed key set is
        noticed and re-merged. ``attrs`` (the profile's fingerprint, the package version) are stored
        beside it.
        """
        merged = self.merged_path
        digest = keys_hash(keys)
        if merged.is_file():
            problem = _check(merged)
            if problem:
                log.warning("%s; it is merged again", problem)
            else:
                table = pd.read_parquet(merged)
                if table.attrs.get("keys_hash") == digest and all(table.attrs.get(k) == v
                                                                  for k, v in (attrs or {}).items()):
                    return table
        problems = [p for p in map(self._problem, keys) if p]
        if problems:
            raise CrsreproError(f"{len(problems)} of {len(keys)} row-sets under {self.runs_dir} are missing or "
                                f"corrupt (first: {problems[0]}); run `crsrepro run` to compute them")
        table = pd.concat([pd.read_parquet(self.path(k)) for k in keys], ignore_index=True)
        table.attrs = {**(attrs or {}), "keys_hash": digest}
        atomic_write_parquet(table, merged)
        _write_digest(merged)
        return table

    def _problem(self, key: str) -> str | None:
        """None when unit ``key`` is done and intact, ``"absent"`` when it is not done, else what is wrong."""
        path = self.path(key)
        if not _digest_path(path).is_file():
            return "absent"
        problem = _check(path)
        if problem:
            return problem
        expected = _read_digest(path)["cases"]
        if expected is None:
            return None
        cases = self.cases_path(key)
        if not cases.is_file():
            return f"row-set {key}: its per-case file {cases} is missing"
        return _check(cases) or (None if sha256_file(cases) == expected else
                                 f"row-set {key}: its per-case file {cases} is not the one it was written with")


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_digest(path: Path, **extra) -> None:
    atomic_write(_digest_path(path), json.dumps({"sha256": sha256_file(path), **extra}, sort_keys=True).encode())


def _read_digest(path: Path) -> dict:
    return json.loads(_digest_path(path).read_text())


def _check(path: Path) -> str | None:
    """None when ``path`` and its digest exist and match, else what is wrong (naming the file)."""
    if not path.is_file():
        return f"{path} is missing"
    if not _digest_path(path).is_file():
        return f"{path} has no digest ({_digest_path(path).name})"
    try:
        expected = _read_digest(path)["sha256"]
    except (ValueError, KeyError):
        return f"{_digest_path(path)} is unreadable"
    return None if sha256_file(path) == expected else f"{path} is corrupt (its SHA-256 does not match its digest)"


def _verified_digest(path: Path) -> str:
    problem = _check(path)
    if problem:
        raise CrsreproError(problem)
    return _read_digest(path)["sha256"]


def remove_temporaries(root: str | os.PathLike) -> int:
    """Remove the temporary files (``.<name>.<random>.tmp``, :func:`crsrepro.core.io.atomic_write`) that a
    writer killed mid-write left under ``root``; returns how many (logged). Only one ``crsrepro run``
    may write a folder at a time (its workers write distinct keys), so none of them is in flight."""
    root = Path(root)
    leftovers = sorted(root.rglob(".*.tmp")) if root.is_dir() else []
    for path in leftovers:
        path.unlink(missing_ok=True)
    if leftovers:
        log.warning("removed %d temporary files left by an interrupted run under %s", len(leftovers), root)
    return len(leftovers)


def keys_hash(keys: list[str]) -> str:
    """The hash of a results table: the content key of its sorted row-set keys. Every row-set key is a
    function of all the inputs that decide its numbers, so this names the table's content."""
    return content_key(keys=sorted(keys))


def load_results(output_dir: str | os.PathLike, *, command: str = "crsrepro run --profile ...") -> pd.DataFrame:
    """Read the merged tidy table of a finished run; ``command`` is what the errors say to run.

    Raises
    ------
    CrsreproError
        The table is missing or corrupt (its SHA-256 does not match its digest).
    """
    path = ResultStore(output_dir).merged_path
    if not path.is_file():
        raise CrsreproError(f"no results at {path}: run `{command}` first")
    problem = _check(path)
    if problem:
        raise CrsreproError(f"{problem}: rerun `{command}`, which merges it again")
    return pd.read_parquet(path)


def results_hash(results: pd.DataFrame) -> str:
    """The hash of a results table: :func:`keys_hash` of its row-sets (recorded by the merge), or of its
    ``rowset`` column; a table built by hand, without row-sets, is hashed by its content. A frozen frame
    records it (:meth:`crsrepro.score.crs.ReferenceFrame.check_results`)."""
    if results.attrs.get("keys_hash"):
        return results.attrs["keys_hash"]
    if "rowset" in results.columns:
        return keys_hash(results["rowset"].unique().tolist())
    return content_key(rows=pd.util.hash_pandas_object(results, index=False).tolist())


def runs_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per run, one column per metric (``auroc``, ``ece`` ...): the wide view analyses use.

    >>> long = pd.DataFrame({k: ["x"] * 2 for k in RUN_KEYS} | {"metric": ["auroc", "ece"], "value": [0.8, 0.1]})
    >>> runs_table(long)[["auroc", "ece"]].values.tolist()
    [[0.8, 0.1]]
    """
    wide = results.set_index(RUN_KEYS + ["metric"])["value"].unstack("metric")
    wide.columns.name = None
    return wide.reset_index()
