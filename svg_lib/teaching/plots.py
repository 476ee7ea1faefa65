"""Pictures of masks and tile plans, as figures and as text.

Conventions (the same in every figure of the series): query index on the y axis,
key index on the x axis, origin top-left like a matrix; one colour per tile class.
Every function returns the matplotlib Figure it drew on. matplotlib is imported
inside the functions, so `import svg_lib` never needs it.

Nothing here runs a kernel: the pictures come from exact pair counts
(`Mask.pair_counts`) and tile plans (`plan_tiles`), i.e. they are analytic.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.masks import Mask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, TilePlan, plan_tiles
from svg_lib.methods import PLANNED_METHODS, check_method

# One colour per tile class (colour-blind safe): skipped work is pale, masked work stands out.
TILE_COLORS = {EMPTY: "#ececec", PARTIAL: "#e69f00", FULL: "#0072b2"}
TILE_LABELS = {EMPTY: "empty (skipped)", PARTIAL: "partial (masked)", FULL: "full (no mask)"}
PADDING_COLOR = "#9a9a9a"

# ascii_tile_map: characters in order of the work a tile costs, least first
_ASCII_CHARS = ".#px"  # empty, full, masked only for key padding, partial (boundary)


def _new_axes(ax, figsize):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
        return fig, ax
    return ax.figure, ax


def _sample_kept_fraction(mask: Mask, edges: np.ndarray, samples: int = 4) -> np.ndarray:
    """Kept fraction per cell estimated from `samples` x `samples` evenly spaced pairs per cell."""
    starts, widths = edges[:-1], np.diff(edges)
    offsets = (np.arange(samples) + 0.5) / samples
    points = (starts[:, None] + np.floor(widths[:, None] * offsets[None, :])).astype(np.int64).ravel()
    cells = starts.size
    kept = np.zeros((cells, samples, cells, samples), dtype=np.float64)
    chunk = max(1, 4096 // samples)  # rows of cells per keep() call bounds memory at ~4k x 2k pairs
    for c0 in range(0, cells, chunk):
        rows = points[c0 * samples:(c0 + chunk) * samples]
        block = np.asarray(mask.keep(rows[:, None], points[None, :]), dtype=np.float64)
        kept[c0:c0 + chunk] = block.reshape(-1, samples, cells, samples)
    return kept.mean(axis=(1, 3))


def kept_fraction_grid(mask: Mask, resolution: int = 512):
    """The fraction of kept pairs in each cell of a grid of at most `resolution` x `resolution` cells.

    Returns `(fraction, edges, exact)`: fraction float64 `[cells, cells]` (query cells on axis 0),
    the cell edges in token indices `[cells + 1]` (the same for queries and keys), and whether
    the fractions are exact (from `pair_counts`) or sampled (for masks too large to count pair by
    pair that have no closed form, e.g. a temporal head's mask at 75,600 tokens).
    """
    if not isinstance(mask, Mask):
        raise TypeError(f"expected an svg_lib Mask (e.g. SVGMask.spatial(...)), got {type(mask).__name__}")
    if isinstance(resolution, bool) or not isinstance(resolution, (int, np.integer)) or resolution < 1:
        raise ValueError(f"resolution must be a positive integer (cells per side), got {resolution!r}")
    n = mask.tokens
    if n <= resolution:
        edges = np.arange(n + 1, dtype=np.int64)  # one cell per token: the mask itself
    else:
        edges = np.unique(np.rint(np.linspace(0, n, resolution + 1)).astype(np.int64))
    widths = np.diff(edges)
    try:
        counts = mask.pair_counts(edges, edges)
    except ValueError:
        # no closed form and too many tokens to count exactly: fall back to sampling pairs
        return _sample_kept_fraction(mask, edges), edges, False
    return counts / (widths[:, None] * widths[None, :]), edges, True


def plot_mask(mask: Mask, ax=None, resolution: int = 512, title: str | None = None):
    """Draw `mask` (`[tokens, tokens]`, query on y, key on x) as an image; returns the Figure.

    Up to `resolution` tokens every pixel is one (query, key) pair, black if kept, white if
    not, with a two-entry key beside the image. Beyond that each pixel is a
    cell of about tokens/resolution tokens per side, shaded by the fraction of its pairs the mask
    keeps, computed exactly with `mask.pair_counts` (no N x N array, so 75,600 tokens is fine).
    A mask with no closed-form count and too many tokens to count pair by pair (a temporal
    head's frame-major view at the blog size) is sampled instead, and the colour bar says so.
    """
    fig, ax = _new_axes(ax, figsize=(5.6, 4.8))
    fraction, edges, exact = kept_fraction_grid(mask, resolution)
    n = mask.tokens
    image = ax.imshow(fraction, cmap="Greys", vmin=0.0, vmax=1.0, extent=(0, n, n, 0),
                      interpolation="nearest", aspect="equal")
    if edges.size == n + 1:
        # one pixel per pair: the image is binary, so a two-colour key says it better than a 0-1 scale
        _binary_legend(ax, image.cmap)
    else:
        cell = n / (edges.size - 1)
        label = f"kept fraction per {cell:,.0f} x {cell:,.0f}-token cell" + ("" if exact else " (sampled)")
        fig.colorbar(image, ax=ax, label=label, shrink=0.9)
    ax.set_xlabel("key index")
    ax.set_ylabel("query index")
    if title is None:
        density = float(np.sum(fraction * np.diff(edges)[:, None] * np.diff(edges)[None, :])) / float(n) ** 2
        approx = "" if exact else "~"
        title = f"{type(mask).__name__}: {n:,} tokens, pair density {approx}{density:.3f}"
    ax.set_title(title)
    return fig


def _binary_legend(ax, cmap, kept: str = "kept pair", dropped: str = "pair not kept"):
    """A two-entry key for a kept / not-kept image drawn with `cmap` from 0 (not kept) to 1 (kept)."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=cmap(1.0), edgecolor="#555555", linewidth=0.5, label=kept),
               Patch(facecolor=cmap(0.0), edgecolor="#555555", linewidth=0.5, label=dropped)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)


def _tile_extents(plan: TilePlan):
    """Token extents of the tiles, clipped to the real tokens: (q0, q1, k0, k1), each `[tiles]` per axis."""
    n = plan.tokens
    nq, nk = plan.grid
    q0 = np.arange(nq, dtype=np.int64) * plan.block_q
    k0 = np.arange(nk, dtype=np.int64) * plan.block_kv
    return q0, np.minimum(q0 + plan.block_q, n), k0, np.minimum(k0 + plan.block_kv, n)


def _legend_handles(counts: dict | None = None, padding: bool = True, shaded: bool = False):
    from matplotlib.patches import Patch

    handles = []
    for cls in (FULL, PARTIAL, EMPTY):
        label = TILE_LABELS[cls] + ("" if counts is None else f": {counts[cls]}")
        handles.append(Patch(facecolor=TILE_COLORS[cls], edgecolor="#555555", linewidth=0.5, label=label))
    if shaded:   # the mask drawn under the tiles (show_mask): where it keeps pairs the colour darkens
        handles.append(Patch(facecolor="#8c8c8c", edgecolor="none", alpha=0.5, label="darker: pairs the mask keeps"))
    if padding:
        handles.append(Patch(facecolor="none", edgecolor="#333333", hatch="////", label="visited, reaches into padding"))
        handles.append(Patch(facecolor=PADDING_COLOR, edgecolor="none", label="padding (no tokens)"))
    return handles


def stage_classes(plan: TilePlan, stage: str = "b2") -> np.ndarray:
    """int8 `[q_tiles, kv_tiles]`: each tile's class as `stage` treats it.

    B1 masks every tile it visits, so its visited tiles all count as PARTIAL (masked); B2 and
    B3 take the mask-free path on FULL tiles, so their classes are the plan's own (for B3, pass
    the plan of the tile-aligned mask).
    """
    return check_method(stage, PLANNED_METHODS, what="stage").step_classes(plan.classes)


def _draw_tiles(ax, plan: TilePlan, colors, visited: np.ndarray, show_mask: bool) -> np.ndarray:
    """Draw `plan`'s tiles at their true extents, coloured `colors` (one per tile, row-major), on
    the padded grid; hatch the `visited` tiles that reach into padding. Returns their flat indices."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    n = plan.tokens
    nq, nk = plan.grid
    q0, q1, k0, k1 = _tile_extents(plan)
    q_end, k_end = nq * plan.block_q, nk * plan.block_kv  # the padded grid

    if show_mask:
        fraction, _, _ = kept_fraction_grid(plan.mask, resolution=min(n, 384))
        # vmax 2: the fully kept regions only reach mid grey, so the tile colours stay readable
        ax.imshow(fraction, cmap="Greys", vmin=0.0, vmax=2.0, extent=(0, n, n, 0),
                  interpolation="nearest", aspect="auto", zorder=1)
    if q_end > n:
        ax.add_patch(Rectangle((0, n), k_end, q_end - n, facecolor=PADDING_COLOR, edgecolor="none", zorder=1))
    if k_end > n:
        ax.add_patch(Rectangle((n, 0), k_end - n, q_end, facecolor=PADDING_COLOR, edgecolor="none", zorder=1))

    ii, jj = np.meshgrid(np.arange(nq), np.arange(nk), indexing="ij")
    tiles = [Rectangle((k0[j], q0[i]), k1[j] - k0[j], q1[i] - q0[i]) for i, j in zip(ii.ravel(), jj.ravel())]
    thin = 0.6 if max(nq, nk) <= 64 else 0.25  # tile borders must not swamp large grids
    ax.add_collection(PatchCollection(tiles, facecolors=colors, edgecolors="white", linewidths=thin,
                                      alpha=0.62 if show_mask else 1.0, zorder=2, gid="tiles"))
    # an empty tile is skipped, so its padding costs nothing: hatch only the tiles a kernel visits
    padded = np.flatnonzero((plan.touches_padding & visited).ravel())
    if padded.size:
        ax.add_collection(PatchCollection([tiles[t] for t in padded], facecolors="none", edgecolors="#333333",
                                          linewidths=0.8, hatch="////", zorder=3, gid="padding"))
    ax.set_xlim(0, k_end)
    ax.set_ylim(q_end, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("key index")
    ax.set_ylabel("query index")
    if n >= 10_000:  # 5-digit tick labels run into each other on a small panel: 10k, 20k, ...
        from matplotlib.ticker import FuncFormatter

        thousands = FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v else "0")
        ax.xaxis.set_major_formatter(thousands)
        ax.yaxis.set_major_formatter(thousands)
    return padded


def plot_tile_map(plan: TilePlan, ax=None, title: str | None = None, show_mask: bool = True,
                  legend: bool = True, stage: str = "b2"):
    """Draw the tile classes of `plan` at their true token extents; returns the Figure.

    Each `block_q` x `block_kv` tile is one rectangle coloured by how `stage` treats it (empty,
    masked, or mask-free: see `stage_classes`; B1 masks every visited tile);
    tiles at the end of the sequence are clipped to the last token, so the padded remainder of
    the grid shows as a grey strip, and the visited tiles reaching into it are hatched (an empty
    tile is skipped, so its padding costs nothing). With `show_mask` the mask's kept fraction is
    drawn faintly underneath, so the band's edge is visible crossing the partial tiles. The
    legend counts the tiles of this map only; `plot_tile_maps` draws several maps with one key.
    """
    if not isinstance(plan, TilePlan):
        raise TypeError(f"plot_tile_map needs a TilePlan (from plan_tiles(mask, block_q, block_kv)), "
                        f"got {type(plan).__name__}")
    classes = stage_classes(plan, stage)
    fig, ax = _new_axes(ax, figsize=(7.4, 5.2))
    colors = [TILE_COLORS[int(c)] for c in classes.ravel()]
    padded = _draw_tiles(ax, plan, colors, classes != EMPTY, show_mask)
    s = plan.stats
    masked = int((classes == PARTIAL).sum())
    if title is None:
        title = (f"{'' if stage == 'b2' else stage.upper() + ', '}{plan.block_q} x {plan.block_kv} tiles (analytic plan): "
                 f"{s['tiles_visited']}/{s['tiles_total']} visited, {masked} masked")
    ax.set_title(title)
    if legend:
        counts = {c: int((classes == c).sum()) for c in (EMPTY, PARTIAL, FULL)}
        ax.legend(handles=_legend_handles(counts, padding=bool(padded.size), shaded=show_mask), loc="upper left",
                  bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False, title="tiles in this map",
                  title_fontsize="small")
    return fig


def plot_tile_maps(plans, titles=None, stages=None, show_mask: bool = True, title: str | None = None,
                   panel_size: float = 3.6):
    """Several tile maps side by side with one shared key; returns the Figure.

    plans: TilePlans (e.g. B2's exact plan and B3's tile-aligned one); stages: how each panel's
    kernel treats its tiles ("b1", "b2" or "b3", see `stage_classes`; default "b2"); titles: one per
    panel (default: block sizes and the panel's visited / masked counts). The shared key names
    the colours without counting them: each panel's counts are in its title.
    """
    import matplotlib.pyplot as plt

    plans = list(plans)
    if not plans or not all(isinstance(p, TilePlan) for p in plans):
        raise TypeError("plot_tile_maps needs a non-empty list of TilePlans (from plan_tiles(mask, block_q, block_kv))")
    stages = ["b2"] * len(plans) if stages is None else list(stages)
    titles = [None] * len(plans) if titles is None else list(titles)
    if len(stages) != len(plans) or len(titles) != len(plans):
        raise ValueError(f"give one stage and one title per plan: {len(plans)} plans, {len(stages)} stages, "
                         f"{len(titles)} titles")
    fig, axes = plt.subplots(1, len(plans), figsize=(panel_size * len(plans) + 0.4, panel_size + 1.2),
                             squeeze=False, layout="constrained")
    for ax, plan, stage, panel_title in zip(axes[0], plans, stages, titles):
        if panel_title is None:
            s = plan.stats
            masked = int((stage_classes(plan, stage) == PARTIAL).sum())
            panel_title = (f"{plan.block_q} x {plan.block_kv}\n{s['tiles_visited']}/{s['tiles_total']} visited, "
                           f"{masked} masked")
        plot_tile_map(plan, ax=ax, show_mask=show_mask, legend=False, stage=stage, title=panel_title)
    for ax in axes[0][1:]:
        ax.set_ylabel("")
    padding = any((p.touches_padding & p.visited).any() for p in plans)
    fig.legend(handles=_legend_handles(padding=padding), loc="outside lower center", ncol=min(5, 2 * len(plans) + 1),
               fontsize="small", frameon=False)
    if title is not None:
        fig.suptitle(title)
    return fig


def plot_tile_map_grid(mask: Mask, block_sizes, show_mask: bool = True, title: str | None = None,
                       panel_size: float = 3.6):
    """One tile map per `(block_q, block_kv)` in `block_sizes`, side by side; returns the Figure.

    Each panel is titled with its block sizes and its visited / masked tile counts, so the
    same mask can be compared across tilings (more tiles skipped is not always less work).
    """
    sizes = [tuple(b) for b in block_sizes]
    if not sizes or any(len(b) != 2 for b in sizes):
        raise ValueError(f"block_sizes must be a non-empty list of (block_q, block_kv) pairs, got {block_sizes!r}")
    plans = [plan_tiles(mask, bq, bkv) for bq, bkv in sizes]  # validates the block sizes first
    return plot_tile_maps(plans, show_mask=show_mask, title=title, panel_size=panel_size)


def plot_schedule(plan: TilePlan, transposed: bool = False, ax=None, title: str | None = None,
                  legend: bool = True, stage: str = "b2"):
    """The path a kernel's grid takes through the tiles of `plan`, over its tile map; returns the Figure.

    `transposed=False`: the forward's schedule, which the backward's dq pass walks too: one
    path per query tile, along its row through the key tiles it visits. `transposed=True`: the
    dk/dv pass's schedule (`plan.transposed_tables`): one path per key tile, down its column
    through the query tiles that visit it. Each path is one row of the schedule table, dots on
    the tiles in visit order and an arrow head on the last; the grid pads every path with idle
    steps to the longest one, and the title counts grid steps, visits and idle steps.
    """
    from matplotlib.lines import Line2D

    if not isinstance(plan, TilePlan):
        raise TypeError(f"plot_schedule needs a TilePlan (from plan_tiles(mask, block_q, block_kv)), "
                        f"got {type(plan).__name__}")
    index, _, num_steps = plan.transposed_tables if transposed else (plan.kv_index, plan.step_class, plan.num_steps)
    q0, q1, k0, k1 = _tile_extents(plan)
    q_mid, k_mid = (q0 + q1) / 2, (k0 + k1) / 2
    rows, steps = index.shape
    visits = int(num_steps.sum())
    if title is None:
        walk = "dk/dv: per key tile, the query tiles" if transposed else "forward and dq: per query tile, the key tiles"
        title = (f"{walk}\n{rows} paths x {steps} steps = {rows * steps} grid steps "
                 f"({visits} visits, {rows * steps - visits} idle)")
    fig = plot_tile_map(plan, ax=ax, title=title, show_mask=False, legend=False, stage=stage)
    ax = fig.axes[0] if ax is None else ax
    for r in range(rows):
        tiles = index[r, steps - num_steps[r]:]  # the visits, after the idle steps
        if not tiles.size:
            continue  # a row that visits nothing: idle steps only
        xs, ys = (k_mid[r], q_mid[tiles]) if transposed else (k_mid[tiles], q_mid[r])
        xs, ys = np.broadcast_to(xs, tiles.shape), np.broadcast_to(ys, tiles.shape)
        ax.plot(xs, ys, color="#222222", linewidth=1.2, marker="o", markersize=4, zorder=4, gid="schedule")
        if tiles.size > 1:  # the arrow head says which way the path runs
            ax.annotate("", xy=(xs[-1], ys[-1]), xytext=(xs[-2], ys[-2]), zorder=4,
                        arrowprops=dict(arrowstyle="-|>", color="#222222", lw=1.2, shrinkA=0, shrinkB=3))
    if legend:
        handles = _legend_handles(padding=bool(plan.touches_padding.any()))
        handles.append(Line2D([], [], color="#222222", marker="o", markersize=4,
                              label="one schedule row: tiles in visit order"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    return fig

def _tile_work(plan: TilePlan) -> np.ndarray:
    """int8 [nq, nk]: index into `_ASCII_CHARS`, ordered by the work the tile costs."""
    work = np.zeros(plan.grid, dtype=np.int8)
    work[plan.classes == FULL] = 1
    partial = plan.classes == PARTIAL
    padding_only = partial & (plan.counts == plan.areas)  # every real pair kept: masked only for key padding
    work[padding_only] = 2
    work[partial & ~padding_only] = 3
    return work


def _downsample_max(work: np.ndarray, axis: int, limit: int | None) -> tuple[np.ndarray, int]:
    """Merge groups of tiles along `axis` so at most `limit` remain, keeping the most work in each group."""
    size = work.shape[axis]
    if limit is None or size <= limit:
        return work, 1
    group = -(-size // limit)
    pad = -size % group
    widths = [(0, 0), (0, 0)]
    widths[axis] = (0, pad)
    work = np.pad(work, widths)  # pads with 0 (empty), which never wins a max
    shape = list(work.shape)
    shape[axis:axis + 1] = [shape[axis] // group, group]
    return work.reshape(shape).max(axis=axis + 1), group


def ascii_tile_map(plan: TilePlan, max_cols: int = 100, max_rows: int | None = None) -> str:
    """The tile classes of `plan` as text: one line per query tile, one character per key tile.

    '#' full (mask-free), 'x' partial (elementwise mask), 'p' partial only because it reaches
    into key padding (all its real pairs are kept: B1 and B2 still evaluate the whole mask
    there, B3 only the padding test), '.' empty (skipped). With more key tiles
    than `max_cols` (or query tiles than `max_rows`), each character stands for a group of
    tiles and shows the most work among them (x > p > # > .); the legend says so.
    """
    if not isinstance(plan, TilePlan):
        raise TypeError(f"ascii_tile_map needs a TilePlan (from plan_tiles(...)), got {type(plan).__name__}")
    for name, value in (("max_cols", max_cols), ("max_rows", max_rows)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    nq, nk = plan.grid
    work, col_group = _downsample_max(_tile_work(plan), 1, max_cols)
    work, row_group = _downsample_max(work, 0, max_rows)
    chars = np.array(list(_ASCII_CHARS))
    lines = ["".join(row) for row in chars[work]]
    legend = "legend: '#' full (no mask)  'x' partial (elementwise mask)  'p' partial only through key padding  '.' empty"
    rows = f"rows: {nq} query tiles of {plan.block_q}" + (f", {row_group} per line" if row_group > 1 else "")
    cols = f"columns: {nk} key tiles of {plan.block_kv}" + (f", {col_group} per character" if col_group > 1 else "")
    scale = f"{rows}; {cols}"
    if row_group > 1 or col_group > 1:
        scale += " (downsampled: each character shows the most work in its group, x > p > # > .)"
    return "\n".join(lines + [legend, scale])


# -- what B3's rounding changed -------------------------------------------------------------

# colours of the rounding diff: unchanged tiles keep their tile-class colours
ADDED_COLOR, DROPPED_COLOR = "#009e73", "#d55e00"


def rounding_diff(plan: TilePlan, aligned) -> dict:
    """Tile by tile, what rounding `plan`'s mask to `aligned` (a TileAlignedMask with the plan's
    block sizes) changed. Returns bool `[q_tiles, kv_tiles]` arrays "added" (boundary tiles kept
    whole: their unkept pairs are added) and "dropped" (boundary tiles dropped: their kept pairs
    are lost), and the pair totals "pairs_added" and "pairs_dropped" (real pairs, padding excluded)."""
    kept = getattr(aligned, "kept", None)
    if not isinstance(plan, TilePlan) or kept is None or np.shape(kept) != plan.grid:
        raise ValueError("rounding_diff needs the exact mask's TilePlan and the TileAlignedMask rounded at the same "
                         f"block sizes (mask.tile_aligned({plan.block_q if isinstance(plan, TilePlan) else 'bq'}, ...))")
    boundary = (plan.counts > 0) & (plan.counts < plan.areas)  # cut by the mask: rounding decides these
    added, dropped = boundary & kept, boundary & ~kept
    return {"added": added, "dropped": dropped,
            "pairs_added": int((plan.areas - plan.counts)[added].sum()), "pairs_dropped": int(plan.counts[dropped].sum())}


def plot_rounding_diff(plan: TilePlan, aligned, ax=None, title: str | None = None, show_mask: bool = True):
    """Tile map of what B3's rounding changed; returns the Figure.

    `plan`: the exact mask's plan; `aligned`: that mask rounded to the same tiles (`b3_mask`).
    Boundary tiles kept whole (pairs added) and dropped (pairs lost) get their own colours;
    tiles rounding left alone keep the tile-class colours (full, empty). From the plans' pair
    counts only: no `N x N` array, so the blog's size is fine.
    """
    from matplotlib.patches import Patch

    diff = rounding_diff(plan, aligned)
    fig, ax = _new_axes(ax, figsize=(9.6, 5.2))
    kinds = np.where(diff["added"], 1, np.where(diff["dropped"], 2, 0))
    unchanged = np.where(plan.classes == EMPTY, TILE_COLORS[EMPTY], TILE_COLORS[FULL])
    colors = np.where(kinds == 1, ADDED_COLOR, np.where(kinds == 2, DROPPED_COLOR, unchanged)).ravel().tolist()
    visited = np.asarray(aligned.kept, bool)
    padded = _draw_tiles(ax, plan, colors, visited, show_mask)
    nq, nk = plan.grid
    labels = [(TILE_COLORS[FULL], f"kept, unchanged: {int((visited & ~diff['added']).sum())}"),
              (ADDED_COLOR, f"kept whole (pairs added): {int(diff['added'].sum())}, +{diff['pairs_added']:,} pairs"),
              (DROPPED_COLOR, f"dropped (pairs lost): {int(diff['dropped'].sum())}, -{diff['pairs_dropped']:,} pairs"),
              (TILE_COLORS[EMPTY], f"empty, unchanged: {int((~visited & ~diff['dropped']).sum())}")]
    handles = [Patch(facecolor=c, edgecolor="#555555", linewidth=0.5, label=text) for c, text in labels]
    if padded.size:
        handles.append(Patch(facecolor="none", edgecolor="#333333", hatch="////", label="kept, reaches into padding"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False,
              title=f"{nq} x {nk} tiles in this map", title_fontsize="small")
    ax.set_title(title if title is not None else
                 f"what rounding to {plan.block_q} x {plan.block_kv} tiles changed (analytic plans)")
    return fig


# -- one query's keys, frame by frame -----------------------------------------------------------

def plot_query_frames(masks: dict, geometry, query: int, max_frames: int | None = None, per_row: int = 7):
    """The keys one query keeps, drawn frame by frame: each mask's frames in rows of `per_row`, one
    block of rows per mask, one above the other; returns the Figure.

    masks: {label: Mask} in frame-major coordinates (e.g. a spatial and a temporal head's);
    geometry: their VideoGeometry (frames x height x width video tokens, text tokens not drawn);
    query: the query token's frame-major index, marked in its own frame. Each frame is
    `height x width` keys, black where the query keeps the key, titled with its number; each block is
    titled with its mask's label and how many keys it keeps.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    F, H, W, S = geometry.frames, geometry.height, geometry.width, geometry.frame_tokens
    if not masks or not all(isinstance(m, Mask) and m.tokens == geometry.tokens for m in masks.values()):
        raise ValueError(f"masks must map labels to svg_lib Masks over this geometry's {geometry.tokens:,} tokens")
    if isinstance(query, bool) or not isinstance(query, (int, np.integer)) or not 0 <= query < F * S:
        raise ValueError(f"query must be a video token's frame-major index in [0, {F * S:,}), got {query!r}")
    if isinstance(per_row, bool) or not isinstance(per_row, (int, np.integer)) or per_row < 1:
        raise ValueError(f"per_row must be a positive int (frames drawn side by side), got {per_row!r}")
    frames = F if max_frames is None else min(F, int(max_frames))
    cols = min(int(per_row), frames)
    rows_each = -(-frames // cols)
    q_frame, q_slot = divmod(int(query), S)
    keys = np.arange(F * S)
    cmap = plt.get_cmap("Greys")
    fig = plt.figure(figsize=(1.5 * cols + 0.4, len(masks) * (rows_each * 1.5 * H / W + 0.75) + 0.7),
                     layout="constrained")
    blocks = fig.subfigures(len(masks), 1, squeeze=False)[:, 0]
    for block, (label, mask) in zip(blocks, masks.items()):
        kept = np.asarray(mask.keep(int(query), keys), bool).reshape(F, H, W)
        axes = block.subplots(rows_each, cols, squeeze=False).ravel()
        for f, ax in enumerate(axes):
            ax.set_xticks([])
            ax.set_yticks([])
            if f >= frames:
                ax.set_axis_off()
                continue
            ax.imshow(kept[f], cmap=cmap, vmin=0, vmax=1, interpolation="nearest", aspect="equal")
            ax.set_title(f"frame {f}", fontsize="small", pad=2)
            if f == q_frame:
                ax.plot(q_slot % W, q_slot // W, marker="o", color="#d55e00", markersize=5, markeredgecolor="white")
        block.suptitle(f"{label}: {int(kept[:frames].sum()):,} keys kept", fontsize="medium", x=0.01, ha="left")
    handles = [Patch(facecolor=cmap(1.0), edgecolor="#555555", label="key kept"),
               Patch(facecolor=cmap(0.0), edgecolor="#555555", label="key not kept"),
               Line2D([], [], marker="o", color="#d55e00", linestyle="none", label=f"the query (frame {q_frame})")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize="small", frameon=False)
    fig.suptitle(f"keys kept by query {int(query):,}, frame by frame (each frame {H} x {W} tokens)",
                 fontsize="large")
    return fig


# -- the per-tile cost lesson -----------------------------------------------------------------------
