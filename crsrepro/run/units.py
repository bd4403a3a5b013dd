"""One unit of work of the run grid, the features it reads and its key (DESIGN.md sections 5-8).

A :class:`Unit` is a (cell, seed, probe): it fits that seed's probes on that seed's own train split
(DESIGN.md section 3: every seed draws its own grouped train / val partition of the non-test pool; the
test split is fixed), scores them under every condition and returns one row-set. Its key
(:meth:`Unit.key`) is *derived from its inputs*: the keys of the feature arrays it reads (which name the
encoder, its weights, its preprocessing, the images' content, the canonical size, the condition and the
layer), the content of the seed's split and label subsets, the labels, the probe's parameters and the
row-set version. Nothing else enters it, so a changed input can never be served a stale row-set, and a
setting that changes no number (``probe.num_threads``) throws nothing away.

The frozen grid (:mod:`crsrepro.run.grid`), the depth sweep (:mod:`crsrepro.run.depth`, the same unit
on each depth tap's features) and the LoRA grid (:mod:`crsrepro.run.lora`, the unit's scoring of a
fine-tuned network) all build on it. The feature requests (:func:`feature_requests`) say which images
are embedded under which conditions; :func:`extract` embeds them (and fills the feature cache),
:func:`cached_features` reads them back.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import content_key
from crsrepro.core.schema import FINAL, FROZEN, case_key, fraction_case_key
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION, RECALIBRATORS
from crsrepro.profiles import Profile
from crsrepro.run.results import CACHE_VERSION
from crsrepro.run.views import DatasetView, Transfer, conditions_for

log = logging.getLogger(__name__)

#: The metric of a smaller label fraction's clean row whose C was chosen on the whole val split
#: instead of the fraction's val subset (the multiverse's C-budget level ``full_val``).
FULL_VAL_AUROC = "auroc_full_val"
VAL_CV_FOLDS = 5  # [ours] folds of the cross-validated ECE inside the val split (crsrepro.fit.calibration)


def canonical_size(profile: Profile) -> int:
    """The cap on the short side at which test images are degraded (DESIGN.md section 6, [ours]):
    ``canonical_size`` if the profile sets it, else the largest input size in the profile's panel, so
    that no encoder of the panel is handed fewer pixels than it takes."""
    from crsrepro.encoders import get_encoder_spec

    return profile.canonical_size or max(get_encoder_spec(e).input_size for e in profile.encoders)


def degraded_image_cache(profile: Profile) -> Path:
    """Where the degraded test images are cached, beside the feature cache: every test image is degraded
    once per condition, and every later encoder reads it (DESIGN.md section 6)."""
    return profile.feature_cache_path.parent / "degraded_images"


# --------------------------------------------------------------------------- features

@dataclass
class FeatureRequest:
    """One call to :func:`crsrepro.extract.features.extract_features`: which images, under which conditions."""

    dataset: str
    images_key: str
    images: pd.DataFrame
    conditions: tuple
    canonical_size: int | None


def feature_requests(profile: Profile, view: DatasetView) -> dict[str, FeatureRequest]:
    """The pool (clean, at its stored size), the test split (every condition, at the canonical size)
    and each transfer set (clean, at the canonical size) [ours: DESIGN.md section 6]."""
    size = canonical_size(profile)
    requests = {"pool": FeatureRequest(view.name, view.images_key, view.pool.images, (CLEAN,), None),
                "test": FeatureRequest(view.name, view.images_key, view.test.images,
                                       tuple(profile.conditions(view.name)), size)}
    for transfer in view.transfers:
        requests[transfer.name] = FeatureRequest(transfer.name, transfer.images_key, transfer.split.images,
                                                 (CLEAN,), size)
    return requests


def layer_feature_keys(encoder, requests: dict[str, FeatureRequest], layer: str = FINAL) -> dict[str, dict[str, str]]:
    """``{request: {condition: feature key}}`` of one layer's arrays (computed without extracting anything)."""
    from crsrepro.extract.features import feature_keys

    return {name: {c: key for (c, _), key in feature_keys(encoder, r.images, dataset=r.dataset,
                                                          images_key=r.images_key, conditions=r.conditions,
                                                          layers=(layer,), canonical_size=r.canonical_size).items()}
            for name, r in requests.items()}


def extract(profile: Profile, encoder, requests: dict[str, FeatureRequest], progress: bool,
            layers: tuple[str, ...] = (FINAL,)) -> dict:
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


def cached_features(profile: Profile, requests: dict[str, FeatureRequest], feature_keys: dict) -> dict:
    """One layer's arrays of :func:`extract` read back from the feature cache by their keys (no encoder):
    ``{"pool": X, "test": {condition: X}, <transfer>: X}``.

    Raises
    ------
    CrsreproError
        An entry is absent: the extraction task that writes it has not run.
    """
    from crsrepro.extract.features import read_entry

    out = {}
    for name, r in requests.items():
        by_condition = {}
        for condition in r.conditions:
            array = read_entry(profile.feature_cache_path, feature_keys[name][condition], len(r.images))
            if array is None:
                raise CrsreproError(f"feature cache {profile.feature_cache_path}: no entry "
                                    f"{feature_keys[name][condition]} ({r.dataset} {name} {condition}); "
                                    f"its extraction task has not written it")
            by_condition[condition] = array
        out[name] = by_condition if name == "test" else by_condition[CLEAN]
    return out


_ENCODERS: dict = {}  # per process: the encoder it built last


def encoder(encoder_id: str, weights, device: str):
    """:func:`crsrepro.encoders.create_encoder`, reusing the encoder this process built last."""
    from crsrepro.encoders import create_encoder

    name = (encoder_id, str(weights), device)
    if name not in _ENCODERS:
        _ENCODERS.clear()
        _ENCODERS[name] = create_encoder(encoder_id, weights=weights, device=device)
    return _ENCODERS[name]


def clear_encoder_cache() -> None:
    """Forget the encoder this process built (its weights may have changed since)."""
    _ENCODERS.clear()


@contextmanager
def probe_threads(n: int):
    """Fit with ``n`` torch threads (``probe.num_threads``: small full-batch fits run best on one), then
    give the process back its own count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- one unit of work

def score_probabilities(task: str, y: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """The metrics of one row-set row: AUROC, ECE, classwise ECE, the labels AUROC skipped, the cases."""
    from crsrepro.core.metrics import classwise_ece, expected_calibration_error, macro_auroc

    auroc, skipped = macro_auroc(y, probs, task=task, return_skipped=True)
    return {"auroc": auroc, "ece": expected_calibration_error(y, probs, task=task),
            "classwise_ece": classwise_ece(y, probs, task=task), "skipped_labels": float(skipped),
            "n_test": float(len(y))}


def _rows(base: dict, metrics: dict[str, float]) -> list[dict]:
    return [{**base, "metric": name, "value": float(value)} for name, value in metrics.items()]


def labels_key(labels: np.ndarray) -> str:
    """The content key of a label matrix (NaN, a masked label, counts as -1)."""
    return content_key(shape=list(labels.shape), values=np.nan_to_num(labels, nan=-1).astype(np.int8).tobytes().hex())


class Unit:
    """One unit of work: a (cell, seed, probe); fits its probes and returns its row-set.

    Parameters
    ----------
    profile : Profile
    spec : EncoderSpec
    view : DatasetView
        The prepared dataset (:func:`crsrepro.run.views.view`).
    seed : int
        One of the profile's seeds: its train / val split and label subsets.
    probe : str
        ``linear`` (every label fraction and condition) or a control probe (``control_probes``' fractions
        and conditions).
    """

    def __init__(self, profile: Profile, spec, view: DatasetView, seed: int, probe: str):
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

    def params(self) -> dict:
        """The parameters of this unit's probe (scikit-learn's ``get_params``) and of its recalibrators."""
        from crsrepro.fit.controls import KNNProbe, MLPProbe
        from crsrepro.fit.linear import LinearProbe

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
        """The row-set's key: a function of every input that decides its numbers, and of nothing else.
        ``feature_keys`` are :func:`layer_feature_keys` of the layer the unit reads."""
        def rows(subsets):
            return None if subsets is None else {str(f): content_key(ids=idx.tolist()) for f, idx in subsets.items()}

        transfers = {t.name: {"features": feature_keys[t.name][CLEAN], "labels": labels_key(t.split.labels),
                              "columns": t.columns.tolist()}
                     for t in self.view.transfers if t.name in self.conditions}
        return content_key(stage="rowset", version=CACHE_VERSION, encoder=self.spec.id, family=self.spec.family,
                           pool_features=feature_keys["pool"][CLEAN],
                           test_features={c: feature_keys["test"][c] for c in self.conditions if c in feature_keys["test"]},
                           transfers=transfers, seed=self.seed, seed_split=self.view.seed_hash[self.seed],
                           train_rows=content_key(rows=self.train_rows.tolist()),
                           val_rows=content_key(rows=self.val_rows.tolist()),
                           labels={"pool": labels_key(self.view.pool.labels), "test": labels_key(self.view.test.labels)},
                           train_subsets=rows({f: self.subsets[f] for f in self.fractions}),
                           val_subsets=rows(self.val_subsets), probe=self.probe, params=self.params(),
                           fractions=self.fractions, conditions=self.conditions, layer=FINAL, regime=FROZEN)

    def run(self, feats: dict) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
        """Fit and score this unit's probes; return the row-set and the per-case arrays to keep."""
        rows, cases = [], {}
        for fraction, probe in self.fit(feats).items():
            rows += self.score(fraction, probe, feats, cases)
        return pd.DataFrame(rows), cases

    def _transfer(self, condition: str) -> Transfer | None:
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

    def score(self, fraction: float, probe, feats: dict, cases: dict, *, recalibrate: bool = True) -> list[dict]:
        """The rows of one fitted probe (anything with ``predict_proba``) under every condition, from
        ``feats`` (``{"pool": X, "test": {condition: X}, <transfer>: X}``); for the full-label linear probe
        also the per-case arrays, into ``cases``, and, with ``recalibrate``, the recalibrated rows and the
        smaller fractions' clean test probabilities (the depth sweep has neither)."""
        base = dict(encoder=self.spec.id, family=self.spec.family, dataset=self.view.name, seed=self.seed,
                    label_fraction=float(fraction), probe=self.probe, layer=FINAL, regime=FROZEN,
                    probe_C=float(getattr(probe, "C_", np.nan)), converged=bool(getattr(probe, "converged_", True)),
                    c_rule=str(getattr(probe, "c_rule_", "")), c_tie=bool(getattr(probe, "c_tie_", False)),
                    hit_time_cap=bool(getattr(probe, "hit_time_cap_", False)),
                    fit_seconds=float(getattr(probe, "fit_seconds_", np.nan)))
        test_probs = {c: probe.predict_proba(self._test_features(feats, c)) for c in self.conditions}
        rows = []
        for condition, probs in test_probs.items():
            rows += _rows({**base, "condition": condition, "recalibrator": NO_RECALIBRATION},
                          score_probabilities(self.view.task, self._labels(condition), self._probs(probs, condition)))
        if self.probe == LINEAR and fraction < 1.0 and recalibrate:
            cases[fraction_case_key(fraction)] = test_probs[CLEAN]
            if getattr(probe, "full_val_", None) is not None:  # the multiverse's C-budget level, full_val
                from crsrepro.core.metrics import macro_auroc

                full_val = probe.full_val_probe().predict_proba(self._test_features(feats, CLEAN))
                rows += _rows({**base, "condition": CLEAN, "recalibrator": NO_RECALIBRATION},
                              {FULL_VAL_AUROC: macro_auroc(self._labels(CLEAN), full_val, task=self.view.task)})
        if self.probe == LINEAR and fraction == 1.0:
            val_probs = probe.predict_proba(feats["pool"][self.val_rows])
            cases.update({case_key("probs", c, NO_RECALIBRATION): self._probs(p, c) for c, p in test_probs.items()})
            cases.update({case_key("probs", "val", NO_RECALIBRATION): val_probs, case_key("labels", "val"): self.val.labels,
                          case_key("image_id", "val"): self.val.images["image_id"].to_numpy(dtype=str)})
            if recalibrate:
                rows += self._recalibrated(base, val_probs, test_probs, cases)
        return rows

    def fit(self, feats: dict) -> dict:
        """``{label fraction: fitted probe}`` on the seed's train split (``feats["pool"]``), C chosen on val."""
        from crsrepro.fit.controls import KNNProbe, MLPProbe
        from crsrepro.fit.linear import fit_linear_probes

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
                metrics = score_probabilities(self.view.task, self._labels(condition), self._probs(calibrated, condition))
                if condition == CLEAN and cv_ece:
                    metrics["val_cv_ece"] = cv_ece[name]
                rows += _rows({**base, "condition": condition, "recalibrator": name}, metrics)
                if condition == CLEAN:
                    cases[case_key("probs", CLEAN, name)] = calibrated
        return rows


def case_arrays(view: DatasetView, cases: dict) -> dict[str, np.ndarray]:
    """A unit's per-case arrays (:data:`crsrepro.run.results.CASES_LAYOUT`) with the labels and image ids
    they belong to: ``clean`` names the test split (whose images every perturbed condition degrades),
    ``val`` the seed's val split, and each transfer set its own name."""
    out = {case_key("labels", CLEAN): view.test.labels,
           case_key("image_id", CLEAN): view.test.images["image_id"].to_numpy(dtype=str)}
    for transfer in view.transfers:
        out[case_key("labels", transfer.name)] = transfer.split.labels
        out[case_key("image_id", transfer.name)] = transfer.split.images["image_id"].to_numpy(dtype=str)
    return {**out, **cases}


__all__ = ["FULL_VAL_AUROC", "FeatureRequest", "Unit", "VAL_CV_FOLDS", "cached_features", "canonical_size", "case_arrays",
           "clear_encoder_cache", "degraded_image_cache", "encoder", "extract", "feature_requests",
           "labels_key", "layer_feature_keys", "probe_threads", "score_probabilities"]
