"""Reference attention: the ground truth every kernel is checked against.

`reference_attention` is plain jax.numpy in float32 (it runs where jax runs, a TPU included, with
every matmul at float32 precision: see `svg_lib.kernels.forward.matmul_precision`). The float64
references on the host, for the tests and notebooks, are in `svg_lib.extensions.references`.
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

