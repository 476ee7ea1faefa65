"""Tests of svg_lib.teaching.plots: mask images, tile maps (figure and ASCII).

Expected values come from dense masks (small sizes), the plan's own class arrays, and
orientation facts of the SVG mask (the sink is a column on the left: keys < S).
"""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from svg_lib.core.geometry import VideoGeometry  # noqa: E402
from svg_lib.core.svg_masks import SVGMask  # noqa: E402
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles  # noqa: E402
from svg_lib.attention import b3_mask  # noqa: E402
from svg_lib.teaching.plots import (ADDED_COLOR, DROPPED_COLOR, TILE_COLORS, ascii_tile_map, kept_fraction_grid,  # noqa: E402
                           plot_mask, plot_query_frames, plot_rounding_diff, plot_schedule, plot_tile_map,
                           plot_tile_map_grid, plot_tile_maps, rounding_diff)
from svg_lib.teaching.charts import plot_speedups, plot_stage_costs  # noqa: E402
from svg_lib.problem import get_preset  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def small_plan(block_q=512, block_kv=256):
    p = get_preset("small")  # 10,080 tokens: padding in both directions at 512 x 256
    return plan_tiles(p.mask(), block_q, block_kv)


# -- kept fraction -------------------------------------------------------------------------

def test_kept_fraction_grid_matches_the_dense_mask():
    g = VideoGeometry(3, 8, 15, text_tokens=7)  # 367 tokens
    mask = SVGMask.spatial(g, 0.4)
    fraction, edges, exact = kept_fraction_grid(mask, resolution=50)
    assert exact and edges[0] == 0 and edges[-1] == g.tokens
    assert np.all(np.diff(edges) > 0) and edges.size - 1 <= 50
    dense = mask.to_dense().astype(np.int64)
    sums = np.add.reduceat(np.add.reduceat(dense, edges[:-1], axis=0), edges[:-1], axis=1)
    widths = np.diff(edges)
    np.testing.assert_allclose(fraction, sums / (widths[:, None] * widths[None, :]))


def test_kept_fraction_grid_is_the_mask_itself_at_small_sizes():
    mask = get_preset("tiny").mask()
    fraction, edges, exact = kept_fraction_grid(mask, resolution=512)
    assert exact and edges.size == mask.tokens + 1
    np.testing.assert_array_equal(fraction, mask.to_dense())


class _NoClosedForm(SVGMask):
    """An SVG mask pretending to be uncountable, to force the sampled fallback."""

    def pair_counts(self, q_edges, k_edges):
        raise ValueError("no closed form")


def test_sampled_fraction_agrees_with_exact_where_cells_are_uniform():
    g = VideoGeometry(5, 20, 20)  # 2,000 tokens, 40-token cells at resolution 50
    exact_mask = SVGMask.spatial(g, 0.3)
    sampled_mask = _NoClosedForm(g, exact_mask.band_width, exact_mask.sink_tokens)
    exact, _, was_exact = kept_fraction_grid(exact_mask, resolution=50)
    sampled, _, sampled_exact = kept_fraction_grid(sampled_mask, resolution=50)
    assert was_exact and not sampled_exact
    uniform = (exact == 0) | (exact == 1)
    assert uniform.mean() > 0.8
    np.testing.assert_array_equal(sampled[uniform], exact[uniform])
    assert abs(sampled.mean() - exact.mean()) < 0.01


def test_kept_fraction_grid_rejects_bad_input():
    with pytest.raises(TypeError, match="Mask"):
        kept_fraction_grid(np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="resolution"):
        kept_fraction_grid(get_preset("tiny").mask(), resolution=0)


# -- plot_mask -----------------------------------------------------------------------------

def test_plot_mask_small_is_the_dense_mask():
    mask = get_preset("tiny").mask()
    fig = plot_mask(mask)
    ax = fig.axes[0]
    (image,) = ax.images
    np.testing.assert_array_equal(np.asarray(image.get_array()), mask.to_dense())
    assert ax.get_xlabel() == "key index" and ax.get_ylabel() == "query index"
    # a binary image gets a two-colour key, not a 0-1 colour bar
    assert len(fig.axes) == 1
    patches = ax.get_legend().get_patches()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["kept pair", "pair not kept"]
    cmap = image.cmap
    assert np.allclose(patches[0].get_facecolor(), cmap(1.0)) and np.allclose(patches[1].get_facecolor(), cmap(0.0))


def test_plot_mask_blog_size_is_exact_and_oriented_like_a_matrix():
    mask = get_preset("blog").mask()
    fig = plot_mask(mask, resolution=256)
    ax = fig.axes[0]
    image = np.asarray(ax.images[0].get_array())
    assert image.shape == (256, 256)
    assert image.min() >= 0 and image.max() <= 1
    assert len(fig.axes) == 2 and ax.get_legend() is None  # fractions: a colour bar, not a two-colour key
    n = mask.tokens
    assert ax.get_ylim() == (n, 0)  # query 0 at the top
    # the first-frame sink is a column of keys on the left: bottom-left kept, top-right far outside the band
    assert image[-1, 0] == 1.0 and image[0, -1] == 0.0
    # cells of (almost) equal size: the mean kept fraction is the pair density
    assert abs(image.mean() - mask.pair_density) < 1e-3


def test_plot_mask_draws_into_a_given_axes():
    fig, ax = plt.subplots()
    assert plot_mask(get_preset("tiny").mask(), ax=ax, title="hello") is fig
    assert ax.get_title() == "hello"


# -- plot_tile_map ---------------------------------------------------------------------------

def _collection(ax, gid):
    found = [c for c in ax.collections if c.get_gid() == gid]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("show_mask", [True, False])
def test_tile_map_colours_one_patch_per_tile_by_class(show_mask):
    plan = small_plan()
    fig = plot_tile_map(plan, show_mask=show_mask)
    ax = fig.axes[0]
    tiles = _collection(ax, "tiles")
    colours = np.asarray(tiles.get_facecolors())[:, :3]
    assert len(colours) == plan.classes.size
    for cls in (EMPTY, PARTIAL, FULL):
        painted = np.all(np.isclose(colours, to_rgb(TILE_COLORS[cls])), axis=1)
        assert painted.sum() == (plan.classes == cls).sum()
        np.testing.assert_array_equal(painted, (plan.classes == cls).ravel())
    assert len(ax.images) == (1 if show_mask else 0)
    assert ax.get_xlabel() == "key index" and ax.get_ylabel() == "query index"


def test_tile_map_draws_tiles_at_their_true_extents():
    plan = small_plan()
    n = plan.tokens
    nq, nk = plan.grid
    ax = plot_tile_map(plan).axes[0]
    boxes = np.array([p.get_extents().bounds for p in _collection(ax, "tiles").get_paths()])  # x, y, w, h
    boxes = boxes.reshape(nq, nk, 4)
    np.testing.assert_allclose(boxes[0, :-1, 2], plan.block_kv)
    np.testing.assert_allclose(boxes[0, -1, 2], n - (nk - 1) * plan.block_kv)  # narrower: key padding
    np.testing.assert_allclose(boxes[-1, 0, 3], n - (nq - 1) * plan.block_q)   # shorter: query padding
    # hatched: the visited tiles reaching into padding; an empty tile is skipped, its padding costs nothing
    hatched = plan.touches_padding & plan.visited
    assert 0 < hatched.sum() < plan.touches_padding.sum() == nq + nk - 1
    hatched_boxes = np.array([p.get_extents().bounds for p in _collection(ax, "padding").get_paths()])
    np.testing.assert_allclose(hatched_boxes, boxes[hatched])
    assert ax.get_xlim() == (0, nk * plan.block_kv) and ax.get_ylim() == (nq * plan.block_q, 0)


def test_tile_map_legend_counts_the_classes():
    plan = small_plan()
    ax = plot_tile_map(plan).axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    for cls, word in ((EMPTY, "empty"), (PARTIAL, "partial"), (FULL, "full")):
        (label,) = [t for t in texts if t.startswith(word)]
        assert label.endswith(f": {(plan.classes == cls).sum()}")
    assert any("padding" in t for t in texts)
    assert ax.get_legend().get_title().get_text() == "tiles in this map"
    # the mask drawn under the tiles gets a key of its own, and only where it is drawn
    assert "darker: pairs the mask keeps" in texts
    bare = [t.get_text() for t in plot_tile_map(plan, show_mask=False).axes[0].get_legend().get_texts()]
    assert not any("darker" in t for t in bare)


def test_tile_map_b1_draws_every_visited_tile_masked():
    plan = small_plan()
    assert (plan.classes == FULL).any()  # otherwise B1 and B2 would look alike and this proves nothing
    ax = plot_tile_map(plan, stage="b1").axes[0]
    colours = np.asarray(_collection(ax, "tiles").get_facecolors())[:, :3]
    masked = np.all(np.isclose(colours, to_rgb(TILE_COLORS[PARTIAL])), axis=1)
    np.testing.assert_array_equal(masked, plan.visited.ravel())
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"partial (masked): {plan.visited.sum()}" in texts and "full (no mask): 0" in texts
    assert f"{plan.visited.sum()} masked" in ax.get_title()
    with pytest.raises(ValueError, match="stage"):
        plot_tile_map(plan, stage="b4")


def test_tile_map_rejects_a_mask():
    with pytest.raises(TypeError, match="TilePlan"):
        plot_tile_map(get_preset("tiny").mask())


def test_tile_map_grid_one_panel_per_block_size():
    mask = get_preset("small").mask()
    sizes = [(256, 256), (512, 256), (1024, 512)]
    fig = plot_tile_map_grid(mask, sizes)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(sizes)
    for ax, (bq, bkv) in zip(panels, sizes):
        s = plan_tiles(mask, bq, bkv).stats
        assert f"{bq} x {bkv}" in ax.get_title()
        assert f"{s['tiles_visited']}/{s['tiles_total']} visited" in ax.get_title()
        assert f"{s['tiles_masked']} masked" in ax.get_title()
        assert len(_collection(ax, "tiles").get_paths()) == s["tiles_total"]
    with pytest.raises(ValueError, match="multiple of 128"):
        plot_tile_map_grid(mask, [(512, 200)])


def test_tile_maps_share_one_key_and_count_each_panel_in_its_title():
    p = get_preset("small")
    exact = plan_tiles(p.mask(), 512, 256)
    rounded = plan_tiles(b3_mask(p.mask(), 512, 256), 512, 256)
    fig = plot_tile_maps([exact, exact, rounded], stages=["b1", "b2", "b3"])
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 3 and all(ax.get_legend() is None for ax in panels)
    masked = [exact.visited.sum(), exact.needs_mask.sum(), rounded.needs_mask.sum()]
    visited = [exact.visited.sum(), exact.visited.sum(), rounded.visited.sum()]
    for ax, v, m in zip(panels, visited, masked):
        assert f"{v}/{exact.classes.size} visited, {m} masked" in ax.get_title()
    (key,) = fig.legends
    assert not any(":" in t.get_text() for t in key.get_texts())  # names the colours, counts nothing
    with pytest.raises(ValueError, match="one stage and one title per plan"):
        plot_tile_maps([exact, rounded], stages=["b2"])
    with pytest.raises(TypeError, match="TilePlans"):
        plot_tile_maps([p.mask()])


# -- what rounding changed -------------------------------------------------------------------

def test_rounding_diff_matches_the_rounding_report_at_blog_size():
    blog = get_preset("blog")
    mask = blog.mask()
    plan = plan_tiles(mask, blog.block_q, blog.block_kv)
    aligned = b3_mask(mask, blog.block_q, blog.block_kv)
    diff = rounding_diff(plan, aligned)
    r = aligned.report
    assert diff["added"].sum() == r.boundary_kept and (diff["added"] | diff["dropped"]).sum() == r.boundary_tiles
    assert (diff["pairs_added"], diff["pairs_dropped"]) == (r.pairs_added, r.pairs_dropped)
    assert not (diff["added"] & diff["dropped"]).any()
    ax = plot_rounding_diff(plan, aligned).axes[0]
    colours = np.asarray(_collection(ax, "tiles").get_facecolors())[:, :3]
    for flags, colour in ((diff["added"], ADDED_COLOR), (diff["dropped"], DROPPED_COLOR)):
        np.testing.assert_array_equal(np.all(np.isclose(colours, to_rgb(colour)), axis=1), flags.ravel())
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(f"+{r.pairs_added:,} pairs" in t for t in texts) and any(f"-{r.pairs_dropped:,} pairs" in t for t in texts)
    with pytest.raises(ValueError, match="same block sizes"):
        rounding_diff(plan_tiles(mask, 1024, 1536), aligned)


# -- one query's keys, frame by frame -------------------------------------------------------------

def test_query_frames_draw_each_frame_of_the_kept_keys():
    g = VideoGeometry(5, 4, 6)
    masks = {"spatial": SVGMask.spatial(g, 0.3), "temporal": SVGMask.temporal(g, 0.3)}
    query = 2 * g.frame_tokens + 7
    fig = plot_query_frames(masks, g, query)
    assert len(fig.axes) == 2 * g.frames
    for row, mask in enumerate(masks.values()):
        kept = mask.to_dense()[query].reshape(g.frames, g.height, g.width)
        for f in range(g.frames):
            ax = fig.axes[row * g.frames + f]
            np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), kept[f])
            assert len(ax.lines) == (1 if f == 2 else 0)  # the query is marked in its own frame only
        assert fig.subfigs[row].get_suptitle().startswith(f"{list(masks)[row]}: {kept.sum():,} keys")
        assert fig.axes[row * g.frames + f].get_title() == f"frame {f}"
    (marker,) = fig.axes[2].lines
    assert (marker.get_xdata()[0], marker.get_ydata()[0]) == (7 % g.width, 7 // g.width)
    with pytest.raises(ValueError, match="query"):
        plot_query_frames(masks, g, g.tokens)
    # frames wrap into rows of per_row; the grid's spare panels stay empty
    wrapped = plot_query_frames(masks, g, query, per_row=2)
    assert len(wrapped.axes) == 2 * 3 * 2 and sum(bool(ax.images) for ax in wrapped.axes) == 2 * g.frames
    with pytest.raises(ValueError, match="per_row"):
        plot_query_frames(masks, g, query, per_row=0)


# -- the per-tile cost lesson --------------------------------------------------------------------

def test_stage_costs_stack_full_and_masked_tiles_and_mark_the_measurements():
    counts = {"B0": (1150, 0), "B1": (0, 509), "B2": (374, 135)}
    a, b = 0.07, 0.2
    measured = {"B0": 78.7, "B2": 54.12}
    ax = plot_stage_costs(counts, (a, b), measured, measured_label="the case study").axes[0]
    full = [p.get_height() for p in ax.containers[0].patches]
    masked = ax.containers[1].patches
    np.testing.assert_allclose(full, [n * a for n, _ in counts.values()])
    np.testing.assert_allclose([p.get_height() for p in masked], [m * b for _, m in counts.values()])
    np.testing.assert_allclose([p.get_y() for p in masked], full)  # stacked on the full part
    ticks = [c for c in ax.collections if c.get_gid() == "measured"][0]
    segments = ticks.get_segments()
    assert [s[0][1] for s in segments] == list(measured.values())
    assert [round((s[0][0] + s[1][0]) / 2) for s in segments] == [0, 2]  # across the B0 and B2 bars
    assert [t.get_text() for t in ax.get_xticklabels()] == list(counts)
    assert "the case study (ms)" in [t.get_text() for t in ax.get_legend().get_texts()]
    with pytest.raises(ValueError, match="two numbers"):
        plot_stage_costs(counts, 0.07)
    with pytest.raises(ValueError, match="not in counts"):
        plot_stage_costs(counts, (a, b), {"B3": 32.76})


class _FakeRuntime:
    platform, device_kind, jax_version = "cpu", "cpu", "0"


def _fake_result(rows):
    from svg_lib.instruments.tools.bench import BenchResult
    from svg_lib.problem import BenchConfig

    keys = BenchResult.ROW_KEYS
    return BenchResult(BenchConfig.from_preset("tiny"), _FakeRuntime(), [dict(dict.fromkeys(keys), **r) for r in rows],
                       "interpret")


def test_speedups_are_each_devices_own_ratio_to_b0():
    result = _fake_result([
        {"method": "splash_dense", "median_ms": 400.0, "speedup": 1.0, "blog_v6e_ms": 78.70},
        {"method": "dense", "median_ms": 500.0, "speedup": 0.8, "blog_v6e_ms": None},
        {"method": "b3", "median_ms": 200.0, "speedup": 2.0, "blog_v6e_ms": 32.76}])
    ax = plot_speedups(result).axes[0]
    ours, theirs = ax.containers
    assert ours.get_label().startswith("this run") and theirs.get_label().startswith("the case study")
    np.testing.assert_allclose([p.get_height() for p in ours.patches], [1.0, 0.8, 2.0])
    np.testing.assert_allclose([p.get_height() for p in theirs.patches], [1.0, 78.70 / 32.76])
    assert len(ax.figure.axes) == 1  # one axis: ratios compare across devices, latencies would not
    with pytest.raises(ValueError, match="splash_dense"):
        plot_speedups(_fake_result([{"method": "b3", "median_ms": 1.0, "speedup": None, "blog_v6e_ms": 32.76}]))


# -- plot_schedule ---------------------------------------------------------------------------

def _schedule_paths(ax):
    return [np.asarray(line.get_xydata()) for line in ax.get_lines() if line.get_gid() == "schedule"]


@pytest.mark.parametrize("transposed", [False, True])
def test_schedule_paths_walk_the_visited_tiles_in_order(transposed):
    """One path per schedule row with a visit: along its query tile's row (forward, dq), or down
    its key tile's column (dk/dv), through tile centres in visit order; together, every visited
    tile exactly once."""
    mask = SVGMask.spatial(VideoGeometry(10, 8, 15), 0.35)   # 1,200 tokens: padding in q and kv
    plan = plan_tiles(mask, 128, 256)
    assert plan.steps != plan.transposed_tables[0].shape[1]  # the two walks differ in length here
    ax = plot_schedule(plan, transposed=transposed).axes[0]
    paths = _schedule_paths(ax)
    index, _, num_steps = plan.transposed_tables if transposed else (plan.kv_index, None, plan.num_steps)
    assert len(paths) == (num_steps > 0).sum()
    n = plan.tokens
    q_mid = (np.arange(plan.grid[0]) * plan.block_q + np.minimum(np.arange(1, plan.grid[0] + 1) * plan.block_q, n)) / 2
    k_mid = (np.arange(plan.grid[1]) * plan.block_kv + np.minimum(np.arange(1, plan.grid[1] + 1) * plan.block_kv, n)) / 2
    seen = np.zeros(plan.grid, int)
    for path, row in zip(paths, np.flatnonzero(num_steps)):
        tiles = index[row, index.shape[1] - num_steps[row]:]  # the visits, after the row's idle steps
        assert (np.diff(tiles) > 0).all()
        if transposed:  # a column: fixed key tile, query tiles going down
            np.testing.assert_allclose(path[:, 0], k_mid[row])
            np.testing.assert_allclose(path[:, 1], q_mid[tiles])
            seen[tiles, row] += 1
        else:           # a row: fixed query tile, key tiles going right
            np.testing.assert_allclose(path[:, 1], q_mid[row])
            np.testing.assert_allclose(path[:, 0], k_mid[tiles])
            seen[row, tiles] += 1
    np.testing.assert_array_equal(seen, plan.visited.astype(int))
    rows, steps = index.shape
    assert f"{rows} paths x {steps} steps = {rows * steps} grid steps" in ax.get_title()
    assert f"{plan.visited.sum()} visits" in ax.get_title()


def test_schedule_rejects_a_mask():
    with pytest.raises(TypeError, match="TilePlan"):
        plot_schedule(get_preset("tiny").mask())

# -- ascii_tile_map --------------------------------------------------------------------------

def test_ascii_map_characters_match_the_classes():
    plan = small_plan()
    lines = ascii_tile_map(plan).splitlines()
    nq, nk = plan.grid
    grid, legend = lines[:nq], lines[nq:]
    assert len(legend) == 2 and "legend" in legend[0]
    assert all(len(line) == nk for line in grid)
    chars = np.array([list(line) for line in grid])
    padding_only = (plan.classes == PARTIAL) & (plan.counts == plan.areas)
    assert padding_only.sum() > 0  # the small preset reaches into key padding
    np.testing.assert_array_equal(chars == "#", plan.classes == FULL)
    np.testing.assert_array_equal(chars == ".", plan.classes == EMPTY)
    np.testing.assert_array_equal(chars == "p", padding_only)
    np.testing.assert_array_equal(chars == "x", (plan.classes == PARTIAL) & ~padding_only)
    assert (chars == "#").sum() == plan.stats["tiles_full"]
    assert np.isin(chars, ["x", "p"]).sum() == plan.stats["tiles_masked"]


def test_ascii_map_downsamples_to_the_most_work():
    plan = small_plan(128, 128)  # 79 x 79 tiles
    nq, nk = plan.grid
    text = ascii_tile_map(plan, max_cols=20)
    lines = text.splitlines()
    group = -(-nk // 20)
    assert all(len(line) == -(-nk // group) for line in lines[:nq])
    assert f"{group} per character" in text and "most work" in text
    padding_only = (plan.classes == PARTIAL) & (plan.counts == plan.areas)
    boundary = (plan.classes == PARTIAL) & ~padding_only
    for i in range(nq):
        for c, char in enumerate(lines[i]):
            cols = slice(c * group, (c + 1) * group)
            expect = ("x" if boundary[i, cols].any() else "p" if padding_only[i, cols].any()
                      else "#" if (plan.classes[i, cols] == FULL).any() else ".")
            assert char == expect, (i, c)


def test_ascii_map_rejects_bad_widths():
    with pytest.raises(ValueError, match="max_cols"):
        ascii_tile_map(small_plan(), max_cols=0)
