"""Attention heads built from a real clip: q and k that follow what the frames show.

`structured_qkv` plants locality in *position* (spatial, temporal, local3d heads). A video model
also has heads whose attention follows *content*: a patch of the rabbit's fur attends to fur
wherever it lies. Such heads are what content masks (SVG2's clusters, semantic tiles) are for, and
position masks (SVG's bands) serve them badly. Random data cannot show it; a real clip can.

Tokens are 4 x 4-pixel RGB patches of a few frames of Big Buck Bunny (`svg_lib/data/clip_bbb.npz`,
package data, extracted by tools/extract-clip.py; source and licence in svg_lib/data/clip_SOURCE.md), in
frame-major order: token f*S + r*W + c is patch (r, c) of frame f, S = W * H patches per frame.

At the case study's size (`case_study_qkv`: 21 frames x 45 x 80 = 75,600 tokens) the tokens are
16 x 16-pixel patches of the full 1280 x 720 frames, and a patch's appearance is a summary of it
(`svg_lib/data/clip_bbb_patches.npz`: per RGB channel its mean and 5 low-frequency DCT
coefficients, 18 numbers, float16), not its 768 pixel values: 2.5 MB instead of 116 MB. The heads
are made by the same recipes (`features_qkv`, which `clip_qkv` calls on the 4 x 4 patches' pixels).
Everything is `[heads, tokens, head_dim]` arrays and sampled rows: no tokens x tokens array, so
75,600 tokens build on a CPU in seconds.

Per head kind:

* "content": each patch's appearance a (its 48 pixel values, standardised over the clip) goes
  through a fixed random Fourier projection, phi(a) = [cos(w_j . a), sin(w_j . a)] / sqrt(m) with
  w_j ~ Normal(0, I / l^2): phi(a) . phi(b) approximates the Gaussian kernel exp(-|a - b|^2 / 2 l^2),
  so attention goes to patches that look alike, wherever and whenever they are. l is
  `content_length` times the median distance between two patches' appearances.
* "mixed": the same code of appearance and position together (pixels / l_a, grid coordinates /
  the spatial head's lengths): look-alike patches nearby.
* "spatial", "temporal", "local3d": position only, exactly `synthetic.structured_qkv`'s heads on the
  clip's grid (the content plays no part).

As in `structured_qkv`, q = k = sqrt(sharpness * sqrt(head_dim)) * phi + independent noise, so a
token's logit against itself is about `sharpness`, and v is standard Gaussian.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.layers.synthetic import KINDS as POSITION_KINDS
from svg_lib.layers.synthetic import default_locality, structured_qkv

CONTENT_KINDS = ("content", "mixed")
CLIP_KINDS = CONTENT_KINDS + POSITION_KINDS
PATCH = 4
DEFAULT_CLIP = Path(__file__).resolve().parents[1] / "data" / "clip_bbb.npz"  # package data, beside the cost records
CASE_PATCHES = DEFAULT_CLIP.with_name("clip_bbb_patches.npz")


def load_clip(path=None) -> np.ndarray:
    """uint8 `[frames, height, width, 3]` RGB frames of the clip file (default: the committed
    svg_lib/data/clip_bbb.npz, 8 frames of 96 x 160)."""
    path = Path(DEFAULT_CLIP if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no clip at {path}; svg_lib ships data/clip_bbb.npz as package data "
                                f"(tools/extract-clip.py writes it)")
    with np.load(path) as data:
        if "frames" not in data:
            raise ValueError(f"{path} holds {sorted(data.files)}, not the 'frames' array tools/extract-clip.py writes")
        frames = data["frames"]
    _check_frames(frames)
    return frames


def _check_frames(frames) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 RGB shaped [frames, height, width, 3], got {frames.dtype} "
                         f"{frames.shape}")
    if frames.shape[1] % PATCH or frames.shape[2] % PATCH:
        raise ValueError(f"frame height and width must be multiples of the {PATCH}-pixel patch, got "
                         f"{frames.shape[1]} x {frames.shape[2]}")
    return frames


def clip_geometry(frames) -> VideoGeometry:
    """The token grid of `frames`: one token per 4 x 4-pixel patch, no text tokens."""
    f, h, w, _ = _check_frames(frames).shape
    return VideoGeometry(int(f), h // PATCH, w // PATCH)


def standardise(x) -> np.ndarray:
    """float64 `x` `[tokens, features]` with every feature at mean 0 and standard deviation 1 over the tokens."""
    x = np.asarray(x, np.float64)
    return (x - x.mean(axis=0)) / np.maximum(x.std(axis=0), 1e-6)


def patch_features(frames) -> np.ndarray:
    """float64 `[tokens, 48]`: each patch's pixels (frame-major token order), every feature
    standardised to mean 0 and standard deviation 1 over the clip."""
    frames = _check_frames(frames).astype(np.float64) / 255.0
    f, h, w, c = frames.shape
    patches = frames.reshape(f, h // PATCH, PATCH, w // PATCH, PATCH, c).transpose(0, 1, 3, 2, 4, 5)
    return standardise(patches.reshape(f * (h // PATCH) * (w // PATCH), PATCH * PATCH * c))


def load_case_patches(path=None) -> tuple[np.ndarray, VideoGeometry]:
    """(features float64 `[75,600, 18]` standardised per feature, geometry 21 x 45 x 80): the
    case study's tokens, 16 x 16-pixel patches of the full-size clip summarised by
    tools/extract-clip.py (default: the committed svg_lib/data/clip_bbb_patches.npz)."""
    path = Path(CASE_PATCHES if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no patch summaries at {path}; the repository ships "
                                f"svg_lib/data/clip_bbb_patches.npz (tools/extract-clip.py writes it)")
    with np.load(path) as data:
        if "features" not in data or "grid" not in data:
            raise ValueError(f"{path} holds {sorted(data.files)}, not the 'features' and 'grid' arrays "
                             f"tools/extract-clip.py writes")
        features, grid = data["features"], data["grid"]
    geometry = VideoGeometry(*(int(g) for g in grid))
    if features.ndim != 2 or features.shape[0] != geometry.tokens or not np.isfinite(features).all():
        raise ValueError(f"{path}: features must be finite and shaped [{geometry.tokens}, features] for the grid "
                         f"{tuple(grid)}, got {features.shape}")
    return standardise(features), geometry


def median_distance(x: np.ndarray, *, pairs: int = 4096, seed: int = 0) -> float:
    """The median Euclidean distance between two random rows of `x` (sampled pairs)."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, len(x), pairs), rng.integers(0, len(x), pairs)
    return float(np.median(np.linalg.norm(x[a] - x[b], axis=1)))


def fourier_code(points: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """`[n, 2m]` random Fourier features of `points` `[n, dims]` (already divided by their length
    scales): code(a) . code(b) ~ exp(-|a - b|^2 / 2), 1 at a = b."""
    angle = points @ rng.standard_normal((m, points.shape[1])).T
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1) / math.sqrt(m)


def clip_qkv(frames, heads_kinds, *, head_dim: int = 64, content_length: float = 0.15, sharpness: float = 10.0,
             noise: float = 0.3, seed: int = 0, dtype=None):
    """`(q, k, v, geometry)`: float32 `[heads, tokens, head_dim]` (frame-major) heads of the clip.

    frames: uint8 `[frames, height, width, 3]` (`load_clip()`, or a slice of it: fewer frames,
    a crop whose sides are multiples of 4); tokens = frames x (height / 4) x (width / 4), 7,680 for
    the committed clip. heads_kinds: one of CLIP_KINDS per head ("content", "mixed", "spatial",
    "temporal", "local3d"; see the module docstring). content_length: the appearance kernel's
    width as a share of the median distance between patches (smaller: sharper content attention).
    sharpness, noise: as in `structured_qkv`. Deterministic for a given seed.
    """
    geometry = clip_geometry(frames)
    return features_qkv(patch_features(frames), geometry, heads_kinds, head_dim=head_dim,
                        content_length=content_length, sharpness=sharpness, noise=noise, seed=seed,
                        dtype=dtype) + (geometry,)


def case_study_qkv(heads_kinds, *, head_dim: int = 64, content_length: float = 0.15, sharpness: float = 10.0,
                   noise: float = 0.3, seed: int = 0, dtype=None, path=None):
    """`(q, k, v, geometry)` at the case study's size: `[heads, 75,600, head_dim]` heads of the clip's
    21 x 45 x 80 patches of 16 x 16 pixels (`load_case_patches`), by `clip_qkv`'s recipes
    (`features_qkv`). 4 heads of head_dim 64 take about 2 s and 0.2 GB on a CPU; float32 q, k, v
    hold 3 x heads x 75,600 x head_dim x 4 bytes (10 heads of 128: 1.2 GB)."""
    features, geometry = load_case_patches(path)
    return features_qkv(features, geometry, heads_kinds, head_dim=head_dim, content_length=content_length,
                        sharpness=sharpness, noise=noise, seed=seed, dtype=dtype) + (geometry,)


def check_head_options(heads_kinds, head_dim, content_length, sharpness, noise) -> list[str]:
    """The heads' kinds as a list, after checking every option `features_qkv` takes."""
    kinds = list(heads_kinds) if not isinstance(heads_kinds, str) else None
    if not kinds or any(kind not in CLIP_KINDS for kind in kinds):
        raise ValueError(f"heads_kinds must be a non-empty sequence of {' / '.join(map(repr, CLIP_KINDS))} "
                         f"(one per head), got {heads_kinds!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 2 (cos/sin pairs), got {head_dim!r}")
    if not content_length > 0 or not sharpness > 0 or not noise >= 0:
        raise ValueError(f"content_length and sharpness must be > 0 and noise >= 0, got content_length="
                         f"{content_length!r}, sharpness={sharpness!r}, noise={noise!r}")
    return kinds


def grid_coordinates(geometry: VideoGeometry) -> np.ndarray:
    """float64 `[tokens, 3]`: (frame, row, col) of each video token, frame-major."""
    f, r, c = np.meshgrid(np.arange(geometry.frames), np.arange(geometry.height), np.arange(geometry.width),
                          indexing="ij")
    return np.stack([f.ravel(), r.ravel(), c.ravel()], axis=1).astype(np.float64)


def content_points(features: np.ndarray, geometry: VideoGeometry, kind: str, *, content_length: float,
                   sharpness: float, seed: int) -> np.ndarray:
    """float64 `[tokens, dims]`: what a "content" head's Fourier code reads (the features over the
    kernel width), and for a "mixed" head the grid coordinates over the spatial head's lengths too."""
    # the kernel width is l * sqrt(sharpness), so the softmax spreads over about l (structured_qkv's rule)
    width = content_length * median_distance(features, seed=seed) * math.sqrt(sharpness)
    points = features / width
    if kind == "mixed":
        place = grid_coordinates(geometry) / (np.asarray(default_locality(geometry)["spatial"]) * math.sqrt(sharpness))
        points = np.concatenate([points, place], axis=1)
    return points


def features_qkv(features, geometry: VideoGeometry, heads_kinds, *, head_dim: int = 64, content_length: float = 0.15,
                 sharpness: float = 10.0, noise: float = 0.3, seed: int = 0, dtype=None):
    """`(q, k, v)`: float32 `[heads, tokens, head_dim]` heads of tokens described by `features`
    float64 `[tokens, dims]` (standardised per feature: `patch_features`, `load_case_patches`) on
    `geometry`'s grid. The recipes of the module docstring; options as in `clip_qkv`."""
    import jax.numpy as jnp

    kinds = check_head_options(heads_kinds, head_dim, content_length, sharpness, noise)
    features = np.asarray(features, np.float64)
    if not isinstance(geometry, VideoGeometry) or geometry.text_tokens or features.ndim != 2 \
            or features.shape[0] != geometry.tokens:
        raise ValueError(f"features must be [tokens, dims] for the video tokens of geometry (no text tokens); got "
                         f"features {features.shape} and geometry {geometry!r}")
    dtype = jnp.float32 if dtype is None else dtype
    n = geometry.tokens
    q = np.empty((len(kinds), n, head_dim), np.float32)
    k, v = np.empty_like(q), np.empty_like(q)

    positional = [i for i, kind in enumerate(kinds) if kind in POSITION_KINDS]
    if positional:  # position heads are structured_qkv's, on the clip's grid
        pq, pk, pv = structured_qkv(geometry, [kinds[i] for i in positional], head_dim, sharpness=sharpness,
                                    noise=noise, seed=seed)
        q[positional], k[positional], v[positional] = np.asarray(pq), np.asarray(pk), np.asarray(pv)

    content = [i for i, kind in enumerate(kinds) if kind in CONTENT_KINDS]
    if content:
        rng = np.random.default_rng([seed, 1])  # a stream apart from structured_qkv's
        amp = math.sqrt(sharpness * math.sqrt(head_dim))
        for i in content:
            points = content_points(features, geometry, kinds[i], content_length=content_length,
                                    sharpness=sharpness, seed=seed)
            code = amp * fourier_code(points, head_dim // 2, rng)
            q[i] = code + noise * rng.standard_normal(code.shape)
            k[i] = code + noise * rng.standard_normal(code.shape)
            v[i] = rng.standard_normal(code.shape)
    return tuple(jnp.asarray(x, dtype=dtype) for x in (q, k, v))
