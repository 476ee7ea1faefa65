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
    from svg_lib.tpu import compiler

    if not has_libtpu():
        message = f"libtpu (the TPU compiler) is not installed: {INSTALL_HINT}"
        if os.environ.get("SVG_LIB_REQUIRE_TPU_COMPILER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return compiler
