"""E3, B2's dispatch inside a working Pallas kernel: `b2_exercise_attention` (the kernel, its
dispatch left to the learner), `check_b2_dispatch` and its hidden cases.

The references are the planner's step classes and `reference_attention`."""
from __future__ import annotations

import math

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import Mask
from svg_lib.core.svg_masks import SVGMask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles
from svg_lib.kernels.forward import finish as finish_tile
from svg_lib.kernels.forward import init_state, plain_interpreter, online_softmax_tile, softmax_scratch
from svg_lib.kernels.reference import reference_attention
from svg_lib.kernels.tolerances import tolerance
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish


MASK_FREE_PATH, MASKED_PATH = 1, 16  # what the exercise kernel records per tile body run (16 so counts add up)


def b2_exercise_attention(q, k, v, mask: Mask, dispatch, *, block_q: int = 128, block_kv: int = 128,
                          interpret=True, record: bool = True):
    """The B2 kernel with its dispatch left to `dispatch(step_class, tile, keep)`.

    q, k, v `[heads, tokens, head_dim]` float32 (unscaled; scaled by 1/sqrt(head_dim) here).
    Returns `(out [heads, tokens, head_dim], paths [heads, q_tiles, steps] int32)`: `paths`
    records, for every grid step, the tile bodies that ran: MASK_FREE_PATH (1) per mask-free
    run plus MASKED_PATH (16) per masked run, so 0 means the step computed nothing.
    `dispatch` receives the step's class (EMPTY / PARTIAL / FULL, read from SMEM), `tile`
    (call `tile(keep=None)` for the mask-free body or `tile(keep=keep)` for the masked one) and
    `keep`, the mask's elementwise predicate. With `record=False` nothing is recorded (`paths` is
    None): the kernel alone, to time it.
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    heads, tokens, head_dim = q.shape
    plan = plan_tiles(mask, block_q, block_kv)
    # the plan's two tables as they are (the series' kernels read them packed, notebook 03)
    kv_index, step_class = (jnp.asarray(t, jnp.int32) for t in (plan.kv_index, plan.step_class))
    nq, steps = plan.kv_index.shape
    q_len, kv_len = nq * block_q, plan.grid[1] * block_kv
    keep = mask.kernel_predicate(block_q, block_kv)

    def kernel(kv_index_ref, step_class_ref, q_ref, k_ref, v_ref, o_ref, *rest):
        path_ref, m_ref, l_ref, acc_ref = rest if record else (None, *rest)
        i, s = pl.program_id(1), pl.program_id(2)

        if record:
            @pl.when((i == 0) & (s == 0))
            def _():
                path_ref[...] = jnp.zeros(path_ref.shape, jnp.int32)

        @pl.when(s == 0)
        def _():
            init_state(m_ref, l_ref, acc_ref)

        body = functools.partial(online_softmax_tile, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref,
                                 q_start=i * block_q, k_start=kv_index_ref[i, s] * block_kv,
                                 block_kv_compute=block_kv, interpret=plain_interpreter(interpret))

        def tile(keep=None):
            body(keep=keep)
            if record:
                path_ref[i, s] += MASK_FREE_PATH if keep is None else MASKED_PATH

        dispatch(step_class_ref[i, s], tile, keep)

        @pl.when(s == steps - 1)
        def _():
            finish_tile(m_ref, l_ref, acc_ref, o_ref, plain_interpreter(interpret))

    def q_map(h, i, s, kv_index_ref, *_):
        return h, i, 0

    def kv_map(h, i, s, kv_index_ref, *_):
        return h, kv_index_ref[i, s], 0

    def path_map(h, i, s, *_):
        return h, 0, 0

    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(heads, nq, steps),
            in_specs=[pl.BlockSpec((None, block_q, head_dim), q_map),
                      pl.BlockSpec((None, block_kv, head_dim), kv_map),
                      pl.BlockSpec((None, block_kv, head_dim), kv_map)],
            out_specs=[pl.BlockSpec((None, block_q, head_dim), q_map),
                       pl.BlockSpec((None, nq, steps), path_map)][:2 if record else 1],
            scratch_shapes=softmax_scratch(block_q, head_dim)),
        out_shape=[jax.ShapeDtypeStruct((heads, q_len, head_dim), q.dtype),
                   jax.ShapeDtypeStruct((heads, nq, steps), jnp.int32)][:2 if record else 1],
        interpret=interpret,
    )
    qs = q * (1.0 / math.sqrt(head_dim))
    out, paths = (*call(kv_index, step_class, jnp.pad(qs, ((0, 0), (0, q_len - tokens), (0, 0))),
                      jnp.pad(k, ((0, 0), (0, kv_len - tokens), (0, 0))),
                      jnp.pad(v, ((0, 0), (0, kv_len - tokens), (0, 0)))), None)[:2]
    return out[:, :tokens], paths, plan


def _path_words(code: int) -> str:
    free, masked = code % MASKED_PATH, code // MASKED_PATH
    parts = []
    if free:
        parts.append("the mask-free body" + (f" {free} times" if free > 1 else ""))
    if masked:
        parts.append("the masked body" + (f" {masked} times" if masked > 1 else ""))
    return " and ".join(parts) if parts else "nothing"


_DISPATCH_HINTS = {
    "TracerBool": ("step_class is read from SMEM while the kernel runs, so a Python `if` cannot see its value "
                   "when the kernel is traced: wrap each branch in pl.when(condition)"),
    "Concretization": ("step_class is a traced value, known only when the kernel runs: compare it inside "
                       "pl.when(...) instead of converting it to a Python value"),
}


def check_b2_dispatch(fn, *, seed: int = 0) -> CheckResult:
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
                      f"{_path_words(int(expected[i, s]))}, your dispatch ran {_path_words(int(paths[i, s]))}")
            got = int(paths[i, s])
            if cls == EMPTY:
                hint = ("an idle step must compute nothing: its key tile was already folded in at the step before, "
                        "so computing it adds that tile's keys a second time")
            elif got >= 2 * MASKED_PATH or got % MASKED_PATH >= 2 or (got % MASKED_PATH and got // MASKED_PATH):
                hint = "each visited step runs exactly one tile body: the conditions of your branches overlap"
            elif cls == FULL and got // MASKED_PATH:
                hint = ("a FULL tile keeps every pair, so the mask cannot change it: evaluating it anyway is the "
                        "per-element VPU work B1 pays and B2 removes")
            elif cls == PARTIAL and got % MASKED_PATH:
                hint = ("a PARTIAL tile is cut by the mask's edge (or reaches into key padding): without keep, its "
                        "dropped pairs leak into the softmax")
            else:
                hint = "every visited step must run one of the two tile bodies: which class did your branches leave out?"
            raise _Fail(detail, hint)
        want = np.asarray(reference_attention(q, k, v, mask))
        got_out = np.asarray(out)
        # the learner's code is the dispatch only: svg_lib's tile body does the arithmetic, its matmuls
        # at float32 precision on every backend, so the kernels' float32 tolerance applies
        if not np.allclose(got_out, want, **tolerance("float32")):
            err = float(np.max(np.abs(got_out - want)))
            raise _Fail(f"every step ran the expected path, but the output differs from reference attention "
                        f"(max error {err:.2g})", "pass the `keep` you were given to the masked body, unchanged")

    return _finish("E3 b2_dispatch", cases, run,
                   "every grid step ran the path its class asks for, and the outputs match reference attention")
