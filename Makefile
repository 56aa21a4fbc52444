# Multi-Head Attention, step by step -- build and test entry points.
#
#   make book      build the HTML book into _build/html (strict: zero warnings)
#   make test      every check: notebooks (nbval), library, book build, browser
#   make execute   re-run book/**/*.ipynb in place (after a library change); NB=path.ipynb for one
#   make lab       add JupyterLab to .venv and open the chapters in it
#   make lint      ruff over mha_lib and tests
#   make clean     remove _build
#
# Everything runs from .venv/bin explicitly; nothing needs an activated venv.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV     := .venv
BIN      := $(VENV)/bin
PY       := $(BIN)/python
STAMP    := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

# Deterministic hashing in pytest, in the notebook kernels it starts and in `make execute`.
export PYTHONHASHSEED := 0
# The notebooks' stored figures come from the inline backend; a backend forced from the
# environment (e.g. MPLBACKEND=Agg in CI) would change their outputs, so never pass one on.
unexport MPLBACKEND

JB_BUILD := $(BIN)/jupyter-book build . -W -n --keep-going --all
PYTEST   := $(BIN)/pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: help setup book test execute lab lint clean chromium

help:
	@sed -n '3,9p' Makefile | sed 's/^# \{0,1\}//'

# --- set-up -----------------------------------------------------------------------
# Create the venv if missing, (re)install when requirements.txt or pyproject.toml change.
# --no-compile: Python compiles what it imports on first use; compiling all of torch,
# jupyterlab and the rest ahead took about a third of the install.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --no-compile -r requirements.txt
	touch $@

setup: $(STAMP)

# Debian's Chromium for the browser tests (Playwright drives /usr/bin/chromium; its own
# browser download is not used). Installed only when missing; needs root (or sudo).
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  echo "Installing Chromium from Debian (apt-get) ..."; \
	  SUDO=""; if [ "$$(id -u)" != 0 ]; then SUDO="sudo -n"; fi; \
	  $$SUDO apt-get update -q < /dev/null; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium < /dev/null; \
	fi

# --- targets ----------------------------------------------------------------------
book: $(STAMP)
	$(JB_BUILD)

# One pytest run over everything, on two workers (pytest-xdist) with one thread each: each
# notebook, and each test file, runs whole on one worker (--dist loadscope), in the order
# tests/conftest.py sets (the book build first), and the two workers share one build. (A second nbval run on ATEN_CPU_CAPABILITY=avx2 used to
# follow; AVX2 is this CPU's default kernel set, so it repeated the first run.)
test: $(STAMP) chromium
	OMP_NUM_THREADS=1 $(PYTEST) -n 2 --dist loadscope --no-loadscope-reorder

execute: $(STAMP)
	$(PY) tests/execute_notebooks.py $(NB)

# JupyterLab is the readers' tool, not the tests': installed on demand, at the version of
# requirements-notebooks.txt (the light set), so `make test` does not pay for it.
lab: $(STAMP)
	$(PY) -m pip install -q --no-compile "$$(grep '^jupyterlab==' requirements-notebooks.txt)"
	$(BIN)/jupyter lab book/

lint: $(STAMP)
	$(BIN)/ruff check mha_lib tests

clean:
	rm -rf _build
