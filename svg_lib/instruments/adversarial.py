"""Inputs built to break an attention kernel's max: scores at their Cauchy-Schwarz bound.

The bounded max (`kernels.forward`) subtracts |q| max|k| instead of a running max. Float rounding
can put a computed score above a computed bound when a query is parallel to a key of largest
norm and the scores are huge; then exp(s - bound) overflows. These heads put the largest scores
exactly there. NumPy only, float64: cast them to the dtype under test.
"""
from __future__ import annotations

import math

import numpy as np

KINDS = ("identical", "parallel")
# (kind, score, seed): whether rounding puts a score above its bound depends on the vector, so several
# vectors at the scores where it happened (with no margin on the bound, 2 to 4 of these 6
# identical-token heads went NaN at each head_dim of 64, 128 and 256 in float32)
CASES = [("identical", score, seed) for score in (1e9, 1e10) for seed in range(3)] + \
        [("identical", 1e7, 0), ("parallel", 1e9, 0)]


def adversarial_qkv(kind: str, head_dim: int, score: float, tokens: int = 256, seed: int = 5):
    """q, k, v float64 `[1, tokens, head_dim]` whose largest scores are about `score` (after the
    1/sqrt(head_dim) scale) and sit at their bound. "identical": every token the same vector (q = k:
    every score is its bound, all equal, so the answer is the mean of v); "parallel": every query
    parallel to the one key of largest norm (that key's score is the bound, every other score far
    below: the answer is that key's value row)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((1, tokens, head_dim))
    if kind == "identical":
        x = rng.standard_normal(head_dim)
        x *= math.sqrt(score * math.sqrt(head_dim)) / np.linalg.norm(x)
        q = k = np.broadcast_to(x, (1, tokens, head_dim))
    else:
        k = rng.standard_normal((1, tokens, head_dim))
        top = tokens // 3
        k[0, top] *= 3.0 * np.linalg.norm(k, axis=-1).max() / np.linalg.norm(k[0, top])
        q = np.broadcast_to(k[0, top] * (score * math.sqrt(head_dim) / np.sum(k[0, top] ** 2)), (1, tokens, head_dim))
    return q, k, v


def adversarial_heads(head_dim: int, tokens: int = 256):
    """Every case of `CASES` as one head: q, k, v float64 `[len(CASES), tokens, head_dim]` (the bound
    is per head, so the cases do not interact)."""
    cases = [adversarial_qkv(kind, head_dim, score, tokens, seed) for kind, score, seed in CASES]
    return tuple(np.concatenate([c[n] for c in cases]) for n in range(3))
