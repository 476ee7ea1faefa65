"""Tests of svg_lib.core.masks: the SVG masks, exact pair counting and B3's rounding to tiles.

Every expected value is rebuilt here from first principles: the brief's formulas for the
band and the permutation, and brute-force sums over dense masks for every count.
"""
import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import ArrayMask, tile_view
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import Mask, TileAlignedMask, check_block_size
from svg_lib.core.svg_masks import PermutedMask, SVGMask, TemporalMask

FAST = settings(max_examples=30, deadline=None, database=None)
FEW = settings(max_examples=12, deadline=None, database=None)


# -- independent helpers ---------------------------------------------------------------------

def expected_band_width(g, density):
    """The brief: W = N (1 - sqrt(1 - d')), d' = d - 2P/N, rounded up to a multiple of 128.

    The 1e-9 only absorbs float noise when W lands exactly on a multiple of 128.
    """
    n = g.tokens
    w = n * (1.0 - math.sqrt(1.0 - (density - 2.0 * g.text_tokens / n)))
    return 128 * math.ceil(w / 128 - 1e-9), w


def brief_spatial_dense(g, band, sink):
    """keep(q, k) = |q - k| <= W or k < sink or q or k is a text token, as a dense array."""
    idx = np.arange(g.tokens)
    q, k = idx[:, None], idx[None, :]
    v = g.video_tokens
    return (np.abs(q - k) <= band) | (k < sink) | (q >= v) | (k >= v)


def brief_position(g):
    """Temporal-major position of each frame-major token: (i mod S) F + i // S; text unmoved."""
    F, S = g.frames, g.frame_tokens
    return np.array([(i % S) * F + i // S if i < g.video_tokens else i for i in range(g.tokens)])


def brute_counts(dense, q_edges, k_edges):
    """Kept pairs per grid cell by slicing a zero-padded copy of the dense mask."""
    n = dense.shape[0]
    size = max(n, int(q_edges[-1]), int(k_edges[-1]))
    padded = np.zeros((size, size), dtype=bool)
    padded[:n, :n] = dense
    out = np.zeros((len(q_edges) - 1, len(k_edges) - 1), dtype=np.int64)
    for i in range(len(q_edges) - 1):
        for j in range(len(k_edges) - 1):
            out[i, j] = padded[q_edges[i]:q_edges[i + 1], k_edges[j]:k_edges[j + 1]].sum()
    return out





def random_tiled_pattern(rng, n, unit=128):
    """A pattern of unit x unit blocks that are empty, full or random: every tile class occurs."""
    m = -(-n // unit)
    state = rng.choice(3, size=(m, m), p=[0.35, 0.35, 0.3])
    fill = rng.uniform(0.05, 0.95, size=(m, m))
    big = np.repeat(np.repeat(state, unit, 0), unit, 1)[:n, :n]
    p = np.repeat(np.repeat(fill, unit, 0), unit, 1)[:n, :n]
    return (big == 1) | ((big == 2) & (rng.random((n, n)) < p))


def random_permuted(base, seed):
    """`base` seen through a random token permutation (`pos[i]`: where token i lands in `base`)."""
    pos = np.random.default_rng(seed).permutation(base.tokens)
    return PermutedMask(base, pos, np.argsort(pos))


@st.composite
def geometry_and_density(draw, max_frames=8, max_side=12, max_text=48):
    # up to ~2,300 tokens: big enough for bands narrower than the sequence, small enough for to_dense
    # hypothesis favours small integers, sampled_from draws uniformly: most cases span several tiles
    g = VideoGeometry(draw(st.integers(1, max_frames)), draw(st.sampled_from(range(4, max_side + 1))),
                      draw(st.sampled_from(range(8, 2 * max_side + 1))), draw(st.integers(0, max_text)))
    text_share = 2.0 * g.text_tokens / g.tokens
    assume(text_share < 0.9)
    density = text_share + draw(st.floats(0.02, 0.95)) * (1.0 - text_share)
    return g, density


@st.composite
def any_mask(draw, kinds=("spatial", "temporal", "permuted", "tile_aligned", "array")):
    """(mask, dense) for every kind of mask the library builds, plus an arbitrary pattern.

    "permuted" is a table-driven PermutedMask under a random token permutation (the generic
    class that TemporalMask specialises with arithmetic positions).
    """
    kind = draw(st.sampled_from(kinds))
    if kind == "array":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        dense = random_tiled_pattern(rng, draw(st.sampled_from(range(1, 1000))))
        return ArrayMask(dense), dense
    g, density = draw(geometry_and_density())
    sink = draw(st.booleans())
    if kind == "spatial":
        mask = SVGMask.spatial(g, density, first_frame_sink=sink)
    elif kind == "temporal":
        mask = SVGMask.temporal(g, density, first_frame_sink=sink)
    elif kind == "permuted":
        mask = random_permuted(SVGMask.spatial(g, density, first_frame_sink=sink), draw(st.integers(0, 2**32 - 1)))
    else:
        base = SVGMask.spatial(g, density, first_frame_sink=sink)
        mask = base.tile_aligned(draw(st.sampled_from([128, 256, 384])), draw(st.sampled_from([128, 256])),
                                 policy=draw(st.sampled_from(["balanced", "up", "down"])))
    return mask, mask.to_dense()


# -- the spatial mask ------------------------------------------------------------------------

@given(geometry_and_density(), st.booleans())
@FAST
def test_band_width_follows_the_brief(gd, sink):
    g, density = gd
    mask = SVGMask.spatial(g, density, first_frame_sink=sink)
    rounded, raw = expected_band_width(g, density)
    if rounded < g.tokens:
        assert mask.band_width == rounded
    else:  # a band as wide as the sequence keeps everything; any cap at >= N - 1 is the same mask
        assert mask.band_width >= g.tokens - 1
    assert mask.band_width >= raw - 1e-6  # rounded up, never down
    assert mask.sink_tokens == (g.frame_tokens if sink else 0)
    assert mask.density == pytest.approx(density)


@given(geometry_and_density(), st.booleans())
@FAST
def test_spatial_dense_matches_the_brief(gd, sink):
    g, density = gd
    mask = SVGMask.spatial(g, density, first_frame_sink=sink)
    dense = mask.to_dense()
    assert dense.dtype == bool and dense.shape == (g.tokens, g.tokens)
    np.testing.assert_array_equal(dense, brief_spatial_dense(g, mask.band_width, mask.sink_tokens))
    # text rows and columns are always kept
    assert dense[g.video_tokens:].all() and dense[:, g.video_tokens:].all()
    # the first frame's keys are seen by every query exactly when the sink is on
    if sink:
        assert dense[:, :g.frame_tokens].all()


def test_sink_is_what_makes_far_first_frame_keys_visible():
    g = VideoGeometry(12, 8, 16)  # S = 128, N = 1536
    with_sink = SVGMask.spatial(g, 0.1, first_frame_sink=True)
    without = SVGMask.spatial(g, 0.1, first_frame_sink=False)
    far_query = g.tokens - 1
    assert far_query - 0 > with_sink.band_width  # outside the band
    assert with_sink.keep(far_query, 0) and not without.keep(far_query, 0)
    assert with_sink.pair_count > without.pair_count


@given(st.integers(4, 30), st.integers(10, 50), st.integers(10, 80), st.floats(0.05, 0.95))
@FAST
def test_pair_density_close_to_requested_without_sink(frames, height, width, density):
    g = VideoGeometry(frames, height, width)
    n = g.tokens
    assume(n >= 4096)
    mask = SVGMask.spatial(g, density, first_frame_sink=False)
    # the band is only ever widened, by < 128 tokens on each side: d <= density <= d + 2*129/N
    assert density - 1e-12 <= mask.pair_density <= density + 2 * 129 / n


@given(geometry_and_density(), st.booleans())
@FEW  # each new geometry recompiles the jax side: keep the count low
def test_keep_agrees_between_numpy_and_jax(gd, sink):
    g, density = gd
    rng = np.random.default_rng(g.tokens)
    q = rng.integers(0, g.tokens + 200, size=(300, 1))
    k = rng.integers(0, g.tokens + 200, size=(1, 40))
    spatial = SVGMask.spatial(g, density, first_frame_sink=sink)
    for mask in (spatial, SVGMask.temporal(g, density, first_frame_sink=sink), random_permuted(spatial, 1),
                 spatial.tile_aligned(256, 128)):
        expect = np.asarray(mask.keep(q, k))
        got = np.asarray(mask.keep(jnp.asarray(q, dtype=jnp.int32), jnp.asarray(k, dtype=jnp.int32)))
        assert expect.dtype == bool and got.dtype == bool
        np.testing.assert_array_equal(got, expect)
        # indices at or past `tokens` are padding and never kept
        assert not expect[(q >= g.tokens)[:, 0]].any()
        assert not expect[:, (k >= g.tokens)[0]].any()



@given(geometry_and_density(), st.booleans())
@FEW
def test_svg_kernel_predicate_keeps_the_same_pairs(gd, sink):
    """SVGMask's kernel predicate (a column and a row per tile, four operations per pair) keeps
    exactly `keep`'s pairs for every real query, and no key padding for any query (query padding
    rows are sliced off by the kernels, so what they keep does not matter)."""
    g, density = gd
    mask = SVGMask.spatial(g, density, first_frame_sink=sink)
    q = np.arange(g.tokens + 150)[:, None]
    k = np.arange(g.tokens + 150)[None, :]
    got = np.asarray(mask.kernel_predicate(128, 128)(jnp.asarray(q, jnp.int32), jnp.asarray(k, jnp.int32)))
    n = g.tokens
    np.testing.assert_array_equal(got[:n], mask.keep(q[:n], k))
    assert not got[:, n:].any()

# -- exact pair counts -----------------------------------------------------------------------

@given(any_mask(), st.data())
@FAST
def test_pair_counts_match_brute_force(mask_dense, data):
    mask, dense = mask_dense
    n = mask.tokens
    edges = st.lists(st.integers(0, n + 300), min_size=2, max_size=7).map(sorted)
    q_edges, k_edges = data.draw(edges), data.draw(edges)
    got = mask.pair_counts(q_edges, k_edges)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, brute_counts(dense, q_edges, k_edges))
    assert mask.pair_count == dense.sum()
    assert mask.pair_density == pytest.approx(dense.sum() / n**2)


@given(geometry_and_density(), st.booleans())
@FEW
def test_band_pair_count_on_the_whole_grid(gd, sink):
    # one cell per tile row/column, as the planner uses it, at a non-lane block size
    g, density = gd
    mask = SVGMask.spatial(g, density, first_frame_sink=sink)
    edges = np.arange(0, g.tokens + 97, 97)
    np.testing.assert_array_equal(mask.pair_counts(edges, edges), brute_counts(mask.to_dense(), edges, edges))


@pytest.mark.parametrize("edges", [[5, 3], [-1, 10], [7], [[0, 4], [4, 8]]])
def test_bad_grid_edges_raise(edges):
    mask = SVGMask.spatial(VideoGeometry(2, 4, 4), 0.5)
    with pytest.raises(ValueError, match="edges"):
        mask.pair_counts(edges, [0, 32])


# -- the temporal mask -----------------------------------------------------------------------

@given(geometry_and_density(), st.booleans())
@FAST
def test_temporal_dense_is_the_spatial_band_in_temporal_major_coordinates(gd, sink):
    g, density = gd
    spatial = SVGMask.spatial(g, density, first_frame_sink=sink)
    temporal = SVGMask.temporal(g, density, first_frame_sink=sink)
    assert isinstance(temporal, TemporalMask) and isinstance(temporal, PermutedMask)
    assert temporal.permuted.band_width == spatial.band_width
    pos = brief_position(g)  # frame-major token i sits at temporal-major position pos[i]
    band = spatial.to_dense()
    dense = temporal.to_dense()
    # frame-major (i, j) is kept iff the band keeps their temporal-major positions
    np.testing.assert_array_equal(dense, band[pos][:, pos])
    # and gathering the temporal-major order back out of it gives the band again
    order = np.argsort(pos)
    np.testing.assert_array_equal(dense[order][:, order], band)
    assert temporal.pair_count == spatial.pair_count


@given(geometry_and_density())
@FEW
def test_temporal_position_is_the_brief_formula(gd):
    g, density = gd
    temporal = SVGMask.temporal(g, density)
    idx = np.arange(g.tokens + 50)  # past the end: padding keeps its index (and is never kept)
    expect = np.concatenate([brief_position(g), np.arange(g.tokens, g.tokens + 50)])
    np.testing.assert_array_equal(temporal.position(idx), expect)
    np.testing.assert_array_equal(np.asarray(temporal.position(jnp.asarray(idx, dtype=jnp.int32))), expect)
    # the lookup table the generic PermutedMask carries says the same
    np.testing.assert_array_equal(temporal.pos, brief_position(g))


def test_random_permuted_mask_moves_pairs_without_changing_their_number():
    g = VideoGeometry(3, 8, 16, text_tokens=5)
    base = SVGMask.spatial(g, 0.2)
    mask = random_permuted(base, 3)
    np.testing.assert_array_equal(mask.to_dense(), base.to_dense()[mask.pos][:, mask.pos])
    assert mask.pair_count == base.pair_count == mask.to_dense().sum()


def test_temporal_mask_direction_on_a_long_thin_video():
    # 200 frames of 2 tokens, band of 128: neighbours in time must be kept, neighbours in
    # space (200 temporal-major positions apart) must not. A transposed permutation fails this.
    g = VideoGeometry(200, 1, 2)
    temporal = SVGMask.temporal(g, 0.05, first_frame_sink=False)
    assert temporal.permuted.band_width == 128
    f, S = 5, g.frame_tokens
    assert temporal.keep(f * S + 0, (f + 1) * S + 0)      # same slot, next frame
    assert temporal.keep(f * S + 1, (f + 100) * S + 1)    # same slot, 100 frames on
    assert not temporal.keep(f * S + 0, f * S + 1)        # other slot, same frame
    spatial = SVGMask.spatial(g, 0.05, first_frame_sink=False)
    assert spatial.keep(f * S + 0, f * S + 1)
    assert not spatial.keep(f * S + 1, (f + 100) * S + 1)


@given(geometry_and_density(max_frames=12, max_side=9), st.booleans(), st.data())
@FAST
def test_temporal_closed_form_counts_match_pair_by_pair_counts(gd, sink, data):
    # the closed form (frame and slot ranges) against the generic walk over every pair, on grids
    # whose cells start and end anywhere: inside frames, across several frames, past the end
    g, density = gd
    mask = SVGMask.temporal(g, density, first_frame_sink=sink)
    edges = st.lists(st.integers(0, g.tokens + 200), min_size=2, max_size=9).map(sorted)
    q_edges, k_edges = data.draw(edges), data.draw(edges)
    np.testing.assert_array_equal(mask.pair_counts(q_edges, k_edges), Mask.pair_counts(mask, q_edges, k_edges))


def test_temporal_counts_at_the_blog_size_need_no_pair_walk():
    # 75,600 tokens is past the pair-by-pair limit; the closed form counts it, and a permutation
    # moves pairs without adding any: the totals equal the band's, tile by tile sums included
    g = VideoGeometry(21, 45, 80)
    spatial = SVGMask.spatial(g, 0.35)
    temporal = SVGMask.temporal(g, 0.35)
    with pytest.raises(ValueError, match="too many to count pair by pair"):
        Mask.pair_counts(temporal, [0, g.tokens], [0, g.tokens])
    counts = temporal.pair_counts(np.arange(0, g.tokens + 3328, 3328), np.arange(0, g.tokens + 1536, 1536))
    assert counts.sum() == spatial.pair_count
    # one whole frame of queries keeps, per key frame, exactly what the band keeps of those positions
    S = g.frame_tokens
    frame = temporal.pair_counts([0, S], [0, g.tokens])[0, 0]
    assert frame == spatial.pair_counts(np.arange(g.tokens), [0, g.tokens])[::g.frames, 0].sum()


# -- the dense limit -------------------------------------------------------------------------

def test_to_dense_refuses_large_masks():
    g = VideoGeometry(1, 1, 16_385)
    spatial = SVGMask.spatial(g, 0.3)
    for mask in (spatial, SVGMask.temporal(g, 0.3), spatial.tile_aligned(128, 128)):
        with pytest.raises(ValueError) as err:
            mask.to_dense()
        message = str(err.value)
        assert "16,385" in message and "plan_tiles" in message


# -- B3: rounding to whole tiles ---------------------------------------------------------------

@st.composite
def rounding_case(draw):
    mask, dense = draw(any_mask(kinds=("spatial", "temporal", "array")))
    return mask, dense, draw(st.sampled_from([128, 256, 384])), draw(st.sampled_from([128, 256, 512]))


def check_whole_tiles(rounded_dense, kept, block_q, block_kv):
    n = rounded_dense.shape[0]
    for i in range(kept.shape[0]):
        for j in range(kept.shape[1]):
            tile = rounded_dense[i * block_q:min((i + 1) * block_q, n), j * block_kv:min((j + 1) * block_kv, n)]
            assert tile.size > 0
            assert tile.all() if kept[i, j] else not tile.any()


@given(rounding_case(), st.sampled_from(["balanced", "up", "down"]))
@FAST
def test_tile_aligned_structure_and_report(case, policy):
    mask, dense, bq, bk = case
    tam = mask.tile_aligned(bq, bk, policy=policy)
    assert isinstance(tam, TileAlignedMask) and tam.source is mask
    counts, areas = tile_view(dense, bq, bk)
    full, empty = counts == areas, counts == 0
    boundary = ~full & ~empty
    assert tam.kept.shape == counts.shape and tam.kept.dtype == bool

    rounded = tam.to_dense()
    check_whole_tiles(rounded, tam.kept, bq, bk)
    assert tam.kept[full].all() and not tam.kept[empty].any()
    if policy == "up":
        assert (rounded | ~dense).all()  # superset
        np.testing.assert_array_equal(tam.kept, ~empty)
    elif policy == "down":
        assert (dense | ~rounded).all()  # subset
        np.testing.assert_array_equal(tam.kept, full)

    r = tam.report
    assert (r.policy, r.block_q, r.block_kv) == (policy, bq, bk)
    assert r.exact_pairs == dense.sum()
    assert r.rounded_pairs == rounded.sum() == tam.pair_count
    assert r.pairs_added == (rounded & ~dense).sum()
    assert r.pairs_dropped == (dense & ~rounded).sum()
    assert r.rounded_pairs - r.exact_pairs == r.pairs_added - r.pairs_dropped
    assert r.boundary_tiles == boundary.sum()
    assert r.boundary_kept == (tam.kept & boundary).sum()
    assert r.boundary_budget == counts[boundary].sum()
    assert r.budget_error == pytest.approx((rounded.sum() - dense.sum()) / max(dense.sum(), 1))
    assert policy in str(r)


@given(rounding_case())
@FAST
def test_balanced_rounding_is_the_best_prefix(case):
    mask, dense, bq, bk = case
    tam = mask.tile_aligned(bq, bk)  # "balanced" is the default
    assert tam.report.policy == "balanced"
    counts, areas = tile_view(dense, bq, bk)
    full, empty = counts == areas, counts == 0
    boundary = np.flatnonzero(~full & ~empty)
    fraction = counts.flat[boundary] / areas.flat[boundary]

    # kept boundary tiles are a prefix of the ranking: none is worse covered than a dropped one
    kept_b = tam.kept.flat[boundary]
    if kept_b.any() and (~kept_b).any():
        assert fraction[kept_b].min() >= fraction[~kept_b].max()

    # no prefix of the ranking lands closer to the exact pair count
    ranking = boundary[sorted(range(boundary.size), key=lambda t: (-fraction[t], boundary[t]))]
    exact = int(dense.sum())
    base = int(areas[full].sum())
    prefix_pairs = base + np.concatenate([[0], np.cumsum(areas.flat[ranking])])
    best = int(np.abs(prefix_pairs - exact).min())
    assert abs(int(tam.to_dense().sum()) - exact) == best


def test_balanced_keeps_budget_on_a_large_band():
    g = VideoGeometry(21, 45, 80)
    mask = SVGMask.spatial(g, 0.35)
    r = mask.tile_aligned(3328, 1536).report
    assert r.boundary_tiles > 0 and 0 < r.boundary_kept < r.boundary_tiles
    assert abs(r.budget_error) < 1e-3
    assert r.exact_pairs == mask.pair_count


@given(any_mask(kinds=("spatial", "temporal", "array")), st.sampled_from([128, 256]), st.sampled_from([128, 384]),
       st.sampled_from(["balanced", "up", "down"]), st.sampled_from(["balanced", "up", "down"]))
@FEW
def test_rounding_twice_changes_nothing(mask_dense, bq, bk, first, second):
    mask, _ = mask_dense
    once = mask.tile_aligned(bq, bk, policy=first)
    twice = once.tile_aligned(bq, bk, policy=second)
    np.testing.assert_array_equal(twice.kept, once.kept)
    np.testing.assert_array_equal(twice.to_dense(), once.to_dense())


def test_rounding_a_tile_mask_to_other_tiles():
    # 256-row tiles seen through 128-row tiles are whole as well; the reverse is not
    mask = SVGMask.spatial(VideoGeometry(4, 8, 24), 0.2)
    coarse = mask.tile_aligned(256, 256, policy="up")
    fine = coarse.tile_aligned(128, 128, policy="down")
    np.testing.assert_array_equal(fine.to_dense(), coarse.to_dense())
    assert fine.report.boundary_tiles == 0
    fine_first = mask.tile_aligned(128, 128, policy="up")
    regrouped = fine_first.tile_aligned(256, 256, policy="up")
    assert (regrouped.to_dense() | ~fine_first.to_dense()).all()


def test_up_and_down_bracket_balanced():
    mask = SVGMask.spatial(VideoGeometry(8, 16, 24), 0.3)
    pairs = {p: mask.tile_aligned(512, 256, policy=p).pair_count for p in ("down", "balanced", "up")}
    assert pairs["down"] <= mask.pair_count <= pairs["up"]
    assert pairs["down"] <= pairs["balanced"] <= pairs["up"]


# -- bad input -------------------------------------------------------------------------------

BAD_BLOCKS = [0, 100, 129, -128, 128.5, True]


@pytest.mark.parametrize("bad", BAD_BLOCKS)
def test_bad_block_sizes_raise_on_a_tile_mask_too(bad):
    # a TileAlignedMask re-rounded to its own tiles may skip the work, not the input checks
    tam = SVGMask.spatial(VideoGeometry(2, 8, 16), 0.5).tile_aligned(128, 128)
    with pytest.raises(ValueError, match=r"block_q.*multiple of 128"):
        tam.tile_aligned(bad, 128)
    with pytest.raises(ValueError, match=r"block_kv.*multiple of 128"):
        tam.tile_aligned(128, bad)


@pytest.mark.parametrize("bad", BAD_BLOCKS)
def test_bad_block_sizes_raise(bad):
    mask = SVGMask.spatial(VideoGeometry(2, 8, 8), 0.5)
    with pytest.raises(ValueError, match=r"block_q.*multiple of 128"):
        mask.tile_aligned(bad, 128)
    with pytest.raises(ValueError, match=r"block_kv.*multiple of 128"):
        mask.tile_aligned(128, bad)
    with pytest.raises(ValueError, match="multiple of 128"):
        check_block_size("block_q", bad)


@pytest.mark.parametrize("bad", [128.0, np.float64(256.0)])
def test_integral_float_block_sizes_are_refused_as_floats(bad):
    # 128.0 is a multiple of 128 and must not be told it is not; it is refused for being a float
    message = rf"block_q must be an int, got {float(bad)!r} \(a float\); pass the int {int(bad)}$"
    with pytest.raises(ValueError, match=message):
        check_block_size("block_q", bad)
    with pytest.raises(ValueError, match=message):
        SVGMask.spatial(VideoGeometry(2, 8, 8), 0.5).tile_aligned(bad, 128)


def test_block_size_hint_names_valid_neighbours():
    with pytest.raises(ValueError, match=r"128 and 256"):
        check_block_size("block_q", 129)
    with pytest.raises(ValueError, match=r"try 128"):
        check_block_size("block_q", 100)
    assert check_block_size("block_q", np.int64(384)) == 384
    assert type(check_block_size("block_q", np.int64(384))) is int


@pytest.mark.parametrize("density", [0, -0.1, 1.5, float("nan"), float("inf"), True, "0.3"])
def test_bad_density_raises(density):
    with pytest.raises(ValueError, match="density"):
        SVGMask.spatial(VideoGeometry(2, 8, 8), density)


def test_a_plan_of_a_density_far_below_what_the_mask_keeps_says_why():
    import warnings

    import re

    from svg_lib.core.masks import DensityFloorWarning, density_floor_note
    from svg_lib.core.planner import plan_tiles

    g = VideoGeometry(3, 8, 16)  # 384 tokens: a 128-token sink and the 128-wide band keep 0.72 of the pairs
    mask = SVGMask.spatial(g, 0.001)
    with pytest.warns(DensityFloorWarning) as record:
        plan_tiles(mask, 128, 128)
    message = str(record[0].message)
    assert record[0].filename == __file__  # points at the caller's line
    assert message == density_floor_note(mask)
    assert f"keeps {mask.pair_density:.1%}" in message and "72.4%" in message
    assert "first-frame sink (128 keys" in message and "minimum width (128 tokens" in message
    assert message.endswith("the smallest density that means something at this size is about 0.72")
    assert re.search(r"the band's minimum width .* keeps 55\.7%.*about 0\.56$",
                     density_floor_note(SVGMask.spatial(g, 0.001, first_frame_sink=False)))
    assert density_floor_note(SVGMask.spatial(VideoGeometry(21, 45, 80), 0.001)).endswith("about 0.051")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no word where the mask keeps about what was asked
        plan_tiles(SVGMask.spatial(VideoGeometry(21, 45, 80), 0.35), 3328, 1536)
        plan_tiles(SVGMask.spatial(g, 0.35), 128, 128)  # 0.72 at 0.35: twice the ask, as the tiny problem always is
        plan_tiles(mask.tile_aligned(128, 128), 128, 128)  # a rounded mask asked for no density
    assert density_floor_note(SVGMask.spatial(g, 0.35)) is None


def test_density_too_low_for_the_text_tokens():
    g = VideoGeometry(2, 8, 8, text_tokens=64)  # text rows and columns alone keep 2P/N = 2/3
    with pytest.raises(ValueError, match="text") as err:
        SVGMask.spatial(g, 0.5)
    assert "0.667" in str(err.value)
    SVGMask.spatial(g, 0.7)  # just above is fine


def test_spatial_needs_a_geometry():
    with pytest.raises(TypeError, match="VideoGeometry"):
        SVGMask.spatial(1024, 0.3)


def test_unknown_policy_raises():
    mask = SVGMask.spatial(VideoGeometry(2, 8, 8), 0.5)
    # the tile mask is re-rounded to its own tiles: the policy must still be checked
    for m in (mask, mask.tile_aligned(128, 128)):
        with pytest.raises(ValueError, match="policy") as err:
            m.tile_aligned(128, 128, policy="nearest")
        assert "balanced" in str(err.value) and "'nearest'" in str(err.value)


def test_tile_aligned_mask_checks_its_tile_table():
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        TileAlignedMask(300, 128, 256, np.ones((2, 2), bool))


# -- masks are values: equal parameters, equal masks (attention's kernel cache keys on this) ----

def test_equal_parameters_make_equal_masks():
    g = VideoGeometry(3, 8, 16, text_tokens=5)
    a, b = SVGMask.spatial(g, 0.35), SVGMask.spatial(g, 0.35)
    assert a is not b and a == b and hash(a) == hash(b) and len({a, b}) == 1
    # each defining parameter tells masks apart: geometry, band width, sink
    assert a != SVGMask.spatial(VideoGeometry(3, 8, 16), 0.35)
    assert a != SVGMask(g, a.band_width + 128, a.sink_tokens)
    assert a != SVGMask.spatial(g, 0.35, first_frame_sink=False)
    # the density asked for is not one: two requests rounding to the same band keep the same pairs
    c = SVGMask(g, a.band_width, a.sink_tokens, density=0.99)
    assert c == a and np.array_equal(c.to_dense(), a.to_dense())
    assert a != "SVGMask" and a != None  # noqa: E711 (comparing with anything else is not an error)


def test_mask_classes_are_never_equal_to_one_another():
    g = VideoGeometry(3, 8, 16)
    spatial = SVGMask.spatial(g, 0.35)
    temporal = SVGMask.temporal(g, 0.35)
    assert temporal == SVGMask.temporal(g, 0.35) and hash(temporal) == hash(SVGMask.temporal(g, 0.35))
    assert temporal != spatial and temporal.permuted == spatial

    class Subclass(SVGMask):  # e.g. one that overrides keep: same parameters, maybe other pairs
        pass
    assert Subclass(g, spatial.band_width, spatial.sink_tokens) != spatial

    from svg_lib.extensions.sliding import SlidingTileMask
    sliding = SlidingTileMask(VideoGeometry(3, 5, 16), [1, 4, 32], (1, 3, 1))
    assert sliding == SlidingTileMask(VideoGeometry(3, 5, 16), (1, 4, 32), [1, 3, 1])
    assert sliding != SlidingTileMask(VideoGeometry(3, 5, 16), (1, 4, 32), (1, 1, 1))
    assert sliding.frame_major() == sliding.frame_major()  # a view holding tables, keyed by them


def test_masks_holding_tables_are_keyed_by_their_contents():
    g = VideoGeometry(3, 8, 16)
    base = SVGMask.spatial(g, 0.35)
    kept = np.eye(3, dtype=bool)
    t1, t2 = TileAlignedMask(g.tokens, 128, 128, kept), TileAlignedMask(g.tokens, 128, 128, kept.copy())
    assert t1 == t2 and hash(t1) == hash(t2)
    assert t1 != TileAlignedMask(g.tokens, 128, 128, ~kept)
    assert t1 == TileAlignedMask(g.tokens, 128, 128, kept, source=base)  # provenance is no part of it
    assert base.tile_aligned(128, 128) == base.tile_aligned(128, 128)  # rounded again: the same tiles
    perm = np.random.default_rng(0).permutation(g.tokens)
    p1, p2 = PermutedMask(base, perm, np.argsort(perm)), PermutedMask(base, perm.copy(), np.argsort(perm))
    assert p1 == p2 and hash(p1) == hash(p2)
    other = np.roll(perm, 1)
    assert p1 != PermutedMask(base, other, np.argsort(other))


def test_a_mask_svg_lib_cannot_describe_is_equal_only_to_itself():
    # a Mask subclass defined elsewhere: svg_lib does not know what defines it, so identity
    dense = np.eye(256, dtype=bool)
    a, b = ArrayMask(dense), ArrayMask(dense)
    assert a.cache_key() is None
    assert a == a and a != b and len({a, b}) == 2
    assert PermutedMask(a, np.arange(256), np.arange(256)).cache_key() is None  # nor a view of it


def test_attention_cache_keys_on_the_mask_value():
    from svg_lib.cache import mask_cache_key

    g = VideoGeometry(3, 8, 16)
    assert mask_cache_key(SVGMask.spatial(g, 0.35)) == mask_cache_key(SVGMask.spatial(g, 0.35))
    assert mask_cache_key(SVGMask.spatial(g, 0.35)) != mask_cache_key(SVGMask.spatial(g, 0.6))
    assert mask_cache_key(None) == ("value", None)
    a = ArrayMask(np.eye(256, dtype=bool))
    assert mask_cache_key(a) == ("identity", id(a))
