"""One analysis object per run: what every chapter and the claims page read (DESIGN.md section 12).

:class:`RunAnalysis` holds a profile's merged results table and computes, once each and on first use,
everything the book shows: the runs table, the per-seed and per-cell reliability profiles, the frozen
reference frame, the CRS scores and their aggregate, the rank agreement, the seed-paired bootstrap and
every analysis of the paper. Chapters and the claims page read the same object, so they cannot show
two different numbers for one quantity, and nothing is computed twice.

>>> from crsrepro.analyse.run_analysis import RunAnalysis
>>> analysis = RunAnalysis.load("smoke")          # doctest: +SKIP
>>> analysis.aggregate.head(3)                     # doctest: +SKIP

It only *reads* what the stages produced (:mod:`crsrepro.run.stages`): :meth:`RunAnalysis.load` reads
``<output_dir>/results.parquet``, and :attr:`RunAnalysis.depth` and :attr:`RunAnalysis.lora_results` the
depth sweep's and the LoRA grid's merged tables. A table that is missing, or that was merged for another
version of the profile, is an error naming the command that produces it (``crsrepro run``, or ``crsrepro
book``, which runs every stage before the chapters). Reading never writes the frame either: ``crsrepro
freeze-frame`` does.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.core.schema import case_key, is_transfer
from crsrepro.core.vocab import CLEAN, MEDICAL_FAMILIES, NO_RECALIBRATION
from crsrepro.profiles import Profile, as_profile
from crsrepro.run.results import ResultStore, results_hash, runs_table
from crsrepro.run.stages import read_stage

logger = logging.getLogger(__name__)


class RunAnalysis:
    """The analyses of one run of a profile, computed on first use and cached.

    Parameters
    ----------
    profile : Profile or str
    results : DataFrame
        The tidy results table (:mod:`crsrepro.run.results`).
    manifest_dir : path, optional
        Where the frozen frame and manifests live (:func:`crsrepro.core.io.manifest_dir`).
    rng : int, default 0
        The seed of every resampling analysis (bootstrap, insertion experiment).
    """

    def __init__(self, profile: Profile | str, results: pd.DataFrame, *, manifest_dir: Path | None = None,
                 rng: int = 0):
        self.profile = as_profile(profile)
        self.results = results
        self.manifest_dir = manifest_dir
        self.rng = rng

    @classmethod
    def load(cls, profile: Profile | str, *, manifest_dir: Path | None = None, rng: int = 0) -> "RunAnalysis":
        """The analysis of ``profile``'s merged results (:func:`crsrepro.run.stages.read_stage` of the grid).

        Raises
        ------
        CrsreproError
            The results are missing, corrupt or were merged for another version of the profile: run
            ``crsrepro run --profile NAME``.
        """
        from crsrepro.run.grid import GridStage

        profile = as_profile(profile)
        return cls(profile, read_stage(profile, GridStage()), manifest_dir=manifest_dir, rng=rng)

    # ------------------------------------------------------------------ the tables
    @cached_property
    def results_hash(self) -> str:
        """The hash of the results table (:func:`crsrepro.run.results.results_hash`)."""
        return results_hash(self.results)

    @cached_property
    def runs(self) -> pd.DataFrame:
        """One row per run, one column per metric, without the transfer conditions that the profile keeps
        out of robustness (:func:`crsrepro.score.frame.scored_runs`)."""
        from crsrepro.score.frame import scored_runs

        return scored_runs(self.profile, self.results)

    @cached_property
    def all_runs(self) -> pd.DataFrame:
        """Every run, including transfer sets outside robustness (e.g. NIH ChestX-ray14)."""
        return runs_table(self.results)

    @cached_property
    def reliability_profiles(self) -> pd.DataFrame:
        """Per (encoder, dataset, seed): the four raw dimensions (DESIGN.md section 8)."""
        from crsrepro.score.dimensions import reliability_profiles

        return reliability_profiles(self.runs)

    @cached_property
    def cell_means(self) -> pd.DataFrame:
        """Per (encoder, dataset): the four raw dimensions averaged over seeds."""
        from crsrepro.score.crs import cell_means

        return cell_means(self.reliability_profiles)

    # ------------------------------------------------------------------ the frame and the CRS
    @cached_property
    def frame(self):
        """The profile's frozen reference frame (read only; :func:`crsrepro.score.frame.freeze_frame` writes it)."""
        from crsrepro.score.frame import reference_frame

        return reference_frame(self.profile, manifest_dir=self.manifest_dir)

    @cached_property
    def frame_warning(self) -> str | None:
        """A one-line warning when the frame was frozen from other results than these, else None."""
        message = self.frame.check_results(self.results_hash)
        if message:
            message += (f"; the scores below are against that frame. Re-freeze it with `crsrepro freeze-frame "
                        f"--profile {self.profile.name} --overwrite` if these results are the new reference")
            logger.warning(message)
        return message

    @cached_property
    def scores(self) -> pd.DataFrame:
        """The CRS and its components per cell, against the frozen frame."""
        from crsrepro.score.crs import crs_scores

        return crs_scores(self.reliability_profiles, self.frame)

    @cached_property
    def aggregate(self) -> pd.DataFrame:
        """Per encoder: mean CRS and AUROC over its cells, with both ranks, best CRS first."""
        from crsrepro.score.crs import aggregate_crs

        return aggregate_crs(self.scores)

    @cached_property
    def rank_agreement(self):
        """AUROC order vs CRS order: Kendall tau-b, Spearman rho, reversed pairs, rank shifts."""
        from crsrepro.score.stats import rank_agreement

        return rank_agreement(self.aggregate["auroc"].to_dict(), self.aggregate["crs"].to_dict())

    @cached_property
    def bootstrap(self):
        """The seed-paired bootstrap (``bootstrap.n_resamples`` replicates, DESIGN.md section 10)."""
        from crsrepro.score.stats import seed_paired_bootstrap

        return seed_paired_bootstrap(self.reliability_profiles, self.frame,
                                     n_resamples=self.profile.bootstrap.n_resamples, rng=self.rng)

    @cached_property
    def seed_variance(self) -> pd.DataFrame:
        """Per cell, the SD over seeds of each dimension (DESIGN.md section 3: a seed must vary D, C and R)."""
        from crsrepro.score.stats import seed_variance

        return seed_variance(self.reliability_profiles)

    @cached_property
    def has_seed_variance(self) -> bool:
        """Whether D, C and R vary across seeds in every cell: the seed bootstrap's intervals mean
        something only then (the claims page marks its bootstrap claims comparable only if so)."""
        from crsrepro.score.stats import has_seed_variance

        return has_seed_variance(self.reliability_profiles)

    def case_probabilities(self, dataset: str, *, condition: str = CLEAN, recalibrator: str = NO_RECALIBRATION):
        """The full-label linear probe's per-case probabilities of every encoder on ``dataset`` under a
        test ``condition``, as stored by the grid (:data:`crsrepro.run.results.CASES_LAYOUT`; the seeds' val
        splits differ in size, so read them with :meth:`crsrepro.run.results.ResultStore.read_cases`).

        Returns
        -------
        labels : array
            The test labels (``(N,)`` class ids or ``(N, L)`` with NaN masked), the same for every encoder.
        probs : dict
            ``{encoder: float64 array (seeds, N, K)}``, seeds in ``profile.seeds`` order.
        """
        from crsrepro.analyse.operating_points import full_label_rowsets

        store = ResultStore(self.profile.output_path)
        keys = full_label_rowsets(self, dataset)  # raises when there is no full-label linear probe
        cases = condition if is_transfer(condition) else CLEAN  # the test split (CASES_LAYOUT)
        labels, probs = None, {}
        for encoder in sorted(keys.index.get_level_values("encoder").unique()):
            arrays = [store.read_cases(keys[(encoder, seed)]) for seed in self.profile.seeds]
            labels = arrays[0][case_key("labels", cases)]
            probs[encoder] = np.stack([a[case_key("probs", condition, recalibrator)] for a in arrays])
        return labels, probs

    def dataset_cases(self, dataset: str):
        """The stored per-case test probabilities that :attr:`crs_bootstrap` resamples on ``dataset``
        (:class:`crsrepro.score.stats.DatasetCases`): the full-label linear probe on the clean split, on
        every perturbed condition and on every transfer set that enters robustness, and the probes of the
        smaller fractions on the clean split; seeds in ``profile.seeds`` order."""
        from crsrepro.analyse.operating_points import full_label_rowsets
        from crsrepro.core.schema import fraction_case_key, is_perturbation
        from crsrepro.data import get_dataset_spec
        from crsrepro.score.dimensions import select_runs
        from crsrepro.score.stats import DatasetCases

        if "rowset" not in self.results.columns:
            raise CrsreproError("these results name no row-sets, so they have no stored per-case probabilities")
        runs = select_runs(self.runs)
        runs = runs[(runs["dataset"] == dataset) & (runs["label_fraction"] == 1.0)]
        perturbed = sorted(c for c in runs["condition"].unique() if is_perturbation(c))
        transfers = sorted(c for c in runs["condition"].unique() if is_transfer(c))
        fractions = [f for f in self.profile.label_fractions if f < 1.0]
        store = ResultStore(self.profile.output_path)
        keys = full_label_rowsets(self, dataset)
        labels, transfer_labels = None, {}
        clean, by_condition, by_fraction, by_transfer = {}, {c: {} for c in perturbed}, {f: {} for f in fractions}, \
            {t: {} for t in transfers}
        for encoder in sorted(keys.index.get_level_values("encoder").unique()):
            arrays = [store.read_cases(keys[(encoder, seed)]) for seed in self.profile.seeds]

            def stack(name):
                if name not in arrays[0]:
                    raise CrsreproError(f"{encoder} on {dataset}: the stored cases lack {name!r} (cases written by an "
                                        f"older version): rerun `crsrepro run --profile {self.profile.name}`")
                return np.stack([a[name] for a in arrays])

            labels = arrays[0][case_key("labels", CLEAN)]
            clean[encoder] = stack(case_key("probs", CLEAN, NO_RECALIBRATION))
            for c in perturbed:
                by_condition[c][encoder] = stack(case_key("probs", c, NO_RECALIBRATION))
            for f in fractions:
                by_fraction[f][encoder] = stack(fraction_case_key(f))
            for t in transfers:
                transfer_labels[t] = arrays[0][case_key("labels", t)]
                by_transfer[t][encoder] = stack(case_key("probs", t, NO_RECALIBRATION))
        return DatasetCases(task=get_dataset_spec(dataset).task, labels=labels, clean=clean, perturbed=by_condition,
                            fractions=by_fraction,
                            transfers={t: (transfer_labels[t], by_transfer[t]) for t in transfers})

    @cached_property
    def crs_bootstrap(self):
        """The two-level CRS bootstrap, seeds x test cases in one shared draw (chapter 05's headline;
        :func:`crsrepro.score.stats.crs_bootstrap`, ``bootstrap.n_case_resamples`` replicates, on the GPU
        when there is one): P(rank 1), P(top 3), CRS intervals (``summary()``: ``encoder, estimate,
        ci_low, ci_high``), the leader-minus-runner-up difference and every dimension's interval.

        Chapter 05 and the claims page read it, each in its own kernel, so it is computed once
        (:meth:`computed_once`)."""
        from crsrepro.score.stats import crs_bootstrap

        def compute():
            cases = {dataset: self.dataset_cases(dataset) for dataset in self.profile.datasets}
            return crs_bootstrap(cases, self.reliability_profiles, self.frame,
                                 n_resamples=self.profile.bootstrap.n_case_resamples, rng=self.rng)

        return self.computed_once("crs_bootstrap", compute)

    def seed_count_coverage(self, n_seeds: int = 5, n_subsets: int = 40, *, two_level: bool = False,
                            n_resamples: int = 1000):
        """How often an ``n_seeds``-seed bootstrap interval contains this run's all-seed estimate
        (:func:`crsrepro.analyse.findings.seed_count_coverage`; needs a run with many seeds, such as the
        ``demo-seeds20`` profile): the paper's seed bootstrap, or with ``two_level`` the bootstrap over
        seeds and test cases. The frame is frozen in memory from this run's own panel.

        It is kept on disk (:meth:`computed_once`), so that chapter 05, edited and executed again, reads it
        instead of running its bootstraps again."""
        from crsrepro.analyse.findings import seed_count_coverage
        from crsrepro.score.crs import ReferenceFrame

        def compute():
            cases = {d: self.dataset_cases(d) for d in self.profile.datasets} if two_level else None
            return seed_count_coverage(self.reliability_profiles, ReferenceFrame.freeze(self.reliability_profiles),
                                       n_seeds=n_seeds, n_subsets=n_subsets, n_resamples=n_resamples, rng=self.rng,
                                       cases=cases)

        return self.computed_once("seed_count_coverage", compute, n_seeds=n_seeds, n_subsets=n_subsets,
                                  two_level=two_level, n_resamples=n_resamples)

    # ------------------------------------------------------------------ the paper's analyses
    @cached_property
    def insertion(self):
        """The insertion experiment: 3 encoders into a panel, fixed anchors vs cohort normalisation.
        Chapter 05 and the claims page read it, so it is computed once (:meth:`computed_once`)."""
        from crsrepro.analyse.findings import insertion_experiment

        n_encoders = self.reliability_profiles["encoder"].nunique()
        if n_encoders < 5:
            raise CrsreproError(f"the insertion experiment needs at least 5 encoders, this run has {n_encoders}")
        return self.computed_once("insertion", lambda: insertion_experiment(
            self.reliability_profiles, panel_size=min(12, n_encoders - 3), rng=self.rng))

    def external_validity(self, source: str = "chexpert", target: str = "mimic_cxr"):
        """CRS without the transfer term vs transfer AUROC, against source AUROC, with encoder-bootstrap
        intervals of both rhos and their difference (DESIGN.md section 10)."""
        from crsrepro.analyse.findings import external_validity

        return external_validity(self.runs, source=source, target=target, rng=self.rng)

    @cached_property
    def leave_one_dataset_out(self) -> pd.DataFrame:
        """Per held-out dataset, the other datasets' CRS vs its AUROC, with encoder-bootstrap intervals."""
        from crsrepro.analyse.findings import leave_one_dataset_out

        return leave_one_dataset_out(self.scores, rng=self.rng)

    @cached_property
    def control_agreement(self) -> pd.DataFrame:
        """AUROC rank agreement of the MLP and k-NN controls with the linear probe, per dataset."""
        from crsrepro.analyse.findings import control_probe_agreement

        return control_probe_agreement(self.runs)

    @cached_property
    def probe_conclusions(self) -> pd.DataFrame:
        """AUROC vs CRS rank agreement under the linear probe and each control (DESIGN.md section 7)."""
        from crsrepro.analyse.findings import probe_conclusions

        return probe_conclusions(self.runs)

    @cached_property
    def recalibration(self):
        """ECE before and after each recalibrator, per cell and overall."""
        from crsrepro.analyse.findings import recalibration_summary

        return recalibration_summary(self.runs)

    @cached_property
    def ece_floor(self) -> pd.DataFrame:
        """Per dataset: how far the probes' clean ECE is above what calibrated probabilities would show.

        For every encoder, the full-label linear probe's clean test ECE before recalibration (the seed mean of
        :attr:`recalibration`'s cells) beside :func:`crsrepro.core.metrics.calibrated_ece_floor` of the same
        probabilities on the same test split (seed mean); per dataset the medians over encoders and the median
        relative ECE change of temperature scaling. Where the ECE is near its floor there is little left for a
        recalibrator to remove (chapter 02).
        """
        from crsrepro.core.metrics import calibrated_ece_floor
        from crsrepro.data import get_dataset_spec

        temperature = self.recalibration.cells.query("recalibrator == 'temperature'").set_index(["dataset", "encoder"])
        rows = []
        for dataset in self.profile.datasets:
            task = get_dataset_spec(dataset).task
            labels, probs = self.case_probabilities(dataset)
            cells = temperature.loc[dataset].loc[list(probs)]
            floor = [np.mean([calibrated_ece_floor(labels, p, task=task, rng=self.rng) for p in seeds])
                     for seeds in probs.values()]
            rows.append({"dataset": dataset, "n_test": len(labels), "ece_median": float(cells["ece_before"].median()),
                         "floor_median": float(np.median(floor)),
                         "above_floor_median": float(np.median(cells["ece_before"].to_numpy() - floor)),
                         "temperature_relative_reduction_median": float(cells["relative_reduction"].median())})
        return pd.DataFrame(rows).set_index("dataset")

    @cached_property
    def degradation(self):
        """ECE rise and AUROC drop under the perturbations, and their correlation over cells."""
        from crsrepro.analyse.findings import calibration_under_degradation

        return calibration_under_degradation(self.runs)

    def transfer_test(self, source: str = "chexpert", target: str = "mimic_cxr"):
        """Welch's t-test on transfer AUROC, medical-pretrained vs general encoders."""
        from crsrepro.analyse.findings import welch_transfer_test

        return welch_transfer_test(self.all_runs, source=source, target=target, medical_families=MEDICAL_FAMILIES)

    @cached_property
    def aulc_vs_retention(self):
        from crsrepro.analyse.findings import aulc_vs_retention

        return aulc_vs_retention(self.runs)

    def absolute_label_efficiency(self, fraction: float = 0.01, reference_encoder: str = "general.vit_b16"):
        from crsrepro.analyse.findings import absolute_label_efficiency

        return absolute_label_efficiency(self.runs, fraction=fraction, reference_encoder=reference_encoder)

    # ------------------------------------------------------------------ layer depth and LoRA (chapters 06, 07)
    @cached_property
    def depth(self) -> pd.DataFrame:
        """The layer-depth sweep's per-seed profiles (chapter 06; :func:`crsrepro.analyse.depth.depth_profiles`
        of the rows :class:`crsrepro.run.depth.DepthStage` wrote; read, never computed)."""
        from crsrepro.analyse.depth import depth_profiles
        from crsrepro.run.depth import DepthStage

        return depth_profiles(read_stage(self.profile, DepthStage()))

    @cached_property
    def lora_results(self) -> pd.DataFrame:
        """The LoRA grid's tidy rows (regime ``lora``; written by :class:`crsrepro.run.lora.LoraStage`;
        read, never trained)."""
        from crsrepro.run.lora import LoraStage

        return read_stage(self.profile, LoraStage())

    @cached_property
    def lora(self):
        """Frozen vs LoRA (chapter 07): :func:`crsrepro.analyse.lora.compare` of the LoRA profiles and the
        frozen ones with retention over the same label fractions, each regime ranked among its own peers
        (the frozen-peer version beside it), with the frame's anchors."""
        from crsrepro.analyse.lora import compare, frozen_profiles, lora_profiles

        return compare(frozen_profiles(self.runs, self.lora_results), lora_profiles(self.lora_results),
                       frame=self.frame)

    # ------------------------------------------------------------------ analyses several chapters read
    def shared_key(self, **inputs) -> str | None:
        """The key of an analysis kept on disk for every chapter that reads it (:meth:`computed_once`):
        the row-sets of the results (:attr:`results_hash`), the profile's fingerprint, the resampling seed,
        every file in the manifest folder (frozen frame, splits, the claims ledger), every file of the
        package (:func:`crsrepro.core.io.package_digest`, so no cached page survives a code change) and
        the analysis's own ``inputs``. None for a results table built by hand (no row-sets), which is
        never cached."""
        from crsrepro.core.io import content_key, folder_digest, manifest_dir, package_digest

        if "rowset" not in self.results.columns and not self.results.attrs.get("keys_hash"):
            return None
        return content_key(results=self.results_hash, profile=self.profile.fingerprint(), rng=self.rng,
                           manifests=folder_digest(manifest_dir(self.manifest_dir)), package=package_digest(),
                           inputs=inputs)

    def computed_once(self, name: str, compute, **inputs):
        """``compute()``, kept in ``<output_dir>/analysis/<name>-<key>.pkl`` under :meth:`shared_key` of
        ``inputs`` [ours]: the book executes each chapter in its own kernel, two side by side, so an
        analysis that several chapters read (the claims table, the multiverse, the subgroup table, the
        operating points) is computed by the first and read by the others
        (:func:`crsrepro.core.io.computed_once`: the second waits on a lock, then reads)."""
        from crsrepro.core.io import computed_once

        key = self.shared_key(**inputs)
        if key is None:
            return compute()
        return computed_once(self.profile.output_path / "analysis" / f"{name}-{key[:16]}.pkl", compute)

    # ------------------------------------------------------------------ the sensitivity chapter
    @cached_property
    def multiverse(self) -> pd.DataFrame:
        """Every combination of the declared [ours] choices, re-scored (:func:`crsrepro.analyse.sensitivity.multiverse`).

        It is the book's costliest analysis (about a minute on the demo) and two pages read it (chapter 05b
        and the claims page, each in its own kernel), so it is computed once (:meth:`computed_once`).
        """
        from crsrepro.analyse.sensitivity import multiverse

        return self.computed_once("multiverse", lambda: multiverse(self, rng=self.rng))
