"""Notebooks stay thin: a parameters cell first, no def/class, no committed outputs (DESIGN.md s. 12)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_the_chapters_of_the_registry():
    """Every notebook has an entry in :data:`crsrepro.present.chapters.CHAPTERS` and every entry a notebook,
    in book order (file names sort as the chapters do)."""
    from crsrepro.present.chapters import CHAPTERS

    assert [p.stem for p in NOTEBOOKS] == list(CHAPTERS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_chapter_glues_its_own_numbers(path):
    """A chapter's numbers cell names the chapter itself, so it cannot quote another chapter's numbers."""
    sources = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    named = {m for s in sources for m in re.findall(r"chapters\.(?:chapter_numbers|paper_vs_run)\(analysis, \"(\w+)\"\)", s)}
    assert named == {path.stem}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_thin_and_clean(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0].get("metadata", {}).get("tags", []), "first code cell must be tagged parameters"
    assert re.search(r"^profile\s*=", "".join(code[0]["source"]), re.M), "parameters must set profile"
    for cell in code:
        source = "".join(cell["source"])
        assert not re.search(r"^\s*(def|class)\s", source, re.M), f"science belongs in crsrepro/: {source[:60]}"
        assert not cell.get("outputs") and cell.get("execution_count") is None, "commit notebooks without outputs"
        assert "hide-input" in cell.get("metadata", {}).get("tags", []), f"the book shows results, not code: {source[:60]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_reads_one_analysis_and_hides_its_code(path):
    """Every chapter loads RunAnalysis once (no run_grid, no hand-built frame) and hides its inputs."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in code]
    assert sum("RunAnalysis.load(profile)" in s for s in sources) == 1
    assert not any(re.search(r"\brun_grid\b|reference_frame\(", s) for s in sources)
    assert all("hide-input" in c["metadata"].get("tags", []) for c in code)
