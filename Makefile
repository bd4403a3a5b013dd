# Two commands do all the set-up on a fresh machine:
#   make book   # venv + install + demo world + run grid + papermill + Jupyter Book -> prints index.html
#   make test   # venv + install + Chromium for the browser test (apt, when missing) + pytest
#   make test-fast   # the same without the slow end-to-end tests (no book build)
#   make test-real-size   # opt-in: the real-size dry run of the three largest architectures: many minutes
# VENV=/path/to/env make ...  reuses an existing environment (the pinned torch build is several GB).
VENV ?= .venv
PROFILE ?= demo
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.crsrepro-installed

.PHONY: book test test-fast test-real-size browser install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

book: $(STAMP)
	$(PY) -m crsrepro book --profile $(PROFILE)

# pytest-xdist runs the tests on every core, handing out the groups of tests/conftest.py in its order
# (each shared fixture on one worker, the slow tests first); benchmarks/suite.py times it against one core
XDIST := -n auto --dist loadgroup --no-loadscope-reorder

test: $(STAMP) browser
	$(PY) -m pytest $(XDIST)

test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow"

test-real-size: $(STAMP)
	$(PY) -m pytest -m real_size

# Debian's chromium and chromium-driver for tests/test_browser.py (selenium comes with the test extra);
# installed only when missing, and only as root: otherwise the browser test skips and says why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "chromium/chromedriver missing and not root: tests/test_browser.py will skip"; fi

clean:
	rm -rf book/_build book/_generated
