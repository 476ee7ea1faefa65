"""Online profiling (Sparse VideoGen): decide per head whether it is spatial or temporal.

For a few sampled query rows (the same rows for every head), compute the rows' dense
attention output over all keys, and their output under each candidate mask: the spatial
SVG mask in frame-major order, and the temporal mask (the same band at temporal-major
positions, `TemporalMask`) also in frame-major coordinates. A head takes the candidate
whose output is closer (lower mean squared error) to dense. Work and memory are
heads x rows x tokens: the N x N score matrix is never formed.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from svg_lib.core.planner import EMPTY, PARTIAL, plan_tiles
from svg_lib.core.svg_masks import TemporalMask
from svg_lib.extensions.bounded_max import bound_test
from svg_lib.kernels.reference import check_qkv, masked_softmax_times_v
from svg_lib.layers.routing import check_spatial_mask
from svg_lib.methods import PLANNED_METHODS, check_method


class HeadProfile(NamedTuple):
    """What `profile_heads(..., return_errors=True)` measured.

    is_temporal bool `[heads]`; mse_spatial, mse_temporal float32 `[heads]` (mean over the
    sampled rows and head_dim of the squared difference to dense); rows int64 `[num_samples]`.
    """

    is_temporal: object
    mse_spatial: object
    mse_temporal: object
    rows: np.ndarray


def sample_rows(tokens: int, num_samples: int, seed: int = 0) -> np.ndarray:
    """`num_samples` distinct query rows in [0, tokens), sorted, from numpy's RNG seeded with `seed`.

    Asking for at least `tokens` rows returns every row.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer (query rows to sample), got {num_samples!r}")
    if num_samples >= tokens:
        return np.arange(tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(tokens, size=int(num_samples), replace=False)).astype(np.int64)


def profile_heads(q, k, v, mask, num_samples: int = 64, seed: int = 0, *, return_errors: bool = False):
    """SVG's online profiling: bool `[heads]`, True where the temporal mask fits the head better.

    q, k, v: `[heads, tokens, head_dim]`, frame-major (may be traced: the rows are chosen on
    the host from `seed`). mask: the spatial `SVGMask`; the temporal candidate is
    `TemporalMask(mask)`. A tie (e.g. a mask that keeps everything) counts as spatial.
    With `return_errors=True`, returns a `HeadProfile` with the per-head MSEs and the rows.
    """
    import jax
    import jax.numpy as jnp

    heads, tokens, head_dim = check_qkv(q, k, v)
    mask = check_spatial_mask(mask, tokens)
    rows = sample_rows(tokens, num_samples, seed)
    cols = np.arange(tokens)
    keep_spatial = jnp.asarray(mask.keep(rows[:, None], cols[None, :]))
    keep_temporal = jnp.asarray(TemporalMask(mask).keep(rows[:, None], cols[None, :]))

    scale = 1.0 / math.sqrt(head_dim)
    qr = q[:, rows].astype(jnp.float32) * scale
    s = jnp.einsum("hrd,hkd->hrk", qr, k.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    vf = v.astype(jnp.float32)
    dense = masked_softmax_times_v(s, None, vf)
    mse_s = jnp.mean((masked_softmax_times_v(s, keep_spatial, vf) - dense) ** 2, axis=(1, 2))
    mse_t = jnp.mean((masked_softmax_times_v(s, keep_temporal, vf) - dense) ** 2, axis=(1, 2))
    is_temporal = mse_t < mse_s
    if return_errors:
        return HeadProfile(is_temporal, mse_s, mse_t, rows)
    return is_temporal


def bound_pass_rate(q, k, mask=None, *, method: str = "dense", block_q: int, block_kv: int) -> np.ndarray:
    """The fraction of each head's query tiles that switch to the bounded max (`kernels.forward`) in
    `method`'s kernel on these activations: float64 `[heads]`, the `pass_rate` the cost model takes
    (`svg_lib.instruments.tpu.cost.model_cycles`).

    q, k `[heads, tokens, head_dim]` as given to `attention()`; `mask` an svg_lib Mask (None for
    dense). Each query tile's check is made after its first visited key tile, as the kernels make it
    (`extensions.bounded_max.bound_test`, tested against the kernels' own decisions): dense starts at
    key tile 0, B1-B3 at the first tile of their plan's schedule (B3's: the tile-aligned mask's),
    masked there as that stage masks it. Query tiles that visit no key tile run no test and are
    left out."""
    heads, tokens, _ = check_qkv(q, k, k)
    record = check_method(method, ("dense",) + PLANNED_METHODS)
    if record.dense or mask is None:
        tested = np.ones(-(-tokens // block_q), bool)
        passed = bound_test(q, k, block_q=block_q, block_kv=block_kv)
    else:
        kernel_mask = record.computed_mask(mask, block_q, block_kv)
        plan = plan_tiles(kernel_mask, block_q, block_kv)
        first = plan.classes[np.arange(plan.grid[0]), plan.kv_index[:, 0]]  # the first visit's (idle steps' tile)
        masked = record.step_classes(first) == PARTIAL
        passed = bound_test(q, k, block_q=block_q, block_kv=block_kv, first_kv=plan.kv_index[:, 0],
                            keep=(kernel_mask.kernel_predicate(block_q, block_kv), masked))
        tested = first != EMPTY
    if not tested.any():
        raise ValueError("no query tile visits a key tile under this mask: there is no test to count")
    return passed[:, tested].mean(axis=1)
