"""The book's chapters, named once (DESIGN.md section 12).

:data:`CHAPTERS` lists every notebook of ``notebooks/`` in book order, with

- ``numbers``: the function of :mod:`crsrepro.present.report.numbers` that gives this run's numbers the
  chapter's prose quotes (:func:`chapter_numbers`);
- ``claims``: whether the chapter measures claims of the paper, so that ``data_manifests/claims.yaml``
  may name it as a claim's ``notebook`` and the chapter closes with a "paper vs this run" box
  (:func:`paper_vs_run`). The sensitivity chapter and the deployment page measure none (they are beyond
  the paper) and the claims page shows them all. The deployment page quotes chapter 02's recalibration
  numbers (the first finding it builds on), so its numbers function is chapter 02's. The "score your own
  encoder" page (chapter 10), a worked example of ``crsrepro score``, measures none either; its numbers
  function also formats the example's score (:func:`crsrepro.present.report.numbers.score_your_encoder`).

What the claims page measures is not listed per chapter: every chapter's box reads the same page
(:func:`crsrepro.present.claims.run_claims`), which measures everything at once
(:data:`crsrepro.present.measurements.MEASURES`).

>>> list(CHAPTERS)[:3]
['00_setup', '01_discrimination', '02_calibration']
>>> CHAPTERS["05b_sensitivity"].claims, CHAPTERS["05_crs_bootstrap"].numbers.__name__
(False, 'crs_bootstrap')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from crsrepro.present import claims
from crsrepro.present.report import html, numbers


@dataclass(frozen=True)
class Chapter:
    """One notebook of the book: its file name (``notebooks/<name>.ipynb``), the function of its prose
    numbers, and whether it measures claims of the paper."""

    name: str
    numbers: Callable[..., dict]
    claims: bool = True


CHAPTERS = {chapter.name: chapter for chapter in (
    Chapter("00_setup", numbers.setup),
    Chapter("01_discrimination", numbers.discrimination),
    Chapter("02_calibration", numbers.calibration),
    Chapter("03_label_efficiency", numbers.label_efficiency),
    Chapter("04_robustness", numbers.robustness),
    Chapter("05_crs_bootstrap", numbers.crs_bootstrap),
    Chapter("05b_sensitivity", numbers.sensitivity, claims=False),
    Chapter("06_layer_depth", numbers.layer_depth),
    Chapter("07_lora", numbers.lora),
    Chapter("08_claims", numbers.claims_page, claims=False),
    Chapter("09_deployment", numbers.calibration, claims=False),
    Chapter("10_score_your_encoder", numbers.score_your_encoder, claims=False),
)}
"""Every chapter of the book, by notebook name, in book order."""


def chapter(name: str) -> Chapter:
    """The chapter of notebook ``name``; a ValueError naming the chapters when there is none."""
    if name not in CHAPTERS:
        raise ValueError(f"no chapter {name!r} (chapters: {', '.join(CHAPTERS)})")
    return CHAPTERS[name]


def chapter_numbers(analysis, name: str) -> dict:
    """This run's numbers that chapter ``name``'s prose quotes, formatted, keyed by their glue name
    (for :func:`crsrepro.present.report.html.glue_numbers`)."""
    return chapter(name).numbers(analysis)


def paper_vs_run(analysis, name: str):
    """Chapter ``name``'s closing box: its claims on the run's claims page
    (:func:`crsrepro.present.claims.run_claims`), the paper's value beside this run's
    (:func:`crsrepro.present.report.html.claims_box`)."""
    if not chapter(name).claims:
        raise ValueError(f"chapter {name!r} measures no claim of the paper, so it has no 'paper vs this run' box")
    return html.claims_box(claims.run_claims(analysis), name, analysis.profile)
