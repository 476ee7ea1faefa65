"""Facts about TPU chips, the bottom of the package: one table of generations and how jax names them.

`TARGETS` holds, per generation the compiler can build for, what the series uses: VMEM, the
default scoped VMEM limit and SMEM per TensorCore, the MXU, peak bf16 throughput and HBM
bandwidth per chip. `parse_tpu_generation` reads a jax `device_kind` ("TPU v6 lite") as one of
those names ("v6e"). Nothing here imports jax at module level or knows about masks or kernels:
the memory estimates, the compiler and the runtime read their chip facts from here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MiB = 2**20
KiB = 2**10


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
    devices_per_chip: int = 1  # jax devices per chip: 2 on a v7x, whose TensorCores jax shows apart

    @property
    def megacore(self) -> bool:
        """True where two TensorCores are joined as one jax device (v4, v5p): Mosaic splits the steps of
        a kernel's "parallel" grid axes, taken together in grid order, between them (`parallel_split`;
        the static profile: svg_lib/data/megacore_split.json)."""
        return self.tensor_cores > self.devices_per_chip

    @property
    def describe(self) -> str:
        return (f"{self.name} ({self.device_kind}): VMEM {self.vmem_bytes // MiB} MiB "
                f"(default scoped {self.default_scoped_vmem // MiB} MiB), SMEM {self.smem_bytes // KiB} KiB, "
                f"{self.mxus_per_core} x {self.mxu}x{self.mxu} MXU per core")


# Single-chip topology names accepted by libtpu 0.0.42 with chips_per_host_bounds=(1, 1, 1).
# ("v5litepod-1" and "v7x:..." are refused; the v7x is named "tpu7x" there.) Memory, MXU and
# per-core figures agree with jax's own table (pltpu.get_tpu_info_for_chip, jax 0.10.2).
# A v7x chip holds two TensorCores that jax shows as two devices ("TPU7x"; "tpu7x:1x1x1" yields
# both, with equal `coords` and `core_on_chip` 0 and 1); its row gives
# per-chip peak figures (twice the per-core ones of jax's table), like the other rows. Its
# default scoped VMEM (32 MiB) is svg_lib.memory.vmem's figure, not one measured here.
TARGETS: dict[str, TpuTarget] = {t.name: t for t in (
    TpuTarget("v4", "v4:1x1x1", "TPU v4", 16 * MiB, 16 * MiB, 1 * MiB, 128, 4, 2, 275.0, 1200.0),
    TpuTarget("v5e", "v5e:1x1", "TPU v5 lite", 128 * MiB, 16 * MiB, 1 * MiB, 128, 4, 1, 197.0, 819.0),
    TpuTarget("v5p", "v5p:1x1x1", "TPU v5", 64 * MiB, 16 * MiB, 1 * MiB, 128, 4, 2, 459.0, 2765.0),
    TpuTarget("v6e", "v6e:1x1", "TPU v6 lite", 128 * MiB, 32 * MiB, 1 * MiB, 256, 2, 1, 918.0, 1640.0),
    TpuTarget("v7x", "tpu7x:1x1x1", "TPU7x", 64 * MiB, 32 * MiB, 1 * MiB, 256, 2, 2, 2310.0, 7400.0,
              devices_per_chip=2),
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


_TOPOLOGY = re.compile(r"([a-z0-9]+):([1-9]\d*(?:x[1-9]\d*){1,2})")


def check_topology(topology: str) -> str:
    """A slice's topology name as libtpu takes it ("v6e:2x4": a generation, then chips per axis), or a
    one-line ValueError naming the generations and the form. Checked here because libtpu's own
    refusal ("Invalid TPU external name") names neither. A series name is read as libtpu's
    ("v7x:2x2x1" is "tpu7x:2x2x1")."""
    prefixes = {t.topology.split(":")[0]: t for t in TARGETS.values()}
    prefixes.update({name: t for name, t in TARGETS.items()})
    m = _TOPOLOGY.fullmatch(topology) if isinstance(topology, str) else None
    if m is None or m[1] not in prefixes:
        forms = ", ".join(t.topology.split(":")[0] + ":" + "x".join("ABC"[:t.topology.count("x") + 1])
                          for t in TARGETS.values())
        raise ValueError(f"unknown TPU topology {topology!r}; give a generation and its chips per axis, one of "
                         f"{forms} (e.g. v6e:2x4, an 8-chip slice)")
    return prefixes[m[1]].topology.split(":")[0] + ":" + m[2]


# The clock a simulated cycle count is turned into time with: no chip's clock is published, so it is
# the clock at which MXUS_FOR_CLOCK[chip] MXUs (side^2 multiply-adds a cycle each) reach the chip's
# bf16 peak. The v5e's count agrees with TARGETS (4 of 128 x 128). For the v6e TARGETS says 2 of
# 256 x 256, but the static profile runs a 3328 x 1536 x 128 `q k^T` in fewer cycles than 2 such MXUs
# could (the committed reference), so 4 are assumed. An assumption either way: print it with every time.
MXUS_FOR_CLOCK = {"v5e": 4, "v6e": 4}


def clock_hz(chip: str) -> float:
    """The clock assumed for `chip` (`MXUS_FOR_CLOCK`): its bf16 peak over its MXUs' work per cycle."""
    t = check_target(chip)
    if chip not in MXUS_FOR_CLOCK:
        raise ValueError(f"no clock assumption for {chip}; one is made for {', '.join(MXUS_FOR_CLOCK)}")
    return t.bf16_tflops * 1e12 / (2 * MXUS_FOR_CLOCK[chip] * t.mxu ** 2 * t.tensor_cores)


def targets_table() -> str:
    """The TARGETS table as fixed-width text: memory, MXU and peak figures per generation."""
    cols = [("target", 6, "<"), ("topology", 12, "<"), ("device kind", 12, "<"), ("VMEM", 8, ">"),
            ("scoped", 7, ">"), ("SMEM", 8, ">"), ("MXU", 9, ">"), ("cores", 5, ">"), ("bf16 TF/s", 9, ">"),
            ("HBM GB/s", 8, ">")]
    rows = [[t.name, t.topology, t.device_kind, f"{t.vmem_bytes // MiB} MiB", f"{t.default_scoped_vmem // MiB} MiB",
             f"{t.smem_bytes // KiB} KiB", f"{t.mxus_per_core} x {t.mxu}", str(t.tensor_cores),
             f"{t.bf16_tflops:.0f}", f"{t.hbm_gbps:.0f}"] for t in TARGETS.values()]

    def fmt(cells):
        return "  ".join(f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, cols))

    head = fmt([c[0] for c in cols])
    lines = [head, "-" * len(head)] + [fmt(r) for r in rows]
    lines.append("VMEM, SMEM and MXUs per TensorCore (what one kernel sees; scoped: a kernel's VMEM limit unless "
                 "it asks for more); cores, bf16 peak and HBM bandwidth per chip.")
    return "\n".join(lines)


def parallel_split(extent: int, cores: int = 2) -> tuple:
    """How a megacore chip's `cores` TensorCores share a kernel's "parallel" grid steps (all parallel
    axes together, `extent` of them): contiguous ranges, one per core (the first ones one longer when it
    does not divide).

    >>> parallel_split(10)
    (range(0, 5), range(5, 10))
    """
    if isinstance(extent, bool) or not isinstance(extent, int) or extent < 1:
        raise ValueError(f"extent must be a positive int (the grid axis' length), got {extent!r}")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive int (2 on a v4 or v5p), got {cores!r}")
    size, extra = divmod(extent, cores)
    bounds = [0]
    for core in range(cores):
        bounds.append(bounds[-1] + size + (core < extra))
    return tuple(range(a, b) for a, b in zip(bounds, bounds[1:]))


# -- how jax names the generations ----------------------------------------------------------------

# The series' names for the TPU generations jax knows, keyed by jax's ChipVersion value.
# jax names v7 and later without the "v" ("7x"); we keep one spelling for all of them.
_JAX_CHIP_NAMES = {"v2": "v2", "v3": "v3", "v4": "v4", "v4i": "v4i", "v5e": "v5e", "v5p": "v5p",
                   "v6e": "v6e", "7": "v7", "7x": "v7x", "8i": "v8i"}
TPU_GENERATIONS = tuple(_JAX_CHIP_NAMES.values())


def _jax_chip_version(device_kind: str) -> str | None:
    """jax's own reading of `device_kind` ("v4i", "7x", ...), or None where this jax has none.

    `chip_version_from_device_kind` lives in a private module of recent jax (0.10 has it);
    older jax, down to our floor, may lack the function or the whole module."""
    try:
        from jax._src.pallas.mosaic import tpu_info
        version = tpu_info.chip_version_from_device_kind(device_kind)
    except (ImportError, AttributeError):
        return None
    return None if version is None else str(getattr(version, "value", version))


# Our own reading, for a jax without the function above. The strings jax reports:
# "TPU v2", "TPU v3", "TPU v4", "TPU v4 lite" (v4i), "TPU v5 lite" or "TPU v5e", "TPU v5" or
# "TPU v5p", "TPU v6 lite" or "TPU v6e", then "TPU7", "TPU7x", "TPU8i" from v7 on.
_DEVICE_KIND = re.compile(r"^\s*TPU\s*v?(\d+)\s*(lite|[a-z])?\s*$", flags=re.IGNORECASE)


def _parse_device_kind(device_kind: str) -> str | None:
    match = _DEVICE_KIND.match(str(device_kind))
    if match is None:
        return None
    number, suffix = int(match.group(1)), (match.group(2) or "").lower()
    if number in (2, 3) and not suffix:
        return f"v{number}"
    if number == 4:
        return {"": "v4", "lite": "v4i", "i": "v4i"}.get(suffix)
    if number == 5:
        return {"lite": "v5e", "e": "v5e", "": "v5p", "p": "v5p"}.get(suffix)
    if number == 6:
        return {"lite": "v6e", "e": "v6e"}.get(suffix)
    if number == 7:
        return {"": "v7", "x": "v7x"}.get(suffix)
    if number == 8:
        return {"i": "v8i"}.get(suffix)
    return None


def parse_tpu_generation(device_kind: str) -> str | None:
    """The TPU generation named by a jax `device_kind` string, or None if it names none we know.

    Uses jax's own table where the installed jax has one, our parser otherwise (both agree on
    every name below; tests check that). None for a CPU or GPU, and also for a TPU name that
    neither knows: callers that plan memory must treat that as an error, never as a v6e.

    >>> [parse_tpu_generation(s) for s in ("TPU v6 lite", "TPU v5 lite", "TPU v5", "TPU v4 lite",
    ...                                    "TPU7x", "cpu")]
    ['v6e', 'v5e', 'v5p', 'v4i', 'v7x', None]
    """
    chip = _jax_chip_version(str(device_kind))
    if chip is not None and chip in _JAX_CHIP_NAMES:
        return _JAX_CHIP_NAMES[chip]
    return _parse_device_kind(device_kind)
