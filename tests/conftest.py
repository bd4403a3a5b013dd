"""Shared fixtures: a scratch CRSREPRO_HOME so tests never write into the checkout."""

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]


@pytest.fixture
def book_checkout(tmp_path, monkeypatch):
    """A copy of the book sources (config, toc, pages, notebooks) in tmp_path, used as the working dir."""
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "notebooks", tmp_path / "notebooks")
    shutil.copytree(REPO / "book", tmp_path / "book", ignore=shutil.ignore_patterns("_build", "_generated"))
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
