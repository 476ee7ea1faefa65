"""Interactive explorers for notebooks: move a slider, watch the tile plan change.

    from svg_lib import mask_explorer
    explorer = mask_explorer()   # the last expression of a cell: the widget shows itself
    explorer.block_q.value = 256 # or drive it from code: the plan and the picture follow
    explorer.plan.stats          # the plan now shown
    explorer.head_kind.value = "sliding tiles"   # 3-D sliding tiles: cube and window sliders appear

Built from core ipywidgets only (sliders, toggle buttons, HTML, Image, Button), so it works
in JupyterLab, classic notebooks, VS Code and Colab. ipywidgets is imported when an explorer
is built, not when svg_lib is imported. Nothing here needs anyone to touch a widget: the
explorer draws its first state when it is built, so notebooks still run top to bottom.

For browser tests every control has a stable `description` and a CSS class (`svg-...`, see
`CSS_CLASSES`); the tile map is an `<img>` inside the element of class `svg-tile-map`.
"""
from __future__ import annotations

import functools
import html
import io

from svg_lib.attention import b3_mask
from svg_lib.chips import clock_hz
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import BRUTE_FORCE_LIMIT_TOKENS, LANES, Mask, check_block_size
from svg_lib.core.svg_masks import SVGMask
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.core.planner import plan_tiles
from svg_lib.memory.smem import schedule_smem
from svg_lib.memory.vmem import MiB, estimate_vmem
from svg_lib.methods import PLANNED_METHODS, MethodPlans, method_plans
from svg_lib.problem import PALLAS_METHODS, BenchConfig
from svg_lib.runtime import detect_runtime
from svg_lib.teaching.plots import plot_mask, plot_tile_map
from svg_lib.instruments.tools.bench import run_benchmark
from svg_lib.instruments.tpu.cost import model_cycles
from svg_lib.instruments.tpu.interpolate import extrapolated, fit_costs, interpolated_cost

# The CSS class of each part, by attribute name on the explorer: what a browser test looks for.
CSS_CLASSES = {
    "frames": "svg-frames", "height": "svg-height", "width": "svg-width", "density": "svg-density",
    "block_q": "svg-block-q", "block_kv": "svg-block-kv", "head_kind": "svg-head-kind",
    "stats": "svg-stats", "tile_map": "svg-tile-map", "note": "svg-note", "methods": "svg-methods",
    "run_button": "svg-run", "run_output": "svg-run-output",
    "cube_frames": "svg-cube-frames", "cube_rows": "svg-cube-rows", "cube_cols": "svg-cube-cols",
    "window_frames": "svg-window-frames", "window_rows": "svg-window-rows", "window_cols": "svg-window-cols",
    "sliding_controls": "svg-sliding-controls",
}
HEAD_KINDS = ("spatial", "temporal", "sliding tiles")
EXPLORER_CLASS = "svg-explorer"
RUN_LIMIT_TOKENS = 20_000   # "Run and time" off a TPU: interpret mode beyond this takes minutes per method
DRAW_LIMIT_TILES = 20_000   # more tiles than this make a picture too slow to redraw live
FRAME_MAJOR_LIMIT_TOKENS = 8_192  # the temporal head's frame-major plan counts pair by pair: ~1.5 s here
DEFAULT_GEOMETRY = VideoGeometry(6, 8, 16)  # 768 tokens: 6 x 6 tiles of 128, all three tile classes
# Sliding tiles on DEFAULT_GEOMETRY: 2 x 4 x 16 cubes are 128 tokens (one tile of 128, no padding),
# 3 x 2 x 1 of them; a window of 3 frames of cubes keeps half the pairs, in whole tiles.
DEFAULT_CUBE, DEFAULT_WINDOW = (2, 4, 16), (3, 1, 1)
PRICE_CHIPS = ("v5e", "v6e")   # the chips whose static profile was committed (svg_lib/data/cost_reference.json)


def tile_prices(plans, *, heads: int = 1, head_dim: int = 128, dtype: str = "bfloat16",
                chips=PRICE_CHIPS) -> dict:
    """What a tile size costs on each chip, from the plans alone (no N x N array): B1-B3's VMEM with its
    fit verdict, the packed schedule's SMEM, and each of B1, B2, B3's predicted milliseconds (`heads`
    heads), a simulation: the committed static profile where these tiles were probed, elsewhere its
    interpolation across the probed sizes (`svg_lib.instruments.tpu.interpolate`), whose largest miss on the
    probed sizes is `fit_error`. `plans`: a `MethodPlans` (without a tile-aligned plan, or one TilePlan,
    the mask's: B3 is not priced)."""
    plans = method_plans(plans)
    plan = plans.grid_plan
    bq, bkv = plan.block_q, plan.block_kv
    out = {"vmem": {}, "smem": schedule_smem(heads, plan.grid[0], plan.steps, chips[-1]), "ms": {}, "source": {},
           "fit_error": {}, "dtype": dtype}
    methods = ("b1", "b2") + (("b3",) if plans.tile_aligned is not None else ())
    for chip in chips:
        out["vmem"][chip] = estimate_vmem("b2", bq, bkv, head_dim, dtype, generation=chip)
        cost = interpolated_cost(chip, bq, bkv)
        fit = fit_costs(chip)
        probed = (bq, bkv) in fit.probed
        out["source"][chip] = ("probed" if probed else "extrapolated" if extrapolated(chip, bq, bkv)
                               else "interpolated")
        out.setdefault("probed_sizes", {})[chip] = len(fit.probed)
        out["fit_error"][chip] = 0.0 if probed else max(fit.fit_error[("svg_lib", k)]
                                                         for k in ("free", "svg_masked", "rows"))
        for m in methods:
            out["ms"].setdefault(m, {})[chip] = model_cycles(m, cost, plans, heads) / clock_hz(chip) * 1e3
    return out


def price_facts(prices: dict) -> list:
    """`tile_prices` as (label, text) rows for the explorer's table."""
    vmem = ", ".join(f"{chip} {e.total / MiB:.1f} of {e.budget / MiB:.0f} MiB {'fits' if e.fits else 'DOES NOT FIT'}"
                     for chip, e in prices["vmem"].items())
    how = "; ".join(f"{chip} {src}" + ("" if src == "probed" else
                                       f" from {prices['probed_sizes'][chip]} probed tile sizes "
                                       + ("(a line through both)" if prices['probed_sizes'][chip] == 2 else
                                          f"(the fit misses them by up to {prices['fit_error'][chip]:.1%})")) for chip, src in prices["source"].items())
    if any("extrapolated" in src for src in prices["source"].values()):
        how += ("; outside the probed sizes each body's cost is extrapolated on its own, so two methods' order "
                "there can be wrong (B2 slower than B1, say): compare methods at probed sizes")
    return [(f"VMEM (B1-B3, {prices['dtype']})", vmem), ("SMEM (schedule)", f"{prices['smem'].total / 1024:.1f} KiB"),
            ("predicted ms", "a simulation (the compiler's static profile, clock assumed), not a measurement: " + how)]


def _png(fig, dpi=80) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)  # or the inline backend would draw it a second time under the widget
    return buffer.getvalue()


class _SampledView(Mask):
    """`mask` with pair counting switched off, so plots sample it instead of walking every pair."""

    def __init__(self, mask: Mask):
        self.base, self.tokens = mask, mask.tokens

    def keep(self, q, k):
        return self.base.keep(q, k)

    def pair_counts(self, q_edges, k_edges):
        raise ValueError("sampled view: no exact pair counts")


def _stats_html(rows, facts, extra_cols=()) -> str:
    """A small HTML table: facts (label, value) on top, then one row per method."""
    span = 3 + len(extra_cols)
    head = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td colspan='{span}'>{html.escape(v)}</td>"
                   "</tr>" for k, v in facts)
    cols = ("<tr><th>method</th><th>tiles visited</th><th>tiles masked</th><th>grid steps</th>"
            + "".join(f"<th>{html.escape(c)}</th>" for c in extra_cols) + "</tr>")
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='svg-stats-table'>{head}{cols}{body}</table>"


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as widgets

    class MaskExplorer(widgets.VBox):
        """The explorer widget; see `mask_explorer`. Attributes are the controls and the state."""

        def __init__(self, geometry, density, block_q, block_kv, head_kind, methods, heads, head_dim, dtype,
                     cube, window, kernels=None):
            g = geometry
            self.kernels = dict(kernels or {})   # method -> builder(config) -> f(q, k, v): the learner's kernels
            self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
            slider = dict(continuous_update=False, style={"description_width": "initial"})
            self.frames = widgets.IntSlider(value=g.frames, min=1, max=max(32, g.frames), description="frames",
                                            **slider)
            self.height = widgets.IntSlider(value=g.height, min=1, max=max(64, g.height), description="height",
                                            **slider)
            self.width = widgets.IntSlider(value=g.width, min=1, max=max(96, g.width), description="width",
                                           **slider)
            self.density = widgets.FloatSlider(value=density, min=0.05, max=1.0, step=0.05, description="density",
                                               readout_format=".2f", **slider)
            self.block_q = widgets.IntSlider(value=block_q, min=LANES, max=max(4096, block_q), step=LANES,
                                             description="block_q", **slider)
            self.block_kv = widgets.IntSlider(value=block_kv, min=LANES, max=max(4096, block_kv), step=LANES,
                                              description="block_kv", **slider)
            self.head_kind = widgets.ToggleButtons(options=list(HEAD_KINDS), value=head_kind,
                                                   description="head kind", style={"description_width": "initial"})
            # sliding tiles: the cube (tokens per dimension) and the window (cubes per dimension, odd)
            dims = {"frames": g.frames, "rows": g.height, "cols": g.width}
            for (name, size), c, w in zip(dims.items(), cube, window):
                setattr(self, f"cube_{name}", widgets.IntSlider(value=c, min=1, max=max(size, c),
                                                                description=f"cube {name}", **slider))
                setattr(self, f"window_{name}", widgets.IntSlider(value=w, min=1, max=max(-(-size // c) | 1, w),
                                                                  step=2, description=f"window {name}", **slider))
            self.cube_controls = [self.cube_frames, self.cube_rows, self.cube_cols]
            self.window_controls = [self.window_frames, self.window_rows, self.window_cols]
            self.sliding_controls = widgets.VBox([widgets.HBox(self.cube_controls), widgets.HBox(self.window_controls)])
            self.stats = widgets.HTML(description="")
            self.note = widgets.HTML(description="")
            self.tile_map = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
            self.methods = widgets.SelectMultiple(options=list(PALLAS_METHODS), value=methods,
                                                  description="methods", rows=6)
            self.run_button = widgets.Button(description="Run and time", button_style="primary",
                                             tooltip="time the chosen methods on this device at this geometry")
            self.run_output = widgets.HTML(description="")
            for name, css in CSS_CLASSES.items():
                getattr(self, name).add_class(css)

            self.plan = None          # TilePlan of what the kernels run (temporal: the band, after permuting;
            #                           sliding tiles: the window over tile-major tokens, padding included)
            self.frame_major_plan = None  # temporal only: the plan of the frame-major mask, when small enough
            self.mask = None          # the mask shown: SVGMask, TemporalMask or SlidingTileMask
            self.error = None         # the last input the library refused, as text
            self.figure = None        # the last Figure drawn (closed; kept for tests and savefig)
            self.last_result = None   # BenchResult of the last "Run and time"
            self.your_ms = {}         # method -> median ms of the learner's kernel (`kernels`) in the last run
            self.updates = 0          # how many times update() redrew

            controls = [self.frames, self.height, self.width, self.density, self.block_q, self.block_kv,
                        self.head_kind, *self.cube_controls, *self.window_controls]
            run_row = widgets.HBox([self.methods, self.run_button])
            super().__init__([widgets.HBox(controls[:3]), widgets.HBox(controls[3:6]), self.head_kind,
                              self.sliding_controls, self.note, self.tile_map, self.stats, run_row, self.run_output])
            self.add_class(EXPLORER_CLASS)
            for control in controls:
                control.observe(self._on_change, names="value")
            self.run_button.on_click(self._on_click)
            self.update()

        # -- state ---------------------------------------------------------------------
        @property
        def geometry(self) -> VideoGeometry:
            return VideoGeometry(self.frames.value, self.height.value, self.width.value)

        @property
        def cube(self) -> tuple:
            """The sliding-tile cube (frames, rows, cols) the sliders show."""
            return tuple(c.value for c in self.cube_controls)

        @property
        def window(self) -> tuple:
            """The sliding-tile window in cubes (frames, rows, cols) the sliders show."""
            return tuple(w.value for w in self.window_controls)

        def _on_change(self, change):
            self.update()

        def _fit_sliding_sliders(self, g):
            # A cube reaches at most the whole dimension; a window of the cubes there (rounded up to
            # odd) already covers it. Ranges only grow past a value set from code: shrinking one below
            # its value would move the value and redraw a second time.
            for size, cube, window in zip((g.frames, g.height, g.width), self.cube_controls, self.window_controls):
                cube.max = max(size, cube.value, 1)
                window.max = max(-(-size // cube.value) | 1, window.value)

        def _sliding_note(self, bq, bkv) -> str:
            mask, layout = self.mask, self.mask.layout
            text = (f"Sliding tiles: tokens in tile-major order ({layout}); each query cube keeps the "
                    f"{' x '.join(map(str, mask.window))} cubes around it, shifted inside at the edges. ")
            if mask.aligned(bq, bkv):
                return text + (f"The blocks divide the {layout.cube_tokens}-token cube, so every tile is kept or "
                               "skipped whole: only tiles holding padding keys mask.")
            return text + (f"{bq} x {bkv} blocks do not divide the {layout.cube_tokens}-token cube, so windows cut "
                           "through tiles; blocks that divide it make every tile full or empty.")

        def update(self):
            """Recompute the mask and plan from the controls and redraw the tile map and statistics."""
            self.updates += 1
            g, kind = self.geometry, self.head_kind.value
            bq, bkv = self.block_q.value, self.block_kv.value
            # block sliders reach one tile covering every token, so their range follows the problem
            whole = -(-g.tokens // LANES) * LANES
            self.block_q.max = max(whole, bq, LANES)
            self.block_kv.max = max(whole, bkv, LANES)
            sliding = kind == "sliding tiles"
            self.sliding_controls.layout.display = None if sliding else "none"
            self.density.disabled = sliding  # the window's cubes set the budget, not the density
            try:
                if sliding:
                    self._fit_sliding_sliders(g)
                    spatial = None
                    self.mask = SlidingTileMask(g, self.cube, self.window)
                else:
                    spatial = SVGMask.spatial(g, float(self.density.value))
            except ValueError as err:
                self.error = str(err)
                self.note.value = f"<b>cannot build this mask:</b> {html.escape(str(err))}"
                return
            self.error = None
            self.frame_major_plan = None
            notes = []
            if sliding:
                self.plan = plan_tiles(self.mask, bq, bkv)
                notes.append(self._sliding_note(bq, bkv))
                self._draw(notes)
                self.stats.value = self._stats_value()
                self.note.value = " ".join(html.escape(n) for n in notes)
                return
            self.mask = spatial if kind == "spatial" else SVGMask.temporal(g, float(self.density.value))
            self.plan = plan_tiles(spatial, bq, bkv)  # temporal: the band the kernels see after permuting
            if kind == "temporal":
                notes.append("Temporal head: left, its mask in frame-major order (strided diagonals); right, the "
                             "plan the kernels use, on tokens permuted to temporal-major order, where the mask is "
                             "the same band as a spatial head's.")
                if g.tokens <= FRAME_MAJOR_LIMIT_TOKENS:
                    self.frame_major_plan = plan_tiles(self.mask, bq, bkv)
                else:
                    limit = min(FRAME_MAJOR_LIMIT_TOKENS, BRUTE_FORCE_LIMIT_TOKENS)
                    notes.append(f"The frame-major plan (masking inside the kernel) is counted pair by pair; "
                                 f"the explorer does that up to {limit:,} tokens (this is {g.tokens:,}).")
            self._draw(notes)
            self.stats.value = self._stats_value()
            self.note.value = " ".join(html.escape(n) for n in notes)

        def _draw(self, notes):
            import matplotlib.pyplot as plt

            s = self.plan.stats
            if s["tiles_total"] > DRAW_LIMIT_TILES:
                notes.append(f"{s['tiles_total']:,} tiles is too many to draw live (limit {DRAW_LIMIT_TILES:,}): "
                             "raise block_q or block_kv. The statistics below are up to date.")
                self.figure = None
                self.tile_map.value = b""
                return
            kind = self.head_kind.value
            if kind == "spatial":
                fig = plot_tile_map(self.plan)
            else:
                fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.0), layout="constrained")
                if kind == "temporal":
                    view, order, left_title = self.mask, "temporal-major", "temporal head, frame-major order"
                else:  # the window over the video's own (frame-major) tokens, padding gone
                    view, order, left_title = self.mask.frame_major(), "tile-major", "sliding window, frame-major order"
                shown = view if view.tokens <= FRAME_MAJOR_LIMIT_TOKENS else _SampledView(view)
                plot_mask(shown, ax=left, resolution=256, title=left_title)
                plot_tile_map(self.plan, ax=right,
                              title=f"plan after permuting to {order} order (analytic)\n"
                                    f"{s['tiles_visited']}/{s['tiles_total']} visited, {s['tiles_masked']} masked")
            self.figure = fig
            self.tile_map.value = _png(fig)

        def _stats_value(self) -> str:
            s = self.plan.stats
            g = self.geometry
            tiles = ("tiles", f"{s['q_tiles']} x {s['kv_tiles']} = {s['tiles_total']:,} of "
                              f"{self.plan.block_q} x {self.plan.block_kv}")
            if self.head_kind.value == "sliding tiles":
                layout = self.mask.layout
                facts = [("tokens", f"{s['tokens']:,} tile-major ({g}, + {layout.padding_tokens:,} padding, "
                                    f"{layout.padding_overhead:.2%})"),
                         tiles,
                         ("cubes", f"{' x '.join(map(str, layout.tile))} = {layout.cube_tokens:,} tokens, "
                                   f"{' x '.join(map(str, layout.cubes))} of them"),
                         ("window", f"{' x '.join(map(str, self.mask.window))} cubes"),
                         ("pair density", f"{self.mask.pair_density:.4f} of the real pairs")]
            else:
                facts = [("tokens", f"{s['tokens']:,} ({g})"), tiles,
                         ("band width", f"{s['band_width']:,}"),
                         ("pair density", f"{s['pair_density']:.4f} (asked {self.density.value:.2f})")]
            if s["b3_tiles_visited"] is None:
                facts.append(("B3", s["b3_refused"]))
                b3_row = ("B3 aligned", "refused", "-", "-")
            else:
                facts.append(("B3 budget error", f"{s['b3_budget_error']:+.3%} of the exact pairs"))
                b3_row = ("B3 aligned", f"{s['b3_tiles_visited']:,}", f"{s['b3_tiles_masked']:,}", self._b3_steps())
            rows = [("B1 naive", f"{s['tiles_visited']:,}", f"{s['tiles_visited']:,}", f"{s['grid_steps']:,}"),
                    ("B2 full/edge", f"{s['tiles_visited']:,}", f"{s['tiles_masked']:,}", f"{s['grid_steps']:,}"),
                    b3_row]
            plans = MethodPlans(self.plan, None if s["b3_tiles_visited"] is None else self._b3_plan())
            self.prices = tile_prices(plans, heads=self.heads, head_dim=self.head_dim, dtype=self.dtype or "bfloat16")
            facts += price_facts(self.prices)
            chips = list(self.prices["vmem"])
            rows = [row + tuple(f"{self.prices['ms'][m][c]:.3f}" if m in self.prices["ms"] else "-" for c in chips)
                    for row, m in zip(rows, PLANNED_METHODS)]
            if self.frame_major_plan is not None:
                fm = self.frame_major_plan
                rows.append(("B2 frame-major (in-kernel)", f"{int(fm.visited.sum()):,}",
                             f"{int(fm.needs_mask.sum()):,}", f"{fm.grid[0] * fm.steps:,}") + ("-",) * len(chips))
            return _stats_html(rows, facts, [f"{c} ms (simulated)" for c in chips])

        def _b3_plan(self):
            p = self.plan
            return plan_tiles(b3_mask(p.mask, p.block_q, p.block_kv), p.block_q, p.block_kv)

        def _b3_steps(self) -> str:
            b3 = self._b3_plan()
            return f"{b3.grid[0] * b3.steps:,}"

        # -- running the kernels ---------------------------------------------------------
        def _on_click(self, button):
            self.run_and_time()

        def run_and_time(self, repeats: int = 2):
            """Time the selected methods at the explorer's geometry and blocks; shows and returns the BenchResult.

            The kernels run on the spatial mask: a temporal head runs the very same band after its
            tokens are permuted, so its kernel time is the same (the permutation is not timed).
            Returns None (with a note in the output) when nothing can run.
            """
            methods = tuple(self.methods.value)
            if not methods:
                self.run_output.value = "<i>choose at least one method above</i>"
                return None
            if self.error is not None:
                self.run_output.value = f"<i>fix the mask first: {html.escape(self.error)}</i>"
                return None
            if self.head_kind.value == "sliding tiles":
                # the benchmark runs the SVG band on frame-major tokens; a window runs on tile-major ones
                self.run_output.value = ("<i>Run and time covers the SVG band (spatial and temporal heads). Time a "
                                         "sliding window with attention(to_tile_major(q, geometry, cube), ..., "
                                         "explorer.mask, method='b3'), as notebook 10 does.</i>")
                return None
            runtime = detect_runtime()
            g = self.geometry
            if not runtime.compiled and g.tokens > RUN_LIMIT_TOKENS:
                self.run_output.value = (f"<i>{g.tokens:,} tokens is more than interpret mode on {runtime.platform} "
                                         f"can time in reasonable time here (limit {RUN_LIMIT_TOKENS:,}); "
                                         "make the video smaller, or run on a TPU.</i>")
                return None
            dtype = self.dtype or ("bfloat16" if runtime.compiled else "float32")
            config = BenchConfig(g, self.heads, self.head_dim, float(self.density.value), self.block_q.value,
                                 self.block_kv.value, dtype=dtype)
            self.run_button.disabled = True
            self.run_output.value = f"<i>running {', '.join(methods)} ...</i>"
            yours = [m for m in methods if m in self.kernels]
            try:
                result = run_benchmark(config, methods, repeats=repeats, warmup=1)
                self.your_ms = {m: _time_kernel(self.kernels[m](config), config, repeats) for m in yours}
            except ValueError as err:  # e.g. a tile configuration that overflows VMEM
                self.run_output.value = f"<b>could not run:</b> {html.escape(str(err))}"
                return None
            finally:
                self.run_button.disabled = False
            extra = "".join(f"\nyour {m}: median {ms:.2f} ms over {repeats} calls (the table's {m} is svg_lib's)"
                            for m, ms in self.your_ms.items())
            if self.head_kind.value == "temporal":
                extra += "\n(temporal head: timed on the band its permuted tokens see; the permutation is not timed)"
            self.last_result = result
            self.run_output.value = f"<pre>{html.escape(result.table() + extra)}</pre>"
            return result

    return MaskExplorer


def _time_kernel(fn, config, repeats: int) -> float:
    """Median ms of `fn(q, k, v)` on `config`'s standard-normal inputs, after one untimed call."""
    import time

    import jax
    import numpy as np

    q, k, v = (jax.random.normal(key, config.shape, config.dtype) for key in jax.random.split(jax.random.key(0), 3))
    jax.block_until_ready(fn(q, k, v))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(q, k, v))
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def mask_explorer(geometry: VideoGeometry | None = None, density: float = 0.35, block_q: int = 128,
                  block_kv: int = 128, head_kind: str = "spatial", methods=PLANNED_METHODS, heads: int = 1,
                  head_dim: int = 128, dtype: str | None = None, cube=DEFAULT_CUBE, window=DEFAULT_WINDOW,
                  kernels: dict | None = None):
    """A widget to explore a mask's tile plan: sliders for frames, height, width, density,
    block_q, block_kv (steps of 128) and a spatial / temporal / sliding tiles toggle.

    "sliding tiles" shows `SlidingTileMask(geometry, cube, window)` (notebook 10) with sliders for
    the cube (tokens per dimension) and the window (odd, cubes per dimension): its window in
    frame-major order beside its plan over tile-major tokens (padding included).

    It shows the tile map (`plot_tile_map`; for a temporal head also its frame-major mask) and a
    table of tiles visited and masked by B1, B2, B3, the pair density and B3's budget error,
    redrawn on every change. "Run and time" times the selected `methods` on this device with
    `run_benchmark` (`heads` x tokens x `head_dim`; dtype None: bfloat16 on a TPU, float32 in
    interpret mode), refusing more than RUN_LIMIT_TOKENS tokens off a TPU. `kernels` ({method:
    builder}, e.g. notebook 06's B3 on the learner's rounding): each selected method found there is
    also timed as `builder(config)(q, k, v)` and shown as "your <method>". Beside the counts: VMEM per
    chip with its fit, SMEM and the simulated time on a v5e and a v6e (`tile_prices`).

    Returns the widget (an ipywidgets VBox). Drive it from code: set `.frames.value` etc. (or
    call `.update()`), read `.plan`, `.mask`, `.stats.value`, `.tile_map.value` (PNG bytes),
    call `.run_and_time()`.
    """
    geometry = DEFAULT_GEOMETRY if geometry is None else geometry
    if not isinstance(geometry, VideoGeometry):
        raise TypeError(f"geometry must be a VideoGeometry (e.g. VideoGeometry(6, 8, 16)), "
                        f"got {type(geometry).__name__}")
    if geometry.text_tokens:
        raise ValueError("the explorer draws video-only geometries (text_tokens=0); "
                         f"got {geometry.text_tokens} text tokens")
    if head_kind not in HEAD_KINDS:
        raise ValueError(f"head_kind must be one of {', '.join(map(repr, HEAD_KINDS))}, got {head_kind!r}")
    sliding = SlidingTileMask(geometry, cube, window)  # a bad cube or window fails here, with its own message
    check_block_size("block_q", block_q)
    check_block_size("block_kv", block_kv)
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.05 <= density <= 1.0:
        raise ValueError(f"density must be a number in [0.05, 1] (the slider's range), got {density!r}")
    methods = (methods,) if isinstance(methods, str) else tuple(methods)
    bad = [m for m in methods if m not in PALLAS_METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(PALLAS_METHODS)}")
    kernels = dict(kernels or {})
    bad = [m for m, b in kernels.items() if m not in PALLAS_METHODS or not callable(b)]
    if bad:
        raise ValueError(f"kernels must map methods ({', '.join(PALLAS_METHODS)}) to a "
                         f"builder(config) -> f(q, k, v); check {bad}")
    return _explorer_class()(geometry, float(density), int(block_q), int(block_kv), head_kind, methods, heads,
                             head_dim, dtype, sliding.tile, sliding.window, kernels)
