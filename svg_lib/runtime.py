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


def parse_tpu_generation(device_kind: str) -> str | None:
    """The TPU generation named by a jax `device_kind` string, or None if it names no TPU.

    >>> [parse_tpu_generation(s) for s in ("TPU v6 lite", "TPU v5 lite", "TPU v5p", "TPU v4", "cpu")]
    ['v6e', 'v5e', 'v5p', 'v4', None]
    """
    match = re.search(r"\bTPU\s*v?(\d+)\s*(lite|e|p)?\b", str(device_kind), flags=re.IGNORECASE)
    if match is None:
        return None
    number, suffix = match.group(1), (match.group(2) or "").lower()
    if suffix in ("lite", "e"):
        return f"v{number}e"  # jax reports the "e" (efficiency) chips as "lite"
    if suffix == "p" or number == "5":
        return f"v{number}p"  # a bare "TPU v5" is the v5p (the v5e always says "lite")
    return f"v{number}"


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
        """e.g. "v6e" on a TPU v6e ("TPU v6 lite"); None off TPU or for an unknown name."""
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
