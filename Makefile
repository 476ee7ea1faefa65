# Two commands for a fresh machine (needs python3 >= 3.11 with venv, git, make):
#   make lab    set up .venv with the learner's packages, then open JupyterLab on notebooks/
#   make test   set up .venv with the test tools too, then run every test: tests/ and each notebook
#               under nbval, then everything again on a replica of Colab's TPU runtime
#
# Setup runs once: it leaves a stamp file in .venv and is redone only when pyproject.toml
# changes or .venv is removed. Options: PYTHON=python3.12, LAB_ARGS="--no-browser",
# PYTEST_ARGS="-x -k masks", PYTEST_WORKERS=1 (pytest-xdist workers; default: one per core).
#
# `make lab` installs pyproject's `lab` extra: jax, jaxlib, JupyterLab. No test tools and no libtpu
# (Linux x86_64 wheels only), so it works on any OS jax installs on, a workshop's Macs included.
# `make test` installs the `dev` extra on top: pytest, nbval, hypothesis, Playwright, and libtpu
# (the TPU compiler, for the compile tests and cells).
#
# make test then runs `make test-colab` (tools/test-colab.sh): a replica of Colab's TPU runtime in
# .venv-colab, its packages at the versions tools/colab-tpu-runtime.txt records (jax 0.7.2, the
# floor pyproject.toml states), where every notebook runs through its own first cell from a
# working directory outside the repository, the unit tests run, and Colab's libtpu compiles the
# case study's size; it fails if anything changed the runtime's packages. Outputs are not
# compared there (numbers and messages may differ between jax versions), errors fail.
#
# make test also makes sure Debian's Chromium is at /usr/bin/chromium, for the browser test
# (tests/test_browser.py, driven by Playwright from the dev extra): tools/ensure-chromium.sh
# installs it with apt-get when run as root on Debian, and otherwise says the test will skip.

PYTHON      ?= python3
# jax needs Python >= 3.11: the lab extra's jax==0.10.2, and the floor (jax>=0.7.2) as well.
MIN_PYTHON  := 3.11
VENV        := .venv
VENV_PYTHON := $(VENV)/bin/python
LAB_STAMP   := $(VENV)/.svg-lib-lab
STAMP       := $(VENV)/.svg-lib-installed
LAB_ARGS    ?=
PYTEST_ARGS ?=
# pytest-xdist workers: one per core by default. --dist loadfile keeps each test file (its module
# fixtures: built and compiled kernels) and each notebook (its kernel) on one worker;
# --no-loadscope-reorder hands files out in collection order, where tests/conftest.py puts the
# slowest first. --durations prints the slowest items at the end of each stage.
PYTEST_WORKERS ?= auto
PYTEST_DIST    := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

.PHONY: lab test test-colab setup browser clean

# Jupyter refuses to start as root unless told; containers and cloud VMs often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

lab: $(LAB_STAMP)
	$(VENV_PYTHON) -m jupyterlab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# pytest reads testpaths and the nbval options (strict output comparison) from pyproject.toml.
# Exit status 5 means pytest collected nothing. tests/ always holds tests, so that points at
# a broken checkout or a PYTEST_ARGS filter that matches nothing; it stays a failure.
# The replica's environment is installed beside the pinned stage (tools/test-colab.sh --setup: mostly
# downloads), its log in .colab/setup.log; should that fail, make test-colab installs it again.
test: $(STAMP) browser
	@mkdir -p .colab; PYTHON=$(PYTHON) bash tools/test-colab.sh --setup > .colab/setup.log 2>&1 & setup=$$!; \
	status=0; SVG_LIB_REQUIRE_TPU_COMPILER=1 $(VENV_PYTHON) -m pytest $(PYTEST_DIST) $(PYTEST_ARGS) || status=$$?; \
	wait $$setup || { cat .colab/setup.log; echo "make test: installing the Colab replica beside the tests" \
	  "failed (above); make test-colab tries again" >&2; }; \
	if [ $$status -eq 5 ]; then \
	  echo "make test: pytest collected no tests (exit 5). tests/ should always have some:" \
	       "check the checkout and PYTEST_ARGS='$(PYTEST_ARGS)'." >&2; \
	fi; \
	exit $$status
	@$(MAKE) --no-print-directory test-colab

test-colab:
	@PYTHON=$(PYTHON) PYTEST_ARGS="$(PYTEST_ARGS)" PYTEST_WORKERS=$(PYTEST_WORKERS) bash tools/test-colab.sh

setup: $(STAMP) browser

# Checked on every run (cheap when the browser is there), not only when .venv is rebuilt.
browser:
	@bash tools/ensure-chromium.sh

# Both stamps check the Python first, then make .venv; the learner's setup installs less.
define make_venv
@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < tuple(map(int, "$(MIN_PYTHON)".split("."))))' || { \
  echo "make: the setup needs Python >= $(MIN_PYTHON) (for jax==0.10.2), but" \
       "'$(PYTHON)' is $$($(PYTHON) -V 2>&1). Run again with PYTHON=python3.11 or newer." >&2; \
  exit 1; }
@if [ ! -x $(VENV_PYTHON) ]; then \
  echo "$(PYTHON) -m venv $(VENV)"; \
  $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
    echo "make: '$(PYTHON) -m venv' failed. On Debian/Ubuntu install python3-venv" \
         "(apt-get install python3-venv) and run make again." >&2; \
    exit 1; }; \
fi
endef

$(LAB_STAMP): pyproject.toml
	$(make_venv)
	$(VENV_PYTHON) -m pip install -e ".[lab]"
	@touch $@

$(STAMP): pyproject.toml
	$(make_venv)
	$(VENV_PYTHON) -m pip install -e ".[dev]"
	@touch $@ $(LAB_STAMP)

clean:
	rm -rf $(VENV) .venv-colab .colab
