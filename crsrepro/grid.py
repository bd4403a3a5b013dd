"""The run grid: what is fitted and scored, and in which order (DESIGN.md section 7).

One *run* is (encoder, dataset, seed, label fraction, test condition). The conditions are ``clean``,
the perturbations ``<name>@<severity>``, and, for a dataset with a transfer target (CheXpert), the
transfer set (``mimic_cxr``) scored without retraining. :func:`enumerate_runs` lists them; for the
``paper`` profile that is the paper's 17,575 runs = 3,515 seed-aggregated rows x 5 seeds over 43
encoder-dataset cells.

:func:`run_grid` executes them on one machine. A probe is fitted once per (cell, seed, fraction) and
scored under every condition; the linear probes of all fractions of one (cell, seed) are fitted in
one batched call. The unit of work, and of resume, is (cell, seed, probe): it writes one row-set to
the :class:`~crsrepro.results.ResultStore`, keyed by the content hash of everything that changes its
numbers, and is skipped when that row-set exists. Features come from the content-addressed cache of
:mod:`crsrepro.features`, so a crashed run resumes without recomputing anything it finished.

Beyond the paper's frozen linear-probe grid, the same units also write

- the control probes (``mlp``, ``knn``) at ``control_probes.label_fractions`` and
  ``control_probes.conditions`` (DESIGN.md section 7), and
- the four recalibrators (DESIGN.md section 8), fitted on the val split (the calibration subset) of the
  full-label linear probe and scored under every condition, in rows whose ``recalibrator`` is not
  ``none``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro import __version__
from crsrepro.errors import CrsreproError
from crsrepro.profiles import Profile, load_profile
from crsrepro.results import CACHE_VERSION, ResultStore, content_key, git_hash, runs_table

log = logging.getLogger(__name__)

LINEAR = "linear"
RECALIBRATORS = ("temperature", "vector", "isotonic", "dirichlet")
RUN_COLUMNS = ["encoder", "dataset", "seed", "label_fraction", "condition"]


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
    """The conditions a probe trained on ``dataset`` is scored under (clean, perturbations, transfer)."""
    transfer = profile.transfer.get(dataset)
    return profile.conditions() + ([transfer] if transfer else [])


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


@dataclass
class _Split:
    """The images and labels of one split of a dataset."""

    images: pd.DataFrame
    labels: np.ndarray


@dataclass
class _DatasetView:
    """A prepared dataset: its splits, task and manifest hash, plus its transfer set if any."""

    name: str
    task: str
    label_names: list[str]
    manifest_hash: str
    splits: dict[str, _Split]
    transfer: tuple[str, str, _Split] | None  # (dataset id, manifest hash, split)


def _split_hash(table: pd.DataFrame) -> str:
    return content_key(ids=table["image_id"].tolist(), splits=table["split"].tolist())


def _prepare(profile: Profile, dataset: str, manifest_dir: Path | None, progress: bool) -> _DatasetView:
    from crsrepro.data import label_matrix, prepare_dataset

    table = prepare_dataset(profile, dataset, manifest_dir=manifest_dir, progress=progress)
    splits = {}
    for split in ("train", "val", "test"):
        part = table[table["split"] == split]
        if part.empty:
            raise CrsreproError(f"{dataset}: the {split} split is empty (profile {profile.name!r})")
        part.attrs = table.attrs
        splits[split] = _Split(part.reset_index(drop=True), label_matrix(part))
    transfer = None
    if dataset in profile.transfer:
        target = profile.transfer[dataset]
        ttable = prepare_dataset(profile, target, manifest_dir=manifest_dir, progress=progress)
        if list(ttable.attrs["label_names"]) != list(table.attrs["label_names"]):
            raise CrsreproError(f"{target}: its labels {ttable.attrs['label_names']} are not {dataset}'s "
                                f"{table.attrs['label_names']}; a probe cannot be transferred")
        transfer = (target, _split_hash(ttable), _Split(ttable.reset_index(drop=True), label_matrix(ttable)))
    return _DatasetView(dataset, table.attrs["task"], list(table.attrs["label_names"]), _split_hash(table),
                        splits, transfer)


def _features(profile: Profile, encoder, view: _DatasetView, progress: bool) -> dict:
    """Clean train/val features, test features under every condition, and clean transfer features."""
    from crsrepro.features import extract_features

    options = dict(layers=("final",), cache_dir=profile.feature_cache_path, batch_size=profile.features["batch_size"],
                   num_workers=profile.features["num_workers"], progress=progress)

    def extract(dataset, manifest_hash, images, conditions):
        out = extract_features(encoder, images, dataset=dataset, manifest_hash=manifest_hash,
                               conditions=tuple(conditions), canonical_size=profile.canonical_size_for(dataset),
                               **options)
        return {condition: out[(condition, "final")] for condition in conditions}

    feats = {split: extract(view.name, view.manifest_hash, view.splits[split].images, ["clean"])["clean"]
             for split in ("train", "val")}
    feats["test"] = extract(view.name, view.manifest_hash, view.splits["test"].images, profile.conditions())
    if view.transfer:
        target, target_hash, split = view.transfer
        feats["test"][target] = extract(target, target_hash, split.images, ["clean"])["clean"]
    return feats


def _score(task: str, y: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    from crsrepro.metrics import classwise_ece, expected_calibration_error, macro_auroc

    auroc, skipped = macro_auroc(y, probs, task=task, return_skipped=True)
    return {"auroc": auroc, "ece": expected_calibration_error(y, probs, task=task),
            "classwise_ece": classwise_ece(y, probs, task=task), "skipped_labels": float(skipped),
            "n_test": float(len(y))}


def _rows(base: dict, metrics: dict[str, float]) -> list[dict]:
    return [{**base, "metric": name, "value": float(value)} for name, value in metrics.items()]


class _Unit:
    """One unit of work: a (cell, seed, probe); fits its probes and returns its row-set."""

    def __init__(self, profile: Profile, spec, view: _DatasetView, seed: int, probe: str):
        self.profile, self.spec, self.view, self.seed, self.probe = profile, spec, view, seed, probe
        control = profile.control_probes
        self.fractions = profile.label_fractions if probe == LINEAR else control["label_fractions"]
        self.conditions = (conditions_for(profile, view.name) if probe == LINEAR
                           else [c for c in conditions_for(profile, view.name) if c in control["conditions"]])

    def key(self, weights_hash: str) -> str:
        return content_key(stage="run", version=CACHE_VERSION, encoder=self.spec.id, weights=weights_hash,
                           preprocessing=self.spec.preprocessing, dataset=self.view.name,
                           manifest=self.view.manifest_hash,
                           transfer_manifest=self.view.transfer[1] if self.view.transfer else None,
                           seed=self.seed, probe=self.probe, probe_options=self.profile.probe,
                           fractions=self.fractions, conditions=self.conditions, layer="final", regime="frozen",
                           u_policy=self.profile.data["u_policy"])

    def run(self, feats: dict, memo: dict) -> pd.DataFrame:
        """Fit and score this unit's probes. ``memo`` holds the cell's scored fits by (probe, fraction,
        label subset[, seed for the MLP]): a fit that does not depend on the seed (the deterministic
        linear and k-NN probes on the same subset, such as the full train split) is computed once per
        cell and its rows are reused for every seed, with identical numbers."""
        from crsrepro.data.manifests import label_subsets

        subsets = label_subsets(self.view.splits["train"].labels, fractions=self.profile.label_fractions,
                                seed=self.seed, task=self.view.task)
        rows, todo = [], {}
        for fraction in self.fractions:
            index = np.asarray(subsets[fraction])
            key = (self.probe, fraction, content_key(index=index.tolist()), self.seed if self.probe == "mlp" else None)
            if key in memo:
                rows += [{**row, "seed": self.seed} for row in memo[key]]
            else:
                todo[fraction] = (index, key)
        if todo:
            probes = self._fit(feats, {fraction: index for fraction, (index, _) in todo.items()})
            for fraction, probe in probes.items():
                memo[todo[fraction][1]] = scored = self._scored(fraction, probe, feats)
                rows += scored
        return pd.DataFrame(rows)

    def _scored(self, fraction: float, probe, feats: dict) -> list[dict]:
        base = dict(encoder=self.spec.id, family=self.spec.family, dataset=self.view.name, seed=self.seed,
                    label_fraction=float(fraction), probe=self.probe, layer="final", regime="frozen",
                    probe_C=float(getattr(probe, "C_", np.nan)), converged=bool(getattr(probe, "converged_", True)),
                    hit_time_cap=bool(getattr(probe, "hit_time_cap_", False)),
                    fit_seconds=float(getattr(probe, "fit_seconds_", np.nan)))
        test_probs = {c: probe.predict_proba(feats["test"][c]) for c in self.conditions}
        rows = []
        for condition, probs in test_probs.items():
            rows += _rows({**base, "condition": condition, "recalibrator": "none"},
                          _score(self.view.task, self._labels(condition), probs))
        if self.probe == LINEAR and fraction == 1.0:
            rows += self._recalibrated(base, probe.predict_proba(feats["val"]), self.view.splits["val"].labels,
                                       test_probs)
        return rows

    def _labels(self, condition: str) -> np.ndarray:
        transfer = self.view.transfer
        return transfer[2].labels if transfer and condition == transfer[0] else self.view.splits["test"].labels

    def _fit(self, feats: dict, subsets: dict[float, np.ndarray]) -> dict:
        from crsrepro.probes import KNNProbe, MLPProbe, fit_linear_probes

        train, val = self.view.splits["train"], self.view.splits["val"]
        options = self.profile.probe
        if self.probe == LINEAR:
            return fit_linear_probes(feats["train"], train.labels, subsets, feats["val"], val.labels,
                                     task=self.view.task, c_grid=options["c_grid"], backend=options["backend"],
                                     device=options["device"], max_iter=options["max_iter"],
                                     time_cap_s=options["time_cap_s"], progress=False)
        if self.probe == "mlp":  # the same device and compute-time cap as the linear probe
            make = lambda: MLPProbe(task=self.view.task, device=options["device"],  # noqa: E731
                                    time_cap_s=options["time_cap_s"], random_state=self.seed)
        else:
            make = lambda: KNNProbe(task=self.view.task)  # noqa: E731
        return {f: make().fit(feats["train"][idx], train.labels[idx], X_val=feats["val"], y_val=val.labels,
                              standardize_with=feats["train"])
                for f, idx in subsets.items()}

    def _recalibrated(self, base: dict, val_probs: np.ndarray, val_labels: np.ndarray, test_probs: dict) -> list:
        from crsrepro.calibration import make_recalibrator

        rows = []
        for name in RECALIBRATORS:
            recalibrator = make_recalibrator(name).fit(val_probs, val_labels)
            for condition, probs in test_probs.items():
                rows += _rows({**base, "condition": condition, "recalibrator": name},
                              _score(self.view.task, self._labels(condition), recalibrator.predict_proba(probs)))
        return rows


def run_grid(profile: Profile | str, *, encoders: list[str] | None = None, weights: dict | None = None,
             output_dir: Path | None = None, manifest_dir: Path | None = None, progress: bool = True) -> pd.DataFrame:
    """Run every unit of the profile's grid that has no row-set yet, then merge the tidy table.

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
        Where split manifests live (default: ``data_manifests/`` in the working directory).
    progress : bool
        Show progress bars.

    Returns
    -------
    pandas.DataFrame
        The merged tidy table (see :mod:`crsrepro.results`), also written to ``results.parquet``.
    """
    import torch
    from tqdm import tqdm

    from crsrepro.encoders import create_encoder, get_spec

    profile = _as_profile(profile)
    store = ResultStore(output_dir or profile.output_path)
    probes = [LINEAR] + list(profile.control_probes["probes"])
    keys = []
    views: dict[str, _DatasetView] = {}
    loaded: dict[str, object] = {}  # each encoder is built once, whatever the number of its cells
    provenance = {"crsrepro": __version__, "git": git_hash()}
    for encoder_id, dataset in tqdm(cells(profile, encoders), desc=f"run grid ({profile.name})", unit="cell", disable=not progress):
        if dataset not in views:
            views[dataset] = _prepare(profile, dataset, manifest_dir, progress)
        view = views[dataset]
        if encoder_id not in loaded:
            loaded[encoder_id] = create_encoder(encoder_id, weights=(weights or {}).get(encoder_id),
                                                device=profile.features["device"])
        encoder = loaded[encoder_id]
        units = [_Unit(profile, get_spec(encoder_id), view, seed, probe)
                 for seed in profile.seeds for probe in probes]
        unit_keys = [unit.key(encoder.weights_hash) for unit in units]
        keys += unit_keys
        pending = [(unit, key) for unit, key in zip(units, unit_keys) if not store.has(key)]
        if not pending:
            continue
        feats, memo = _features(profile, encoder, view, progress), {}
        threads = torch.get_num_threads()
        torch.set_num_threads(profile.probe["num_threads"])  # small full-batch fits run best on one thread
        try:
            for unit, key in pending:
                rows = unit.run(feats, memo)
                rows.attrs = {**provenance, "key": key, "weights": encoder.weights_hash,
                              "manifest": view.manifest_hash}  # pandas keeps attrs in the parquet metadata
                store.write(key, rows)
                log.info("wrote %s %s seed %d %s (%d rows)", encoder_id, dataset, unit.seed, unit.probe, len(rows))
        finally:
            torch.set_num_threads(threads)
    log.info("crsrepro %s: %d row-sets for profile %s", __version__, len(keys), profile.name)
    return store.merge(keys)


def frame_path(profile: Profile, manifest_dir: Path | None = None) -> Path:
    """Where the profile's frozen CRS reference frame lives: ``data_manifests/crs_reference_<profile>.yaml``."""
    return Path(manifest_dir or "data_manifests").absolute() / f"crs_reference_{profile.name}.yaml"


def reference_frame(profile: Profile | str, results: pd.DataFrame | None = None, *,
                    manifest_dir: Path | None = None):
    """The profile's frozen CRS reference frame, frozen from ``results`` on first use (DESIGN.md section 9).

    A frame is only ever frozen from a run of the profile on real features, never from printed numbers.
    Once frozen it is read back (its hash checked) and never silently replaced: delete the file to
    re-freeze it.
    """
    from crsrepro.crs import ReferenceFrame, cell_profiles

    profile = _as_profile(profile)
    path = frame_path(profile, manifest_dir)
    if path.is_file() or results is None:
        return ReferenceFrame.load(path)
    frame = ReferenceFrame.freeze(cell_profiles(runs_table(results)), description=(
        f"profile {profile.name}, panel of {len(profile.encoders)} encoders, frozen from crsrepro "
        f"{__version__} at commit {git_hash()}"))
    frame.save(path)
    return frame


def score_new_encoder(profile: Profile | str, encoder_id: str, *, weights=None, manifest_dir: Path | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """Run a newcomer through the profile's grid and score it against the frozen frame (``crsrepro score``).

    The panel is not recomputed and its published scores do not move (the frame is fixed). The
    newcomer's results go to ``<output_dir>/newcomers/<encoder id>/``.
    """
    from crsrepro.crs import cell_profiles, score_encoder
    from crsrepro.encoders import get_spec

    profile = _as_profile(profile)
    get_spec(encoder_id)  # an unknown id fails here, before any work
    frame = reference_frame(profile, manifest_dir=manifest_dir)
    results = run_grid(profile, encoders=[encoder_id], weights={encoder_id: weights} if weights else None,
                       output_dir=profile.output_path / "newcomers" / encoder_id, manifest_dir=manifest_dir,
                       progress=progress)
    return score_encoder(cell_profiles(runs_table(results)), frame)
