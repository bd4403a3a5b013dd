"""The report helpers the chapters call: worked examples, the frame note, the paper-vs-run box (fast)."""

import doctest
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from crsrepro.present import report


def test_doctests():
    assert doctest.testmod(report).failed == 0


def _analysis(frame_warning=None, profile="demo"):
    claims = pd.DataFrame({"id": ["a", "b", "c"], "claim": ["first", "second", "third"],
                           "paper value": ["1", "0.5", "2"], "this run": ["1", "0.4", ""],
                           "notebook": ["02_calibration", "02_calibration", "02_calibration"],
                           "status": ["measured", "paper profile only", "not measured"]})
    return SimpleNamespace(frame_warning=frame_warning, claims=claims, profile=SimpleNamespace(name=profile))


def test_frame_note_is_nothing_without_a_warning_and_a_box_with_one():
    assert report.frame_note(_analysis()) is None
    note = report.frame_note(_analysis("frozen from results abc, these are def"))
    assert note.data.startswith('<div class="admonition warning">')
    assert "frozen from results abc, these are def" in note.data


def test_paper_vs_run_lists_what_this_run_measured_and_counts_the_rest():
    text = report.paper_vs_run(_analysis(), "02_calibration").data
    assert "<td>first</td>" in text and "<td>0.4</td>" in text and "paper profile only" in text
    assert "third" not in text and "1 more claim(s)" in text
    assert "analogue" in text                       # not the paper profile: analogues are flagged
    assert "analogue" not in report.paper_vs_run(_analysis(profile="paper"), "02_calibration").data


def test_chapter_numbers_refuses_an_unknown_chapter():
    with pytest.raises(ValueError, match="99_nothing"):
        report.chapter_numbers(_analysis(), "99_nothing")


def test_toy_examples_agree_with_their_definitions():
    assert report.toy_auroc()["ranked above"].mean() == report.toy_auroc().attrs["auroc"]
    table = report.toy_ece()
    assert table.attrs["ece"] == pytest.approx((table["n"] * table["gap"]).sum() / table["n"].sum(), abs=2e-3)
    boot = report.toy_paired_bootstrap(300)
    assert boot.attrs["ci_low"] < 0 < boot.attrs["ci_high"]   # the worked example's point: not separable


# --------------------------------------------------------------------------- the chapters' new tables and numbers

def test_transfer_table_has_one_column_per_target():
    runs = pd.DataFrame({"encoder": ["e1", "e1", "e1", "e2", "e2"], "dataset": "chexpert",
                         "condition": ["clean", "mimic_cxr", "nih_cxr14", "clean", "mimic_cxr"],
                         "auroc": [0.8, 0.7, 0.6, 0.9, 0.65], "probe": "linear", "regime": "frozen", "layer": "final",
                         "recalibrator": "none", "label_fraction": 1.0})
    one = SimpleNamespace(all_runs=runs, profile=SimpleNamespace(name="x", transfer={"chexpert": ("mimic_cxr",)}))
    assert report.transfer_table(one).columns.tolist() == ["chexpert (clean)", "chexpert -> mimic_cxr"]
    two = SimpleNamespace(all_runs=runs, profile=SimpleNamespace(name="x", transfer={"chexpert": ("mimic_cxr", "nih_cxr14")}))
    table = report.transfer_table(two)
    assert table.loc["e1", "chexpert -> nih_cxr14"] == 0.6 and pd.isna(table.loc["e2", "chexpert -> nih_cxr14"])
    none = SimpleNamespace(all_runs=runs, profile=SimpleNamespace(name="x", transfer={}))
    # without a transfer set the chapter shows one note (the figure's) and nothing else
    assert "names no transfer set" in report.transfer_figure(none).data
    assert report.transfer_table(none) is None and report.transfer_welch(none) is None
    assert report.transfer_thresholds(none, pd.DataFrame({"severity": []})) is None
    assert "names no transfer set" in report.external_validity(none).data
    assert "no transfer set" in report._transfer_numbers(none)["transfer_sentence"].data


def test_two_level_intervals_stack_the_datasets():
    from crsrepro.score.stats import two_level_bootstrap

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 60)
    probs = {e: np.stack([np.column_stack([1 - p, p]) for p in rng.uniform(size=(2, 60))]) for e in ("a", "b")}
    result = two_level_bootstrap(labels, probs, task="multiclass", n_resamples=50)
    table = report.two_level_intervals(SimpleNamespace(two_level_bootstrap={"d1": result, "d2": result}))
    assert table.index.names == ["dataset", "encoder"] and len(table) == 4
    assert (table["auroc_width"] >= 0).all() and (table["auroc_ci_low"] <= table["auroc"]).all()


def test_seed_count_coverage_is_a_note_when_skipped_and_a_row_otherwise(monkeypatch):
    from crsrepro.analyse.run_analysis import RunAnalysis

    assert "not run here" in report.seed_count_coverage("").data
    table = pd.DataFrame({"a": ["x"], "b": ["y"], "estimate_all_seeds": [0.1], "coverage": [0.8], "mean_width": [0.2]})
    table.attrs = {"coverage": 0.8, "level": 0.95, "n_seeds": 5, "n_all_seeds": 20, "n_subsets": 40}
    monkeypatch.setattr(RunAnalysis, "load", classmethod(
        lambda cls, profile: SimpleNamespace(seed_count_coverage=lambda n_seeds: table)))
    row = report.seed_count_coverage("demo-seeds20").loc["demo-seeds20"]
    assert (row["coverage"], row["nominal"], row["seeds of the run"]) == (0.8, 0.95, 20)
