"""Semantic attention (svg_lib.semantic_attention): the B3 kernels over a semantic plan's tiles,
forward and backward (interpret mode). The plan itself: tests/test_semantic_plan.py.

The kernels' results are checked against float64 attention under the plan's *own* mask (the
selected tiles, mapped back to the original token order by `plan_keep`): exact, not approximate.
360 tokens: neither 128 nor 256 divides it, so the last query and key clusters are short and the
last key tile holds padding (PARTIAL, masked).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import svg_lib
from svg_lib import CompileCounter, VideoGeometry, structured_qkv
from svg_lib.extensions.references import attention_float64, attention_gradients_float64
from svg_lib.extensions.tolerances import tolerance
from svg_lib.layers.semantic import plan_keep

GEOMETRY = VideoGeometry(3, 8, 15)            # 360 tokens
BLOCKS = dict(block_q=128, block_kv=128)      # 3 x 3 tiles, the last of each 104 tokens
DENSITY = 0.67                                # 2 key tiles per query tile
plan_jit = jax.jit(svg_lib.semantic_plan, static_argnames=("block_q", "block_kv", "density", "iterations"))


@pytest.fixture(scope="module")
def problem():
    q, k, v = structured_qkv(GEOMETRY, ["local3d", "temporal"], head_dim=64, seed=0)
    plan = plan_jit(q, k, density=DENSITY, iterations=3, **BLOCKS)
    return q, k, v, plan


def as_dtype(dtype, *xs):
    return tuple(x.astype(dtype) for x in xs)


# -- attention over the plan --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_output_and_gradients_are_exact_under_the_plans_own_mask(problem, dtype):
    q, k, v, plan = problem
    q, k, v = as_dtype(jnp.dtype(dtype), q, k, v)
    dout = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape), q.dtype)
    # one trace for both: the forward with residuals, then the B3 backward over the same tiles
    out, pullback = jax.vjp(lambda q, k, v: svg_lib.semantic_attention(q, k, v, plan, interpret=True), q, k, v)
    grads = pullback(dout)
    assert out.shape == q.shape and out.dtype == q.dtype
    keep = np.asarray(plan_keep(plan))
    heads = [(q[h:h + 1], k[h:h + 1], v[h:h + 1]) for h in range(q.shape[0])]
    want = np.concatenate([attention_float64(*x, keep[h]) for h, x in enumerate(heads)])
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want, **tolerance(dtype))
    assert np.abs(attention_float64(q, k, v) - want).max() > 0.05  # the plan matters: dense is far from it
    want_grads = [np.concatenate(parts) for parts in zip(*[
        attention_gradients_float64(*x, dout[h:h + 1], keep[h]) for h, x in enumerate(heads)])]
    for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
        np.testing.assert_allclose(np.asarray(g.astype(jnp.float32)), w, **tolerance(dtype, "gradients"), err_msg=name)


def test_one_compilation_across_ten_steps_whose_clusters_change(problem):
    # a denoising loop's shape: each step plans from its own q and k, warm-started from the last
    # step's centroids, and attends; the inputs drift from step to step, so the clusters move
    q, k, v, _ = problem

    @jax.jit
    def step(q, k, v, centroids):
        plan = svg_lib.semantic_plan(q, k, density=DENSITY, iterations=2, centroids=centroids, **BLOCKS)
        return svg_lib.semantic_attention(q, k, v, plan, interpret=True), plan

    centroids = plan_jit(q, k, density=DENSITY, iterations=1, **BLOCKS).centroids
    noise = np.random.default_rng(7).standard_normal((10,) + q.shape).astype(np.float32)
    inputs = [(q + 0.3 * i * noise[i], jnp.roll(k, 40 * i, axis=1), v) for i in range(10)]  # made before counting
    orders = []
    with CompileCounter() as counter:
        for qi, ki, vi in inputs:
            out, plan = step(qi, ki, vi, centroids)
            centroids = plan.centroids  # the warm start the next step takes
            orders.append(np.asarray(plan.k_order))
        out.block_until_ready()
    assert counter.count == 1
    assert all(not np.array_equal(a, b) for a, b in zip(orders, orders[1:]))  # the clusters moved at every step


def test_the_gradient_permutes_back_by_gathers_not_scatters(problem):
    # a permutation's transpose is its inverse: the gradients of q, k, v go back by the plan's
    # places, a gather each, where jax's own transpose of a gather is a scatter-add (4.5x the
    # cycles on a v6e, the static profile says)
    import re

    q, k, v, plan = problem
    loss = lambda q, k, v: jnp.sum(svg_lib.semantic_attention(q, k, v, plan, interpret=True))
    program = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert re.search(r"\bgather\b", program) and not re.search(r"\bscatter", program)


def test_mismatched_shapes_are_refused(problem):
    q, k, v, plan = problem
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        svg_lib.semantic_plan(q, k[:, :300], density=0.5, **BLOCKS)
    with pytest.raises(ValueError, match="plan.q_order is shaped"):
        svg_lib.semantic_attention(q[:1], k[:1], v[:1], plan, interpret=True)
    with pytest.raises(ValueError, match="q, k and v must have the same shape"):
        svg_lib.semantic_attention(q, k, v[:, :300], plan, interpret=True)
    with pytest.raises(ValueError, match="centroids.k must be shaped"):
        svg_lib.semantic_plan(q, k, density=0.5, block_q=128, block_kv=256, centroids=plan.centroids)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        svg_lib.semantic_attention(*(x.astype(jnp.float16) for x in (q, k, v)), plan, interpret=True)
    with pytest.raises(TypeError, match="plan must be a SemanticPlan"):
        svg_lib.semantic_attention(q, k, v, plan.tiles, interpret=True)


def test_first_built_under_jit_then_differentiated_keeps_no_tracer(problem):
    # the kernel is built (and cached) inside the first caller's trace; a later gradient under
    # another trace must not meet an array of the first
    from svg_lib.layers.semantic import _built

    q, k, v, plan = problem
    _built.cache_clear()
    run = jax.jit(lambda q, k, v: svg_lib.semantic_attention(q, k, v, plan, interpret=True))
    first = run(q, k, v)
    grads = jax.jit(jax.grad(lambda q: jnp.sum(svg_lib.semantic_attention(q, k, v, plan, interpret=True))))(q)
    assert np.isfinite(np.asarray(first)).all() and np.isfinite(np.asarray(grads)).all()


def test_every_tile_selected_is_dense_attention():
    # density 1: every tile computed, in cluster order, and the output put back is dense attention
    q, k, v = structured_qkv(GEOMETRY, ["spatial"], head_dim=64, seed=4)
    plan = plan_jit(q, k, density=1.0, iterations=1, **BLOCKS)
    assert np.asarray(plan.tiles).all()
    out = svg_lib.semantic_attention(q, k, v, plan, interpret=True)
    np.testing.assert_allclose(np.asarray(out), attention_float64(q, k, v), **tolerance("float32"))
