"""The learner's pieces run inside the library's own block-sparse forward (`grid.Pieces`, adapted by
`teaching.exercises.plugged`): a right piece gives the library's output, a wrong one changes it.

Interpret mode on a CPU, one head of 480 tokens (the last key tile partial) in 128 x 128 tiles."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles, schedule_entry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.kernels.forward import MASK_VALUE, block_sparse_attention
from svg_lib.kernels.grid import Pieces, library_grid_spec
from svg_lib.methods import METHODS
from svg_lib.extensions.tolerances import tolerance
from svg_lib.teaching.exercises.p03_b1 import b1_learner_attention
from svg_lib.teaching.exercises.p04_b2_dispatch import b2_exercise_attention
from svg_lib.teaching.exercises.plugged import (b1_step_piece, b2_dispatch_piece, grid_spec_piece, kv_map_piece,
                                                tile_body_piece)

BLOCK = 128
MASK = SVGMask.spatial(VideoGeometry(4, 8, 15), 0.2)
PLAN = plan_tiles(MASK, BLOCK, BLOCK)
KEEP = MASK.kernel_predicate(BLOCK, BLOCK)
STEPS = PLAN.kv_index.shape[1]


def _qkv():
    keys = jax.random.split(jax.random.key(3), 3)
    q, k, v = (jax.random.normal(key, (1, MASK.tokens, 64), jnp.float32) for key in keys)
    # q pre-scaled by 1/sqrt(head_dim), as the forward takes it: logits of a unit spread, as in attention, so
    # one bf16 pass of the MXU (a float32 body stating no precision, on a TPU) stays within its tolerance
    return q / 8.0, k, v


QKV = _qkv()


def forward(stage, pieces=None, block_kv_compute=BLOCK):
    """The library's forward over PLAN, with `pieces` in place of its own."""
    out = block_sparse_attention(*QKV, jnp.zeros((1,), jnp.int32), jnp.asarray(PLAN.schedule), steps=STEPS,
                                 method=METHODS[stage], keep=KEEP, block_q=BLOCK, block_kv=BLOCK,
                                 block_kv_compute=block_kv_compute, interpret=True, pieces=pieces)
    return np.asarray(out)[0]


LIBRARY = {stage: forward(stage) for stage in ("b1", "b2")}


def differs(out, stage):
    return not np.allclose(out, LIBRARY[stage], equal_nan=True, **tolerance("float32"))


def test_default_pieces_trace_as_no_pieces():
    def trace(pieces):
        return str(jax.make_jaxpr(lambda q, k, v: block_sparse_attention(
            q, k, v, jnp.zeros((1,), jnp.int32), jnp.asarray(PLAN.schedule), steps=STEPS, method=METHODS["b2"], keep=KEEP,
            block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, interpret=True, pieces=pieces))(*QKV))
    assert trace(Pieces()) == trace(None) == trace(Pieces(grid_spec=library_grid_spec))


def kv_map(h, i, s, schedule_ref, *, steps):
    kv_tile, _ = schedule_entry(schedule_ref, i * steps + s)
    return h, kv_tile, 0


def kv_map_one_tile_on(h, i, s, schedule_ref, *, steps):
    kv_tile, _ = schedule_entry(schedule_ref, i * steps + s)
    return h, jnp.minimum(kv_tile + 1, PLAN.grid[1] - 1), 0


def test_kv_map():
    assert np.array_equal(forward("b1", Pieces(kv_map=kv_map_piece(kv_map, steps=STEPS))), LIBRARY["b1"])
    assert differs(forward("b1", Pieces(kv_map=kv_map_piece(kv_map_one_tile_on, steps=STEPS))), "b1")


def b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    pl.when(cls != EMPTY)(lambda: tile(keep, q_start=i * block_q, k_start=kv_tile * block_kv))


def b1_step_skipping_partial(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    pl.when(cls == FULL)(lambda: tile(keep, q_start=i * block_q, k_start=kv_tile * block_kv))


def b1_step_offset_by_steps(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    pl.when(cls != EMPTY)(lambda: tile(keep, q_start=i * block_q, k_start=s * block_kv))


def test_b1_step():
    def step(fn):
        return Pieces(step=b1_step_piece(fn, KEEP, block_q=BLOCK, block_kv=BLOCK))
    assert (PLAN.step_class == PARTIAL).any() and (PLAN.kv_index != np.arange(STEPS)).any()
    assert np.allclose(forward("b1", step(b1_step)), LIBRARY["b1"], **tolerance("float32"))
    assert differs(forward("b1", step(b1_step_skipping_partial)), "b1")
    assert differs(forward("b1", step(b1_step_offset_by_steps)), "b1")   # the learner's offsets are what run


def b2_dispatch(step_class, tile, keep):
    pl.when(step_class == FULL)(lambda: tile(keep=None))
    pl.when(step_class == PARTIAL)(lambda: tile(keep=keep))


def b2_dispatch_free_everywhere(step_class, tile, keep):
    pl.when(step_class != EMPTY)(lambda: tile(keep=None))


def test_b2_dispatch():
    def step(fn):
        return Pieces(step=b2_dispatch_piece(fn, KEEP))
    assert np.array_equal(forward("b2", step(b2_dispatch)), LIBRARY["b2"])
    assert differs(forward("b2", step(b2_dispatch_free_everywhere)), "b2")


def b1_grid_spec(tables, *, heads, query_tiles, steps, block_q, block_kv, head_dim, kv_map, out_specs,
                 more_in_specs, more_scratch, k_map=None):
    def q_map(h, i, s, *table_refs):
        return h, i, 0

    block = (None, block_kv, head_dim)
    return pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables), grid=(heads, query_tiles, steps),
        in_specs=[pl.BlockSpec((None, block_q, head_dim), q_map), pl.BlockSpec(block, k_map or kv_map),
                  pl.BlockSpec(block, k_map or kv_map), *more_in_specs],
        out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((block_q, 128), jnp.float32), pltpu.VMEM((block_q, 128), jnp.float32),
                        pltpu.VMEM((block_q, head_dim), jnp.float32), *more_scratch])


def b1_grid_spec_kv_by_query_tile(*args, **kwargs):
    return b1_grid_spec(*args, **kwargs, k_map=lambda h, i, s, *table_refs: (h, i, 0))


@pytest.mark.parametrize("stage", ["b1", "b2"])
def test_grid_spec(stage):
    assert np.array_equal(forward(stage, Pieces(grid_spec=grid_spec_piece(b1_grid_spec))), LIBRARY[stage])
    assert differs(forward(stage, Pieces(grid_spec=grid_spec_piece(b1_grid_spec_kv_by_query_tile))), stage)


def body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep, rescale=True):
    s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)
    if keep is not None:
        s = jnp.where(keep, s, MASK_VALUE)
    m_prev = m_ref[...]
    m_next = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next)
    l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = (alpha if rescale else 1.0) * acc_ref[...] + jnp.dot(p, v_ref[...],
                                                                       preferred_element_type=jnp.float32)
    m_ref[...] = m_next


def body_without_rescale(*refs):
    body(*refs, rescale=False)


@pytest.mark.parametrize("stage", ["b1", "b2"])
def test_tile_body(stage):
    # the body's float32 matmuls state no precision: on a TPU (interpreted there too) they take one bf16 pass
    on_tpu = jax.default_backend() == "tpu"
    assert np.allclose(forward(stage, Pieces(body=tile_body_piece(body))), LIBRARY[stage],
                       **tolerance("float32", one_bf16_pass=on_tpu))
    assert differs(forward(stage, Pieces(body=tile_body_piece(body_without_rescale))), stage)


def test_plugged_pieces_compile_for_a_tpu(tpu_compiler):
    """The B1 and B2 kernels with pieces plugged in (B1's grid spec too) compile for a v6e (compile-only), bf16 at
    128 x 128."""
    shapes = [((2, MASK.tokens, 128), "bfloat16")] * 3
    for kernel in (lambda q, k, v: b1_learner_attention(q, k, v, MASK, kv_map=kv_map, step=b1_step,
                                                        grid_spec=b1_grid_spec, block_q=BLOCK, block_kv=BLOCK,
                                                        interpret=False),
                   lambda q, k, v: b2_exercise_attention(q, k, v, MASK, b2_dispatch, block_q=BLOCK, block_kv=BLOCK,
                                                         interpret=False, record=False)[0]):
        compiled, _ = tpu_compiler.compile_fn(kernel, shapes, target="v6e")
        assert compiled is not None
