"""Recall of the kernel-planned next step (layers.next_plan) along the denoising proxy, and what skip-softmax buys.

    python tools/next-plan-recall.py [--frames 4] [--steps 20] [--rows 256] [--density 0.2] [--json OUT]

The content heads ("content", "mixed") of the denoising proxy (layers.denoising) on the first `frames`
frames of the committed clip (4 x 4-pixel patches: 4 frames are 3,840 tokens), 128-token tiles, on the
CPU (the B3 forward in interpret mode). Per sampler step and head, recall (the dense softmax mass of
`rows` sampled queries inside the computed pairs) of:

    fresh        a plan made cold (10 k-means iterations) from that step's q and k
    warm         the last step's plan made again from its centroids (2 iterations), tiles by centroid score
    kernel warm  the same warm orders, tiles re-chosen from the tile masses the forward measured at the
                 step before and the tile means of this step's q and k
    kernel       the first step's orders kept, tiles re-chosen the same way
    frozen       the first step's plan, unchanged
    (`--margins 1 4` adds "kernel x4": an unvisited tile's estimate must beat a measured tile 4-fold)

Then skip-softmax on the fresh plans at each threshold: the share of visited tiles skipped (one key
slice per tile) and the recall left. Everything is computed here; nothing is read from a file.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from svg_lib.layers.clip_heads import clip_geometry, load_clip, patch_features
from svg_lib.layers.denoising import DenoisingProxy
from svg_lib.layers.next_plan import kernel_planned_run, plan_tile_mass, tile_masses
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.semantic import plan_recall, semantic_plan

KINDS = ["content", "mixed"]
BLOCK = 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--thresholds", type=float, nargs="*", default=[8.0, 4.0])
    ap.add_argument("--margins", type=float, nargs="*", default=[1.0])
    ap.add_argument("--json")
    a = ap.parse_args()
    frames = load_clip()[:a.frames]
    proxy = DenoisingProxy(patch_features(frames), clip_geometry(frames), KINDS, steps=a.steps, head_dim=a.head_dim)
    tokens = proxy.geometry.tokens
    rows = sample_rows(tokens, a.rows, 0)
    start = time.perf_counter()
    qk = [proxy.qk(s) for s in range(proxy.steps)]
    run = kernel_planned_run(qk, rows, block_q=BLOCK, block_kv=BLOCK, density=a.density, iterations=10,
                             margins=tuple(a.margins))
    seconds = time.perf_counter() - start
    print(f"{tokens} tokens ({a.frames} frames), heads {KINDS}, head_dim {a.head_dim}, {BLOCK}-token tiles, "
          f"density {a.density}, {a.steps} sampler steps (shift 5), {a.rows} sampled rows; {seconds:.0f} s")
    print("recall per step (mean over the heads; per head in the JSON)")
    names = list(run)
    print(f"{'step':>4s} {'sigma':>6s} " + " ".join(f"{n:>11s}" for n in names))
    for s in range(proxy.steps):
        print(f"{s:4d} {proxy.sigmas[s]:6.3f} " + " ".join(f"{run[n][s].mean():11.3f}" for n in names))
    print("mean" + " " * 8 + " ".join(f"{run[n][1:].mean():11.3f}" for n in names) + "   (steps 1 on)")

    skip = {}
    fresh = jax.jit(lambda q, k: semantic_plan(q, k, block_q=BLOCK, block_kv=BLOCK, density=a.density, iterations=10))
    plans = [fresh(q, k) for q, k in qk] if a.thresholds else []
    for t in a.thresholds:
        skipped, kept_recall, plain_recall = [], [], []
        for (q, k), plan in zip(qk, plans):
            _, masses, schedule = plan_tile_mass(q, k, jnp.zeros_like(q), plan, skip_below=t)
            mass, visited = tile_masses(masses, schedule, plan.grid, plan.steps)
            dropped = np.asarray(visited & (mass == 0.0))          # a skipped step records mass 0
            skipped.append(dropped.sum() / np.asarray(visited).sum())
            kept = plan.__class__(**{**plan.__dict__, "tiles": plan.tiles & ~jnp.asarray(dropped)})
            kept_recall.append(np.asarray(plan_recall(q, k, kept, jnp.asarray(rows))).mean())
            plain_recall.append(np.asarray(plan_recall(q, k, plan, jnp.asarray(rows))).mean())
        skip[t] = {"skipped": [float(x) for x in skipped], "recall": [float(x) for x in kept_recall],
                   "recall_without_skip": [float(x) for x in plain_recall]}
        print(f"skip-softmax at threshold {t:g} (fresh plans): tiles skipped {np.mean(skipped):.3f} "
              f"(per step {min(skipped):.3f}-{max(skipped):.3f}), recall {np.mean(kept_recall):.4f} "
              f"vs {np.mean(plain_recall):.4f} without")
    if a.json:
        out = {"tokens": tokens, "frames": a.frames, "heads": KINDS, "head_dim": a.head_dim, "block": BLOCK,
               "density": a.density, "sampler_steps": a.steps, "rows": a.rows, "sigmas": proxy.sigmas.tolist(),
               "recall": {n: run[n].tolist() for n in run}, "skip": {str(t): v for t, v in skip.items()}}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
