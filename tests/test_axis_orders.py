"""The six axis orders of the video grid (svg_lib.layers.axis_orders) and the priced router over them.

Exactness: attention through each order (q, k, v transposed in, B3 over the order's tiles, the
output transposed back) equals float64 attention under the same tiles mapped back to frame-major
order; a wrong inverse does not. The router (`semantic_router.route_orders`) on planted positional
heads never takes a candidate when another recalling at least as much costs less (cost model on
the committed v6e probes).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import svg_lib
from svg_lib import SVGMask, VideoGeometry, structured_qkv
from svg_lib.core.geometry import temporal_major_permutation
from svg_lib.extensions.references import attention_float64
from svg_lib.extensions.token_order import to_temporal_major
from svg_lib.extensions.tolerances import tolerance
from svg_lib.layers.axis_orders import (AXIS_ORDERS, axis_order_attention, check_order, from_axis_order,
                                        order_permutation, order_plan, order_tiles, to_axis_order, transpose_bytes)
from svg_lib.layers.semantic import plan_keep, tile_budget
from svg_lib.layers.semantic_router import (band_density, candidate_plans, cheapest_near_best, order_candidates,
                                            pick_plan, route_orders)
from svg_lib.instruments.tools.axis_order_cost import candidate_cycles, permutation_cycles
from svg_lib.instruments.tpu.cost import committed_tile_cost

GEOMETRY = VideoGeometry(4, 8, 16)  # 512 tokens: 4 x 4 tiles of 128
BLOCK = 128


def frame_major_keep(tiles, geometry, order, block_q, block_kv):
    """bool [tokens, tokens]: the pairs `tiles` (in `order`'s coordinates) computes, frame-major."""
    place = np.argsort(order_permutation(geometry, order))
    return np.asarray(tiles)[place[:, None] // block_q, place[None, :] // block_kv]


def test_orders_are_transposes_equal_to_their_gathers_and_undo():
    g = VideoGeometry(3, 4, 5, text_tokens=7)
    x = np.random.default_rng(0).standard_normal((2, g.tokens, 3)).astype(np.float32)
    seen = set()
    for order in AXIS_ORDERS:
        perm = order_permutation(g, order)
        assert sorted(perm) == list(range(g.tokens)) and (perm[g.video_tokens:] == np.arange(60, 67)).all()
        for xs in (x, jnp.asarray(x)):
            np.testing.assert_array_equal(np.asarray(to_axis_order(xs, g, order)), x[:, perm])
            np.testing.assert_array_equal(np.asarray(from_axis_order(to_axis_order(xs, g, order), g, order)), x)
        seen.add(tuple(perm))
    assert len(seen) == 6  # six different orders
    np.testing.assert_array_equal(order_permutation(g, "fhw"), np.arange(g.tokens))
    np.testing.assert_array_equal(order_permutation(g, "hwf"), temporal_major_permutation(g))
    np.testing.assert_array_equal(to_axis_order(x, g, "hwf"), to_temporal_major(x, g))
    assert transpose_bytes(g, "fhw", head_dim=128) == 0 and transpose_bytes(g, "wfh", head_dim=128) == 8 * 60 * 256
    with pytest.raises(ValueError, match="one of fhw"):
        check_order("ffw")


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(1)
    return [jnp.asarray(rng.standard_normal((2, GEOMETRY.tokens, 64)), jnp.float32) for _ in range(3)]


@pytest.mark.parametrize("order", AXIS_ORDERS)
def test_attention_through_each_order_equals_float64_under_the_mapped_mask(qkv, order):
    q, k, v = qkv
    rng = np.random.default_rng(AXIS_ORDERS.index(order))
    tiles = rng.random((2, 4, 4)) < 0.45
    tiles[:, np.arange(4), rng.integers(0, 4, 4)] = True  # every query tile keeps a key tile
    out = np.asarray(axis_order_attention(q, k, v, GEOMETRY, order, jnp.asarray(tiles), block_q=BLOCK,
                                          block_kv=BLOCK, interpret=True))
    for h in range(2):
        keep = frame_major_keep(tiles[h], GEOMETRY, order, BLOCK, BLOCK)
        want = attention_float64(q[h:h + 1], k[h:h + 1], v[h:h + 1], keep)
        np.testing.assert_allclose(out[h:h + 1], want, **tolerance("float32"))
        if order != "fhw":  # positive control: the right output, sent back by another order's inverse, is wrong
            wrong = AXIS_ORDERS[(AXIS_ORDERS.index(order) + 1) % 6]
            back = np.asarray(from_axis_order(to_axis_order(out[h:h + 1], GEOMETRY, order), GEOMETRY, wrong))
            assert np.abs(back - want).max() > 0.1
        # and the mask not mapped back (the order's tiles read as frame-major) is another attention
        if not (frame_major_keep(tiles[h], GEOMETRY, order, BLOCK, BLOCK)
                == frame_major_keep(tiles[h], GEOMETRY, "fhw", BLOCK, BLOCK)).all():
            unmapped = attention_float64(q[h:h + 1], k[h:h + 1], v[h:h + 1],
                                         frame_major_keep(tiles[h], GEOMETRY, "fhw", BLOCK, BLOCK))
            assert np.abs(out[h:h + 1] - unmapped).max() > 0.1


def test_order_tiles_keep_the_budget_and_their_plan_computes_the_mapped_mask():
    q, k, _ = structured_qkv(GEOMETRY, ["spatial", "temporal"], head_dim=64, seed=0)
    rows = np.arange(0, GEOMETRY.tokens, 16)
    for order in AXIS_ORDERS:
        tiles = np.asarray(order_tiles(q, k, GEOMETRY, order, rows, density=0.5, block_q=BLOCK, block_kv=BLOCK))
        assert (tiles.sum(axis=-1) == tile_budget(0.5, 4)).all()
        plan = order_plan(tiles, GEOMETRY, order, block_q=BLOCK, block_kv=BLOCK)
        keep = np.asarray(plan_keep(plan))
        for h in range(2):
            np.testing.assert_array_equal(keep[h], frame_major_keep(tiles[h], GEOMETRY, order, BLOCK, BLOCK))


# -- the router, priced --------------------------------------------------------------------

ROUTER_GEOMETRY = VideoGeometry(8, 16, 32)  # 4,096 tokens: 8 x 16 tiles of 512 x 256 (committed v6e probes)


def assert_never_dominated(choice, recalls, costs):
    """No candidate with recall >= the chosen one's costs less (per head)."""
    for h, c in enumerate(choice):
        at_least = recalls[h] >= recalls[h, c]
        assert costs[h, c] <= costs[h][at_least].min(), (h, c, recalls[h], costs[h])


@pytest.fixture(scope="module")
def routed_orders():
    g = ROUTER_GEOMETRY
    q, k, _ = structured_qkv(g, ["spatial", "temporal", "local3d"], head_dim=64, seed=0)
    mask = SVGMask.spatial(g, 0.2)
    density = band_density(mask, 512, 256)
    plan = jax.jit(svg_lib.semantic_plan, static_argnames=("block_q", "block_kv", "density", "iterations"))(
        q, k, block_q=512, block_kv=256, density=density, iterations=3)
    rows = np.arange(7, g.tokens, 61)
    cost = committed_tile_cost("v6e", 512, 256, 256)
    plans = candidate_plans(q, k, plan, mask, rows, density=density)
    costs = candidate_cycles(plans, order_candidates(), g, cost)
    return q, k, plan, mask, rows, density, costs


@pytest.mark.parametrize("tol", [0.0, 0.02, 0.2, 0.55])
def test_the_router_never_takes_a_candidate_that_a_cheaper_one_matches(routed_orders, tol):
    q, k, plan, mask, rows, density, costs = routed_orders
    _, choice, recalls = route_orders(q, k, plan, mask, rows, costs, density=density, tolerance=tol)
    choice, recalls = np.asarray(choice), np.asarray(recalls)
    assert recalls.shape == costs.shape == (3, 9)
    assert_never_dominated(choice, recalls, costs)
    assert (recalls[np.arange(3), choice] >= recalls.max(axis=1) - tol - 1e-7).all()
    if tol == 0.0:  # no margin: the highest recall
        assert (recalls[np.arange(3), choice] == recalls.max(axis=1)).all()


def test_the_priced_router_differs_from_recall_alone_and_the_check_catches_it(routed_orders):
    q, k, plan, mask, rows, density, costs = routed_orders
    # the frame-major order moves nothing; every other order pays its transpose
    names = order_candidates()
    assert costs[0, names.index("order:fhw")] < costs[0, names.index("order:hwf")]
    assert permutation_cycles("order:fhw", ROUTER_GEOMETRY) == 0 < permutation_cycles("temporal", ROUTER_GEOMETRY)
    _, choice, recalls = route_orders(q, k, plan, mask, rows, costs, density=density, tolerance=0.55)
    recalls, choice = np.asarray(recalls), np.asarray(choice)
    by_recall = recalls.argmax(axis=1)
    # at a wide margin (the temporal head's frame-major order recalls 0.42 of its best 0.96) some
    # head gives up recall for a cheaper candidate; the positive control:
    # a choice that took a dearer candidate of no more recall fails the property
    assert (choice != by_recall).any()
    h = int(np.flatnonzero(choice != by_recall)[0])
    assert costs[h, choice[h]] < costs[h, by_recall[h]] and recalls[h, choice[h]] < recalls[h, by_recall[h]]
    dominated = choice.copy()
    worse = np.flatnonzero((recalls[h] <= recalls[h, choice[h]]) & (costs[h] > costs[h, choice[h]]))
    if worse.size:
        dominated[h] = worse[0]
        with pytest.raises(AssertionError):
            assert_never_dominated(dominated, recalls, costs)
    # a synthetic case: equal recalls, the cheaper wins whatever its position
    r = np.array([[0.9, 0.9, 0.5]], np.float32)
    assert int(cheapest_near_best(r, np.array([3.0, 1.0, 0.0]))[0]) == 1
    # equal costs: the higher recall, never the first of them by position
    assert int(cheapest_near_best(np.array([[0.7, 0.9, 0.95]]), np.array([1.0, 1.0, 1.0]), 0.3)[0]) == 2
    with pytest.raises(AssertionError):
        assert_never_dominated(np.array([0]), r, np.array([[3.0, 1.0, 0.0]]))


def test_route_orders_refuses_costs_of_another_length(routed_orders):
    q, k, plan, mask, rows, density, costs = routed_orders
    with pytest.raises(ValueError, match="one cost per candidate"):
        route_orders(q, k, plan, mask, rows, costs[:, :3], density=density)


def test_each_head_runs_the_plan_it_chose(routed_orders):
    q, k, plan, mask, rows, density, costs = routed_orders
    plans = candidate_plans(q, k, plan, mask, rows, density=density)
    choice = np.array([3, 6, 2], np.int32)  # order fhw, order hwf, semantic tiles
    routed = jax.jit(lambda c: pick_plan(plans, c))(jnp.asarray(choice))
    keep = np.asarray(plan_keep(routed, rows))
    for h, c in enumerate(choice):
        np.testing.assert_array_equal(keep[h], np.asarray(plan_keep(plans[c], rows))[h])
    assert routed.steps == max(p.steps for p in plans)
    other = np.asarray(plan_keep(jax.jit(lambda c: pick_plan(plans, c))(jnp.asarray([6, 3, 2], jnp.int32)), rows))
    assert (other[0] != keep[0]).any()  # another choice is another mask
