"""The tile planner on the device: a per-head selection of tiles -> the kernels' tables, in jnp.

`core.planner` turns a *mask* into tables once, in NumPy, when a kernel is built. A mask computed
from the content (semantic tiles: `svg_lib.layers.semantic`) changes at every denoising step and
lives on the device, so its tables must be made there too, inside `jax.jit`: static shapes, no
host round trip. The input is already tile-level, a bool `[heads, nq, nk]` selection of (query
tile, key tile) pairs, so there are no pair counts to take: a selected tile is FULL, except that a
tile whose key tile reaches past the last token stays PARTIAL (its padded keys must be masked,
B3's padding-only mask), and an unselected tile is EMPTY.

What differs from the NumPy planner is only where the step count comes from. There it is the
longest row of the plan; here it must be known when tracing, so it is a budget the caller states
(`steps`, `steps_t`), and every row is padded to it with idle steps first, on its first tile, exactly
as `stacked_schedules.stack_schedules` pads a shorter plan. For a selection whose longest row equals the
budget the tables are the NumPy planner's, word for word (tests/test_device_plan.py checks it
against `plan_tiles(TileAlignedMask(...))`). A row that selects more tiles than the budget cannot
raise inside jit: its extra tiles are dropped and `DeviceTables.overflow` says so (the semantic
selection never asks for more than its budget, by construction).

The tables are per head (`schedule[h]` is head h's `TilePlan.schedule`). The B3 kernels read one
head's tables at a time (`layers.semantic` runs them head by head); see there for why.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from svg_lib.core.planner import CLASS_BITS, EMPTY, FULL, MAX_KV_TILES, PARTIAL, STEP_BITS


@dataclasses.dataclass(frozen=True)
class DeviceTables:
    """The tables of a per-head tile selection, made on the device (a pytree: crosses `jax.jit`).

    Shapes: `nq`, `nk` query and key tiles (`grid`), `steps` and `steps_t` the static budgets.
    `schedule` int32 `[heads, ceil(nq * steps / 2)]`: head h's forward schedule, packed like
    `planner.pack_schedule` (per query tile, the key tiles to visit). `schedule_t` int32
    `[heads, ceil(nk * steps_t / 2)]`: the transposed schedule the backward walks (per key tile,
    the query tiles that visit it). `num_steps` int32 `[heads, nq]`, `num_steps_t` int32
    `[heads, nk]`: real visits per row, before the budget cut them. `overflow` bool `[]`: some row
    selected more tiles than its budget (those tiles were dropped).
    """

    schedule: jax.Array
    schedule_t: jax.Array
    num_steps: jax.Array
    num_steps_t: jax.Array
    overflow: jax.Array
    grid: tuple[int, int] = dataclasses.field(metadata=dict(static=True))
    steps: int = dataclasses.field(metadata=dict(static=True))
    steps_t: int = dataclasses.field(metadata=dict(static=True))


jax.tree_util.register_dataclass(
    DeviceTables, data_fields=["schedule", "schedule_t", "num_steps", "num_steps_t", "overflow"],
    meta_fields=["grid", "steps", "steps_t"])


def tile_classes(tiles, tokens: int, block_kv: int):
    """int32 `[..., nq, nk]` classes of a bool tile selection: FULL where selected, PARTIAL where
    selected and the key tile reaches past `tokens` (its padded keys are masked), EMPTY elsewhere.

    Padded *query* rows need no mask (they are computed and thrown away), as in `core.planner`."""
    nk = tiles.shape[-1]
    kv_padded = (jnp.arange(1, nk + 1) * block_kv) > tokens  # [nk]
    return jnp.where(tiles, jnp.where(kv_padded, PARTIAL, FULL), EMPTY).astype(jnp.int32)


def schedule_rows(classes, steps: int):
    """`core.planner.schedule_rows` in jnp with a static step budget, for one `[rows, cols]` table.

    Returns `(index, step_class, num_steps)`: int32 `[rows, steps]` the column tile of each step,
    int32 `[rows, steps]` its class (EMPTY for idle steps), int32 `[rows]` the non-empty tiles of
    each row (may exceed `steps`: those past the budget are dropped). Each row starts with its idle
    steps, on its first tile, then lists its non-empty tiles in ascending order; a row that visits
    nothing idles on the tile already resident: the last tile of the nearest visiting row above
    (before the first visiting row, that row's first tile), so an idle step never issues a DMA.
    """
    rows, cols = classes.shape
    visited = classes != EMPTY
    num_steps = jnp.sum(visited, axis=1, dtype=jnp.int32)
    # each row's visited tiles in ascending order: a stable sort on "not visited"
    visits = jnp.argsort(~visited, axis=1, stable=True)[:, :steps].astype(jnp.int32)
    taken = jnp.minimum(num_steps, steps)
    last = jnp.take_along_axis(visits, jnp.maximum(taken - 1, 0)[:, None], axis=1)[:, 0]
    visit = jnp.arange(steps)[None, :] - (steps - taken)[:, None]  # which visit a step makes; < 0: idle
    order = jnp.take_along_axis(visits, jnp.maximum(visit, 0), axis=1)
    idle = visit < 0
    index = jnp.where(idle, _idle_tiles(visits[:, 0], last, taken > 0)[:, None], order)
    step_class = jnp.where(idle, EMPTY, jnp.take_along_axis(classes, order, axis=1))
    return index, step_class.astype(jnp.int32), num_steps


def _idle_tiles(first, last, has):
    """Each row's idle-step tile `[rows]`: its own first visited tile, or for a row with no visit the
    last tile of the nearest visiting row above, or before any visiting row the first visiting
    row's first tile (0 if no row visits anything). `has` bool `[rows]`: the row visits a tile."""
    rows = last.shape[0]
    above = jax.lax.cummax(jnp.where(has, jnp.arange(rows), -1), axis=0)  # nearest visiting row at or above
    first_row = jnp.argmax(has)
    resident = jnp.where(has, first, jnp.where(above >= 0, last[jnp.maximum(above, 0)], first[first_row]))
    return jnp.where(jnp.any(has), resident, 0).astype(jnp.int32)


def pack_schedule(index, step_class):
    """`core.planner.pack_schedule` in jnp: int32 `[ceil(rows * steps / 2)]` from two `[rows, steps]`
    tables; entry n = `index << CLASS_BITS | class`, in the low half of word n // 2 when n is even."""
    entries = ((index.astype(jnp.uint32) << CLASS_BITS) | step_class.astype(jnp.uint32)).reshape(-1)
    if entries.shape[0] % 2:
        entries = jnp.concatenate([entries, jnp.zeros((1,), jnp.uint32)])
    pairs = entries.reshape(-1, 2)  # (even, odd) entries; a reshape, not a strided slice (a gather in older jax)
    words = pairs[:, 0] | (pairs[:, 1] << STEP_BITS)
    return jax.lax.bitcast_convert_type(words, jnp.int32)  # a tile index past 2**13 sets the sign bit: as in NumPy


def check_budgets(grid, steps: int, steps_t: int) -> tuple[int, int]:
    """Validate the static budgets for a `(nq, nk)` tile grid: 1 <= steps <= nk, 1 <= steps_t <= nq
    (more steps than tiles never helps), and tile indices that fit a 16-bit schedule entry."""
    nq, nk = grid
    if max(nq, nk) > MAX_KV_TILES:
        raise ValueError(f"{max(nq, nk):,} tiles on one axis do not fit a {STEP_BITS}-bit schedule entry "
                         f"(at most {MAX_KV_TILES:,}); use larger blocks")
    for name, value, most, axis in (("steps", steps, nk, "key"), ("steps_t", steps_t, nq, "query")):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{name} must be an int in [1, {most}] (the {axis} tiles a row can visit), got {value!r}")
    return steps, steps_t


def device_tables(tiles, *, tokens: int, block_kv: int, steps: int, steps_t: int | None = None) -> DeviceTables:
    """The B3 kernels' tables of a per-head selection, computed with jnp (traceable under `jax.jit`).

    tiles: bool `[heads, nq, nk]`, the (query tile, key tile) pairs to compute. `tokens`: the real
    token count (key tiles reaching past it stay PARTIAL). `steps`: the forward's static budget of
    key tiles per query tile; `steps_t`: the backward's, of query tiles per key tile (default nq,
    which no selection can overflow: a key tile may be chosen by every query tile).
    """
    heads, nq, nk = tiles.shape
    steps_t = nq if steps_t is None else steps_t
    check_budgets((nq, nk), steps, steps_t)
    classes = tile_classes(tiles.astype(bool), tokens, block_kv)

    def one_head(c):
        index, cls, num = schedule_rows(c, steps)
        index_t, cls_t, num_t = schedule_rows(c.T, steps_t)
        return pack_schedule(index, cls), pack_schedule(index_t, cls_t), num, num_t

    schedule, schedule_t, num, num_t = jax.vmap(one_head)(classes)
    overflow = jnp.any(num > steps) | jnp.any(num_t > steps_t)
    return DeviceTables(schedule, schedule_t, num, num_t, overflow, (nq, nk), steps, steps_t)
