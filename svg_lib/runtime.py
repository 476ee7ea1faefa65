"""Where the code runs, and the problem sizes the series uses.

`detect_runtime()` tells a notebook whether Pallas TPU kernels will compile (on a
TPU) or run in interpret mode (everywhere else), so a notebook never hard-codes a
device. The presets name the three sizes the series works at: `tiny` for tests and
race checks, `small` (blog-shaped, but small enough for interpret mode on a CPU) and
`blog` (the case study's 75,600 tokens, used for plans and Mosaic lowering on CPU).

jax is imported inside functions only: importing this module stays cheap.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .geometry import VideoGeometry
from .masks import SVGMask, check_block_size


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
        (see `svg_lib.vmem.tpu_generation`, which refuses to plan for such a chip)."""
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


@dataclass(frozen=True)
class Preset:
    """A named problem size: video geometry, heads, block sizes, mask density and dtype.

    q, k, v for a preset are shaped `[heads, geometry.tokens, head_dim]`.
    """

    name: str
    geometry: VideoGeometry
    heads: int
    head_dim: int
    block_q: int
    block_kv: int
    density: float
    dtype: str  # a dtype name ("float32", "bfloat16"), so this module needs no jax

    def __post_init__(self):
        check_block_size("block_q", self.block_q)
        check_block_size("block_kv", self.block_kv)

    @property
    def tokens(self) -> int:
        return self.geometry.tokens

    @property
    def shape(self) -> tuple[int, int, int]:
        """`(heads, tokens, head_dim)`: the shape of q, k and v."""
        return (self.heads, self.tokens, self.head_dim)

    def mask(self, first_frame_sink: bool = True) -> SVGMask:
        """The spatial-head SVG mask at this preset's density."""
        return SVGMask.spatial(self.geometry, self.density, first_frame_sink=first_frame_sink)

    def __str__(self) -> str:
        return (f"{self.name}: {self.geometry}, {self.heads} heads x {self.head_dim}, "
                f"blocks {self.block_q}x{self.block_kv}, density {self.density}, {self.dtype}")


PRESETS: dict[str, Preset] = {
    # 3 x 3 tiles of 128 that already hold all three tile classes; small enough for race-checking interpret mode
    "tiny": Preset("tiny", VideoGeometry(3, 8, 16), heads=2, head_dim=128, block_q=128, block_kv=128,
                   density=0.35, dtype="float32"),
    # the blog's 21 frames and its frame-to-block proportions, scaled down so interpret mode on a CPU copes
    "small": Preset("small", VideoGeometry(21, 16, 30), heads=2, head_dim=128, block_q=512, block_kv=256,
                    density=0.35, dtype="bfloat16"),
    # the case study: Wan 2.1 720p, 81 frames -> 21 latent frames of 45 x 80 tokens, 10 heads per chip
    "blog": Preset("blog", VideoGeometry(21, 45, 80), heads=10, head_dim=128, block_q=3328, block_kv=1536,
                   density=0.35, dtype="bfloat16"),
}


def get_preset(name: str) -> Preset:
    """Look up a preset by name ("tiny", "small" or "blog")."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


def notebook_data_file(name: str):
    """The path of `notebooks/data/<name>` in the checkout svg_lib was imported from.

    Found relative to the svg_lib package, not the working directory: a notebook may run from
    the repository root, from notebooks/, or on Colab from /content. A missing file raises
    FileNotFoundError naming the path looked at and how the files get there.
    """
    from pathlib import Path

    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"name must be a plain file name inside notebooks/data, got {name!r}")
    folder = Path(__file__).resolve().parent.parent / "notebooks" / "data"
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: svg_lib was imported from {Path(__file__).resolve().parent}, and the recorded "
            f"data the notebooks read lives in notebooks/data of the same checkout. Use a full clone of the "
            f"repository (pip install -e <clone>), not an installed copy of svg_lib alone")
    return path
