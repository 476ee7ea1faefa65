"""Reference attention: the ground truth every kernel is checked against.

`reference_attention` is plain jax.numpy in float32 (it runs where jax runs, a TPU included, with
every matmul at float32 precision: see `svg_lib.kernels.forward.matmul_precision`).
`attention_float64` and `attention_gradients_float64` are NumPy in float64 on the host: the
references for float32 results, which a float64 computation on the device could not give
everywhere (a TPU has no float64, and `jax.enable_x64` is not in every jax the series supports).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from svg_lib.core.masks import Mask
from svg_lib.kernels.forward import matmul_precision


def check_qkv(q, k, v):
    """Validate `[heads, tokens, head_dim]` q, k, v; returns (heads, tokens, head_dim)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 3:
            raise ValueError(f"{name} must be shaped [heads, tokens, head_dim], got shape {getattr(x, 'shape', None)}")
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k and v must have the same shape [heads, tokens, head_dim]; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    return check_shape(*q.shape)


def check_shape(heads, tokens, head_dim) -> tuple[int, int, int]:
    """(heads, tokens, head_dim) as ints, each at least 1. An empty axis would reach the kernels as
    an empty grid or slice, whose error (jax's) says nothing about the input that caused it."""
    shape = (heads, tokens, head_dim)
    bad = [f"{name}={value!r}" for name, value in zip(("heads", "tokens", "head_dim"), shape)
           if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: q, k and v [heads, tokens, head_dim] need at least one head, one "
                         "token and a head_dim of at least 1")
    return tuple(int(s) for s in shape)


def check_mask(mask, n: int):
    """`mask` validated for `n` tokens: None, an svg_lib `Mask`, or a bool `[n, n]` NumPy array."""
    if mask is None:
        return None
    if isinstance(mask, Mask):
        if mask.tokens != n:
            raise ValueError(f"the mask covers {mask.tokens} tokens but q, k, v have {n}")
        return mask
    if np.asarray(mask).dtype != bool:
        raise ValueError(f"a dense mask must be boolean (True = keep), got dtype {np.asarray(mask).dtype}; "
                         "additive float masks are not supported")
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (n, n):
        raise ValueError(f"a dense mask must be shaped [tokens, tokens] = ({n}, {n}), got {mask.shape}")
    return mask


def reference_attention(q, k, v, mask=None, *, block_rows: int = 2048):
    """softmax(q k^T / sqrt(head_dim) + mask) v with float32 accumulation.

    q, k, v: `[heads, tokens, head_dim]`. `mask`: None (dense), an svg_lib `Mask`, or a bool
    array `[tokens, tokens]` (True = keep). A query row with no kept key returns zeros (the
    kernels do the same). Query rows are processed `block_rows` at a time so memory stays at
    heads x block_rows x tokens. Returns `[heads, tokens, head_dim]` in q's dtype.
    """
    heads, n, d = check_qkv(q, k, v)
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or block_rows < 1:
        raise ValueError(f"block_rows must be a positive integer (query rows per chunk), got {block_rows!r}")
    mask = check_mask(mask, n)

    scale = 1.0 / math.sqrt(d)
    kf = k.astype(jnp.float32)
    vf = v.astype(jnp.float32)
    cols = jnp.arange(n)
    out = []
    for start in range(0, n, block_rows):
        stop = min(start + block_rows, n)
        s = jnp.einsum("hqd,hkd->hqk", q[:, start:stop].astype(jnp.float32) * scale, kf,
                       precision=matmul_precision(kf.dtype))
        if mask is None:
            keep = None
        elif isinstance(mask, Mask):
            keep = mask.keep(jnp.arange(start, stop)[:, None], cols[None, :])
        else:
            keep = jnp.asarray(mask[start:stop])
        out.append(masked_softmax_times_v(s, keep, vf))
    return jnp.concatenate(out, axis=1).astype(q.dtype)


def masked_softmax_times_v(s, keep, vf):
    """softmax(s) over kept keys, times v, in float32; rows that keep nothing give zeros.

    s `[heads, rows, tokens]` f32 scores (already scaled), keep bool `[rows, tokens]` or None,
    vf `[heads, tokens, head_dim]` f32. Returns `[heads, rows, head_dim]`. NaN propagates as in
    the kernels (`svg_lib.kernels.forward`): a NaN score of a kept key makes its row NaN, and a NaN
    in v makes NaN every row that keeps a key (p @ v meets it, 0 * NaN = NaN: one tile of every pair).
    """
    kept = True                             # whether the row keeps a key (from the mask: a max may drop NaN)
    if keep is not None:
        s = jnp.where(keep[None], s, -jnp.inf)
        kept = jnp.any(keep, axis=-1)[None, :, None]
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # rows with nothing kept (or a NaN max): avoid inf - inf
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("hqk,hkd->hqd", p, vf, precision=matmul_precision(vf.dtype))
    return jnp.where(kept, o / jnp.where(kept, l, 1.0), 0.0)


# -- float64 on the host --------------------------------------------------------------------

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

