"""How good are tile-sized clusters? The same tile selection on three token orders, compared.

* "tile_kmeans": `semantic_plan`'s clusters of exactly one tile;
* "cut_kmeans": ordinary k-means (as many clusters as tiles), tokens sorted by label, cut into
  tiles (a big cluster spills into the next tile, small ones share one);
* "token_order": no clustering, the tiles as the sequence lies (a pooled block estimate, as
  block-sparse methods without a reorder make).

Each is scored at the same budget (the same key tiles per query tile, so the same computed pairs
up to the short last tiles) by recall, the share of the dense softmax mass inside the computed
pairs averaged over sampled queries (`semantic.plan_recall`), and by the k-means objective of
its tiles (`semantic_clusters.tile_objective`). Arrays in, a dict of NumPy figures out: for a
notebook's table.
"""
from __future__ import annotations

import numpy as np

from svg_lib.layers.semantic import check_qk, computed_fraction, plan_from_orders, plan_recall, tile_budget
from svg_lib.layers.semantic_clusters import DEFAULT_ROUNDS, cut_kmeans_order, tile_kmeans, tile_objective

ORDERS = ("tile_kmeans", "cut_kmeans", "token_order")


def _orders(x, block: int, iterations: int, rounds: int):
    """{name: int32 `[heads, tokens]`} for `x` `[heads, tokens, d]`, one per entry of ORDERS."""
    import jax
    import jax.numpy as jnp

    tile = jax.jit(jax.vmap(lambda h: tile_kmeans(h, block, iterations=iterations, rounds=rounds)[0]))
    cut = jax.jit(jax.vmap(lambda h: cut_kmeans_order(h, block, iterations=iterations)))
    ident = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
    return {"tile_kmeans": tile(x), "cut_kmeans": cut(x), "token_order": ident}


def compare_orders(q, k, *, block_q: int, block_kv: int, density: float, rows, iterations: int = 10,
                   rounds: int = DEFAULT_ROUNDS) -> dict:
    """{order: {"recall", "computed", "tiles", "objective_q", "objective_k"}}, each a float64 `[heads]` array.

    q, k `[heads, tokens, head_dim]`; `rows` int `[rows]`, the query indices recall averages over.
    Every order keeps `round(density * nk)` key tiles per query tile, by the centroid scores of its
    own tiles; "tiles" counts the computed tiles (equal for every order), "computed" is the share of
pairs computed (it differs only by which orders' short last tiles were chosen), "objective_*" the mean squared distance
    of a token to its tile's mean.
    """
    import jax

    heads, tokens, _ = check_qk(q, k)
    steps = tile_budget(density, -(-tokens // block_kv))
    q_orders, k_orders = _orders(q, block_q, iterations, rounds), _orders(k, block_kv, iterations, rounds)
    objective = jax.vmap(tile_objective, in_axes=(0, 0, None))
    out = {}
    for name in ORDERS:
        plan = plan_from_orders(q, k, q_orders[name], k_orders[name], block_q=block_q, block_kv=block_kv,
                                steps=steps)
        out[name] = {"recall": plan_recall(q, k, plan, rows), "computed": computed_fraction(plan),
                     "tiles": plan.tiles.sum(axis=(1, 2)),
                     "objective_q": objective(q, q_orders[name], block_q),
                     "objective_k": objective(k, k_orders[name], block_kv)}
    return {name: {key: np.asarray(value, np.float64) for key, value in figures.items()}
            for name, figures in out.items()}
