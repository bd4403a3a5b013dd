"""A rebuild re-executes only the chapters whose inputs changed (issue 18): the inputs key of
``crsrepro.present.book.execution_inputs`` and the record each executed copy keeps."""

import json

import pytest

from crsrepro.present import book
from crsrepro.core.io import content_key


def _notebook(source: str) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": "params", "metadata": {"tags": ["parameters"]},
                       "outputs": [], "source": ['profile = "smoke"']},
                      {"cell_type": "code", "execution_count": None, "id": "body", "metadata": {}, "outputs": [],
                       "source": [source]}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A minimal book root with one chapter, its own CRSREPRO_HOME and manifest folder."""
    (tmp_path / "_config.yml").write_text("title: test\n")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text(json.dumps(_notebook("print(profile)")))
    (tmp_path / "data_manifests").mkdir()
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "data_manifests"))
    return tmp_path


def _key(checkout, **parameters) -> str:
    return content_key(**book.execution_inputs("01_x", profile="smoke", book_root=checkout, parameters=parameters))


def test_the_key_changes_with_each_input_and_only_then(checkout):
    key = _key(checkout)
    assert _key(checkout) == key
    assert _key(checkout, coverage_profile="") != key                    # another parameter
    (checkout / "data_manifests" / "crs_reference_smoke.yaml").write_text("frame\n")
    assert _key(checkout) != key                                         # a frame appeared
    key = _key(checkout)
    (checkout / "notebooks" / "01_x.ipynb").write_text(json.dumps(_notebook("print(profile, 1)")))
    assert _key(checkout) != key                                         # the prose or code of the chapter
    key = _key(checkout)
    from crsrepro.profiles import load_profile
    from crsrepro.run.results import ResultStore
    merged = ResultStore(load_profile("smoke").output_path).merged_path
    merged.parent.mkdir(parents=True)
    merged.with_name(merged.name + ".sha256").write_text('{"sha256": "abc"}')
    assert _key(checkout) != key                                         # the profile's results
    assert "package" in book.execution_inputs("01_x", profile="smoke", book_root=checkout)


def test_an_executed_copy_is_reused_only_under_the_same_key(checkout):
    key = _key(checkout)
    assert book.reusable_seconds("01_x", key, book_root=checkout) is None   # never executed
    seconds = book.execute_notebook("01_x", profile="smoke", book_root=checkout, progress=False, inputs_key=key)
    assert book.reusable_seconds("01_x", key, book_root=checkout) == round(seconds, 1)
    assert book.reusable_seconds("01_x", "another key", book_root=checkout) is None
    # `crsrepro notebook` executes without a key: such a copy is never reused by a build
    book.execute_notebook("01_x", profile="smoke", book_root=checkout, progress=False)
    assert book.reusable_seconds("01_x", key, book_root=checkout) is None


def test_the_status_page_says_which_chapters_this_build_executed(checkout):
    path = book.write_status_page(checkout, "smoke", {"01_x": book.ChapterRun(12.0, reused=True),
                                                      "02_y": book.ChapterRun(3.5)})
    text = path.read_text()
    assert "| 01_x | `smoke` | 12.0 | reused (inputs unchanged) |" in text
    assert "| 02_y | `smoke` | 3.5 | executed |" in text and "1 executed" in text


@pytest.mark.slow
def test_depth_and_lora_are_precomputed_so_the_chapters_only_merge(tmp_path, monkeypatch):
    """The book's precompute step writes every row-set of the depth sweep and the LoRA grid, so that
    the chapters' own calls (``RunAnalysis.depth``, ``.lora_results``) compute nothing."""
    from crsrepro.run import depth, lora
    from crsrepro.encoders import get_spec
    from crsrepro.profiles import load_profile

    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    profile = load_profile("smoke", overrides={"datasets": ["aptos2019"], "transfer": {}, "severities": [2],
                                               "perturbations": ["jpeg"], "control_probes": {"probes": []},
                                               "encoders": ["demo.random_cnn", "demo.color_histogram"], "seeds": [0]})
    assert lora.default_cells(profile) == depth.default_pairs(profile) == [("demo.random_cnn", "aptos2019")]
    book.precompute_depth_and_lora(profile, executor="serial", progress=False)
    # the parallel tasks write row-sets only: none of them rewrites the shared merged tables
    assert not (profile.output_path / "depth" / "results.parquet").exists()
    assert not (profile.output_path / "lora" / "results.parquet").exists()

    def refuse(*args, **kwargs):
        raise AssertionError("the chapter recomputed what the precompute step wrote")

    monkeypatch.setattr(lora, "finetune", refuse)
    monkeypatch.setattr(depth, "_unit_rows", refuse)
    assert set(depth.sweep(profile)["layer"]) == set(depth.taps(get_spec("demo.random_cnn")))
    assert set(lora.lora_grid(profile)["regime"]) == {"lora"}


def test_the_claims_table_of_a_run_is_computed_once_and_read_by_the_other_chapters(tmp_path, monkeypatch):
    import pandas as pd

    import crsrepro.present.claims
    import crsrepro.present.measurements
    from crsrepro.analyse.run_analysis import RunAnalysis

    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    calls = []

    def claims_table(*args, **kwargs):
        calls.append(1)
        return pd.DataFrame({"id": ["a"], "status": ["measured"]})

    monkeypatch.setattr(crsrepro.present.claims, "claims_table", claims_table)
    monkeypatch.setattr(crsrepro.present.measurements, "multiverse_shares", lambda table: {})

    def analysis(results, rng=0):
        a = RunAnalysis("smoke", results, rng=rng)
        a.__dict__.update(measurements={}, multiverse=None)  # what the claims need, without measuring
        return a

    run = pd.DataFrame({"rowset": ["k1", "k2"], "value": [0.1, 0.2]})
    first = analysis(run).claims
    assert len(calls) == 1 and len(list((tmp_path / ".crsrepro").rglob("claims/*.pkl"))) == 1
    pd.testing.assert_frame_equal(analysis(run).claims, first)              # another chapter's kernel: read
    assert len(calls) == 1
    analysis(run, rng=1).claims                                              # another input: computed
    analysis(run.assign(rowset=["k1", "k3"])).claims
    assert len(calls) == 3
    (tmp_path / "manifests" / "crs_reference_smoke.yaml").write_text("frame\n")   # a (re)frozen frame
    analysis(run).claims
    assert len(calls) == 4
    by_hand = pd.DataFrame({"value": [0.1]})                                  # no row-sets: never cached
    assert analysis(by_hand).claims_key() is None
    analysis(by_hand).claims
    analysis(by_hand).claims
    assert len(calls) == 6
