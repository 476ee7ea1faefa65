"""The real TPU compiler, run on this machine's CPU: compile for a TPU that is not attached.

The `libtpu` wheel holds the whole TPU compiler. JAX can hand it a *compile-only* device of
a named topology (`jax.experimental.topologies.get_topology_desc`), and `jax.jit(f).lower(
...).compile()` then compiles for that chip exactly as it would on a TPU VM: Mosaic kernels
included, VMEM and SMEM allocated and checked, nothing run. This is the strongest TPU
evidence the series has without a TPU (stronger than `jax.export` lowering, which stops
before any memory is allocated); it is still not a measurement of speed.

    from svg_lib.compiler import compile_only_device, compile_fn
    device = compile_only_device("v6e")
    compiled, seconds = compile_fn(f, [((10, 75_600, 128), "bfloat16")] * 3, target="v6e")
    compiled.memory_analysis()

Installing libtpu changes nothing for a CPU reader: `jax.devices()` still returns the CPU
and kernels still run in interpret mode. libtpu is needed only for what this module does;
without it, `require_libtpu()` raises with the pip command that installs it.

jax is imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import time
from dataclasses import dataclass

MiB = 2**20
KiB = 2**10

INSTALL_HINT = ('pip install -e ".[tpu-compile]"  (from the repository root; `make lab` and '
                "`make test` install it). It pins libtpu to the version the installed jax expects.")


@dataclass(frozen=True)
class TpuTarget:
    """One TPU generation the compiler can build for, with the facts the series uses.

    Memory figures are per TensorCore, as the compiler enforces them.
    """

    name: str              # the series' name for it: "v6e", "v5e", ...
    topology: str          # single-chip topology name get_topology_desc accepts
    device_kind: str       # what jax reports for that chip ("TPU v6 lite")
    vmem_bytes: int        # VMEM per TensorCore
    default_scoped_vmem: int  # a kernel's VMEM limit unless it asks for more (vmem_limit_bytes)
    smem_bytes: int        # SMEM per TensorCore: where scalar-prefetched tables live
    mxu: int               # MXU side: 128 x 128 before v6, 256 x 256 from v6
    mxus_per_core: int
    tensor_cores: int      # TensorCores per chip (a v4 / v5p "megacore" chip shows as one device)
    bf16_tflops: float     # peak bf16 TFLOP/s per chip (public spec sheets)
    hbm_gbps: float        # HBM bandwidth per chip, GB/s (public spec sheets)

    def describe(self) -> str:
        return (f"{self.name} ({self.device_kind}): VMEM {self.vmem_bytes // MiB} MiB "
                f"(default scoped {self.default_scoped_vmem // MiB} MiB), SMEM {self.smem_bytes // KiB} KiB, "
                f"{self.mxus_per_core} x {self.mxu}x{self.mxu} MXU per core")


# Single-chip topology names accepted by libtpu 0.0.42 with chips_per_host_bounds=(1, 1, 1).
# ("v5litepod-1" and "v7x:..." are refused; the v7x is named "tpu7x" there.)
TARGETS: dict[str, TpuTarget] = {t.name: t for t in (
    TpuTarget("v4", "v4:1x1x1", "TPU v4", 16 * MiB, 16 * MiB, 1 * MiB, 128, 4, 2, 275.0, 1200.0),
    TpuTarget("v5e", "v5e:1x1", "TPU v5 lite", 128 * MiB, 16 * MiB, 1 * MiB, 128, 4, 1, 197.0, 819.0),
    TpuTarget("v5p", "v5p:1x1x1", "TPU v5", 64 * MiB, 16 * MiB, 1 * MiB, 128, 4, 2, 459.0, 2765.0),
    TpuTarget("v6e", "v6e:1x1", "TPU v6 lite", 128 * MiB, 32 * MiB, 1 * MiB, 256, 2, 1, 918.0, 1640.0),
)}
DEFAULT_TARGET = "v6e"  # the case study's chip


def check_target(target: str) -> TpuTarget:
    """The TpuTarget named `target` ("v6e", ...), or a ValueError listing the known ones."""
    if isinstance(target, TpuTarget):
        return target
    try:
        return TARGETS[target]
    except (KeyError, TypeError):
        raise ValueError(f"unknown TPU target {target!r}; the compiler can build for "
                         f"{', '.join(TARGETS)}") from None


def has_libtpu() -> bool:
    """True when the libtpu wheel (the TPU compiler) is installed."""
    import importlib.util
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """Raise a RuntimeError that says how to install libtpu, if it is missing."""
    if not has_libtpu():
        raise RuntimeError("compiling for TPU on this machine needs the TPU compiler from the libtpu "
                           f"wheel, which is not installed. Install it with: {INSTALL_HINT}")


def allow_shared_libtpu() -> None:
    """Let several processes load libtpu when no TPU is attached (called by `import svg_lib`).

    Must run before jax first initialises its backends in a process, hence at import."""
    # libtpu takes a lock file so that two processes never drive the same TPU chips. With no
    # TPU attached there are no chips to protect, and the lock would only stop a second
    # process (a notebook kernel beside a test run) from compiling. On a TPU host (device
    # files present) the lock stays.
    if not glob.glob("/dev/accel*") and not os.path.isdir("/dev/vfio"):
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        # Without these, libtpu's start-up (when jax first looks for devices) prints several
        # lines of warnings about the TPU slice it cannot find, into every notebook's output.
        # With no TPU attached they name nothing real: jax still falls back to the CPU, and a
        # compile-only topology names its own generation (same compiler verdicts either way).
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")



@functools.lru_cache(maxsize=None)
def compile_only_topology(target: str = DEFAULT_TARGET, topology: str | None = None):
    """jax's TopologyDescription for `target` (single chip), or for an explicit topology name
    such as "v6e:2x4" (an 8-chip slice), without any TPU attached."""
    require_libtpu()
    from jax.experimental import topologies

    spec = check_target(target)
    return topologies.get_topology_desc(platform="tpu", topology_name=topology or spec.topology,
                                        chips_per_host_bounds=(1, 1, 1))


def compile_only_device(target: str = DEFAULT_TARGET):
    """A compile-only jax Device of one `target` chip: give it to ShapeDtypeStruct shardings."""
    return compile_only_topology(target).devices[0]


def shape_structs(shapes, target: str = DEFAULT_TARGET):
    """`[(shape, dtype), ...]` -> ShapeDtypeStructs placed on `target`'s compile-only device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(compile_only_device(target))
    return [jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding) for shape, dtype in shapes]


def compile_fn(fn, shapes, target: str = DEFAULT_TARGET):
    """Compile `fn(*args)` for `target` with args of `shapes` `[(shape, dtype), ...]`.

    Returns `(compiled, seconds)`; the compiler's errors (a VMEM or SMEM overflow, an
    unsupported op) propagate as they are: see `classify_error`.
    """
    import jax

    args = shape_structs(shapes, target)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - start


_OOM = re.compile(r"(CompileTimeScopedVmemOom|Ran out of memory in memory space (\w+)|"
                  r"Scoped allocation with size ([\d.]+\w?) and limit ([\d.]+\w?))")


def classify_error(err: BaseException) -> str:
    """"vmem", "smem" or "compile": what kind of refusal a compiler error is."""
    text = str(err)
    if "CompileTimeScopedVmemOom" in text or "memory space vmem" in text:
        return "vmem"
    if "memory space smem" in text:
        return "smem"
    return "compile"


def first_lines(err: BaseException, lines: int = 4) -> str:
    """The exception's type and its first few lines: compiler messages can run to pages."""
    text = f"{type(err).__name__}: {err}".strip()
    keep = [line for line in text.splitlines() if line.strip()]
    return "\n".join(keep[:lines])
