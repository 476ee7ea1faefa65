"""Reference attention in plain jax.numpy: the ground truth every kernel is checked against."""
from __future__ import annotations

import math

import numpy as np

from .masks import Mask


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
    return tuple(int(s) for s in q.shape)


def reference_attention(q, k, v, mask=None, *, block_rows: int = 2048):
    """softmax(q k^T / sqrt(head_dim) + mask) v with float32 accumulation.

    q, k, v: `[heads, tokens, head_dim]`. `mask`: None (dense), an svg_lib `Mask`, or a bool
    array `[tokens, tokens]` (True = keep). A query row with no kept key returns zeros (the
    kernels do the same). Query rows are processed `block_rows` at a time so memory stays at
    heads x block_rows x tokens. Returns `[heads, tokens, head_dim]` in q's dtype.
    """
    import jax
    import jax.numpy as jnp

    heads, n, d = check_qkv(q, k, v)
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or block_rows < 1:
        raise ValueError(f"block_rows must be a positive integer (query rows per chunk), got {block_rows!r}")
    if mask is not None and not isinstance(mask, Mask):
        if np.asarray(mask).dtype != bool:
            raise ValueError(f"a dense mask must be boolean (True = keep), got dtype {np.asarray(mask).dtype}; "
                             "additive float masks are not supported")
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (n, n):
            raise ValueError(f"a dense mask must be shaped [tokens, tokens] = ({n}, {n}), got {mask.shape}")
    if isinstance(mask, Mask) and mask.tokens != n:
        raise ValueError(f"the mask covers {mask.tokens} tokens but q, k, v have {n}")

    scale = 1.0 / math.sqrt(d)
    kf = k.astype(jnp.float32)
    vf = v.astype(jnp.float32)
    cols = jnp.arange(n)
    out = []
    for start in range(0, n, block_rows):
        stop = min(start + block_rows, n)
        s = jnp.einsum("hqd,hkd->hqk", q[:, start:stop].astype(jnp.float32) * scale, kf,
                       precision=jax.lax.Precision.HIGHEST)
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
    vf `[heads, tokens, head_dim]` f32. Returns `[heads, rows, head_dim]`.
    """
    import jax
    import jax.numpy as jnp

    if keep is not None:
        s = jnp.where(keep[None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # rows with nothing kept: avoid inf - inf
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("hqk,hkd->hqd", p, vf, precision=jax.lax.Precision.HIGHEST)
    return jnp.where(l > 0, o / jnp.where(l > 0, l, 1.0), 0.0)
