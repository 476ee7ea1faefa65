"""The per-head router between SVG's bands and semantic tiles (svg_lib.layers.semantic_router).

Three planted heads: one spatial and one temporal (svg_lib.structured_qkv), and one whose attention
follows content only (tokens of 8 random groups scattered over the sequence, q = k = the group's
vector plus noise). The router must give each the candidate of highest recall (the temporal
band to the temporal head, semantic tiles to the content head), a routed
band head must compute exactly what `svg_attention(..., method="b3")` computes, and changing the
choices must not recompile.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import svg_lib
from svg_lib import CompileCounter, SVGMask, VideoGeometry, structured_qkv, svg_attention
from svg_lib.extensions.references import attention_float64
from svg_lib.extensions.tolerances import tolerance
from svg_lib.layers.semantic import plan_keep
from svg_lib.layers.semantic_router import CANDIDATES, band_density, route, routed_plan

GEOMETRY = VideoGeometry(4, 8, 16)  # 512 tokens: 4 x 4 tiles of 128
BLOCK = 128
MASK = SVGMask.spatial(GEOMETRY, 0.2)
SAME_MATH = dict(rtol=2e-6, atol=2e-6)  # the same tiles and kernel in another call: summation order only


def content_head(tokens, head_dim, groups=8, seed=3):
    """q, k, v `[1, tokens, head_dim]`: attention that follows content, not position."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, groups, tokens)
    centers = rng.standard_normal((groups, head_dim)) * 1.2
    q = centers[group] + 0.3 * rng.standard_normal((tokens, head_dim))
    k = centers[group] + 0.3 * rng.standard_normal((tokens, head_dim))
    return [jnp.asarray(x[None], jnp.float32) for x in (q, k, rng.standard_normal((tokens, head_dim)))]


@pytest.fixture(scope="module")
def routed():
    q, k, v = structured_qkv(GEOMETRY, ["spatial", "temporal"], head_dim=64, seed=0)
    qc, kc, vc = content_head(GEOMETRY.tokens, 64)
    q, k, v = (jnp.concatenate(pair) for pair in ((q, qc), (k, kc), (v, vc)))
    density = band_density(MASK, BLOCK, BLOCK)
    plan = jax.jit(svg_lib.semantic_plan, static_argnames=("block_q", "block_kv", "density", "iterations"))(
        q, k, block_q=BLOCK, block_kv=BLOCK, density=density, iterations=5)
    rows = np.arange(0, GEOMETRY.tokens, 8)
    new_plan, choice, recalls = jax.jit(lambda q, k, p: route(q, k, p, MASK, rows))(q, k, plan)
    return q, k, v, plan, new_plan, np.asarray(choice), np.asarray(recalls)


def test_each_planted_head_gets_the_candidate_of_highest_recall(routed):
    *_, choice, recalls = routed
    assert recalls.shape == (3, 3)
    assert (recalls[[0, 1, 2], choice] == recalls.max(axis=1)).all()
    # the temporal head takes the temporal band, the content head semantic tiles (the bands miss
    # much of it); the spatial head never the temporal band (at this size its band and semantic
    # tiles are within a few thousandths: either may win)
    assert CANDIDATES[choice[1]] == "temporal" and CANDIDATES[choice[2]] == "semantic"
    assert recalls[2, 2] > recalls[2, :2].max() + 0.1
    assert CANDIDATES[choice[0]] != "temporal" and recalls[0, choice[0]] >= recalls[0, 0]


def test_routed_heads_compute_what_their_candidate_computes_and_choices_do_not_recompile(routed):
    q, k, v, plan, *_ = routed
    choice = np.array([0, 1, 2], np.int32)  # spatial, temporal, semantic: each candidate once

    @jax.jit
    def run(q, k, v, plan, choice):
        return svg_lib.semantic_attention(q, k, v, routed_plan(plan, MASK, choice), interpret=True)

    other = np.array([1, 0, 2], np.int32)  # swap the band heads' kinds
    choices = [jnp.asarray(c) for c in (choice, other)]
    with CompileCounter() as counter:
        outs = [run(q, k, v, plan, c) for c in choices]
        outs[-1].block_until_ready()
    assert counter.count == 1
    # band heads: exactly svg_attention's B3 routed layer (same tiles, same kernel)
    band = svg_attention(q, k, v, jnp.asarray(choice == 1), MASK, method="b3", block_q=BLOCK, block_kv=BLOCK,
                         interpret=True)
    np.testing.assert_allclose(np.asarray(outs[0][:2]), np.asarray(band[:2]), **SAME_MATH)
    # every head: float64 attention under the routed plan's own mask
    keep = np.asarray(plan_keep(routed_plan(plan, MASK, jnp.asarray(choice))))
    want = np.concatenate([attention_float64(q[h:h + 1], k[h:h + 1], v[h:h + 1], keep[h]) for h in range(3)])
    np.testing.assert_allclose(np.asarray(outs[0]), want, **tolerance("float32"))
    assert np.abs(np.asarray(outs[1][:2]) - np.asarray(outs[0][:2])).max() > 0.05  # the new choice took effect


def test_the_router_refuses_a_temporal_mask(routed):
    plan = routed[3]
    with pytest.raises(TypeError, match="spatial SVGMask"):
        routed_plan(plan, SVGMask.temporal(GEOMETRY, 0.2), jnp.zeros(3, jnp.int32))
