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

`variable_clusters_on_tiles` measures the other side: SVG2's clusters (ordinary k-means, sizes as
they fall) on a kernel with fixed tiles, which computes every tile a chosen cluster pair touches.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.layers.semantic import check_qk, computed_fraction, plan_from_orders, plan_recall, tile_budget
from svg_lib.layers.semantic_clusters import (DEFAULT_ROUNDS, capacities, cut_kmeans_order, lloyd_kmeans, tile_kmeans,
                                              tile_objective)
from svg_lib.layers.semantic_router import CANDIDATES, band_density, candidate_recalls
from svg_lib.layers.synthetic import matching_density

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


# -- SVG2's variable clusters laid on fixed tiles ---------------------------------------------------

def variable_clusters_on_tiles(q, k, *, q_clusters: int, k_clusters: int, block_q: int, block_kv: int,
                               density: float, rows, iterations: int = 10) -> dict:
    """What SVG2's clusters cost on a kernel with fixed tiles: float64 `[heads]` figures.

    Per head: ordinary k-means of q (`q_clusters`) and k (`k_clusters`), tokens sorted by label,
    and for each query cluster the key clusters of highest centroid score (`semantic.tile_scores`'
    estimate, with the real cluster sizes) until they hold `density` of the keys. A variable-block
    kernel computes exactly those cluster pairs ("selected", share of all pairs; "recall_clusters");
    a fixed-tile kernel computes every `block_q` x `block_kv` tile that any of them touches
    ("computed"; "recall_tiles"). "waste" = computed / selected.
    """
    import jax
    import jax.numpy as jnp

    heads, tokens, head_dim = check_qk(q, k)
    rows = jnp.asarray(rows)
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)

    def one(qh, kh):
        lq, cq = lloyd_kmeans(qh, q_clusters, iterations=iterations)
        lk, ck = lloyd_kmeans(kh, k_clusters, iterations=iterations)
        size_q = jnp.zeros(q_clusters, jnp.float32).at[lq].add(1.0)
        size_k = jnp.zeros(k_clusters, jnp.float32).at[lk].add(1.0)
        score = (cq @ ck.T) / jnp.sqrt(float(head_dim)) + jnp.log(jnp.maximum(size_k, 1e-30))[None, :]
        score = jnp.where(size_k[None, :] > 0, score, -jnp.inf)
        # per query cluster: key clusters by score until they hold `density` of the keys
        order = jnp.argsort(-score, axis=1)
        held = jnp.cumsum(size_k[order], axis=1) - size_k[order]          # keys held before each
        chosen = held < density * tokens
        sel = jnp.zeros(score.shape, bool).at[jnp.arange(q_clusters)[:, None], order].set(chosen)
        sel = sel & (size_q[:, None] > 0) & (size_k[None, :] > 0)
        selected = jnp.sum(sel * size_q[:, None] * size_k[None, :]) / tokens ** 2
        # which tiles each cluster touches in sorted order: tile t holds positions [t*block, (t+1)*block)
        def touched(label, clusters, block, tiles):
            pos_tile = jnp.arange(tokens) // block                          # tile of each sorted position
            sorted_label = jnp.sort(label)
            return jnp.zeros((tiles, clusters), jnp.float32).at[pos_tile, sorted_label].max(1.0)
        tq, tk = touched(lq, q_clusters, block_q, nq), touched(lk, k_clusters, block_kv, nk)
        computed_tiles = (tq @ sel.astype(jnp.float32) @ tk.T) > 0           # [nq, nk]
        rows_q = jnp.asarray(capacities(tokens, block_q), jnp.float32)
        cols_k = jnp.asarray(capacities(tokens, block_kv), jnp.float32)
        computed = jnp.sum(computed_tiles * rows_q[:, None] * cols_k[None, :]) / tokens ** 2
        # recall: the sampled rows' softmax mass inside the selected pairs and inside the computed tiles
        p = jax.nn.softmax((qh[rows].astype(jnp.float32) @ kh.astype(jnp.float32).T) / jnp.sqrt(float(head_dim)))
        in_pairs = sel[lq[rows][:, None], lk[None, :]]
        pos_q = jnp.zeros(tokens, jnp.int32).at[jnp.argsort(lq, stable=True)].set(jnp.arange(tokens))
        pos_k = jnp.zeros(tokens, jnp.int32).at[jnp.argsort(lk, stable=True)].set(jnp.arange(tokens))
        in_tiles = computed_tiles[(pos_q[rows] // block_q)[:, None], (pos_k // block_kv)[None, :]]
        return (selected, computed, jnp.mean(jnp.sum(p * in_pairs, axis=1)), jnp.mean(jnp.sum(p * in_tiles, axis=1)))

    selected, computed, recall_c, recall_t = jax.jit(jax.vmap(one))(q, k)
    out = {"selected": selected, "computed": computed, "waste": computed / selected,
           "recall_clusters": recall_c, "recall_tiles": recall_t}
    return {key: np.asarray(value, np.float64) for key, value in out.items()}


# -- the recall table: every way of choosing tiles, at equal computed pairs, per head -----------

def svg2_clusters(tokens: int) -> tuple[int, int]:
    """SVG2's cluster counts scaled to `tokens`: its Wan scripts' 300 query and 1,000 key clusters at
    75,600 tokens (about 252 and 76 tokens per cluster), at least 2 each."""
    return max(2, round(tokens * 300 / 75_600)), max(2, round(tokens * 1000 / 75_600))


def recall_table(q, k, *, geometry: VideoGeometry, block_q: int, block_kv: int, density: float, rows,
                 route_rows=None, iterations: int = 10, rounds: int = DEFAULT_ROUNDS, svg2_clusters_=None,
                 names=None) -> list[dict]:
    """One row per head: recall (dense softmax mass inside the computed pairs, averaged over the
    query `rows`) of every way of choosing tiles, at the same share of computed pairs.

    q, k `[heads, tokens, head_dim]` frame-major over `geometry` (no text tokens). The budget:
    SVG's band (no first-frame sink) whose exact mask keeps `density` of the pairs
    (`synthetic.matching_density`), rounded to whole tiles as B3 does; its computed share
    ("computed") is then the density every other method gets, as key tiles per query tile.

    Columns: "band_spatial", "band_temporal" (B3's band in frame-major / temporal-major order),
    "best_band" (the better of the two), "tile_kmeans" (semantic tiles: clusters of exactly one
    tile, `iterations` from a cold start), "cut_kmeans" (ordinary k-means sorted and cut into tiles),
    "token_order" (tiles as the sequence lies), "svg2_ideal" and "svg2_tiles" (SVG2's variable
    clusters, `svg2_clusters(tokens)` or `svg2_clusters_` = (query, key) counts, keeping `density`
    of the keys per query cluster: on an ideal variable-block kernel, and laid on fixed tiles),
    "svg2_selected" / "svg2_computed" (their shares of pairs) and "svg2_waste" (computed / selected),
    "choice" and "routed" (the router's pick among spatial / temporal / semantic, decided on
    `route_rows`, other sampled queries, and that pick's recall on `rows`), "better" (the higher of
    best_band and tile_kmeans). `names`: a label per head ("head" column).
    """
    import jax.numpy as jnp

    heads, tokens, _ = check_qk(q, k)
    if not isinstance(geometry, VideoGeometry) or geometry.tokens != tokens or geometry.text_tokens:
        raise ValueError(f"geometry must be the VideoGeometry of the {tokens} video tokens (no text), got {geometry!r}")
    names = list(names) if names is not None else [str(h) for h in range(heads)]
    if len(names) != heads:
        raise ValueError(f"names must give one label per head ({heads}), got {len(names)}")
    rows = np.asarray(rows)
    route_rows = rows if route_rows is None else np.asarray(route_rows)
    mask = SVGMask.spatial(geometry, matching_density(geometry, density, first_frame_sink=False),
                           first_frame_sink=False)
    computed = band_density(mask, block_q, block_kv)
    steps = tile_budget(computed, -(-tokens // block_kv))
    q_orders, k_orders = _orders(q, block_q, iterations, rounds), _orders(k, block_kv, iterations, rounds)
    plans = {name: plan_from_orders(q, k, q_orders[name], k_orders[name], block_q=block_q, block_kv=block_kv,
                                    steps=steps) for name in ORDERS}
    recall = {name: np.asarray(plan_recall(q, k, plan, rows)) for name, plan in plans.items()}
    bands = np.asarray(candidate_recalls(q, k, plans["tile_kmeans"], mask, rows))           # [heads, 3]
    choice = np.asarray(jnp.argmax(candidate_recalls(q, k, plans["tile_kmeans"], mask, route_rows), axis=1))
    qc, kc = svg2_clusters(tokens) if svg2_clusters_ is None else svg2_clusters_
    svg2 = variable_clusters_on_tiles(q, k, q_clusters=qc, k_clusters=kc, block_q=block_q, block_kv=block_kv,
                                      density=computed, rows=rows, iterations=iterations)
    semantic_share = np.asarray(computed_fraction(plans["tile_kmeans"]))
    table = []
    for h in range(heads):
        best_band = float(max(bands[h, 0], bands[h, 1]))
        table.append({
            "head": names[h], "computed": float(computed), "semantic_computed": float(semantic_share[h]),
            "band_spatial": float(bands[h, 0]), "band_temporal": float(bands[h, 1]), "best_band": best_band,
            "tile_kmeans": float(recall["tile_kmeans"][h]), "cut_kmeans": float(recall["cut_kmeans"][h]),
            "token_order": float(recall["token_order"][h]),
            "svg2_ideal": float(svg2["recall_clusters"][h]), "svg2_tiles": float(svg2["recall_tiles"][h]),
            "svg2_selected": float(svg2["selected"][h]), "svg2_computed": float(svg2["computed"][h]),
            "svg2_waste": float(svg2["waste"][h]),
            "choice": CANDIDATES[int(choice[h])], "routed": float(bands[h, int(choice[h])]),
            "better": max(best_band, float(recall["tile_kmeans"][h]))})
    return table
