"""The run grid: what is fitted and scored, and in which order (DESIGN.md section 7).

One *run* is (encoder, dataset, seed, label fraction, test condition). The conditions are ``clean``,
the perturbations ``<name>@<severity>``, and, for a dataset with transfer targets (CheXpert), each
transfer set (``mimic_cxr``) scored without retraining. :func:`enumerate_runs` lists them; for the
``paper`` profile that is the paper's 17,575 runs = 3,515 seed-aggregated rows x 5 seeds over 43
encoder-dataset cells.

:func:`run_grid` executes them as keyed tasks (DESIGN.md section 13, :mod:`crsrepro.run.executor`):
one extraction task per (encoder, dataset) cell, which writes the cell's feature arrays to the
content-addressed feature cache, and one probe task per unit, after it, in this process, on a process
pool or on a Dask cluster, with the same table from each. The unit of work, and of resume, is (cell, seed,
probe): it fits that seed's probes on that seed's own train split (DESIGN.md section 3: every seed
draws its own grouped train / val partition of the non-test pool; the test split is fixed) and writes
one row-set to the :class:`~crsrepro.run.results.ResultStore`. A unit's key is *derived from its inputs*
(:meth:`_Unit.key`): the keys of the feature arrays it reads (which name the encoder, its weights, its
preprocessing, the images' content, the canonical size and the condition), the content of the seed's
split and label subsets, the labels, the probe's parameters and the row-set version. Nothing else
enters it, so a changed input can never be served a stale row-set, and a setting that changes no
number (``probe.num_threads``) throws nothing away. A unit whose row-set exists (and matches its digest) is skipped.

Beyond the paper's linear-probe grid, the same units also write

- the control probes (``mlp``, ``knn``) at ``control_probes.label_fractions`` and
  ``control_probes.conditions`` (default: every fraction and condition, DESIGN.md section 7);
- the four recalibrators (DESIGN.md section 8), fitted on the seed's val split (the calibration
  subset) of the full-label linear probe and scored under every condition, in rows whose
  ``recalibrator`` is not ``none``;
- the per-case test probabilities of the full-label linear probe (clean, each recalibrator, each
  transfer set), for the two-level bootstrap and the reliability diagrams.

The reference frame is never written here: :func:`freeze_frame` is an explicit act
(``crsrepro freeze-frame``), and :func:`reference_frame` only reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import content_key, git_hash, manifest_dir as default_manifest_dir
from crsrepro.profiles import Profile, load_profile
from crsrepro.run.results import CACHE_VERSION, ResultStore, keys_hash, runs_table
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION, RECALIBRATORS

log = logging.getLogger(__name__)

RUN_COLUMNS = ["encoder", "dataset", "seed", "label_fraction", "condition"]
VAL_CV_FOLDS = 5  # [ours] folds of the cross-validated ECE inside the val split (crsrepro.fit.calibration)


def _as_profile(profile: Profile | str) -> Profile:
    return profile if isinstance(profile, Profile) else load_profile(profile)


def cells(profile: Profile | str, encoders: list[str] | None = None) -> list[tuple[str, str]]:
    """The (encoder, dataset) cells of a profile (or of ``encoders`` on its datasets), without the
    datasets an encoder is excluded from.

    >>> len(cells("paper"))  # BioViL and CheXzero have no APTOS cell
    43
    """
    from crsrepro.encoders import get_spec

    profile = _as_profile(profile)
    return [(encoder, dataset) for dataset in profile.datasets for encoder in encoders or profile.encoders
            if dataset not in get_spec(encoder).excluded_datasets]


def conditions_for(profile: Profile, dataset: str) -> list[str]:
    """The conditions a probe trained on ``dataset`` is scored under (clean, perturbations, transfers)."""
    return profile.conditions() + list(profile.transfer_targets(dataset))


def enumerate_runs(profile: Profile | str) -> pd.DataFrame:
    """Every run of the frozen linear-probe grid: one row per (encoder, dataset, seed, fraction, condition).

    >>> runs = enumerate_runs("paper")
    >>> len(runs), len(runs.drop(columns="seed").drop_duplicates()), len(runs[["encoder", "dataset"]].drop_duplicates())
    (17575, 3515, 43)
    """
    profile = _as_profile(profile)
    rows = [(encoder, dataset, seed, fraction, condition)
            for encoder, dataset in cells(profile)
            for seed in profile.seeds
            for fraction in profile.label_fractions
            for condition in conditions_for(profile, dataset)]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def canonical_size(profile: Profile) -> int:
    """The cap on the short side at which test images are degraded (DESIGN.md section 6, [ours]):
    ``canonical_size`` if the profile sets it, else the largest input size in the profile's panel, so
    that no encoder of the panel is handed fewer pixels than it takes."""
    from crsrepro.encoders import get_spec

    return profile.canonical_size or max(get_spec(e).input_size for e in profile.encoders)


# --------------------------------------------------------------------------- prepared datasets

@dataclass
class _Split:
    """The images (``image_id``, ``path``) and label matrix of one image set."""

    images: pd.DataFrame
    labels: np.ndarray

    def take(self, rows: np.ndarray) -> "_Split":
        return _Split(self.images.iloc[rows].reset_index(drop=True), self.labels[rows])


@dataclass
class _Transfer:
    """A transfer set: its images and the source probe's columns that its labels are scored on."""

    name: str
    images_key: str
    split: _Split  # every image of the transfer set (no probe is trained on it), its shared labels
    columns: np.ndarray  # indices into the source dataset's labels, one per transfer label column


@dataclass
class _DatasetView:
    """A prepared dataset: the non-test pool, the fixed test split, each seed's train / val rows into
    the pool, and its transfer sets."""

    name: str
    task: str
    label_names: list[str]
    images_key: str
    pool: _Split
    test: _Split
    seed_rows: dict[int, tuple[np.ndarray, np.ndarray]]  # seed -> (train rows, val rows) into the pool
    seed_hash: dict[int, str]
    transfers: list[_Transfer]


def _images_and_labels(table: pd.DataFrame) -> _Split:
    from crsrepro.data import label_matrix

    return _Split(table[["image_id", "path"]].reset_index(drop=True), label_matrix(table))


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


def _learnable_labels(table: pd.DataFrame, seeds) -> pd.DataFrame:
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


def _prepare(profile: Profile, dataset: str, manifest_dir: Path | None, progress: bool) -> _DatasetView:
    from crsrepro.data import prepare_dataset
    from crsrepro.data.content import dataset_content_key
    from crsrepro.data.manifests import seed_column, seed_split_hash

    table = _learnable_labels(prepare_dataset(profile, dataset, manifest_dir=manifest_dir, progress=progress),
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
        split = _Split(ttable[["image_id", "path"]].reset_index(drop=True), labels)
        transfers.append(_Transfer(target, dataset_content_key(profile, target, ttable), split, columns))
    return _DatasetView(dataset, attrs["task"], list(attrs["label_names"]),
                        dataset_content_key(profile, dataset, table), _images_and_labels(pool_table),
                        _images_and_labels(test_table), seed_rows, seed_hash, transfers)


# --------------------------------------------------------------------------- features

@dataclass
class _FeatureRequest:
    """One call to :func:`crsrepro.extract.features.extract_features`: which images, under which conditions."""

    dataset: str
    images_key: str
    images: pd.DataFrame
    conditions: tuple
    canonical_size: int | None


def _feature_requests(profile: Profile, view: _DatasetView) -> dict[str, _FeatureRequest]:
    """The pool (clean, at its stored size), the test split (every condition, at the canonical size)
    and each transfer set (clean, at the canonical size) [ours: DESIGN.md section 6]."""
    size = canonical_size(profile)
    requests = {"pool": _FeatureRequest(view.name, view.images_key, view.pool.images, (CLEAN,), None),
                "test": _FeatureRequest(view.name, view.images_key, view.test.images, tuple(profile.conditions()), size)}
    for transfer in view.transfers:
        requests[transfer.name] = _FeatureRequest(transfer.name, transfer.images_key, transfer.split.images,
                                                  (CLEAN,), size)
    return requests


def _feature_keys(encoder, requests: dict[str, _FeatureRequest]) -> dict[str, dict[str, str]]:
    from crsrepro.extract.features import feature_keys

    return {name: {c: key for (c, _), key in feature_keys(encoder, r.images, dataset=r.dataset,
                                                          images_key=r.images_key, conditions=r.conditions,
                                                          layers=("final",),
                                                          canonical_size=r.canonical_size).items()}
            for name, r in requests.items()}


def degraded_image_cache(profile: Profile) -> Path:
    """Where the degraded test images are cached, beside the feature cache: every test image is degraded
    once per condition, and every later encoder reads it (DESIGN.md section 6; issue 18)."""
    return profile.feature_cache_path.parent / "degraded_images"


def _features(profile: Profile, encoder, requests: dict[str, _FeatureRequest], progress: bool,
              layers: tuple[str, ...] = ("final",)) -> dict:
    """``{"pool": {layer: X}, "test": {condition: {layer: X}}, <transfer>: {layer: X}}`` at ``layers``, from
    one forward pass per image and the feature cache; the test images are degraded once for every
    encoder (the degraded-image cache). The grid's extraction tasks and the depth sweep both call it."""
    from crsrepro.extract.features import extract_features

    out = {}
    for name, r in requests.items():
        arrays = extract_features(encoder, r.images, dataset=r.dataset, images_key=r.images_key,
                                  conditions=r.conditions, layers=tuple(layers), cache_dir=profile.feature_cache_path,
                                  canonical_size=r.canonical_size, batch_size=profile.features.batch_size,
                                  num_workers=profile.features.num_workers, progress=progress,
                                  image_cache_dir=degraded_image_cache(profile) if name == "test" else None)
        by_condition = {c: {layer: arrays[(c, layer)] for layer in layers} for c in r.conditions}
        out[name] = by_condition if name == "test" else by_condition[CLEAN]
    return out


# --------------------------------------------------------------------------- one unit of work

def _score(task: str, y: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    from crsrepro.core.metrics import classwise_ece, expected_calibration_error, macro_auroc

    auroc, skipped = macro_auroc(y, probs, task=task, return_skipped=True)
    return {"auroc": auroc, "ece": expected_calibration_error(y, probs, task=task),
            "classwise_ece": classwise_ece(y, probs, task=task), "skipped_labels": float(skipped),
            "n_test": float(len(y))}


def _rows(base: dict, metrics: dict[str, float]) -> list[dict]:
    return [{**base, "metric": name, "value": float(value)} for name, value in metrics.items()]


def _labels_key(labels: np.ndarray) -> str:
    return content_key(shape=list(labels.shape), values=np.nan_to_num(labels, nan=-1).astype(np.int8).tobytes().hex())


class _Unit:
    """One unit of work: a (cell, seed, probe); fits its probes and returns its row-set."""

    def __init__(self, profile: Profile, spec, view: _DatasetView, seed: int, probe: str):
        from crsrepro.data.manifests import label_subsets

        self.profile, self.spec, self.view, self.seed, self.probe = profile, spec, view, seed, probe
        control = profile.control_probes
        every = conditions_for(profile, view.name)
        if probe == LINEAR:
            self.fractions, self.conditions = list(profile.label_fractions), every
        else:
            self.fractions = list(control.label_fractions or profile.label_fractions)
            self.conditions = [c for c in every if control.conditions is None or c in control.conditions]
        train_rows, val_rows = view.seed_rows[seed]
        self.train, self.val = view.pool.take(train_rows), view.pool.take(val_rows)
        self.train_rows, self.val_rows = train_rows, val_rows
        fractions = profile.label_fractions
        self.subsets = label_subsets(self.train.labels, fractions=fractions, seed=seed, task=view.task)
        self.val_subsets = (label_subsets(self.val.labels, fractions=fractions, seed=seed, task=view.task)
                            if profile.probe.c_selection == "nested_val" else None)

    def probe_params(self) -> dict:
        """The parameters of this unit's probe (scikit-learn's ``get_params``) and of its recalibrators."""
        from crsrepro.fit.probes import KNNProbe, LinearProbe, MLPProbe

        options, task = self.profile.probe, self.view.task
        if self.probe == LINEAR:
            params = LinearProbe(task=task, c_grid=list(options.c_grid), backend=options.backend,
                                 device=options.device, max_iter=options.max_iter,
                                 time_cap_s=options.time_cap_s).get_params()
            return {**params, "c_selection": options.c_selection, "recalibrators": list(RECALIBRATORS),
                    "val_cv_folds": VAL_CV_FOLDS}
        if self.probe == "mlp":  # the same device and compute-time cap as the linear probe
            return MLPProbe(task=task, device=options.device, time_cap_s=options.time_cap_s,
                            random_state=self.seed).get_params()
        return KNNProbe(task=task).get_params()

    def key(self, feature_keys: dict[str, dict[str, str]]) -> str:
        """The row-set's key: a function of every input that decides its numbers, and of nothing else."""
        def rows(subsets):
            return None if subsets is None else {str(f): content_key(ids=idx.tolist()) for f, idx in subsets.items()}

        transfers = {t.name: {"features": feature_keys[t.name][CLEAN], "labels": _labels_key(t.split.labels),
                              "columns": t.columns.tolist()}
                     for t in self.view.transfers if t.name in self.conditions}
        return content_key(stage="rowset", version=CACHE_VERSION, encoder=self.spec.id, family=self.spec.family,
                           pool_features=feature_keys["pool"][CLEAN],
                           test_features={c: feature_keys["test"][c] for c in self.conditions if c in feature_keys["test"]},
                           transfers=transfers, seed=self.seed, seed_split=self.view.seed_hash[self.seed],
                           train_rows=content_key(rows=self.train_rows.tolist()),
                           val_rows=content_key(rows=self.val_rows.tolist()),
                           labels={"pool": _labels_key(self.view.pool.labels), "test": _labels_key(self.view.test.labels)},
                           train_subsets=rows({f: self.subsets[f] for f in self.fractions}),
                           val_subsets=rows(self.val_subsets), probe=self.probe, params=self.probe_params(),
                           fractions=self.fractions, conditions=self.conditions, layer="final", regime="frozen")

    def run(self, feats: dict) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
        """Fit and score this unit's probes; return the row-set and the per-case arrays to keep."""
        probes = self._fit(feats)
        rows, cases = [], {}
        for fraction, probe in probes.items():
            rows += self._scored(fraction, probe, feats, cases)
        return pd.DataFrame(rows), cases

    def _transfer(self, condition: str) -> _Transfer | None:
        return next((t for t in self.view.transfers if t.name == condition), None)

    def _test_features(self, feats: dict, condition: str) -> np.ndarray:
        return feats[condition] if self._transfer(condition) else feats["test"][condition]

    def _labels(self, condition: str) -> np.ndarray:
        transfer = self._transfer(condition)
        return transfer.split.labels if transfer else self.view.test.labels

    def _probs(self, probs: np.ndarray, condition: str) -> np.ndarray:
        """A probe's probabilities on ``condition``, restricted to a transfer set's shared labels."""
        transfer = self._transfer(condition)
        return probs[:, transfer.columns] if transfer else probs

    def _scored(self, fraction: float, probe, feats: dict, cases: dict, *, recalibrate: bool = True) -> list[dict]:
        """The rows of one fitted probe under every condition; for the full-label linear probe also the
        per-case store's arrays and, with ``recalibrate``, the recalibrated rows (the depth sweep has none)."""
        base = dict(encoder=self.spec.id, family=self.spec.family, dataset=self.view.name, seed=self.seed,
                    label_fraction=float(fraction), probe=self.probe, layer="final", regime="frozen",
                    probe_C=float(getattr(probe, "C_", np.nan)), converged=bool(getattr(probe, "converged_", True)),
                    hit_time_cap=bool(getattr(probe, "hit_time_cap_", False)),
                    fit_seconds=float(getattr(probe, "fit_seconds_", np.nan)))
        test_probs = {c: probe.predict_proba(self._test_features(feats, c)) for c in self.conditions}
        rows = []
        for condition, probs in test_probs.items():
            rows += _rows({**base, "condition": condition, "recalibrator": NO_RECALIBRATION},
                          _score(self.view.task, self._labels(condition), self._probs(probs, condition)))
        if self.probe == LINEAR and fraction == 1.0:
            val_probs = probe.predict_proba(feats["pool"][self.val_rows])
            cases.update({f"probs|{c}|{NO_RECALIBRATION}": self._probs(p, c) for c, p in test_probs.items()})
            cases.update({f"probs|val|{NO_RECALIBRATION}": val_probs, "labels|val": self.val.labels,
                          "image_id|val": self.val.images["image_id"].to_numpy(dtype=str)})
            if recalibrate:
                rows += self._recalibrated(base, val_probs, test_probs, cases)
        return rows

    def _fit(self, feats: dict) -> dict:
        from crsrepro.fit.probes import KNNProbe, MLPProbe, fit_linear_probes

        X_train, X_val = feats["pool"][self.train_rows], feats["pool"][self.val_rows]
        y_train, y_val = self.train.labels, self.val.labels
        options = self.profile.probe
        subsets = {f: self.subsets[f] for f in self.fractions}
        val_subsets = None if self.val_subsets is None else {f: self.val_subsets[f] for f in self.fractions}
        if self.probe == LINEAR:
            return fit_linear_probes(X_train, y_train, subsets, X_val, y_val, task=self.view.task,
                                     c_grid=options.c_grid, backend=options.backend, device=options.device,
                                     max_iter=options.max_iter, time_cap_s=options.time_cap_s,
                                     val_subsets=val_subsets, progress=False)
        if self.probe == "mlp":  # the same device and compute-time cap as the linear probe
            make = lambda: MLPProbe(task=self.view.task, device=options.device,  # noqa: E731
                                    time_cap_s=options.time_cap_s, random_state=self.seed)
        else:
            make = lambda: KNNProbe(task=self.view.task)  # noqa: E731
        fitted = {}
        for f, idx in subsets.items():
            val_idx = np.arange(len(y_val)) if val_subsets is None else val_subsets[f]
            fitted[f] = make().fit(X_train[idx], y_train[idx], X_val=X_val[val_idx], y_val=y_val[val_idx],
                                   standardize_with=X_train)
        return fitted

    def _recalibrated(self, base: dict, val_probs: np.ndarray, test_probs: dict, cases: dict) -> list:
        """The four recalibrators, fitted on the seed's val split (the calibration subset), and the
        cross-validated ECE of each inside that split (``val_cv_ece``, on the clean rows), which picks a
        method per cell without looking at the test split."""
        from crsrepro.fit.calibration import TooFewCasesError, cross_validated_ece, make_recalibrator

        try:
            cv_ece = cross_validated_ece(val_probs, self.val.labels, methods=RECALIBRATORS, task=self.view.task,
                                         n_folds=VAL_CV_FOLDS, seed=self.seed)
        except TooFewCasesError as exc:  # a tiny val split: no in-val choice for this cell, said in the log
            log.info("%s %s seed %d: no val_cv_ece (%s)", self.spec.id, self.view.name, self.seed, exc)
            cv_ece = {}
        rows = [{**base, "condition": CLEAN, "recalibrator": NO_RECALIBRATION, "metric": "val_cv_ece",
                 "value": float(cv_ece[NO_RECALIBRATION])}] if cv_ece else []
        for name in RECALIBRATORS:
            recalibrator = make_recalibrator(name).fit(val_probs, self.val.labels)
            for condition, probs in test_probs.items():
                calibrated = recalibrator.predict_proba(probs)
                metrics = _score(self.view.task, self._labels(condition), self._probs(calibrated, condition))
                if condition == CLEAN and cv_ece:
                    metrics["val_cv_ece"] = cv_ece[name]
                rows += _rows({**base, "condition": condition, "recalibrator": name}, metrics)
                if condition == CLEAN:
                    cases[f"probs|{CLEAN}|{name}"] = calibrated
        return rows


def _case_arrays(view: _DatasetView, cases: dict) -> dict[str, np.ndarray]:
    """A unit's per-case arrays (:data:`crsrepro.run.results.CASES_LAYOUT`) with the labels and image ids
    they belong to: ``clean`` names the test split (whose images every perturbed condition degrades),
    ``val`` the seed's val split, and each transfer set its own name."""
    out = {"labels|clean": view.test.labels, "image_id|clean": view.test.images["image_id"].to_numpy(dtype=str)}
    for transfer in view.transfers:
        out[f"labels|{transfer.name}"] = transfer.split.labels
        out[f"image_id|{transfer.name}"] = transfer.split.images["image_id"].to_numpy(dtype=str)
    return {**out, **cases}


# --------------------------------------------------------------------------- the grid as keyed tasks

@dataclass(frozen=True)
class _Cell:
    """The inputs of one extraction task: an (encoder, dataset) cell of a run. ``images_key`` is what
    the planning process saw of the dataset: a worker that sees other data refuses to go on."""

    profile: Profile
    encoder: str
    dataset: str
    weights: str | None
    manifest_dir: Path | None
    images_key: str
    progress: bool = False


@dataclass(frozen=True)
class _ProbeTask:
    """The inputs of one probe task: a :class:`_Unit` (cell, seed, probe), the key its row-set gets and
    the keys of the feature arrays it reads (written by its cell's extraction task)."""

    cell: _Cell
    seed: int
    probe: str
    key: str
    feature_keys: dict
    weights_hash: str
    output_dir: Path


_VIEWS: dict = {}  # per process: the datasets prepared for the tasks it ran, by what identifies them
_ENCODERS: dict = {}  # per process: the encoder it built last


def _view(profile: Profile, dataset: str, manifest_dir: Path | None, images_key: str | None = None) -> _DatasetView:
    """:func:`_prepare`, once per process and dataset; ``images_key``: the images the caller expects."""
    name = (profile.fingerprint(), dataset, str(manifest_dir), images_key)
    if name not in _VIEWS:
        view = _prepare(profile, dataset, manifest_dir, progress=False)
        if images_key is not None and view.images_key != images_key:
            raise CrsreproError(f"{dataset}: this worker sees other images than the process that planned the run "
                                f"(images key {view.images_key[:12]}, not {images_key[:12]}); every worker must "
                                f"read the same data root, feature cache and output folder")
        while len(_VIEWS) >= 8:  # [ours] a bound for long-lived workers: drop the oldest
            _VIEWS.pop(next(iter(_VIEWS)))
        _VIEWS[name] = _VIEWS[(profile.fingerprint(), dataset, str(manifest_dir), view.images_key)] = view
    return _VIEWS[name]


def _encoder(encoder_id: str, weights, device: str):
    """:func:`crsrepro.encoders.create_encoder`, reusing the encoder this process built last."""
    from crsrepro.encoders import create_encoder

    name = (encoder_id, str(weights), device)
    if name not in _ENCODERS:
        _ENCODERS.clear()
        _ENCODERS[name] = create_encoder(encoder_id, weights=weights, device=device)
    return _ENCODERS[name]


def _extract_task(cell: _Cell) -> str:
    """Extraction task: the cell's feature arrays, into the feature cache (runs where the encoder's
    device is; a cuda profile's extraction tasks hold the ``GPU`` resource, :mod:`crsrepro.run.executor`)."""
    profile = cell.profile
    view = _view(profile, cell.dataset, cell.manifest_dir, cell.images_key)
    encoder = _encoder(cell.encoder, cell.weights, profile.features.device)
    _features(profile, encoder, _feature_requests(profile, view), cell.progress)
    return f"{cell.encoder} {cell.dataset}"


def _cached_features(profile: Profile, requests: dict[str, _FeatureRequest], feature_keys: dict) -> dict:
    """The arrays of :func:`_features` read back from the feature cache by their keys (no encoder)."""
    from crsrepro.extract.features import _read_entry

    out = {}
    for name, r in requests.items():
        by_condition = {}
        for condition in r.conditions:
            array = _read_entry(profile.feature_cache_path, feature_keys[name][condition], len(r.images))
            if array is None:
                raise CrsreproError(f"feature cache {profile.feature_cache_path}: no entry "
                                    f"{feature_keys[name][condition]} ({r.dataset} {name} {condition}); "
                                    f"its extraction task has not written it")
            by_condition[condition] = array
        out[name] = by_condition if name == "test" else by_condition[CLEAN]
    return out


def _probe_task(task: _ProbeTask) -> str:
    """Probe task: fit and score one unit on its cell's cached features, write its row-set (and per-case
    file) to the store, and return its key. Pure: the row-set is a function of the key's inputs."""
    import torch

    from crsrepro.encoders import get_spec

    cell, profile = task.cell, task.cell.profile
    view = _view(profile, cell.dataset, cell.manifest_dir, cell.images_key)
    unit = _Unit(profile, get_spec(cell.encoder), view, task.seed, task.probe)
    if unit.key(task.feature_keys) != task.key:
        raise CrsreproError(f"{cell.encoder} {cell.dataset} seed {task.seed} {task.probe}: this worker derives "
                            f"another row-set key than the planning process (other data or code?)")
    feats = _cached_features(profile, _feature_requests(profile, view), task.feature_keys)
    threads = torch.get_num_threads()
    torch.set_num_threads(profile.probe.num_threads)  # small full-batch fits run best on one thread
    try:
        rows, cases = unit.run(feats)
    finally:
        torch.set_num_threads(threads)
    rows["rowset"] = task.key
    rows.attrs = {"crsrepro": __version__, "git": git_hash(), "key": task.key, "weights": task.weights_hash}
    store = ResultStore(task.output_dir)
    if cases:  # the per-case file first: the row-set marks the unit done
        store.write_cases(task.key, _case_arrays(view, cases))
    store.write(task.key, rows)
    log.info("wrote %s %s seed %d %s (%d rows)", cell.encoder, cell.dataset, task.seed, task.probe, len(rows))
    return task.key


def _plan(profile: Profile, store: ResultStore, *, encoders, weights, manifest_dir, progress):
    """The grid's keys (in :func:`cells` order: the merged table's row order) and the tasks of the units
    without a row-set: per cell with work left, one extraction task and, after it, one probe task per
    pending (seed, probe) unit. Tasks come encoder by encoder, so a worker rebuilds encoders rarely."""
    from crsrepro.encoders import get_spec
    from crsrepro.run.executor import Task

    probes = [LINEAR] + list(profile.control_probes.probes)
    all_cells = cells(profile, encoders)
    keys: dict[tuple[str, str], list[str]] = {}
    tasks = []
    gpu = profile.features.device.startswith("cuda")
    for encoder_id in dict.fromkeys(e for e, _ in all_cells):
        encoder = _encoder(encoder_id, (weights or {}).get(encoder_id), "cpu")  # keys need the weights hash only
        for dataset in [d for e, d in all_cells if e == encoder_id]:
            view = _view(profile, dataset, manifest_dir)
            feature_keys = _feature_keys(encoder, _feature_requests(profile, view))
            cell = _Cell(profile, encoder_id, dataset, (weights or {}).get(encoder_id), manifest_dir,
                         view.images_key, progress)
            units = [_Unit(profile, get_spec(encoder_id), view, seed, probe)
                     for seed in profile.seeds for probe in probes]
            keys[(encoder_id, dataset)] = [unit.key(feature_keys) for unit in units]
            pending = [(unit, key) for unit, key in zip(units, keys[(encoder_id, dataset)]) if not store.has(key)]
            if not pending:
                continue
            extract = Task(f"extract-{encoder_id}-{dataset}-{feature_keys['pool'][CLEAN][:12]}", _extract_task,
                           (cell,), gpu=gpu)
            tasks.append(extract)
            tasks += [Task(f"probe-{key[:16]}", _probe_task, (_ProbeTask(cell, unit.seed, unit.probe, key, feature_keys,
                                                                          encoder.weights_hash, store.root),),
                           after=extract.key) for unit, key in pending]
    return [key for cell_ in all_cells for key in keys[cell_]], tasks


def run_grid(profile: Profile | str, *, encoders: list[str] | None = None, weights: dict | None = None,
             output_dir: Path | None = None, manifest_dir: Path | None = None, progress: bool = True,
             executor: str = "serial", workers: int | None = None, scheduler: str | None = None) -> pd.DataFrame:
    """Run every unit of the profile's grid that has no row-set yet, then merge the tidy table.

    Plan, execute, merge: :func:`_plan` derives every unit's key and lists the tasks of the units not
    done (an extraction task per cell, then a probe task per unit); :func:`crsrepro.run.executor.execute`
    runs them; :meth:`~crsrepro.run.results.ResultStore.merge` concatenates the row-sets in the grid's
    order. Every executor runs the same tasks and gives the same table (DESIGN.md section 13).

    Parameters
    ----------
    profile : Profile or str
    encoders : list of str, optional
        Only these encoders (default: the profile's panel). Used to score a newcomer.
    weights : dict, optional
        ``{encoder id: weights path}`` overriding where an encoder's weights are read from.
    output_dir : path, optional
        The results folder (default: the profile's ``output_dir``).
    manifest_dir : path, optional
        Where split manifests live (default: :func:`crsrepro.core.io.manifest_dir`).
    progress : bool
        Show progress bars (the serial executor; pools log instead).
    executor : {"serial", "local", "dask"}
        ``serial``: the tasks in this process, in order (the reference); ``local``: a process pool
        (``crsrepro run``'s default); ``dask``: Dask distributed. See :mod:`crsrepro.run.executor`.
    workers : int, optional
        Worker processes of ``local`` and of a Dask LocalCluster (default: the CPU cores).
    scheduler : str, optional
        ``dask`` only: the address of a running Dask scheduler (default: a LocalCluster).

    Returns
    -------
    pandas.DataFrame
        The merged tidy table (see :mod:`crsrepro.run.results`), also written to ``results.parquet``.
    """
    from crsrepro.run.executor import execute
    from crsrepro.run.results import remove_temporaries

    profile = _as_profile(profile)
    store = ResultStore(output_dir or profile.output_path)
    _VIEWS.clear()  # data or weights may have changed since the last run in this process
    _ENCODERS.clear()
    for folder in (store.root, profile.feature_cache_path):  # what a killed run left half-written
        remove_temporaries(folder)
    keys, tasks = _plan(profile, store, encoders=encoders, weights=weights, manifest_dir=manifest_dir,
                        progress=progress and executor == "serial")
    log.info("%d row-sets for profile %s: %d tasks to run (%s executor)", len(keys), profile.name, len(tasks), executor)
    execute(tasks, executor=executor, workers=workers, scheduler=scheduler, progress=progress,
            description=f"run grid ({profile.name})")
    return store.merge(keys, attrs={"profile": profile.name, "profile_fingerprint": profile.fingerprint(),
                                    "rowset_version": str(CACHE_VERSION)})


# --------------------------------------------------------------------------- the reference frame

def frame_path(profile: Profile, manifest_dir: Path | None = None) -> Path:
    """Where the profile's frozen CRS reference frame lives: ``<data_manifests>/crs_reference_<profile>.yaml``."""
    return default_manifest_dir(manifest_dir) / f"crs_reference_{profile.name}.yaml"


def missing_runs(profile: Profile | str, results: pd.DataFrame) -> pd.DataFrame:
    """The primary runs of :func:`enumerate_runs` that ``results`` lacks (an AUROC row of the linear,
    final-layer, frozen, uncalibrated probe), one row per missing run."""
    profile = _as_profile(profile)
    expected = enumerate_runs(profile)
    have = results[(results["probe"] == LINEAR) & (results["layer"] == "final") & (results["regime"] == "frozen")
                   & (results["recalibrator"] == NO_RECALIBRATION) & (results["metric"] == "auroc")]
    merged = expected.merge(have[RUN_COLUMNS].drop_duplicates(), how="left", on=RUN_COLUMNS, indicator=True)
    return merged[merged["_merge"] == "left_only"].drop(columns="_merge").reset_index(drop=True)


def freeze_frame(profile: Profile | str, results: pd.DataFrame, *, manifest_dir: Path | None = None,
                 overwrite: bool = False):
    """Freeze the profile's CRS reference frame from a complete run and save it (``crsrepro freeze-frame``).

    The frame (DESIGN.md section 9) holds the anchors, the weights and the reliability profiles of the
    panel, and records the hash of the results it was frozen from, so that results which change later
    are noticed (:meth:`crsrepro.score.crs.ReferenceFrame.check_results`).

    Raises
    ------
    CrsreproError
        ``results`` lacks runs of the profile's grid (the message names the first missing cells), or a
        frame exists and ``overwrite`` is False.
    """
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.score.crs import ReferenceFrame

    profile = _as_profile(profile)
    missing = missing_runs(profile, results)
    if len(missing):
        gaps = missing[["encoder", "dataset", "seed"]].drop_duplicates()
        named = "; ".join(f"{r.encoder} on {r.dataset} seed {r.seed}" for r in gaps.head(5).itertuples())
        raise CrsreproError(f"profile {profile.name!r}: the run is incomplete ({len(missing)} runs missing, in "
                            f"{len(gaps)} cell-seeds: {named}{' ...' if len(gaps) > 5 else ''}); "
                            f"finish `crsrepro run --profile {profile.name}` before freezing the frame")
    path = frame_path(profile, manifest_dir)
    if path.is_file() and not overwrite:
        raise CrsreproError(f"{path} exists: a frozen frame is never silently replaced; pass --overwrite to "
                            f"re-freeze it (every published score of this profile then changes)")
    analysis = RunAnalysis(profile, results, manifest_dir=manifest_dir)
    frame = ReferenceFrame.freeze(analysis.reliability_profiles, results_hash=analysis.results_hash, description=(
        f"profile {profile.name}, panel of {len(profile.encoders)} encoders, frozen from crsrepro "
        f"{__version__} at commit {git_hash()}"))
    frame.save(path)
    log.info("froze the %s reference frame to %s", profile.name, path)
    return frame


def frame_for_book(profile: Profile | str, results: pd.DataFrame, *, manifest_dir: Path | None = None) -> Path | None:
    """The frame step of ``crsrepro book``: a demo-world profile without a frozen frame gets one, frozen
    from ``results`` (returns its path); any other profile must have been frozen by ``crsrepro
    freeze-frame`` (an error otherwise), so a book never publishes a frame frozen by accident."""
    profile = _as_profile(profile)
    path = frame_path(profile, manifest_dir)
    if path.is_file():
        return None
    if profile.data.source != "demo_world":
        raise CrsreproError(f"{path}: profile {profile.name!r} has no frozen reference frame; after a complete "
                            f"run, freeze it with `crsrepro freeze-frame --profile {profile.name}`")
    freeze_frame(profile, results, manifest_dir=manifest_dir)
    return path


def reference_frame(profile: Profile | str, *, manifest_dir: Path | None = None):
    """The profile's frozen CRS reference frame, read from ``data_manifests/`` (never written here).

    Raises
    ------
    crsrepro.score.crs.FrameError
        No frame has been frozen for the profile (``crsrepro freeze-frame --profile P`` freezes one).
    """
    from crsrepro.score.crs import ReferenceFrame

    return ReferenceFrame.load(frame_path(_as_profile(profile), manifest_dir))


def score_new_encoder(profile: Profile | str, encoder_id: str, *, weights=None, manifest_dir: Path | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """Run a newcomer through the profile's grid and score it against the frozen frame (``crsrepro score``).

    The panel is not recomputed and its published scores do not move (the frame is fixed). The
    newcomer's results go to ``<output_dir>/newcomers/<encoder id>/``.

    Raises
    ------
    CrsreproError
        No frame is frozen, or the panel's results have changed since the frame was frozen from them.
    """
    from crsrepro.score.crs import score_encoder
    from crsrepro.score.dimensions import reliability_profiles
    from crsrepro.encoders import get_spec

    profile = _as_profile(profile)
    get_spec(encoder_id)  # an unknown id fails here, before any work
    frame = reference_frame(profile, manifest_dir=manifest_dir)
    panel = ResultStore(profile.output_path).merged_path
    if panel.is_file():
        problem = frame.check_results(pd.read_parquet(panel).attrs.get("keys_hash"))
        if problem:
            raise CrsreproError(f"{problem}; re-freeze the frame (crsrepro freeze-frame --profile {profile.name} "
                                f"--overwrite) or restore the results it was frozen from")
    results = run_grid(profile, encoders=[encoder_id], weights={encoder_id: weights} if weights else None,
                       output_dir=profile.output_path / "newcomers" / encoder_id, manifest_dir=manifest_dir,
                       progress=progress)
    return score_encoder(reliability_profiles(runs_table(results)), frame)


__all__ = ["RUN_COLUMNS", "canonical_size", "cells", "conditions_for", "enumerate_runs", "frame_path",
           "frame_for_book", "freeze_frame", "missing_runs", "reference_frame", "run_grid", "score_new_encoder"]
