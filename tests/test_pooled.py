"""Tests of the pooled-estimate mask (layers.pooled): its choice, its budget, its memory, its kernel run.

The kernel test runs the B3 forward in interpret mode over the plan's tiles and compares it with
masked dense attention under the same tiles, head by head (`reference_attention` with each head's
`TileAlignedMask`). The selection is checked against a NumPy re-derivation from the tile means.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import VideoGeometry, reference_attention, structured_qkv
from svg_lib.layers.pooled import (PooledPlan, choose_tiles, computed_density, head_masks, mask_bytes,
                                   pooled_attention, pooled_plan, window_tiles)

GEOMETRY = VideoGeometry(6, 10, 24)  # 1,440 tokens: 12 query tiles of 128 (the last short)
KINDS = ["spatial", "temporal", "local3d"]


@pytest.fixture(scope="module")
def qkv():
    return structured_qkv(GEOMETRY, KINDS, head_dim=64, seed=3)


def numpy_scores(q, k, bq, bk):
    """log estimated mass of each tile pair from the tile means, in float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    heads, n, d = q.shape
    qm = np.stack([q[:, i:i + bq].mean(axis=1) for i in range(0, n, bq)], axis=1)
    km = np.stack([k[:, j:j + bk].mean(axis=1) for j in range(0, n, bk)], axis=1)
    sizes = np.array([min(bk, n - j) for j in range(0, n, bk)])
    return np.einsum("hid,hjd->hij", qm, km) / math.sqrt(d) + np.log(sizes)[None, None]


@pytest.mark.parametrize("blocks", [(128, 128), (256, 128)])
def test_top_k_keeps_the_best_estimated_tiles_and_exactly_the_budget(qkv, blocks):
    q, k, _ = qkv
    plan = pooled_plan(q, k, block_q=blocks[0], block_kv=blocks[1], density=0.25)
    tiles = np.asarray(plan.tiles)
    nk = tiles.shape[-1]
    assert plan.steps == round(0.25 * nk)
    assert (tiles.sum(axis=-1) == plan.steps).all()           # top-k: the whole budget, every row
    scores = numpy_scores(q, k, *blocks)
    kept_worst = np.where(tiles, scores, np.inf).min(axis=-1)
    dropped_best = np.where(tiles, -np.inf, scores).max(axis=-1)
    assert (kept_worst >= dropped_best - 1e-4).all()            # nothing dropped beats what was kept


def test_threshold_keeps_a_prefix_under_the_budget(qkv):
    q, k, _ = qkv
    full = np.asarray(pooled_plan(q, k, block_q=128, block_kv=128, density=0.5).tiles)
    plan = pooled_plan(q, k, block_q=128, block_kv=128, density=0.5, threshold=0.6)
    tiles = np.asarray(plan.tiles)
    assert (tiles <= full).all() and (tiles.sum(-1) >= 1).all()
    assert tiles.sum() < full.sum()                             # the threshold trims some rows
    scores = numpy_scores(q, k, 128, 128)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    kept_mass = (p * tiles).sum(-1)
    # each row keeps the fewest best tiles whose estimated mass reaches 0.6 (or its whole budget)
    without_worst = kept_mass - np.where(tiles, p, np.inf).min(-1)
    assert ((kept_mass >= 0.6 - 1e-5) | (tiles.sum(-1) == plan.steps)).all()
    assert (without_worst < 0.6 + 1e-5).all()


def test_window_is_always_kept_and_counted_in_the_budget(qkv):
    q, k, _ = qkv
    window = window_tiles(GEOMETRY.tokens, 128, 128, GEOMETRY.frame_tokens)
    plan = pooled_plan(q, k, block_q=128, block_kv=128, density=0.5, threshold=0.3, window=GEOMETRY.frame_tokens)
    tiles = np.asarray(plan.tiles)
    assert tiles[:, window].all()
    assert (tiles.sum(-1) <= plan.steps).all()
    # the window by brute force: a key tile within 240 tokens of some query of the tile
    n = GEOMETRY.tokens
    for i in range(window.shape[0]):
        for j in range(window.shape[1]):
            qs, ks = np.arange(i * 128, min(n, i * 128 + 128)), np.arange(j * 128, min(n, j * 128 + 128))
            assert window[i, j] == (np.abs(qs[:, None] - ks[None, :]).min() <= GEOMETRY.frame_tokens)
    with pytest.raises(ValueError, match="narrow the window or raise the density"):
        pooled_plan(q, k, block_q=128, block_kv=128, density=0.1, window=GEOMETRY.frame_tokens)


def test_bad_arguments_raise(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="threshold must be None"):
        pooled_plan(q, k, block_q=128, block_kv=128, density=0.3, threshold=1.5)
    with pytest.raises(ValueError, match="density must be a number"):
        pooled_plan(q, k, block_q=128, block_kv=128, density=0.0)
    with pytest.raises(ValueError, match="window must be a non-negative int"):
        window_tiles(100, 128, 128, -1)
    plan = pooled_plan(q, k, block_q=128, block_kv=128, density=0.3)
    with pytest.raises(ValueError, match="was it made from other q and k"):
        pooled_attention(q[:, :1024], k[:, :1024], v[:, :1024], plan, interpret=True)
    with pytest.raises(TypeError, match="PooledPlan"):
        pooled_attention(q, k, v, plan.tiles, interpret=True)


@pytest.mark.parametrize("blocks, density, threshold, window", [((128, 128), 0.3, None, None),
                                                                ((256, 128), 0.5, 0.7, 100)])
def test_b3_runs_exact_against_masked_attention_under_its_own_mask(qkv, blocks, density, threshold, window):
    q, k, v = qkv

    @jax.jit
    def plan_and_run(q, k, v):  # the mask and its tables are made on the device, in one program
        plan = pooled_plan(q, k, block_q=blocks[0], block_kv=blocks[1], density=density, threshold=threshold,
                           window=window)
        return plan, pooled_attention(q, k, v, plan, interpret=True)

    plan, out = plan_and_run(q, k, v)
    assert isinstance(plan, PooledPlan)
    for h, mask in enumerate(head_masks(plan)):
        expect = reference_attention(q[h:h + 1], k[h:h + 1], v[h:h + 1], mask)
        np.testing.assert_allclose(np.asarray(out[h:h + 1]), np.asarray(expect), rtol=1e-5, atol=1e-5)
    density = np.asarray(computed_density(plan))
    assert np.allclose(density, [m.pair_density for m in head_masks(plan)])
    assert (np.asarray(plan.tiles).sum(-1) <= plan.steps).all()
    assert (density <= plan.steps * blocks[1] / GEOMETRY.tokens).all()  # the pair budget


def test_mask_memory_at_the_blog_size_is_o_tiles():
    # 75,600 tokens, 10 heads, 128 x 128 tiles (the finest a TPU kernel takes), density 0.3
    tokens, heads, nk = 75_600, 10, 591
    steps = round(0.3 * nk)
    parts = mask_bytes(heads, tokens, 128, 128, steps)
    assert parts["tiles"] == heads * nk * nk
    assert parts["total"] < 16 * 2**20                          # 10 heads under 16 MiB
    assert parts["total"] < heads * tokens**2 / 1000            # a token-level int8 mask: 57 GB
    # what jax allocates for the plan when it compiles it for this CPU (nothing runs): the tile table
    # comes out; the pooled means and scores are the only temporaries of size tiles x head_dim
    spec = jax.ShapeDtypeStruct((heads, tokens, 128), jnp.bfloat16)
    compiled = jax.jit(lambda q, k: pooled_plan(q, k, block_q=128, block_kv=128, density=0.3).tiles) \
        .lower(spec, spec).compile()
    memory = compiled.memory_analysis()
    assert memory.output_size_in_bytes == parts["tiles"]
    # never a tokens^2 array (57 GB here): at most float32 copies of q and k, tokens x head_dim each.
    # XLA's fusion decides which: jax 0.10.2 fuses the cast into the pooling (under 64 MiB of
    # temporaries); Colab's jax 0.7.2 keeps the two float32 copies (787,785,296 bytes, measured).
    f32_copies = 2 * heads * tokens * 128 * 4
    assert memory.temp_size_in_bytes < f32_copies + 64 * 2**20
    if jax.__version__ == "0.10.2":
        assert memory.temp_size_in_bytes < 64 * 2**20


def test_choose_tiles_pins_first_then_best():
    scores = jnp.asarray([[[0.0, 5.0, 1.0, 3.0]]])
    pinned = np.array([[False, False, True, False]])
    got = np.asarray(choose_tiles(scores, 2, pinned=pinned))[0, 0]
    assert got.tolist() == [False, True, True, False]
