"""The bounded max's check replayed on the host (or on jax's device), query tile by query tile, as the
kernels decide it (`kernels.forward.check_bound`): what the profiling layer and the report measure the
pass rate with."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from svg_lib.kernels.forward import BOUND_MARGIN, BOUND_SLACK
from svg_lib.kernels.reference import check_qkv


def bound_test_on_device() -> bool:
    """Whether `bound_test` computes its scores on jax's device by default: on a TPU only."""
    return jax.default_backend() == "tpu"


def kept_row_sums(rows, keys, kept, bound, on_device: bool) -> np.ndarray:
    """log sum_j exp(s_ij - b_i) over each row's kept keys, float64 `[heads, rows]`: rows `[heads, rows, d]`,
    keys `[heads, keys, d]`, kept bool `[rows, keys]`, bound `[heads, rows]` (a row keeping none gets -inf)."""
    if on_device:
        scores = jnp.matmul(jnp.asarray(rows, jnp.float32), jnp.asarray(keys, jnp.float32).transpose(0, 2, 1),
                            precision=jax.lax.Precision.HIGHEST)
        shifted = jnp.where(jnp.asarray(kept)[None], scores - jnp.asarray(bound, jnp.float32)[..., None], -jnp.inf)
        return np.asarray(jax.nn.logsumexp(shifted, axis=-1), np.float64)
    scores = rows @ keys.transpose(0, 2, 1)  # a BLAS matmul (einsum's loops took minutes)
    shifted = np.where(kept[None], scores - bound[..., None], -np.inf)
    top = shifted.max(-1, keepdims=True)
    finite = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return (finite + np.log(np.exp(shifted - finite).sum(-1, keepdims=True)))[..., 0]


def bound_test(q, k, *, block_q: int, block_kv: int, first_kv=None, keep=None, on_device: bool | None = None) -> np.ndarray:
    """Which query tiles keep the bounded max, decided as the kernels decide it
    (`svg_lib.kernels.forward.check_bound`): bool `[heads, ceil(tokens / block_q)]`.

    q, k `[heads, tokens, head_dim]` as given to `attention()` (not yet scaled). Its first visited key
    tile run on each row's bound b_i = |q_i| max|k| (1 + BOUND_MARGIN), a query tile passes when every
    row's sum over the kept keys of that tile, sum_j exp(s_ij - b_i), reaches block_kv
    exp(-BOUND_SLACK): then that row's max lies within BOUND_SLACK of its bound. `first_kv`: int `[nq]`, the
    key tile each query tile visits first (default: 0, as dense does); `keep`: None, or a predicate
    `keep(q_ids, k_ids)` for the first tiles that mask (a bool `[nq]` may say which; see
    `svg_lib.layers.profiling.bound_pass_rate`), given as `(predicate, masked)`. Rows past the last
    token are zero rows here, which pass the test, as the kernels pass them by leaving them out; keys
    past it no row keeps.
    Work: heads x tokens x block_kv, never tokens x tokens. `on_device`: the scores and their row
    sums in float32 (matmuls at HIGHEST) on jax's default device instead of float64 on the host:
    minutes of host work at the case study's size take a second on a TPU. None: `bound_test_on_device()`.
    """
    heads, n, d = check_qkv(q, k, k)
    if on_device is None:
        on_device = bound_test_on_device()
    nq = -(-n // block_q)
    first_kv = np.zeros(nq, np.int64) if first_kv is None else np.asarray(first_kv, np.int64)
    predicate, masked = keep if keep is not None else (None, np.zeros(nq, bool))
    qs = np.asarray(np.asarray(q, np.float32) * np.float32(1.0 / math.sqrt(d)), np.float64)  # as `prescaled` does
    kf = np.asarray(k, np.float64)
    bound_k = np.sqrt((kf * kf).sum(-1).max(-1)) * (1.0 + BOUND_MARGIN)                     # [heads]
    out = np.zeros((heads, nq), bool)
    for i in range(nq):
        q_ids = np.arange(i * block_q, (i + 1) * block_q)
        k_ids = np.arange(first_kv[i] * block_kv, (first_kv[i] + 1) * block_kv)
        rows = np.zeros((heads, block_q, d))
        rows[:, :min(block_q, n - i * block_q)] = qs[:, q_ids[q_ids < n]]
        kept = np.broadcast_to(k_ids[None, :] < n, (block_q, block_kv))
        if masked[i]:
            kept = kept & np.asarray(predicate(q_ids[:, None], k_ids[None, :]), bool)
        real = k_ids[k_ids < n]
        bound = np.sqrt((rows * rows).sum(-1)) * bound_k[:, None]                          # [heads, block_q]
        log_l = kept_row_sums(rows, kf[:, real], kept[:, :len(real)], bound, on_device)    # [heads, block_q]
        out[:, i] = (log_l >= math.log(block_kv) - BOUND_SLACK).all(-1)
    return out
