"""The frontier: which mask reaches a given recall at the lowest predicted cost, per chip.

The library behind `python -m svg_lib frontier` (`cli/frontier.py`: its arguments) and notebook 13.

For each mask family and each tile size with committed probes (`svg_lib/data/cost_reference.json`:
512 x 256 and 3328 x 1536 on a v5e and a v6e), over a range of each family's knob:

* recall: the share of each planted head's dense softmax mass inside the pairs the kernel
  computes (`layers.synthetic.structured_qkv`: a spatial, a temporal and a local-3-D head at the
  case study's geometry, 21 x 45 x 80 = 75,600 tokens; head_dim 64; `--rows` sampled query rows),
  averaged over the three heads;
* computed density: the pairs of the tiles the kernel visits, over tokens^2;
* predicted time: the cost model (`tpu.cost.model_cycles`, method "b3": each grid step priced at
  the compiler's simulated cycles for its body kind, plus the per-row terms) for the case study's
  10 heads of head_dim 128, turned into milliseconds at the clock that makes the chip's MXUs reach
  its spec-sheet bf16 peak (`clock_hz`: 1.50 GHz for a v5e, 1.75 GHz for a v6e; an assumption).

The families: "svg_b3" (SVG's band with the first-frame sink, rounded to tiles by B3; each head
takes the better of its spatial and temporal form, as SVG's online profiling would), "radial"
(`extensions.radial.RadialMask`, Wan rules, knob: decay_factor; rounded to the tiles by B3), "sliding"
(`extensions.sliding.SlidingTileMask` in 512-token cubes of 2 x 16 x 16, tile-aligned at 512 x 256 only:
no 3-D cube is a multiple of 3,328 tokens; knob: the window) and "pooled" (`layers.pooled`,
top-k of mean-pooled tile scores; knob: density) and, with `--masks ...,semantic`, "semantic"
(`layers.semantic`: tile-sized k-means clusters, 2 iterations from a cold start, then the same
top-k by centroid score; knob: density; minutes of k-means on a CPU, so not in the default run).

Evidence: recall is computed on synthetic heads on this CPU; cycles are *simulated* by the TPU
compiler's static profile (compile-only, nothing ran); milliseconds follow from an assumed clock.
The calibration line sets the model's B0 and B3 on the case study's problem beside the blog's
measured v6e latencies; the model is never fitted to them.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from svg_lib.chips import MXUS_FOR_CLOCK, check_target, clock_hz
from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.planner import plan_tiles
from svg_lib.methods import MethodPlans
from svg_lib.extensions.radial import RadialMask
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.core.svg_masks import SVGMask
from svg_lib.layers.pooled import pooled_plan
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.semantic import plan_from_orders, plan_keep, semantic_plan, tile_budget
from svg_lib.layers.synthetic import KINDS, computed_mask, structured_qkv
from svg_lib.problem import BLOG_V6E_MS, get_preset
from svg_lib.progress import bar as progress_bar
from svg_lib.instruments.tpu.cost import EVIDENCE, load_reference, model_cycles

TILES = ((512, 256), (3328, 1536))
CHIPS = ("v5e", "v6e")
TARGET_RECALLS = (0.90, 0.95)
SLIDING_CUBE = (2, 16, 16)  # 512 tokens; 21 x 45 x 80 pads to 22 x 48 x 80 (11 x 3 x 5 cubes, 12 % padding)
KNOBS = {
    "svg_b3": (0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.85, 0.92),
    "radial": (0.1, 0.35, 1.0, 2.0, 4.0, 8.0, 16.0),
    "sliding": ((1, 3, 3), (3, 3, 3), (3, 3, 5), (5, 3, 5), (7, 3, 5), (9, 3, 5)),
    "pooled": (0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.85, 0.92),
    "semantic": (0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.85, 0.92),
}
MASKS = tuple(KNOBS)
DEFAULT_MASKS = ("svg_b3", "radial", "sliding", "pooled")  # semantic tiles' k-means adds minutes on a CPU
SEMANTIC_ITERATIONS = 2  # k-means iterations from a cold start (SVG2 runs 50 at its first sparse step)


# The clock that turns simulated cycles into time: chips.clock_hz (an assumption, printed with every table).


def probed_costs(chips=CHIPS, tiles=TILES) -> dict:
    """{(chip, block_q, block_kv): TileCost} from the committed reference ("after": the kernels as committed)."""
    after = load_reference()["groups"]["after"]
    missing = [(c, bq, bk) for c in chips for bq, bk in tiles if (c, bq, bk) not in after]
    if missing:
        raise ValueError(f"no committed probe for {missing}; probed: {sorted(after)}")
    return {(c, bq, bk): after[c, bq, bk] for c in chips for bq, bk in tiles}


def planted_heads(rows: int, seed: int = 0):
    """(geometry, softmax rows p float64 `[3, rows, tokens]`, query rows, q, k) of the three planted heads."""
    import jax
    import jax.numpy as jnp

    g = get_preset("blog").geometry
    q, k, _ = structured_qkv(g, list(KINDS), head_dim=64, seed=seed)
    r = sample_rows(g.tokens, rows, seed=seed)
    s = jnp.einsum("hrd,hkd->hrk", q[:, r], k, precision=jax.lax.Precision.HIGHEST) / np.sqrt(q.shape[-1])
    return g, np.asarray(jax.nn.softmax(s, axis=-1), np.float64), r, q, k


def _recall(p, keep):
    """float64 `[heads]`: softmax mass inside `keep` (bool `[rows, tokens]` or `[heads, rows, tokens]`)."""
    return (p * keep).sum(axis=-1).mean(axis=-1)


def _computed_density(plan, real_tokens):
    """Pairs of the visited tiles (padding included: the kernel computes it) over real tokens^2."""
    return float(plan.visited.sum()) * plan.block_q * plan.block_kv / float(real_tokens) ** 2


def _tile_plans(tiles, tokens, block_q, block_kv):
    """One B3 plan per head of a bool `[heads, nq, nk]` tile selection (what the device planner runs)."""
    return [plan_tiles(TileAlignedMask(tokens, block_q, block_kv, t), block_q, block_kv) for t in np.asarray(tiles)]


def mask_points(name, knob, g, p, rows, q, k, block_q, block_kv, cache=None):
    """One point of one family: (per-head recall `[3]`, per-head b3 plans, computed density), or None
    where the family has no point at these tiles. `cache`: a dict kept across calls (semantic tiles'
    clusters, which do not depend on the density)."""
    keys = np.arange(g.tokens)[None, :]
    if name == "svg_b3":
        mask = SVGMask.spatial(g, knob)
        rec = np.maximum(*[_recall(p, computed_mask(mask, kind, "b3", block_q, block_kv).keep(rows[:, None], keys))
                           for kind in ("spatial", "temporal")])
        plan = plan_tiles(mask.tile_aligned(block_q, block_kv), block_q, block_kv)  # temporal: same plan, permuted
        return rec, [plan] * p.shape[0], _computed_density(plan, g.tokens)
    if name == "radial":
        computed = RadialMask(g, "wan", knob).tile_aligned(block_q, block_kv)
        plan = plan_tiles(computed, block_q, block_kv)
        return _recall(p, computed.keep(rows[:, None], keys)), [plan] * p.shape[0], _computed_density(plan, g.tokens)
    if name == "sliding":
        mask = SlidingTileMask(g, SLIDING_CUBE, knob)
        if not mask.aligned(block_q, block_kv):
            return None
        plan = plan_tiles(mask, block_q, block_kv)
        rec = _recall(p, mask.frame_major().keep(rows[:, None], keys))
        return rec, [plan] * p.shape[0], _computed_density(plan, g.tokens)
    if name == "pooled":
        tiles = np.asarray(pooled_plan(q, k, block_q=block_q, block_kv=block_kv, density=knob).tiles)
        keep = tiles[:, rows // block_q][:, :, np.arange(g.tokens) // block_kv]
        plans = _tile_plans(tiles, g.tokens, block_q, block_kv)
        return _recall(p, keep), plans, float(np.mean([_computed_density(pl, g.tokens) for pl in plans]))
    if name == "semantic":
        import jax

        # the tiles are cut in cluster order: the kernel computes them on gathered q, k, v (the
        # gathers are not priced); recall maps them back to token order (`plan_keep`)
        cache = {} if cache is None else cache
        if ("semantic", block_q, block_kv) not in cache:
            first = jax.jit(functools.partial(semantic_plan, block_q=block_q, block_kv=block_kv, density=knob,
                                              iterations=SEMANTIC_ITERATIONS))(q, k)
            cache["semantic", block_q, block_kv] = (first.q_order, first.k_order)
        q_order, k_order = cache["semantic", block_q, block_kv]
        steps = tile_budget(knob, -(-g.tokens // block_kv))
        plan = plan_from_orders(q, k, q_order, k_order, block_q=block_q, block_kv=block_kv, steps=steps)
        plans = _tile_plans(plan.tiles, g.tokens, block_q, block_kv)
        rec = _recall(p, np.asarray(plan_keep(plan, rows)))
        return rec, plans, float(np.mean([_computed_density(pl, g.tokens) for pl in plans]))
    raise ValueError(f"unknown mask family {name!r}; known: {MASKS}")


def frontier(rows: int = 64, masks=DEFAULT_MASKS, chips=CHIPS, tiles=TILES, knobs=None, heads: int | None = None,
             bar: bool = False) -> dict:
    """Every (mask, tile size, knob) point with its recall, computed density and predicted ms per chip.

    Returns {"points": [...], "best": {chip: {mask: {target: point or None}}}, "calibration": {...},
    "dense_ms": {chip: ms}}. `knobs`: {mask: values} overriding `KNOBS` (a small grid for tests).
    `bar`: a progress bar naming the point being computed (`svg_lib.progress`: stderr, --quiet)."""
    blog = get_preset("blog")
    heads = heads or blog.heads
    costs = probed_costs(chips, tiles)
    g, p, r, q, k = planted_heads(rows)
    points, cache = [], {}
    shown = progress_bar(total=len(tiles) * sum(len((knobs or {}).get(n, KNOBS[n])) for n in masks), desc="frontier",
                         unit="point", show=bar)
    for name in masks:
        for block_q, block_kv in tiles:
            for knob in (knobs or {}).get(name, KNOBS[name]):
                shown.set_description(f"frontier: {name} at {block_q} x {block_kv}, knob {knob}")
                got = mask_points(name, knob, g, p, r, q, k, block_q, block_kv, cache)
                shown.update(1)
                if got is None:
                    continue
                recall, plans, density = got
                ms = {}
                for chip in chips:
                    cost, hz = costs[chip, block_q, block_kv], clock_hz(chip)
                    per_head = np.mean([model_cycles("b3", cost, MethodPlans(tile_aligned=pl)) for pl in plans])
                    ms[chip] = heads * per_head / hz * 1e3
                points.append(dict(mask=name, block_q=block_q, block_kv=block_kv,
                                   knob=list(knob) if isinstance(knob, tuple) else knob, density=density,
                                   recall=float(np.mean(recall)), recall_per_head=dict(zip(KINDS, map(float, recall))),
                                   ms=ms))
    shown.close()
    best = {chip: {name: {t: cheapest(points, chip, t, mask=name) for t in TARGET_RECALLS}
                   for name in masks} for chip in chips}
    out = dict(points=points, best=best, evidence=EVIDENCE, rows=int(r.size), geometry=str(g), heads=heads,
               clock_ghz={c: clock_hz(c) / 1e9 for c in chips})
    out["dense_ms"], out["calibration"] = _dense_and_calibration(costs, chips, tiles, heads)
    return out


def cheapest(points, chip: str, target: float, mask: str | None = None, tiles=None):
    """The point of `points` (optionally of one `mask` family and one `(block_q, block_kv)`) reaching
    mean recall `target` at the lowest predicted ms on `chip`; None where none reaches it."""
    ok = [pt for pt in points if pt["recall"] >= target and mask in (None, pt["mask"])
          and (tiles is None or (pt["block_q"], pt["block_kv"]) == tuple(tiles))]
    return min(ok, key=lambda pt: pt["ms"][chip], default=None)


def ms_per_all_pairs(points, chips=CHIPS, tiles=TILES) -> dict:
    """{(chip, (block_q, block_kv)): ms}: what computing every pair would cost at those tiles, read
    from the points (each point's ms over its computed density, the median over the points)."""
    return {(c, tuple(s)): float(np.median([pt["ms"][c] / pt["density"] for pt in points
                                            if (pt["block_q"], pt["block_kv"]) == tuple(s)]))
            for c in chips for s in tiles}


def matmul_cycles_per_pair(chips=CHIPS, tiles=TILES) -> dict:
    """{(chip, (block_q, block_kv)): cycles}: the committed probe of one grid step's two matmuls
    (q k^T and p v, our kernel's body) over the tile's pairs: what the MXUs charge a pair at that size."""
    costs = probed_costs(chips, tiles)
    return {(c, tuple(s)): costs[c, s[0], s[1]].per_step["svg_lib"]["matmuls"] / (s[0] * s[1])
            for c in chips for s in tiles}


def pareto_front(points, chip: str) -> list:
    """The points (of one family) drawn on the frontier: sorted by ms on `chip`, each recalling more
    than every cheaper one."""
    front, best = [], -1.0
    for pt in sorted(points, key=lambda pt: pt["ms"][chip]):
        if pt["recall"] > best:
            front.append(pt)
            best = pt["recall"]
    return front


def _every_tile(tokens, block_q, block_kv):
    """The plan that visits every tile (dense attention in the B3 kernel: only padded keys masked)."""
    kept = np.ones((-(-tokens // block_q), -(-tokens // block_kv)), dtype=bool)
    return plan_tiles(TileAlignedMask(tokens, block_q, block_kv, kept), block_q, block_kv)


def _dense_and_calibration(costs, chips, tiles, heads):
    """Dense attention's predicted ms per chip (our kernel on every tile, the cheapest probed tiles),
    and the model on the case study's problem beside the blog's measured v6e latencies: B0 priced as
    Splash's body on every tile (its block-mask body, which padded keys make it run, where probed;
    else its mask-free body, a lower bound), B2 and B3 from their plans."""
    blog = get_preset("blog")
    n = blog.geometry.tokens
    dense = {chip: min(heads * model_cycles("b3", costs[chip, bq, bk], MethodPlans(tile_aligned=_every_tile(n, bq, bk)))
                       / clock_hz(chip) * 1e3 for bq, bk in tiles) for chip in chips}
    calibration = {}
    bq, bk = blog.block_q, blog.block_kv
    if ("v6e", bq, bk) in costs:
        cost, hz = costs["v6e", bq, bk], clock_hz("v6e")
        every = _every_tile(n, bq, bk)
        padded = every.grid[1] * bk != n  # padded keys: B0 runs Splash's block-mask body where it was probed
        body = "blocks" if padded and "blocks" in cost.per_step["splash"] else "free"
        splash = every.classes.size * cost.per_step["splash"][body] + every.grid[0] * cost.per_row.get("splash", 0.0)
        plans = MethodPlans.of(blog.mask(), bq, bk)
        cycles = {"splash_dense": splash, "b2": model_cycles("b2", cost, plans), "b3": model_cycles("b3", cost, plans)}
        calibration = {m: dict(model_ms=blog.heads * c / hz * 1e3, blog_ms=BLOG_V6E_MS[m]) for m, c in cycles.items()}
        calibration["splash_dense"]["body"] = body
    return dense, calibration


def table(result: dict) -> str:
    chips = list(result["dense_ms"])
    lines = [f"frontier: planted heads (spatial, temporal, local3d) at {result['geometry']}, {result['rows']} sampled "
             f"query rows; predicted attention ms for {result['heads']} heads x head_dim 128, bf16",
             f"cycles {result['evidence']}; ms at an assumed clock (MXUs at the bf16 peak) "
             + ", ".join(f"{c} {hz:.2f} GHz" for c, hz in result["clock_ghz"].items()), ""]
    head = f"  {'mask':8} {'target':>6}" + "".join(f" | {c + ' ms':>8} {'tiles':>10} {'knob':>10} {'density':>7} "
                                                      f"{'recall':>6}" for c in chips)
    lines += ["cheapest point reaching each mean recall (per chip):", head]
    for name in result["best"][chips[0]]:
        for t in TARGET_RECALLS:
            cells = ""
            for c in chips:
                pt = result["best"][c][name][t]
                if pt is None:
                    cells += f" | {'-':>8} {'-':>10} {'-':>10} {'-':>7} {'-':>6}"
                else:
                    knob = pt["knob"] if not isinstance(pt["knob"], list) else "x".join(map(str, pt["knob"]))
                    cells += (f" | {pt['ms'][c]:8.2f} {str(pt['block_q']) + 'x' + str(pt['block_kv']):>10} "
                              f"{knob:>10} {pt['density']:7.3f} {pt['recall']:6.3f}")
            lines.append(f"  {name:8} {t:6.2f}{cells}")
    lines.append("  dense (our kernel, every tile): " + ", ".join(f"{c} {ms:.2f} ms" for c, ms in result["dense_ms"].items()))
    if result["calibration"]:
        cal = result["calibration"]
        lines.append("calibration (v6e, the case study's problem at 3328 x 1536; never fitted): "
                     + ", ".join(f"{m} model {v['model_ms']:.2f} ms vs blog {v['blog_ms']:.2f} ms "
                                 f"({v['model_ms'] / v['blog_ms']:.2f}x)" for m, v in cal.items()))
        b0 = cal["splash_dense"].get("body", "free")
        lines.append(f"  the model counts the simulated cycles of the kernels' grid steps (B0: Splash's {b0!r} body"
                     f"{', a lower bound' if b0 == 'free' else ''})\n  at the assumed clock: nothing for HBM stalls "
                     "beyond the profile's, launch or host overhead")
    return "\n".join(lines)


def plot(result: dict, path=None, axes=None):
    """A Pareto plot per chip: predicted ms against mean recall, one curve per mask (best over tile
    sizes), into `axes` (one per chip; a notebook passes pyplot's) or a new Figure made without
    pyplot (no backend is changed). Returns the figure, saved to `path` when one is given."""
    from matplotlib.figure import Figure

    chips = list(result["dense_ms"])
    if axes is None:
        axes = Figure(figsize=(6 * len(chips), 4.5), layout="tight").subplots(1, len(chips), squeeze=False)[0]
    axes = list(np.ravel(axes))
    if len(axes) != len(chips):
        raise ValueError(f"plot draws one chart per chip ({', '.join(chips)}): give {len(chips)} axes, got {len(axes)}")
    fig = axes[0].figure
    for ax, chip in zip(axes, chips):
        for name in result["best"][chip]:
            front = pareto_front([pt for pt in result["points"] if pt["mask"] == name], chip)
            ax.plot([pt["ms"][chip] for pt in front], [pt["recall"] for pt in front], marker="o", label=name)
        ax.axvline(result["dense_ms"][chip], color="grey", linestyle=":", label="dense")
        for t in TARGET_RECALLS:
            ax.axhline(t, color="grey", linewidth=0.5)
        ax.set(title=f"{chip}: predicted attention time vs recall", xlabel="predicted ms (simulated cycles)",
               ylabel="mean recall, planted heads", ylim=(0.5, 1.01))
        ax.legend(loc="lower right")
    if path is not None:
        fig.savefig(Path(path), dpi=110)
    return fig
