"""The problem the series solves, described once: presets, the case study's figures, `BenchConfig`.

A problem is q, k, v of shape `[heads, tokens, head_dim]` from a video geometry, the spatial SVG
mask at a density, a dtype, and the tile sizes (`block_q` x `block_kv`, each key tile processed
`block_kv_compute` keys at a time). `Preset` names the three sizes the series works at (tiny,
small, blog); `BenchConfig` is the one description that the benchmark, the tuner, lowering,
compiling and the cost probes all take. Pure Python over `svg_lib.core`: no jax at import.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import LANES, SVGMask, check_block_size

MiB = 2**20


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


# The Google Developers blog case study "Accelerating Spatio-Temporal Attention for Video
# Diffusion on TPUs" (BRIEF section 1): synthetic bf16 inputs, 75,600 tokens, 10 heads,
# head dim 128, BQ 3328, BKV 1536, one TPU v6e chip. Milliseconds per attention call.
BLOG_V6E_MS = {"splash_dense": 78.70, "b1": 96.37, "b2": 54.12, "b3": 32.76}
# The same study's block-size sweep of B2 with BKV = 1536: BQ -> ms.
BLOG_SWEEP_V6E_MS = {1024: 66.88, 3328: 54.12, 4864: 58.62}
# The problem those figures were measured on.
BLOG_PROBLEM = {"frames": 21, "height": 45, "width": 80, "text_tokens": 0, "heads": 10, "head_dim": 128,
                "block_q": 3328, "block_kv": 1536, "dtype": "bfloat16"}

DEFAULT_METHODS = ("splash_dense", "dense", "splash", "b1", "b2", "b3")
PALLAS_METHODS = ("dense", "splash_dense", "splash", "b1", "b2", "b3")
_DTYPES = ("float32", "bfloat16")


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        return dtype
    import numpy as np  # jax's ml_dtypes registers bfloat16 with numpy
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark problem: q, k, v are `[heads, geometry.tokens, head_dim]` arrays of `dtype`.

    The mask is the spatial SVG mask at `density` (`.mask()`); `block_q` x `block_kv` tiles,
    with each key tile processed `block_kv_compute` keys at a time (None: the default).
    """

    geometry: VideoGeometry
    heads: int
    head_dim: int
    density: float
    block_q: int
    block_kv: int
    block_kv_compute: int | None = None
    dtype: str = "bfloat16"
    first_frame_sink: bool = True

    def __post_init__(self):
        if not isinstance(self.geometry, VideoGeometry):
            raise TypeError(f"geometry must be a VideoGeometry, got {type(self.geometry).__name__}")
        for name in ("heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        d = self.density
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or not 0.0 < d <= 1.0:
            raise ValueError(f"density must be in (0, 1] (the band's share of the pairs, as the case study defines it, e.g. 0.35; plan stats give the kept fraction), got {d!r}")
        check_block_size("block_q", self.block_q)
        check_block_size("block_kv", self.block_kv)
        if self.block_kv_compute is not None:
            check_block_kv_compute(self.block_kv, self.block_kv_compute, self.block_q)
        dtype = _dtype_name(self.dtype)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)  # always the name, so the config is JSON-ready

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "BenchConfig":
        """The config of preset `name` ("tiny", "small", "blog") with some fields replaced.

        `overrides` are field names (geometry, heads, head_dim, density, block_q, block_kv,
        block_kv_compute, dtype, first_frame_sink) or geometry parts (frames, height, width,
        text_tokens).
        """
        p = get_preset(name)
        geo_parts = {key: overrides.pop(key) for key in ("frames", "height", "width", "text_tokens")
                     if key in overrides}
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"unknown BenchConfig field(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(sorted(fields | {'frames', 'height', 'width', 'text_tokens'}))}")
        geometry = overrides.pop("geometry", p.geometry)
        if geo_parts:
            geometry = dataclasses.replace(geometry, **geo_parts)
        values = dict(geometry=geometry, heads=p.heads, head_dim=p.head_dim, density=p.density,
                      block_q=p.block_q, block_kv=p.block_kv, dtype=p.dtype)
        values.update(overrides)
        return cls(**values)

    @property
    def tokens(self) -> int:
        return self.geometry.tokens

    @property
    def shape(self) -> tuple[int, int, int]:
        """`(heads, tokens, head_dim)`: the shape of q, k and v."""
        return (self.heads, self.tokens, self.head_dim)

    @property
    def is_blog_problem(self) -> bool:
        """True when the geometry, heads, head dim and dtype are the case study's."""
        g = self.geometry
        mine = {"frames": g.frames, "height": g.height, "width": g.width, "text_tokens": g.text_tokens,
                "heads": self.heads, "head_dim": self.head_dim, "dtype": self.dtype}
        return all(BLOG_PROBLEM[k] == v for k, v in mine.items())

    def mask(self) -> SVGMask:
        """The spatial-head SVG mask of this problem."""
        return SVGMask.spatial(self.geometry, self.density, first_frame_sink=self.first_frame_sink)

    def describe(self) -> str:
        """One line: problem size, dtype, density, blocks."""
        compute = f" (compute {self.block_kv_compute})" if self.block_kv_compute else ""
        sink = "" if self.first_frame_sink else ", no sink"
        return (f"{self.geometry}, {self.heads} heads x {self.head_dim}, {self.dtype}, density {self.density}"
                f"{sink}, blocks {self.block_q} x {self.block_kv}{compute}")

    def to_json(self) -> dict:
        g = self.geometry
        return {"frames": g.frames, "height": g.height, "width": g.width, "text_tokens": g.text_tokens,
                "heads": self.heads, "head_dim": self.head_dim, "density": self.density,
                "block_q": self.block_q, "block_kv": self.block_kv, "block_kv_compute": self.block_kv_compute,
                "dtype": self.dtype, "first_frame_sink": self.first_frame_sink, "tokens": self.tokens}

    @classmethod
    def from_json(cls, data: dict) -> "BenchConfig":
        geometry = VideoGeometry(data["frames"], data["height"], data["width"], data.get("text_tokens", 0))
        return cls(geometry, data["heads"], data["head_dim"], data["density"], data["block_q"], data["block_kv"],
                   data.get("block_kv_compute"), data.get("dtype", "bfloat16"), data.get("first_frame_sink", True))


def default_block_kv_compute(block_q: int, block_kv: int) -> int:
    """The largest multiple of 128 dividing block_kv that keeps a score slice <= 2M elements.

    2M f32 elements is 8 MiB per intermediate array: large enough to keep the MXU busy,
    small enough that the few intermediates of a tile fit comfortably next to the blocks.
    """
    best = LANES
    for c in range(LANES, block_kv + 1, LANES):
        if block_kv % c == 0 and block_q * c <= 2 * MiB:
            best = c
    return best


def check_block_kv_compute(block_kv: int, block_kv_compute: int | None, block_q: int) -> int:
    """Validate block_kv_compute (None picks a default): a multiple of 128 dividing block_kv."""
    if block_kv_compute is None:
        return default_block_kv_compute(block_q, block_kv)
    block_kv_compute = check_block_size("block_kv_compute", block_kv_compute)
    if block_kv % block_kv_compute:
        divisors = [c for c in range(LANES, block_kv + 1, LANES) if block_kv % c == 0]
        raise ValueError(f"block_kv_compute={block_kv_compute} must divide block_kv={block_kv}; "
                         f"valid choices: {divisors}")
    return block_kv_compute
