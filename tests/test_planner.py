"""Tests of svg_lib.core.planner: tile classes and the scalar-prefetch schedule.

Expected classes come from the dense mask, zero-padded to the tile grid and summed per tile;
the schedule is checked row by row against the tiles that brute force says are visited.
"""
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import ArrayMask, tile_view
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.svg_masks import PermutedMask, SVGMask
from svg_lib.core.planner import (CLASS_BITS, CLASS_NAMES, EMPTY, FULL, MAX_KV_TILES, PARTIAL, STEP_BITS, TilePlan,
                             pack_schedule, plan_tiles, unpack_schedule)
from svg_lib.extensions.stacked_schedules import stack_schedules

FAST = settings(max_examples=30, deadline=None, database=None)


# -- independent helpers ---------------------------------------------------------------------

def brute_plan(dense, block_q, block_kv):
    """(counts, areas, classes, touches_padding) [nq, nk] straight from the dense mask."""
    n = dense.shape[0]
    nq, nk = -(-n // block_q), -(-n // block_kv)
    counts, areas = tile_view(dense, block_q, block_kv)
    q_pad = np.array([(i + 1) * block_q > n for i in range(nq)])
    k_pad = np.array([(j + 1) * block_kv > n for j in range(nk)])
    classes = np.empty((nq, nk), dtype=int)
    for i in range(nq):
        for j in range(nk):
            if counts[i, j] == 0:
                classes[i, j] = EMPTY
            elif counts[i, j] == areas[i, j] and not k_pad[j]:
                classes[i, j] = FULL
            else:
                classes[i, j] = PARTIAL
    return counts, areas, classes, q_pad[:, None] | k_pad[None, :]


def random_tiled_pattern(rng, n, unit=128):
    """unit x unit blocks that are empty, full or random, with whole empty query stripes."""
    m = -(-n // unit)
    state = rng.choice(3, size=(m, m), p=[0.4, 0.35, 0.25])
    state[rng.random(m) < 0.2] = 0  # some query tiles with nothing to visit
    fill = rng.uniform(0.05, 0.95, size=(m, m))
    big = np.repeat(np.repeat(state, unit, 0), unit, 1)[:n, :n]
    p = np.repeat(np.repeat(fill, unit, 0), unit, 1)[:n, :n]
    return (big == 1) | ((big == 2) & (rng.random((n, n)) < p))


@st.composite
def masks(draw):
    """(mask, dense) across the mask kinds the planner sees."""
    kind = draw(st.sampled_from(["spatial", "temporal", "permuted", "tile_aligned", "array"]))
    if kind == "array":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        dense = random_tiled_pattern(rng, draw(st.sampled_from(range(1, 1200))))
        return ArrayMask(dense), dense
    # sampled_from draws uniformly, where st.integers favours tiny values (and tiny masks are one tile)
    g = VideoGeometry(draw(st.integers(1, 8)), draw(st.sampled_from(range(4, 13))),
                      draw(st.sampled_from(range(8, 25))), draw(st.integers(0, 40)))
    text_share = 2.0 * g.text_tokens / g.tokens
    assume(text_share < 0.9)
    density = text_share + draw(st.floats(0.02, 0.9)) * (1.0 - text_share)
    sink = draw(st.booleans())
    if kind == "temporal":
        mask = SVGMask.temporal(g, density, first_frame_sink=sink)
    elif kind == "permuted":  # the generic, table-driven permuted mask under a random order
        pos = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(g.tokens)
        mask = PermutedMask(SVGMask.spatial(g, density, first_frame_sink=sink), pos, np.argsort(pos))
    else:
        mask = SVGMask.spatial(g, density, first_frame_sink=sink)
        if kind == "tile_aligned":
            mask = mask.tile_aligned(draw(st.sampled_from([128, 256])), draw(st.sampled_from([128, 384])),
                                     policy=draw(st.sampled_from(["balanced", "up", "down"])))
    return mask, mask.to_dense()


blocks = st.sampled_from([128, 128, 256, 384, 512])  # 128 twice: more tiles per mask


# -- tile classes ----------------------------------------------------------------------------

def check_classes(mask, dense, bq, bk):
    plan = plan_tiles(mask, bq, bk)
    counts, areas, classes, touches = brute_plan(dense, bq, bk)
    assert isinstance(plan, TilePlan) and plan.mask is mask and plan.tokens == mask.tokens
    assert plan.grid == counts.shape == (-(-mask.tokens // bq), -(-mask.tokens // bk))
    assert plan.classes.dtype == np.int8
    np.testing.assert_array_equal(plan.counts, counts)
    np.testing.assert_array_equal(plan.areas, areas)
    np.testing.assert_array_equal(plan.classes, classes)
    np.testing.assert_array_equal(plan.touches_padding, touches)
    np.testing.assert_array_equal(plan.visited, classes != EMPTY)
    np.testing.assert_array_equal(plan.needs_mask, classes == PARTIAL)
    return classes


@given(masks(), blocks, blocks)
@FAST
def test_classes_match_brute_force(mask_dense, bq, bk):
    check_classes(*mask_dense, bq, bk)


# mid-sized masks where every class occurs, checked whatever hypothesis happens to draw
MID = VideoGeometry(8, 12, 24, text_tokens=16)  # 2,320 tokens


@pytest.mark.parametrize("mask", [SVGMask.spatial(MID, 0.15), SVGMask.spatial(MID, 0.3, first_frame_sink=False),
                                  SVGMask.temporal(MID, 0.15)], ids=["spatial", "spatial-nosink", "temporal"])
@pytest.mark.parametrize("bq, bk", [(128, 128), (256, 384), (512, 128)])
def test_classes_match_brute_force_mid_size(mask, bq, bk):
    classes = check_classes(mask, mask.to_dense(), bq, bk)
    if (bq, bk) == (128, 128):
        assert {EMPTY, PARTIAL, FULL} <= set(classes.ravel().tolist())


@given(masks(), blocks, blocks)
@FAST
def test_schedule_tables(mask_dense, bq, bk):
    mask, dense = mask_dense
    plan = plan_tiles(mask, bq, bk)
    _, _, classes, _ = brute_plan(dense, bq, bk)
    nq, nk = classes.shape
    assert plan.kv_index.dtype == np.int32 and plan.num_steps.dtype == np.int32
    assert plan.step_class.dtype == np.int8
    assert plan.schedule.dtype == np.int32 and plan.schedule.shape == (-(-plan.kv_index.size // 2),)
    visits = [np.flatnonzero(classes[i] != EMPTY) for i in range(nq)]
    steps = max(1, max(v.size for v in visits))
    assert plan.steps == steps
    assert plan.kv_index.shape == plan.step_class.shape == (nq, steps)
    assert plan.num_steps.shape == (nq,)
    assert ((plan.kv_index >= 0) & (plan.kv_index < nk)).all()
    for i, tiles in enumerate(visits):
        m = tiles.size
        assert plan.num_steps[i] == m
        idle = steps - m  # idle steps first, then the visited tiles, ascending
        np.testing.assert_array_equal(plan.kv_index[i, idle:], tiles)
        np.testing.assert_array_equal(plan.step_class[i, idle:], classes[i, tiles])
        # idle steps point at the row's first tile (copied once, before its visit) and compute nothing
        if m:
            assert (plan.kv_index[i, :idle] == tiles[0]).all()
        assert (plan.step_class[i, :idle] == EMPTY).all()
    # the packed table the kernel reads holds exactly these two tables
    kv, cls = unpack_schedule(plan.schedule, plan.grid[0], plan.steps)
    np.testing.assert_array_equal(kv, plan.kv_index)
    np.testing.assert_array_equal(cls, plan.step_class)
    assert dma_count(plan.kv_index) <= max(int(plan.visited.sum()), 1)  # no DMA for an idle step


def test_query_tile_with_nothing_to_visit():
    dense = np.zeros((300, 300), bool)
    dense[:128, 140:200] = True           # query tile 0: one partial tile (kv tile 1)
    dense[256:, :256] = True              # query tile 2: kv tiles 0 and 1 full
    plan = plan_tiles(ArrayMask(dense), 128, 128)
    assert plan.num_steps.tolist() == [1, 0, 2]
    assert plan.steps == 2
    assert plan.kv_index[0].tolist() == [1, 1]  # its idle step first, on the tile it visits
    assert plan.step_class[0].tolist() == [EMPTY, PARTIAL]
    assert plan.step_class[1].tolist() == [EMPTY, EMPTY]
    assert plan.kv_index[1].tolist() == [1, 1]  # the tile query tile 0 left resident: no DMA
    assert plan.kv_index[2].tolist() == [0, 1]
    assert plan.step_class[2].tolist() == [FULL, FULL]


def dma_count(kv_index):
    """Key-tile copies of one head walking the grid (query tile, then step): one per change of tile."""
    order = np.asarray(kv_index).ravel()
    return 1 + int((order[1:] != order[:-1]).sum())


def test_keyless_query_tiles_point_at_the_resident_tile():
    # query tiles 0 and 3 keep nothing: tile 0 waits on the tile that query tile 1 fetches first,
    # tile 3 on the one query tile 2 left resident, so neither issues a DMA
    dense = np.zeros((512, 512), bool)
    dense[128:256, 300:512] = True   # query tile 1: key tiles 2, 3
    dense[256:384, 140:200] = True   # query tile 2: key tile 1
    plan = plan_tiles(ArrayMask(dense), 128, 128)
    assert plan.num_steps.tolist() == [0, 2, 1, 0]
    assert plan.kv_index.tolist() == [[2, 2], [2, 3], [1, 1], [1, 1]]
    assert dma_count(plan.kv_index) == int(plan.visited.sum()) == 3


def test_pack_and_stack_schedules():
    a = plan_tiles(ArrayMask(np.tril(np.ones((300, 300), bool))), 128, 128)   # steps 3
    b = plan_tiles(ArrayMask(np.eye(300, dtype=bool)), 128, 128)             # steps 1
    table = stack_schedules([a, b])
    assert table.dtype == np.int32 and table.shape == (9,)  # 18 steps, two to a word
    kv, cls = unpack_schedule(table, 6, 3)
    np.testing.assert_array_equal(kv[:3], a.kv_index)
    np.testing.assert_array_equal(cls[:3], a.step_class)
    np.testing.assert_array_equal(kv[3:, -1:], b.kv_index)
    # b's rows start with idle steps on the row's own first tile
    assert (cls[3:, :-1] == EMPTY).all() and (kv[3:, :-1] == b.kv_index[:, :1]).all()
    # the layout the kernel decodes: entry n in half n % 2 of word n // 2
    n = np.arange(18)
    entry = (table.view(np.uint32)[n // 2].astype(np.int64) >> (STEP_BITS * (n % 2))) & 0xFFFF
    assert (entry >> CLASS_BITS).tolist() == kv.ravel().tolist()
    assert (entry & 3).tolist() == cls.ravel().tolist()
    with pytest.raises(ValueError, match="one tile grid"):
        stack_schedules([a, plan_tiles(ArrayMask(np.eye(300, dtype=bool)), 256, 128)])


def test_packing_round_trips_large_tile_indices_and_odd_lengths():
    kv = np.array([[0, MAX_KV_TILES - 1, 8192], [5, 9000, 1]])
    cls = np.array([[FULL, PARTIAL, EMPTY], [FULL, FULL, PARTIAL]])
    for rows in (1, 2):  # 3 or 6 entries: an odd count leaves half a word unused
        table = pack_schedule(kv[:rows], cls[:rows])
        assert table.shape == (-(-3 * rows // 2),)
        got_kv, got_cls = unpack_schedule(table, rows, 3)
        np.testing.assert_array_equal(got_kv, kv[:rows])
        np.testing.assert_array_equal(got_cls, cls[:rows])
    with pytest.raises(ValueError, match="must lie in.*block_kv"):
        pack_schedule(np.array([[MAX_KV_TILES]]), np.array([[FULL]]))
    with pytest.raises(ValueError, match="must lie in"):
        pack_schedule(np.array([[-1]]), np.array([[FULL]]))


def test_an_all_empty_mask_still_has_one_step():
    plan = plan_tiles(ArrayMask(np.zeros((200, 200), bool)), 128, 128)
    assert plan.steps == 1 and plan.num_steps.tolist() == [0, 0]
    assert (plan.step_class == EMPTY).all()
    assert plan.stats["tiles_visited"] == 0 and plan.stats["pair_density"] == 0.0


def test_full_tile_reaching_into_key_padding_is_partial():
    # every real pair kept, but the last key tile runs past the sequence: its padded
    # columns must be masked out of the softmax, so it is not a mask-free tile
    plan = plan_tiles(ArrayMask(np.ones((200, 200), bool)), 128, 128)
    assert plan.classes.tolist() == [[FULL, PARTIAL], [FULL, PARTIAL]]
    assert CLASS_NAMES[FULL] == "full" and CLASS_NAMES[PARTIAL] == "partial" and CLASS_NAMES[EMPTY] == "empty"


# -- padding a mask declares (Mask.real_tokens_in) ----------------------------------------------

class PaddedArrayMask(ArrayMask):
    """A dense pattern whose `padding` positions (bool [tokens]) are padding inside the sequence."""

    def __init__(self, dense, padding):
        self.padding = np.asarray(padding, dtype=bool)
        super().__init__(np.asarray(dense, bool) & ~self.padding[:, None] & ~self.padding[None, :])

    def real_tokens_in(self, edges):
        real = np.concatenate([[0], np.cumsum(~self.padding)])
        edges = np.minimum(np.asarray(edges), self.tokens)
        return real[edges[1:]] - real[edges[:-1]]


def brute_padded_classes(mask, bq, bk):
    """Classes by the rule, tile by tile: padded query rows ignored, padded keys forcing a mask."""
    n = mask.tokens
    nq, nk = -(-n // bq), -(-n // bk)
    pad = np.concatenate([mask.padding, np.ones(nq * bq + nk * bk, bool)])  # past the end: padding too
    classes = np.empty((nq, nk), dtype=int)
    for i in range(nq):
        for j in range(nk):
            rows = np.flatnonzero(~pad[i * bq:(i + 1) * bq]) + i * bq
            cols = np.flatnonzero(~pad[j * bk:(j + 1) * bk]) + j * bk
            kept = mask.dense[np.ix_(rows, cols)]
            if not kept.any():
                classes[i, j] = EMPTY
            elif kept.all() and cols.size == bk:
                classes[i, j] = FULL
            else:
                classes[i, j] = PARTIAL
    return classes


@given(st.integers(0, 2**32 - 1), st.sampled_from(range(1, 700)), blocks, blocks)
@FAST
def test_declared_padding_rows_are_dropped_and_padded_keys_masked(seed, n, bq, bk):
    rng = np.random.default_rng(seed)
    padding = np.zeros(n, bool)
    for start in rng.integers(0, n, size=3):  # runs of padding, some longer than a tile
        padding[start:start + int(rng.integers(1, 300))] = True
    mask = PaddedArrayMask(random_tiled_pattern(rng, n), padding)
    plan = plan_tiles(mask, bq, bk)
    np.testing.assert_array_equal(plan.classes, brute_padded_classes(mask, bq, bk))
    rows, cols = mask.real_tokens_in(np.arange(0, plan.grid[0] * bq + 1, bq)), \
        mask.real_tokens_in(np.arange(0, plan.grid[1] * bk + 1, bk))
    np.testing.assert_array_equal(plan.areas, rows[:, None] * cols[None, :])
    np.testing.assert_array_equal(plan.touches_padding, (rows < bq)[:, None] | (cols < bk)[None, :])
    # a tile of nothing but padded query rows is skipped, whatever its keys
    assert not plan.visited[rows == 0].any()


def test_padded_query_rows_leave_a_tile_full_padded_keys_do_not():
    padding = np.zeros(256, bool)
    padding[100:128] = True                      # the end of query / key tile 0
    plan = plan_tiles(PaddedArrayMask(np.ones((256, 256), bool), padding), 128, 128)
    assert plan.classes.tolist() == [[PARTIAL, FULL], [PARTIAL, FULL]]
    assert plan.stats["tiles_masked"] == 2 and plan.touches_padding[0].all() and plan.touches_padding[:, 0].all()
    # without the hook (plain ArrayMask of the same pattern) the padded rows would cut tile row 0 too
    plain = plan_tiles(ArrayMask(PaddedArrayMask(np.ones((256, 256), bool), padding).dense), 128, 128)
    assert plain.classes.tolist() == [[PARTIAL, PARTIAL], [PARTIAL, FULL]]


def test_a_mask_keeping_pairs_on_its_padding_is_refused():
    class Leaky(PaddedArrayMask):
        def __init__(self, dense, padding):
            super().__init__(dense, padding)
            self.dense = np.asarray(dense, bool)  # keeps pairs on the padding it declares

    padding = np.zeros(200, bool)
    padding[:10] = True
    with pytest.raises(ValueError, match="keeps pairs on positions its real_tokens_in calls padding"):
        plan_tiles(Leaky(np.ones((200, 200), bool), padding), 128, 128)


# -- statistics ------------------------------------------------------------------------------

@given(masks(), blocks, blocks)
@FAST
def test_stats_are_consistent(mask_dense, bq, bk):
    mask, dense = mask_dense
    plan = plan_tiles(mask, bq, bk)
    _, areas, classes, touches = brute_plan(dense, bq, bk)
    n = mask.tokens
    nq, nk = classes.shape
    s = plan.stats
    visited = int((classes != EMPTY).sum())
    masked = int((classes == PARTIAL).sum())
    assert s["tokens"] == n
    assert (s["block_q"], s["block_kv"], s["q_tiles"], s["kv_tiles"]) == (bq, bk, nq, nk)
    assert s["tiles_total"] == nq * nk
    assert s["tiles_visited"] == visited
    assert s["tiles_full"] == (classes == FULL).sum()
    assert s["tiles_masked"] == masked
    assert s["tiles_touching_padding"] == touches.sum()
    assert s["pair_density"] == pytest.approx(dense.sum() / n**2, rel=1e-12)
    assert s["visited_fraction"] == pytest.approx(visited / (nq * nk))
    assert s["masked_fraction"] == pytest.approx(masked / max(visited, 1))
    assert s["grid_steps"] == nq * plan.steps
    assert s["computed_pairs"] == areas[classes != EMPTY].sum()
    band = getattr(mask, "band_width", None)
    assert s["band_width"] == (None if band is None else int(band))

    # B3 numbers: the same as planning the rounded mask separately
    b3 = plan_tiles(mask.tile_aligned(bq, bk, policy="balanced"), bq, bk)
    assert s["b3_tiles_visited"] == b3.visited.sum()
    assert s["b3_tiles_masked"] == b3.needs_mask.sum()
    assert s["b3_visited_fraction"] == pytest.approx(b3.visited.sum() / (nq * nk))
    assert s["b3_pairs"] == b3.counts.sum()
    assert s["b3_budget_error"] == pytest.approx((b3.counts.sum() - dense.sum()) / max(dense.sum(), 1))


@given(masks(), blocks, blocks)
@settings(max_examples=15, deadline=None, database=None)
def test_tile_aligned_plans_mask_only_key_padding(mask_dense, bq, bk):
    mask, dense = mask_dense
    tam = mask.tile_aligned(bq, bk)
    plan = plan_tiles(tam, bq, bk)
    kv_padded = np.array([(j + 1) * bk > mask.tokens for j in range(plan.grid[1])])
    np.testing.assert_array_equal(plan.visited, tam.kept)
    np.testing.assert_array_equal(plan.needs_mask, tam.kept & kv_padded[None, :])
    # rounding an already-aligned mask changes nothing
    s = plan.stats
    assert s["b3_tiles_visited"] == s["tiles_visited"]
    assert s["b3_tiles_masked"] == s["tiles_masked"]
    assert s["b3_budget_error"] == 0


def test_hand_built_tile_mask_is_its_own_b3():
    kept = np.array([[True, False, True], [False, True, True]])
    tam = TileAlignedMask(700, 384, 256, kept)  # no report: built by hand, nothing to round
    s = plan_tiles(tam, 384, 256).stats
    assert s["tiles_visited"] == s["b3_tiles_visited"] == 4
    assert s["tiles_masked"] == s["b3_tiles_masked"] == 2  # the kept tiles of the padded last key tile
    assert s["b3_budget_error"] == 0 and s["band_width"] is None


def test_str_mentions_the_tiles():
    plan = plan_tiles(SVGMask.spatial(VideoGeometry(4, 8, 16), 0.3), 256, 128)
    text = str(plan)
    assert "256x128" in text and "visited" in text and "B3" in text


# -- the blog's configuration ----------------------------------------------------------------

def test_blog_geometry_plans_quickly_and_b3_removes_masking():
    mask = SVGMask.spatial(VideoGeometry(21, 45, 80), 0.35)
    start = time.perf_counter()
    plan = plan_tiles(mask, 3328, 1536)
    s = plan.stats
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0, f"planning 75,600 tokens took {elapsed:.1f} s; it should need no N x N work"
    assert (s["tokens"], s["q_tiles"], s["kv_tiles"]) == (75_600, 23, 50)
    assert s["band_width"] % 128 == 0
    assert s["tiles_visited"] < s["tiles_total"]
    assert s["b3_tiles_masked"] < s["tiles_masked"]
    assert abs(s["b3_budget_error"]) < 1e-3
    assert abs(s["pair_density"] - 0.35) < 0.05  # the sink adds a little on top of the band
    # counts agree with the closed form on whole rows of tiles
    assert plan.counts.sum() == mask.pair_count


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("not_a_mask", [np.ones((256, 256), bool), None, "band"])
def test_plan_needs_a_mask(not_a_mask):
    with pytest.raises(TypeError, match="Mask"):
        plan_tiles(not_a_mask, 128, 128)


@pytest.mark.parametrize("bad", [0, 100, 129, -128, 128.5, True])
def test_plan_rejects_bad_block_sizes(bad):
    mask = SVGMask.spatial(VideoGeometry(2, 8, 8), 0.5)
    with pytest.raises(ValueError, match=r"block_q.*multiple of 128"):
        plan_tiles(mask, bad, 128)
    with pytest.raises(ValueError, match=r"block_kv.*multiple of 128"):
        plan_tiles(mask, 128, bad)


def test_plan_refuses_an_integral_float_block_as_a_float():
    mask = SVGMask.spatial(VideoGeometry(2, 8, 8), 0.5)
    with pytest.raises(ValueError, match=r"^block_kv must be an int, got 128.0 \(a float\); pass the int 128$"):
        plan_tiles(mask, 128, 128.0)


def test_a_large_plan_counted_a_band_of_rows_at_a_time_is_the_same_plan(monkeypatch):
    # plans of PROGRESS_TOKENS or more count their pairs in bands of query tiles (to show a bar); the
    # result must not depend on it: the same mask planned whole and in bands gives equal tables
    import svg_lib.core.planner as planner
    from svg_lib.progress import set_quiet

    mask = SVGMask.spatial(VideoGeometry(21, 16, 30), 0.35)  # 10,080 tokens, 79 x 40 tiles
    whole = planner.plan_tiles(mask, 128, 256)
    monkeypatch.setattr(planner, "PROGRESS_TOKENS", 1000)
    set_quiet(True)
    try:
        banded = planner.plan_tiles(mask, 128, 256)
    finally:
        set_quiet(False)
    assert np.array_equal(whole.classes, banded.classes)
    assert np.array_equal(whole.tables.schedule, banded.tables.schedule) and whole.steps == banded.steps
    assert np.array_equal(whole.tables.schedule_t, banded.tables.schedule_t)
    assert whole.stats == banded.stats
