"""Where the code runs: `detect_runtime()` tells a notebook whether Pallas TPU kernels will
compile (on a TPU) or run in interpret mode (everywhere else), so a notebook never hard-codes a
device; `tpu_memory()` says how much VMEM and SMEM the TPU planned for has (the attached one, or a
v6e off TPU), what `svg_lib.memory`'s estimates are held against; `split_backward_is_faster` which
backward keeps a megacore's two TensorCores busy. The problem sizes the series uses (presets) live in
`svg_lib.problem`.

jax is imported inside functions only: importing this module stays cheap.
"""
from __future__ import annotations

from dataclasses import dataclass

from svg_lib.chips import TARGETS, parse_tpu_generation


@dataclass(frozen=True)
class Runtime:
    """What `jax.devices()` reports, and what that means for the Pallas kernels."""

    platform: str      # "tpu" | "gpu" | "cpu"
    device_kind: str   # e.g. "TPU v6 lite"; "cpu" on a CPU
    device_count: int
    jax_version: str
    compiled: bool     # True only on a TPU: Pallas TPU kernels compile to Mosaic there

    @property
    def mode(self) -> str:
        """"compiled" on a TPU, "interpret" elsewhere (the kernels run as an XLA loop)."""
        return "compiled" if self.compiled else "interpret"

    @property
    def tpu_generation(self) -> str | None:
        """e.g. "v6e" on a TPU v6e ("TPU v6 lite"); None off TPU or for a TPU name we do not know
        (see `tpu_generation` below, which refuses to plan for such a chip)."""
        return parse_tpu_generation(self.device_kind) if self.platform == "tpu" else None

    def banner(self) -> str:
        """One line for the top of a notebook: jax version, devices, and how kernels run."""
        devices = f"{self.device_count} device{'s' if self.device_count != 1 else ''}"
        where = self.platform if self.device_kind.lower() == self.platform else f"{self.platform} {self.device_kind}"
        if self.compiled:
            gen = f", {self.tpu_generation}" if self.tpu_generation else ""
            kernels = f"kernels: compiled (Mosaic{gen})"
        else:
            kernels = "kernels: interpret mode (no TPU)"
        return f"jax {self.jax_version} | {where} ({devices}) | {kernels}"


def detect_runtime() -> Runtime:
    """Inspect jax's default backend (the first device decides the platform)."""
    import jax

    devices = jax.devices()
    first = devices[0]
    platform = str(first.platform).lower()
    kind = str(getattr(first, "device_kind", platform) or platform)
    return Runtime(platform=platform, device_kind=kind, device_count=len(devices),
                   jax_version=jax.__version__, compiled=platform == "tpu")


def default_interpret() -> bool:
    """The `interpret=` a Pallas TPU kernel needs here: True unless running on a TPU."""
    return not detect_runtime().compiled


# -- the TPU's memory: what the VMEM and SMEM estimates (svg_lib.memory) plan for ------------------

OFFLINE_GENERATION = "v6e"  # what we plan for when no TPU is attached (the blog's chip)


@dataclass(frozen=True)
class TpuMemory:
    """Per-TensorCore memory of one TPU generation, and where the numbers came from."""

    generation: str
    vmem_bytes: int
    default_scoped: int | None  # a kernel's VMEM limit unless it asks; None: not known for this chip
    smem_bytes: int | None
    source: str  # "compile targets (svg_lib.chips.TARGETS)" or "pltpu.get_tpu_info() on this TPU"


def _from_target(generation: str) -> TpuMemory:
    t = TARGETS[generation]
    return TpuMemory(generation, t.vmem_bytes, t.default_scoped_vmem, t.smem_bytes,
                     "compile targets (svg_lib.chips.TARGETS)")


def attached_tpu_memory(runtime=None) -> TpuMemory:
    """The attached TPU's generation and memory; a RuntimeError for a TPU we cannot plan for.

    Capacities come from `pltpu.get_tpu_info()` where the installed jax has it, else from the
    compile-target table. A TPU whose device kind we do not recognise is an error: planning it
    as a v6e (128 MiB) would overflow chips with 64 MiB or less."""
    runtime = runtime or detect_runtime()
    if runtime.platform != "tpu":
        raise RuntimeError(f"no TPU attached (jax reports {runtime.platform} {runtime.device_kind!r})")
    generation = runtime.tpu_generation
    if generation is None:
        raise RuntimeError(f"this TPU reports device_kind {runtime.device_kind!r}, which svg_lib does not "
                           f"recognise (jax {runtime.jax_version}); it will not guess its VMEM. Known "
                           f"generations: {', '.join(_known_generations())}. Pass generation=... to "
                           "estimate_vmem explicitly, or upgrade jax and svg_lib.")
    info = _tpu_info()
    default = TARGETS[generation].default_scoped_vmem if generation in TARGETS else None
    if info is not None:
        return TpuMemory(generation, int(info.vmem_capacity_bytes), default,
                         int(getattr(info, "smem_capacity_bytes", 0)) or None, "pltpu.get_tpu_info() on this TPU")
    if generation in TARGETS:
        return _from_target(generation)
    raise RuntimeError(f"this TPU is a {generation}, but the installed jax {runtime.jax_version} has no "
                       "pltpu.get_tpu_info() to report its VMEM and svg_lib has no table entry for it; "
                       "upgrade jax (0.10 has it) or pass generation=... explicitly")


def _tpu_info():
    """pltpu.get_tpu_info() for the attached TPU, or None where this jax lacks it."""
    try:
        from jax.experimental.pallas import tpu as pltpu
        get = pltpu.get_tpu_info
    except (ImportError, AttributeError):
        return None
    return get()


def _known_generations():
    return tuple(TARGETS)


def tpu_memory(generation: str | None = None) -> TpuMemory:
    """Memory facts for `generation` ("v6e", ...); None means the attached TPU, or the offline v6e.

    Named generations come from `svg_lib.chips.TARGETS` (the chips the compiler on this
    machine builds for: one table for both); another name is accepted only when it is the
    attached TPU's, with its capacity from `pltpu.get_tpu_info()`."""
    if generation is None:
        runtime = detect_runtime()
        return attached_tpu_memory(runtime) if runtime.platform == "tpu" else _from_target(OFFLINE_GENERATION)
    if generation in TARGETS:
        return _from_target(generation)
    runtime = detect_runtime()
    if runtime.platform == "tpu" and runtime.tpu_generation == generation:
        return attached_tpu_memory(runtime)
    raise ValueError(f"unknown TPU generation {generation!r}; known: {', '.join(TARGETS)}"
                     + (f" and the attached {runtime.tpu_generation}" if runtime.tpu_generation else ""))


def tpu_generation() -> str:
    """The attached TPU's generation ("v6e", ...), or the offline default when there is none.

    Raises a RuntimeError on a TPU we do not recognise (see `attached_tpu_memory`)."""
    return tpu_memory(None).generation


def smem_capacity(generation: str | None = None) -> tuple[str, int]:
    """(generation, SMEM bytes per core); the attached TPU's (or the offline v6e's) when None.

    From the same table as VMEM (`tpu_memory`: the compile targets, or
    `pltpu.get_tpu_info()` on an attached TPU)."""
    memory = tpu_memory(generation)
    if not memory.smem_bytes:
        raise ValueError(f"no SMEM capacity known for TPU generation {memory.generation!r} ({memory.source})")
    return memory.generation, memory.smem_bytes


# -- a megacore's two TensorCores (v4, v5p: one jax device): which backward keeps both busy ------

# On a megacore chip (v4, v5p: two TensorCores, one jax device) the split backward's cycles per head, as a
# fraction of the fused backward's for one head: 0.699 to 0.707 by the static profile of a v5p, rounded up
# (CONTRIBUTING.md, "Fused or split backward on a megacore").
MEGACORE_SPLIT_PER_HEAD = 0.71


def split_backward_is_faster(heads: int, generation: str | None) -> bool:
    """Whether the split backward beats the fused one for `heads` heads on `generation` (None: the
    attached TPU, or the offline v6e), by the static profile's figures.

    Only a megacore chip (`TpuTarget.megacore`: v4, v5p) can differ: its two TensorCores share the
    steps of a kernel's "parallel" grid axes. The fused kernel has only its head axis parallel, so its
    heads split between the cores, ceil(heads / 2) of them on the busier one; the split kernels have
    heads and tiles parallel, so both cores share every head, at 0.71 of one head's fused cycles per
    head (`MEGACORE_SPLIT_PER_HEAD`: the dq and dk/dv kernels do 7 matmuls per tile against the fused
    kernel's 5, halved). Split wins where heads x 0.71 < ceil(heads / 2): one head only. A v4, the other
    megacore, takes the v5p's figures: its static profile aborts in libtpu 0.0.42.1 (the profiler's DMA
    latency model). On every other chip each TensorCore is its own device and the fused backward stays
    the faster one.
    """
    target = TARGETS.get(tpu_memory(generation).generation)
    if target is None or not target.megacore:
        return False
    return heads * MEGACORE_SPLIT_PER_HEAD < -(-heads // 2)


# -- a v7x chip's two TensorCores: two jax devices, heads split between them ----------------------

def chip_devices(device=None) -> tuple:
    """The jax devices of the chip that holds `device` (default: jax's first device), in core order.

    Two on a v7x, whose TensorCores jax shows as separate devices (same `coords`, `core_on_chip`
    0 and 1); `(device,)` on every other chip (one TensorCore, or a v4 / v5p megacore that is one
    device) and off TPU. Compile-only devices (`jax.experimental.topologies`) work the same way.
    """
    import jax

    device = jax.devices()[0] if device is None else device
    generation = parse_tpu_generation(getattr(device, "device_kind", "")) if device.platform == "tpu" else None
    target = TARGETS.get(generation)
    if target is None or target.devices_per_chip < 2:
        return (device,)
    client = getattr(device, "client", None)
    pool = client.devices() if client is not None else jax.devices()

    def chip(d):
        return tuple(getattr(d, "coords", ())), getattr(d, "slice_index", 0), d.process_index

    same = [d for d in pool if chip(d) == chip(device)]
    return tuple(sorted(same, key=lambda d: getattr(d, "core_on_chip", 0))) if device in same else (device,)


def check_head_split(devices, heads: int) -> tuple:
    """`devices` as a tuple, after checking that `heads` split evenly over two or more distinct devices."""
    try:
        devices = tuple(devices)
    except TypeError:
        raise TypeError(f"devices must be a sequence of jax devices, got {type(devices).__name__}") from None
    if len(devices) < 2 or len(set(devices)) != len(devices) or not all(hasattr(d, "platform") for d in devices):
        raise ValueError(f"splitting heads needs two or more distinct jax devices (e.g. a v7x chip's two "
                         f"TensorCores, runtime.chip_devices()), got {devices!r}")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or heads % len(devices):
        raise ValueError(f"{heads!r} heads do not split evenly over {len(devices)} devices; use a head count "
                         f"divisible by {len(devices)}, or one device (split_heads=False)")
    return devices


def head_split_devices(x, heads: int, split_heads=None):
    """The devices `attention()` splits its heads over for input `x` (q), or None for one device.

    `split_heads`: False -> None. A sequence of devices -> those (checked). True -> the chip's
    devices, or a ValueError where the chip shows one device or the heads do not divide. None (the
    default) -> the chip's two devices on a v7x, and None everywhere else, also on a v7x when:
    the head count is odd; `x` is an array already spread over several devices (the caller placed
    it); under a trace, a mesh of the caller's is active (a shard_map or `jax.set_mesh`), or jax sees
    more devices than one chip's (a slice: the caller's program decides the placement there).
    """
    import jax

    if split_heads is False:
        return None
    if split_heads is not None and split_heads is not True:
        if isinstance(split_heads, (str, bytes, int, float)):
            raise TypeError(f"split_heads must be None, True, False or a sequence of devices, got {split_heads!r}")
        return check_head_split(split_heads, heads)
    traced = isinstance(x, jax.core.Tracer)
    placed = () if traced else tuple(getattr(getattr(x, "sharding", None), "device_set", ()))
    if split_heads is None:
        if heads % 2 or len(placed) > 1:
            return None
        if traced:
            current_mesh = getattr(jax.sharding, "get_abstract_mesh", lambda: None)  # jax >= 0.5
            if getattr(current_mesh(), "axis_names", ()) or len(jax.devices()) != 2:
                return None
    devices = chip_devices(placed[0] if len(placed) == 1 else None)
    if len(devices) < 2:
        if split_heads is None:
            return None
        raise ValueError(f"split_heads=True needs a chip whose TensorCores jax shows as separate devices (a v7x); "
                         f"{devices[0].device_kind if hasattr(devices[0], 'device_kind') else devices[0]} shows "
                         "one. Pass the devices to split over, or split_heads=None / False")
    return check_head_split(devices, heads)


def shard_heads(fn, devices, heads: int, per_head: int = 0):
    """`fn(q, k, v, *flags) -> out` (built for `heads // len(devices)` heads) run on `heads` heads split
    evenly over `devices`: a `jax.shard_map` whose every device runs `fn` on its own contiguous block
    of heads.

    q, k, v and the result are `[heads, tokens, head_dim]`, and the `per_head` arrays after them
    (the routed layers' `is_temporal`) `[heads]`, all sharded on the head axis over a 1-D mesh of
    `devices` (axis "cores"). Differentiable, and usable inside a caller's jax.jit as long as the
    caller's arguments are not committed to other devices (jax refuses mixed placements).
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    devices = check_head_split(devices, heads)
    mesh = Mesh(np.array(devices, dtype=object), ("cores",))
    spec = P("cores", None, None)
    # check_vma=False: a pallas_call declares a plain out_shape, which shard_map's type check would
    # reject; every value here is split over the axis anyway
    return jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 3 + (P("cores"),) * per_head, out_specs=spec,
                         check_vma=False)


def run_split(fn, devices, *args):
    """`fn(*args)` built by `shard_heads` over `devices`. Concrete arguments committed to one device
    are moved onto the split first and the result put back on that device, so the caller sees no
    new placement; traced or uncommitted ones go straight in."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    first = args[0]
    if isinstance(first, jax.core.Tracer) or not getattr(first, "committed", False):
        return fn(*args)
    mesh = Mesh(np.array(devices, dtype=object), ("cores",))
    moved = [jax.device_put(x, NamedSharding(mesh, P("cores", *(None,) * (np.ndim(x) - 1)))) for x in args]
    return jax.device_put(fn(*moved), first.sharding)
