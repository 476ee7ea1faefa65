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
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import temporal_major_permutation
from svg_lib.core.svg_masks import SVGMask
from svg_lib.layers.semantic import SemanticPlan, plan_recall

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
