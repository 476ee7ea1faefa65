"""The XLA option that raises a chip's default scoped VMEM for one top-level `jax.jit`.

svg_lib's kernels carry their VMEM limit in their own pallas_calls' `CompilerParams`, Splash's
through `kernels.splash.with_vmem_limit` (`memory.vmem` says why): a limit there holds inside a
caller's `jax.jit`, where jax refuses compiler options. This is the other way, kept for a caller who
compiles a bare Splash kernel at the top level; the lesson's `attention(...)` does not use it.
"""
from __future__ import annotations

from svg_lib.memory.vmem import KiB, VmemEstimate


def compiler_options(estimate: VmemEstimate) -> dict:
    """XLA options for a top-level `jax.jit(..., compiler_options=...)` raising the default limit to
    `estimate.vmem_limit_bytes`; {} where the chip's default already covers it.

    The TPU compiler's `xla_tpu_scoped_vmem_limit_kib` raises the chip's default scoped limit
    (32 MiB on a v6e, 16 MiB on a v5e) for one compiled function; kernels that set
    vmem_limit_bytes are not affected. svg_lib no longer uses it (jax refuses compiler options
    on a jit nested inside a caller's, so a model could not call such a kernel): Splash gets
    `vmem_limit_bytes` in its own CompilerParams (`splash.with_vmem_limit`)."""
    limit = estimate.vmem_limit_bytes
    return {} if limit is None else {"xla_tpu_scoped_vmem_limit_kib": str(limit // KiB)}
