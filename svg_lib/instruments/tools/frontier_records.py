"""Every cost on the frontier: per mask, chip, head kind and recall target, the attention, the plan
(amortized over a denoising run) and the permutation, as records (`python -m svg_lib frontier --json PATH`).

`frontier.frontier` sets recall on planted heads against the attention's predicted time alone. A
content mask pays twice more: it plans (semantic tiles: k-means of q and k, then a tile selection;
pooled estimates: mean-pooled scores and a top-k) and it moves the tokens into the order its tiles
were cut in (q, k and v gathered in, the output gathered back). Here, per record:

* heads: the clip's heads at the case study's size (`layers.clip_heads.case_study_qkv`: one head of
  each kind, content, mixed, spatial, temporal and local3d, 21 x 45 x 80 = 75,600 tokens, head_dim 64),
  recall on `rows` sampled queries of each head (its dense softmax mass inside the computed pairs);
* attention_ms: the cost model (`tpu.cost.model_cycles`, B3 on the head's own tile plan, committed
  probes) for the case study's 10 heads of head_dim 128, all of this kind, at the chip's assumed clock;
* plan_ms: what making the mask costs per denoising step: the plan's simulated cycles per head
  (`svg_lib/data/semantic_plan_cost.json`: compile-only programs for a v6e priced by the TPU
  compiler's static profile; `tools/frontier-plan-cost.py` writes it) times the plans a 40-step run
  makes under the record's refresh policy (`layers.plan_reuse.RefreshPolicy`), over 40 steps
  (`plan_reuse.amortized_plan_cycles`). Masks fixed by the geometry (SVG's bands, radial, sliding
  tiles) are built once per video shape: 0, and the record says so;
* permutation_ms: q, k, v into the mask's order and the output back, every step: the row gathers of
  `semantic.into_cluster_order` / `out_of_cluster_order`, priced by the same static profile. Semantic
  tiles pay it always; SVG's temporal form and sliding tiles' cubes pay it too (a fixed permutation,
  priced as the same four gathers: a transpose might be cheaper, so this is an upper bound); radial
  and pooled attend in frame-major order: 0.
* total_ms: the three summed.

The static profile aborts on a sort whose length is not a power of two (libtpu 0.0.42.1), so the
plan and the gathers are priced at powers of two (16,384, 32,768, 65,536 tokens). A size between is
priced from the nearest priced size by a power law whose exponent is fitted between the two priced
sizes nearest it: `cycles(n) = cycles(n0) * (n / n0) ** e`. Neither linear nor n log n holds for the
plan: tile-sized k-means compares every token with every cluster, and the clusters grow with the
tokens, so its work grows nearly as tokens^2 (measured 16,384 -> 65,536 at 512 x 256: 12.2x for 4x
tokens, e = 1.80; n log n would say 4.6x); the gathers grow about linearly (e near 1.05). Each record
names its base size and exponent.

Evidence: recall on this CPU; cycles simulated (nothing ran on a TPU); ms at an assumed clock.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from svg_lib.chips import clock_hz
from svg_lib.core.planner import plan_tiles
from svg_lib.methods import MethodPlans
from svg_lib.extensions.radial import RadialMask
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.core.svg_masks import SVGMask
from svg_lib.instruments.tools.frontier import (KNOBS, SLIDING_CUBE, _computed_density, _recall, _tile_plans)
from svg_lib.instruments.tpu.cost import EVIDENCE, load_reference, model_cycles
from svg_lib.layers.clip_heads import CLIP_KINDS, case_study_qkv, clip_qkv, load_clip
from svg_lib.layers.plan_reuse import RefreshPolicy, amortized_plan_cycles
from svg_lib.layers.pooled import pooled_plan
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.semantic import plan_from_orders, plan_keep, semantic_plan, tile_budget
from svg_lib.layers.synthetic import computed_mask
from svg_lib.progress import bar as progress_bar

PLAN_COST = Path(__file__).resolve().parents[2] / "data" / "semantic_plan_cost.json"
RECORD_MASKS = ("svg_b3", "radial", "sliding", "pooled", "semantic")
RECORD_CHIPS = ("v6e",)  # the plan and the gathers were compiled for a v6e: its static profile prices them
RECORD_TARGETS = (0.80, 0.90, 0.95)
HEADS_PRICED = 10          # the case study's heads (head_dim 128) per layer, all of the record's kind
DENOISING_STEPS = 40       # layers.denoising's rectified-flow run
DEFAULT_POLICY = RefreshPolicy(every=4)  # 12_reuse_tables at 75,600 tokens: a plan reused 4 steps keeps its recall, 8 loses
POLICIES = (RefreshPolicy(every=1), RefreshPolicy(every=2), RefreshPolicy(every=4), RefreshPolicy(every=8),
            RefreshPolicy(every=20), RefreshPolicy())
SEMANTIC_ITERATIONS = 10   # cold k-means for the recall (plan_reuse.planner's; the priced plan: 2 warm ones)
# frontier.KNOBS, finer near recall 0.90 on the clip's content heads (every family alike)
RECORD_KNOBS = dict(KNOBS, svg_b3=(0.1, 0.2, 0.3, 0.45, 0.6, 0.7, 0.75, 0.8, 0.85, 0.92),
                    radial=(0.1, 0.35, 1.0, 2.0, 4.0, 6.0, 8.0, 11.0, 16.0),
                    pooled=(0.1, 0.2, 0.3, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.88, 0.92),
                    semantic=(0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.85, 0.92))


def plans_per_run(policy: RefreshPolicy, steps: int = DENOISING_STEPS) -> int:
    """Plans a `steps`-step run makes under a step-count policy (the first one included)."""
    if policy.threshold is not None:
        raise ValueError(f"a drift policy's refreshes depend on the run; give a step-count policy, got {policy.name!r}")
    return 1 if policy.every is None else math.ceil(steps / policy.every)


# -- what the static profile priced -----------------------------------------------------------

def load_plan_cost(path=None) -> dict:
    """{"plan": {(block_q, block_kv): {tokens: cycles per head}}, "gather": {tokens: cycles per head},
    "pooled": {(block_q, block_kv): {tokens: cycles}}, "record": the JSON} of the priced compiles."""
    path = Path(PLAN_COST if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no plan-cost record at {path}; tools/frontier-plan-cost.py writes it")
    record = json.loads(path.read_text())
    out = {"plan": {}, "gather": {}, "pooled": {}, "record": record}
    for c in record["compiles"]:
        if not c.get("cycles"):
            continue
        per_head = c["cycles"] / c.get("heads", 1)
        if c["program"] in ("plan", "pooled"):
            out[c["program"]].setdefault((c["block_q"], c["block_kv"]), {})[c["tokens"]] = per_head
        elif c["program"] == "gather":
            out["gather"][c["tokens"]] = per_head  # several head counts: one head's own compile is kept below
    for c in record["compiles"]:  # one head's compile wins where both were made (no batching assumed)
        if c["program"] == "gather" and c.get("cycles") and c.get("heads", 1) == 1:
            out["gather"][c["tokens"]] = c["cycles"]
    return out


def scaled(priced: dict, tokens: int) -> dict:
    """Cycles at `tokens` from {tokens: cycles} priced at other sizes: {"cycles", "from_tokens",
    "exponent", "rule"}. Priced exactly: as is. Otherwise from the nearest priced size (log distance)
    by cycles * (tokens / n0) ** e, e fitted between the two priced sizes nearest `tokens`."""
    if not priced:
        raise ValueError("nothing priced to scale from")
    if tokens in priced:
        return dict(cycles=float(priced[tokens]), from_tokens=tokens, exponent=None, rule="priced at this size")
    near = sorted(priced, key=lambda n: abs(math.log(n / tokens)))
    n0 = near[0]
    if len(near) < 2:
        raise ValueError(f"one priced size ({n0:,} tokens): two are needed to fit how the cost grows")
    n1 = near[1]
    e = math.log(priced[n1] / priced[n0]) / math.log(n1 / n0)
    return dict(cycles=float(priced[n0] * (tokens / n0) ** e), from_tokens=n0, exponent=e,
                rule=f"power law: cycles({n0:,}) x (tokens / {n0:,})^{e:.2f}, the exponent fitted between the "
                     f"static profile's prices at {min(n0, n1):,} and {max(n0, n1):,} tokens")


# -- the heads and each mask's points ---------------------------------------------------------

def clip_heads(rows: int, seed: int = 0, kinds=CLIP_KINDS, small: bool = False):
    """(geometry, softmax rows p float64 `[kinds, rows, tokens]`, query rows, q, k) of the clip's heads:
    at the case study's 75,600 tokens, or with `small` the committed 8 x 24 x 40 = 7,680-token clip (tests)."""
    import jax
    import jax.numpy as jnp

    if small:
        q, k, _, g = clip_qkv(load_clip(), list(kinds), head_dim=64, seed=seed)
    else:
        q, k, _, g = case_study_qkv(list(kinds), head_dim=64, seed=seed)
    q, k = jnp.asarray(q), jnp.asarray(k)
    r = sample_rows(g.tokens, rows, seed=seed)
    s = jnp.einsum("hrd,hkd->hrk", q[:, r], k, precision=jax.lax.Precision.HIGHEST) / np.sqrt(q.shape[-1])
    return g, np.asarray(jax.nn.softmax(s, axis=-1), np.float64), r, q, k


def mask_points(name, knob, g, p, rows, q, k, block_q, block_kv, cache, iterations=SEMANTIC_ITERATIONS):
    """Per head: (recall `[heads]`, b3 plans, computed density `[heads]`, permuted `[heads]` bool:
    the head attends in another order than frame-major), or None where the family has no point here."""
    keys = np.arange(g.tokens)[None, :]
    heads = p.shape[0]
    if name == "svg_b3":  # each head takes the better of the spatial and the temporal form
        mask = SVGMask.spatial(g, knob)
        forms = np.stack([_recall(p, computed_mask(mask, kind, "b3", block_q, block_kv).keep(rows[:, None], keys))
                          for kind in ("spatial", "temporal")])
        plan = plan_tiles(mask.tile_aligned(block_q, block_kv), block_q, block_kv)  # temporal: same plan, permuted
        dens = _computed_density(plan, g.tokens)
        return forms.max(axis=0), [plan] * heads, np.full(heads, dens), forms.argmax(axis=0) == 1
    if name == "radial":
        computed = RadialMask(g, "wan", knob).tile_aligned(block_q, block_kv)
        plan = plan_tiles(computed, block_q, block_kv)
        return (_recall(p, computed.keep(rows[:, None], keys)), [plan] * heads,
                np.full(heads, _computed_density(plan, g.tokens)), np.zeros(heads, bool))
    if name == "sliding":
        mask = SlidingTileMask(g, SLIDING_CUBE, knob)
        if not mask.aligned(block_q, block_kv):
            return None
        plan = plan_tiles(mask, block_q, block_kv)
        return (_recall(p, mask.frame_major().keep(rows[:, None], keys)), [plan] * heads,
                np.full(heads, _computed_density(plan, g.tokens)), np.ones(heads, bool))
    if name == "pooled":
        tiles = np.asarray(pooled_plan(q, k, block_q=block_q, block_kv=block_kv, density=knob).tiles)
        keep = tiles[:, rows // block_q][:, :, np.arange(g.tokens) // block_kv]
        plans = _tile_plans(tiles, g.tokens, block_q, block_kv)
        return (_recall(p, keep), plans, np.array([_computed_density(pl, g.tokens) for pl in plans]),
                np.zeros(heads, bool))
    if name == "semantic":
        import jax

        if ("semantic", block_q, block_kv) not in cache:  # the clusters do not depend on the density
            first = jax.jit(functools.partial(semantic_plan, block_q=block_q, block_kv=block_kv, density=0.2,
                                              iterations=iterations))(q, k)
            cache["semantic", block_q, block_kv] = (first.q_order, first.k_order)
        q_order, k_order = cache["semantic", block_q, block_kv]
        plan = plan_from_orders(q, k, q_order, k_order, block_q=block_q, block_kv=block_kv,
                                steps=tile_budget(knob, -(-g.tokens // block_kv)))
        plans = _tile_plans(plan.tiles, g.tokens, block_q, block_kv)
        return (_recall(p, np.asarray(plan_keep(plan, rows))), plans,
                np.array([_computed_density(pl, g.tokens) for pl in plans]), np.ones(heads, bool))
    raise ValueError(f"unknown mask family {name!r}; known: {RECORD_MASKS}")


def record_tiles(chips=RECORD_CHIPS) -> dict:
    """{chip: [(block_q, block_kv), ...]}: the tile sizes whose committed probe prices every step B3
    runs at 75,600 tokens, the tiles holding padded keys included (on a v6e: 512 x 256 and 3328 x 1536;
    1024 x 1536 and 4864 x 1536 were probed without that step)."""
    after = load_reference()["groups"]["after"]
    return {c: sorted((bq, bk) for cc, bq, bk in after
                      if cc == c and "padding_masked" in after[cc, bq, bk].per_step.get("svg_lib", {})) for c in chips}


# -- the records --------------------------------------------------------------------------------

def _overheads(name, chip, block_q, block_kv, tokens, permuted, cost, policy, moved=None):
    """(plan fields, permutation fields) of one point on one chip: ms for HEADS_PRICED heads per step.
    `moved`: the tokens the permutation moves (sliding tiles' cubes pad the video; default `tokens`)."""
    moved = moved or tokens
    hz = clock_hz(chip)
    to_ms = HEADS_PRICED / hz * 1e3
    plan = dict(plan_ms=0.0, refresh_policy=None, plans_per_run=0, plan_basis=None, plan_cycles_per_head=0.0,
                plan_scaled_from_tokens=None, plan_scaling=None)
    if name in ("svg_b3", "radial", "sliding"):
        plan["plan_basis"] = "static: the mask follows from the video's shape, built once, no per-step planning"
    else:
        program = "plan" if name == "semantic" else "pooled"
        priced = cost[program].get((block_q, block_kv))
        if chip != "v6e" or not priced or len(priced) < 2 and tokens not in (priced or {}):
            why = ("the static profile priced it for a v6e only" if chip != "v6e"
                   else f"not priced at {block_q} x {block_kv} (tools/frontier-plan-cost.py --tiles)")
            plan.update(plan_ms=None, plan_basis=f"{program} not priced: {why}")
        else:
            s = scaled(priced, tokens)
            n = plans_per_run(policy)
            plan.update(plan_cycles_per_head=s["cycles"], plan_scaled_from_tokens=s["from_tokens"],
                        plan_scaling=s["rule"], plan_scaling_exponent=s["exponent"], refresh_policy=policy.name,
                        plans_per_run=n,
                        plan_ms=float(amortized_plan_cycles(s["cycles"], n, DENOISING_STEPS)) * to_ms,
                        plan_basis=(f"{'semantic_plan (2 warm k-means iterations of q and k, tile selection)' if name == 'semantic' else 'pooled_plan (mean-pooled q, k; tile scores; top-k)'}"
                                    f", v6e static profile, {n} plan(s) per {DENOISING_STEPS}-step run "
                                    f"(refresh {policy.name}; every plan priced as a warm one)"))
    perm = dict(permutation_ms=0.0, permutation_basis=None, permutation_scaled_from_tokens=None,
                permutation_scaling=None, permuted=bool(permuted))
    if not permuted:
        perm["permutation_basis"] = "none: attends in frame-major order"
    elif chip != "v6e":
        perm.update(permutation_ms=None, permutation_basis="not priced: the static profile priced the gathers for a v6e only")
    else:
        s = scaled(cost["gather"], moved)
        perm.update(permutation_ms=s["cycles"] * to_ms, permutation_scaled_from_tokens=s["from_tokens"],
                    permutation_scaling=s["rule"], permutation_cycles_per_head=s["cycles"],
                    permutation_basis=("row gathers of q, k, v into the plan's order and of the output back, every "
                                       "step, v6e static profile" if name == "semantic" else
                                       "a fixed permutation (" + ("SVG's temporal form" if name == "svg_b3" else
                                                                  "frame-major into cubes, padded") +
                                       ") priced as the same four row gathers: an upper bound"))
    return plan, perm


def points(rows: int = 64, masks=RECORD_MASKS, chips=RECORD_CHIPS, knobs=None, kinds=CLIP_KINDS, tiles=None,
           seed: int = 0, bar: bool = False, iterations: int = SEMANTIC_ITERATIONS,
           small: bool = False) -> tuple[list, dict]:
    """Every (mask, tile size, knob) point: per head kind its recall, computed density and per chip its
    attention ms; and the heads' description. `tiles`: {chip: [(bq, bk)]} (default: every probed size)."""
    tiles = tiles or record_tiles(chips)
    sizes = sorted({t for c in chips for t in tiles[c]})
    after = load_reference()["groups"]["after"]
    g, p, r, q, k = clip_heads(rows, seed, kinds, small)
    cache, out = {}, []
    total = len(sizes) * sum(len((knobs or {}).get(n, RECORD_KNOBS[n])) for n in masks)
    shown = progress_bar(total=total, desc="frontier records", unit="point", show=bar)
    for name in masks:
        for block_q, block_kv in sizes:
            for knob in (knobs or {}).get(name, RECORD_KNOBS[name]):
                first = name == "semantic" and ("semantic", block_q, block_kv) not in cache  # mask_points' clusters
                clusters = " (k-means of q and k first)" if first else ""
                shown.set_description(f"frontier records: {name} at {block_q} x {block_kv}, knob {knob}{clusters}")
                got = mask_points(name, knob, g, p, r, q, k, block_q, block_kv, cache, iterations)
                shown.update(1)
                if got is None:
                    continue
                recall, plans, density, permuted = got
                moved = SlidingTileMask(g, SLIDING_CUBE, knob).tokens if name == "sliding" else int(g.tokens)
                ms = {c: [HEADS_PRICED * model_cycles("b3", after[c, block_q, block_kv], MethodPlans(tile_aligned=pl)) / clock_hz(c) * 1e3
                          for pl in plans] for c in chips if (block_q, block_kv) in tiles[c]}
                for h, kind in enumerate(kinds):
                    out.append(dict(mask=name, head_kind=kind, block_q=block_q, block_kv=block_kv,
                                    knob=list(knob) if isinstance(knob, tuple) else knob, recall=float(recall[h]),
                                    density=float(density[h]), permuted=bool(permuted[h]), permuted_tokens=moved,
                                    attention_ms={c: float(v[h]) for c, v in ms.items()}))
    shown.close()
    return out, dict(geometry=str(g), tokens=int(g.tokens), rows=int(r.size), seed=seed,
                     semantic_iterations=iterations)


def priced(pt, chip, cost, policy, tokens) -> dict:
    """One point on one chip with its plan and permutation: the record's cost fields."""
    plan, perm = _overheads(pt["mask"], chip, pt["block_q"], pt["block_kv"], tokens, pt["permuted"], cost, policy,
                            pt.get("permuted_tokens"))
    att = pt["attention_ms"][chip]
    parts = (att, plan["plan_ms"], perm["permutation_ms"])
    total = None if any(x is None for x in parts) else float(sum(parts))
    return dict(attention_ms=att, **plan, **perm, total_ms=total)


def records(pts, heads: dict, *, chips=RECORD_CHIPS, targets=RECORD_TARGETS, policy=DEFAULT_POLICY, cost=None,
            masks=None) -> list:
    """One record per mask, chip, head kind and recall target: the mask's cheapest point (by total ms)
    whose recall on that head reaches the target, with its attention, plan and permutation ms.
    `reached` False (and no ms) where no point reaches it; `priced` False where a part is unpriced."""
    cost = cost or load_plan_cost()
    masks = masks or list(dict.fromkeys(pt["mask"] for pt in pts))
    kinds = list(dict.fromkeys(pt["head_kind"] for pt in pts))
    out = []
    for mask in masks:
        for chip in chips:
            for kind in kinds:
                cands = [pt for pt in pts if pt["mask"] == mask and pt["head_kind"] == kind and chip in pt["attention_ms"]]
                costed = [(pt, priced(pt, chip, cost, policy, heads["tokens"])) for pt in cands]
                for t in targets:
                    ok = [(pt, c) for pt, c in costed if pt["recall"] >= t]
                    rec = dict(mask=mask, chip=chip, head_kind=kind, tokens=heads["tokens"], recall_target=t,
                               heads=HEADS_PRICED, reached=bool(ok))
                    if ok:
                        key = (lambda pc: (pc[1]["total_ms"] is None, pc[1]["total_ms"] if pc[1]["total_ms"] is not None
                                           else pc[1]["attention_ms"]))
                        pt, c = min(ok, key=key)
                        rec.update(recall=pt["recall"], block_q=pt["block_q"], block_kv=pt["block_kv"], knob=pt["knob"],
                                   density=pt["density"], priced=c["total_ms"] is not None, **c)
                    else:
                        best = max((pt["recall"] for pt in cands), default=None)
                        rec.update(attention_ms=None, plan_ms=None, permutation_ms=None, total_ms=None, priced=False,
                                   best_recall=best, why=f"no point of the grid reaches recall {t} on this head "
                                                         f"(best {best if best is None else round(best, 3)})")
                    out.append(rec)
    return out


def winners(recs, chip: str = "v6e", target: float = 0.90) -> dict:
    """{head kind: the priced record of the lowest total ms at `target` on `chip`, or None}."""
    out = {}
    for rec in recs:
        if rec["chip"] != chip or rec["recall_target"] != target:
            continue
        out.setdefault(rec["head_kind"], None)
        if rec["reached"] and rec["total_ms"] is not None:
            cur = out[rec["head_kind"]]
            if cur is None or rec["total_ms"] < cur["total_ms"]:
                out[rec["head_kind"]] = rec
    return out


def goal(pts, heads, *, cost=None, kind="content", chip="v6e", target=0.90, policies=POLICIES, speedup=1.5,
         plan_share=0.10) -> dict:
    """Semantic tiles against the best other mask on one head kind: per (tiles, policy) the cheapest
    semantic point reaching `target`, its total and plan share, and whether it is `speedup` x faster
    than the best other mask's total with the amortized plan at most `plan_share` of its attention."""
    cost = cost or load_plan_cost()
    others = [r for r in records([pt for pt in pts if pt["mask"] != "semantic" and pt["head_kind"] == kind], heads,
                                 chips=(chip,), targets=(target,), cost=cost) if r["reached"] and r["priced"]]
    best_other = min(others, key=lambda r: r["total_ms"], default=None)
    levers = []
    sem = [pt for pt in pts if pt["mask"] == "semantic" and pt["head_kind"] == kind and chip in pt["attention_ms"]]
    for tiles in sorted({(pt["block_q"], pt["block_kv"]) for pt in sem}):
        for policy in policies:
            recs = records([pt for pt in sem if (pt["block_q"], pt["block_kv"]) == tiles], heads, chips=(chip,),
                           targets=(target,), policy=policy, cost=cost)
            r = recs[0]
            row = dict(block_q=tiles[0], block_kv=tiles[1], refresh_policy=policy.name, plans_per_run=plans_per_run(policy),
                       reached=r["reached"], best_recall=r.get("best_recall", r.get("recall")))
            if r["reached"] and r["priced"]:
                row.update(knob=r["knob"], recall=r["recall"], attention_ms=r["attention_ms"], plan_ms=r["plan_ms"],
                           permutation_ms=r["permutation_ms"], total_ms=r["total_ms"],
                           plan_share=r["plan_ms"] / r["attention_ms"])
                if best_other:
                    row["speedup"] = best_other["total_ms"] / r["total_ms"]
                    row["met"] = bool(row["speedup"] >= speedup and row["plan_share"] <= plan_share)
            levers.append(row)
    met = [row for row in levers if row.get("met")]
    best = min((row for row in levers if "total_ms" in row), key=lambda row: row["total_ms"], default=None)
    return dict(head_kind=kind, chip=chip, recall_target=target, required_speedup=speedup, max_plan_share=plan_share,
                best_other={k: best_other[k] for k in ("mask", "block_q", "block_kv", "knob", "recall", "attention_ms",
                                                        "plan_ms", "permutation_ms", "total_ms")} if best_other else None,
                semantic_levers=levers, best_semantic=best, met=bool(met),
                recall_basis="each point's recall is a fresh plan's (cold k-means on the clip's heads); a plan reused "
                             "for more steps recalls less, so a policy of few plans is priced here at a recall it "
                             "keeps only while q and k move little (the denoising proxy of notebook 12 measures how much)")


def run(rows: int = 64, masks=RECORD_MASKS, chips=RECORD_CHIPS, knobs=None, kinds=CLIP_KINDS, tiles=None,
        policy=DEFAULT_POLICY, targets=RECORD_TARGETS, seed: int = 0, bar: bool = False, cost_path=None,
        iterations: int = SEMANTIC_ITERATIONS, small: bool = False) -> dict:
    """The JSON `python -m svg_lib frontier --json PATH` writes: the records, the points they were
    chosen from, the goal check on the content heads, and what every number rests on."""
    load_plan_cost(cost_path)  # a missing record is refused before the minutes of recall
    pts, heads = points(rows, masks, chips, knobs, kinds, tiles, seed, bar, iterations, small)
    cost = load_plan_cost(cost_path)
    recs = records(pts, heads, chips=chips, targets=targets, policy=policy, cost=cost, masks=list(masks))
    out = dict(
        what="per mask, chip, head kind and recall target: the cheapest point reaching the target by total ms = "
             "attention + plan (amortized per denoising step) + permutation",
        heads=dict(heads, source="layers.clip_heads.case_study_qkv (Big Buck Bunny patches), one head per kind, "
                                 "head_dim 64", kinds=list(kinds)),
        priced_heads=HEADS_PRICED, priced_head_dim=128, denoising_steps=DENOISING_STEPS, refresh_policy=policy.name,
        evidence=dict(recall="computed on this CPU on the clip's heads (sampled query rows)",
                      attention=f"tpu.cost.model_cycles on the committed probes: cycles {EVIDENCE}",
                      plan_and_permutation="compile-only v6e programs priced by libtpu's static profile "
                                           f"(svg_lib/data/semantic_plan_cost.json, libtpu {cost['record'].get('libtpu')})",
                      ms="simulated cycles at an assumed clock: " + ", ".join(f"{c} {clock_hz(c) / 1e9:.2f} GHz" for c in chips)),
        scaling="sizes the static profile cannot price (a sort whose length is not a power of two aborts it) are "
                "priced from the nearest priced power of two by a power law fitted between the two priced sizes "
                "nearest: the plan's k-means compares every token with every cluster and the clusters grow with "
                "the tokens (near tokens^2), the gathers grow linearly; each record names its base and exponent",
        sampling=f"recall on {heads['rows']} sampled query rows per head (seed {seed}), one head per kind; every "
                 "mask family over a grid of its knob (RECORD_KNOBS) at each tile size with a complete probe",
        records=recs, points=pts)
    if "semantic" in masks and "content" in kinds and "v6e" in chips:
        out["goal"] = goal(pts, heads, cost=cost, target=0.90)
    return out
