"""VMEM estimates for the attention kernels: arithmetic, known before anything is built.

`jax.export` lowers a kernel for TPU on any machine but cannot tell whether its blocks fit in
VMEM; this module does that arithmetic. `svg_lib.instruments.tpu.checks` holds it against the real TPU
compiler (libtpu, compile-only, on this CPU: `compile_check`, `verify_against_compiler`,
`largest_block_q`); what that found is in CONTRIBUTING.md ("Measurements behind the kernels").

Capacities come from one table, `svg_lib.chips.TARGETS` (v4, v5e, v5p, v6e); on a TPU, from
`pltpu.get_tpu_info()` where jax has it. Off a TPU we plan for a v6e (the blog's chip); on a
TPU whose device kind we do not recognise we refuse to guess (`svg_lib.runtime.attached_tpu_memory`).

The estimate (`estimate_vmem`) counts, per kernel instance:
  pipeline       q, out, k, v blocks, double-buffered (Splash adds its mask: a [block_q,
                 block_kv] int32 block double-buffered for a mask given as blocks, a
                 [block_q, 128] int32 index block for a computable one);
  scratch        running max and sum ([block_q, 128] f32 each) and the f32 accumulator;
  intermediates  the score slice [block_q, block_kv_compute] in f32 twice, in the input dtype
                 once, and for masking tiles two int32 index arrays and a bool mask.
It fits when the total is within 85 % of the chip's VMEM, and asks for a scoped limit of 1.25 x
the total + 2 MiB (capped there) when that exceeds the chip's default scoped limit, through each
kernel's `CompilerParams(vmem_limit_bytes=...)`: our kernels pass it themselves; Splash, whose
`make_splash_mha` takes none, gets it in its pallas_calls' CompilerParams by
`splash.with_vmem_limit`. Either way the limit is part of the traced program, so it holds
inside a caller's `jax.jit` (a jit's `compiler_options`,
`svg_lib.extensions.top_level_vmem.compiler_options`, would only be accepted on the outermost jit).

The estimate is conservative, by its intermediates term mostly: where it says "fits" the kernel
compiles, where the compiler refuses it refuses too, and in between it refuses tiles the compiler
would take (tests/test_vmem.py holds points on each side; CONTRIBUTING.md, "Measurements behind the
kernels", says what the compiler checks and where its boundary lies, data/largest_block_q.json).
"""
from __future__ import annotations

from dataclasses import dataclass

from svg_lib.core.masks import LANES, check_block_size
from svg_lib.methods import BACKWARD_METHODS, METHODS, SPLASH_METHODS
from svg_lib.problem import PALLAS_METHODS, check_block_kv_compute, check_dtype, check_method
from svg_lib.runtime import tpu_memory

MiB = 2**20
KiB = 2**10
HEADROOM = 0.85  # leave room for Mosaic's internal scratch and alignment padding
# the fused backward's estimate is fitted to the compiler's scoped allocation, not counted: less room
FUSED_HEADROOM = 0.95

SPLASH_MASK_FORMS = ("full", "blocks", "computable")  # see splash.splash_mask_form


@dataclass(frozen=True)
class VmemEstimate:
    """Bytes of VMEM one kernel instance needs, by kind of buffer, and what it asks the compiler for."""

    method: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    dtype: str
    pipeline: int       # double-buffered q, k, v and output blocks (+ Splash's mask blocks, `mask_table`)
    scratch: int        # running max, sum (lane-replicated) and f32 accumulator
    intermediates: int  # scores, probabilities, and (for masking tiles) index and mask arrays
    generation: str
    capacity: int
    default_scoped: int | None
    splash_mask: str | None = None  # how Splash holds its mask: "full", "blocks", "computable"
    mask_table: int = 0             # the part of `pipeline` that is Splash's mask blocks / q indices

    @property
    def total(self) -> int:
        return self.pipeline + self.scratch + self.intermediates

    @property
    def budget(self) -> int:
        return int(self.capacity * (FUSED_HEADROOM if self.method.endswith(":fused") else HEADROOM))

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    @property
    def vmem_limit_bytes(self) -> int | None:
        """The scoped VMEM limit to ask for (CompilerParams(vmem_limit_bytes=...), Splash's through
        `splash.with_vmem_limit`); None when the chip's default scoped limit already covers it."""
        want = int(self.total * 1.25) + 2 * MiB
        limit = int(min(-(-want // MiB) * MiB, self.budget))
        if self.default_scoped is None:  # a chip whose default we do not know: always say
            return limit
        # asking for no more than the default would only ever lower it (v4's budget is below it)
        return limit if limit > self.default_scoped else None

    def __str__(self) -> str:
        form = f", mask {self.splash_mask}" if self.splash_mask else ""
        return (f"{self.method} {self.block_q}x{self.block_kv} (compute {self.block_kv_compute}{form}), head_dim "
                f"{self.head_dim}: {self.total / MiB:.1f} MiB of VMEM (pipeline {self.pipeline / MiB:.1f}, "
                f"scratch {self.scratch / MiB:.1f}, intermediates {self.intermediates / MiB:.1f}); "
                f"{self.generation} budget {self.budget / MiB:.0f} MiB")


def estimate_vmem(method: str, block_q: int, block_kv: int, head_dim: int, dtype,
                  block_kv_compute: int | None = None, generation: str | None = None, *,
                  splash_mask: str | None = None, q_len: int | None = None) -> VmemEstimate:
    """Estimate the VMEM of one kernel of `method` ("dense", "b1", "b2", "b3", "splash_dense", "splash").

    `splash_mask` says how a Splash method holds its mask (`splash.splash_mask_form`): "blocks"
    (the default, the costliest: a `[block_q, block_kv]` int32 mask block, double-buffered),
    "computable" (a `[block_q, 128]` int32 index block) or "full" (nothing). A backward kernel
    of dense, b1, b2 or b3 is named with its pass: "b3:dq", "b3:dkv", or "b3:fused", which holds a
    whole head's dq and so needs `q_len`, the padded query count (`svg_lib.kernels.backward`).
    """
    if not (isinstance(method, str) and ":" in method):
        check_method(method, PALLAS_METHODS)
    check_dtype(dtype)
    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    memory = tpu_memory(generation)
    if ":" in method:
        return _estimate_backward(method, block_q, block_kv, head_dim, dtype, block_kv_compute, memory, q_len)
    record = METHODS[method]
    splash = record.splash
    if splash:
        splash_mask = splash_mask or "blocks"
        if splash_mask not in SPLASH_MASK_FORMS:
            raise ValueError(f"splash_mask must be one of {SPLASH_MASK_FORMS}, got {splash_mask!r}")
    elif splash_mask is not None:
        raise ValueError(f"splash_mask applies to {SPLASH_METHODS} only, not {method!r}")
    import jax.numpy as jnp  # bfloat16 is a jax dtype
    itemsize = jnp.dtype(dtype).itemsize
    # Splash's mask buffers, double-buffered like q, k, v (a bool block is int32 in VMEM)
    mask_table = {None: 0, "full": 0, "blocks": 2 * 4 * block_q * block_kv,
                  "computable": 2 * 4 * block_q * LANES}[splash_mask]
    pipeline = 2 * itemsize * head_dim * (2 * block_q + 2 * block_kv) + mask_table  # q, out, k, v
    scratch = 4 * block_q * (2 * LANES + head_dim)
    chunk = block_q * block_kv_compute
    # s and p in f32 plus p in the input dtype; tiles that mask add two int32 index arrays
    # and a bool mask (Splash: a slice of its int32 mask block and a bool, or two index arrays
    # and a bool). Splash multiplies p by v in f32, so it also holds a f32 copy of a v chunk.
    masks = splash_mask != "full" if splash else record.tile_masks
    per_element = 8 + itemsize + (9 if masks else 0)
    intermediates = chunk * per_element + (4 * block_kv_compute * head_dim if splash else 0)
    return VmemEstimate(method, block_q, block_kv, block_kv_compute, head_dim, jnp.dtype(dtype).name, pipeline,
                        scratch, intermediates, memory.generation, memory.vmem_bytes, memory.default_scoped,
                        splash_mask, mask_table)


BACKWARD_PASSES = ("dq", "dkv", "fused")
# VMEM per score element of a backward kernel's per-tile values, by input itemsize: fitted to the
# TPU compiler (about 1.3x above what it kept), not counted (CONTRIBUTING.md, "Measurements behind the kernels").
_BACKWARD_BYTES_PER_SCORE = {2: {"dq": 6, "dkv": 8, "fused": 5}, 4: {"dq": 17, "dkv": 18, "fused": 19}}


def _estimate_backward(method, block_q, block_kv, head_dim, dtype, block_kv_compute, memory,
                       q_len=None) -> VmemEstimate:
    """The backward kernels' VMEM (svg_lib.kernels.backward), counted like the forward's.

    dq: q, do, dq blocks `[block_q, head_dim]`, k, v blocks, lse and D rows (`[1, block_q]` f32,
    padded to 8 sublanes), all double-buffered; an f32 dq accumulator; per score element what the
    compiler was measured to keep (`_BACKWARD_BYTES_PER_SCORE`). dkv: q, do blocks, k, v, dk, dv
    blocks, the same lse and D rows; f32 dk and dv accumulators; per element likewise. fused: dkv's blocks and
    accumulators, one head's whole dq accumulator (f32 `[q_len, head_dim]`; it leaves for HBM a query
    tile at a time through a `[block_q, head_dim]` buffer, not through a pipelined block), per element
    as dkv, and dq's `[block_q, head_dim]` f32 product.
    """
    import jax.numpy as jnp
    stage, _, which = method.partition(":")
    if stage not in BACKWARD_METHODS or which not in BACKWARD_PASSES:
        raise ValueError(f"backward kernels are named '<stage>:<pass>' with stage in {BACKWARD_METHODS} and pass "
                         f"in {BACKWARD_PASSES} (e.g. 'b3:dkv'), got {method!r}")
    itemsize = jnp.dtype(dtype).itemsize
    chunk = block_q * block_kv_compute
    extra = 0
    if which == "dq":
        pipeline = 2 * (itemsize * head_dim * (3 * block_q + 2 * block_kv) + 2 * 4 * 8 * block_q)
        scratch = 4 * block_q * head_dim
    else:
        pipeline = 2 * (itemsize * head_dim * (2 * block_q + 4 * block_kv) + 2 * 4 * 8 * block_q)
        scratch = 2 * 4 * block_kv * head_dim
    per_element = _BACKWARD_BYTES_PER_SCORE[itemsize][which]
    if which == "fused":
        if q_len is None or q_len < block_q or q_len % block_q:
            raise ValueError(f"the fused backward holds a whole head's dq: give q_len, the padded query count "
                             f"(a multiple of block_q={block_q}), got {q_len!r}")
        scratch += 4 * q_len * head_dim + itemsize * block_q * head_dim  # and the buffer dq leaves through
        extra = 4 * block_q * head_dim
    intermediates = chunk * per_element + extra
    return VmemEstimate(method, block_q, block_kv, block_kv_compute, head_dim, jnp.dtype(dtype).name, pipeline,
                        scratch, intermediates, memory.generation, memory.vmem_bytes, memory.default_scoped)


def check_fits(estimate: VmemEstimate) -> VmemEstimate:
    """Raise a ValueError with the numbers and a configuration that fits, if `estimate` does not."""
    if estimate.fits:
        return estimate
    e = estimate
    # block_q and smaller, at each the compute slices that divide block_kv, largest first: the first that fits
    trials = (estimate_vmem(e.method, bq, e.block_kv, e.head_dim, e.dtype, c, e.generation, splash_mask=e.splash_mask)
              for bq in range(e.block_q, LANES - 1, -LANES)
              for c in sorted((c for c in range(LANES, e.block_kv + 1, LANES) if e.block_kv % c == 0), reverse=True))
    suggestion = next((trial for trial in trials if trial.fits), None)
    hint = (f"; block_q={suggestion.block_q}, block_kv={suggestion.block_kv}, "
            f"block_kv_compute={suggestion.block_kv_compute} fits ({suggestion.total / MiB:.1f} MiB)"
            if suggestion else "; reduce block_kv")
    raise ValueError(f"tile configuration overflows VMEM: {e}{hint}")
