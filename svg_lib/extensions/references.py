"""float64 references on the host: what the tests, the notebooks and the checkers compare float32 results with.

`attention_float64`, `attention_rows_float64` (chosen query rows only, at sizes whose full weights
would not fit) and `attention_gradients_float64` are NumPy in float64: the references for float32
results, which a float64 computation on the device could not give everywhere (a TPU has no float64,
and `jax.enable_x64` is not in every jax the series supports). They take what
`svg_lib.kernels.reference.reference_attention` takes, validated by the same checks.
"""
from __future__ import annotations

import math

import numpy as np

from svg_lib.core.masks import Mask
from svg_lib.kernels.reference import check_mask, check_qkv


def _host_float64(*arrays):
    """NumPy float64 copies of jax or NumPy arrays (bf16 and float32 upcast exactly)."""
    return [np.asarray(x).astype(np.float64) for x in arrays]


def _weights_float64(q, k, mask):
    """(p, scale): softmax weights `[heads, tokens, tokens]` in float64 over kept keys (rows that
    keep nothing all 0), and the 1/sqrt(head_dim) they were scaled by."""
    n, d = q.shape[1], q.shape[2]
    mask = check_mask(mask, n)
    keep = mask.to_dense() if isinstance(mask, Mask) else mask
    scale = 1.0 / math.sqrt(d)
    s = np.einsum("hqd,hkd->hqk", q, k) * scale
    if keep is not None:
        s = np.where(keep[None], s, -np.inf)
    return _softmax_float64(s), scale


def _softmax_float64(s):
    """Softmax over the last axis of float64 scores with -inf for dropped keys; all-dropped rows 0.
    A row with a NaN kept score is NaN throughout (its sum is NaN, and 0 / NaN is NaN)."""
    m = s.max(axis=-1, keepdims=True)
    kept = ~(m == -np.inf)  # the row keeps a key (NaN max: it kept a NaN score)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
        total = e.sum(axis=-1, keepdims=True)
        return np.where(kept, e / np.where(kept, total, 1.0), 0.0)


def _times_v_float64(p, v):
    """p @ v `[heads, rows, head_dim]` for softmax weights p `[heads, rows, tokens]`, rows keeping nothing
    (p all 0) exactly 0 even where v holds NaN (a matmul would give 0 * NaN = NaN there)."""
    kept = (p != 0).any(axis=-1, keepdims=True)  # NaN != 0: a NaN row counts as keeping
    with np.errstate(invalid="ignore"):
        return np.where(kept, np.einsum("hqk,hkd->hqd", p, v), 0.0)


def attention_float64(q, k, v, mask=None):
    """softmax(q k^T / sqrt(head_dim) + mask) v in float64 NumPy on the host; rows keeping nothing give 0.

    Takes what `reference_attention` takes (jax or NumPy arrays, any float dtype, read exactly) and
    returns a float64 NumPy `[heads, tokens, head_dim]`. It holds `[heads, tokens, tokens]` float64
    weights: for checks at tutorial sizes.
    """
    check_qkv(q, k, v)
    q, k, v = _host_float64(q, k, v)
    p, _ = _weights_float64(q, k, mask)
    return _times_v_float64(p, v)


def attention_rows_float64(q, k, v, rows, keep):
    """float64 attention of some query rows: `[heads, len(rows), head_dim]` NumPy.

    q, k, v `[heads, tokens, head_dim]` (jax or NumPy, read exactly); `rows` int `[r]`, the query
    rows to check; `keep` bool `[heads, r, tokens]`, the keys each of them attends. Holds only
    `[heads, r, tokens]` weights, so sampled rows can be checked at a size whose full
    `[heads, tokens, tokens]` would not fit. Rows keeping nothing give 0.
    """
    check_qkv(q, k, v)
    rows = np.asarray(rows)
    keep = np.asarray(keep, bool)
    if keep.shape != (q.shape[0], rows.size, k.shape[1]):
        raise ValueError(f"keep has shape {keep.shape}; for {rows.size} rows of {q.shape[0]} heads over "
                         f"{k.shape[1]} keys it should be {(q.shape[0], rows.size, k.shape[1])}")
    qr, k, v = _host_float64(np.asarray(q)[:, rows], k, v)
    s = np.where(keep, np.einsum("hqd,hkd->hqk", qr, k) / math.sqrt(q.shape[2]), -np.inf)
    return _times_v_float64(_softmax_float64(s), v)


def attention_gradients_float64(q, k, v, dout, mask=None):
    """(dq, dk, dv) of sum(attention(q, k, v, mask) * dout) in float64 NumPy on the host.

    From the softmax's derivative (FlashAttention-2's backward, written out whole): with P the
    weights, dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K / sqrt(D),
    dK = dS^T Q / sqrt(D). `dout` is shaped like q. Returns float64 NumPy arrays.
    """
    check_qkv(q, k, v)
    if tuple(getattr(dout, "shape", ())) != tuple(q.shape):
        raise ValueError(f"dout must be shaped like q {tuple(q.shape)}, got {getattr(dout, 'shape', None)}")
    q, k, v, dout = _host_float64(q, k, v, dout)
    p, scale = _weights_float64(q, k, mask)
    dv = np.einsum("hqk,hqd->hkd", p, dout)
    dp = np.einsum("hqd,hkd->hqk", dout, v)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return np.einsum("hqk,hkd->hqd", ds, k) * scale, np.einsum("hqk,hqd->hkd", ds, q) * scale, dv

