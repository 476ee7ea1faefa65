"""The sharded SVG layer compiled for a TPU slice that is not attached (libtpu, compile-only).

`compile_sharded_layer` builds `svg_lib.layers.multichip`'s layer over every chip of a
compile-only topology ("v6e:2x4": an 8-chip slice), compiles it on this CPU, and reports the
collectives the SPMD partitioner inserted and the per-chip memory. Nothing runs.
`python -m svg_lib sharded` (svg_lib/cli/sharded.py) prints the report for the case study's layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from svg_lib.layers.multichip import build_sharded_svg_attention, hlo_collectives
from svg_lib.problem import get_preset
from svg_lib.tpu.compiler import compile_only_topology, compile_placed

EVIDENCE = "compiled for TPU (libtpu, compile-only {topology}), not run"


@dataclass(frozen=True)
class ShardedCompileReport:
    """The sharded SVG layer compiled for a TPU slice that is not attached: its collectives and memory.

    `collectives`: `{kind: Collective}` (per chip); `memory`: the compiler's per-chip
    `memory_analysis()` in bytes (argument, output, temp, alias, generated code). Nothing
    ran: `evidence` says so.
    """

    permute: str
    topology: str
    chips: int
    method: str
    heads: int
    tokens: int
    head_dim: int
    dtype: str
    block_q: int
    block_kv: int
    seconds: float
    collectives: dict
    memory: dict
    compiled: object = field(default=None, repr=False, compare=False)

    @property
    def evidence(self) -> str:
        return EVIDENCE.format(topology=self.topology)

    def describe(self) -> str:
        """A few lines: configuration, collectives present, per-chip memory."""
        lines = [f"permute={self.permute!r}: {self.heads} heads x {self.head_dim}, {self.tokens:,} tokens, "
                 f"{self.dtype}, {self.method.upper()} {self.block_q}x{self.block_kv}, over {self.chips} chips "
                 f"({self.heads // self.chips} heads per chip); {self.evidence}, {self.seconds:.0f} s"]
        for c in self.collectives.values():
            if c.count:
                lines.append(f"  {c.kind:18} x{c.count}: {c.operand_bytes / 2**20:8.1f} MiB in, "
                             f"{c.result_bytes / 2**20:8.1f} MiB out per chip  ({', '.join(sorted(set(c.shapes)))})")
        lines.append("  per chip: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.memory.items()))
        return "\n".join(lines)


def compile_sharded_layer(mask=None, *, permute: str = "after", heads: int = 40, head_dim: int = 128,
                          dtype="bfloat16", method: str = "b3", block_q: int = 3328, block_kv: int = 1536,
                          block_kv_compute: int | None = None, target: str = "v6e",
                          topology: str = "v6e:2x4") -> ShardedCompileReport:
    """Compile the sharded SVG layer for a TPU slice on this CPU (libtpu); nothing runs.

    Defaults: one Wan2.1-14B attention layer as in the case study (40 heads of 128, 75,600
    tokens of the `blog` preset's mask, bf16, B3 with 3328 x 1536 blocks) over an 8-chip v6e
    slice ("v6e:2x4"). The mesh spans every chip of `topology`; q, k, v arrive
    sequence-sharded (`[heads, tokens, head_dim]`, tokens split over the chips), the flags
    replicated. Raises what the compiler raises (e.g. a VMEM overflow), and a RuntimeError
    saying how to install libtpu when it is missing.
    """
    import time

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mask = get_preset("blog").mask() if mask is None else mask
    devices = compile_only_topology(target, topology).devices
    mesh = Mesh(np.array(devices), ("x",))
    tokens = mask.tokens
    f = build_sharded_svg_attention(mask, mesh=mesh, permute=permute, method=method, heads=heads, tokens=tokens,
                                    head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv,
                                    block_kv_compute=block_kv_compute, interpret=False)
    x = jax.ShapeDtypeStruct((heads, tokens, head_dim), jnp.dtype(dtype),
                             sharding=NamedSharding(mesh, P(None, "x", None)))
    flags = jax.ShapeDtypeStruct((heads,), jnp.bool_, sharding=NamedSharding(mesh, P()))
    start = time.perf_counter()
    compiled = compile_placed(f, (x, x, x, flags))  # Colab's older libtpu too (see compile_placed)
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    memory = {name: int(getattr(stats, f"{name}_size_in_bytes"))
              for name in ("argument", "output", "temp", "alias", "generated_code")}
    return ShardedCompileReport(permute, topology, len(devices), method, heads, tokens, head_dim,
                                jnp.dtype(dtype).name, block_q, block_kv, seconds, hlo_collectives(compiled),
                                memory, compiled)
