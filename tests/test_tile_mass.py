"""The B3 forward's tile-mass side output (extensions.observed, beside kernels.forward) and the next
step's tiles chosen from it (layers.next_plan), in interpret mode at small sizes: 2 heads, 500 and
512 tokens, 128-token tiles."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib.core.planner import EMPTY, schedule_entry
from svg_lib.extensions.device_plan import device_tables
from svg_lib.kernels.forward import block_sparse_attention
from svg_lib.methods import METHODS
from svg_lib.extensions.observed import observed_block_sparse_attention
from svg_lib.layers.next_plan import next_plan, next_tiles, plan_tile_mass, tile_masses
from svg_lib.layers.semantic import semantic_plan

BLOCK = 128
HEADS = 2


def _tiles(tokens, steps, seed):
    """A random selection, at most `steps` key tiles per query tile, query tile 1 of head 0 empty."""
    n = -(-tokens // BLOCK)
    rng = np.random.default_rng(seed)
    tiles = np.zeros((HEADS, n, n), bool)
    for h in range(HEADS):
        for i in range(n):
            if (h, i) != (0, 1):
                tiles[h, i, rng.choice(n, size=rng.integers(1, steps + 1), replace=False)] = True
    return tiles


def _qkv(tokens, scale, seed=0, head_dim=64):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((HEADS, tokens, head_dim)) for _ in range(3))
    return (jnp.asarray(q * scale, jnp.float32), jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32))


def _run(q, k, v, schedule, steps, tile_mass, tokens, interpret=True):
    """Head by head (one schedule each): (out, lse[, masses]) stacked over the heads."""
    outs = []
    for h in range(HEADS):
        common = dict(steps=steps, method=METHODS["b3"], keep=lambda qi, ki: ki < tokens, block_q=BLOCK, block_kv=BLOCK,
                      block_kv_compute=BLOCK, interpret=interpret, residuals=True)
        args = (q[h:h + 1], k[h:h + 1], v[h:h + 1], jnp.zeros((1,), jnp.int32), schedule[h])
        outs.append(observed_block_sparse_attention(*args, **common) if tile_mass
                    else block_sparse_attention(*args, **common))
    return [np.concatenate([np.asarray(o[j]) for o in outs]) for j in range(len(outs[0]))]


def _reference(q, k, schedule, steps, tokens):
    """float64 [heads, nq * steps]: per step, the mean over the query tile's rows of the share of each
    row's softmax (over the keys its tile computes) that falls in the step's key tile; 0 at idle steps."""
    n = -(-tokens // BLOCK)
    out = np.zeros((HEADS, n * steps))
    for h in range(HEADS):
        qh, kh, sched = np.asarray(q[h], np.float64), np.asarray(k[h], np.float64), np.asarray(schedule[h])
        for i in range(n):
            entries = [schedule_entry(sched, i * steps + s) for s in range(steps)]
            cols = [(s, j) for s, (j, c) in enumerate(entries) if c != EMPTY]
            if not cols:
                continue
            spans = [np.arange(j * BLOCK, min((j + 1) * BLOCK, tokens)) for _, j in cols]
            scores = qh[i * BLOCK:(i + 1) * BLOCK] @ kh[np.concatenate(spans)].T
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            edges = np.cumsum([0] + [len(s) for s in spans])
            for (s, _), a, b in zip(cols, edges[:-1], edges[1:]):
                out[h, i * steps + s] = p[:, a:b].sum(axis=1).mean()
    return out


# scale 0.3: the bound's test passes (later steps bounded); 40: scores span more than its slack (running
# max throughout); "tpu": the interpreter that runs the code a TPU compiles (the lane shift at finish)
@pytest.mark.parametrize("tokens,scale,interpreter", [(512, 0.3, "cpu"), (500, 0.3, "cpu"), (500, 40.0, "cpu"),
                                                      (500, 0.3, "tpu")])
def test_tile_mass_matches_float64_and_output_is_unchanged(tokens, scale, interpreter):
    from jax.experimental.pallas import tpu as pltpu

    steps = 3
    interpret = True if interpreter == "cpu" else pltpu.InterpretParams()
    tiles = _tiles(tokens, steps, seed=tokens)
    tables = device_tables(jnp.asarray(tiles), tokens=tokens, block_kv=BLOCK, steps=steps)
    q, k, v = _qkv(tokens, scale)
    out, lse, masses = _run(q, k, v, tables.schedule, steps, True, tokens, interpret)
    plain_out, plain_lse = _run(q, k, v, tables.schedule, steps, False, tokens, interpret)
    np.testing.assert_array_equal(out, plain_out)        # bit-identical with the option on
    np.testing.assert_array_equal(lse, plain_lse)
    expect = _reference(q, k, tables.schedule, steps, tokens)
    assert masses.shape == (HEADS, -(-tokens // BLOCK) * steps) and masses.dtype == np.float32
    np.testing.assert_allclose(masses, expect, atol=2e-6)
    per_tile = masses.reshape(HEADS, -1, steps).sum(axis=-1)
    visits = tiles.any(axis=-1)
    np.testing.assert_allclose(per_tile[visits], 1.0, atol=1e-5)   # a query tile's masses sum to 1
    assert np.all(per_tile[~visits] == 0.0)                         # a query tile that visits nothing: zeros, no NaN
    assert expect.std() > 0.05                                      # the masses are not all alike


def test_nan_reaches_only_its_query_tile():
    tokens, steps = 512, 3
    tables = device_tables(jnp.asarray(_tiles(tokens, steps, seed=3)), tokens=tokens, block_kv=BLOCK, steps=steps)
    q, k, v = _qkv(tokens, 0.3)
    clean = _run(q, k, v, tables.schedule, steps, True, tokens)[2]
    with_nan_q = _run(q.at[1, 300].set(jnp.nan), k, v, tables.schedule, steps, True, tokens)[2]
    row = with_nan_q[1].reshape(-1, steps)
    assert np.isnan(row[2]).all()                                    # query 300 lies in query tile 2 of head 1
    np.testing.assert_array_equal(np.delete(row, 2, axis=0), np.delete(clean[1].reshape(-1, steps), 2, axis=0))
    np.testing.assert_array_equal(with_nan_q[0], clean[0])
    with_nan_v = _run(q, k, v.at[0, 5].set(jnp.nan), tables.schedule, steps, True, tokens)[2]
    np.testing.assert_array_equal(with_nan_v, clean)                 # v plays no part in the masses


def test_one_compile_runs_plans_that_change():
    """The same jitted forward (and the same jitted re-planning) serve two different plans: traced once."""
    tokens, steps = 512, 2
    q, k, v = _qkv(tokens, 0.3)
    traces = []

    @jax.jit
    def forward(q, k, v, schedule):
        traces.append(1)
        outs = [observed_block_sparse_attention(q[h:h + 1], k[h:h + 1], v[h:h + 1], jnp.zeros((1,), jnp.int32),
                                                schedule[h], steps=steps, method=METHODS["b3"], keep=lambda qi, ki: ki < tokens,
                                                block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, interpret=True)
                for h in range(HEADS)]
        return jnp.concatenate([m for _, m in outs])

    results = []
    for seed in (1, 2):
        tables = device_tables(jnp.asarray(_tiles(tokens, steps, seed)), tokens=tokens, block_kv=BLOCK, steps=steps)
        results.append((tables.schedule, np.asarray(forward(q, k, v, tables.schedule))))
    assert len(traces) == 1 and forward._cache_size() == 1
    assert not np.array_equal(results[0][1], results[1][1])
    for schedule, masses in results:
        np.testing.assert_allclose(masses, _reference(q, k, schedule, steps, tokens), atol=2e-6, rtol=1e-4)

    plan = semantic_plan(q, k, block_q=BLOCK, block_kv=BLOCK, density=0.5, iterations=2)
    replans = []

    @jax.jit
    def replan(masses, schedule, q, k, plan):
        replans.append(1)
        return next_plan(masses, schedule, q, k, plan)

    for step in range(3):
        _, masses, schedule = plan_tile_mass(q, k, v, plan, interpret=True)
        plan = replan(masses, schedule, q + 0.1 * step, k, plan)
    assert len(replans) == 1 and replan._cache_size() == 1


def test_tile_masses_lay_the_side_output_on_the_grid():
    tokens, steps = 512, 3
    tiles = _tiles(tokens, steps, seed=5)
    tables = device_tables(jnp.asarray(tiles), tokens=tokens, block_kv=BLOCK, steps=steps)
    n = tiles.shape[1]
    masses = jnp.arange(1, HEADS * n * steps + 1, dtype=jnp.float32).reshape(HEADS, n * steps)
    mass, visited = tile_masses(masses, tables.schedule, (n, n), steps)
    np.testing.assert_array_equal(np.asarray(visited), tiles)
    expect = np.zeros(tiles.shape, np.float32)
    for h in range(HEADS):
        for i in range(n):
            for s in range(steps):
                j, c = schedule_entry(np.asarray(tables.schedule[h]), i * steps + s)
                if c != EMPTY:
                    expect[h, i, j] = masses[h, i * steps + s]
    np.testing.assert_array_equal(np.asarray(mass), expect)
    with pytest.raises(ValueError, match=r"masses must be \[heads, nq \* steps\]"):
        tile_masses(masses[:, :-1], tables.schedule, (n, n), steps)


def test_next_tiles_moves_from_a_light_tile_to_a_heavy_estimate():
    """A visited tile whose measured mass is 0 gives way to the unvisited tile the estimate ranks first;
    a visited tile with all the mass stays; NaN counts as not measured; the budget holds; pinned tiles stay."""
    tokens = 512
    q, k, _ = _qkv(tokens, 0.3)
    plan = semantic_plan(q, k, block_q=BLOCK, block_kv=BLOCK, density=0.5, iterations=2)   # 2 of 4 key tiles
    n = plan.grid[0]
    from svg_lib.layers.semantic import tile_means, tile_scores
    from svg_lib.layers.semantic_clusters import capacities
    estimate = np.asarray(jax.nn.softmax(tile_scores(tile_means(q, plan.q_place, BLOCK), tile_means(k, plan.k_place, BLOCK),
                                                     capacities(tokens, BLOCK)), axis=-1))
    visited = np.asarray(plan.tiles)
    mass = np.zeros(visited.shape, np.float32)
    # per row: all the measured mass on the visited tile the estimate likes least
    for h in range(HEADS):
        for i in range(n):
            vis = np.flatnonzero(visited[h, i])
            mass[h, i, vis[np.argmin(estimate[h, i, vis])]] = 1.0
    tiles = np.asarray(next_tiles(jnp.asarray(mass), jnp.asarray(visited), q, k, plan))
    assert (tiles.sum(-1) == plan.steps).all()
    for h in range(HEADS):
        for i in range(n):
            vis = np.flatnonzero(visited[h, i])
            kept = vis[np.argmin(estimate[h, i, vis])]
            others = np.flatnonzero(~visited[h, i])
            assert tiles[h, i, kept]                                    # the measured heavy tile stays
            assert tiles[h, i, others[np.argmax(estimate[h, i, others])]]  # the best unvisited estimate comes in
    nan_mass = np.where(visited, np.nan, 0.0).astype(np.float32)
    fallback = np.asarray(next_tiles(jnp.asarray(nan_mass), jnp.asarray(visited), q, k, plan))
    np.testing.assert_array_equal(fallback, np.asarray(next_tiles(jnp.zeros_like(mass), jnp.zeros(visited.shape, bool),
                                                                  q, k, plan)))
    pinned = np.zeros(n, bool)
    pinned[3] = True
    assert np.asarray(next_tiles(jnp.asarray(mass), jnp.asarray(visited), q, k, plan, pinned=pinned))[..., 3].all()


def test_skip_softmax_drops_only_tiles_far_below_the_running_max():
    """Skip-softmax (`skip_below`, off by default; `extensions.observed.skip_softmax_tile`): key tile 2 lies far below key tile 0 for every query.
    Visited after tile 0 it is skipped (mass exactly 0, output that of tile 0 alone); visited first (a
    query tile that sees it before any other) it is not; tile 1, about 8 below, is skipped at threshold 3,
    not at 24; a threshold no gap reaches changes nothing, bit for bit."""
    tokens, d, steps = 384, 64, 2
    rng = np.random.default_rng(7)
    u = rng.standard_normal(d) / np.sqrt(d)
    u /= np.linalg.norm(u)
    q = 0.2 * rng.standard_normal((1, tokens, d)) + 4.0 * u
    k = 0.2 * rng.standard_normal((1, tokens, d))
    k[0, :128] += 4.0 * u                     # tile 0: scores about +16
    k[0, 128:256] += 2.0 * u                  # tile 1: about +8, 8 below tile 0
    k[0, 256:] -= 4.0 * u                     # tile 2: scores about -16, 32 below tile 0
    v = rng.standard_normal((1, tokens, d))
    q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    tiles = np.zeros((1, 3, 3), bool)
    tiles[0, 0, [0, 2]] = True                # tile 0, then tile 2: skipped
    tiles[0, 1, [2]] = True                   # tile 2 alone: the running max starts there, not skipped
    tiles[0, 2, [0, 1]] = True
    schedule = device_tables(jnp.asarray(tiles), tokens=tokens, block_kv=BLOCK, steps=steps).schedule[0]

    def run(skip_below):
        return [np.asarray(x) for x in observed_block_sparse_attention(
            q, k, v, jnp.zeros((1,), jnp.int32), schedule, steps=steps, method=METHODS["b3"], keep=lambda qi, ki: ki < tokens,
            block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, interpret=True, skip_below=skip_below)]

    plain_out, plain_mass = run(None)
    never_out, never_mass = run(1e6)
    np.testing.assert_array_equal(never_out, plain_out)
    np.testing.assert_array_equal(never_mass, plain_mass)
    # query tile 0: key tiles 0, 2 (32 below); 1: key tile 2 alone; 2: key tiles 0, 1 (about 8 below)
    out, mass = run(24.0)
    np.testing.assert_array_equal(mass[0, [1, 3, 2]], [0.0, 1.0, 0.0])    # 32 below: skipped; first: not; idle
    np.testing.assert_allclose(mass[0, 4:], plain_mass[0, 4:], rtol=1e-6)  # 8 below: kept at 24
    assert plain_mass[0, 5] > 1e-5
    assert run(3.0)[1][0, 5] == 0.0                                         # and skipped at 3
    qf, kf, vf = (np.asarray(x[0], np.float64) for x in (q, k, v))
    s = qf[:128] @ kf[:128].T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out[0, :128], (p / p.sum(axis=1, keepdims=True)) @ vf[:128], atol=1e-5)
    np.testing.assert_array_equal(out[0, 128:], plain_out[0, 128:])   # nothing skipped there at 24
    with pytest.raises(ValueError, match="skip_below must be None or a number > 0"):
        run(0.0)
