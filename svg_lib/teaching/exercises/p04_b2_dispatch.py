"""Notebook 04's your-code piece, B2's dispatch: the checker is exercise E3's (`check_b2_dispatch`, the
path each grid step ran against the planner's classes, then the output against reference attention,
on `b2_exercise_attention`); here are the library's dispatch, the hints, and a dry run of a dispatch
over any plan (the case study's too)."""
from __future__ import annotations

from svg_lib.core.planner import FULL, PARTIAL
from svg_lib.teaching.exercises import e3_b2_dispatch
from svg_lib.teaching.exercises.e3_b2_dispatch import (MASK_FREE_PATH, MASKED_PATH,  # noqa: F401 (re-exported)
                                                      b2_exercise_attention)
from svg_lib.teaching.exercises.p03_b1 import b1_dry_run
from svg_lib.teaching.yourcode import Hints


def check_b2_dispatch(fn, *, seed: int = 0):
    """Notebook 04's check of `fn(step_class, tile, keep)`: exercise E3's, under the notebook's name."""
    return e3_b2_dispatch.check_b2_dispatch(fn, seed=seed, label="04 b2_dispatch")


def library_b2_dispatch(step_class, tile, keep):
    """B2's dispatch: FULL tiles the mask-free body, PARTIAL tiles the masked one, idle steps nothing."""
    from jax.experimental import pallas as pl

    pl.when(step_class == FULL)(lambda: tile(keep=None))
    pl.when(step_class == PARTIAL)(lambda: tile(keep=keep))


DISPATCH_SOLUTION = '''def b2_dispatch(step_class, tile, keep):
    pl.when(step_class == FULL)(lambda: tile(keep=None))      # the mask-free body
    pl.when(step_class == PARTIAL)(lambda: tile(keep=keep))   # the masked body
    # an idle step (EMPTY) matches neither branch: it runs nothing'''


def dispatch_hints():
    return Hints("b2_dispatch", (
        "step_class is read from SMEM while the kernel runs: each branch goes in pl.when(condition), "
        "not in a Python `if`.",
        "One branch per visited class, FULL and PARTIAL (imported from svg_lib): an idle step (EMPTY) must match "
        "neither, as its key tile was folded in at the step before. `step_class != EMPTY` as one branch's test "
        "would also send FULL tiles down the masked path (B1).",
        "Which body can a FULL tile skip the mask in, and which class still needs keep? pl.when takes the "
        "function to run, not its result: pl.when(condition)(lambda: ...).",
    ), DISPATCH_SOLUTION)


def b2_dry_run(plan, dispatch):
    """`dispatch` over `plan` in `b1_dry_run`'s kernel (blocks copied, nothing computed): `(resident,
    paths)`, `[nq, steps]` each, the key tile in VMEM and the bodies each grid step ran (MASK_FREE_PATH
    per mask-free run, MASKED_PATH per masked run)."""
    def step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
        dispatch(cls, lambda keep=None: tile(keep, i * block_q, kv_tile * block_kv), keep)

    return b1_dry_run(plan, step=step)
