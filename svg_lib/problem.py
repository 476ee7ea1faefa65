"""The problem the series solves, described once: presets, the case study's figures, `BenchConfig`.

A problem is q, k, v of shape `[heads, tokens, head_dim]` from a video geometry, the spatial SVG
mask at a density, a dtype, and the tile sizes (`block_q` x `block_kv`, each key tile processed
`block_kv_compute` keys at a time). `BenchConfig` is that description, the one the benchmark,
the tuner, lowering, compiling and the cost model all take; `PRESETS` are the sizes the series
works at (tiny, walkthrough, routing, small, blog), each a `BenchConfig` with a name (`Preset` is
the same class). The case study's published figures are here too, once, for every notebook and
tool that quotes them (notebook 00, section 7 prints them all).
Pure Python over `svg_lib.core`: no jax at import.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from svg_lib import methods
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import LANES, Mask, check_block_size
from svg_lib.core.svg_masks import SVGMask

MiB = 2**20


# The Google Developers blog case study "Accelerating Spatio-Temporal Attention for Video
# Diffusion on TPUs" (2026-09-30, BLOG_URL; BRIEF section 1): synthetic bf16 inputs, 75,600 tokens,
# 10 heads, head dim 128, BQ 3328, BKV 1536, one TPU v6e chip. Milliseconds per attention call.
BLOG_URL = ("https://developers.googleblog.com/en/"
            "accelerating-spatio-temporal-attention-for-video-diffusion-on-tpus/")
BLOG_V6E_MS = {"splash_dense": 78.70, "b1": 96.37, "b2": 54.12, "b3": 32.76}
# The same study's block-size sweep of B2 with BKV = 1536: BQ -> ms.
BLOG_SWEEP_V6E_MS = {1024: 66.88, 3328: 54.12, 4864: 58.62}
# They were measured on the "blog" preset's problem (`PRESETS["blog"]`, `BenchConfig.is_blog_problem`).
# Its temporal-head benchmark, one v6e: the permutation as a gather around the kernel ("physical")
# against the permutation handled inside the kernel ("in_kernel"), ms.
BLOG_TEMPORAL_V6E_MS = {"physical": 44.40, "in_kernel": 74.14}
# Multi-chip inference (v6e chips): attention latency with the permutation before or after the
# head all-to-all, ms.
BLOG_MULTICHIP_MS = {"before": 75.64, "after": 46.81}
# End to end, Wan 2.x on 8 v6e chips, 40 denoising steps, per resolution: speed-up over dense,
# PSNR against the dense model's video in dB (None: not reported), attention's share of a layer's
# latency (None: not reported).
BLOG_END_TO_END = {"720p": (1.28, None, 0.555), "1080p": (1.49, 24.66, None), "1440p": (1.69, 24.05, 0.882)}

DEFAULT_METHODS = methods.DEFAULT_METHODS
PALLAS_METHODS = methods.PALLAS_METHODS
_DTYPES = ("float32", "bfloat16")


def check_method(method, allowed=PALLAS_METHODS, what: str = "method") -> str:
    """`method` if it is one of `allowed`, else a one-line ValueError listing the valid names.

    The one place a method name is checked (the memory estimates, the cost model, the tuner,
    the command lines call it with their own `allowed`), so that a misspelt name ("B2", "b5",
    "") is refused, never estimated as some other kernel."""
    if isinstance(method, str) and method in allowed:
        return method
    close = [m for m in allowed if isinstance(method, str) and m == method.strip().lower()]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown {what} {method!r}{hint}; valid: {', '.join(allowed)}")


def check_dtype(dtype) -> str:
    """The name of `dtype` ("float32" or "bfloat16", what the kernels support), else a one-line
    ValueError listing them. Takes a name, a numpy or a jax dtype."""
    name = _dtype_name(dtype)
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; the kernels take {' or '.join(_DTYPES)}")
    return name


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
    """One problem: q, k, v are `[heads, geometry.tokens, head_dim]` arrays of `dtype`.

    The mask is the spatial SVG mask at `density` (`.mask()`); `block_q` x `block_kv` tiles,
    with each key tile processed `block_kv_compute` keys at a time (None: the default). The
    benchmark, the tuner, lowering, compiling and the cost model all take one; a preset
    (`PRESETS`, `get_preset`) is one with a `name`, which takes no part in comparisons.
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
    name: str | None = dataclasses.field(default=None, compare=False)

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
        dtype = check_dtype(self.dtype)
        object.__setattr__(self, "dtype", dtype)  # always the name, so the config is JSON-ready

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "BenchConfig":
        """The config of preset `name` (e.g. "tiny", "small", "blog") with some fields replaced.

        `overrides` are field names (geometry, heads, head_dim, density, block_q, block_kv,
        block_kv_compute, dtype, first_frame_sink, name) or geometry parts (frames, height, width,
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
        changed = geometry != p.geometry or any(getattr(p, key) != value for key, value in overrides.items())
        overrides.setdefault("name", None if changed else p.name)  # a changed preset is no longer that preset
        return dataclasses.replace(p, geometry=geometry, **overrides)

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
        blog = PRESETS["blog"]
        return (self.geometry, self.heads, self.head_dim, self.dtype) == (blog.geometry, blog.heads, blog.head_dim,
                                                                          blog.dtype)

    def mask(self, first_frame_sink: bool | None = None) -> SVGMask:
        """The spatial-head SVG mask of this problem (`first_frame_sink`: None keeps the problem's)."""
        sink = self.first_frame_sink if first_frame_sink is None else first_frame_sink
        return SVGMask.spatial(self.geometry, self.density, first_frame_sink=sink)

    def __str__(self) -> str:
        return f"{self.name}: {self.describe()}" if self.name else self.describe()

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


PRESETS: dict[str, BenchConfig] = {
    # 3 x 3 tiles of 128 that already hold all three tile classes; small enough for race-checking interpret mode
    "tiny": BenchConfig(VideoGeometry(3, 8, 16), heads=2, head_dim=128, block_q=128, block_kv=128,
                        density=0.35, dtype="float32", name="tiny"),
    # the kernel walkthrough of notebooks 01 to 06 and the appendix: the blog's 21 frames, one head, padding in
    # both axes (2,520 tokens in 10 x 20 tiles of 256 x 128), fast in interpret mode
    "walkthrough": BenchConfig(VideoGeometry(21, 8, 15), heads=1, head_dim=128, block_q=256, block_kv=128,
                               density=0.35, dtype="bfloat16", name="walkthrough"),
    # the heads of notebooks 07 to 09: 8 frames of 16 x 16 tokens (one frame = two 128-token tiles), 8 heads
    # split into spatial and temporal ones, float32 so that routed and reference outputs compare closely
    "routing": BenchConfig(VideoGeometry(8, 16, 16), heads=8, head_dim=64, block_q=128, block_kv=128,
                           density=0.35, dtype="float32", name="routing"),
    # the blog's 21 frames and its frame-to-block proportions, scaled down so interpret mode on a CPU copes
    "small": BenchConfig(VideoGeometry(21, 16, 30), heads=2, head_dim=128, block_q=512, block_kv=256,
                         density=0.35, dtype="bfloat16", name="small"),
    # the case study: Wan 2.1 720p, 81 frames -> 21 latent frames of 45 x 80 tokens, 10 heads per chip
    "blog": BenchConfig(VideoGeometry(21, 45, 80), heads=10, head_dim=128, block_q=3328, block_kv=1536,
                        density=0.35, dtype="bfloat16", name="blog"),
}


def get_preset(name: str, **overrides) -> BenchConfig:
    """Look up a preset by name (one of `PRESETS`: tiny, walkthrough, routing, small, blog).

    With `overrides` (e.g. `get_preset("walkthrough", block_q=512, density=0.25)`) it is
    `BenchConfig.from_preset(name, **overrides)`: the fields are checked like any config's, and a
    preset with a changed field loses its name.
    """
    if overrides:
        return BenchConfig.from_preset(name, **overrides)
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


# A preset is a problem with a name: the same description everything else takes.
Preset = BenchConfig


def resolve_problem(problem, *, needs=(), **given) -> tuple[Mask, dict]:
    """The mask and the fields a tool needs, from the problem it was given.

    `problem` is a `BenchConfig` (its mask; each of `given` left None takes the config's field
    of that name) or any svg_lib `Mask` (then every field named in `needs` must be given).
    Returns `(mask, {field: value})` for the fields in `given`.
    """
    if isinstance(problem, BenchConfig):
        return problem.mask(), {key: getattr(problem, key) if value is None else value
                                for key, value in given.items()}
    if isinstance(problem, Mask):
        missing = [key for key in needs if given.get(key) is None]
        if missing:
            raise TypeError(f"with a bare mask, give {', '.join(missing)} too, or pass a BenchConfig "
                            "(e.g. get_preset('small')), which holds them")
        return problem, dict(given)
    raise TypeError(f"expected a BenchConfig (e.g. get_preset('small')) or an svg_lib Mask "
                    f"(e.g. SVGMask.spatial(geometry, 0.35)), got {type(problem).__name__}")


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
