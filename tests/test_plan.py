"""The compute planner (DESIGN.md section 13): its counts agree with the run grid and the profile."""

import pytest

from crsrepro.cli import main
from crsrepro.run.grid import cells, enumerate_runs
from crsrepro.run.plan import plan
from crsrepro.profiles import load_profile


@pytest.fixture(scope="module")
def paper():
    return plan("paper")


def test_paper_agrees_with_the_run_grid(paper):
    assert paper.n_runs == len(enumerate_runs("paper")) == 17_575
    stages = paper.stages.set_index("stage")
    assert stages.loc["scoring", "count"] == 17_575
    assert stages.loc["linear probes", "count"] == 43 * 5 * 5
    assert stages.loc["control probes", "count"] == 43 * 5 * 5 * 2
    assert stages.loc["recalibrators", "count"] == 43 * 5 * 4
    assert stages.loc["bootstrap", "count"] == 10_000 + 1_000 * 3


def test_paper_images_and_forward_passes(paper):
    images = paper.images.set_index("dataset")
    assert images.loc["chexpert", "total"] == 191_229 and images.loc["isic2019", "total"] == 25_331
    assert images.loc["aptos2019", "total"] == 3_662 and images.loc["mimic_cxr", "role"] == "transfer"
    assert "ESTIMATE" in images.loc["mimic_cxr", "source"]
    isic = images.loc["isic2019"]
    assert isic.train + isic.val + isic.test == isic.total and isic.test == round(0.2 * 25_331)
    vit = paper.forward[(paper.forward.encoder == "general.vit_b16") & (paper.forward.dataset == "isic2019")]
    assert len(vit) == 1 + 16  # the clean pool, and the test split under clean + 15 perturbed conditions
    assert vit.images.sum() == isic.train + isic.val + 16 * isic.test
    assert (vit.disk_bytes == vit.images * 768 * 4).all()
    chexzero = paper.forward[paper.forward.encoder == "specialist.chexzero"]
    assert set(chexzero.dataset) == {"isic2019", "chexpert", "mimic_cxr"}  # no APTOS cell


def test_paper_medgemma_dominates_and_totals_add_up(paper):
    encoders = paper.encoders
    assert encoders.iloc[0]["encoder"] == "medical.medgemma"
    assert encoders.iloc[0]["forward_gpu_hours"] > 2 * encoders.iloc[1]["forward_gpu_hours"]
    assert encoders.lora_gpu_hours.idxmax() == 0
    stages = paper.stages.set_index("stage")
    for column in ("gpu_hours", "cpu_hours", "disk_gb"):
        assert stages.loc["total", column] == pytest.approx(stages.drop(index="total")[column].sum())
    assert stages.loc["feature extraction", "disk_gb"] == pytest.approx(paper.forward.disk_bytes.sum() / 1e9)
    assert stages.loc["total", "gpu_hours"] > 0


@pytest.mark.parametrize("name", ["demo", "smoke"])
def test_demo_world_profiles_count_their_images_and_run_on_the_cpu(name):
    profile = load_profile(name)
    p = plan(profile)
    assert p.n_runs == len(enumerate_runs(profile))
    images = p.images.set_index("dataset")["total"].to_dict()
    assert images == dict(profile.demo_world.n_images)
    stages = p.stages.set_index("stage")
    assert stages.loc["total", "gpu_hours"] == 0 and stages.loc["total", "cpu_hours"] > 0
    assert set(p.forward.encoder) == {e for e, _ in cells(profile)}
    no_lora = p.encoders.set_index("encoder").loc["demo.color_histogram", "lora_steps"]
    assert no_lora == 0  # a fixed extractor is not fine-tuned


def test_cli_plan_prints_the_totals(capsys):
    assert main(["plan", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "compute plan for profile 'smoke'" in out and "total" in out and "throughputs" in out
