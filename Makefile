# Two commands do all the set-up on a fresh machine:
#   make book   # venv + install + demo world + run grid + papermill + Jupyter Book -> prints index.html
#   make test   # venv + install + pytest
# VENV=/path/to/env make ...  reuses an existing environment (the pinned torch build is several GB).
VENV ?= .venv
PROFILE ?= demo
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.crsrepro-installed

.PHONY: book test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

book: $(STAMP)
	$(PY) -m crsrepro book --profile $(PROFILE)

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf book/_build book/_generated
