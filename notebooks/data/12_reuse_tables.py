"""Semantic plans reused across denoising steps: recall against the plan's age, drift statistics,
and refresh policies with their amortized plan cost, recorded as JSON.

    python notebooks/data/12_reuse_tables.py notebooks/data/12_reuse_tables.json

Heads: `layers.denoising.DenoisingProxy` (a 40-step rectified-flow sampler, shift 5, on the
clip's patch features; one content, mixed, spatial and temporal head, head_dim 64, seed 0) at two
sizes: 7,680 tokens (8 x 24 x 40, `clip_heads.patch_features`), 128 x 128 tiles, 128 sampled
queries; 75,600 tokens (the case study's 21 x 45 x 80, `clip_heads.load_case_patches`),
1024 x 512 tiles, 64 sampled queries. Plans: `semantic.semantic_plan` at density 0.2 (20 % of
the key tiles per query tile), no sink, 10 k-means iterations cold, 2 warm.

* "age": per anchor step a, a cold plan made at a and used at a + age for ages 0, 1, 2, 4, 8, 16
  ("reused"), against a plan made at a + age ("fresh": cold at 7,680 tokens; at 75,600, warm from
  the anchor's centroids, as a refresh makes it), with both drift statistics (`plan_reuse`).
* "policies" (7,680 tokens): whole runs under `plan_reuse.RefreshPolicy`: mean recall over the
  steps, refreshes per head, and the plan's cost per step: refreshes x the cycles of one plan
  (v6e static profile, notebooks/data/12_semantic_cost.json: 2 warm iterations, 512 x 256 tiles,
  at 16,384 and 65,536 tokens) / 40 steps.
CPU, jax as installed; the wall seconds each part took are recorded (a 2-core machine shared with other
work: the 75,600-token part took 364 s alone and 783 s beside other jobs, about 230 s of CPU either way).
"""
import datetime
import json
import os
import pathlib
import sys
import time

import jax
import numpy as np

from svg_lib.layers.clip_heads import clip_geometry, load_case_patches, load_clip, patch_features
from svg_lib.layers.denoising import DEFAULT_SHIFT, DEFAULT_STEPS, DenoisingProxy
from svg_lib.layers.plan_reuse import (RefreshPolicy, amortized_plan_cycles, planner, reuse_run, tile_mean_drift,
                                       token_mean_drift)
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.semantic import plan_recall

KINDS = ["content", "mixed", "spatial", "temporal"]
AGES = (0, 1, 2, 4, 8, 16)
DENSITY, ITERATIONS, WARM = 0.2, 10, 2
SIZES = {"7680": dict(block_q=128, block_kv=128, rows=128, anchors=(0, 8, 16, 23), fresh="cold"),
         "75600": dict(block_q=1024, block_kv=512, rows=64, anchors=(23,), fresh="warm")}
POLICIES = [RefreshPolicy(every=1), RefreshPolicy(every=2), RefreshPolicy(every=4), RefreshPolicy(every=8),
            RefreshPolicy(), RefreshPolicy(threshold=0.01), RefreshPolicy(threshold=0.05),
            RefreshPolicy(threshold=0.05, statistic="tile_mean"), RefreshPolicy(threshold=0.15, statistic="tile_mean"),
            RefreshPolicy(every=8, threshold=0.05, statistic="tile_mean")]
COST = pathlib.Path(__file__).with_name("12_semantic_cost.json")


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def age_table(proxy, cfg):
    rows = sample_rows(proxy.geometry.tokens, cfg["rows"], 0)
    cold, warm = planner(block_q=cfg["block_q"], block_kv=cfg["block_kv"], density=DENSITY, iterations=ITERATIONS,
                         warm_iterations=WARM)
    qk, fresh_plans, out = {}, {}, []
    for anchor in cfg["anchors"]:
        qk.setdefault(anchor, proxy.qk(anchor))
        plan = cold(*qk[anchor])
        for age in AGES:
            step = anchor + age
            if step >= proxy.steps:
                continue
            qk.setdefault(step, proxy.qk(step))
            q, k = qk[step]
            if age == 0:
                fresh = plan
            elif cfg["fresh"] == "cold":
                fresh = fresh_plans.setdefault(step, cold(q, k))
            else:
                fresh = warm(q, k, plan.centroids)
            reused, again = np.asarray(plan_recall(q, k, plan, rows)), np.asarray(plan_recall(q, k, fresh, rows))
            tok, til = token_mean_drift(*qk[anchor], q, k), tile_mean_drift(plan, q, k)
            for h, kind in enumerate(KINDS):
                out.append({"kind": kind, "anchor": anchor, "age": age, "step": step,
                            "sigma": float(proxy.sigmas[step]), "reused": float(reused[h]), "fresh": float(again[h]),
                            "token_mean_drift": float(tok[h]), "tile_mean_drift": float(til[h])})
            print(f"  anchor {anchor} age {age}: reused {np.round(reused, 3)} fresh {np.round(again, 3)} "
                  f"drift {np.round(tok, 4)} / {np.round(til, 4)}", flush=True)
    table = {kind: {str(age): {key: float(np.mean([r[key] for r in out if r["kind"] == kind and r["age"] == age]))
                               for key in ("reused", "fresh", "token_mean_drift", "tile_mean_drift")}
                    for age in AGES if any(r["age"] == age for r in out)} for kind in KINDS}
    correlation = {}
    for kind in (None, *KINDS):  # over every head, then per kind
        moved = [r for r in out if r["age"] > 0 and kind in (None, r["kind"])]
        loss = [r["fresh"] - r["reused"] for r in moved]
        correlation[kind or "all"] = {stat: spearman([r[stat] for r in moved], loss)
                                      for stat in ("token_mean_drift", "tile_mean_drift")}
    return {"by_kind_and_age": table, "points": out, "spearman_drift_vs_recall_loss": correlation}


def policy_table(proxy, cfg, plan_cycles):
    rows = sample_rows(proxy.geometry.tokens, cfg["rows"], 0)
    plans = planner(block_q=cfg["block_q"], block_kv=cfg["block_kv"], density=DENSITY, iterations=ITERATIONS,
                    warm_iterations=WARM)
    steps = [proxy.qk(s) for s in range(proxy.steps)]
    out = []
    for policy in POLICIES:
        start = time.perf_counter()
        run = reuse_run(steps, policy, rows, block_q=cfg["block_q"], block_kv=cfg["block_kv"], density=DENSITY,
                        plans=plans)
        row = {"policy": policy.name, "every": policy.every, "threshold": policy.threshold,
               "statistic": policy.statistic, "seconds": round(time.perf_counter() - start, 1)}
        for h, kind in enumerate(KINDS):
            row[kind] = {"mean_recall": float(run["recall"][:, h].mean()),
                         "last_10_steps_recall": float(run["recall"][-10:, h].mean()),
                         "refreshes": int(run["refreshes"][h]),
                         "plan_cycles_per_step": {tokens: float(amortized_plan_cycles(c, run["refreshes"][h],
                                                                                      proxy.steps))
                                                  for tokens, c in plan_cycles.items()}}
        out.append(row)
        print(f"  {policy.name:36s} recall {[round(row[k]['mean_recall'], 3) for k in KINDS]} refreshes "
              f"{[row[k]['refreshes'] for k in KINDS]} ({row['seconds']} s)", flush=True)
    return out


def main():
    out_path = pathlib.Path(sys.argv[1])
    sizes = os.environ.get("SVG12_SIZES", ",".join(SIZES)).split(",")
    cost = json.loads(COST.read_text())
    plan_cycles = {str(s["tokens"]): s["plan_cycles_per_head"] for s in cost["summary"]
                   if s["heads"] == 1 and (s["block_q"], s["block_kv"]) == (512, 256)}
    attention_cycles = {str(s["tokens"]): s["semantic_attention_cycles_per_head"] for s in cost["summary"]
                        if s["heads"] == 1 and (s["block_q"], s["block_kv"]) == (512, 256)}
    previous = json.loads(out_path.read_text()) if out_path.is_file() else {}
    results = previous.get("sizes", {})
    for size in sizes:
        cfg = SIZES[size]
        start = time.perf_counter()
        if size == "7680":
            frames = load_clip()
            features, geometry = patch_features(frames), clip_geometry(frames)
        else:
            features, geometry = load_case_patches()
        proxy = DenoisingProxy(features, geometry, KINDS)
        print(f"{geometry}: {cfg}", flush=True)
        result = {"geometry": str(geometry), **{key: value for key, value in cfg.items()}}
        result["age"] = age_table(proxy, cfg)
        result["age_seconds"] = round(time.perf_counter() - start, 1)
        if size == "7680":
            start = time.perf_counter()
            result["policies"] = policy_table(proxy, cfg, plan_cycles)
            result["policies_seconds"] = round(time.perf_counter() - start, 1)
        results[size] = result
    out_path.write_text(json.dumps({
        "what": "semantic plans reused across denoising steps (plan_reuse): recall (dense softmax mass inside the "
                "computed pairs, mean over sampled queries) against the plan's age, drift statistics, refresh policies",
        "heads": "layers.denoising.DenoisingProxy on svg_lib/data/clip_bbb.npz and clip_bbb_patches.npz "
                 "(Big Buck Bunny, CC BY 3.0), kinds " + ", ".join(KINDS) + ", head_dim 64, seed 0",
        "schedule": f"rectified flow, {DEFAULT_STEPS} steps, shift {DEFAULT_SHIFT}",
        "density": DENSITY, "iterations": ITERATIONS, "warm_iterations": WARM, "ages": list(AGES),
        "plan_cycles_per_head": plan_cycles, "semantic_attention_cycles_per_head": attention_cycles,
        "cost_source": "notebooks/data/12_semantic_cost.json (v6e static profile, 512 x 256 tiles, 1 head)",
        "device": "CPU (2 cores, shared)", "jax": jax.__version__, "date": datetime.date.today().isoformat(),
        "sizes": results,
        "command": "python notebooks/data/12_reuse_tables.py notebooks/data/12_reuse_tables.json "
                   "(SVG12_SIZES=7680 or 75600 for one size)",
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
