"""The report helpers the chapters call: worked examples, the frame note, the paper-vs-run box (fast)."""

import doctest
from types import SimpleNamespace

import pandas as pd
import pytest

from crsrepro import report


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
