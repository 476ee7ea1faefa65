"""Tests of 3-D sliding tile attention: SlidingTileMask, its plans and kernels (interpret mode).

The expected mask is rebuilt here with plain loops over cubes (window shifted inside the video,
padding never kept, text always kept); counts are checked against sums over that dense mask.
"""
import itertools
import time

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svg_lib import VideoGeometry, attention, b3_mask, reference_attention
from svg_lib.extensions.tile_layout import TileLayout, from_tile_major, tile_major_permutation, to_tile_major
from svg_lib.core.masks import Mask
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.core.planner import FULL, plan_tiles

FAST = settings(max_examples=30, deadline=None, database=None)
FEW = settings(max_examples=3, deadline=None, database=None)  # eager jax traces per shape: slow


def loop_dense(g, tile, window):
    """The mask by loops: cubes of each tile-major position, shifted windows, text and padding."""
    perm = tile_major_permutation(g, tile)
    layout = TileLayout(g, tile)
    n, vc = layout.tokens, layout.cube_tokens
    real = perm < g.tokens
    text = np.arange(n) >= layout.video_tokens
    cube = [tuple(np.unravel_index(j // vc, layout.cubes)) if not text[j] else None for j in range(n)]
    dense = np.zeros((n, n), dtype=bool)
    for i, j in itertools.product(range(n), range(n)):
        if not (real[i] and real[j]):
            continue
        if text[i] or text[j]:
            dense[i, j] = True
            continue
        inside = True
        for a, b, c, w in zip(cube[i], cube[j], layout.cubes, window):
            start = min(max(a - w // 2, 0), max(c - w, 0))
            inside &= start <= b < start + w
        dense[i, j] = inside
    return dense


def brute_counts(dense, q_edges, k_edges):
    size = max(dense.shape[0], q_edges[-1], k_edges[-1])
    padded = np.zeros((size, size), dtype=np.int64)
    padded[:dense.shape[0], :dense.shape[0]] = dense
    return np.array([[padded[a:b, c:d].sum() for c, d in zip(k_edges, k_edges[1:])]
                     for a, b in zip(q_edges, q_edges[1:])], dtype=np.int64)


@st.composite
def small_case(draw):
    g = VideoGeometry(draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 6)),
                      draw(st.integers(0, 6)))
    tile = tuple(draw(st.integers(1, 3)) for _ in range(3))
    window = tuple(draw(st.sampled_from([1, 3, 5])) for _ in range(3))
    return g, tile, window


@given(small_case(), st.data())
@FAST
def test_mask_and_closed_form_counts_match_the_loops(case, data):
    g, tile, window = case
    mask = SlidingTileMask(g, tile, window)
    dense = loop_dense(g, tile, window)
    np.testing.assert_array_equal(mask.to_dense(), dense)
    n = mask.tokens
    edges = st.lists(st.integers(0, n + 40), min_size=2, max_size=7).map(sorted)
    q_edges, k_edges = data.draw(edges), data.draw(edges)
    got = mask.pair_counts(q_edges, k_edges)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, brute_counts(dense, q_edges, k_edges))
    assert mask.pair_count == dense.sum()
    assert mask.pair_density == pytest.approx(dense.sum() / g.tokens**2)  # a share of the real pairs
    # the padding it declares to the planner: every tile-major position but the cubes' padding
    real = np.concatenate([tile_major_permutation(g, tile) < g.tokens, np.zeros(40, bool)])
    np.testing.assert_array_equal(mask.real_tokens_in(q_edges), [real[a:b].sum() for a, b in zip(q_edges, q_edges[1:])])


@given(small_case())
@FEW
def test_keep_agrees_between_numpy_and_jax_and_frame_major_view(case):
    g, tile, window = case
    mask = SlidingTileMask(g, tile, window)
    idx = np.arange(mask.tokens + 3)
    expect = mask.keep(idx[:, None], idx[None, :])
    got = np.asarray(mask.keep(jnp.asarray(idx, jnp.int32)[:, None], jnp.asarray(idx, jnp.int32)[None, :]))
    np.testing.assert_array_equal(got, expect)
    # the frame-major view is the same mask on the real tokens, read through the permutation
    perm = tile_major_permutation(g, tile)
    real = np.flatnonzero(perm < g.tokens)
    order = real[np.argsort(perm[real])]  # tile-major position of each frame-major token
    view = mask.frame_major()
    assert view.tokens == g.tokens and view.pair_count == mask.pair_count
    np.testing.assert_array_equal(view.to_dense(), expect[order][:, order])


def test_every_query_cube_sees_the_same_number_of_key_cubes():
    # shifted windows: edge cubes see as many cubes as middle ones (clipped windows would not)
    g, tile, window = VideoGeometry(7, 9, 10), (2, 2, 2), (3, 3, 1)
    mask = SlidingTileMask(g, tile, window)
    layout = mask.layout
    cube_edges = np.arange(layout.num_cubes + 1) * layout.cube_tokens
    kept_cubes = (mask.pair_counts(cube_edges, cube_edges) > 0).sum(axis=1)
    assert set(kept_cubes.tolist()) == {3 * 3 * 1}


@pytest.mark.parametrize("g, tile, window, blocks", [
    (VideoGeometry(6, 8, 16), (2, 4, 16), (1, 3, 1), [(128, 128)]),                     # no padding
    (VideoGeometry(5, 7, 30, text_tokens=5), (2, 4, 16), (3, 1, 1), [(128, 128)]),       # padding, text
    (VideoGeometry(4, 8, 24), (1, 8, 32), (3, 1, 1), [(128, 256), (256, 128)]),         # padding in cols
    (VideoGeometry(3, 12, 16, text_tokens=5), (1, 8, 16), (1, 3, 1), [(128, 128)]),      # whole padded rows
])
def test_aligned_blocks_mask_only_tiles_holding_padded_keys(g, tile, window, blocks):
    mask = SlidingTileMask(g, tile, window)
    perm = tile_major_permutation(g, tile)
    padding = perm >= g.tokens
    for bq, bk in blocks:
        assert mask.aligned(bq, bk)
        plan = plan_tiles(mask, bq, bk)

        def padding_in(block):  # per tile: how many cube or sequence padding positions it holds
            pad = np.concatenate([padding, np.ones(-(-mask.tokens // block) * block - mask.tokens, bool)])
            return pad.reshape(-1, block).sum(axis=1)
        pad_q, pad_k = padding_in(bq), padding_in(bk)
        # masked exactly where a visited tile holds padded keys; padded query rows mask nothing
        np.testing.assert_array_equal(plan.needs_mask, plan.visited & (pad_k > 0)[None, :])
        assert not plan.visited[pad_q == bq].any()  # query rows all padding: skipped
        if pad_q.any() and window[1] > 1:  # a query tile with padded rows, full against real key cubes
            assert (plan.classes == FULL)[(pad_q > 0) & (pad_q < bq)].any()
        # B3 has nothing to round: it runs the mask itself and its plan
        assert b3_mask(mask, bq, bk) is mask
        assert plan.stats["b3_tiles_visited"] == plan.stats["tiles_visited"]
        assert plan.stats["b3_pairs"] == mask.pair_count
        if mask.layout.padding_tokens == 0:
            # the generic rounding agrees: no boundary tile, nothing added or dropped
            report = Mask.tile_aligned(mask, bq, bk).report
            assert (report.boundary_tiles, report.pairs_added, report.pairs_dropped) == (0, 0, 0)
            assert not plan.needs_mask.any()


def test_unaligned_blocks_with_padding_are_refused_by_b3():
    mask = SlidingTileMask(VideoGeometry(3, 5, 16), (1, 4, 32), (1, 1, 1))  # 128-token cubes, padding
    assert not mask.aligned(256, 128)
    with pytest.raises(ValueError, match="do not divide the 128-token cube"):
        mask.tile_aligned(256, 128)
    stats = plan_tiles(mask, 256, 128).stats  # B2's plan stands; its statistics say why B3 has none
    assert "do not divide the 128-token cube" in stats["b3_refused"] and stats["b3_tiles_visited"] is None
    assert stats["tiles_visited"] > 0 and "B3 refused" in str(plan_tiles(mask, 256, 128))
    assert plan_tiles(mask, 128, 128).stats["b3_refused"] is None
    no_pad = SlidingTileMask(VideoGeometry(2, 4, 32), (1, 4, 32), (1, 1, 1))
    assert no_pad.tile_aligned(256, 128).report.block_q == 256  # ordinary rounding without padding


@pytest.mark.parametrize("window", ["333", (2, 3, 3), (3, 3), (0, 1, 1), (True, 1, 1)])
def test_bad_window_raises(window):
    with pytest.raises(ValueError, match="window must be 3 odd positive integers"):
        SlidingTileMask(VideoGeometry(2, 3, 3), (1, 1, 1), window)


def test_blog_size_plan_counts_windows_of_real_tokens():
    # 75,600 tokens: pairs from the closed form equal the sum, over query cubes, of real queries
    # times real keys in the window, computed here cube by cube from the layout
    g = VideoGeometry(21, 45, 80)
    mask = SlidingTileMask(g, (3, 8, 16), (3, 3, 3))
    layout = mask.layout
    perm = tile_major_permutation(g, mask.tile)
    real = (perm[:layout.video_tokens] < g.tokens).reshape(layout.num_cubes, -1).sum(axis=1).reshape(layout.cubes)
    total = 0
    for a in itertools.product(*(range(c) for c in layout.cubes)):
        lo = [min(max(x - 1, 0), c - 3) for x, c in zip(a, layout.cubes)]
        total += real[a] * real[lo[0]:lo[0] + 3, lo[1]:lo[1] + 3, lo[2]:lo[2] + 3].sum()
    plan = plan_tiles(mask, 384, 384)
    assert plan.counts.sum() == mask.pair_count == total
    assert plan.stats["tiles_visited"] == layout.num_cubes * 27  # every query cube, 27 key cubes


def test_blog_size_best_window_plans_fast_and_masks_only_padded_keys():
    # notebook 10's pick: 1920-token cubes, the last cube row holding the 3 padded rows of 45 -> 48
    g = VideoGeometry(21, 45, 80)
    mask = SlidingTileMask(g, (3, 8, 80), (3, 5, 1))
    start = time.perf_counter()
    plan = plan_tiles(mask, 1920, 1920)
    stats = plan.stats
    assert time.perf_counter() - start < 1.0
    last_row = (np.arange(mask.layout.num_cubes) // mask.layout.cubes[2]) % mask.layout.cubes[1] == 5
    np.testing.assert_array_equal(plan.needs_mask, plan.visited & last_row[None, :])  # padded keys only
    assert (plan.classes[last_row] == FULL).any()  # padded query rows: no mask
    # every query cube visits 3 frame cubes x 5 row cubes; the query cubes of the 3 cube rows whose
    # shifted window reaches the last row (7 frame cubes x 3 rows) each visit 3 key cubes there
    assert stats["tiles_visited"] == mask.layout.num_cubes * 3 * 5
    assert stats["tiles_masked"] == int(last_row.sum()) * 3 * 3


# -- kernels in interpret mode -------------------------------------------------------------------

PROBLEMS = {  # (geometry, cube, window): both with cube padding and text
    "cols": (VideoGeometry(5, 7, 30, text_tokens=5), (2, 4, 16), (1, 1, 3)),    # padding in most cubes
    "rows": (VideoGeometry(3, 12, 16, text_tokens=5), (1, 8, 16), (1, 3, 1)),   # half-padded cubes beside whole
}


@pytest.fixture(scope="module", params=list(PROBLEMS))
def small_problem(request):
    g, tile, window = PROBLEMS[request.param]
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.standard_normal((2, g.tokens, 64)), jnp.float32) for _ in range(3))
    return g, SlidingTileMask(g, tile, window), q, k, v


def with_garbage_padding(x, g, tile, seed):
    """`x` in tile-major order with large random values, not zeros, at the padding positions."""
    padding = np.asarray(tile_major_permutation(g, tile)) >= g.tokens
    noise = 30.0 * np.random.default_rng(seed).standard_normal(x.shape[:1] + (padding.size,) + x.shape[2:])
    return jnp.where(padding[None, :, None], jnp.asarray(noise, x.dtype), to_tile_major(x, g, tile)), padding


@pytest.mark.parametrize("method, blocks", [("b1", (128, 128)), ("b2", (128, 128)), ("b3", (128, 128)),
                                            ("b2", (256, 128))])  # 256 does not divide the cube: exact mask
def test_kernels_run_the_sliding_mask_and_padding_never_leaks(small_problem, method, blocks):
    # Padded q, k, v hold large random values: a padded key reaching the softmax, or a padded
    # row surviving, would show. Real rows must be attention under the window over real tokens.
    g, mask, q, k, v = small_problem
    if method == "b3" and not mask.aligned(*blocks):
        pytest.skip("B3 refuses unaligned blocks over padding (tested above)")
    (qt, padding), (kt, _), (vt, _) = (with_garbage_padding(x, g, mask.tile, seed) for seed, x in enumerate((q, k, v)))
    out = attention(qt, kt, vt, mask, method=method, block_q=blocks[0], block_kv=blocks[1], interpret=True)
    expect = reference_attention(qt, kt, vt, mask)  # padding keeps no pair: zero rows, keys ignored
    np.testing.assert_allclose(np.asarray(out), np.asarray(expect), rtol=1e-5, atol=1e-5)
    assert not np.asarray(out)[:, padding].any()  # computed in FULL tiles, then thrown away as zeros
    frame_major = reference_attention(q, k, v, mask.frame_major())
    np.testing.assert_allclose(np.asarray(from_tile_major(out, g, mask.tile)), np.asarray(frame_major),
                               rtol=1e-5, atol=1e-5)


def test_the_rows_problem_really_computes_padded_rows_unmasked():
    # the case the padding hook is for: a query tile holding padded rows is FULL against real keys,
    # and the kernel's predicate for masked tiles reads keys only
    g, tile, window = PROBLEMS["rows"]
    mask = SlidingTileMask(g, tile, window)
    plan = plan_tiles(mask, 128, 128)
    padded_rows = mask.real_tokens_in(np.arange(0, plan.grid[0] * 128 + 1, 128)) < 128
    assert (plan.classes[padded_rows] == FULL).any()
    keep = mask.kernel_predicate(128, 128)
    q_ids, k_ids = np.arange(plan.grid[0] * 128)[:, None], np.arange(plan.grid[1] * 128)[None, :]
    assert keep(q_ids, k_ids).shape == (1, k_ids.size)  # one row of work per key chunk, not a tile


def test_b3_compiles_for_tpu_on_a_sliding_mask(tpu_compiler):
    # compile-only for v6e (no run): the aligned sliding plan through the unchanged B3 kernel,
    # with padding tiles (30 columns padded to 32) masked by the padding-only predicate
    from svg_lib import build_attention

    g = VideoGeometry(4, 8, 30)
    mask = SlidingTileMask(g, (1, 8, 32), (3, 1, 1))
    fn = build_attention(mask, method="b3", heads=2, tokens=mask.tokens, head_dim=128, dtype=jnp.bfloat16,
                         block_q=256, block_kv=256, interpret=False)
    compiled, seconds = tpu_compiler.compile_fn(fn, [((2, mask.tokens, 128), "bfloat16")] * 3, "v6e")
    assert compiled.memory_analysis().argument_size_in_bytes == 3 * 2 * mask.tokens * 128 * 2
