"""JAX's Splash attention (shipped in the jax wheel) as the series' baseline and peer.

B0 is Splash with a full mask. "splash" is Splash with the exact SVG mask: as blocks of
booleans at tutorial sizes, as a computable predicate at large sizes (see
`splash_mask_form`). Either way Splash classifies blocks by evaluating the mask block by
block on the host (tens of seconds at 75,600 tokens, never an N x N array). Splash applies
no softmax scale, so the caller passes q already scaled.
"""
from __future__ import annotations

import numpy as np

from .masks import Mask, SVGMask


def _splash():
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    return sa, sm


class _EqualByKey:
    """Splash de-duplicates head masks by hash and equality; ours are equal when their keys are."""

    key = None

    def _identity(self):
        # by class name: each call of the builders below defines its class afresh
        return type(self).__name__, self.key

    def __eq__(self, other):
        return isinstance(other, _EqualByKey) and other._identity() == self._identity()

    def __hash__(self):
        return hash(self._identity())


def _computable_mask(shape, predicate, key):
    """A Splash `_ComputableMask` from a predicate on (q_ids, k_ids), hashable by `key`."""
    _, sm = _splash()

    class PredicateMask(_EqualByKey, sm._ComputableMask):
        def __init__(self):
            super().__init__(shape=shape, mask_function=predicate)

    m = PredicateMask()
    m.key = key
    return m


# Splash handles a mask in one of two ways. Given blocks of booleans (any mask that is not
# "computable"), it stores the distinct partial blocks and evaluates no predicate: close to
# B2, except that its single tile body still loads a mask block and selects on every visited
# block (a full block's flag makes every pair pass). Given a computable mask (a predicate),
# it evaluates the predicate on every block it visits, full ones included, like B1, but
# stores nothing. Distinct partial blocks cost block_q x block_kv bytes each in HBM (and in an
# exported module), so above this many tokens the exact mask goes in as a predicate.
BLOCK_MASK_LIMIT_TOKENS = 16_384


def _block_mask(shape, predicate, key):
    """A Splash mask evaluated block by block on the host from `predicate` (never N x N at once)."""
    _, sm = _splash()

    class PredicateBlocks(_EqualByKey, sm.Mask):
        @property
        def shape(self):
            return shape

        def __getitem__(self, idx):
            rows, cols = (np.arange(*sl.indices(size)) for sl, size in zip(idx, shape))
            kept = np.asarray(predicate(rows[:, None], cols[None, :]), dtype=bool)
            return np.broadcast_to(kept, (rows.size, cols.size))  # a predicate may ignore q

    m = PredicateBlocks()
    m.key = key
    return m


def splash_mask_form(mask: Mask | None, tokens: int, kv_len: int) -> str:
    """How `make_splash` hands `mask` to Splash: "full", "blocks" or "computable" (see above)."""
    if mask is None:
        return "full" if kv_len == tokens else "blocks"
    if isinstance(mask, SVGMask) and tokens > BLOCK_MASK_LIMIT_TOKENS:
        return "computable"
    return "blocks"


def splash_mask(mask: Mask | None, tokens: int, q_len: int, kv_len: int):
    """The Splash mask for `mask` on padded lengths (q_len, kv_len); None means dense.

    Padded key columns are always masked out. A dense problem without key padding is
    Splash's own FullMask (B0 in the blog); with key padding, only the last key block column
    is partial, so B0 stays mask-free everywhere else.
    """
    _, sm = _splash()
    form = splash_mask_form(mask, tokens, kv_len)
    if form == "full":
        return sm.FullMask((q_len, kv_len))
    if mask is None:
        return _block_mask((q_len, kv_len), lambda q, k: k < tokens, ("dense", tokens, q_len, kv_len))
    if form == "computable":
        key = ("svg", mask.tokens, mask.band_width, mask.sink_tokens, mask.video_tokens, q_len, kv_len)
        return _computable_mask((q_len, kv_len), mask.keep, key)
    if mask.tokens > BLOCK_MASK_LIMIT_TOKENS:
        raise ValueError(f"Splash needs a computable form of this {type(mask).__name__} at {mask.tokens:,} tokens "
                         f"(above {BLOCK_MASK_LIMIT_TOKENS:,} its partial blocks are stored); use an SVGMask")
    return _block_mask((q_len, kv_len), mask.keep, ("mask", id(mask), q_len, kv_len))


def make_splash(mask: Mask | None, *, tokens: int, heads: int, q_len: int, kv_len: int, block_q: int,
                block_kv: int, block_kv_compute: int, interpret):
    """Build a Splash MHA kernel for `[heads, q_len, head_dim]` q and `[heads, kv_len, head_dim]` k, v."""
    sa, sm = _splash()
    head_mask = splash_mask(mask, tokens, q_len, kv_len)
    # the backward (jax.grad) runs Splash's fused dq/dk/dv kernel on the forward's tiles
    sizes = sa.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute,
                          block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv_compute,
                          use_fused_bwd_kernel=True)
    return sa.make_splash_mha_single_device(sm.MultiHeadMask([head_mask] * heads), block_sizes=sizes,
                                            interpret=interpret)
