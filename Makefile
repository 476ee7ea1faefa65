# Two commands for a fresh machine (needs python3 >= 3.11 with venv, git, make):
#   make lab    set up .venv, then open JupyterLab on notebooks/
#   make test   set up .venv, then run every test: tests/ and each notebook under nbval
#
# Setup runs once: it leaves a stamp file in .venv and is redone only when pyproject.toml
# changes or .venv is removed. Options: PYTHON=python3.12, LAB_ARGS="--no-browser",
# PYTEST_ARGS="-x -k masks".
#
# make test then runs the unit tests and every notebook a second time under the oldest jax
# that pyproject.toml admits (the floor, `jax>=X` there), in .venv-floor: `make test-floor`.
# Notebooks run top to bottom there without output comparison (nbval-lax): outputs may
# legitimately differ between jax versions, errors may not.
#
# make test also makes sure Debian's Chromium is at /usr/bin/chromium, for the browser test
# (tests/test_browser.py, driven by Playwright from the dev extra): tools/ensure-chromium.sh
# installs it with apt-get when run as root on Debian, and otherwise says the test will skip.

PYTHON      ?= python3
# jax needs Python >= 3.11: the dev extra's jax==0.10.2, and the floor (jax>=0.8.1) as well.
MIN_PYTHON  := 3.11
VENV        := .venv
VENV_PYTHON := $(VENV)/bin/python
STAMP       := $(VENV)/.svg-lib-installed
LAB_ARGS    ?=
PYTEST_ARGS ?=

# The floor environment: jax and jaxlib at pyproject.toml's lower bound, test tools, no dev
# extra (so no libtpu: it pairs with the pinned jax only; compiler tests skip there).
FLOOR_JAX    := $(shell sed -n 's/^ *"jax>=\([0-9][0-9.]*\)",.*/\1/p' pyproject.toml)
FLOOR_VENV   := .venv-floor
FLOOR_PYTHON := $(FLOOR_VENV)/bin/python
FLOOR_STAMP  := $(FLOOR_VENV)/.svg-lib-installed
FLOOR_TOOLS  := pytest nbval hypothesis
# Pinned-environment checks only: the browser test needs the dev extra's Playwright, and the
# environment-agreement test reads files, which does not depend on jax.
FLOOR_IGNORE := --ignore=tests/test_browser.py --ignore=tests/test_environment.py

.PHONY: lab test test-floor setup browser clean

# Jupyter refuses to start as root unless told; containers and cloud VMs often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

lab: $(STAMP)
	$(VENV_PYTHON) -m jupyterlab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# pytest reads testpaths and the nbval options (strict output comparison) from pyproject.toml.
# Exit status 5 means pytest collected nothing. tests/ always holds tests, so that points at
# a broken checkout or a PYTEST_ARGS filter that matches nothing; it stays a failure.
test: $(STAMP) browser
	@status=0; SVG_LIB_REQUIRE_TPU_COMPILER=1 $(VENV_PYTHON) -m pytest $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -eq 5 ]; then \
	  echo "make test: pytest collected no tests (exit 5). tests/ should always have some:" \
	       "check the checkout and PYTEST_ARGS='$(PYTEST_ARGS)'." >&2; \
	fi; \
	exit $$status
	@$(MAKE) --no-print-directory test-floor

# -o addopts replaces pyproject's --nbval (strict comparison) with --nbval-lax; the rest as there.
test-floor: $(FLOOR_STAMP)
	@echo "make test-floor: unit tests and notebooks under jax $(FLOOR_JAX) (the floor), outputs not compared"
	$(FLOOR_PYTHON) -m pytest -o addopts="" -ra --nbval-lax --nbval-current-env --nbval-cell-timeout=600 \
	  $(FLOOR_IGNORE) $(PYTEST_ARGS)

setup: $(STAMP) browser

# Checked on every run (cheap when the browser is there), not only when .venv is rebuilt.
browser:
	@bash tools/ensure-chromium.sh

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < tuple(map(int, "$(MIN_PYTHON)".split("."))))' || { \
	  echo "make: the development setup needs Python >= $(MIN_PYTHON) (for jax==0.10.2), but" \
	       "'$(PYTHON)' is $$($(PYTHON) -V 2>&1). Run again with PYTHON=python3.11 or newer." >&2; \
	  exit 1; }
	@if [ ! -x $(VENV_PYTHON) ]; then \
	  echo "$(PYTHON) -m venv $(VENV)"; \
	  $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	    echo "make: '$(PYTHON) -m venv' failed. On Debian/Ubuntu install python3-venv" \
	         "(apt-get install python3-venv) and run make again." >&2; \
	    exit 1; }; \
	fi
	$(VENV_PYTHON) -m pip install -e ".[dev]"
	@touch $@

$(FLOOR_STAMP): pyproject.toml
	@test -n "$(FLOOR_JAX)" || { echo "make: no 'jax>=X' line found in pyproject.toml's dependencies" >&2; exit 1; }
	@[ -x $(FLOOR_PYTHON) ] || { echo "$(PYTHON) -m venv $(FLOOR_VENV)"; $(PYTHON) -m venv $(FLOOR_VENV); }
	$(FLOOR_PYTHON) -m pip install "jax==$(FLOOR_JAX)" "jaxlib==$(FLOOR_JAX)" $(FLOOR_TOOLS) -e .
	@touch $@

clean:
	rm -rf $(VENV) $(FLOOR_VENV)
