"""Masks the tests build from plain arrays, shared by the mask and planner tests."""
import jax.numpy as jnp
import numpy as np

from svg_lib.core.masks import Mask


class ArrayMask(Mask):
    """Any dense pattern as a Mask; exercises the generic (brute-force) pair_counts."""

    def __init__(self, dense):
        self.dense = np.asarray(dense, dtype=bool)
        self.tokens = self.dense.shape[0]

    def keep(self, q, k):
        n = self.tokens
        inside = (q < n) & (k < n)
        if isinstance(q, np.ndarray) or isinstance(k, np.ndarray):
            return self.dense[np.minimum(q, n - 1), np.minimum(k, n - 1)] & inside
        return jnp.asarray(self.dense)[jnp.minimum(q, n - 1), jnp.minimum(k, n - 1)] & inside


def tile_view(dense, block_q, block_kv):
    """(counts, areas) [nq, nk] of the tile grid, from a dense mask padded with False."""
    n = dense.shape[0]
    nq, nk = -(-n // block_q), -(-n // block_kv)
    padded = np.zeros((nq * block_q, nk * block_kv), dtype=bool)
    padded[:n, :n] = dense
    counts = padded.reshape(nq, block_q, nk, block_kv).sum(axis=(1, 3))
    real = np.zeros_like(padded)
    real[:n, :n] = True
    areas = real.reshape(nq, block_q, nk, block_kv).sum(axis=(1, 3))
    return counts, areas
