"""The walking skeleton end to end on the smoke profile: demo world, run grid, papermill, Jupyter Book."""

import os
import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.slow
def test_book_builds_on_smoke(smoke_book):
    chapters = smoke_book.html / "book" / "_generated"
    assert (smoke_book.html / "index.html").is_file()

    # Both chapters were executed by papermill, and their outputs are in the HTML.
    html = (chapters / "01_discrimination.html").read_text()
    assert "<table" in html and "mean AUROC" in html and "demo.effnet_lite0" in html
    assert "<img" in html and ".png" in html
    setup = (chapters / "00_setup.html").read_text()
    assert "isic2019" in setup and "mimic_cxr" in setup and setup.count("<img") >= 3  # examples + 2 perturbation grids
    assert ">NaN<" not in setup  # the class shares leave a dataset's missing labels blank
    # The status page names the profile, every chapter, the commit and the package versions.
    status = (chapters / "status.html").read_text()
    assert "smoke" in status and "01_discrimination" in status and "Git commit" in status
    assert all(name in status for name in ("crsrepro", "torch", "numpy", "pandas", "scikit-learn", "timm"))

    # The tidy table holds every run of the smoke grid, and AUROC values are real probabilities.
    results = pd.read_parquet(smoke_book.home / "smoke" / "results" / "results.parquet")
    from crsrepro.run.grid import enumerate_runs
    from crsrepro.profiles import load_profile
    runs = enumerate_runs(load_profile("smoke"))
    linear = results[(results.probe == "linear") & (results.recalibrator == "none") & (results.metric == "auroc")]
    assert len(linear) == len(runs)
    assert linear["value"].between(0.0, 1.0).all()
    # At least 99 % of the linear-probe fits converge, and the status page says how many did not.
    from crsrepro.analyse.probe_health import MAX_UNCONVERGED, convergence_table
    assert convergence_table(results).loc["all", "unconverged_share"] <= MAX_UNCONVERGED
    assert "Linear-probe convergence" in status

    # The demo world is hard enough to teach (DESIGN.md section 2): clean AUROC spreads across the panel and stays
    # clearly below 1, and the second hospital costs AUROC.
    full = linear[linear.label_fraction == 1.0].groupby(["dataset", "encoder", "condition"])["value"].mean()
    clean = full.xs("clean", level="condition")
    assert (clean.groupby("dataset").max() - clean.groupby("dataset").min()).max() >= 0.1
    assert clean.max() < 0.97
    transfer_drop = clean.xs("chexpert") - full.xs(("chexpert", "mimic_cxr"), level=("dataset", "condition"))
    assert transfer_drop.mean() > 0

    # The book froze the smoke frame (its one explicit freezing step); a newcomer is scored against it
    # without moving the panel.
    frame = smoke_book.checkout / "data_manifests" / "crs_reference_smoke.yaml"
    before = frame.read_bytes()
    scored = subprocess.run([sys.executable, "-m", "crsrepro", "-q", "score", "--encoder", "demo.texture",
                             "--profile", "smoke"], capture_output=True, text=True, cwd=smoke_book.checkout,
                            env={**os.environ, "CRSREPRO_HOME": str(smoke_book.home),
                                 "CRSREPRO_MANIFESTS": str(smoke_book.checkout / "data_manifests")}, timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "demo.texture" in scored.stdout and "aggregate CRS" in scored.stdout and "rank" in scored.stdout
    assert frame.read_bytes() == before


# The numbers a chapter's prose quotes (myst-nb glue) and the claims page's measurement of the same
# quantity: both must come from the one RunAnalysis, so they cannot disagree (DESIGN.md section 12).
CHAPTER_VS_CLAIMS = {
    "01_discrimination": {"auroc_leader_value": "aggregate_auroc:rank1"},
    "02_calibration": {"temperature_mean_drop": "recalibration_mean_absolute_drop"},
    "03_label_efficiency": {"aulc_rho_encoder": "aulc_rho:encoder", "retention_rho_cell": "retention_rho:cell"},
    "04_robustness": {"degradation_r": "degradation_pearson_r", "transfer_p": "transfer_welch_p",
                      "transfer_medical": "transfer_auroc_mean:medical"},
    "05_crs_bootstrap": {"kendall_tau": "auroc_crs_kendall_tau", "reversed_pairs": "auroc_crs_reversed_pairs",
                         "crs_leader_value": "aggregate_crs:rank1"},
}


def _glued(notebook_path) -> dict[str, str]:
    """The glued values of an executed notebook, by name."""
    import nbformat

    out = {}
    for cell in nbformat.read(notebook_path, as_version=4).cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                text = next(v for k, v in output["data"].items() if k.endswith("text/plain"))
                out[name] = text.strip("'\"")
    return out


@pytest.mark.slow
def test_chapters_and_the_claims_page_show_the_same_numbers(smoke_book, monkeypatch):
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.present.measurements import measure

    monkeypatch.setenv("CRSREPRO_HOME", str(smoke_book.home))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(smoke_book.checkout / "data_manifests"))
    measured = measure(RunAnalysis.load("smoke"))
    compared = 0
    for notebook, pairs in CHAPTER_VS_CLAIMS.items():
        glued = _glued(smoke_book.checkout / "book" / "_generated" / f"{notebook}.ipynb")
        for glue_name, measure in pairs.items():
            if measure not in measured or glued.get(glue_name, "n/a") == "n/a":
                continue
            compared += 1
            assert float(glued[glue_name]) == pytest.approx(measured[measure], abs=6e-4), (notebook, glue_name)
    assert compared >= 8
