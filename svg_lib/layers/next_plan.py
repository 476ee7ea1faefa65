"""The kernel plans the next step: a semantic plan's tiles re-chosen from what the B3 forward measured.

A plan made at one denoising step (`semantic.semantic_plan`) fixes two things: the token orders
(its clusters, the tiles' contents) and which tiles are computed. The orders age slowly; the
choice of tiles can move cheaply if each step's forward says how much every computed tile
weighed. The B3 forward does so with its tile-mass side output (`extensions.observed`):
per grid step, the softmax mass of the tile it visited (each row's share of its probability over
the keys it computes, averaged over the query tile's rows), a `[heads, nq * steps]` f32 side
output aligned with the schedule. From it, per head and query tile:

* visited tiles keep their measured mass, put on the estimate's scale: times the estimated mass of
  all the visited tiles together (measured masses sum to 1 over the visited tiles; the estimate
  says what share of the row they held);
* tiles not visited get the estimate: the softmax over key tiles of SVG2's centroid score
  (`semantic.tile_scores`), from the tile means of today's q and k in the plan's orders
  (`semantic.tile_means`: a matmul per head, no k-means, no gather);
* the `round(density * nk)` tiles of highest mass are computed at the next step (`semantic.top_tiles`),
  the first frame's key tiles first if `pinned`.

So a tile that lost its weight gives way to an unvisited one whose estimate beats it, and the
mask moves without re-clustering. A NaN mass (a NaN row reached the forward) counts as not measured.

`tile_masses` lays the side output on the `[heads, nq, nk]` tile grid; `next_tiles` chooses;
`next_plan` returns the plan with the new tiles; `plan_tile_mass` runs the forward with the side
output on a plan; `kernel_planned_run` measures recall along a sampler run against a fresh plan at
every step (tools/next-plan-recall.py; svg_lib/data/next_plan_recall.json). What it found on the
denoising proxy's content heads (3,840 tokens, 128-token tiles, density 0.2, 20 steps): with the
orders warm-started each step (SVG2's 2 iterations), tiles chosen from the masses recall what tiles
chosen by centroid score do (0.514 both, mean of steps 1-19; a cold plan every step 0.526); with the
first step's orders kept, neither choice helps (0.458, the frozen plan 0.459): the tiles' contents,
not which tiles are computed, limit recall there. The side output's price: svg_lib/data/tile_mass_cost.json.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from svg_lib.core.masks import padding_only
from svg_lib.core.planner import EMPTY, schedule_entry
from svg_lib.extensions.device_plan import device_tables
from svg_lib.extensions.observed import observed_block_sparse_attention
from svg_lib.layers.semantic import (SemanticCentroids, SemanticPlan, check_plan, into_cluster_order, plan_recall,
                                     semantic_plan, tile_budget, tile_means, tile_scores, top_tiles)
from svg_lib.layers.semantic_clusters import capacities
from svg_lib.methods import METHODS
from svg_lib.problem import check_block_kv_compute
from svg_lib.runtime import default_interpret


def tile_masses(masses, schedule, grid: tuple[int, int], steps: int):
    """(mass f32 `[heads, nq, nk]`, visited bool `[heads, nq, nk]`): the side output `masses` f32
    `[heads, nq * steps]` laid on the tile grid by the per-head packed `schedule` int32 `[heads, words]`
    it is aligned with (`device_tables(...).schedule`). Tiles not visited get 0. A one-hot compare per
    step (`[heads, nq, steps, nk]`), no scatter."""
    import jax
    import jax.numpy as jnp

    nq, nk = grid
    heads = schedule.shape[0]
    if tuple(masses.shape) != (heads, nq * steps):
        raise ValueError(f"masses must be [heads, nq * steps] = {(heads, nq * steps)} for this schedule, "
                         f"got {tuple(masses.shape)}")
    entries = jnp.arange(nq * steps, dtype=jnp.int32)
    index, cls = jax.vmap(lambda sch: schedule_entry(sch, entries))(schedule)               # [heads, nq * steps]
    hit = (index[..., None] == jnp.arange(nk)) & (cls != EMPTY)[..., None]                 # [heads, nq*steps, nk]
    hit = hit.reshape(heads, nq, steps, nk)
    mass = jnp.sum(jnp.where(hit, masses.reshape(heads, nq, steps, 1), 0.0), axis=2)
    return mass, jnp.any(hit, axis=2)


def next_tiles(mass, visited, q, k, plan: SemanticPlan, *, steps: int | None = None, pinned=None,
               margin: float = 1.0):
    """bool `[heads, nq, nk]`: the tiles the next step computes, `steps` per query tile (default the
    plan's), from the measured `mass` and `visited` (`tile_masses`) and the estimate from q and k
    `[heads, tokens, head_dim]` (module docstring). `pinned`: bool `[nk]` key tiles every query tile
    keeps (a sink). `margin` >= 1: an unvisited tile's estimate counts 1 / margin (it must beat a
    measured tile by that factor to replace it: the estimate from stale tiles is noisy). Traceable."""
    import jax
    import jax.numpy as jnp

    steps = plan.steps if steps is None else steps
    estimate = jax.nn.softmax(tile_scores(tile_means(q.astype(jnp.float32), plan.q_place, plan.block_q),
                                          tile_means(k.astype(jnp.float32), plan.k_place, plan.block_kv),
                                          capacities(q.shape[1], plan.block_kv)), axis=-1)
    measured = visited & jnp.isfinite(mass)
    held = jnp.sum(jnp.where(measured, estimate, 0.0), axis=-1, keepdims=True)   # the estimate's share of them
    combined = jnp.where(measured, mass * held, estimate / margin)
    priority = combined if pinned is None else jnp.where(jnp.asarray(pinned)[None, None, :], jnp.inf, combined)
    return top_tiles(priority, combined, steps)


def next_plan(masses, schedule, q, k, plan: SemanticPlan, *, density: float | None = None, pinned=None,
              margin: float = 1.0) -> SemanticPlan:
    """`plan` with its tiles re-chosen for the next step (`next_tiles`) from the forward's side output
    `masses` `[heads, nq * plan.steps]` over `schedule` (the tables it ran), q and k of the next step:
    same orders, new tiles, centroids the tile means of q and k. `density`: a new budget (default the plan's);
    `margin` as in `next_tiles`."""
    import jax.numpy as jnp

    heads, tokens = plan.q_order.shape
    nk = plan.grid[1]
    steps = plan.steps if density is None else tile_budget(density, nk)
    mass, visited = tile_masses(masses, schedule, plan.grid, plan.steps)
    tiles = next_tiles(mass, visited, q, k, plan, steps=steps, pinned=pinned, margin=margin)
    cents = SemanticCentroids(tile_means(q.astype(jnp.float32), plan.q_place, plan.block_q),
                              tile_means(k.astype(jnp.float32), plan.k_place, plan.block_kv))
    return dataclasses.replace(plan, tiles=tiles, centroids=cents, steps=steps)


def plan_tile_mass(q, k, v, plan: SemanticPlan, *, block_kv_compute: int | None = None, interpret=None,
                   skip_below: float | None = None):
    """(out `[heads, tokens, head_dim]` in cluster order, masses f32 `[heads, nq * steps]`, schedule int32
    `[heads, words]`): the B3 forward over the plan's tiles with the tile-mass side output, head by head
    (as `semantic.semantic_attention` runs them), its tables made on the device. Forward only; q is
    scaled by 1/sqrt(head_dim) here. `skip_below`: skip-softmax's threshold (None: off; a skipped step's mass is 0)."""
    import jax

    heads, tokens, head_dim = q.shape
    check_plan(plan, heads, tokens)
    run = _one_head(tokens, plan.block_q, plan.block_kv, plan.steps,
                    check_block_kv_compute(plan.block_kv, block_kv_compute, plan.block_q),
                    default_interpret() if interpret is None else interpret, skip_below)
    qs, ks, vs = into_cluster_order((q * (1.0 / math.sqrt(head_dim))).astype(q.dtype), k, v, plan)
    tables = device_tables(plan.tiles, tokens=tokens, block_kv=plan.block_kv, steps=plan.steps)
    out, masses = jax.lax.map(lambda a: run(*a), (qs, ks, vs, tables.schedule))
    return out, masses, tables.schedule


@functools.lru_cache(maxsize=16)
def _one_head(tokens, block_q, block_kv, steps, block_kv_compute, interpret, skip_below=None):
    import jax.numpy as jnp

    not_padding = padding_only(tokens)

    def run(q, k, v, schedule):
        out, masses = observed_block_sparse_attention(q[None], k[None], v[None], jnp.zeros((1,), jnp.int32), schedule,
                                                      steps=steps, method=METHODS["b3"], keep=not_padding, block_q=block_q,
                                                      block_kv=block_kv, block_kv_compute=block_kv_compute,
                                                      interpret=interpret, tile_mass=True, skip_below=skip_below)
        return out[0], masses[0]
    return run


def kernel_planned_run(step_qk, rows, *, block_q: int, block_kv: int, density: float, iterations: int = 10,
                       warm_iterations: int = 2, block_kv_compute: int | None = None, interpret=None,
                       margins=(1.0,)) -> dict:
    """Recall per step and head along a sampler run (float64 `[steps, heads]` each), five ways:

    "fresh": a plan made cold (`iterations`) from each step's q and k. "warm": the last step's plan
    made again from its centroids (`warm_iterations`, as SVG2 after its first step), tiles by centroid
    score. "kernel warm": the same warm orders, tiles re-chosen (`next_tiles`) from the tile masses the
    forward measured at the step before (a warm-started tile keeps its index: k-means' cluster j starts
    from the last step's centroid j) and the tile means of this step's q and k. "kernel": the first
    step's orders kept, tiles re-chosen the same way (`next_plan`). "frozen": the first step's plan.
    Every plan starts from the first step's cold one. With several `margins` (`next_tiles`), one
    "kernel" run per margin ("kernel x{margin}" for those not 1). Recall on the query `rows`
    (`semantic.plan_recall`). `step_qk`: (q, k) per step. v does not change the masses: zeros are used.
    Each function is jitted once and runs every step's plan (the plans are data)."""
    import jax
    import jax.numpy as jnp

    common = dict(block_q=block_q, block_kv=block_kv, density=density)
    fresh_fn = jax.jit(lambda q, k: semantic_plan(q, k, iterations=iterations, **common))
    warm_fn = jax.jit(lambda q, k, c: semantic_plan(q, k, iterations=warm_iterations, centroids=c, **common))
    forward = jax.jit(lambda q, k, plan: plan_tile_mass(q, k, jnp.zeros_like(q), plan,
                                                         block_kv_compute=block_kv_compute, interpret=interpret)[1:])
    move = jax.jit(lambda masses, schedule, q, k, plan, margin: next_plan(masses, schedule, q, k, plan, margin=margin))

    @jax.jit
    def move_warm(masses, schedule, q, k, plan, warm):
        mass, visited = tile_masses(masses, schedule, plan.grid, plan.steps)
        return dataclasses.replace(warm, tiles=next_tiles(mass, visited, q, k, warm))

    recall = jax.jit(plan_recall)
    names = ["kernel" if m == 1 else f"kernel x{m:g}" for m in margins]
    out = {name: [] for name in ["fresh", "warm", "kernel warm", *names, "frozen"]}
    plans, measured, first = {}, {}, None
    for q, k in step_qk:
        fresh = fresh_fn(q, k)
        if first is None:
            first = fresh
            plans = {name: fresh for name in ["warm", "kernel warm", *names]}
        else:
            plans["warm"] = warm_fn(q, k, plans["warm"].centroids)
            plans["kernel warm"] = move_warm(*measured["kernel warm"], q, k, plans["kernel warm"],
                                             warm_fn(q, k, plans["kernel warm"].centroids))
            for name, margin in zip(names, margins):
                plans[name] = move(*measured[name], q, k, plans[name], margin)
        for name in ["kernel warm", *names]:
            measured[name] = forward(q, k, plans[name])     # this step's forward, with its side output
        for name, p in (("fresh", fresh), *plans.items(), ("frozen", first)):
            out[name].append(np.asarray(recall(q, k, p, jnp.asarray(rows)), np.float64))
    return {name: np.stack(v) for name, v in out.items()}
