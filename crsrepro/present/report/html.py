"""The boxes a chapter shows beside its tables, and the glue that hands its prose this run's numbers.

The notebook's Markdown outputs are read as CommonMark, which has no directives, so a box is an IPython
HTML object styled as the book's own admonitions (the theme's ``admonition <kind>`` classes). A cell
whose function returns None shows nothing: :func:`frame_note` is None when the frame matches the run.
"""

from __future__ import annotations

import pandas as pd

#: Columns of the claims table that a chapter's "paper vs this run" box shows.
CLAIM_COLUMNS = ["claim", "paper value", "this run", "status"]
#: A "paper vs this run" box with more rows than this starts folded, so the chapter stays readable.
LONG_BOX = 10
#: The column widths of the box's table (claim, paper, this run, status); the table takes 90 % of the box, whose
#: children carry side margins, so that it fits inside.
_BOX_COLUMNS = ('<colgroup><col style="width: 52%"><col style="width: 14%"><col style="width: 14%">'
                '<col style="width: 20%"></colgroup>')


def paragraph(text: str) -> str:
    """Plain text with ``code`` spans as an HTML paragraph.

    >>> paragraph("run `crsrepro freeze-frame` <now>")
    '<p>run <code>crsrepro freeze-frame</code> &lt;now&gt;</p>'
    """
    import html
    import re

    return "<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False)) + "</p>"


def admonition(kind: str, title: str, body: str):
    """A box styled as the book's admonitions of ``kind`` (``note``, ``warning``, ``tip``), as an IPython
    HTML object; ``body`` is HTML (e.g. :func:`paragraph`).

    >>> admonition("note", "Title", "<p>Body</p>").data
    '<div class="admonition note"><p class="admonition-title">Title</p><p>Body</p></div>'
    """
    from IPython.display import HTML

    return HTML(f'<div class="admonition {kind}"><p class="admonition-title">{title}</p>{body}</div>')


def notes_list(notes, *, empty: str = "Nothing."):
    """Short notes (a list of strings) as an HTML bullet list, ``empty`` when there are none; for the
    "what was skipped, and why" cells, which would otherwise print a raw, clipped Python list.

    >>> notes_list(["a `b`", "c"]).data
    '<ul><li>a <code>b</code></li><li>c</li></ul>'
    >>> notes_list([]).data
    '<p>Nothing.</p>'
    """
    from IPython.display import HTML

    if not notes:
        return HTML(paragraph(empty))
    return HTML("<ul>" + "".join(f"<li>{paragraph(note)[3:-4]}</li>" for note in notes) + "</ul>")


def frame_note(analysis):
    """A warning box when the frozen frame was frozen from other results than the run's, else None
    (DESIGN.md section 12: the frame is frozen by an explicit command, never as a side effect)."""
    if analysis.frame_warning is None:
        return None
    return admonition("warning", "The reference frame does not match these results", paragraph(analysis.frame_warning))


def convergence_note(results: pd.DataFrame):
    """A warning box when more than :data:`crsrepro.analyse.probe_health.MAX_UNCONVERGED` of the run's
    linear-probe fits stopped before converging, else None (issue 24).

    >>> results = pd.DataFrame({"encoder": ["a", "b"], "dataset": "d", "seed": 0, "label_fraction": 1.0,
    ...                         "layer": "final", "probe": "linear", "probe_C": 1.0, "converged": [False, True]})
    >>> "1 of 2 linear-probe fits (50.0 %)" in convergence_note(results).data
    True
    >>> convergence_note(results.assign(converged=True)) is None
    True
    """
    from crsrepro.analyse.probe_health import MAX_UNCONVERGED, convergence_table

    total = convergence_table(results).loc["all"]
    if total["unconverged_share"] <= MAX_UNCONVERGED:
        return None
    return admonition("warning", "Some probes did not converge", paragraph(
        f"{int(total['unconverged'])} of {int(total['fits'])} linear-probe fits ({100 * total['unconverged_share']:.1f} %) "
        f"stopped at `probe.max_iter` before converging, more than the {100 * MAX_UNCONVERGED:.0f} % this book accepts: "
        "their AUROCs are those of probes that had not finished fitting. The table below names the encoders."))


def chapter_claims(claims: pd.DataFrame, notebook: str) -> pd.DataFrame:
    """The rows of a claims table (:func:`crsrepro.present.claims.run_claims`) that ``notebook`` measures,
    with the columns the chapter's box shows, indexed by claim id.

    >>> table = pd.DataFrame({"id": ["a", "b"], "claim": ["x", "y"], "paper value": ["1", "2"],
    ...                       "this run": ["1", ""], "notebook": ["00_setup", "01_discrimination"],
    ...                       "status": ["measured", "not measured"]})
    >>> chapter_claims(table, "00_setup").to_dict("index")
    {'a': {'claim': 'x', 'paper value': '1', 'this run': '1', 'status': 'measured'}}
    """
    return claims.loc[claims["notebook"] == notebook].set_index("id")[CLAIM_COLUMNS]


def claims_box(claims: pd.DataFrame, notebook: str, profile):
    """A chapter's closing box: each claim of ``notebook`` in the run's claims table ``claims``, the
    paper's value beside this run's (:func:`crsrepro.present.chapters.paper_vs_run` hands it the table).

    Claims that this run measures (status ``measured``) are compared; ``paper profile only`` rows
    show this run's analogue, which illustrates the analysis and checks nothing; claims this run
    cannot measure are counted, not listed. ``profile`` is the run's: its name titles the box, and
    its ``claims.paper_scope`` says whether the analogue rows need their note.
    """
    table = chapter_claims(claims, notebook)
    shown = table[table["this run"] != ""].rename(columns={"paper value": "paper"})
    body = (shown.to_html(index=False, border=0, classes="table").replace(
        "<table", '<table style="width: 90%; table-layout: fixed"', 1).replace("<thead>", _BOX_COLUMNS + "<thead>", 1)
            if len(shown) else paragraph("This run measures none of this chapter's claims."))
    missing = len(table) - len(shown)
    if missing:
        body += paragraph(f"{missing} more claim(s) of this chapter are not measured by this run (see the claims page).")
    if not profile.claims.paper_scope:
        body += paragraph("On this profile, `paper profile only` rows hold this run's analogue (its own leader, its own "
                          "cells): they illustrate the analysis and do not check the paper.")
    kind = "tip dropdown" if len(shown) > LONG_BOX else "tip"   # a long box starts folded (sphinx-togglebutton)
    return admonition(kind, f"Paper vs this run (profile {profile.name})", body)


#: The claims page's columns and their widths: the claim (its English gloss, the review's sentence under it)
#: and the note take the room, so that the page reads without sideways scrolling at 1280 px (issue 27.5).
_PAGE_COLUMNS = {"claim": 30, "paper value": 9, "this run": 9, "status": 11, "multiverse": 8, "note": 33}


def claims_page(claims: pd.DataFrame):
    """The claims page's table (:func:`crsrepro.present.claims.run_claims`) in a fixed layout: no row
    index; each claim's id and chapter under its English gloss, and the review's sentence (``source``)
    under those; the values, status, multiverse share and note beside it.

    >>> table = pd.DataFrame({"id": ["a"], "claim": ["x <y>"], "source": ["s"], "paper value": ["1"],
    ...                       "this run": ["1"], "notebook": ["00_setup"], "status": ["protocol"], "note": [""]})
    >>> html = claims_page(table).data
    >>> "x &lt;y&gt;" in html and "<code>a</code> · 00_setup" in html and "multiverse" not in html
    True
    """
    import html

    from IPython.display import HTML

    columns = [c for c in _PAGE_COLUMNS if c in claims.columns]
    width = sum(_PAGE_COLUMNS[c] for c in columns)
    head = "".join(f'<col style="width: {100 * _PAGE_COLUMNS[c] / width:.0f}%">' for c in columns)
    cells = lambda row: "".join(  # noqa: E731
        f"<td>{_claim_cell(row) if c == 'claim' else html.escape(str(row[c]))}</td>" for c in columns)
    rows = "".join(f"<tr>{cells(row)}</tr>" for _, row in claims.iterrows())
    return HTML(f'<table class="dataframe claims-page" style="width: 100%; table-layout: fixed">'
                f'<colgroup>{head}</colgroup><thead><tr>{"".join(f"<th>{c}</th>" for c in columns)}</tr></thead>'
                f"<tbody>{rows}</tbody></table>")


def _claim_cell(row) -> str:
    import html

    small = '<span style="font-size: 0.9em; opacity: 0.8"'  # the theme's <small> is sized in rem: larger than the cell
    return (f"{html.escape(str(row['claim']))}<br>{small}><code>{html.escape(str(row['id']))}</code> · "
            f"{html.escape(str(row['notebook']))}</span><br>{small} lang=\"zh\">{html.escape(str(row['source']))}</span>")


def glue_numbers(numbers: dict) -> None:
    """Glue each formatted number with myst-nb (not displayed here), for ``{glue:text}`name``` in the prose;
    a value that is an ``IPython.display.Markdown`` sentence is for ``{glue:md}`name```."""
    from myst_nb import glue

    for name, text in numbers.items():
        glue(name, text, display=False)
