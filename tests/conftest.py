"""Shared pytest setup for tests/.

Hypothesis's default 200 ms per-example deadline trips over one-off costs that have nothing
to do with the property under test (jax tracing and compiling on the first example, a busy
2-core CI machine), so the deadline is off. Example counts stay at Hypothesis's defaults or
whatever each test sets.
"""
from hypothesis import settings

settings.register_profile("svg_lib", deadline=None)
settings.load_profile("svg_lib")
