"""JAX's Splash attention (shipped in the jax wheel) as the series' baseline and peer.

B0 is Splash with a full mask. "splash" is Splash with the exact SVG mask, expressed as a
computable mask: Splash evaluates the predicate inside its kernel and classifies blocks by
evaluating it block by block on the host (a few seconds at 75,600 tokens, no N x N array).
Splash applies no softmax scale, so the caller passes q already scaled.
"""
from __future__ import annotations

import numpy as np

from .masks import Mask, SVGMask


def _splash():
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    return sa, sm


def _computable_mask(shape, predicate, key):
    """A Splash `_ComputableMask` from a predicate on (q_ids, k_ids), hashable by `key`."""
    _, sm = _splash()

    class PredicateMask(sm._ComputableMask):
        def __init__(self):
            super().__init__(shape=shape, mask_function=predicate)

        def __eq__(self, other):
            return isinstance(other, PredicateMask) and other.key == self.key

        def __hash__(self):
            return hash(self.key)

    m = PredicateMask()
    m.key = key
    return m


def splash_mask(mask: Mask | None, tokens: int, q_len: int, kv_len: int):
    """The Splash mask for `mask` on padded lengths (q_len, kv_len); None means dense.

    Padded key columns are always masked out. A dense mask with no key padding is Splash's
    own FullMask (no predicate at all, as B0 in the blog).
    """
    _, sm = _splash()
    if mask is None:
        if kv_len == tokens:
            return sm.FullMask((q_len, kv_len))
        return _computable_mask((q_len, kv_len), lambda q, k: k < tokens, ("dense", tokens, q_len, kv_len))
    if isinstance(mask, SVGMask):
        key = ("svg", mask.tokens, mask.band_width, mask.sink_tokens, mask.video_tokens, q_len, kv_len)
        return _computable_mask((q_len, kv_len), mask.keep, key)
    # Masks without a closed-form predicate go in as arrays: fine at tutorial sizes only.
    dense = np.zeros((q_len, kv_len), dtype=bool)
    dense[:tokens, :tokens] = mask.to_dense()
    return sm.NumpyMask(dense)


def make_splash(mask: Mask | None, *, tokens: int, heads: int, q_len: int, kv_len: int, block_q: int,
                block_kv: int, block_kv_compute: int, interpret):
    """Build a Splash MHA kernel for `[heads, q_len, head_dim]` q and `[heads, kv_len, head_dim]` k, v."""
    sa, sm = _splash()
    head_mask = splash_mask(mask, tokens, q_len, kv_len)
    sizes = sa.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute)
    return sa.make_splash_mha_single_device(sm.MultiHeadMask([head_mask] * heads), block_sizes=sizes,
                                            interpret=interpret)
