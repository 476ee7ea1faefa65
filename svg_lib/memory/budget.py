"""One memory check per built attention: VMEM and SMEM of every kernel it may run, on one plan.

`build_attention` plans once (the tile classes and both schedules, `planner.KernelTables`),
then calls `check_memory` once on that plan, then builds the kernels from the tables and the
limits this returns. The forward is checked now: blocks that overflow VMEM, or a schedule
that overflows SMEM, are refused before anything is built. The backward passes are checked
now too, but a refusal is kept and raised only when a gradient is traced
(`MemoryBudget.backward_limits`): a forward-only caller can use blocks whose backward would
not fit.
"""
from __future__ import annotations

from dataclasses import dataclass

from svg_lib.core.planner import KernelTables, TilePlan
from svg_lib.memory.smem import SmemEstimate, SmemOverflowError, check_schedule_fits, estimate_smem
from svg_lib.memory.vmem import VmemEstimate, check_fits, estimate_vmem
from svg_lib.methods import METHODS
from svg_lib.runtime import split_backward_is_faster

BACKWARD_FORMS = ("fused", "split")


@dataclass(frozen=True)
class MemoryBudget:
    """What one built attention may use of a TPU core's memory.

    `forward`: the forward kernel's VMEM estimate (it fits). `smem`: its schedule's SMEM, None
    for kernels that read no schedule (dense, Splash's own tables). `backward_form`: which backward
    a gradient runs, "fused" (one kernel: `kernels.backward.attention_fused`) or "split" (the dq
    and dk/dv kernels); `backward`: its kernels' VMEM estimates, `(fused,)` or `(dq, dkv)` (None
    for Splash, whose backward is its own), and `backward_refusal` the error a gradient would
    raise, or None when they fit.
    """

    forward: VmemEstimate
    smem: SmemEstimate | None = None
    backward: tuple[VmemEstimate, ...] | None = None
    backward_refusal: ValueError | None = None
    backward_form: str | None = None

    @property
    def forward_limit(self) -> int | None:
        """The forward kernel's scoped VMEM limit (None: the chip's default covers it)."""
        return self.forward.vmem_limit_bytes

    def backward_limits(self) -> tuple[str, tuple[int | None, ...]]:
        """`(form, limits)`: the backward's form and its kernels' VMEM limits (`(fused,)` or `(dq, dkv)`);
        raises the kept refusal if they do not fit."""
        if self.backward_refusal is not None:
            raise type(self.backward_refusal)(str(self.backward_refusal))
        if self.backward is None:
            raise ValueError(f"{self.forward.method} has no backward kernels of svg_lib's")
        return self.backward_form, tuple(e.vmem_limit_bytes for e in self.backward)


def check_memory(method: str, *, heads: int, head_dim: int, dtype, block_q: int, block_kv: int,
                 block_kv_compute: int | None = None, generation: str | None = None,
                 plan: TilePlan | None = None, tables: KernelTables | None = None,
                 splash_mask: str | None = None, q_len: int | None = None,
                 backward: str | None = None) -> MemoryBudget:
    """Check `method`'s kernels at these blocks against `generation`'s VMEM and SMEM, once.

    `plan`: the forward's tile plan (b1, b2, b3: its schedule is checked against SMEM, and a
    refusal names larger blocks that fit); `tables`: the schedules the backward reads (dense,
    b1, b2, b3); `splash_mask`: how a Splash method holds its mask (`splash.splash_mask_form`).
    `backward`: "fused", "split", or None to take the fused backward wherever one head's dq fits
    in VMEM beside it (`q_len` padded query rows; the split form otherwise), except where the split
    one is faster (`split_backward_is_faster`: one head on a megacore v4 or v5p).
    Raises a ValueError for a forward that does not fit; returns a `MemoryBudget`.
    """
    if backward not in (None,) + BACKWARD_FORMS:
        raise ValueError(f"backward must be one of {BACKWARD_FORMS} or None (the fused one where it fits), "
                         f"got {backward!r}")
    forward = check_fits(estimate_vmem(method, block_q, block_kv, head_dim, dtype, block_kv_compute, generation,
                                       splash_mask=splash_mask))
    if METHODS[method].splash:
        return MemoryBudget(forward)
    smem = None if plan is None else check_schedule_fits(plan, method=method, heads=heads, generation=generation)
    if tables is None and METHODS[method].planned:  # dense's backward, like its forward, reads no table
        raise ValueError(f"{method} needs its kernel tables (TilePlan.tables) to check its backward")
    def estimate(which):
        return estimate_vmem(f"{method}:{which}", block_q, block_kv, head_dim, dtype, block_kv_compute, generation,
                             q_len=q_len)
    form = backward
    if form is None:
        form = "fused" if q_len is not None and estimate("fused").fits else "split"
        if form == "fused" and split_backward_is_faster(heads, generation):
            form = "split"
    kernels = (estimate("fused"),) if form == "fused" else (estimate("dq"), estimate("dkv"))
    # the fused kernel walks the transposed schedule only; the split form walks both
    tables_read = () if tables is None else (("transposed schedule", tables.schedule_t),) + (
        (("schedule", tables.schedule),) if form == "split" else ())
    refusal = None
    try:
        for name, table in tables_read:
            estimate = estimate_smem({name: table.shape}, generation)
            if not estimate.fits:
                raise SmemOverflowError(f"the backward's {name} ({table.size:,} words) overflows SMEM: "
                                        f"{estimate}; use larger blocks")
        for kernel in kernels:
            if form == "fused" and not kernel.fits:  # check_fits would suggest blocks; here the cure is the split form
                raise ValueError(f"the fused backward holds one head's dq in VMEM and overflows it: {kernel}; "
                                 f"use backward='split' (or None, which picks it)")
            check_fits(kernel)
    except ValueError as err:
        refusal = err
    return MemoryBudget(forward, smem, kernels, refusal, form)
