"""Layer-depth sweeps: linear probes on the 25 / 50 / 75 / 100 % taps (DESIGN.md section 11).

The paper's primary protocol probes the final layer; its sharpest self-criticism is that intermediate
layers often do better (5 of 8 sweeps; RAD-DINO best near 50 % depth, DINOv2 at 75 %). This module
measures that on a profile's (encoder, dataset) *pairs* (:func:`pairs`: the profile's ``depth.pairs``).

For each pair and seed, the linear probe of the run grid (:class:`crsrepro.run.units.Unit`: the seed's
own train / val split, its label subsets and the same C selection) is fitted on the features of each
depth tap, all taken in the forward pass that gives the ``final`` features and cached like them
(:func:`crsrepro.extract.features.extract_features`). Its rows go, in the tidy schema of
:mod:`crsrepro.run.results` with ``layer`` set to the tap, to a separate
:class:`~crsrepro.run.results.ResultStore` at ``<output_dir>/depth/``; each row-set's key is the grid
unit's key (which names the tap's feature keys) wrapped with the stage and the layer. Besides the grid's
metrics, the clean rows carry ``val_auroc``: the probe's AUROC on the seed's val split, the only number a
depth may be *chosen* on. The sweep scores no recalibrator [ours]: the four dimensions use the probe's
own probabilities, and the recalibrators (with their cross-validated choice inside val) were most of its
CPU time.

The taps: ``depth25/50/75`` and ``depth100`` (the last block's tokens, pooled like the other depth
taps: the like-for-like 100 % point). An encoder without a ``depth100`` tap (the demo networks, whose
``final`` *is* the pooled last stage, :data:`crsrepro.encoders.registry.NETWORK_TAPS`) has ``final``
at depth 100. ``final`` is always swept too: the primary protocol's row, for comparison.

:class:`DepthStage` is the sweep as a stage of :func:`crsrepro.run.stages.run_stages`: one task per pair
with work left. The analyses (chapter 06) are in :mod:`crsrepro.analyse.depth`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import content_key, git_hash
from crsrepro.core.schema import FINAL
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION
from crsrepro.profiles import Profile
from crsrepro.run.executor import Task
from crsrepro.run.results import ResultStore
from crsrepro.run.stages import holds_gpu
from crsrepro.run.units import (Unit, encoder, extract, feature_requests, layer_feature_keys, probe_threads,
                                score_probabilities)
from crsrepro.run.views import view

log = logging.getLogger(__name__)

DEPTHS = {"depth25": 25, "depth50": 50, "depth75": 75, "depth100": 100}
"""The depth taps and their depth in % of the network."""

STAGE = "depth"


class DepthError(CrsreproError, ValueError):
    """A depth sweep was asked for an encoder without depth taps, or a table lacks what it needs."""


def taps(spec) -> list[str]:
    """The layers swept for an encoder: its depth taps, then ``final``.

    >>> from crsrepro.encoders import get_encoder_spec
    >>> taps(get_encoder_spec("demo.random_cnn")), taps(get_encoder_spec("general.dinov2"))[-2:]
    (['depth25', 'depth50', 'depth75', 'final'], ['depth100', 'final'])
    """
    return [t for t in DEPTHS if t in spec.layer_taps] + [FINAL]


def tap_depth(spec, layer: str) -> float:
    """The depth (%) of ``layer``: :data:`DEPTHS`, and 100 for ``final`` when the encoder has no
    ``depth100`` tap (its final features are the pooled last block); NaN for a ``final`` that is a
    projection beside a ``depth100`` tap."""
    if layer in DEPTHS:
        return float(DEPTHS[layer])
    return np.nan if "depth100" in spec.layer_taps else 100.0


def pairs(profile: Profile) -> list[tuple[str, str]]:
    """The pairs a profile sweeps: its ``depth.pairs``, or, where that is null, every cell of an encoder
    with depth taps that ``depth.exclude`` does not leave out (the smoke profile: its two TinyCNNs on
    every dataset)."""
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.run.grid import cells

    if profile.depth.pairs is not None:
        return [tuple(pair) for pair in profile.depth.pairs]
    return [(e, d) for e, d in cells(profile)
            if e not in profile.depth.exclude and len(taps(get_encoder_spec(e))) > 1]


def _check_pair(profile: Profile, spec, dataset: str) -> None:
    if len(taps(spec)) < 2:
        raise DepthError(f"depth pair ({spec.id}, {dataset}): {spec.id} has no depth taps "
                         f"(its layer_taps are {list(spec.layer_taps)})")
    if dataset not in profile.datasets:
        raise DepthError(f"depth pair ({spec.id}, {dataset}): {dataset} is not among profile "
                         f"{profile.name!r}'s datasets {profile.datasets}. A profile that narrows another with "
                         f"`include` inherits its depth.pairs: name this profile's own pairs, or set "
                         f"`depth: {{pairs: null}}` to sweep every cell of an encoder with depth taps")


def _tap_features(feats_by_layer: dict, layer: str) -> dict:
    """The grid's feats dict (``{"pool": X, "test": {condition: X}, <transfer>: X}``) for one tap."""
    return {name: ({c: a[layer] for c, a in value.items()} if name == "test" else value[layer])
            for name, value in feats_by_layer.items()}


def _rowset_key(unit: Unit, tap_keys: dict, layer: str) -> str:
    """A depth row-set's key: the grid unit's key on the tap's features, with the stage and the layer."""
    return content_key(stage=STAGE, layer=layer, unit=unit.key(tap_keys), metrics=["val_auroc"], recalibrators=[])


def _unit_rows(unit: Unit, feats: dict, layer: str) -> pd.DataFrame:
    """The grid unit's rows on one tap, with ``layer`` set and the val AUROC of each fraction's probe."""
    rows, cases = [], {}
    for fraction, probe in unit.fit(feats).items():
        scored = unit.score(fraction, probe, feats, cases, recalibrate=False)
        val = score_probabilities(unit.view.task, unit.val.labels, probe.predict_proba(feats["pool"][unit.val_rows]))
        clean = next(r for r in scored if r["condition"] == CLEAN and r["recalibrator"] == NO_RECALIBRATION)
        rows += scored + [{**clean, "metric": "val_auroc", "value": float(val["auroc"])}]
    return pd.DataFrame(rows).assign(layer=layer)


@dataclass(frozen=True)
class _PairTask:
    """The inputs of one depth task: a pair, the (layer, seed, key) of its row-sets not done yet, and
    what the planning process saw of the dataset."""

    profile: Profile
    encoder: str
    dataset: str
    manifest_dir: Path | None
    images_key: str
    todo: tuple
    output_dir: Path
    progress: bool = False


def _pair_task(task: _PairTask) -> str:
    """Depth task: the pair's features at every tap (one forward pass per image), then each pending
    (tap, seed) probe fitted, scored and written."""
    from crsrepro.encoders import get_encoder_spec

    profile, spec = task.profile, get_encoder_spec(task.encoder)
    prepared = view(profile, task.dataset, task.manifest_dir, task.images_key)
    built = encoder(task.encoder, None, profile.features.device)
    requests = feature_requests(profile, prepared)
    feats = extract(profile, built, requests, task.progress, layers=tuple(taps(spec)))
    store, provenance = ResultStore(task.output_dir), {"crsrepro": __version__, "git": git_hash()}
    with probe_threads(profile.probe.num_threads):
        for layer, seed, key in task.todo:
            unit = Unit(profile, spec, prepared, seed, LINEAR)
            if _rowset_key(unit, layer_feature_keys(built, requests, layer), layer) != key:
                raise CrsreproError(f"depth {task.encoder} {task.dataset} seed {seed} {layer}: this worker derives "
                                    f"another row-set key than the planning process (other data or code?)")
            rows = _unit_rows(unit, _tap_features(feats, layer), layer).assign(rowset=key)
            rows.attrs = {**provenance, "key": key, "weights": built.weights_hash}
            store.write(key, rows)
            log.info("depth: wrote %s %s seed %d %s (%d rows)", task.encoder, task.dataset, seed, layer, len(rows))
    return f"depth {task.encoder} {task.dataset}"


@dataclass(frozen=True)
class DepthStage:
    """The layer-depth sweep as a stage (:class:`crsrepro.run.stages.Stage`), into ``<output_dir>/depth/``.

    Parameters
    ----------
    pairs : tuple of (encoder id, dataset), optional
        The pairs swept (default: :func:`pairs` of the profile).
    output_dir : path, optional
        The profile's results folder (default: its ``output_dir``); the sweep writes under ``depth/``.
    manifest_dir : path, optional
        Where the split manifests live.
    """

    pairs: tuple | None = None
    output_dir: Path | None = None
    manifest_dir: Path | None = None
    name: ClassVar[str] = STAGE
    command: ClassVar[str] = "crsrepro book"

    def store(self, profile: Profile) -> ResultStore:
        return ResultStore(Path(self.output_dir or profile.output_path) / STAGE)

    def plan(self, profile: Profile, store: ResultStore, *, progress: bool = False) -> tuple[list[str], list[Task]]:
        """Every pair's keys (pair by pair, tap by tap, seed by seed: the merged table's order) and one task
        per pair with a row-set left to write. Planning builds the encoders on the CPU (the keys need only
        their weights hash); a task builds its encoder where the profile extracts.

        Raises
        ------
        DepthError
            A pair's encoder has no depth taps, or its dataset is not in the profile.
        """
        from crsrepro.encoders import get_encoder_spec

        chosen = pairs(profile) if self.pairs is None else [tuple(pair) for pair in self.pairs]
        keys, tasks = [], []
        for encoder_id, dataset in chosen:
            spec = get_encoder_spec(encoder_id)
            _check_pair(profile, spec, dataset)
            prepared, built = view(profile, dataset, self.manifest_dir), encoder(encoder_id, None, "cpu")
            requests = feature_requests(profile, prepared)
            units = [Unit(profile, spec, prepared, seed, LINEAR) for seed in profile.seeds]
            todo = []
            for layer in taps(spec):
                tap_keys = layer_feature_keys(built, requests, layer)
                for unit in units:
                    key = _rowset_key(unit, tap_keys, layer)
                    keys.append(key)
                    if not store.has(key):
                        todo.append((layer, unit.seed, key))
            if todo:
                tasks.append(Task(f"depth:{encoder_id}:{dataset}", _pair_task,
                                  (_PairTask(profile, encoder_id, dataset, self.manifest_dir, prepared.images_key,
                                             tuple(todo), store.root, progress),), gpu=holds_gpu(profile),
                                  stage="depth"))
        return keys, tasks

    def attrs(self, profile: Profile) -> dict:
        return {"profile": profile.name, "profile_fingerprint": profile.fingerprint()}


__all__ = ["DEPTHS", "DepthError", "DepthStage", "STAGE", "pairs", "tap_depth", "taps"]
