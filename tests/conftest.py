"""Shared pytest setup for tests/.

Hypothesis's default 200 ms per-example deadline trips over one-off costs that have nothing
to do with the property under test (jax tracing and compiling on the first example, a busy
2-core CI machine), so the deadline is off. Example counts stay at Hypothesis's defaults or
whatever each test sets.
"""
from hypothesis import settings

settings.register_profile("svg_lib", deadline=None)
settings.load_profile("svg_lib")


# --- the TPU compiler (libtpu) ---------------------------------------------------------------
# Tests that compile for a TPU topology on this CPU take the `tpu_compiler` fixture. Without
# libtpu they skip (an environment testing the jax floor has no matching libtpu), except when
# SVG_LIB_REQUIRE_TPU_COMPILER=1 is set, as `make test` does for the pinned environment: there a
# missing compiler is a failure, never a silent skip.
import os

import pytest


@pytest.fixture(scope="session")
def tpu_compiler():
    from svg_lib.environment import INSTALL_HINT, has_libtpu
    from svg_lib.instruments.tpu import compiler

    if not has_libtpu():
        message = f"libtpu (the TPU compiler) is not installed: {INSTALL_HINT}"
        if os.environ.get("SVG_LIB_REQUIRE_TPU_COMPILER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return compiler


# --- the order pytest-xdist hands out files ---------------------------------------------------
# `make test` runs `-n auto --dist loadfile --no-loadscope-reorder`: each worker takes the next
# whole file (or notebook) in collection order when it runs low. A file that takes minutes, started
# last, leaves the other core idle until it ends, so the slowest ones are put first, longest first;
# the rest keep their order and fill in behind. Seconds of worker time measured by
# `--durations=0` on the 2-core machine under other load (fa3d977, 2026-12-04), the notebooks by
# tools/execute-notebooks.py; only the order matters, so a stale figure costs time, never coverage.
SLOWEST_FIRST = (
    "tests/test_knobs.py",                           # 562 s with 24 papermill runs of the spine (~25 s each); 20 now
    "tests/test_compiler.py",                        # 693 s: every method at the blog's size, 2 chips
    "tests/test_bounded_max.py",                     # 573 s
    "tests/test_backward.py",                        # 564 s
    "notebooks/09_scaling_out.ipynb",                # 505 s: the blog's 8-chip layer compiled
    "tests/test_vmem.py",                            # ~520 s: estimate against the compiler
    "tests/test_in_model.py",                        # 366 s
    "tests/test_lowering.py",                        # 294 s
    "tests/test_cores.py",                           # 289 s
    "tests/test_multichip.py",                       # 273 s
    "tests/test_bench.py",                           # 224 s
    "tests/test_kernels.py",                         # 180 s
    "tests/test_routing.py",                         # 174 s
    "tests/test_sliding.py",                         # 173 s
    "notebooks/11_training_with_sparse_attention.ipynb",  # 146 s
    "tests/test_masks.py",                           # 119 s
    "notebooks/10_sliding_tiles.ipynb",              # 115 s
)


# --- what the replica of Colab's runtime leaves to the pinned stage -----------------------------
# Runs under the interpreter that simulates a TPU's memory (`pltpu.InterpretParams`) are marked
# `tpu_interpreter`. They check the kernels against TPU semantics with the pinned jax; a Colab
# reader never runs that interpreter (on a TPU the kernels compile), so the replica of Colab's
# runtime (tools/test-colab.sh sets SVG_LIB_REPLICA=1) skips them and runs the plain interpreter's.
# What only a chip or a topology a Colab runtime never has exercises (Colab offers one v5e or v6e
# chip: not a v4, a v5p, a v7x's two devices or several chips) is marked `not_on_colab`: the
# replica skips it too; the pinned stage runs it. Notebook 09 compiles a v6e:2x4 layer in both.
def pytest_configure(config):
    config.addinivalue_line("markers", "tpu_interpreter: runs under pltpu.InterpretParams; pinned stage only")
    config.addinivalue_line("markers", "tpu: needs a real TPU (the kernels compiled and run); skips elsewhere")
    config.addinivalue_line("markers", "not_on_colab: a chip or topology Colab does not offer; pinned stage only")
    config.addinivalue_line("markers", "knobs: a spine notebook run by papermill at other tile sizes; pinned stage only")
    config.addinivalue_line("markers", "lesson: a test of the lesson's core, no compiler (pytest -m lesson; tests/conftest.py)")


# --- the lesson's tests alone -------------------------------------------------------------------
# `pytest -m lesson` runs the tests of the lesson's rooms (core, methods, problem, runtime, memory,
# kernels, attention: ARCHITECTURE.md) without what made the figures: no test that takes the TPU
# compiler (`tpu_compiler`), no run under the interpreter that simulates a TPU (`tpu_interpreter`),
# no notebook. A few minutes on two cores, for a change to the lesson.
LESSON_FILES = {f"tests/test_{name}.py" for name in (
    "geometry", "masks", "planner", "sliding", "radial", "methods", "problem", "runtime", "vmem", "smem",
    "reference", "kernels", "backward", "bounded_max", "precision", "device_plan", "splash_mask", "nan",
    "yourcode")}


def pytest_collection_modifyitems(config, items):
    """Slowest files first (SLOWEST_FIRST), the rest after them in collection order. A stable sort
    by file only: the tests of a file, and a notebook's cells, keep their own order."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
    for item in items:
        if (item.nodeid.split("::", 1)[0] in LESSON_FILES and "tpu_compiler" not in getattr(item, "fixturenames", ())
                and item.get_closest_marker("tpu_interpreter") is None):
            item.add_marker(pytest.mark.lesson)
    if any(item.get_closest_marker("tpu") is not None for item in items):
        import jax
        if jax.devices()[0].platform != "tpu":
            skip = pytest.mark.skip(reason=f"needs a real TPU; jax runs on {jax.devices()[0].platform} here "
                                           "(CI has none: run `pytest -m tpu` on a TPU machine)")
            for item in items:
                if item.get_closest_marker("tpu") is not None:
                    item.add_marker(skip)
    if os.environ.get("SVG_LIB_REPLICA") == "1":
        reasons = {"tpu_interpreter": "TPU-interpreter runs are the pinned stage's (tests/conftest.py)",
                   "not_on_colab": "a chip or topology Colab does not offer: the pinned stage's (tests/conftest.py)"}
        for item in items:
            for marker, reason in reasons.items():
                if item.get_closest_marker(marker) is not None:
                    item.add_marker(pytest.mark.skip(reason=reason))


# --- where the time went, per file ------------------------------------------------------------
# `--durations` names the slowest single items (a notebook's cells are items); this sums each
# file's setup, call and teardown, so the list above can be kept in order. Printed with
# --durations only. Under xdist the reports reach the controller, which prints the summary.
_FILE_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption("durations", None) or not _FILE_SECONDS:
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
    terminalreporter.write_sep("=", f"slowest {len(slowest)} files (seconds of one worker)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f}s  all {len(_FILE_SECONDS)} files")
