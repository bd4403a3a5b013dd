"""A rebuild re-executes only the chapters whose inputs changed (DESIGN.md section 13): the inputs key of
``crsrepro.present.book.execution_inputs`` and the record each executed copy keeps; and the chapters read
what the stages wrote before them."""

import json

import pandas as pd
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
def test_the_stages_write_depth_and_lora_and_the_chapters_only_read(tmp_path, monkeypatch):
    """``crsrepro book`` runs the depth and LoRA stages before the chapters, so that the chapters' reads
    (``RunAnalysis.depth``, ``.lora_results``) train nothing; before the stages ran, a read is an error
    that names the command."""
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.core.errors import CrsreproError
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.profiles import load_profile
    from crsrepro.run import depth, lora
    from crsrepro.run.stages import run_stages

    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    tiny = {"datasets": ["aptos2019"], "transfer": {}, "severities": [2], "perturbations": ["jpeg"],
            "control_probes": {"probes": []}, "encoders": ["demo.random_cnn", "demo.color_histogram"], "seeds": [0]}
    profile = load_profile("smoke", overrides=tiny)
    assert lora.default_cells(profile) == depth.pairs(profile) == [("demo.random_cnn", "aptos2019")]
    with pytest.raises(CrsreproError, match="no depth results.*run `crsrepro book --profile smoke`"):
        RunAnalysis(profile, pd.DataFrame()).depth
    run_stages(profile, [depth.DepthStage(), lora.LoraStage()], executor="serial", progress=False)

    def refuse(*args, **kwargs):
        raise AssertionError("a chapter recomputed what the stages wrote")

    monkeypatch.setattr(lora, "finetune", refuse)
    monkeypatch.setattr(depth, "_unit_rows", refuse)
    analysis = RunAnalysis(profile, pd.DataFrame())
    assert set(analysis.depth["layer"]) == set(depth.taps(get_encoder_spec("demo.random_cnn")))
    assert set(analysis.lora_results["regime"]) == {"lora"}
    stale = load_profile("smoke", overrides={**tiny, "lora": {"epochs": 3}})
    with pytest.raises(CrsreproError, match="merged for another version of profile 'smoke'.*epochs"):
        RunAnalysis(stale, pd.DataFrame()).lora_results


def test_a_cell_that_displays_nothing_loses_its_collapsed_source(tmp_path):
    """Parameters, imports and glue cells show no empty "Show code cell source" toggle; a cell with a
    table or a printed line keeps its collapsed source beside what it shows."""
    import nbformat

    glued = {"output_type": "display_data", "data": {"text/plain": "'1'"}, "metadata": {"scrapbook": {"name": "n"}}}
    shown = {"output_type": "stream", "name": "stdout", "text": "a warning\n"}
    notebook = nbformat.from_dict(_notebook("x"))
    notebook.cells.append(nbformat.v4.new_code_cell("glue()", metadata={"tags": ["hide-input"]}))
    notebook.cells.append(nbformat.v4.new_code_cell("table()", metadata={"tags": ["hide-input"]}))
    notebook.cells[-2].outputs, notebook.cells[-1].outputs = [nbformat.from_dict(glued)], [nbformat.from_dict(shown)]
    notebook.cells[0].metadata["tags"].append("hide-input")
    path = tmp_path / "x.ipynb"
    nbformat.write(notebook, path)
    book._finish_executed_copy(path, {"seconds": 1})
    tags = [c.metadata.get("tags", []) for c in nbformat.read(path, as_version=4).cells]
    assert "remove-input" in tags[0] and "remove-input" in tags[2]
    assert "hide-input" in tags[3] and "remove-input" not in tags[3]


@pytest.mark.slow  # a process pool of two notebook kernels that import torch: 9 s of the fast lane's 90
def test_the_chapter_kernels_run_one_thread_each(checkout):
    """The chapters run on a pool of one kernel per core, so each kernel gets one torch and one BLAS thread
    (issue 29: two kernels of two threads each on 2 cores ran chapters 05 and 09 2.5x slower)."""
    from crsrepro.profiles import load_profile
    from crsrepro.run.progress import as_progress

    probe = "import os, torch; print(profile, torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))"
    for name in ("01_x", "02_y"):
        (checkout / "notebooks" / f"{name}.ipynb").write_text(json.dumps(_notebook(probe)))
    with as_progress(False).bar("chapters", 2, "") as bar:
        book._run_chapters(["01_x", "02_y"], "smoke", load_profile("smoke"), checkout, bar)
    for name in ("01_x", "02_y"):
        executed = json.loads((checkout / book.GENERATED / f"{name}.ipynb").read_text())
        assert executed["cells"][-1]["outputs"][0]["text"] == ["smoke 1 1\n"], executed["cells"][-1]["outputs"]


def _failing_starts(monkeypatch, messages):
    """Make papermill raise ``messages`` (RuntimeErrors, in order) before it executes for real; returns the calls."""
    import papermill

    real, calls = papermill.execute_notebook, []

    def execute(*args, **kwargs):
        calls.append(args[0])
        if len(calls) <= len(messages):
            raise RuntimeError(messages[len(calls) - 1])
        return real(*args, **kwargs)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    return calls


def test_a_kernel_that_does_not_start_is_started_again_and_said(checkout, monkeypatch, caplog):
    """Kernels started at once race for ports (jupyter/jupyter_client#154): the smoke book once failed with "Kernel
    didn't respond in 60 seconds" under `make test`. Nothing of the chapter ran, so it is started again."""
    calls = _failing_starts(monkeypatch, ["Kernel didn't respond in 60 seconds", "Kernel died before replying to "
                                          "kernel_info"])
    with caplog.at_level("WARNING", logger="crsrepro.present.book"):
        book.execute_notebook("01_x", profile="smoke", book_root=checkout, progress=False)
    assert len(calls) == 3 == book.KERNEL_START_TRIES
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["01_x", "01_x"]
    assert "try 1 of 3" in caplog.records[0].getMessage()
    executed = json.loads((checkout / book.GENERATED / "01_x.ipynb").read_text())
    assert executed["cells"][-1]["outputs"][0]["text"] == ["smoke\n"]


def test_another_runtime_error_or_a_kernel_that_never_starts_fails_the_chapter(checkout, monkeypatch):
    calls = _failing_starts(monkeypatch, ["the disk is full"])
    with pytest.raises(RuntimeError, match="the disk is full"):
        book.execute_notebook("01_x", profile="smoke", book_root=checkout, progress=False)
    assert len(calls) == 1
    calls = _failing_starts(monkeypatch, ["Kernel didn't respond in 60 seconds"] * book.KERNEL_START_TRIES)
    with pytest.raises(RuntimeError, match="didn't respond"):
        book.execute_notebook("01_x", profile="smoke", book_root=checkout, progress=False)
    assert len(calls) == book.KERNEL_START_TRIES
