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


def test_the_planted_subgroup_effect_is_found(demo):
    """DESIGN.md section 14: the demo world plants worse images for patients aged 60 or more (ISIC and CheXpert
    look-alikes); the subgroup analysis finds older patients' AUROC lower on average over the panel."""
    from crsrepro.analyse.subgroups import subgroup_table

    table = subgroup_table(demo, attributes=("age_group",), n_resamples=200)
    for dataset in ("isic2019", "chexpert"):
        cells = table[table["dataset"] == dataset]
        older = cells["subgroup"].isin(["60-79", "80+"])
        assert cells.loc[older, "auroc_gap"].mean() < cells.loc[~older, "auroc_gap"].mean() - 0.01, dataset
