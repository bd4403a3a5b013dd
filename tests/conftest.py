"""Shared fixtures: a scratch CRSREPRO_HOME so tests never write into the checkout."""

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]


def _copy_book_sources(target: Path) -> Path:
    """Copy the book sources (config, toc, pages, notebooks) into ``target``."""
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO / name, target / name)
    shutil.copytree(REPO / "notebooks", target / "notebooks")
    shutil.copytree(REPO / "book", target / "book", ignore=shutil.ignore_patterns("_build", "_generated"))
    shutil.copytree(REPO / "data_manifests", target / "data_manifests",
                    ignore=shutil.ignore_patterns("*_smoke.csv*", "crs_reference_smoke.yaml"))
    return target


@dataclass(frozen=True)
class BuiltBook:
    """The smoke book built once per test run: its checkout, its ``CRSREPRO_HOME`` and its HTML."""

    checkout: Path
    home: Path
    html: Path

    def pages(self) -> list[Path]:
        """Every page a reader reads: Sphinx's search and index pages and Jupyter Book's root
        ``index.html`` (a one-line redirect to the intro) left out."""
        return sorted(p for p in self.html.rglob("*.html")
                      if p.name not in {"search.html", "genindex.html"} and "_static" not in p.parts
                      and 'http-equiv="Refresh"' not in p.read_text()[:200])


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> BuiltBook:
    """Run the smoke grid and build the smoke book once per test run, shared by every slow book test."""
    from crsrepro.book import build_book
    from crsrepro.grid import run_grid
    from crsrepro.profiles import load_profile

    checkout = _copy_book_sources(tmp_path_factory.mktemp("smoke_book"))
    home = checkout / ".crsrepro"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CRSREPRO_HOME", str(home))
        patch.setenv("CRSREPRO_MANIFESTS", str(checkout / "data_manifests"))
        patch.chdir(checkout)
        run_grid(load_profile("smoke"), progress=False)
        index = build_book(profile="smoke", book_root=checkout, progress=False)
    return BuiltBook(checkout=checkout, home=home, html=index.parent)
