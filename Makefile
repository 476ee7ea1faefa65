# Two commands for a fresh machine (needs python3 >= 3.11 with venv, git, make):
#   make lab    set up .venv, then open JupyterLab on notebooks/
#   make test   set up .venv, then run every test: tests/ and each notebook under nbval
#
# Setup runs once: it leaves a stamp file in .venv and is redone only when pyproject.toml
# changes or .venv is removed. Options: PYTHON=python3.12, LAB_ARGS="--no-browser",
# PYTEST_ARGS="-x -k masks".
#
# make test also makes sure Debian's Chromium is at /usr/bin/chromium, for the browser test
# (tests/test_browser.py, driven by Playwright from the dev extra): tools/ensure-chromium.sh
# installs it with apt-get when run as root on Debian, and otherwise says the test will skip.

PYTHON      ?= python3
# pyproject.toml allows Python 3.10 for svg_lib alone; the dev extra's jax==0.10.2 needs 3.11.
MIN_PYTHON  := 3.11
VENV        := .venv
VENV_PYTHON := $(VENV)/bin/python
STAMP       := $(VENV)/.svg-lib-installed
LAB_ARGS    ?=
PYTEST_ARGS ?=

.PHONY: lab test setup browser clean

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

clean:
	rm -rf $(VENV)
