"""Masks the tests build from plain arrays, shared by the mask and planner tests."""
import jax.numpy as jnp
import numpy as np

from svg_lib.masks import Mask


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
