"""The learner's pieces run inside svg_lib's own block-sparse forward (`forward.block_sparse_attention`
through `grid.tile_step_call`), plugged in as `grid.Pieces`: each adapter here turns a notebook's
contract into the library's, so that the piece the learner wrote is the code that runs.

    notebook 01  tile_body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep)   -> Pieces.body
    notebook 03  kv_map(h, i, s, schedule_ref, *, steps)                        -> Pieces.kv_map
    notebook 03  b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv)  -> Pieces.step
    notebook 03  b1_grid_spec(tables, *, heads, query_tiles, steps, ...)         -> Pieces.grid_spec
    notebook 04  b2_dispatch(step_class, tile, keep)                            -> Pieces.step

`plugged_attention` runs the forward over a plan with such pieces and, with `record`, what each grid
step ran (`Hooks` that add three outputs). One mask, so every head follows the plan's rows.
"""
from __future__ import annotations

import math

import numpy as np

from svg_lib.kernels.forward import block_sparse_attention, real_part, token_ids
from svg_lib.kernels.grid import Hooks, Pieces
from svg_lib.methods import METHODS

MASK_FREE, MASKED = 1, 16  # what a recorded step adds per mask-free / masked tile body run (16: counts add up)
RECORDED = ("paths", "q_starts", "k_starts")


class _ReadOnly:
    """A ref-like view of a value: `x[...]`, `.shape`, `.dtype`; what a learner's body reads as v_ref
    where the last key tile's rows past the end must read as zeros (a select on the loaded block)."""

    def __init__(self, value):
        self._value = value
        self.shape, self.dtype = value.shape, value.dtype

    def __getitem__(self, index):
        return self._value[index]


def tile_body_piece(body):
    """Notebook 01's `body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep)` as `Pieces.body`.

    The learner's body folds the whole `[block_kv, head_dim]` tile at once, with m and l one number per
    row (`[block_q, 1]`: lane 0 of the library's `[block_q, 128]` state, whose other lanes of l stay 0,
    so the library's lane sum in `finish` is the learner's l) and `keep` a bool `[block_q, block_kv]`
    (None on a mask-free tile). After it, m is copied across the lanes, the layout `finish` reads."""
    import jax.numpy as jnp

    def piece(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, keep, q_start, k_start, block_kv_compute,
              interpret=False, bounded=False, kv_tokens=None, unrolled=frozenset()):
        block_q, block_kv = q_ref.shape[0], k_ref.shape[0]
        tile_keep = None
        if keep is not None:
            tile_keep = jnp.broadcast_to(keep(token_ids(q_start, block_q, 0), token_ids(k_start, block_kv, 1)),
                                         (block_q, block_kv))
        values = v_ref if keep is None or kv_tokens is None else _ReadOnly(real_part(v_ref[...], k_start, kv_tokens))
        body(q_ref, k_ref, values, m_ref.at[:, 0:1], l_ref.at[:, 0:1], acc_ref, tile_keep)
        m_ref[...] = jnp.broadcast_to(m_ref[:, 0:1], m_ref.shape)
    return piece


def kv_map_piece(kv_map, *, steps: int):
    """Notebook 03's `kv_map(h, i, s, schedule_ref, *, steps)` as `Pieces.kv_map` (one mask: the
    schedule's rows are the plan's query tiles; no head order)."""
    def piece(h, i, s, *, head_kind_ref, schedule_ref, head_order_ref):
        return tuple(kv_map(h, i, s, schedule_ref, steps=steps))
    return piece


OWN_SCRATCH = ("m", "l", "acc")   # the scratch a learner's grid spec declares; the library's rest is handed over


def grid_spec_piece(grid_spec):
    """Notebook 03's `b1_grid_spec(tables, *, heads, query_tiles, steps, block_q, block_kv, head_dim, kv_map,
    out_specs, more_in_specs, more_scratch)` as `Pieces.grid_spec`.

    The learner declares the grid, the q, k and v blocks (q's index map their own, k's and v's the
    `kv_map` handed over: the `Pieces.kv_map` where there is one) and the softmax state's scratch
    (`OWN_SCRATCH`); the library hands over what its kernel adds: the inputs after q, k and v, the
    output blocks, and the scratch after the state (the bounded max's flag, any hook's). One mask, no
    head order: the query block of grid row h is head h's."""
    def piece(schedule, sizes, *, q_shape, q_map, kv_map, extra_in_specs, out_specs, scratch_shapes):
        heads, _, head_dim = q_shape
        return grid_spec(schedule.tables, heads=heads, query_tiles=schedule.query_tiles, steps=schedule.steps,
                         block_q=sizes.block_q, block_kv=sizes.block_kv, head_dim=head_dim, kv_map=kv_map,
                         out_specs=list(out_specs), more_in_specs=list(extra_in_specs),
                         more_scratch=list(scratch_shapes)[len(OWN_SCRATCH):])
    return piece


def path_words(code: int) -> str:
    """A recorded step's code (`MASK_FREE` per mask-free run plus `MASKED` per masked run) in words."""
    free, masked = code % MASKED, code // MASKED
    parts = [f"the {name} body" + (f" {n} times" if n > 1 else "")
             for name, n in (("mask-free", free), ("masked", masked)) if n]
    return " and ".join(parts) if parts else "nothing"


def _record(step, keep, q_start=None, k_start=None):
    """Add the body a step ran to the recording outputs, where there are any."""
    paths = step.refs.get("paths_ref")
    if paths is None:
        return
    paths[step.i, step.s] += MASK_FREE if keep is None else MASKED
    if q_start is not None:
        step.refs["q_starts_ref"][step.i, step.s] = q_start
        step.refs["k_starts_ref"][step.i, step.s] = k_start


def b1_step_piece(b1_step, keep, *, block_q: int, block_kv: int):
    """Notebook 03's `b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv)` as `Pieces.step`.

    The learner's `tile(keep, q_start, k_start)` runs the library's tile with the learner's predicate
    read at the learner's offsets: the library's body asks it about the tokens of the step's tiles,
    shifted by how far the learner's offsets lie from them (none, when they are right)."""
    def piece(step, free, masked, *, method, run):
        def tile(keep, q_start, k_start):
            _record(step, keep, q_start, k_start)
            if keep is None:
                run(None)
                return
            dq, dk = q_start - step.i * block_q, k_start - step.kv_tile * block_kv
            run(lambda q_ids, k_ids: keep(q_ids + dq, k_ids + dk))

        b1_step(step.i, step.s, step.kv_tile, step.cls, tile, keep, block_q=block_q, block_kv=block_kv)
    return piece


def b2_dispatch_piece(dispatch, keep):
    """Notebook 04's `dispatch(step_class, tile, keep)` as `Pieces.step`: `tile(keep=None)` runs the
    library's mask-free tile, `tile(keep=keep)` its tile under that predicate."""
    def piece(step, free, masked, *, method, run):
        def tile(keep=None):
            _record(step, keep)
            run(keep)

        dispatch(step.cls, tile, keep)
    return piece


def recorder(heads: int, nq: int, steps: int) -> Hooks:
    """`Hooks` adding three int32 outputs `[heads, nq, steps]` (`RECORDED`): per grid step, the bodies
    it ran (MASK_FREE per mask-free run plus MASKED per masked run) and the offsets the last run was
    given (-1: none recorded)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def whole(h, i, s, *tables):  # one block per head, resident while its query tiles run
        return h, 0, 0

    def out_shapes(q_map):
        return [(jax.ShapeDtypeStruct((heads, nq, steps), jnp.int32), pl.BlockSpec((None, nq, steps), whole))] * 3

    def start(step):
        @pl.when(step.i == 0)
        def _():
            r = step.refs
            r["paths_ref"][...] = jnp.zeros((nq, steps), jnp.int32)
            r["q_starts_ref"][...] = jnp.full((nq, steps), -1, jnp.int32)
            r["k_starts_ref"][...] = jnp.full((nq, steps), -1, jnp.int32)

    return Hooks(name="recorded", outputs=RECORDED, out_shapes=out_shapes, start=start)


def plugged_attention(q, k, v, plan, *, stage: str, keep, pieces: Pieces | None = None, record: bool = False,
                      interpret=True, block_kv_compute: int | None = None):
    """svg_lib's block-sparse forward over `plan` (`planner.plan_tiles`) with `pieces` in place of the library's.

    q, k, v `[heads, tokens, head_dim]` (unscaled; q is scaled by 1/sqrt(head_dim) here). `stage`: the
    method whose record picks the library's own step (where `pieces.step` is None); `keep` the
    predicate of the masked tiles. Returns the output `[heads, tokens, head_dim]`, and with `record`
    `(out, paths, q_starts, k_starts)`, the last three NumPy int32 `[heads, nq, steps]` (`recorder`)."""
    import jax.numpy as jnp

    heads, _, head_dim = q.shape
    nq, steps = plan.kv_index.shape
    qs = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    outs = block_sparse_attention(
        qs, k, v, jnp.zeros((heads,), jnp.int32), jnp.asarray(plan.schedule, jnp.int32), steps=steps, method=METHODS[stage],
        keep=keep, block_q=plan.block_q, block_kv=plan.block_kv,
        block_kv_compute=plan.block_kv if block_kv_compute is None else block_kv_compute, interpret=interpret,
        hooks=recorder(heads, nq, steps) if record else None, pieces=pieces)
    if not record:
        return outs
    out, *recorded = outs
    return (out, *(np.asarray(r) for r in recorded))
