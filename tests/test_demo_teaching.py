"""The demo world teaches (DESIGN.md section 12): recorded on the demo profile's CACHED results, never run here.

On the paper's fixed anchors (DESIGN.md section 9) the demo panel's cells must span the anchor
ranges, their CRS values must spread over most of [0, 1], temperature scaling must lower ECE on
average (the paper's headline, DESIGN.md section 8), and a random network must not lead the CRS
ranking. These are properties of the demo world's generator (:mod:`crsrepro.data.demo_world`) and of
the demo panel together, so they are checked on a complete demo run (``crsrepro run --profile demo``
or ``make book``), which this test only reads. It is skipped, saying why, when there is none.
The demo panel meets them since its domain CNNs are pretrained long enough, with acquisition
augmentation, to be better than their random twin (:mod:`crsrepro.encoders.demo_pretrain`). Retention is
held to a smaller span (:data:`MIN_SPAN`): see :data:`RETENTION_FLOOR`.
"""

import pandas as pd
import pytest

from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.score.crs import DIMENSIONS, NORMALISED
from crsrepro.score.frame import frame_path, missing_runs
from crsrepro.profiles import load_profile
from crsrepro.run.results import ResultStore

pytestmark = pytest.mark.slow

RANDOM_NETWORKS = ("demo.random_cnn", "demo.random_vit")
SPECIALISTS = {"isic2019": "demo.derm_cnn", "aptos2019": "demo.fundus_cnn", "chexpert": "demo.cxr_cnn"}
MIN_CRS_RANGE = 0.6       # the cells' CRS values cover at least this much of [0, 1]
#: Retention cannot span its anchors [0.5, 1] on any panel whose few-label probes beat chance:
#: AUROC_f >= 0.5 makes retention >= 0.5 / AUROC_100, i.e. >= 0.53-0.77 for the demo's full-label
#: AUROCs of 0.65-0.95, and a few-label probe on features that carry any signal stays well above
#: chance. The chapter on label efficiency says so; the other dimensions must cover half their range.
RETENTION_FLOOR = "retention >= 0.5 / AUROC_100 unless a few-label probe is worse than chance"
MIN_SPAN = {"p_auroc": 0.5, "p_ece": 0.5, "p_retention": 0.25, "p_robustness": 0.5}


@pytest.fixture(scope="module")
def demo():
    """The analysis of the demo profile's cached results, against its frozen frame."""
    profile = load_profile("demo")
    path = ResultStore(profile.output_path).merged_path
    if not path.is_file():
        pytest.skip(f"no demo results at {path}: run `crsrepro run --profile demo` (or `make book`) first")
    results = pd.read_parquet(path)
    if results.attrs.get("profile_fingerprint") != profile.fingerprint():
        pytest.skip(f"{path} was computed for another version of the demo profile: rerun `crsrepro run --profile demo`")
    missing = missing_runs(profile, results)
    if len(missing):
        pytest.skip(f"{path} is incomplete ({len(missing)} runs missing): finish `crsrepro run --profile demo`")
    if not frame_path(profile).is_file():
        pytest.skip(f"no frozen demo frame at {frame_path(profile)}: `crsrepro freeze-frame --profile demo`")
    analysis = RunAnalysis(profile, results)
    if analysis.frame_warning:
        pytest.skip(analysis.frame_warning)
    return analysis


def test_cells_span_the_anchor_ranges(demo):
    normalised = demo.scores[list(NORMALISED)]
    span = normalised.max() - normalised.min()
    assert all(span[c] >= MIN_SPAN[c] for c in NORMALISED), (
        f"normalised spans {span.round(2).to_dict()}; raw cell means:\n{demo.cell_means[list(DIMENSIONS)].describe()}")


def test_crs_spreads_over_most_of_the_unit_interval(demo):
    crs = demo.scores["crs"]
    assert crs.max() - crs.min() >= MIN_CRS_RANGE, crs.describe()


def test_temperature_scaling_lowers_ece_on_average(demo):
    summary = demo.recalibration.summary
    assert summary.loc["temperature", "mean_absolute_drop"] > 0, summary


def test_at_least_99_percent_of_the_linear_probes_converge(demo):
    """Issue 24.5 on the demo profile (tests/test_book.py checks the smoke grid)."""
    from crsrepro.analyse.probe_health import MAX_UNCONVERGED, convergence_table

    table = convergence_table(demo.results)
    assert table.loc["all", "unconverged_share"] <= MAX_UNCONVERGED, table


def test_a_random_network_does_not_lead(demo):
    leaders = demo.aggregate.index[demo.aggregate["rank_crs"] == 1]
    assert not set(leaders) & set(RANDOM_NETWORKS), demo.aggregate


def test_pretraining_beats_random_features_of_the_same_architecture(demo):
    """Each domain CNN has a higher CRS than the random CNN (the same TinyCNN, untrained) in its own
    domain, and the broad medical CNN has a higher aggregate CRS than every random or classical extractor."""
    crs = demo.scores.set_index(["encoder", "dataset"])["crs"]
    for dataset, specialist in SPECIALISTS.items():
        assert crs[specialist, dataset] > crs["demo.random_cnn", dataset], (dataset, crs.xs(dataset, level=1))
    general = [e for e in demo.aggregate.index if e.startswith(("demo.random", "demo.pixel", "demo.color", "demo.texture"))]
    assert demo.aggregate.loc["demo.med_cnn", "crs"] > demo.aggregate.loc[general, "crs"].max(), demo.aggregate


#: Measured on the demo book of 2026-12-05 (commit 1afb78e): the older patients' mean AUROC gap minus the
#: younger ones' is -0.017 on ISIC (105 and 130 test cases) and -0.070 on CheXpert. Until the random baselines
#: were redrawn portably (1afb78e) ISIC gave -0.006 and this was a strict xfail: the pretrained panel, trained
#: with contrast and noise augmentation, barely notices the older patients' lower contrast and added noise,
#: so ISIC finds the planted effect by a narrow margin.
@pytest.mark.parametrize("dataset", ["isic2019", "chexpert"])
def test_the_planted_subgroup_effect_is_found(demo, dataset):
    """DESIGN.md section 14: the demo world plants worse images for patients aged 60 or more (ISIC and CheXpert
    look-alikes); the subgroup analysis finds older patients' AUROC lower on average over the panel."""
    from crsrepro.analyse.subgroups import older_patients_gap, subgroup_table

    gaps = older_patients_gap(subgroup_table(demo, attributes=("age_group",), n_resamples=200))
    assert gaps.loc[dataset, "difference"] < -0.01, gaps


# ------------------------------------------------------------------------------------------------------
# One teaching test per qualitative finding of the paper that the demo world's design makes possible
# (issue 27.4), each with the paper's sentence (../shared/seed/000_e17ff5654a74f3ba.txt, the review of the
# paper; DESIGN.md section 10). A finding the demo cannot show is a strict xfail whose reason names the
# measured cause; the same cause is in that chapter's "where this run differs" box.
#
# 1. "The AUROC and CRS rankings disagree": some encoder pairs are reversed (chapter 05).
# 2. "Medical-pretrained encoders lead both rankings" (chapters 01 and 05).
# 3. "Temperature scaling lowers ECE by 54-77 % at no AUROC cost": lower in most cells with mean AUROC
#    within 0.005, and by >= 30 % in most cells (chapter 02).
# 4. "Under perturbation calibration degrades more than discrimination, and the two losses correlate
#    only moderately (r = 0.63)" (chapter 04).
# 5. "Medical encoders transfer better to the unseen hospital than general ones" (Welch p < 0.05,
#    chapter 04).
# 6. "AULC tracks full-label AUROC (rho 0.986) while retention does not (0.339)" (chapter 03).
# 7. "An intermediate layer often beats the last one": after the Holm correction, in at least one pair
#    (chapter 06).
# 8. "LoRA raises mean AUROC (+0.010 to +0.030)", "and reorders the middle of the ranking" (chapter 07).
# ------------------------------------------------------------------------------------------------------

MEDICAL = ("medical", "specialist")  # crsrepro.core.vocab.MEDICAL_FAMILIES: the paper's "medical-pretrained"


def _family(encoder: str) -> str:
    from crsrepro.encoders import get_encoder_spec

    return get_encoder_spec(encoder).family


def test_finding_1_auroc_and_crs_rankings_disagree(demo):
    """The paper: ranking by CRS reorders encoders that AUROC alone would rank otherwise."""
    agreement = demo.rank_agreement
    assert agreement.reversed_pairs > 0 and agreement.kendall_tau < 1, agreement


def test_finding_2_medical_pretrained_encoders_lead_both_rankings(demo):
    """The paper: medical-pretrained encoders take the first places by AUROC and by CRS."""
    aggregate = demo.aggregate
    for rank in ("rank_auroc", "rank_crs"):
        leader = aggregate.index[aggregate[rank] == aggregate[rank].min()][0]
        assert _family(leader) in MEDICAL, (rank, leader, aggregate)


def test_finding_3_temperature_scaling_lowers_ece_in_most_cells_at_no_auroc_cost(demo):
    """The paper: temperature scaling lowers ECE and leaves AUROC unchanged."""
    cells = demo.recalibration.cells
    temperature = cells[cells["recalibrator"] == "temperature"]
    assert float((temperature["absolute_drop"] > 0).mean()) > 0.5, temperature.sort_values("relative_reduction")
    assert abs(temperature["auroc_change"].mean()) <= 0.005, temperature["auroc_change"].describe()


#: Measured on the demo book of 2026-12-05, commit 1afb78e (RunAnalysis.ece_floor, recalibration.cells).
TEMPERATURE_REASON = (
    "temperature scaling lowers ECE in 21 of 30 cells but by 30 % or more in only 8: the APTOS and CheXpert "
    "probes start at a median ECE of 0.076 and 0.049, within 0.02 of the 0.067 and 0.036 that perfectly "
    "calibrated probabilities would show on their ~250 test images, so there is little to remove (median "
    "reductions -3 % and 8 %); on ISIC, at 0.259 against a floor of 0.063, the median reduction is 63 %")


@pytest.mark.xfail(strict=True, reason=TEMPERATURE_REASON)
def test_finding_3_temperature_scaling_lowers_ece_by_at_least_30_percent_in_most_cells(demo):
    """The paper: temperature scaling lowers ECE by 54-77 %; here by at least 30 % in most cells."""
    cells = demo.recalibration.cells
    temperature = cells[cells["recalibrator"] == "temperature"]
    assert float((temperature["relative_reduction"] >= 0.30).mean()) > 0.5, temperature.sort_values("relative_reduction")


def test_finding_4_calibration_degrades_more_than_discrimination(demo):
    """The paper: under perturbation ECE rises more than AUROC falls, and the losses correlate moderately."""
    degradation = demo.degradation
    cells = degradation.cells
    assert float((cells["mean_ece_rise"] > cells["mean_auroc_drop"]).mean()) > 0.5, cells
    assert 0.2 <= degradation.pearson_r <= 0.9, degradation.pearson_r


#: Measured on the demo book of 2026-12-05, commit 1afb78e (RunAnalysis.transfer_test).
TRANSFER_REASON = (
    "the medical group does transfer better to the unseen hospital (MIMIC-like AUROC 0.674 against 0.561) but "
    "Welch's t = 2.35 on 4 medical against 6 general encoders gives p = 0.081: the dermoscopy and fundus "
    "specialists (0.620, 0.583), never trained on radiographs, count as medical and score like general features")


@pytest.mark.xfail(strict=True, reason=TRANSFER_REASON)
def test_finding_5_medical_encoders_transfer_better(demo):
    """The paper: medical-pretrained encoders keep more AUROC at the unseen hospital (Welch p < 0.05)."""
    result = demo.transfer_test()
    assert result.mean_medical > result.mean_general and result.p_value < 0.05, result


def test_finding_6_aulc_tracks_full_label_auroc_while_retention_does_not(demo):
    """The paper: AULC copies full-label AUROC (rho 0.986), retention does not (0.339)."""
    rho = demo.aulc_vs_retention.correlations["cell"]
    assert rho["aulc"] >= 0.8 and rho["retention"] < 0.6, rho


def test_finding_7_an_intermediate_layer_beats_the_last_after_correction(demo):
    """The paper: intermediate layers often do better than the last (5 of 8 sweeps); here after Holm."""
    from crsrepro.analyse.depth import paired_test

    tests = paired_test(demo.depth, "depth100")
    assert tests["survives"].any(), tests


def test_finding_8_lora_raises_mean_auroc(demo):
    """The paper: LoRA raises AUROC by 0.010-0.030 per domain."""
    gains = demo.lora.per_domain["auroc_gain"]
    assert float((gains > 0).mean()) > 0.5, demo.lora.per_domain


#: Measured on the demo book of 2026-12-05, commit 1afb78e (RunAnalysis.lora).
LORA_REASON = (
    "the demo fine-tunes 3 networks (issue 29's budget) whose frozen CRS are far apart (0.48, 0.37, 0.14) "
    "against mean LoRA gains of +0.000 to +0.006 AUROC per domain, so no rank can move: Kendall tau 1.0 in every "
    "domain and on the CRS")


@pytest.mark.xfail(strict=True, reason=LORA_REASON)
def test_finding_8_lora_reorders_the_middle_of_the_ranking(demo):
    """The paper: LoRA reorders the middle of the ranking."""
    assert (demo.lora.movers["shift"] != 0).any(), demo.lora.movers
