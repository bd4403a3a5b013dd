"""What the chapters show beside their figures: the boxes, the tables, the prose numbers and the worked
examples (fast)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from crsrepro.present import chapters, teaching
from crsrepro.present.report import html, numbers, tables


def _profile(name="demo", paper_scope=False, **keys):
    return SimpleNamespace(name=name, claims=SimpleNamespace(paper_scope=paper_scope), **keys)


CLAIMS = pd.DataFrame({"id": ["a", "b", "c"], "claim": ["first", "second", "third"],
                       "paper value": ["1", "0.5", "2"], "this run": ["1", "0.4", ""],
                       "notebook": ["02_calibration", "02_calibration", "02_calibration"],
                       "status": ["measured", "paper profile only", "not measured"]})


def test_frame_note_is_nothing_without_a_warning_and_a_box_with_one():
    assert html.frame_note(SimpleNamespace(frame_warning=None)) is None
    note = html.frame_note(SimpleNamespace(frame_warning="frozen from results abc, these are def"))
    assert note.data.startswith('<div class="admonition warning">')
    assert "frozen from results abc, these are def" in note.data


def test_the_claims_box_lists_what_this_run_measured_and_counts_the_rest():
    text = html.claims_box(CLAIMS, "02_calibration", _profile()).data
    assert "<td>first</td>" in text and "<td>0.4</td>" in text and "paper profile only" in text
    assert "third" not in text and "1 more claim(s)" in text
    assert "Paper vs this run (profile demo)" in text
    assert "analogue" in text                       # not the paper's protocol: analogues are flagged
    assert "analogue" not in html.claims_box(CLAIMS, "02_calibration", _profile("paper-gpu2", paper_scope=True)).data
    long = pd.concat([CLAIMS.iloc[:1]] * (html.LONG_BOX + 1)).assign(id=[f"x{i}" for i in range(html.LONG_BOX + 1)])
    assert 'class="admonition tip dropdown"' in html.claims_box(long, "02_calibration", _profile()).data


def test_a_chapter_box_reads_the_run_s_claims_page(monkeypatch):
    from crsrepro.present import claims

    monkeypatch.setattr(claims, "run_claims", lambda analysis: CLAIMS)
    analysis = SimpleNamespace(profile=_profile())
    assert "<td>first</td>" in chapters.paper_vs_run(analysis, "02_calibration").data
    with pytest.raises(ValueError, match="measures no claim"):
        chapters.paper_vs_run(analysis, "05b_sensitivity")


def test_chapter_numbers_refuses_an_unknown_chapter():
    with pytest.raises(ValueError, match="99_nothing"):
        chapters.chapter_numbers(SimpleNamespace(), "99_nothing")


def test_toy_examples_agree_with_their_definitions():
    assert teaching.toy_auroc()["ranked above"].mean() == teaching.toy_auroc().attrs["auroc"]
    table = teaching.toy_ece()
    assert table.attrs["ece"] == pytest.approx((table["n"] * table["gap"]).sum() / table["n"].sum(), abs=2e-3)
    boot = teaching.toy_paired_bootstrap(300)
    assert boot.attrs["ci_low"] < 0 < boot.attrs["ci_high"]   # the worked example's point: not separable


# --------------------------------------------------------------------------- the chapters' choices and tables

def test_the_example_and_contrast_datasets():
    three = SimpleNamespace(datasets=("isic2019", "aptos2019", "chexpert"))
    assert tables.example_dataset(three) == "isic2019" and tables.contrast_dataset(three) == "chexpert"
    assert tables.example_dataset(three, "aptos2019") == "aptos2019"
    assert tables.contrast_dataset(three, "chexpert") is None      # the example is the last: drawn once
    one = SimpleNamespace(datasets=("isic2019",))
    assert tables.example_dataset(one) == "isic2019" and tables.contrast_dataset(one) is None


def test_the_label_efficiency_bar_is_vit_b16_when_the_panel_has_it():
    calls = []

    def analysis(encoders):
        return SimpleNamespace(profile=SimpleNamespace(encoders=encoders, label_fractions=(0.1, 0.01, 1.0)),
                               absolute_label_efficiency=lambda fraction, reference: calls.append((fraction, reference)))

    tables.absolute_label_efficiency(analysis(["general.resnet50", "general.vit_b16"]))
    tables.absolute_label_efficiency(analysis(["demo.a", "demo.b"]))
    tables.absolute_label_efficiency(analysis(["general.resnet50", "general.vit_b16"]), "general.resnet50")
    assert calls == [(0.01, "general.vit_b16"), (0.01, "demo.a"), (0.01, "general.resnet50")]


def _runs(**columns):
    base = dict(seed=0, probe="linear", regime="frozen", layer="final", recalibrator="none", label_fraction=1.0,
                ece=0.1)
    return pd.DataFrame({**base, **columns})


def test_primary_runs_keep_the_primary_protocol_at_the_chosen_condition_and_fraction():
    from crsrepro.core.schema import COLUMNS

    keys = dict(encoder="e", family="general", dataset="d", seed=0, layer="final", regime="frozen", probe_C=1.0,
                c_rule="val", c_tie=False, converged=True, hit_time_cap=False, fit_seconds=1.0)
    rows = [keys | dict(label_fraction=f, condition=c, probe=p, recalibrator=r, rowset=f"{f}{c}{p}{r}",
                        metric=m, value=v)
            for f in (0.1, 1.0) for c in ("clean", "jpeg@2") for p, r in (("linear", "none"), ("knn", "none"),
                                                                          ("linear", "temperature"))
            for m, v in (("auroc", 0.8), ("ece", 0.1))]
    results = pd.DataFrame(rows)[COLUMNS]
    runs = tables.primary_runs(results)
    assert (runs["probe"].tolist(), runs["recalibrator"].tolist()) == (["linear"], ["none"])
    assert (runs["condition"].tolist(), runs["label_fraction"].tolist()) == (["clean"], [1.0])
    assert len(tables.primary_runs(results, condition=None, label_fraction=None)) == 4


def test_transfer_table_has_one_column_per_target():
    runs = _runs(encoder=["e1", "e1", "e1", "e2", "e2"], dataset="chexpert",
                 condition=["clean", "mimic_cxr", "nih_cxr14", "clean", "mimic_cxr"], auroc=[0.8, 0.7, 0.6, 0.9, 0.65])
    one = SimpleNamespace(all_runs=runs, profile=_profile("x", transfer={"chexpert": ("mimic_cxr",)}))
    assert tables.transfer_table(one).columns.tolist() == ["chexpert (clean)", "chexpert -> mimic_cxr"]
    two = SimpleNamespace(all_runs=runs, profile=_profile("x", transfer={"chexpert": ("mimic_cxr", "nih_cxr14")}))
    table = tables.transfer_table(two)
    assert table.loc["e1", "chexpert -> nih_cxr14"] == 0.6 and pd.isna(table.loc["e2", "chexpert -> nih_cxr14"])
    none = SimpleNamespace(all_runs=runs, profile=_profile("x", transfer={}))
    # without a transfer set the chapter shows one note (the figure's) and nothing else
    assert "names no transfer set" in tables.transfer_figure(none).data
    assert tables.transfer_table(none) is None and tables.transfer_welch(none) is None
    assert tables.transfer_thresholds(none, pd.DataFrame({"severity": []})) is None
    assert "names no transfer set" in tables.external_validity(none).data
    degradation = SimpleNamespace(pearson_r=0.5, cells=pd.DataFrame(
        {"peak_ece_rise": [0.1, 0.3], "mean_ece_rise": [0.05, 0.1], "mean_auroc_drop": [0.01, 0.03]},
        index=pd.MultiIndex.from_tuples([("demo.a", "d1"), ("demo.b", "d2")], names=["encoder", "dataset"])))
    robustness = numbers.robustness(SimpleNamespace(degradation=degradation, profile=none.profile))
    assert robustness["peak_ece_cell"] == "b on d2" and robustness["degradation_r"] == "0.500"
    assert "no transfer set" in robustness["transfer_sentence"].data and "transfer_p" not in robustness


def test_seed_count_coverage_is_a_note_when_skipped_and_a_row_otherwise(monkeypatch):
    from crsrepro.analyse.run_analysis import RunAnalysis

    assert "not run here" in tables.seed_count_coverage("").data
    table = pd.DataFrame({"a": ["x"], "b": ["y"], "estimate_all_seeds": [0.1], "coverage": [0.8], "mean_width": [0.2]})

    def coverage(n_seeds, n_subsets, *, two_level, n_resamples):
        out = table.copy()
        out.attrs = {"coverage": 0.99 if two_level else 0.8, "level": 0.95, "n_seeds": n_seeds, "n_all_seeds": 20,
                     "n_subsets": n_subsets, "n_resamples": n_resamples,
                     "bootstrap": "seeds x cases" if two_level else "seeds"}
        return out

    monkeypatch.setattr(RunAnalysis, "load", classmethod(
        lambda cls, profile: SimpleNamespace(seed_count_coverage=coverage)))
    result = tables.seed_count_coverage("demo-seeds20")
    assert (result.loc["seeds", "coverage"], result.loc["seeds", "nominal"], result.loc["seeds", "seeds of the run"]) \
        == (0.8, 0.95, 20)
    assert result.loc["seeds x cases", "coverage"] == 0.99 and result.loc["seeds", "profile"] == "demo-seeds20"


def test_status_page_repeats_the_coverage_chapter_05_glued(tmp_path):
    import json

    from crsrepro.present.book import GENERATED, ChapterRun, write_status_page

    def glued(name, text):
        return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": "x/"}},
                "data": {"x/text/plain": repr(text)}}

    (tmp_path / GENERATED).mkdir(parents=True)
    notebook = {"cells": [{"cell_type": "code", "outputs": [glued("coverage_seeds", "0.812"),
                                                             glued("coverage_two_level", "0.990"),
                                                             glued("coverage_profile", "demo-seeds20")]}]}
    (tmp_path / GENERATED / "05_crs_bootstrap.ipynb").write_text(json.dumps(notebook))
    text = write_status_page(tmp_path, "demo", {"05_crs_bootstrap": ChapterRun(1.0)}).read_text()
    assert "| the paper's: seeds only | 0.812 |" in text and "| seeds x test cases | 0.990 |" in text
    assert "`demo-seeds20`" in text
    (tmp_path / GENERATED / "05_crs_bootstrap.ipynb").unlink()
    assert "Coverage of a 5-seed" not in write_status_page(tmp_path, "demo", {}).read_text()


def test_status_page_repeats_the_unconverged_share_chapter_01_glued(tmp_path):
    import json

    from crsrepro.present.book import GENERATED, write_status_page

    def glued(name, text):
        return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": "x/"}},
                "data": {"x/text/plain": repr(text)}}

    (tmp_path / GENERATED).mkdir(parents=True)
    notebook = {"cells": [{"cell_type": "code", "outputs": [glued("probe_fits", "750"), glued("probe_unconverged", "3"),
                                                             glued("probe_unconverged_share", "0.4 %"),
                                                             glued("probe_unconverged_by_encoder", "a 0.0 %; b 0.8 %")]}]}
    (tmp_path / GENERATED / "01_discrimination.ipynb").write_text(json.dumps(notebook))
    text = write_status_page(tmp_path, "demo", {}).read_text()
    assert "3 of 750 linear-probe fits (0.4 %) stopped before" in text and "Per encoder: a 0.0 %; b 0.8 %." in text
    (tmp_path / GENERATED / "01_discrimination.ipynb").unlink()
    assert "Linear-probe convergence" not in write_status_page(tmp_path, "demo", {}).read_text()
