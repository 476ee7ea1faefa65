"""The sharded SVG layer compiled for a TPU slice that is not attached (libtpu, compile-only).

`compile_sharded_layer` builds `svg_lib.layers.multichip`'s layer over every chip of a
compile-only topology ("v6e:2x4": an 8-chip slice), compiles it on this CPU, and reports the
collectives the SPMD partitioner inserted and the per-chip memory. Nothing runs.
`python -m svg_lib sharded` (svg_lib/cli/sharded.py) prints the report for the case study's layer.

`compile_split_attention` does the same for one v7x chip, whose two TensorCores jax shows as two
devices: `attention()`'s heads split over both (its default there) or all on one, per-device
kernel shapes and memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from svg_lib.attention import build_attention
from svg_lib.chips import check_target
from svg_lib.layers.multichip import plain_shape, build_sharded_svg_attention, hlo_collectives
from svg_lib.methods import check_method
from svg_lib.problem import get_preset
from svg_lib.runtime import chip_devices
from svg_lib.instruments.tpu.compiler import compile_only_topology, compile_placed

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


# -- one v7x chip: attention's heads split over its two TensorCores ----------------------------------

_KERNEL_CALL = re.compile(r"=\s*(.+?)\s+custom-call\(.*custom_call_target=\"tpu_custom_call\"")


def kernel_result_shapes(hlo) -> list:
    """The result shape of every Mosaic kernel (`tpu_custom_call`) in a compiled program, layout
    stripped ("bf16[5,76544,128]"; a kernel with several results: "bf16[...], f32[...]"): what one
    device's kernel computes. `hlo`: text or a compiled object."""
    text = hlo if isinstance(hlo, str) else hlo.as_text()
    return [plain_shape(m.group(1)) for m in map(_KERNEL_CALL.search, text.splitlines()) if m]


@dataclass(frozen=True)
class SplitCompileReport:
    """`attention()`'s kernels compiled for one chip of `topology`, over `devices` of its jax devices.

    `kernel_shapes`: each Mosaic kernel's per-device result (its leading axis: the heads one device
    runs); `memory`: the compiler's per-device `memory_analysis()` in bytes. Nothing ran.
    """

    topology: str
    devices: int
    method: str
    heads: int
    tokens: int
    head_dim: int
    dtype: str
    block_q: int
    block_kv: int
    seconds: float
    kernel_shapes: tuple
    memory: dict
    compiled: object = field(default=None, repr=False, compare=False)

    @property
    def evidence(self) -> str:
        return EVIDENCE.format(topology=self.topology)

    def describe(self) -> str:
        where = "one device" if self.devices == 1 else f"{self.devices} devices ({self.heads // self.devices} heads each)"
        return (f"{self.method.upper()} {self.heads} heads x {self.head_dim}, {self.tokens:,} tokens, {self.dtype}, "
                f"{self.block_q}x{self.block_kv} on {where}; kernels {', '.join(self.kernel_shapes)} per device; "
                + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.memory.items())
                + f" per device; {self.evidence}, {self.seconds:.0f} s")


def compile_split_attention(config=None, *, method: str = "b3", split: bool = True, target: str = "v7x",
                            topology: str | None = None) -> SplitCompileReport:
    """Compile `attention()`'s kernels for one `target` chip (default a v7x: "tpu7x:1x1x1", two
    TensorCores that jax shows as two devices), heads split over the chip's devices (`split`) or all on
    its first device (what attention() did before the split, and does with split_heads=False).

    `config`: a svg_lib.problem.BenchConfig (default: the `blog` preset). The inputs are placed
    as attention() places them: split on the head axis over the devices, or on the first device.
    Raises what the compiler raises; ValueError where the heads do not split or the chip has one device.
    """
    import time

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
    from jax.sharding import PartitionSpec as P

    config = get_preset("blog") if config is None else config
    spec = check_target(target)
    topology = topology or spec.topology
    devices = chip_devices(compile_only_topology(target, topology).devices[0])
    if split and len(devices) < 2:
        raise ValueError(f"{topology} shows one device per chip ({spec.device_kind}); the split needs a chip whose "
                         f"TensorCores are separate devices (v7x). Use split=False")
    devices = devices if split else devices[:1]
    mask = None if check_method(method).dense else config.mask()
    f = build_attention(mask, method=method, heads=config.heads, tokens=config.tokens, head_dim=config.head_dim,
                        dtype=config.dtype, block_q=config.block_q, block_kv=config.block_kv,
                        block_kv_compute=config.block_kv_compute, interpret=False, generation=spec.name,
                        devices=devices if split else None)
    if split:
        placed = NamedSharding(Mesh(np.array(devices, dtype=object), ("cores",)), P("cores", None, None))
    else:
        placed = SingleDeviceSharding(devices[0])
    x = jax.ShapeDtypeStruct(config.shape, jnp.dtype(config.dtype), sharding=placed)
    start = time.perf_counter()
    compiled = compile_placed(f, (x, x, x))
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    memory = {name: int(getattr(stats, f"{name}_size_in_bytes"))
              for name in ("argument", "output", "temp", "alias", "generated_code")}
    return SplitCompileReport(topology, len(devices), method, config.heads, config.tokens, config.head_dim,
                              jnp.dtype(config.dtype).name, config.block_q, config.block_kv, seconds,
                              tuple(kernel_result_shapes(compiled)), memory, compiled)
