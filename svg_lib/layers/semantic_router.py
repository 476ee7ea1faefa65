"""A router per head between SVG's bands and semantic tiles, by recall on sampled queries.

Heads whose attention follows position are served best by SVG's band (spatial, or temporal after
the temporal-major permutation); heads whose attention follows content, by semantic tiles. Each
of the three is a *plan* in the same form (`semantic.SemanticPlan`): token orders and a tile
selection. The band's plan is static (B3's tile-aligned band, identity order for a spatial head,
the temporal-major permutation for a temporal one); the semantic plan is made on the device. So
a router only picks, per head, which plan's rows to take (`jnp.where` over the head axis), and
one `semantic_attention` runs every head whatever it chose: a head changing its choice is new
data, never a new program.

The choice is SVG's profiling made tile-aligned: for a few sampled query rows, the share of each
head's dense softmax mass that falls inside each candidate's computed pairs (`plan_recall`); the
head takes the candidate with the highest. Candidates should be compared at equal computed pairs:
give the band mask and the semantic plan the same density.

Positional heads have more candidates than SVG's two bands: the six axis orders of the video's
(frame, height, width) grid, each with a static band of tiles chosen from the head's own sampled
rows (`axis_orders`). `route_orders` adds them and prices the choice: each candidate comes with a
cost (the attention's cycles by the cost model plus its permutation's, computed by the caller,
`instruments.tools.axis_order_cost`), and each head takes the cheapest candidate whose recall is
within `tolerance` of its best (`cheapest_near_best`). So no candidate at least as recalling as
the chosen one is cheaper.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import temporal_major_permutation
from svg_lib.core.svg_masks import SVGMask
from svg_lib.layers.axis_orders import AXIS_ORDERS, check_order, order_plan, order_tiles
from svg_lib.layers.semantic import SemanticPlan, check_density, plan_recall, tile_budget

CANDIDATES = ("spatial", "temporal", "semantic")  # choice codes 0, 1, 2


def band_plans(mask: SVGMask, plan: SemanticPlan) -> tuple[SemanticPlan, SemanticPlan]:
    """The spatial and temporal band as plans of `plan`'s heads, blocks and centroids.

    Both compute B3's tile-aligned band (`mask.tile_aligned(block_q, block_kv)`) in their own
    order: frame-major for the spatial head, temporal-major for the temporal one (the permutation
    `routing.svg_attention` applies). Their `steps` is the band's longest row."""
    import jax.numpy as jnp

    if not isinstance(mask, SVGMask) or type(mask) is not SVGMask:
        raise TypeError(f"the router's band is the spatial SVGMask (SVGMask.spatial(geometry, density)), "
                        f"got {type(mask).__name__}")
    heads, tokens = plan.q_order.shape
    if mask.tokens != tokens:
        raise ValueError(f"the mask covers {mask.tokens} tokens but the plan {tokens}")
    kept = mask.tile_aligned(plan.block_q, plan.block_kv).kept               # [nq, nk] NumPy
    steps = max(int(kept.sum(axis=1).max()), 1)
    tiles = jnp.broadcast_to(jnp.asarray(kept), (heads,) + kept.shape)
    plans = []
    for order in (np.arange(tokens), temporal_major_permutation(mask.geometry)):
        rows, places = (jnp.broadcast_to(jnp.asarray(o, jnp.int32), (heads, tokens))
                        for o in (order, np.argsort(order)))
        plans.append(SemanticPlan(rows, rows, places, places, tiles, plan.centroids, plan.block_q, plan.block_kv,
                                  steps))
    return plans[0], plans[1]


def band_density(mask: SVGMask, block_q: int, block_kv: int) -> float:
    """The share of all pairs B3's tile-aligned band computes: give `semantic_plan` this density so
    that the candidates are compared at equal computed pairs (the band's own density counts the
    exact mask, before rounding; its first-frame sink adds more)."""
    rounded = mask.tile_aligned(block_q, block_kv)
    return rounded.pair_count / float(mask.tokens) ** 2


def candidate_recalls(q, k, plan: SemanticPlan, mask: SVGMask, rows):
    """f32 `[heads, 3]`: each head's recall (`plan_recall`) under the spatial band, the temporal
    band and the semantic plan, averaged over the query `rows` (int `[rows]`, original order)."""
    import jax.numpy as jnp

    spatial, temporal = band_plans(mask, plan)
    return jnp.stack([plan_recall(q, k, p, rows) for p in (spatial, temporal, plan)], axis=1)


def routed_plan(plan: SemanticPlan, mask: SVGMask, choice) -> SemanticPlan:
    """The plan each head runs: row h of the spatial band's, the temporal band's or `plan`'s, as
    `choice[h]` says (int `[heads]`, 0 / 1 / 2 = CANDIDATES; may be traced). Its `steps` is the
    larger budget of the two kinds, so every choice fits the same program."""
    import jax.numpy as jnp

    spatial, temporal = band_plans(mask, plan)
    choice = jnp.asarray(choice)

    def pick(*rows):  # per head, the chosen candidate's rows
        sel = choice.reshape((-1,) + (1,) * (rows[0].ndim - 1))
        return jnp.where(sel == 2, rows[2], jnp.where(sel == 1, rows[1], rows[0]))

    return SemanticPlan(*(pick(getattr(spatial, f), getattr(temporal, f), getattr(plan, f))
                          for f in ("q_order", "k_order", "q_place", "k_place")),
                        pick(spatial.tiles, temporal.tiles, plan.tiles), plan.centroids, plan.block_q,
                        plan.block_kv, max(spatial.steps, plan.steps))


def route(q, k, plan: SemanticPlan, mask: SVGMask, rows):
    """`(routed plan, choice int32 [heads], recalls f32 [heads, 3])`: each head takes the candidate
    of highest recall on the sampled `rows` (`candidate_recalls`); traceable, static shapes."""
    import jax.numpy as jnp

    recalls = candidate_recalls(q, k, plan, mask, rows)
    choice = jnp.argmax(recalls, axis=1).astype(jnp.int32)
    return routed_plan(plan, mask, choice), choice, recalls


# -- with the six axis orders, priced --------------------------------------------------------

def order_candidates(orders=AXIS_ORDERS) -> tuple[str, ...]:
    """The candidates' names in `route_orders`' code order: CANDIDATES, then "order:<order>" per order."""
    return CANDIDATES + tuple(f"order:{check_order(o)}" for o in orders)


def candidate_plans(q, k, plan: SemanticPlan, mask: SVGMask, rows, *, density: float, orders=AXIS_ORDERS):
    """`[spatial band, temporal band, plan, *one plan per order]`: each axis order with its static tiles
    chosen from the sampled `rows` at `density` (`axis_orders.order_tiles`; q, k `[heads, tokens,
    head_dim]`, frame-major, on `mask.geometry`'s grid), all at `plan`'s blocks."""
    spatial, temporal = band_plans(mask, plan)
    nk = -(-plan.tokens // plan.block_kv)
    steps = tile_budget(check_density(density), nk)
    extra = [order_plan(order_tiles(q, k, mask.geometry, o, rows, density=density, block_q=plan.block_q,
                                    block_kv=plan.block_kv), mask.geometry, o, block_q=plan.block_q,
                        block_kv=plan.block_kv, centroids=plan.centroids, steps=steps) for o in orders]
    return [spatial, temporal, plan] + extra


def pick_plan(plans, choice) -> SemanticPlan:
    """The plan each head runs: head h takes row h of `plans[choice[h]]` (int `[heads]`, may be traced).
    Its `steps` is the largest of the plans', so every choice fits one program."""
    import jax.numpy as jnp

    choice = jnp.asarray(choice)

    def pick(rows):
        sel = choice.reshape((-1,) + (1,) * (rows[0].ndim - 1))
        out = rows[0]
        for i, r in enumerate(rows[1:], start=1):
            out = jnp.where(sel == i, r, out)
        return out

    first = plans[0]
    fields = [pick([getattr(p, f) for p in plans]) for f in ("q_order", "k_order", "q_place", "k_place", "tiles")]
    return SemanticPlan(*fields, plans[2].centroids if len(plans) > 2 else first.centroids, first.block_q,
                        first.block_kv, max(p.steps for p in plans))


def cheapest_near_best(recalls, costs, tolerance: float = 0.0):
    """int32 `[heads]`: per head, the cheapest candidate among those whose recall is within `tolerance`
    of the head's best (equal costs: the higher recall, then the first). recalls f32 `[heads, candidates]`; costs `[candidates]` or
    `[heads, candidates]` (any unit, lower is better). Any candidate recalling at least as much as the
    chosen one costs at least as much. Traceable."""
    import jax.numpy as jnp

    recalls = jnp.asarray(recalls)
    costs = jnp.broadcast_to(jnp.asarray(costs, jnp.float32), recalls.shape)
    if not 0.0 <= float(tolerance) < 1.0:
        raise ValueError(f"tolerance is a recall margin in [0, 1), got {tolerance!r}")
    near = recalls >= recalls.max(axis=1, keepdims=True) - tolerance
    cheapest = jnp.where(near, costs, jnp.inf).min(axis=1, keepdims=True)
    # among the cheapest of those (equal costs), the one of highest recall
    return jnp.argmax(jnp.where(near & (costs == cheapest), recalls, -jnp.inf), axis=1).astype(jnp.int32)


def route_orders(q, k, plan: SemanticPlan, mask: SVGMask, rows, costs, *, density: float, orders=AXIS_ORDERS,
                 tolerance: float = 0.0):
    """`(routed plan, choice int32 [heads], recalls f32 [heads, candidates])` over SVG's bands, semantic
    tiles and the axis orders (`candidate_plans`, codes as `order_candidates(orders)`): each head takes
    the cheapest candidate within `tolerance` of its best recall on the sampled `rows`
    (`cheapest_near_best`). `costs`: `[candidates]` or `[heads, candidates]`."""
    import jax.numpy as jnp

    plans = candidate_plans(q, k, plan, mask, rows, density=density, orders=orders)
    costs = jnp.asarray(costs, jnp.float32)
    if costs.shape[-1] != len(plans):
        raise ValueError(f"costs must give one cost per candidate ({len(plans)}: {', '.join(order_candidates(orders))}), "
                         f"got shape {tuple(costs.shape)}")
    recalls = jnp.stack([plan_recall(q, k, p, rows) for p in plans], axis=1)
    choice = cheapest_near_best(recalls, costs, tolerance)
    return pick_plan(plans, choice), choice, recalls
