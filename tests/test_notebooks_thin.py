"""Notebooks stay thin: a parameters cell first, no def/class, no committed outputs (DESIGN.md s. 12)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.stem for p in NOTEBOOKS][:2] == ["00_setup", "01_discrimination"]


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_reads_one_analysis_and_hides_its_code(path):
    """Every chapter loads RunAnalysis once (no run_grid, no hand-built frame) and hides its inputs."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in code]
    assert sum("RunAnalysis.load(profile)" in s for s in sources) == 1
    assert not any(re.search(r"\brun_grid\b|reference_frame\(", s) for s in sources)
    assert all("hide-input" in c["metadata"].get("tags", []) for c in code)
