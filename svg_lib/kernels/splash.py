"""JAX's Splash attention (shipped in the jax wheel) as the series' baseline and peer.

B0 is Splash with a full mask. "splash" is Splash with the exact SVG mask: as blocks of
booleans at tutorial sizes, as a computable predicate at large sizes (see
`splash_mask_form`). Either way Splash classifies blocks by evaluating the mask block by
block on the host (slow at the case study's size, but never an N x N array). Splash applies
no softmax scale, so the caller passes q already scaled.

Splash's VMEM limit. `make_splash_mha` takes no `vmem_limit_bytes`: its three pallas_calls
(forward, dq, fused dk/dv) build their own `pltpu.CompilerParams` and run under the chip's
default scoped VMEM, which the blog's tiles overflow on a v5e (and on a v6e at a few thousand
tokens). A per-jit XLA option (`xla_tpu_scoped_vmem_limit_kib`) raises that default, but
jax accepts compiler options only on the outermost jit, so a model that calls attention
inside its own `jax.jit` could not use it. `with_vmem_limit` puts the limit where the
caller's jit cannot lose it: in each Splash pallas_call's own `CompilerParams`, so it is part
of the traced program (the Mosaic custom call's config) however deeply it is nested:
  * Splash calls `pl.pallas_call` through its module's `pl` name; that name is replaced (once)
    by a stand-in that forwards everything to `jax.experimental.pallas` and, only while
    `with_vmem_limit` traces a kernel (a context variable, so other threads and other Splash
    users are untouched), adds `vmem_limit_bytes` to the kernel's CompilerParams.
  * Splash's entry point is a `jax.jit` whose trace is cached by shapes and static arguments,
    so a trace made without the limit (or another kernel's) would be reused without ours; the
    kernel is therefore traced through the function under that jit (`__wrapped__`), inline.
  * `jax.grad` traces Splash's backward later than its forward, after the forward's call has
    returned; a `custom_vjp` around the kernel traces both under the limit.
It fails loudly (RuntimeError) if a jax's Splash stops reaching `pl.pallas_call` that way.
Checked with jax 0.7.2 and 0.10.2 (tests/test_in_model.py).
"""
from __future__ import annotations

import contextvars
import dataclasses

import numpy as np

from svg_lib.core.masks import Mask
from svg_lib.core.svg_masks import SVGMask


def _splash():
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    return sa, sm


class _EqualByKey:
    """Splash de-duplicates head masks by hash and equality; ours are equal when their keys are."""

    key = None

    @classmethod
    def keyed(cls, key):
        """An instance with value key `key`."""
        m = cls()
        m.key = key
        return m

    def _identity(self):
        # by class name: each call of the builders below defines its class afresh
        return type(self).__name__, self.key

    def __eq__(self, other):
        return isinstance(other, _EqualByKey) and other._identity() == self._identity()

    def __hash__(self):
        return hash(self._identity())


def _computable_mask(shape, predicate, key, mask: Mask | None = None):
    """A Splash `_ComputableMask` from a predicate on (q_ids, k_ids), hashable by `key`.

    Splash classifies every block on the host by evaluating the predicate on all of its pairs
    (two minutes for one head at the blog's size). Given the `mask` the predicate comes from, a
    block inside its tokens is classified by `mask.pair_counts` instead (no pair evaluated) and
    only the partial ones are evaluated; Splash sees the same booleans either way."""
    _, sm = _splash()

    class PredicateMask(_EqualByKey, sm._ComputableMask):
        def __init__(self):
            super().__init__(shape=shape, mask_function=predicate)

        def __getitem__(self, idx):
            if mask is not None and len(idx) == 2 and all(isinstance(s, slice) for s in idx):
                (r0, r1, rs), (c0, c1, cs) = (s.indices(n) for s, n in zip(idx, shape))
                if rs == cs == 1 and r0 < r1 <= mask.tokens and c0 < c1 <= mask.tokens:
                    n = int(mask.pair_counts(np.array([r0, r1]), np.array([c0, c1]))[0, 0])
                    if n in (0, (r1 - r0) * (c1 - c0)):  # empty or full: the same array, built at once
                        return np.full((r1 - r0, c1 - c0), n > 0)
            return super().__getitem__(idx)

    return PredicateMask.keyed(key)


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

    return PredicateBlocks.keyed(key)


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
        return _computable_mask((q_len, kv_len), mask.keep, key, mask)
    if mask.tokens > BLOCK_MASK_LIMIT_TOKENS:
        raise ValueError(f"Splash needs a computable form of this {type(mask).__name__} at {mask.tokens:,} tokens "
                         f"(above {BLOCK_MASK_LIMIT_TOKENS:,} its partial blocks are stored); use an SVGMask")
    return _block_mask((q_len, kv_len), mask.keep, ("mask", mask.cache_key() or id(mask), q_len, kv_len))


def make_splash(mask: Mask | None, *, tokens: int, heads: int, q_len: int, kv_len: int, block_q: int,
                block_kv: int, block_kv_compute: int, interpret, vmem_limit_bytes: int | None = None):
    """Build a Splash MHA kernel for `[heads, q_len, head_dim]` q and `[heads, kv_len, head_dim]` k, v.

    `vmem_limit_bytes` (compiled kernels only; None: the chip's default scoped VMEM) is given to
    every Splash kernel, forward and backward, and survives a caller's `jax.jit` (`with_vmem_limit`).
    """
    sa, sm = _splash()
    head_mask = splash_mask(mask, tokens, q_len, kv_len)
    # the backward (jax.grad) runs Splash's fused dq/dk/dv kernel on the forward's tiles
    sizes = sa.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute,
                          block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv_compute,
                          use_fused_bwd_kernel=True)
    kernel = sa.make_splash_mha_single_device(sm.MultiHeadMask([head_mask] * heads), block_sizes=sizes,
                                              interpret=interpret)
    if vmem_limit_bytes is None or interpret is not False:  # interpret mode allocates no VMEM
        return kernel
    return with_vmem_limit(kernel, vmem_limit_bytes)


# -- Splash's VMEM limit (see the module docstring) ---------------------------------------------

class _LimitRequest:
    """The limit `with_vmem_limit` is tracing a kernel under, and how many pallas_calls took it."""

    def __init__(self, limit: int):
        self.limit = limit
        self.applied = 0


_REQUEST: contextvars.ContextVar = contextvars.ContextVar("svg_lib_splash_vmem_limit", default=None)


class _PallasWithVmemLimit:
    """Stands in for `jax.experimental.pallas` inside Splash's kernel module.

    Every attribute is the real module's; `pallas_call` adds the VMEM limit of the active
    `_LimitRequest`, and is exactly the real one when there is none."""

    def __init__(self, pallas):
        self._pallas = pallas

    def __getattr__(self, name):
        return getattr(self._pallas, name)

    def pallas_call(self, *args, **kwargs):
        request = _REQUEST.get()
        if request is not None:
            kwargs["compiler_params"] = _params_with_limit(kwargs.get("compiler_params"), request.limit)
            request.applied += 1
        return self._pallas.pallas_call(*args, **kwargs)


def _params_with_limit(params, limit: int):
    """Splash's CompilerParams for one kernel with `vmem_limit_bytes` at least `limit`."""
    from jax.experimental.pallas import tpu as pltpu

    if params is None:
        return pltpu.CompilerParams(vmem_limit_bytes=limit)
    if not (dataclasses.is_dataclass(params) and hasattr(params, "vmem_limit_bytes")):
        raise RuntimeError(f"Splash passed its pallas_call compiler_params of type {type(params).__name__}, "
                           "not the pltpu.CompilerParams svg_lib knows how to give a VMEM limit; this jax's "
                           "Splash needs a newer svg_lib (or run it in interpret mode)")
    if params.vmem_limit_bytes is not None and params.vmem_limit_bytes >= limit:
        return params  # Splash asked for as much itself
    return dataclasses.replace(params, vmem_limit_bytes=int(limit))


def _splash_kernel_module():
    """Splash's kernel module, with its `pl` replaced by `_PallasWithVmemLimit` (done once)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sak

    if not isinstance(sak.pl, _PallasWithVmemLimit):
        sak.pl = _PallasWithVmemLimit(sak.pl)
    return sak


def _trace_with_limit(limit: int, fn, *args):
    """`fn(*args)` with Splash's pallas_calls given `limit`; refuses if none was reached."""
    request = _LimitRequest(limit)
    token = _REQUEST.set(request)
    try:
        out = fn(*args)
    finally:
        _REQUEST.reset(token)
    if not request.applied:
        import jax
        raise RuntimeError(f"Splash's kernels were traced without reaching pl.pallas_call through its module "
                           f"(jax {jax.__version__}), so svg_lib could not give them their VMEM limit of "
                           f"{limit / 2**20:.1f} MiB; this jax's Splash needs a newer svg_lib")
    return out


def with_vmem_limit(kernel, vmem_limit_bytes: int):
    """`f(q, k, v)`: the Splash kernel `kernel` with every pallas_call (forward and backward) under
    `vmem_limit_bytes`, a limit that is part of the traced program, so that it holds inside any
    caller's `jax.jit` and `jax.grad` (see the module docstring)."""
    import jax

    sak = _splash_kernel_module()
    unjitted = getattr(sak._splash_attention, "__wrapped__", None)
    missing = [name for name in ("fwd_mask_info", "dq_mask_info", "dkv_mask_info", "kwargs")
               if not hasattr(kernel, name)]
    if unjitted is None or missing:
        raise RuntimeError(f"this jax's Splash ({jax.__version__}) is not laid out as svg_lib expects "
                           f"(_splash_attention.__wrapped__, SplashAttentionKernel attributes; missing: "
                           f"{missing or ['__wrapped__']}), so it cannot be given a VMEM limit")

    def splash(q, k, v):
        # SplashAttentionKernel.__call__, minus the jit around it whose trace cache ignores our limit
        return unjitted(kernel.fwd_mask_info, kernel.dq_mask_info, kernel.dkv_mask_info, q, k, v, **kernel.kwargs)

    @jax.custom_vjp
    def run(q, k, v):
        return _trace_with_limit(vmem_limit_bytes, splash, q, k, v)

    def run_fwd(q, k, v):
        # jax.vjp's backward function is a pytree (its leaves are Splash's residuals)
        return _trace_with_limit(vmem_limit_bytes, lambda *a: jax.vjp(splash, *a), q, k, v)

    def run_bwd(splash_vjp, cotangent):
        return _trace_with_limit(vmem_limit_bytes, splash_vjp, cotangent)

    run.defvjp(run_fwd, run_bwd)
    return run
