"""The built book loads nothing from the web: MathJax, fonts and scripts are served from ``_static``.

DESIGN.md section 12: formulas showed as raw LaTeX offline because MathJax came from a CDN. This test reads every
built page of the shared smoke book and lists each script, stylesheet or image it would fetch from an
absolute ``http(s)://`` (or protocol-relative ``//``) address.
"""

import re
from html.parser import HTMLParser

import pytest

#: ``<link rel=...>`` kinds that make the browser fetch the address (``canonical`` or ``index`` do not).
FETCHING_LINKS = {"stylesheet", "preload", "modulepreload", "icon"}


#: A stylesheet rule that fetches from the web: ``url(https://...)`` or ``@import "//..."``.
EXTERNAL_CSS = re.compile(r"""(?:url\(|@import)\s*['"]?\s*(?:https?:)?//""", re.IGNORECASE)


def _is_external(url: str | None) -> bool:
    return bool(url) and url.strip().lower().startswith(("http://", "https://", "//"))


class _ExternalResources(HTMLParser):
    """Collects ``(tag, url)`` for every external resource a page fetches when it is opened."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe") and _is_external(attrs.get("src")):
            self.found.append((tag, attrs["src"]))
        rel = set((attrs.get("rel") or "").lower().split())
        if tag == "link" and rel & FETCHING_LINKS and _is_external(attrs.get("href")):
            self.found.append((tag, attrs["href"]))


def external_resources(html: str) -> list[tuple[str, str]]:
    """The external resources a page fetches.

    >>> external_resources('<script src="https://cdn.x/mj.js"></script><script src="_static/a.js"></script>')
    [('script', 'https://cdn.x/mj.js')]
    >>> external_resources('<link rel="stylesheet" href="//fonts.x/f.css"><link rel="canonical" href="https://a">')
    [('link', '//fonts.x/f.css')]
    >>> bool(EXTERNAL_CSS.search("@font-face{src:url('https://f.x/a.woff')}")), bool(EXTERNAL_CSS.search("url(a.woff)"))
    (True, False)
    """
    parser = _ExternalResources()
    parser.feed(html)
    return parser.found


@pytest.mark.slow
def test_built_pages_load_nothing_from_the_web(smoke_book):
    pages = smoke_book.pages()
    assert len(pages) >= 5
    offending = {str(page.relative_to(smoke_book.html)): found for page in pages
                 if (found := external_resources(page.read_text()))}
    assert not offending, f"pages fetch external resources: {offending}"
    stylesheets = [str(css.relative_to(smoke_book.html)) for css in (smoke_book.html / "_static").rglob("*.css")
                   if EXTERNAL_CSS.search(css.read_text(errors="replace"))]
    assert not stylesheets, f"stylesheets fetch from the web (fonts?): {stylesheets}"
    # MathJax itself is vendored: the pages point at the copy in _static, and it is there.
    assert "_static/mathjax/tex-chtml.js" in (smoke_book.html / "book" / "methods.html").read_text()
    assert (smoke_book.html / "_static" / "mathjax" / "tex-chtml.js").is_file()
