"""Charts of what the stages cost: a model's bars against measured figures, and a benchmark's speedups.

The same conventions as `svg_lib.teaching.plots` (one colour per tile class, the Figure returned,
matplotlib imported inside the functions); these draw numbers, not tile maps.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.planner import FULL, PARTIAL
from svg_lib.methods import BASELINE
from svg_lib.teaching.plots import TILE_COLORS, _new_axes


def plot_stage_costs(counts: dict, costs, measured: dict | None = None, ax=None, title: str | None = None,
                     unit: str = "ms", measured_label: str = "measured"):
    """Per stage, a stacked bar of full tiles x a + masked tiles x b; returns the Figure.

    counts: {stage label: (full tiles, masked tiles)}, in bar order; costs: (a, b), the cost of one
    mask-free (full) tile and of one masked tile, in `unit`; measured: optional {stage label:
    latency in unit}, drawn as a black tick across that stage's bar, its value beside it, and named
    `measured_label` in the legend (say whose measurement it is).
    """
    fig, ax = _new_axes(ax, figsize=(7.2, 4.2))
    try:
        a, b = (float(c) for c in costs)
    except (TypeError, ValueError):
        raise ValueError(f"costs must be two numbers (a, b): a full tile's cost and a masked tile's, got {costs!r}") from None
    if not counts:
        raise ValueError("counts must map at least one stage label to (full tiles, masked tiles)")
    labels = list(counts)
    tiles = np.array([tuple(counts[s]) for s in labels], dtype=float)
    if tiles.ndim != 2 or tiles.shape[1] != 2 or (tiles < 0).any():
        raise ValueError(f"counts must map each stage to (full tiles, masked tiles), two counts >= 0, got {counts!r}")
    x = np.arange(len(labels))
    full, masked = tiles[:, 0] * a, tiles[:, 1] * b
    ax.bar(x, full, 0.6, color=TILE_COLORS[FULL], label=f"full tiles x a (a = {a:.4g} {unit})")
    ax.bar(x, masked, 0.6, bottom=full, color=TILE_COLORS[PARTIAL], label=f"masked tiles x b (b = {b:.4g} {unit})")
    top = full + masked
    for xi, f, m, t in zip(x, tiles[:, 0], tiles[:, 1], top):
        ax.text(xi, t / 2, f"{int(f)} full\n{int(m)} masked", ha="center", va="center", fontsize=7, color="white")
    if measured:
        unknown = set(measured) - set(labels)
        if unknown:
            raise ValueError(f"measured names stages not in counts: {sorted(unknown)}")
        mx = [x[labels.index(s)] for s in measured]
        my = [float(v) for v in measured.values()]
        ax.hlines(my, np.array(mx) - 0.38, np.array(mx) + 0.38, colors="black", linewidths=2.2,
                  label=f"{measured_label} ({unit})", gid="measured")
        for xi, yi in zip(mx, my):
            ax.annotate(f"{yi:.2f}", (xi + 0.38, yi), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=8)
        top = np.maximum(top, [float(measured.get(s, 0.0)) for s in labels])
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4 + (0.5 if measured else 0.0))  # room for the values beside the ticks
    ax.set_ylabel(unit)
    ax.set_ylim(0, top.max() * 1.3)
    ax.legend(loc="upper right", fontsize="small")
    ax.set_title(title if title is not None else "cost model: full tiles x a + masked tiles x b")
    return fig


def plot_speedups(result, ax=None):
    """Each device's speed-up over its own dense Splash (B0), method by method; returns the Figure.

    `result` is a `svg_lib.instruments.tools.bench.BenchResult`: this run's speed-ups (its `speedup` column) beside
    the case study's v6e ones, where it reports the method. Both are ratios to a B0 timed on the
    same device and problem, so bars of the two devices compare; their latencies would not.
    """
    fig, ax = _new_axes(ax, figsize=(8, 4.2))
    rows = list(result.rows)
    if BASELINE not in [r["method"] for r in rows]:
        raise ValueError(f"plot_speedups needs {BASELINE!r} (B0) among the benchmark's methods: speed-ups are over it")
    blog_b0 = next(r["blog_v6e_ms"] for r in rows if r["method"] == BASELINE)
    x = np.arange(len(rows))
    ours = np.array([r["speedup"] for r in rows], dtype=float)
    blog = [None if r["blog_v6e_ms"] is None or blog_b0 is None else blog_b0 / r["blog_v6e_ms"] for r in rows]
    mine = ax.bar(x - 0.2, ours, 0.4, color="#0072b2",
                  label=f"this run: {result.device}, {result.mode} mode, {result.config.geometry.tokens:,} tokens")
    ax.bar_label(mine, fmt="%.2fx", fontsize=8)
    bx = [xi + 0.2 for xi, v in zip(x, blog) if v is not None]
    theirs = ax.bar(bx, [v for v in blog if v is not None], 0.4, color="#e69f00",
                    label="the case study: TPU v6e, 75,600 tokens (its measurements)")
    ax.bar_label(theirs, fmt="%.2fx", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, [r["method"] for r in rows])
    ax.set_ylabel("speed-up over the same device's dense Splash (B0)")
    ax.set_ylim(0, max([*ours, *[v for v in blog if v is not None]]) * 1.3)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title("speed-up over each device's own B0 (higher is faster; 1 = as fast as B0)", fontsize=9)
    return fig
