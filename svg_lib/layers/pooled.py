"""Pooled-estimate masks: each tile's mean q and mean k guess where the attention mass is.

The family of DraftAttention, SpargeAttn, XAttention and NABLA, made tile-aligned for B3. Per head,
in token order (no reordering, unlike semantic tiles):

1. mean-pool q over each query tile of `block_q` tokens and k over each key tile of `block_kv`;
2. score each (query tile, key tile) pair by the log of its estimated mass,
   mean_q . mean_k / sqrt(d) + log(key tile size) (`semantic.tile_scores`: what a query at its
   tile's mean would give the key tile if every key sat at that tile's mean);
3. per query tile keep the best key tiles under a pair budget: `round(density * nk)` key tiles
   (`semantic.tile_budget`), the top-k by score, or with `threshold` only the shortest prefix of
   them whose estimated share of the row's mass reaches it (NABLA's cumulative-mass rule);
   optionally OR-ed with a `window` (the key tiles within `window` tokens of the query tile, kept
   first and counted in the budget, as NABLA ORs its estimate with sliding tiles).

The selection is a bool `[heads, nq, nk]` tile table, made with jnp inside `jax.jit`; the device
planner (`extensions.device_plan.device_tables`) turns it into the B3 kernels' tables on the device
and the B3 forward runs it head by head (`semantic.head_by_head`). Nothing of size tokens^2 is
ever formed: the mask is the tile table, O(tiles) (`mask_bytes` counts it; at the case study's
75,600 tokens, 10 heads and 128 x 128 tiles it is a few MiB).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from svg_lib.core.masks import TileAlignedMask, check_block_size
from svg_lib.kernels.reference import check_qkv
from svg_lib.layers.semantic import b3_on_tiles, check_qk, tile_budget, tile_scores, top_tiles
from svg_lib.layers.semantic_clusters import capacities


@dataclasses.dataclass(frozen=True)
class PooledPlan:
    """Which tiles a pooled-estimate mask computes (a pytree: it crosses `jax.jit`).

    `tiles` bool `[heads, nq, nk]`, `nq = ceil(tokens / block_q)`, `nk = ceil(tokens / block_kv)`, in
    token order; at most `steps` per query tile. Static: `tokens`, `block_q`, `block_kv`, `steps`."""

    tiles: object
    tokens: int = dataclasses.field(metadata=dict(static=True))
    block_q: int = dataclasses.field(metadata=dict(static=True))
    block_kv: int = dataclasses.field(metadata=dict(static=True))
    steps: int = dataclasses.field(metadata=dict(static=True))


def _register():
    import jax
    jax.tree_util.register_dataclass(PooledPlan, data_fields=["tiles"],
                                     meta_fields=["tokens", "block_q", "block_kv", "steps"])


_register()


def pooled_means(x, block: int):
    """f32 `[heads, ceil(tokens / block), d]`: the mean of each tile of `block` tokens of x
    `[heads, tokens, d]` (the last tile averages its real tokens only)."""
    import jax.numpy as jnp

    heads, tokens, d = x.shape
    sizes = capacities(tokens, block)
    padded = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, len(sizes) * block - tokens), (0, 0)))
    return padded.reshape(heads, len(sizes), block, d).sum(axis=2) / jnp.asarray(sizes, jnp.float32)[None, :, None]


def window_tiles(tokens: int, block_q: int, block_kv: int, window: int) -> np.ndarray:
    """bool `[nq, nk]`: key tiles holding a key within `window` tokens of some query of the query tile."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be a non-negative int (tokens either side of a query tile), got {window!r}")
    q0 = np.arange(0, tokens, block_q)
    k0 = np.arange(0, tokens, block_kv)
    q1, k1 = np.minimum(q0 + block_q, tokens), np.minimum(k0 + block_kv, tokens)
    gap = np.maximum(k0[None, :] - q1[:, None] + 1, q0[:, None] - k1[None, :] + 1)  # nearest pair's distance
    return gap <= window


def _check_threshold(threshold):
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0.0 < threshold <= 1.0):
        raise ValueError(f"threshold must be None (top-k) or a number in (0, 1] (the share of each query tile's "
                         f"estimated mass to keep), got {threshold!r}")


def choose_tiles(scores, steps: int, *, threshold: float | None = None, pinned=None):
    """bool `[heads, nq, nk]` from log-mass scores f32 `[heads, nq, nk]`: per query tile, the pinned key
    tiles (bool `[nq, nk]` or None), then the best-scoring others, `steps` in all (top-k); with
    `threshold`, only as many of them as it takes for the estimated mass (the softmax of the row's
    scores) to reach `threshold` (the pinned tiles always, and always at least one tile)."""
    import jax
    import jax.numpy as jnp

    priority = scores if pinned is None else jnp.where(jnp.asarray(pinned)[None], jnp.inf, scores)
    return top_tiles(priority, jax.nn.softmax(scores, axis=-1), steps, threshold=threshold)


def pooled_plan(q, k, *, block_q: int, block_kv: int, density: float, threshold: float | None = None,
                window: int | None = None) -> PooledPlan:
    """The pooled-estimate mask of q, k `[heads, tokens, head_dim]`: a `PooledPlan`.

    Each query tile keeps at most `round(density * nk)` key tiles (the pair budget): the top-k by
    pooled score, or with `threshold` the shortest best-first prefix holding that share of the
    estimated mass; `window` (tokens, or None) pins the key tiles near the query tile first.
    Traceable: call it inside `jax.jit` (q, k traced; everything else static).
    """
    heads, tokens, head_dim = check_qk(q, k)
    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    _check_threshold(threshold)
    nk = -(-tokens // block_kv)
    steps = tile_budget(density, nk)
    pinned = None
    if window is not None:
        pinned = window_tiles(tokens, block_q, block_kv, window)
        if pinned.sum(axis=1).max() > steps:
            raise ValueError(f"a window of {window} tokens pins up to {pinned.sum(axis=1).max()} key tiles per query "
                             f"tile, more than the {steps} the density {density} allows; narrow the window or raise "
                             "the density")
    scores = tile_scores(pooled_means(q, block_q), pooled_means(k, block_kv), capacities(tokens, block_kv))
    return PooledPlan(choose_tiles(scores, steps, threshold=threshold, pinned=pinned), tokens, block_q, block_kv, steps)


def pooled_attention(q, k, v, plan: PooledPlan, *, block_kv_compute: int | None = None, interpret=None,
                     generation: str | None = None):
    """Attention over the plan's tiles: `[heads, tokens, head_dim]`, softmax scale 1/sqrt(head_dim).

    q, k, v `[heads, tokens, head_dim]` float32 or bfloat16; the B3 forward over the selected tiles,
    whose tables the device planner makes inside the same program. Runs inside `jax.jit`.
    `interpret`: None runs compiled on a TPU and in interpret mode elsewhere."""
    heads, tokens, head_dim = check_qkv(q, k, v)
    if str(q.dtype) not in ("float32", "bfloat16"):
        raise ValueError(f"q, k, v must be float32 or bfloat16 (the kernels' dtypes), got {q.dtype}")
    if not isinstance(plan, PooledPlan):
        raise TypeError(f"plan must be a PooledPlan (svg_lib.layers.pooled.pooled_plan), got {type(plan).__name__}")
    expect = (heads, -(-tokens // plan.block_q), -(-tokens // plan.block_kv))
    if plan.tokens != tokens or tuple(plan.tiles.shape) != expect:
        raise ValueError(f"the plan's tiles are shaped {tuple(plan.tiles.shape)} over {plan.tokens} tokens, but q, k, "
                         f"v of {heads} heads x {tokens} tokens need {expect}: was it made from other q and k?")
    fn = _built(heads, tokens, head_dim, str(q.dtype), plan.block_q, plan.block_kv, plan.steps, block_kv_compute,
                interpret, generation)
    return fn(q, k, v, plan.tiles)


@functools.lru_cache(maxsize=16)
def _built(heads, tokens, head_dim, dtype, block_q, block_kv, steps, block_kv_compute, interpret, generation):
    """The jitted `f(q, k, v, tiles)` of one configuration (forward only; cached)."""
    import jax

    f = b3_on_tiles(tokens, head_dim, dtype, block_q, block_kv, steps, block_kv_compute, interpret, None, generation)
    return jax.jit(f)


# -- what a plan computes, for checking and measuring ---------------------------------------------

def head_masks(plan: PooledPlan) -> list:
    """One `TileAlignedMask` per head (NumPy, on the host): the pairs each head's plan computes."""
    tiles = np.asarray(plan.tiles)
    return [TileAlignedMask(plan.tokens, plan.block_q, plan.block_kv, t) for t in tiles]


def computed_density(plan: PooledPlan):
    """float `[heads]`: the share of all tokens x tokens pairs each head computes (short tiles counted short)."""
    import jax.numpy as jnp

    rows = jnp.asarray(capacities(plan.tokens, plan.block_q), jnp.float32)
    cols = jnp.asarray(capacities(plan.tokens, plan.block_kv), jnp.float32)
    return jnp.einsum("hij,i,j->h", plan.tiles.astype(jnp.float32), rows, cols) / float(plan.tokens) ** 2


def mask_bytes(heads: int, tokens: int, block_q: int, block_kv: int, steps: int) -> dict:
    """Bytes of what the pooled mask keeps on the device, by part: the tile table (bool `[heads, nq, nk]`)
    and the B3 tables the device planner makes from it (`device_plan.DeviceTables`: int32 schedules
    `[heads, ceil(nq * steps / 2)]` and `[heads, ceil(nk * nq / 2)]`, step counts `[heads, nq]` and
    `[heads, nk]`). All O(tiles): none grows with tokens^2 at fixed tiles."""
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    parts = {"tiles": heads * nq * nk, "schedule": 4 * heads * -(-nq * steps // 2),
             "schedule_t": 4 * heads * -(-nk * nq // 2), "num_steps": 4 * heads * (nq + nk)}
    parts["total"] = sum(parts.values())
    return parts
