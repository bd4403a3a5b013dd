"""The two-level CRS bootstrap (crsrepro.score.stats.crs_bootstrap): laws on synthetic benchmarks."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from crsrepro.core.metrics import expected_calibration_error, label_efficiency_retention, macro_auroc, robustness_raw
from crsrepro.score.crs import ReferenceFrame
from crsrepro.score.stats import DatasetCases, crs_bootstrap, seed_paired_bootstrap

SEEDS = 5
FRACTIONS = (0.1, 0.25)
CONDITIONS = ("blur@1", "blur@2")


def _probs(rng, labels, signal, seed_shift, case_effect):
    """Binary probabilities (N, 1) with logit (signal + seed_shift) (2y - 1) / 2 + noise, the noise N(0, 1):
    a case effect shared by every seed and probe (70 % of its variance) plus fresh noise. The population
    AUROC is Phi((signal + seed_shift) / sqrt(2))."""
    y = labels[:, 0]
    noise = np.sqrt(0.7) * case_effect + np.sqrt(0.3) * rng.normal(size=len(y))
    logits = (signal + seed_shift) * (2 * y - 1) / 2 + noise
    return (1 / (1 + np.exp(-logits)))[:, None]


def _benchmark(rng, *, n_cases=160, n_transfer=80, signals=(0.6, 1.0, 1.4, 1.8), seed_sd=0.1):
    """Per-case probabilities of len(signals) encoders on two binary datasets (one with a transfer set),
    and the per-seed profiles computed from them with the scalar metrics (the published table)."""
    cases, rows = {}, []
    for dataset in ("d1", "d2"):
        labels = (rng.random((n_cases, 1)) < 0.4).astype(float)
        transfer_labels = (rng.random((n_transfer, 1)) < 0.4).astype(float)
        z, z_transfer = rng.normal(size=n_cases), rng.normal(size=n_transfer)
        clean, perturbed, fractions, transfer = {}, {c: {} for c in CONDITIONS}, {f: {} for f in FRACTIONS}, {}
        for k, signal in enumerate(signals):
            e = f"enc{k}"
            shifts = seed_sd * rng.normal(size=SEEDS)
            clean[e] = np.stack([_probs(rng, labels, signal, shifts[s], z) for s in range(SEEDS)])
            for j, c in enumerate(CONDITIONS):
                perturbed[c][e] = np.stack([_probs(rng, labels, signal * (0.9 - 0.1 * j), shifts[s], z)
                                            for s in range(SEEDS)])
            for f in FRACTIONS:
                fractions[f][e] = np.stack([_probs(rng, labels, signal * (0.5 + f), shifts[s], z)
                                            for s in range(SEEDS)])
            if dataset == "d2":
                transfer[e] = np.stack([_probs(rng, transfer_labels, signal * 0.8, shifts[s], z_transfer)
                                        for s in range(SEEDS)])
            for s in range(SEEDS):
                auroc = macro_auroc(labels, clean[e][s], task="multilabel")
                drops = [auroc - macro_auroc(labels, perturbed[c][e][s], task="multilabel") for c in CONDITIONS]
                if dataset == "d2":
                    drops.append(auroc - macro_auroc(transfer_labels, transfer[e][s], task="multilabel"))
                by_fraction = {f: macro_auroc(labels, fractions[f][e][s], task="multilabel") for f in FRACTIONS}
                rows.append(dict(encoder=e, dataset=dataset, seed=s, auroc=auroc,
                                 ece=expected_calibration_error(labels, clean[e][s], task="multilabel"),
                                 retention=label_efficiency_retention({**by_fraction, 1.0: auroc}),
                                 robustness=robustness_raw(drops)))
        cases[dataset] = DatasetCases(task="multilabel", labels=labels, clean=clean, perturbed=perturbed,
                                      fractions=fractions,
                                      transfers={"t2": (transfer_labels, transfer)} if dataset == "d2" else {})
    profiles = pd.DataFrame(rows)
    return cases, profiles, ReferenceFrame.freeze(profiles)


@pytest.fixture(scope="module")
def bench():
    return _benchmark(np.random.default_rng(0))


def test_seed_only_variant_is_the_papers_seed_bootstrap(bench):
    cases, profiles, frame = bench
    ours = crs_bootstrap(cases, profiles, frame, n_resamples=60, rng=3, resample_cases=False, device="cpu")
    paper = seed_paired_bootstrap(profiles, frame, n_resamples=60, rng=3)
    np.testing.assert_allclose(ours.replicates.to_numpy(), paper.replicates.to_numpy(), atol=1e-9)
    pd.testing.assert_frame_equal(ours.rank_probabilities, paper.rank_probabilities)


def test_summary_intervals_hold_their_estimate_and_probabilities_sum(bench):
    cases, profiles, frame = bench
    result = crs_bootstrap(cases, profiles, frame, n_resamples=80, rng=0, device="cpu")
    table = result.summary()
    assert list(table.columns[:4]) == ["encoder", "estimate", "ci_low", "ci_high"]
    assert (table["ci_low"] <= table["estimate"]).all() and (table["estimate"] <= table["ci_high"]).all()
    assert table["p_rank1"].sum() == pytest.approx(1.0)
    assert table["p_top3"].sum() == pytest.approx(3.0)
    dims = result.dimension_intervals()
    for dim in ("auroc", "ece", "retention", "robustness"):
        assert (dims[f"{dim}_ci_low"] <= dims[dim]).all() and (dims[dim] <= dims[f"{dim}_ci_high"]).all()
    diff = result.leader_difference()
    assert diff.a == table["encoder"].iloc[0] and diff.ci_low <= diff.estimate <= diff.ci_high


def test_case_noise_widens_every_dimension(bench):
    cases, profiles, frame = bench
    two = crs_bootstrap(cases, profiles, frame, n_resamples=80, rng=0, device="cpu").dimension_intervals()
    seed = crs_bootstrap(cases, profiles, frame, n_resamples=80, rng=0, device="cpu",
                         resample_cases=False).dimension_intervals()
    for dim in ("auroc", "ece", "retention", "robustness"):
        assert (two[f"{dim}_width"] > seed[f"{dim}_width"]).mean() >= 0.75, dim


def test_cases_of_another_run_are_refused(bench):
    cases, profiles, frame = bench
    shifted = profiles.assign(auroc=profiles["auroc"] + 0.01)
    with pytest.raises(ValueError, match="do not reproduce the profiles"):
        crs_bootstrap(cases, shifted, frame, n_resamples=5, device="cpu")


def test_bad_shapes_name_the_dataset_and_encoder(bench):
    cases, profiles, frame = bench
    broken = dict(cases)
    d1 = cases["d1"]
    broken["d1"] = DatasetCases(task=d1.task, labels=d1.labels, clean={**d1.clean, "enc0": d1.clean["enc0"][:, :10]},
                                perturbed=d1.perturbed, fractions=d1.fractions, transfers=d1.transfers)
    with pytest.raises(ValueError, match="d1, clean, enc0"):
        crs_bootstrap(broken, profiles, frame, n_resamples=5, device="cpu")


@pytest.mark.slow
def test_two_level_auroc_interval_covers_the_population_value():
    """On a simulated benchmark with a known population AUROC (binormal: Phi(d / sqrt 2), averaged over the
    seed shifts), the 95 % interval of D covers it in about 95 % of benchmarks."""
    rng = np.random.default_rng(1)
    signals, seed_sd, hits, n_sims = (1.0, 1.6), 0.15, [], 60
    shifts = rng.normal(size=200_000) * seed_sd
    truth = {f"enc{k}": float(norm.cdf((s + shifts) / np.sqrt(2)).mean()) for k, s in enumerate(signals)}
    for _ in range(n_sims):
        cases, profiles, frame = _benchmark(rng, n_cases=150, n_transfer=40, signals=signals, seed_sd=seed_sd)
        dims = crs_bootstrap(cases, profiles, frame, n_resamples=200, rng=rng, device="cpu").dimension_intervals()
        for (dataset, encoder), row in dims.iterrows():
            hits.append(row["auroc_ci_low"] <= truth[encoder] <= row["auroc_ci_high"])
    assert 0.88 <= np.mean(hits) <= 0.995, np.mean(hits)


def test_chapter_tables_show_both_bootstraps_and_every_interval_holds_its_estimate(bench):
    from types import SimpleNamespace

    from crsrepro.present.report import tables

    cases, profiles, frame = bench
    analysis = SimpleNamespace(crs_bootstrap=crs_bootstrap(cases, profiles, frame, n_resamples=60, device="cpu"),
                               bootstrap=seed_paired_bootstrap(profiles, frame, n_resamples=200))
    table = tables.crs_bootstrap_table(analysis)
    assert table["published CRS"].is_monotonic_decreasing
    for prefix in ("", "seed_"):
        assert (table[f"{prefix}ci_low"] <= table[f"{prefix}estimate"]).all()
        assert (table[f"{prefix}estimate"] <= table[f"{prefix}ci_high"]).all()
        assert table[f"{prefix}p_rank1"].sum() == pytest.approx(1.0, abs=0.01)
    dims = tables.two_level_intervals(analysis)
    assert dims.index.names == ["dataset", "encoder"] and len(dims) == 8 and (dims["auroc_width"] > 0).all()


def test_coverage_with_cases_uses_the_two_level_bootstrap():
    from crsrepro.analyse.findings import seed_count_coverage

    rng = np.random.default_rng(5)
    cases, profiles, frame = _benchmark(rng, n_cases=60, n_transfer=30, signals=(0.8, 1.6))
    # 5 seeds -> subsets of 3 seeds
    seed_only = seed_count_coverage(profiles, frame, n_seeds=3, n_subsets=4, n_resamples=50, rng=0)
    two_level = seed_count_coverage(profiles, frame, n_seeds=3, n_subsets=4, n_resamples=50, rng=0, cases=cases)
    assert seed_only.attrs["bootstrap"] == "seeds" and two_level.attrs["bootstrap"] == "seeds x cases"
    assert two_level["mean_width"].iloc[0] > seed_only["mean_width"].iloc[0]


# ---------------------------------------------------------------- end to end: the grid's store -> RunAnalysis
TINY = {"datasets": ["aptos2019", "chexpert"], "transfer": {"chexpert": "mimic_cxr"},
        "encoders": ["demo.color_histogram", "demo.pixel_pca", "demo.texture"], "seeds": [0, 1],
        "label_fractions": [0.25, 1.0], "perturbations": ["jpeg"], "severities": [3], "control_probes": {"probes": []},
        "demo_world": {"n_images": {"aptos2019": 150, "chexpert": 200, "mimic_cxr": 80}},
        "bootstrap": {"n_resamples": 200, "n_case_resamples": 40}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_grid):
    yield from tiny_grid(tmp_path_factory, "crs_bootstrap", TINY, freeze=True)


@pytest.mark.slow
def test_run_analysis_resamples_the_stored_float64_cases_of_every_dimension(tiny):
    cases = tiny.dataset_cases("chexpert")
    assert cases.clean["demo.pixel_pca"].dtype == np.float64 and cases.clean["demo.pixel_pca"].shape[0] == 2
    assert list(cases.perturbed) == ["jpeg@3"] and list(cases.fractions) == [0.25] and list(cases.transfers) == ["mimic_cxr"]
    result = tiny.crs_bootstrap  # the identity check inside: the stored cases reproduce the profile table
    assert result.n_resamples == 40
    summary = result.summary()
    assert set(summary["encoder"]) == set(TINY["encoders"])
    assert ((summary["ci_low"] <= summary["estimate"]) & (summary["estimate"] <= summary["ci_high"])).all()
    pd.testing.assert_series_equal(summary.set_index("encoder")["plug_in"].sort_index(),
                                   tiny.aggregate["crs"].sort_index(), check_names=False)


@pytest.mark.slow
def test_another_kernel_reads_the_bootstraps_instead_of_running_them_again(tiny, monkeypatch):
    """Chapter 05 and the claims page run in their own kernels, and an edited chapter 05 runs again: the
    two-level bootstrap, the coverage check and their inputs are computed once per run and read after."""
    from crsrepro.analyse import findings
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.score import stats

    first = tiny.crs_bootstrap.summary()
    coverage = tiny.seed_count_coverage(1, 2, two_level=True, n_resamples=20)
    monkeypatch.setattr(stats, "crs_bootstrap", lambda *a, **k: pytest.fail("bootstrapped a second time"))
    monkeypatch.setattr(findings, "seed_count_coverage", lambda *a, **k: pytest.fail("covered a second time"))
    again = RunAnalysis(tiny.profile, tiny.results, manifest_dir=tiny.manifest_dir, rng=tiny.rng)
    pd.testing.assert_frame_equal(again.crs_bootstrap.summary(), first)
    pd.testing.assert_frame_equal(again.seed_count_coverage(1, 2, two_level=True, n_resamples=20), coverage)
    with pytest.raises(pytest.fail.Exception, match="second time"):  # other replicates: computed
        again.seed_count_coverage(1, 2, two_level=True, n_resamples=21)
    with pytest.raises(pytest.fail.Exception, match="second time"):  # another resampling seed: computed
        RunAnalysis(tiny.profile, tiny.results, manifest_dir=tiny.manifest_dir, rng=1).crs_bootstrap
