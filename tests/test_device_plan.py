"""The device planner (svg_lib.extensions.device_plan) against the NumPy planner (svg_lib.core.planner).

A per-head tile selection is a `TileAlignedMask` per head in NumPy terms (whole tiles kept, nothing
else), so `plan_tiles` of that mask gives the tables the device planner must reproduce: the same
classes (FULL, PARTIAL only where key padding reaches in), the same packed schedule word for word,
forward and transposed, idle steps on the resident tile included.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, pack_schedule, plan_tiles, unpack_schedule
from svg_lib.extensions.device_plan import device_tables, tile_classes

# device_tables traced once per shape and budget (eager, op by op, it is ten times slower)
planned = jax.jit(device_tables, static_argnames=("tokens", "block_kv", "steps", "steps_t"))

# (tokens, block_q, block_kv): key padding in the last key tile, none, and padding in both axes
GRIDS = [(700, 128, 256), (512, 128, 128), (1000, 256, 128)]


def random_selection(seed, heads, nq, nk, density=0.4):
    """bool `[heads, nq, nk]` with the awkward rows planted: a head whose first rows select
    nothing (keyless rows before the first visiting row), a keyless row in the middle, a key tile
    no query tile selects, and a head that selects nothing at all."""
    rng = np.random.default_rng(seed)
    tiles = rng.random((heads, nq, nk)) < density
    tiles[0, :2] = False
    tiles[1, nq // 2] = False
    tiles[1, :, 0] = False
    tiles[-1] = False
    return tiles


def padded_rows(index, step_class, steps):
    """A NumPy plan's `[rows, s]` tables padded to `steps` steps the way `stack_schedules` pads a
    shorter plan: idle (EMPTY) steps first, on the row's first tile."""
    extra = steps - index.shape[1]
    return (np.concatenate([np.repeat(index[:, :1], extra, axis=1), index], axis=1),
            np.concatenate([np.full((index.shape[0], extra), EMPTY, step_class.dtype), step_class], axis=1))


def numpy_tables(tiles, tokens, block_q, block_kv, steps, steps_t):
    """Per head, the NumPy planner's (schedule, transposed schedule) padded to the given budgets."""
    out = []
    for kept in tiles:
        plan = plan_tiles(TileAlignedMask(tokens, block_q, block_kv, kept), block_q, block_kv)
        q_index, cls_t, _ = plan.transposed_tables
        out.append((pack_schedule(*padded_rows(plan.kv_index, plan.step_class, steps)),
                    pack_schedule(*padded_rows(q_index, cls_t, steps_t)), plan))
    return out


@pytest.mark.parametrize("tokens,block_q,block_kv", GRIDS)
def test_tables_equal_the_numpy_planners_at_its_own_step_count(tokens, block_q, block_kv):
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    tiles = random_selection(1, 3, nq, nk)
    plans = [plan_tiles(TileAlignedMask(tokens, block_q, block_kv, kept), block_q, block_kv) for kept in tiles]
    for h, plan in enumerate(plans):
        # one head at a time, at the NumPy plan's own steps: the very same words
        one = planned(jnp.asarray(tiles[h:h + 1]), tokens=tokens, block_kv=block_kv, steps=plan.steps,
                            steps_t=plan.tables.steps_t)
        np.testing.assert_array_equal(np.asarray(one.schedule[0]), plan.schedule)
        np.testing.assert_array_equal(np.asarray(one.schedule_t[0]), plan.tables.schedule_t)
        np.testing.assert_array_equal(np.asarray(one.num_steps[0]), plan.num_steps)
        assert not bool(one.overflow)


@pytest.mark.parametrize("tokens,block_q,block_kv", GRIDS)
def test_tables_under_jit_with_budgets_equal_the_padded_numpy_tables(tokens, block_q, block_kv):
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    tiles = random_selection(2, 3, nq, nk)
    tiles[:, :, -1] = False  # no row selects every key tile, so a budget above every row exists
    steps = int(tiles.sum(axis=2).max()) + 1  # idle steps at the end of every row
    build = jax.jit(lambda t: device_tables(t, tokens=tokens, block_kv=block_kv, steps=steps))
    got = build(jnp.asarray(tiles))
    assert got.grid == (nq, nk) and got.steps == steps and got.steps_t == nq
    for h, (schedule, schedule_t, plan) in enumerate(numpy_tables(tiles, tokens, block_q, block_kv, steps, nq)):
        np.testing.assert_array_equal(np.asarray(got.schedule[h]), schedule)
        np.testing.assert_array_equal(np.asarray(got.schedule_t[h]), schedule_t)
        # the classes the kernel reads back: FULL inside, PARTIAL only on key tiles holding padding
        _, cls = unpack_schedule(np.asarray(got.schedule[h]), nq, steps)
        assert set(np.unique(cls)) <= {EMPTY, FULL, PARTIAL}
        assert (cls == PARTIAL).sum() == plan.needs_mask.sum()
    assert not bool(got.overflow)


def test_padding_tiles_stay_partial_and_nothing_else_does():
    tiles = jnp.ones((1, 3, 3), bool).at[0, 1, 1].set(False)
    classes = np.asarray(tile_classes(tiles, 700, 256))[0]  # 700 keys: key tile 2 reaches past the end
    assert (classes[:, 2] == PARTIAL).all()
    assert classes[1, 1] == EMPTY and (np.delete(classes[:, :2].ravel(), 3) == FULL).all()
    assert (np.asarray(tile_classes(tiles, 768, 256)) != PARTIAL).all()  # whole tiles: no padding, no mask


def test_a_row_over_the_budget_is_reported():
    tiles = jnp.zeros((2, 2, 4), bool).at[1, 0, :3].set(True)
    assert bool(planned(tiles, tokens=512, block_kv=128, steps=3).overflow) is False
    assert bool(planned(tiles, tokens=512, block_kv=128, steps=2).overflow) is True


def test_tables_are_a_pytree_that_crosses_jit():
    tiles = jnp.asarray(random_selection(3, 2, 4, 4))
    tables = planned(tiles, tokens=512, block_kv=128, steps=4)
    leaves, treedef = jax.tree_util.tree_flatten(tables)
    assert len(leaves) == 5
    same = jax.jit(lambda t: t)(tables)
    assert same.steps == 4 and np.array_equal(np.asarray(same.schedule), np.asarray(tables.schedule))


@pytest.mark.parametrize("kwargs,match", [(dict(steps=0), "steps must be"), (dict(steps=5), r"steps must be an int in \[1, 4\]"),
                                          (dict(steps=2, steps_t=9), "steps_t must be")])
def test_bad_budgets_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        device_tables(jnp.zeros((1, 4, 4), bool), tokens=512, block_kv=128, **kwargs)
