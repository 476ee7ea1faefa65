"""Semantic tiles, the plan (svg_lib.layers.semantic_clusters, semantic): clusters of exactly one
tile, the tiles chosen from their centroids, what a plan computes. Attention over a plan:
tests/test_semantic.py.

360 tokens: 128 does not divide it, so the last query and key clusters are short.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import svg_lib
from svg_lib import VideoGeometry, structured_qkv
from svg_lib.layers.semantic import SemanticPlan, computed_fraction, plan_keep, plan_recall, select_tiles
from svg_lib.layers.semantic_quality import compare_orders, variable_clusters_on_tiles
from svg_lib.layers import semantic_clusters
from svg_lib.layers.semantic_clusters import (assign_with_capacity, capacities, cut_kmeans_order, inverse_order,
                                              member_means, places_of_labels, tile_kmeans, tile_objective)

GEOMETRY = VideoGeometry(3, 8, 15)            # 360 tokens
BLOCKS = dict(block_q=128, block_kv=128)      # 3 x 3 tiles, the last of each 104 tokens
DENSITY = 0.67                                # 2 key tiles per query tile
plan_jit = jax.jit(svg_lib.semantic_plan, static_argnames=("block_q", "block_kv", "density", "iterations", "geometry"))
# traced once per shape (eager, op by op, the k-means loops are several times slower)
kmeans_jit = jax.jit(tile_kmeans, static_argnames=("block", "iterations", "rounds"))
cut_jit = jax.jit(cut_kmeans_order, static_argnames=("block", "iterations"))


@pytest.fixture(scope="module")
def problem():
    q, k, v = structured_qkv(GEOMETRY, ["local3d", "temporal"], head_dim=64, seed=0)
    plan = plan_jit(q, k, density=DENSITY, iterations=3, **BLOCKS)
    return q, k, v, plan


# -- the clusters -------------------------------------------------------------------------------

def test_capacities_are_whole_tiles_and_a_short_last_one():
    assert capacities(360, 128).tolist() == [128, 128, 104]
    assert capacities(256, 128).tolist() == [128, 128]


def test_the_vector_forms_equal_their_gathers_and_scatters():
    # what the clustering does with sorts, one-hot compares and a matmul (a TPU runs those on
    # vectors), against the indexing NumPy would do
    rng = np.random.default_rng(3)
    orders = np.stack([rng.permutation(300) for _ in range(2)])
    want = np.zeros_like(orders)
    np.put_along_axis(want, orders, np.arange(300)[None, :], axis=1)
    assert np.array_equal(np.asarray(inverse_order(jnp.asarray(orders))), want)
    # the inverse of the sort by label, by counting: labels across several blocks of 128 tokens,
    # a label nobody has, and a label of all tokens
    for labels, clusters in ((rng.integers(0, 7, 300), 8), (rng.integers(0, 40, 1000), 40), (np.zeros(130), 1)):
        order = np.argsort(labels, kind="stable")
        place = np.asarray(places_of_labels(jnp.asarray(labels, jnp.int32), clusters))
        assert np.array_equal(order[place], np.arange(labels.size))

    # each cluster takes its askers of largest regret, never more than its room; with distinct
    # regrets and halvings enough, exactly the top room of them (ties wait for the next round)
    group = rng.integers(0, 5, 300).astype(np.int32)
    asked = jnp.asarray(group[None, :] == np.arange(5)[:, None])
    room = np.array([0, 3, 20, 70, 1000], np.int32)
    distinct = rng.permutation(300).astype(np.float32)
    for regret, halvings in ((distinct, 40), (distinct, 4), (rng.integers(0, 4, 300).astype(np.float32), 40)):
        taken = np.asarray(jax.jit(semantic_clusters._largest_within_room, static_argnums=3)(
            jnp.asarray(regret), asked, jnp.asarray(room), halvings))
        for g in range(5):
            members = np.flatnonzero(group == g)
            top = members[np.argsort(-regret[members], kind="stable")][:room[g]]
            got = np.flatnonzero(taken & (group == g))
            assert got.size <= room[g] and set(got) <= set(top)
            if regret is distinct and halvings == 40:
                assert set(got) == set(top)
            # whatever is taken is everything above the lowest regret taken
            if got.size:
                assert set(got) == set(members[regret[members] >= regret[got].min()])

    x = rng.standard_normal((300, 8)).astype(np.float32)
    label = rng.permutation(np.repeat(np.arange(3), [128, 128, 44])).astype(np.int32)
    means = np.asarray(member_means(jnp.asarray(x), jnp.asarray(label), np.array([128, 128, 44])))
    np.testing.assert_allclose(means, np.stack([x[label == j].mean(0) for j in range(3)]), rtol=1e-5, atol=1e-6)


def test_every_cluster_gets_exactly_its_capacity_even_when_all_tokens_want_the_same_one():
    sizes = capacities(360, 128)
    x = jnp.zeros((360, 8)).at[:, 0].set(jnp.linspace(0, 1, 360))
    centroids = jnp.zeros((3, 8)).at[:, 0].set(jnp.asarray([0.5, 10.0, 20.0]))  # every token nearest cluster 0
    # one round: cluster 0 takes 128 askers, the rest fill the free places in token order
    label = np.asarray(jax.jit(lambda x, c: assign_with_capacity(x, c, sizes, rounds=1))(x, centroids))
    assert np.bincount(label, minlength=3).tolist() == sizes.tolist()
    # cluster 0 took the 128 that would lose the most elsewhere: the smallest x, farthest from 10 and 20
    assert np.flatnonzero(label == 0).tolist() == list(range(128))
    # however few halvings find the thresholds, the capacities are exact (what they miss waits or fills)
    rng = np.random.default_rng(5)
    x, centroids = jnp.asarray(rng.standard_normal((360, 8))), jnp.asarray(rng.standard_normal((3, 8)))
    for halvings in (1, 3, 40):
        label = np.asarray(jax.jit(lambda x, c: assign_with_capacity(x, c, sizes, halvings=halvings))(x, centroids))
        assert np.bincount(label, minlength=3).tolist() == sizes.tolist()


def test_planted_tile_sized_clusters_are_recovered():
    # three well separated blobs of exactly 128, 128 and 104 tokens, shuffled; a cold start
    rng = np.random.default_rng(0)
    sizes = capacities(360, 128)
    truth = rng.permutation(np.repeat(np.arange(3), sizes))
    centers = rng.standard_normal((3, 16)) * 10
    x = jnp.asarray(centers[truth] + rng.standard_normal((360, 16)) * 0.1, jnp.float32)
    order, centroids = kmeans_jit(x, block=128, iterations=5)
    tiles = truth[np.asarray(order)]
    for t, (start, size) in enumerate(zip((0, 128, 256), sizes)):
        assert len(set(tiles[start:start + size])) == 1, f"tile {t} mixes planted clusters"
    assert sorted(np.asarray(order).tolist()) == list(range(360))


def test_tile_kmeans_tiles_are_tighter_than_token_order_and_no_looser_than_cut_kmeans(problem):
    q, k, _, _ = problem
    for x in (q[0], k[1]):
        order, _ = kmeans_jit(x, block=128, iterations=5)
        ours = float(tile_objective(x, order, 128))
        assert ours < float(tile_objective(x, jnp.arange(360), 128))
        assert ours <= 1.05 * float(tile_objective(x, cut_jit(x, block=128, iterations=5), 128))


def test_plan_shapes_orders_and_budget(problem):
    q, k, _, plan = problem
    assert isinstance(plan, SemanticPlan)
    assert plan.q_order.shape == plan.k_order.shape == (2, 360) and plan.tiles.shape == (2, 3, 3)
    for order, place in ((plan.q_order, plan.q_place), (plan.k_order, plan.k_place)):
        assert (np.sort(np.asarray(order), axis=1) == np.arange(360)).all()  # permutations
        assert (np.take_along_axis(np.asarray(order), np.asarray(place), axis=1) == np.arange(360)).all()  # inverses
    assert (np.asarray(plan.tiles).sum(axis=2) == 2).all()                 # the budget, every row
    assert plan.centroids.q.shape == (2, 3, 64) and plan.centroids.k.shape == (2, 3, 64)
    assert float(jnp.min(computed_fraction(plan))) > 0.5


def test_top_p_trims_each_row_within_the_budget():
    scores = jnp.log(jnp.asarray([[[0.7, 0.2, 0.05, 0.05], [0.25, 0.25, 0.25, 0.25]]]))
    tiles = np.asarray(select_tiles(scores, 3, top_p=0.8))
    assert tiles[0, 0].tolist() == [True, True, False, False]  # 0.7 then 0.2 reach 0.8
    assert tiles[0, 1].sum() == 3                                # uniform: the whole budget
    assert np.asarray(select_tiles(scores, 3)).sum(axis=2).tolist() == [[3, 3]]


def test_the_sink_is_computed_by_every_query_tile():
    geometry = VideoGeometry(4, 8, 12)  # 384 tokens, 96 per frame: one sink tile of 128
    q, k, _ = structured_qkv(geometry, ["local3d"], head_dim=32, seed=1)
    plan = plan_jit(q, k, density=0.34, iterations=2, geometry=geometry, **BLOCKS)
    assert np.asarray(plan.tiles)[0, :, 0].all()
    first_frame = set(range(96))
    assert first_frame <= set(np.asarray(plan.k_order)[0, :128].tolist())  # held in key tile 0
    keep = np.asarray(plan_keep(plan))[0]
    assert keep[:, :96].all()


def test_plan_recall_is_the_mass_inside_the_tiles(problem):
    q, k, _, plan = problem
    rows = np.arange(0, 360, 9)
    recall = np.asarray(plan_recall(q, k, plan, rows))
    # independently: float64 softmax rows, summed over the plan's kept keys
    keep = np.asarray(plan_keep(plan))[:, rows]
    s = np.einsum("hrd,hkd->hrk", np.asarray(q, np.float64)[:, rows], np.asarray(k, np.float64)) / 8.0
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(recall, (p * keep).sum(-1).mean(-1), rtol=1e-5)
    assert (recall > 0.5).all() and (recall < 1.0).all()



# -- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(density=0.0), r"density must be a number in \(0, 1\]"),
    (dict(density=1.5), r"density must be a number in \(0, 1\]"),
    (dict(block_q=100), "block_q must be a positive multiple of 128"),
    (dict(block_kv=200), "block_kv must be a positive multiple of 128"),
    (dict(iterations=-1), "iterations must be an int >= 0"),
    (dict(rounds=0), "rounds must be an int >= 1"),
    (dict(halvings=0), "halvings must be an int >= 1"),
])
def test_bad_plan_arguments_are_refused(problem, kwargs, match):
    q, k, _, _ = problem
    args = dict(BLOCKS, density=0.5, iterations=1) | kwargs
    with pytest.raises(ValueError, match=match):
        svg_lib.semantic_plan(q, k, **args)


def test_orders_are_compared_at_equal_computed_pairs(problem):
    q, k, _, _ = problem
    figures = compare_orders(q, k, density=DENSITY, rows=np.arange(0, 360, 12), iterations=3, **BLOCKS)
    assert set(figures) == {"tile_kmeans", "cut_kmeans", "token_order"}
    tiles = [f["tiles"] for f in figures.values()]
    assert all(np.array_equal(t, [6, 6]) for t in tiles)  # the same budget for every order: 3 rows x 2
    for f in figures.values():
        assert ((0 < f["recall"]) & (f["recall"] <= 1)).all()
    # tile-sized clusters make tighter tiles than the sequence's own order, for q and for k
    for key in ("objective_q", "objective_k"):
        assert (figures["tile_kmeans"][key] < figures["token_order"][key]).all()


def test_variable_clusters_on_fixed_tiles_compute_a_superset_of_their_pairs(problem):
    q, k, _, _ = problem
    figures = variable_clusters_on_tiles(q, k, q_clusters=6, k_clusters=12, density=0.2,
                                         rows=np.arange(0, 360, 12), iterations=3, **BLOCKS)
    # every selected cluster pair lies inside the tiles it touches: more computed, more recall
    assert (figures["selected"] > 0.1).all() and (figures["selected"] < 0.35).all()
    assert (figures["computed"] >= figures["selected"]).all() and (figures["waste"] > 1).all()
    assert (figures["recall_tiles"] >= figures["recall_clusters"] - 1e-6).all()


@pytest.mark.parametrize("tokens,block_q,block_kv,density", [(100, 128, 128, 1.0), (300, 256, 128, 0.34),
                                                              (300, 128, 256, 1.0)])
def test_plans_at_edge_sizes(tokens, block_q, block_kv, density):
    # fewer tokens than one tile, unequal blocks, every tile: the shapes and the budget still hold
    rng = np.random.default_rng(tokens)
    q, k = (jnp.asarray(rng.standard_normal((1, tokens, 16)), jnp.float32) for _ in range(2))
    plan = plan_jit(q, k, block_q=block_q, block_kv=block_kv, density=density, iterations=0)
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    assert plan.tiles.shape == (1, nq, nk)
    assert (np.asarray(plan.tiles).sum(axis=2) == max(1, round(density * nk))).all()
    assert (np.sort(np.asarray(plan.q_order)) == np.arange(tokens)).all()
    if density == 1.0:
        assert float(computed_fraction(plan)[0]) == 1.0


def test_a_sink_wider_than_the_budget_is_refused():
    geometry = VideoGeometry(4, 16, 16)  # 256 tokens per frame: two key tiles of sink; 8 key tiles in all
    q, k, _ = structured_qkv(geometry, ["local3d"], head_dim=16, seed=2)
    with pytest.raises(ValueError, match="first frame's keys fill 2 key tiles, more than the 1"):
        svg_lib.semantic_plan(q, k, density=0.125, iterations=1, geometry=geometry, **BLOCKS)
