"""Recall of the six axis orders against SVG's band and semantic tiles on the clip's heads, priced.

    python notebooks/data/12_axis_orders.py notebooks/data/12_axis_orders.json [--size small|case]
        [--select-rows 32] [--eval-rows 256] [--iterations 5]

Heads: the clip's five kinds (`layers.clip_heads`: content, mixed, spatial, temporal, local3d),
head_dim 64, at the committed clip's 7,680 tokens (`--size small`: 8 frames x 24 x 40) or the case
study's 75,600 (`--size case`: 21 x 45 x 80). Tiles 128 x 128, 20 % of the key tiles per query tile:

* SVG's band: `SVGMask.spatial` at the density whose B3 tile-aligned band computes 20 % of the pairs
  (found by bisection), in frame-major order ("band:spatial") and temporal-major ("band:temporal");
* semantic tiles: `semantic_plan` at density 0.2 (`--iterations` of tile-sized k-means, cold start);
* each axis order: `axis_orders.order_tiles` chosen from `--select-rows` sampled query rows.

Recall is measured on `--eval-rows` other sampled rows (held out from the rows that chose the
orders' tiles). Cost per head for the case study's head_dim 128, bf16: B3's simulated cycles
(`tpu.cost.model_cycles` on probes at 128 x 128 tiles, if `tile_cost` finds them: cached or
compiled here) plus the permutation: for the transposes, bytes moved over the v6e's HBM bandwidth
(`instruments.tools.axis_order_cost.permutation_cycles`: a lower bound); for semantic tiles'
gathers, notebook 12's static-profile record (`12_semantic_cost.json`) scaled by tokens; or cycles
per order from `--permutation`. `--reprice` redoes only that and the router's choices.

The transposes' own static profile was tried (compile-only, v6e, q, k, v `[1, 75,600, 128]` bf16
into "hwf" and an output back): on this shared 2-core machine it had not finished in 5 minutes,
and the ops it had dumped by then priced the transposing copies at 0 cycles (reshapes at 10 k and
3 x 27 k), so the bandwidth bound stands in for it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import time

BLOCK = 128
DENSITY = 0.2
KINDS = ("content", "mixed", "spatial", "temporal", "local3d")
TOLERANCES = (0.0, 0.01, 0.05)  # the router's recall margins shown


def band_mask_for(geometry, target: float):
    """The spatial SVGMask whose B3 band at BLOCK tiles computes closest to `target` of the pairs."""
    from svg_lib import SVGMask
    from svg_lib.layers.semantic_router import band_density

    lo, hi = 1e-4, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if band_density(SVGMask.spatial(geometry, mid), BLOCK, BLOCK) < target:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda d: abs(band_density(SVGMask.spatial(geometry, d), BLOCK, BLOCK) - target))
    return SVGMask.spatial(geometry, best)


def measure(size: str, select_rows: int, eval_rows: int, iterations: int, permutation: dict | None,
            priced: bool = True) -> dict:
    import jax
    import numpy as np

    import svg_lib
    from svg_lib.layers.axis_orders import AXIS_ORDERS
    from svg_lib.layers.clip_heads import case_study_qkv, clip_qkv, load_clip
    from svg_lib.layers.profiling import sample_rows
    from svg_lib.layers.semantic import computed_fraction, plan_recall
    from svg_lib.layers.semantic_router import band_density, candidate_plans, order_candidates
    from svg_lib.instruments.tools.axis_order_cost import attention_cycles

    start = time.perf_counter()
    if size == "case":
        q, k, _, g = case_study_qkv(KINDS)
    else:
        q, k, _, g = clip_qkv(load_clip(), KINDS)
    mask = band_mask_for(g, DENSITY)
    band = band_density(mask, BLOCK, BLOCK)
    chosen = sample_rows(g.tokens, select_rows, seed=1)
    held = np.setdiff1d(sample_rows(g.tokens, eval_rows + select_rows, seed=2), chosen)[:eval_rows]
    t0 = time.perf_counter()
    plan = jax.jit(svg_lib.semantic_plan, static_argnames=("block_q", "block_kv", "density", "iterations"))(
        q, k, block_q=BLOCK, block_kv=BLOCK, density=DENSITY, iterations=iterations)
    jax.block_until_ready(plan.tiles)
    plan_s = time.perf_counter() - t0
    plans = candidate_plans(q, k, plan, mask, chosen, density=DENSITY)
    names = order_candidates()
    recall = np.stack([np.asarray(plan_recall(q, k, p, held)) for p in plans], axis=1)    # [heads, candidates]
    computed = np.stack([np.asarray(computed_fraction(p)) for p in plans], axis=1)

    cost = None
    try:
        if not priced:
            raise RuntimeError("--no-cost")
        from svg_lib.instruments.tpu.cost import tile_cost
        cost = tile_cost("v6e", block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, head_dim=128,
                         kernels=("svg_lib",), kinds=("free", "padding_masked", "idle"))
    except Exception as e:  # no libtpu, or the probes did not compile: recall only
        print(f"no cost model at {BLOCK} x {BLOCK}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    rows = []
    for j, (name, p) in enumerate(zip(names, plans)):
        att = attention_cycles(p.tiles, g.tokens, cost, block_q=BLOCK, block_kv=BLOCK) if cost else None
        rows.append(dict(candidate=name, recall={kind: float(recall[h, j]) for h, kind in enumerate(KINDS)},
                         computed_fraction={kind: float(computed[h, j]) for h, kind in enumerate(KINDS)},
                         attention_cycles_per_head=None if att is None else {kind: float(att[h])
                                                                              for h, kind in enumerate(KINDS)}))
    result = dict(size=size, geometry=[g.frames, g.height, g.width], tokens=g.tokens, block=BLOCK, density=DENSITY,
                band_mask_density=mask.density, band_computed=band, select_rows=int(chosen.size),
                eval_rows=int(held.size), semantic_iterations=iterations, semantic_plan_s=round(plan_s, 1),
                cost_probe=None if cost is None else dict(per_step=cost.per_step, per_row=cost.per_row,
                                                          evidence=cost.evidence),
                orders=list(AXIS_ORDERS), rows=rows, seconds=round(time.perf_counter() - start, 1),
                date=datetime.date.today().isoformat())
    return priced_result(result, permutation)


def gather_cycles(tokens: int) -> dict:
    """{"gather": cycles per head}: semantic tiles' permutation (q, k, v gathered in, the output back)
    from notebook 12's compile-only record (`12_semantic_cost.json`, v6e static profile, 1 head, the
    most tokens it priced), scaled linearly to `tokens`; {} if it has none."""
    path = pathlib.Path(__file__).with_name("12_semantic_cost.json")
    found = [c for c in json.loads(path.read_text()).get("compiles", []) if c.get("program") == "gather"
             and c.get("heads") == 1 and c.get("cycles")] if path.exists() else []
    if not found:
        return {}
    best = max(found, key=lambda c: c["tokens"])
    return {"gather": best["cycles"] * tokens / best["tokens"]}


def priced_result(result: dict, permutation: dict | None) -> dict:
    """`result` with each candidate's permutation cycles and the router's choices at TOLERANCES (the
    recalls and attention cycles as measured): cheap, so a new permutation price needs no re-measurement."""
    import numpy as np

    from svg_lib import VideoGeometry
    from svg_lib.layers.semantic_router import cheapest_near_best
    from svg_lib.instruments.tools.axis_order_cost import permutation_cycles, permutation_source

    g = VideoGeometry(*result["geometry"])
    permutation = {**gather_cycles(g.tokens), **(permutation or {})}
    for r in result["rows"]:
        r["permutation_cycles_per_head"] = permutation_cycles(r["candidate"], g, head_dim=128, itemsize=2,
                                                              permutation=permutation)
        r["permutation_source"] = permutation_source(r["candidate"], permutation)
    result["permutation_note"] = ("transposes: bytes (q, k, v in, the output back, each read and written, "
                                  "head_dim 128, bf16) over the v6e's HBM bandwidth at the assumed clock, a lower "
                                  "bound; semantic tiles' gathers: notebook 12's static-profile record scaled by tokens; "
                                  "semantic tiles' plan (k-means, selection) is not counted")
    result["choices"] = {}
    rows, kinds = result["rows"], list(result["rows"][0]["recall"])
    if rows[0]["attention_cycles_per_head"] is not None:  # the router's rule on these recalls and costs
        recall = np.array([[r["recall"][kind] for r in rows] for kind in kinds], np.float32)
        total = np.array([[r["attention_cycles_per_head"][kind] + r["permutation_cycles_per_head"] for r in rows]
                          for kind in kinds])
        for tol in TOLERANCES:
            pick = np.asarray(cheapest_near_best(recall, total, tol))
            result["choices"][str(tol)] = {kind: rows[int(pick[h])]["candidate"] for h, kind in enumerate(kinds)}
    return result


def table(result: dict) -> str:
    kinds = list(result["rows"][0]["recall"])
    head = f"{'candidate':<15}" + "".join(f"{k:>9}" for k in kinds) + f"{'computed':>10}{'Mcycles/head':>14}"
    lines = [f"recall on {result['eval_rows']} held-out rows, {result['tokens']:,} tokens, {result['block']} x "
             f"{result['block']} tiles, {result['density']:.0%} density (band: {result['band_computed']:.3f} computed)",
             head]
    for r in result["rows"]:
        att = r["attention_cycles_per_head"]
        mc = "" if att is None else f"{(max(att.values()) + r['permutation_cycles_per_head']) / 1e6:>14.3f}"
        comp = max(r["computed_fraction"].values())
        lines.append(f"{r['candidate']:<15}" + "".join(f"{r['recall'][k]:>9.3f}" for k in kinds) + f"{comp:>10.3f}" + mc)
    for tol, picks in result.get("choices", {}).items():
        lines.append(f"router, margin {tol}: " + ", ".join(f"{k} -> {c}" for k, c in picks.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--size", choices=("small", "case"), default="small")
    parser.add_argument("--select-rows", type=int, default=32)
    parser.add_argument("--eval-rows", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--permutation", type=pathlib.Path,
                        help='a JSON {"cycles": {order: cycles per head}} of measured permutations')
    parser.add_argument("--reprice", action="store_true",
                        help="recompute permutation cycles and choices of the stored --size result only")
    parser.add_argument("--no-cost", action="store_true", help="recall only (no cost probes compiled)")
    args = parser.parse_args(argv)
    permutation = None
    if args.permutation:
        permutation = {o: c for o, c in json.loads(args.permutation.read_text())["cycles"].items() if c}
    if args.reprice:
        old = json.loads(args.out.read_text())
        old[args.size] = priced_result(old[args.size], permutation)
        args.out.write_text(json.dumps(old, indent=1) + "\n")
        print(table(old[args.size]), flush=True)
        return 0
    result = measure(args.size, args.select_rows, args.eval_rows, args.iterations, permutation, not args.no_cost)
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    old[args.size] = result
    args.out.write_text(json.dumps(old, indent=1) + "\n")
    print(table(result), f"\n({result['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
