"""The built smoke book read in a real browser, page by page, as a new reader meets it (DESIGN.md section 12).

Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them when missing) are driven by
PyPI selenium through ``/usr/bin/chromedriver``, set explicitly so that selenium-manager never runs
(it would download a browser). Each page fails on a broken image, formulas left as raw LaTeX, a
missing glued number, or a console error.
"""

import importlib.util
import re
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Flags for headless Chromium as root in a container, with no network traffic of its own.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking")
#: LaTeX that MathJax would have typeset; seen in the page's prose it means math did not render.
RAW_LATEX = re.compile(r"\\\[|\\\]|\\\(|\\\)|\$\$|\\(?:mathrm|frac|sum|operatorname|begin|text)\b")
#: Seconds to wait for a page to load and MathJax to finish typesetting it (CI machines are slow at times).
MATHJAX_TIMEOUT = 60

# Runs in the page: waits until the document is parsed and MathJax (when the page loads it) has typeset,
# then reports what a reader would see. Any error on the way is reported, never left to a timeout.
INSPECT_PAGE = r"""
const done = arguments[arguments.length - 1];
const parsed = new Promise(resolve => {
  const check = () => (document.readyState === "complete" && document.body) ? resolve() : setTimeout(check, 50);
  check();
});
parsed.then(() => (window.MathJax && MathJax.startup) ? MathJax.startup.promise : null).then(() => {
  const main = document.querySelector("main") || document.body;
  const prose = main.cloneNode(true);
  prose.querySelectorAll("pre, code, script, style, mjx-container").forEach(e => e.remove());
  done({
    broken_images: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
    untypeset_math: Array.from(main.querySelectorAll(".math")).filter(e => !e.querySelector("mjx-container"))
                         .map(e => e.textContent.slice(0, 80)),
    prose: prose.textContent,
    warnings: Array.from(main.querySelectorAll(".system-message, .problematic"))
                   .map(e => e.textContent.trim().slice(0, 200)),
    glued: Array.from(main.querySelectorAll(".pasted-text")).map(e => e.textContent.trim()),
    roles: Array.from(main.querySelectorAll("code")).map(e => e.textContent.trim())
                .filter(t => /^\{[\w-]+(:[\w-]+)?\}$/.test(t)),
  });
}).catch(err => done({error: String(err)}));
"""


def _browser():
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if importlib.util.find_spec("selenium") is None:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        pytest.skip(f"browser test needs {', '.join(missing)}: `make test` installs them "
                    "(apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(MATHJAX_TIMEOUT)
    return driver


def page_problems(driver, url: str) -> list[str]:
    """What is wrong with the page at ``url`` as a reader sees it (an empty list: nothing)."""
    from selenium.common.exceptions import TimeoutException

    driver.get(url)
    try:
        seen = driver.execute_async_script(INSPECT_PAGE)
    except TimeoutException:
        driver.get_log("browser")  # this page's console entries stay with it, not with the next page
        return [f"MathJax did not finish typesetting within {MATHJAX_TIMEOUT} s"]
    if "error" in seen:
        driver.get_log("browser")
        return [f"the page could not be inspected (MathJax or the page script failed): {seen['error']}"]
    problems = [f"broken image {src}" for src in seen["broken_images"]]
    problems += [f"math not typeset: {text!r}" for text in seen["untypeset_math"]]
    prose = " ".join(seen["prose"].split())
    problems += [f"raw LaTeX in the text: ...{prose[max(m.start() - 40, 0):m.end() + 40]!r}..."
                 for m in RAW_LATEX.finditer(prose)]
    problems += [f"build warning shown in the page (a missing glue key?): {text!r}" for text in seen["warnings"]]
    problems += [f"empty or NaN glued value {text!r}" for text in seen["glued"] if text.lower() in ("", "nan")]
    problems += [f"a MyST role shown as code, not rendered (inside backticks?): {text!r}" for text in seen["roles"]]
    problems += [f"console error: {entry['message']}" for entry in driver.get_log("browser")
                 if entry["level"] == "SEVERE"]
    return problems


@pytest.mark.slow
def test_every_page_reads_cleanly_in_chromium(smoke_book):
    driver = _browser()
    try:
        problems = {str(page.relative_to(smoke_book.html)): found for page in smoke_book.pages()
                    if (found := page_problems(driver, page.as_uri()))}
    finally:
        driver.quit()
    assert not problems, "\n".join(f"{page}: {p}" for page, found in problems.items() for p in found)
