"""Real images end to end (DESIGN.md section 3): the grid on a reduced real-mini profile, and NIH ChestX-ray14 as a
second transfer target of a CheXpert-trained probe. Skipped where ../shared/realdata is absent."""

import os
from pathlib import Path

import numpy as np
import pytest

from crsrepro.run import grid
from crsrepro.analyse.run_analysis import RunAnalysis
from crsrepro.profiles import load_profile
from crsrepro.score.frame import freeze_frame

REALDATA = Path(os.environ.get("CRSREPRO_REALDATA", Path(__file__).resolve().parents[1].parent / "shared" / "realdata"))
IMAGES = REALDATA / "images"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not IMAGES.is_dir(), reason=f"real images not found at {IMAGES} (set CRSREPRO_REALDATA)")]

FAST = {"encoders": ["demo.color_histogram", "demo.pixel_pca"], "seeds": [0, 1], "label_fractions": [0.25, 1.0],
        "perturbations": ["gaussian_blur", "jpeg"], "severities": [3], "control_probes": {"probes": []}}


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    monkeypatch.setenv("CRSREPRO_DATA", str(IMAGES))
    return tmp_path


def test_real_mini_runs_the_protocol_on_real_images(home):
    profile = load_profile("real-mini", overrides={
        **FAST, "data": {"subsample": {"isic2017": 200, "kermany_cxr": 200}}})  # NIH: all 1,051 present
    results = grid.run_grid(profile, progress=False)
    analysis = RunAnalysis(profile, results)
    cells = analysis.cell_means
    assert set(cells["dataset"]) == {"isic2017", "kermany_cxr", "nih_cxr14"} and len(cells) == 6
    assert cells["auroc"].between(0.5, 1.0).all()  # real signal, even for colour histograms and pixel PCA
    freeze_frame(profile, results)
    assert analysis.aggregate["crs"].between(0, 1).all() and analysis.has_seed_variance


def test_nih_is_a_second_transfer_target_on_the_shared_labels(home):
    profile = load_profile("smoke", overrides={
        **FAST, "datasets": ["chexpert"], "transfer": {"chexpert": ["mimic_cxr", "nih_cxr14"]},
        "data": {"images": "present-only", "folders": {"nih_cxr14": str(IMAGES / "nih_cxr14")},
                 "subsample": {"nih_cxr14": 300}}})
    assert profile.robustness_transfer == ("mimic_cxr",)  # the paper-faithful CRS keeps MIMIC only
    results = grid.run_grid(profile, progress=False)
    nih = results[(results["condition"] == "nih_cxr14") & (results["metric"] == "auroc")
                  & (results["recalibrator"] == "none")]
    assert len(nih) == 2 * 2 * 2 and np.isfinite(nih["value"]).all()  # encoders x seeds x fractions
    analysis = RunAnalysis(profile, results)
    assert "nih_cxr14" not in set(analysis.runs["condition"]) and "nih_cxr14" in set(analysis.all_runs["condition"])
    labels, probs = analysis.case_probabilities("chexpert", condition="nih_cxr14")
    shared = labels.shape[1]  # the eight shared labels, less any the smoke world's splits cannot learn
    assert 1 <= shared <= 8 and next(iter(probs.values())).shape[2] == shared
