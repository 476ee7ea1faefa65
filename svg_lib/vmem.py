"""VMEM estimates for the attention kernels, checked against the TPU they will run on.

`jax.export` lowers a kernel for TPU on any machine but cannot tell whether its blocks
fit in VMEM; this module does that arithmetic. Off a TPU, budgets are those of a v6e.
"""
from __future__ import annotations

from dataclasses import dataclass

from .masks import LANES, check_block_size

MiB = 2**20
# VMEM per TensorCore and the compiler's default scoped limit per kernel, by generation.
# Capacities as listed by jax's own TPU info table; the default scoped limit is what a
# kernel gets unless it asks for more with CompilerParams(vmem_limit_bytes=...).
VMEM_BYTES = {"v4": 16 * MiB, "v5e": 128 * MiB, "v5p": 64 * MiB, "v6e": 128 * MiB, "v7": 64 * MiB}
DEFAULT_SCOPED_BYTES = {"v4": 16 * MiB, "v5e": 16 * MiB, "v5p": 16 * MiB, "v6e": 32 * MiB, "v7": 32 * MiB}
OFFLINE_GENERATION = "v6e"  # what we plan for when no TPU is attached (the blog's chip)
HEADROOM = 0.85  # leave room for Mosaic's internal scratch and alignment padding

_MASKED_METHODS = ("b1", "b2", "b3", "dense")


@dataclass(frozen=True)
class VmemEstimate:
    """Bytes of VMEM one kernel instance needs, by kind of buffer."""

    method: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    dtype: str
    pipeline: int       # double-buffered q, k, v and output blocks
    scratch: int        # running max, sum (lane-replicated) and f32 accumulator
    intermediates: int  # scores, probabilities, and (for masking tiles) index and mask arrays
    generation: str
    capacity: int
    default_scoped: int

    @property
    def total(self) -> int:
        return self.pipeline + self.scratch + self.intermediates

    @property
    def budget(self) -> int:
        return int(self.capacity * HEADROOM)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    @property
    def vmem_limit_bytes(self) -> int | None:
        """What to pass as CompilerParams(vmem_limit_bytes=...); None when the default suffices."""
        want = int(self.total * 1.25) + 2 * MiB
        limit = int(min(-(-want // MiB) * MiB, self.budget))
        # asking for no more than the default would only ever lower it (v4's budget is below it)
        return limit if limit > self.default_scoped else None

    def __str__(self) -> str:
        return (f"{self.method} {self.block_q}x{self.block_kv} (compute {self.block_kv_compute}), head_dim "
                f"{self.head_dim}: {self.total / MiB:.1f} MiB of VMEM (pipeline {self.pipeline / MiB:.1f}, "
                f"scratch {self.scratch / MiB:.1f}, intermediates {self.intermediates / MiB:.1f}); "
                f"{self.generation} budget {self.budget / MiB:.0f} MiB")


def tpu_generation() -> str:
    """The attached TPU's generation ("v6e", ...), or the offline default when there is none."""
    from .runtime import detect_runtime
    gen = detect_runtime().tpu_generation
    return gen if gen in VMEM_BYTES else OFFLINE_GENERATION


def default_block_kv_compute(block_q: int, block_kv: int) -> int:
    """The largest multiple of 128 dividing block_kv that keeps a score slice <= 2M elements.

    2M f32 elements is 8 MiB per intermediate array: large enough to keep the MXU busy,
    small enough that the few intermediates of a tile fit comfortably next to the blocks.
    """
    best = LANES
    for c in range(LANES, block_kv + 1, LANES):
        if block_kv % c == 0 and block_q * c <= 2 * MiB:
            best = c
    return best


def estimate_vmem(method: str, block_q: int, block_kv: int, head_dim: int, dtype,
                  block_kv_compute: int | None = None, generation: str | None = None) -> VmemEstimate:
    """Estimate the VMEM of one kernel of `method` ("dense", "b1", "b2", "b3", "splash*")."""
    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    generation = generation or tpu_generation()
    if generation not in VMEM_BYTES:
        raise ValueError(f"unknown TPU generation {generation!r}; known: {', '.join(VMEM_BYTES)}")
    import jax.numpy as jnp  # bfloat16 is a jax dtype
    itemsize = jnp.dtype(dtype).itemsize
    pipeline = 2 * itemsize * head_dim * (2 * block_q + 2 * block_kv)  # q, out, k, v; two buffers each
    scratch = 4 * block_q * (2 * LANES + head_dim)
    chunk = block_q * block_kv_compute
    # s and p in f32 plus p in the input dtype; tiles that mask add two int32 index arrays
    # and a bool mask. Splash's computable masks build the same index arrays.
    per_element = 8 + itemsize + (9 if method in _MASKED_METHODS or method.startswith("splash") else 0)
    return VmemEstimate(method, block_q, block_kv, block_kv_compute, head_dim, jnp.dtype(dtype).name, pipeline, scratch,
                        chunk * per_element, generation, VMEM_BYTES[generation], DEFAULT_SCOPED_BYTES[generation])


def check_block_kv_compute(block_kv: int, block_kv_compute: int | None, block_q: int) -> int:
    """Validate block_kv_compute (None picks a default): a multiple of 128 dividing block_kv."""
    if block_kv_compute is None:
        return default_block_kv_compute(block_q, block_kv)
    block_kv_compute = check_block_size("block_kv_compute", block_kv_compute)
    if block_kv % block_kv_compute:
        divisors = [c for c in range(LANES, block_kv + 1, LANES) if block_kv % c == 0]
        raise ValueError(f"block_kv_compute={block_kv_compute} must divide block_kv={block_kv}; "
                         f"valid choices: {divisors}")
    return block_kv_compute


def check_fits(estimate: VmemEstimate) -> VmemEstimate:
    """Raise a ValueError with the numbers and a configuration that fits, if `estimate` does not."""
    if estimate.fits:
        return estimate
    e = estimate
    suggestion = None
    for bq in range(e.block_q, LANES - 1, -LANES):
        for c in sorted((c for c in range(LANES, e.block_kv + 1, LANES) if e.block_kv % c == 0), reverse=True):
            trial = estimate_vmem(e.method, bq, e.block_kv, e.head_dim, e.dtype, c, e.generation)
            if trial.fits:
                suggestion = trial
                break
        if suggestion:
            break
    hint = (f"; block_q={suggestion.block_q}, block_kv={suggestion.block_kv}, "
            f"block_kv_compute={suggestion.block_kv_compute} fits ({suggestion.total / MiB:.1f} MiB)"
            if suggestion else "; reduce block_kv")
    raise ValueError(f"tile configuration overflows VMEM: {e}{hint}")
