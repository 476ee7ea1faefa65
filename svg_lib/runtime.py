"""Where the code runs: `detect_runtime()` tells a notebook whether Pallas TPU kernels will
compile (on a TPU) or run in interpret mode (everywhere else), so a notebook never hard-codes a
device. The problem sizes the series uses (presets) live in `svg_lib.problem`.

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
        (see `svg_lib.memory.vmem.tpu_generation`, which refuses to plan for such a chip)."""
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
