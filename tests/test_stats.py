"""Tests of the rank statistics and the paired bootstraps (DESIGN.md section 10)."""

import time

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from crsrepro.score.crs import DEFAULT_ANCHORS, DIMENSIONS, ProfileTableError, ReferenceFrame, aggregate_crs, crs_scores
from crsrepro.core.metrics import macro_auroc
from crsrepro.score.stats import (weighted_macro_auroc, case_paired_bootstrap, has_seed_variance, rank_agreement,
                                  rank_correlations, seed_paired_bootstrap, seed_variance)

import torch


def synthetic_per_seed(n_encoders=15, datasets=("isic2019", "aptos2019", "chexpert"), n_seeds=5, noise=0.01,
                       rng=0, quality=None):
    """Per-seed profiles: encoder i has a latent quality; seeds add independent noise."""
    rng = np.random.default_rng(rng)
    quality = np.linspace(0.0, 1.0, n_encoders) if quality is None else np.asarray(quality)
    rows = []
    for d in datasets:
        base = rng.uniform(-0.1, 0.1, size=(n_encoders, 4))
        for s in range(n_seeds):
            for i in range(n_encoders):
                q = quality[i] + base[i] + rng.normal(0, noise, 4)
                rows.append(dict(encoder=f"e{i:02d}", dataset=d, seed=s, auroc=0.6 + 0.3 * q[0],
                                 ece=0.2 - 0.15 * q[1], retention=0.7 + 0.25 * q[2], robustness=0.8 + 0.18 * q[3]))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- rank agreement

@pytest.mark.parametrize("seed", range(5))
def test_rank_agreement_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=12)
    b = a + rng.normal(scale=1.0, size=12)
    if seed % 2:  # ties in both
        a, b = np.round(a, 0), np.round(b, 0)
    names = [f"e{i}" for i in range(12)]
    r = rank_agreement(dict(zip(names, a)), dict(zip(names, b)))
    assert r.kendall_tau == pytest.approx(sps.kendalltau(a, b, variant="b").statistic, abs=1e-12)
    assert r.spearman_rho == pytest.approx(sps.spearmanr(a, b).statistic, abs=1e-12)
    assert r.n_pairs == 66
    i, j = np.triu_indices(12, 1)
    assert r.reversed_pairs == int(np.sum((a[i] - a[j]) * (b[i] - b[j]) < 0))


def test_rank_correlations_is_rank_agreement_for_every_row():
    """The vectorised core gives, row by row, rank_agreement's numbers to the last bit (rho as numpy.corrcoef)."""
    rng = np.random.default_rng(4)
    a = np.round(rng.normal(size=12), 1)
    b = a + rng.normal(scale=1.0, size=(20, 12))
    b[::3] = np.round(b[::3])  # ties in some rows
    b[1] = 0.5  # a constant ranking: tau and rho are NaN
    names = [f"e{i}" for i in range(12)]
    tau, rho, reversed_pairs = rank_correlations(a, b)
    assert tau.shape == rho.shape == reversed_pairs.shape == (20,)
    for k in range(20):
        r = rank_agreement(dict(zip(names, a)), dict(zip(names, b[k])))
        np.testing.assert_array_equal([tau[k], rho[k], reversed_pairs[k]],
                                      [r.kendall_tau, r.spearman_rho, r.reversed_pairs])
        if k != 1:
            assert rho[k] == np.corrcoef(sps.rankdata(a), sps.rankdata(b[k]))[0, 1]
    assert np.isnan(tau[1]) and np.isnan(rho[1])


def test_tau_identity_for_15_untied_encoders():
    rng = np.random.default_rng(1)
    names = [f"e{i}" for i in range(15)]
    for _ in range(20):
        a, b = rng.permutation(15), rng.permutation(15)
        r = rank_agreement(dict(zip(names, a)), dict(zip(names, b)))
        assert r.n_pairs == 105
        assert r.kendall_tau == pytest.approx((105 - 2 * r.reversed_pairs) / 105, abs=1e-12)
    # the paper: tau 0.600 <=> 21 of 105 pairs reversed; 21 adjacent swaps give exactly that
    order = list(range(15))
    for k in [0, 2, 4, 6, 8, 10, 12]:  # 7 disjoint swaps reverse 7 pairs ...
        order[k], order[k + 1] = order[k + 1], order[k]
    r = rank_agreement(dict(zip(names, range(15))), dict(zip(names, order)))
    assert r.reversed_pairs == 7 and r.kendall_tau == pytest.approx(91 / 105)
    shifted = list(range(15))
    shifted[0:7] = [6, 0, 1, 2, 3, 4, 5]  # ... moving one encoder 6 places reverses 6 pairs
    r = rank_agreement(dict(zip(names, range(15))), dict(zip(names, shifted)))
    assert r.reversed_pairs == 6 and r.mean_abs_rank_shift == pytest.approx(12 / 15)


def test_rank_agreement_top3_and_errors():
    a = {"p": 0.70, "m": 0.70, "g": 0.69, "x": 0.5, "y": 0.4}
    b = {"p": 0.909, "m": 0.908, "g": 0.5, "x": 0.6, "y": 0.4}
    r = rank_agreement(a, b)
    assert r.top3_overlap == pytest.approx(2 / 3)
    assert r.ranks.loc["x", "shift"] == 4 - 3  # 4th under a, 3rd under b: rises by one
    with pytest.raises(ValueError, match="same encoders"):
        rank_agreement(a, {"p": 1.0})
    with pytest.raises(ValueError, match="finite"):
        rank_agreement({"a": 1.0, "b": np.nan}, {"a": 1.0, "b": 0.0})


# --------------------------------------------------------------------------- seed-paired bootstrap

def test_seed_bootstrap_laws_and_dominant_encoder():
    per_seed = synthetic_per_seed(n_encoders=6, noise=0.05)
    frame = ReferenceFrame.freeze(per_seed)
    dominant = pd.DataFrame([dict(encoder="best", dataset=d, seed=s, auroc=0.999, ece=0.0, retention=1.0,
                                  robustness=1.0) for d in ("isic2019", "aptos2019", "chexpert") for s in range(5)])
    result = seed_paired_bootstrap(pd.concat([per_seed, dominant]), frame, n_resamples=2000, rng=0)
    assert result.p_rank1.sum() == pytest.approx(1.0)
    assert result.p_top3.sum() == pytest.approx(3.0)
    assert result.p_rank1["best"] == 1.0 and result.p_top3["best"] == 1.0
    np.testing.assert_allclose(result.rank_probabilities.sum(axis=0), 1.0)
    assert result.replicates.shape == (2000, 7)
    est = aggregate_crs(crs_scores(pd.concat([per_seed, dominant]), frame))["crs"]
    np.testing.assert_allclose(result.estimate.to_numpy(), est.reindex(result.estimate.index).to_numpy())
    # the replicates scatter around the estimate
    assert abs(result.replicates.mean() - result.estimate).max() < 0.05
    d = result.paired_diff_ci("best", "e05")
    assert d.ci_low > 0 and d.ci_low <= d.ci_high
    again = seed_paired_bootstrap(pd.concat([per_seed, dominant]), frame, n_resamples=2000, rng=0)
    pd.testing.assert_frame_equal(result.replicates, again.replicates)


def test_seed_bootstrap_equals_crs_of_resampled_means():
    """A replicate is the CRS of the resampled panel against the same replicate's peers (frame's anchors
    and weights), i.e. a frame frozen from the resampled profiles; peers="frozen" keeps the frozen peers."""
    per_seed = synthetic_per_seed(n_encoders=5, n_seeds=4, noise=0.1, rng=3)
    frame = ReferenceFrame.freeze(per_seed)
    paired = seed_paired_bootstrap(per_seed, frame, n_resamples=8, rng=7)
    frozen = seed_paired_bootstrap(per_seed, frame, n_resamples=8, rng=7, peers="frozen")
    draws = np.random.default_rng(7).integers(0, 4, size=(8, 4))
    for r, draw in enumerate(draws):
        resampled = pd.concat([per_seed[per_seed["seed"] == s].assign(seed=k) for k, s in enumerate(draw)])
        own = aggregate_crs(crs_scores(resampled, ReferenceFrame.freeze(resampled)))["crs"]
        np.testing.assert_allclose(paired.replicates.iloc[r], own.reindex(paired.replicates.columns), atol=1e-12)
        fixed = aggregate_crs(crs_scores(resampled, frame))["crs"]
        np.testing.assert_allclose(frozen.replicates.iloc[r], fixed.reindex(frozen.replicates.columns), atol=1e-12)
    assert np.abs(paired.replicates - frozen.replicates).to_numpy().max() > 1e-3  # the two estimands differ here
    pd.testing.assert_series_equal(paired.estimate, frozen.estimate)  # the published point estimate is shared
    with pytest.raises(ValueError, match="peers must be one of"):
        seed_paired_bootstrap(per_seed, frame, n_resamples=8, peers="fixed")


def test_identity_draw_reproduces_the_published_estimate():
    """With the frame frozen from the same profiles, the draw 'every seed once' gives exactly ``estimate``."""
    per_seed = synthetic_per_seed(n_encoders=5, n_seeds=3, noise=0.1, rng=4)
    frame = ReferenceFrame.freeze(per_seed)
    result = seed_paired_bootstrap(per_seed, frame, n_resamples=400, rng=0)
    identity = np.flatnonzero((np.sort(np.random.default_rng(0).integers(0, 3, size=(400, 3)), 1)
                               == [0, 1, 2]).all(1))
    assert len(identity) > 0
    np.testing.assert_allclose(result.replicates.iloc[identity], np.tile(result.estimate, (len(identity), 1)),
                               atol=1e-12)


def test_seed_bootstrap_needs_every_seed_in_every_cell():
    per_seed = synthetic_per_seed(n_encoders=3, n_seeds=3)
    frame = ReferenceFrame.freeze(per_seed)
    with pytest.raises(ProfileTableError, match="e00, dataset isic2019\\) has seeds \\[1, 2\\], expected every seed"):
        seed_paired_bootstrap(per_seed.iloc[1:], frame, n_resamples=10)
    with pytest.raises(ProfileTableError, match="missing column seed"):
        seed_paired_bootstrap(per_seed.drop(columns="seed"), frame, n_resamples=10)


def test_seed_bootstrap_ci_coverage_with_40_units():
    """Percentile CI of a paired CRS difference covers the truth ~95 % of the time with 40 seeds."""
    truth_profiles = synthetic_per_seed(n_encoders=4, datasets=("isic2019",), n_seeds=1, noise=0.0, rng=5)
    frame = ReferenceFrame.freeze(truth_profiles)
    truth = aggregate_crs(crs_scores(truth_profiles, frame))["crs"]
    true_diff = truth["e02"] - truth["e01"]
    rng = np.random.default_rng(11)
    covered, n_rep = 0, 120
    for _ in range(n_rep):
        noisy = pd.concat([truth_profiles.assign(seed=s) for s in range(40)], ignore_index=True)
        noisy[["auroc", "retention"]] += rng.normal(0, 0.01, size=(len(noisy), 2))
        ci = seed_paired_bootstrap(noisy, frame, n_resamples=250, rng=rng).paired_diff_ci("e02", "e01")
        covered += ci.ci_low <= true_diff <= ci.ci_high
    assert 0.88 <= covered / n_rep <= 0.995


def _shared_effect_panel(truth, n_seeds, shared_sd, own_sd, rng):
    """Per-seed profiles around normalised ``truth`` {encoder: p}: a seed effect shared by every encoder
    (an easy or a hard split, one shift per dimension) plus a small effect of each encoder's own."""
    encoders = list(truth)
    lo = np.array([DEFAULT_ANCHORS[d][0] for d in DIMENSIONS])
    hi = np.array([DEFAULT_ANCHORS[d][1] for d in DIMENSIONS])
    p = (np.array([truth[e] for e in encoders])[None] + rng.normal(0, shared_sd, (n_seeds, 1, 4))
         + rng.normal(0, own_sd, (n_seeds, len(encoders), 4)))
    raw = lo + p * (hi - lo)
    return pd.DataFrame({"encoder": np.tile(encoders, n_seeds), "dataset": "isic2019",
                         "seed": np.repeat(np.arange(n_seeds), len(encoders)),
                         **{d: raw[..., k].ravel() for k, d in enumerate(DIMENSIONS)}})


def test_paired_peers_ci_covers_and_is_narrower_under_a_shared_seed_effect():
    """DESIGN.md section 10: with a shared seed effect the resampled-peers interval of A - B is far narrower than the
    frozen-peers one and covers the true difference at about the nominal 95 % over repeated panels."""
    truth = {"A": [0.72, 0.68, 0.70, 0.66], "B": [0.69, 0.65, 0.67, 0.63], "C": [0.70, 0.62, 0.64, 0.72],
             "D": [0.66, 0.62, 0.64, 0.60]}  # gaps of 0.03: the Pareto order is stable under the own effect
    truth_table = _shared_effect_panel(truth, 1, 0.0, 0.0, np.random.default_rng(0))
    true = aggregate_crs(crs_scores(truth_table, ReferenceFrame.freeze(truth_table)))["crs"]
    true_diff = true["A"] - true["B"]
    rng = np.random.default_rng(0)
    covered, widths = 0, {"resampled": [], "frozen": []}
    n_panels = 80
    for i in range(n_panels):
        per_seed = _shared_effect_panel(truth, 40, 0.1, 0.004, rng)
        frame = ReferenceFrame.freeze(per_seed)
        ci = seed_paired_bootstrap(per_seed, frame, n_resamples=200, rng=rng).paired_diff_ci("A", "B")
        covered += ci.ci_low <= true_diff <= ci.ci_high
        widths["resampled"].append(ci.ci_high - ci.ci_low)
        if i < 10:
            frozen = seed_paired_bootstrap(per_seed, frame, n_resamples=200, rng=rng, peers="frozen")
            ci = frozen.paired_diff_ci("A", "B")
            widths["frozen"].append(ci.ci_high - ci.ci_low)
    assert 0.86 <= covered / n_panels <= 0.99
    assert np.mean(widths["resampled"]) < 0.2 * np.mean(widths["frozen"])


def test_seed_bootstrap_is_vectorised_fast():
    per_seed = synthetic_per_seed()
    frame = ReferenceFrame.freeze(per_seed)
    t0 = time.perf_counter()
    seed_paired_bootstrap(per_seed, frame, n_resamples=10000)
    assert time.perf_counter() - t0 < 20  # seconds, not minutes (benchmarks/bootstrap.py measures it)


# --------------------------------------------------------------------------- case-level bootstrap

def test_weighted_auroc_matches_macro_auroc_on_resampled_cases():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60)
    p = np.round(rng.dirichlet(np.ones(3), 60), 1)  # rounding makes ties
    onehot = torch.as_tensor(np.eye(3)[y], dtype=torch.float64)
    counts = torch.ones(1, 60, dtype=torch.float64)
    assert float(weighted_macro_auroc(onehot, torch.as_tensor(p), counts)[0]) == pytest.approx(
        macro_auroc(y, p, task="multiclass"), abs=1e-12)
    idx = rng.integers(0, 60, 60)
    counts = torch.as_tensor(np.bincount(idx, minlength=60)[None], dtype=torch.float64)
    assert float(weighted_macro_auroc(onehot, torch.as_tensor(p), counts)[0]) == pytest.approx(
        macro_auroc(y[idx], p[idx], task="multiclass"), abs=1e-12)
    ml = rng.integers(0, 2, (60, 4)).astype(float)
    ml[rng.random((60, 4)) < 0.2] = np.nan
    s = rng.random((60, 4))
    assert float(weighted_macro_auroc(torch.as_tensor(ml), torch.as_tensor(s), counts)[0]) == pytest.approx(
        macro_auroc(ml[idx], s[idx], task="multilabel"), abs=1e-12)


def test_case_bootstrap_paired_ci_coverage_and_sharing():
    """Two encoders whose scores differ on 200 cases: CIs cover the population difference, paired draws."""
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 200)
    good = np.stack([1 - (y + rng.normal(0, 0.8, 200)), y + rng.normal(0, 0.8, 200)], 1)
    result = case_paired_bootstrap(y, {"good": good, "same": good.copy()}, task="multiclass", n_resamples=300,
                                   rng=0, progress=False)
    assert result.replicates.shape == (300, 2)
    np.testing.assert_array_equal(result.replicates["good"], result.replicates["same"])  # same indices
    assert result.paired_diff_ci("good", "same").ci_high == 0.0
    # coverage of the AUROC itself against a large-sample truth
    covered = 0
    for rep in range(40):
        y = rng.integers(0, 2, 120)
        s = np.stack([-y - rng.normal(0, 1.0, 120), y + rng.normal(0, 1.0, 120)], 1)
        r = case_paired_bootstrap(y, {"e": s}, task="multiclass", n_resamples=200, rng=rep, progress=False)
        low, high = np.quantile(r.replicates["e"], [0.025, 0.975])
        covered += low <= sps.norm.cdf(1 / np.sqrt(2)) <= high  # AUROC of N(0,1) vs N(1,1)
    assert covered >= 34


# --------------------------------------------------------------------------- seed variance

def test_seed_variance_and_its_check():
    per_seed = synthetic_per_seed(n_encoders=3, n_seeds=4, noise=0.02, rng=8)
    table = seed_variance(per_seed)
    assert len(table) == 9 and (table["n_seeds"] == 4).all()
    cell = per_seed[(per_seed["encoder"] == "e01") & (per_seed["dataset"] == "chexpert")]
    row = table[(table["encoder"] == "e01") & (table["dataset"] == "chexpert")].iloc[0]
    assert row["sd_ece"] == pytest.approx(np.std(cell["ece"], ddof=1))
    assert has_seed_variance(per_seed)
    # the degenerate grid of DESIGN.md section 10: every seed a copy of seed 0 except for retention
    copies = per_seed.copy()
    first = copies[copies["seed"] == 0].set_index(["encoder", "dataset"])
    for d in ("auroc", "ece", "robustness"):
        copies[d] = first[d].reindex(pd.MultiIndex.from_frame(copies[["encoder", "dataset"]])).to_numpy()
    assert not has_seed_variance(copies)
    assert (seed_variance(copies)["sd_retention"] > 0).all()
    one_flat = per_seed.copy()
    one_flat.loc[(one_flat["encoder"] == "e02") & (one_flat["dataset"] == "isic2019"), "ece"] = 0.1
    assert not has_seed_variance(one_flat)  # one cell without variance in C is enough
    assert not has_seed_variance(per_seed[per_seed["seed"] == 0])  # one seed: no variance to speak of
    with pytest.raises(ProfileTableError, match="missing column seed"):
        seed_variance(per_seed.drop(columns="seed"))


def test_an_ece_interval_never_goes_below_zero_and_still_holds_its_estimate():
    """A small, well-calibrated ECE: the basic interval's bias correction would print a negative bound
    (chapter 09 showed ``after 0.031 [-0.008, 0.063]``); an ECE value is floored at 0, an ECE change is not."""
    from crsrepro.score.stats import bootstrap_interval

    replicates = np.array([0.02, 0.03, 0.05, 0.06, 0.08])  # resampling inflates a binned ECE
    unfloored = bootstrap_interval(0.03, replicates, level=0.9, method="basic")
    assert unfloored[1] < 0
    estimate, low, high = bootstrap_interval(0.03, replicates, level=0.9, method="basic", floor=0.0)
    assert 0.0 == low <= estimate <= high and high == unfloored[2]
    change = bootstrap_interval(-0.01, replicates - 0.05, level=0.9, method="basic")
    assert change[1] < 0  # a change may be negative
