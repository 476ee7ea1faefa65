"""E3, B2's dispatch inside svg_lib's own kernel: `b2_exercise_attention` (B2 with its dispatch
left to the learner), `check_b2_dispatch` and its hidden cases.

The references are the planner's step classes and `reference_attention`."""
from __future__ import annotations

import inspect
import re

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import Mask
from svg_lib.core.svg_masks import SVGMask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles
from svg_lib.kernels.grid import Pieces
from svg_lib.kernels.reference import reference_attention
from svg_lib.extensions.tolerances import tolerance
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish
from svg_lib.teaching.exercises.plugged import MASK_FREE as MASK_FREE_PATH
from svg_lib.teaching.exercises.plugged import MASKED as MASKED_PATH
from svg_lib.teaching.exercises.plugged import b2_dispatch_piece, path_words, plugged_attention


CODES_NOTE = " (compare with FULL and PARTIAL, imported from svg_lib, not with their codes)"


def _codes_note(fn) -> str:
    """CODES_NOTE for a dispatch whose source compares the class with a number, or cannot be read; else ""."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return CODES_NOTE
    return CODES_NOTE if re.search(r"(==|!=)\s*-?\d|\d\s*(==|!=)", source) else ""


def b2_exercise_attention(q, k, v, mask: Mask, dispatch, *, block_q: int = 128, block_kv: int = 128,
                          interpret=True, record: bool = True):
    """svg_lib's B2 (`forward.block_sparse_attention`, built by `grid.tile_step_call`) with its
    dispatch replaced by `dispatch(step_class, tile, keep)` (`plugged`).

    q, k, v `[heads, tokens, head_dim]` float32 (unscaled; scaled by 1/sqrt(head_dim) here).
    Returns `(out [heads, tokens, head_dim], paths [heads, q_tiles, steps] int32, plan)`: `paths`
    records, for every grid step, the tile bodies that ran: MASK_FREE_PATH (1) per mask-free
    run plus MASKED_PATH (16) per masked run, so 0 means the step computed nothing.
    `dispatch` receives the step's class (EMPTY / PARTIAL / FULL, read from SMEM), `tile`
    (call `tile(keep=None)` for the mask-free body or `tile(keep=keep)` for the masked one) and
    `keep`, the mask's elementwise predicate. With `record=False` nothing is recorded (`paths` is
    None): the kernel alone, to time it.
    """
    plan = plan_tiles(mask, block_q, block_kv)
    keep = mask.kernel_predicate(block_q, block_kv)
    pieces = Pieces(step=b2_dispatch_piece(dispatch, keep))
    outs = plugged_attention(q, k, v, plan, stage="b2", keep=keep, pieces=pieces, record=record, interpret=interpret)
    return (outs[0], outs[1], plan) if record else (outs, None, plan)


_DISPATCH_HINTS = {
    "TracerBool": ("step_class is read from SMEM while the kernel runs, so a Python `if` cannot see its value "
                   "when the kernel is traced: wrap each branch in pl.when(condition)"),
    "Concretization": ("step_class is a traced value, known only when the kernel runs: compare it inside "
                       "pl.when(...) instead of converting it to a Python value"),
    "callable": ("pl.when(condition) takes the function to run, not its result: "
                 "pl.when(condition)(lambda: ...)"),
}


def check_b2_dispatch(fn, *, seed: int = 0, label: str = "E3 b2_dispatch") -> CheckResult:
    """E3: `fn(step_class, tile, keep)` is B2's dispatch inside `b2_exercise_attention`.

    Runs the kernel in interpret mode on small SVG masks (one with key padding, one whose rows
    visit different numbers of tiles, so some grid steps are idle), checks which tile body every
    grid step ran against the planner's classes (FULL: mask-free once; PARTIAL: masked once;
    idle EMPTY steps: nothing), then the output against `reference_attention`.
    """
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    specs = [("a 3-frame video of 8 x 16 tokens (384 tokens, 3 x 3 tiles of 128), density 0.35",
              VideoGeometry(3, 8, 16), 0.35, True),
             ("4 frames of 8 x 15 tokens (480 tokens): the last key tile reaches into padding, some steps idle",
              VideoGeometry(4, 8, 15), 0.2, False)]
    cases = [_Case(name, dict(geometry=g, density=d, sink=sink, seed=int(rng.integers(2**31))))
             for name, g, d, sink in specs]

    def run(case):
        g = case.data["geometry"]
        mask = SVGMask.spatial(g, case.data["density"], first_frame_sink=case.data["sink"])
        keys = jax.random.split(jax.random.key(case.data["seed"]), 3)
        q, k, v = (jax.random.normal(key, (1, g.tokens, 128), jnp.float32) for key in keys)
        out, paths, plan = _call(b2_exercise_attention, "your dispatch (inside the kernel)", q, k, v, mask, fn,
                                 hints=_DISPATCH_HINTS)
        paths = np.asarray(paths)[0]
        expected = np.where(plan.step_class == FULL, MASK_FREE_PATH,
                            np.where(plan.step_class == PARTIAL, MASKED_PATH, 0))
        wrong = np.argwhere(paths != expected)
        if wrong.size:
            i, s = (int(x) for x in wrong[0])
            cls = int(plan.step_class[i, s])
            j = int(plan.kv_index[i, s])
            what = {FULL: "a FULL tile", PARTIAL: "a PARTIAL (edge) tile", EMPTY: "an idle step (class EMPTY)"}[cls]
            tile_words = f"key tile {j}" if cls != EMPTY else f"it repeats key tile {j} so that no DMA is issued"
            detail = (f"grid step (query tile {i}, step {s}) is {what} ({tile_words}): expected "
                      f"{path_words(int(expected[i, s]))}, your dispatch ran {path_words(int(paths[i, s]))}")
            got = int(paths[i, s])
            swapped = (((plan.step_class == FULL) & (paths == MASKED_PATH)).any()
                       and ((plan.step_class == PARTIAL) & (paths == MASK_FREE_PATH)).any())
            if swapped and cls != EMPTY:
                hint = ("your two bodies are swapped: FULL tiles ran the masked body (wasted work) and PARTIAL tiles "
                        "the mask-free one, whose dropped pairs leak into the softmax (wrong output)")
            elif cls == EMPTY:
                hint = ("an idle step must compute nothing: its key tile was already folded in at the step before, "
                        "so computing it adds that tile's keys a second time")
            elif got >= 2 * MASKED_PATH or got % MASKED_PATH >= 2 or (got % MASKED_PATH and got // MASKED_PATH):
                hint = "each visited step runs exactly one tile body: the conditions of your branches overlap"
            elif cls == FULL and got // MASKED_PATH:
                hint = ("a FULL tile keeps every pair, so the mask cannot change it: evaluating it anyway is the "
                        "per-element VPU work B1 pays and B2 removes" + _codes_note(fn))
            elif cls == PARTIAL and got % MASKED_PATH:
                hint = ("a PARTIAL tile is cut by the mask's edge (or reaches into key padding): without keep, its "
                        "dropped pairs leak into the softmax" + _codes_note(fn))
            else:
                hint = "every visited step must run one of the two tile bodies: which class did your branches leave out?"
            raise _Fail(detail, hint)
        want = np.asarray(reference_attention(q, k, v, mask))
        got_out = np.asarray(out)
        if not np.isfinite(got_out).all():   # only a keep that lets in the keys past the end does this
            bad = int((~np.isfinite(got_out)).sum())
            raise _Fail(f"every step ran the expected path, but {bad} output values are inf or NaN where reference "
                        "attention is finite", "the masked body must get `keep` as given: it masks the keys past "
                        "the end, whose blocks hold garbage. If yours passes it unchanged, run the check again, "
                        "and if this repeats, report it with this message: then svg_lib's kernel is at fault")
        # the learner's code is the dispatch only: svg_lib's tile body does the arithmetic, its matmuls
        # at float32 precision on every backend, so the kernels' float32 tolerance applies
        if not np.allclose(got_out, want, **tolerance("float32")):
            err = float(np.max(np.abs(got_out - want)))
            raise _Fail(f"every step ran the expected path, but the output differs from reference attention "
                        f"(max error {err:.2g})", "pass the `keep` you were given to the masked body, unchanged")

    return _finish(label, cases, run,
                   "every grid step ran the path its class asks for, and the outputs match reference attention")
