"""The grid traversal of the block-sparse kernels: which key tile each grid step fetches, and when.

B1, B2 and B3 run on a grid `(heads, q_tiles, steps)`. Grid step `(h, i, s)` fetches key/value
tile `plan.kv_index[i, s]` (scalar-prefetched, read by the index map). The Pallas pipeline copies
a block in only when its block index differs from the previous grid step's, so:

* the first step of every query row usually fetches (its key tile differs from the one the
  previous row ended on) - but not always: a row may start on the very tile the row before
  ended on, and then that step issues no DMA;
* idle steps (rows with fewer visits than `steps`) come first in their row, on its first
  visited tile: that tile is copied while the row above computes its last tile, and the
  steps after it issue no DMA.

`grid_trace` derives the traversal from the planner's tables; `recorded_grid_trace` runs the
real kernel in the TPU interpreter with a grid-point recorder and returns what it visited,
so the two can be compared. `plot_traversal` draws the visit order over the tile map.

One head is shown (h = 0): every head repeats the same traversal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svg_lib.attention import build_attention
from svg_lib.methods import METHODS, PLANNED_METHODS, check_method
from svg_lib.core.planner import EMPTY, FULL, TilePlan, plan_tiles
from svg_lib.teaching.plots import _legend_handles, plot_tile_map

TRACE_METHODS = PLANNED_METHODS
STEP_KINDS = ("idle", "full", "partial")  # what a step computes: nothing, mask-free, masked
# A recorded run simulates TPU memory and DMAs for every grid step: keep it to toy sizes.
RECORD_LIMIT_STEPS = 256


@dataclass(frozen=True)
class GridStep:
    """One grid step of one head: query tile `i`, schedule slot `s`, the key tile it fetches."""

    order: int     # position in the traversal (0 = first step the kernel runs)
    i: int         # query tile (grid axis 1)
    s: int         # schedule slot (grid axis 2)
    kv_tile: int   # key/value tile the index map points at
    dma: bool      # whether the pipeline copies a new K/V block in for this step
    kind: str      # "idle" (no work), "full" (mask-free tile) or "partial" (elementwise mask)

    def key(self) -> tuple:
        """Everything but `order`: what two traces must agree on, step by step."""
        return (self.i, self.s, self.kv_tile, self.dma, self.kind)


class GridTrace(list):
    """A list of `GridStep`s in visit order, with the plan and method it came from."""

    def __init__(self, steps, plan: TilePlan, method: str, source: str):
        super().__init__(steps)
        self.plan = plan          # the plan the kernel runs (for b3, the plan of the tile-aligned mask)
        self.method = method
        self.source = source      # "schedule tables" or "interpreter recording"

    @property
    def row_order(self) -> list[int]:
        """Query tiles in the order their first steps appear."""
        seen = []
        for step in self:
            if not seen or seen[-1] != step.i:
                seen.append(step.i)
        return seen

    def counts(self) -> dict:
        """Steps, DMAs, DMA-free steps and steps of each kind (idle / full / partial)."""
        out = {"steps": len(self), "dma": sum(st.dma for st in self)}
        out["no_dma"] = out["steps"] - out["dma"]
        for kind in STEP_KINDS:
            out[kind] = sum(st.kind == kind for st in self)
        out["no_dma_idle"] = sum((not st.dma) and st.kind == "idle" for st in self)
        out["no_dma_work"] = out["no_dma"] - out["no_dma_idle"]  # work done on a block already resident
        return out

    def keys(self) -> list[tuple]:
        return [st.key() for st in self]


def _check_method(method: str) -> str:
    return check_method(method, TRACE_METHODS, what="method (a block-sparse kernel that follows a schedule)").name


def kernel_plan(plan: TilePlan, method: str) -> TilePlan:
    """The plan the kernel of `method` runs: `plan` itself for B1/B2, the plan of b3_mask for B3."""
    _check_method(method)
    if not isinstance(plan, TilePlan):
        raise TypeError(f"expected a TilePlan (from plan_tiles(mask, block_q, block_kv)), got {type(plan).__name__}")
    aligned = METHODS[method].computed_mask(plan.mask, plan.block_q, plan.block_kv)
    return plan if aligned is plan.mask else plan_tiles(aligned, plan.block_q, plan.block_kv)


def _step_kind(method: str, step_class: int) -> str:
    runs = METHODS[method].step_classes(step_class)  # B1 masks every visited tile, full or not
    if runs == EMPTY:
        return "idle"
    return "full" if runs == FULL else "partial"


def _trace_from_points(plan: TilePlan, method: str, points, source: str) -> GridTrace:
    """Steps for grid points `(i, s)` in the order given, DMAs by comparing consecutive block indices."""
    kv_index, step_class = plan.kv_index, plan.step_class
    steps, previous = [], None
    for order, (i, s) in enumerate(points):
        kv = int(kv_index[i, s])
        steps.append(GridStep(order, int(i), int(s), kv, previous is None or kv != previous,
                              _step_kind(method, int(step_class[i, s]))))
        previous = kv
    return GridTrace(steps, plan, method, source)


def grid_trace(plan: TilePlan, method: str, row_order=None) -> GridTrace:
    """The traversal of one head by the `method` kernel ("b1", "b2", "b3"), from the schedule tables.

    `plan` is the plan of the exact mask; for "b3" the plan of `b3_mask(mask, ...)` is used (as
    the kernel does). The grid runs query tiles in `row_order` (default 0, 1, 2, ...: what one
    TensorCore does) and, within a query tile, the schedule slots in order. A step issues a DMA
    when its key tile differs from the previous step's (the K and V blocks share the index map).
    """
    run = kernel_plan(plan, _check_method(method))
    nq, steps = run.kv_index.shape
    if row_order is None:
        row_order = range(nq)
    row_order = [int(i) for i in row_order]
    if sorted(row_order) != list(range(nq)):
        raise ValueError(f"row_order must list each of the {nq} query tiles once, got {row_order}")
    return _trace_from_points(run, method, [(i, s) for i in row_order for s in range(steps)], "schedule tables")


def recorded_grid_trace(plan: TilePlan, method: str, *, head_dim: int = 128, seed: int = 0,
                        random_seed: int | None = None) -> GridTrace:
    """Run the `method` kernel once in the TPU interpreter and return the grid steps it really visited.

    One head, float32 q, k, v `[1, tokens, head_dim]`. The interpreter
    (`pltpu.InterpretParams(grid_point_recorder=...)`) calls back at every grid point in the order
    it runs them. It visits the "parallel" grid axes (heads, query tiles) in a shuffled order
    (`random_seed` picks the shuffle) to catch kernels that depend on it, and the "arbitrary"
    axis (schedule slots) in order; compare with `grid_trace(plan, method, row_order=rec.row_order)`.
    The DMA flags are the pipeline's rule (copy when the block index changes) applied to the
    recorded order. Refuses more than RECORD_LIMIT_STEPS grid steps (the simulation is slow).
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu

    run = kernel_plan(plan, _check_method(method))
    nq, steps = run.kv_index.shape
    if nq * steps > RECORD_LIMIT_STEPS:
        raise ValueError(f"recording simulates every grid step; {nq} x {steps} = {nq * steps} steps is more than "
                         f"{RECORD_LIMIT_STEPS}: use a smaller mask or larger blocks (grid_trace needs no run)")
    points = []

    def record(*args):  # (token, grid_point, core_id); older jax (0.8.1) passes (grid_point, core_id), no token
        points.append(tuple(int(x) for x in np.asarray(args[-2])))
        if len(args) == 3:
            return np.asarray(args[0], dtype=np.int32)  # the interpreter threads this token through its callbacks
        return ()

    params = pltpu.InterpretParams(grid_point_recorder=record, random_seed=random_seed)
    tokens = plan.tokens
    fn = build_attention(plan.mask, method=method, heads=1, tokens=tokens, head_dim=head_dim, dtype=jnp.float32,
                         block_q=plan.block_q, block_kv=plan.block_kv, interpret=params)
    keys = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(key, (1, tokens, head_dim), jnp.float32) for key in keys)
    jax.block_until_ready(fn(q, k, v))
    if len(points) != nq * steps or any(len(p) != 3 or p[0] != 0 for p in points):
        raise RuntimeError(f"the interpreter recorded {len(points)} grid points, expected {nq * steps} "
                           f"of the grid (1, {nq}, {steps}): {points[:6]}...")
    return _trace_from_points(run, method, [(i, s) for _, i, s in points], "interpreter recording")


def plot_traversal(plan: TilePlan, method: str, ax=None, row_order=None, title: str | None = None):
    """The tile map of the `method` kernel with its visit order drawn on top; returns the Figure.

    Tiles are coloured by what the kernel does with them (B1 masks every visited tile; B3 is
    drawn on the tile-aligned mask's plan). A line joins the tile centres in visit order; each
    tile is labelled with the global numbers of the steps that land on it. Filled dots: the step
    copies a new K/V block in (DMA); hollow red rings: the block is already resident (no DMA,
    e.g. idle steps, or a row starting where the previous row ended).
    """
    import dataclasses

    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    trace = grid_trace(plan, method, row_order=row_order)
    run = trace.plan
    classes = METHODS[method].step_classes(run.classes)  # B1: every visited tile runs the elementwise mask
    shown = run if classes is run.classes else dataclasses.replace(run, classes=classes, _stats=None)
    if ax is None:
        nq, nk = run.grid
        fig, ax = plt.subplots(figsize=(min(7.0 + 0.9 * nk, 14.0), min(3.0 + 0.9 * nq, 10.0)), layout="constrained")
    else:
        fig = ax.figure
    c = trace.counts()
    if title is None:
        what = {"b1": "B1 (mask on every visited tile)", "b2": "B2 (mask on partial tiles)",
                "b3": "B3 (tile-aligned mask)"}[method]
        title = (f"{what}: {c['steps']} grid steps, {c['dma']} DMAs, {c['no_dma']} without DMA "
                 f"({c['idle']} idle)\nfrom the schedule tables (analytic)")
    plot_tile_map(shown, ax=ax, title=title, show_mask=False, legend=False)
    ax.title.set_fontsize(9)

    bq, bkv = run.block_q, run.block_kv
    xs = np.array([(st.kv_tile + 0.5) * bkv for st in trace], dtype=float)
    ys = np.array([(st.i + 0.5) * bq for st in trace], dtype=float)
    # a small per-step offset inside the tile, so that repeated visits of one tile stay apart
    slot = {}
    for n, st in enumerate(trace):
        k = slot.setdefault((st.i, st.kv_tile), [])
        k.append(n)
    for (i, j), members in slot.items():
        for r, n in enumerate(members):
            frac = (r + 1) / (len(members) + 1) - 0.5
            xs[n] += 0.5 * frac * bkv
    ax.plot(xs, ys, color="#222222", linewidth=1.0, zorder=4)
    for a in range(len(trace) - 1):  # arrow heads show the direction
        ax.annotate("", xy=(xs[a + 1], ys[a + 1]), xytext=(xs[a], ys[a]),
                    arrowprops=dict(arrowstyle="-|>", color="#222222", lw=0.8, shrinkA=4, shrinkB=4), zorder=4)
    dma = np.array([st.dma for st in trace])
    ax.scatter(xs[dma], ys[dma], s=60, color="#222222", zorder=5)
    ax.scatter(xs[~dma], ys[~dma], s=90, facecolors="white", edgecolors="#d55e00", linewidths=1.8, zorder=5)
    fontsize = 8 if len(trace) <= 64 else 6
    for n, st in enumerate(trace):
        ax.annotate(str(st.order), (xs[n], ys[n]), xytext=(0, 7), textcoords="offset points", ha="center",
                    fontsize=fontsize, color="#d55e00" if not st.dma else "#000000", zorder=6)
    handles = _legend_handles(padding=False)
    handles += [Line2D([], [], marker="o", linestyle="-", color="#222222", label="step: new K/V block (DMA)"),
                Line2D([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor="#d55e00",
                       markeredgewidth=1.8, label="step: block resident (no DMA)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    return fig
