"""Attention heads built from a real clip: q and k that follow what the frames show.

`structured_qkv` plants locality in *position* (spatial, temporal, local3d heads). A video model
also has heads whose attention follows *content*: a patch of the rabbit's fur attends to fur
wherever it lies. Such heads are what content masks (SVG2's clusters, semantic tiles) are for, and
position masks (SVG's bands) serve them badly. Random data cannot show it; a real clip can.

Tokens are 4 x 4-pixel RGB patches of a few frames of Big Buck Bunny (`svg_lib/data/clip_bbb.npz`,
package data, extracted by tools/extract-clip.py; source and licence in svg_lib/data/clip_SOURCE.md), in
frame-major order: token f*S + r*W + c is patch (r, c) of frame f, S = W * H patches per frame.

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


def patch_features(frames) -> np.ndarray:
    """float64 `[tokens, 48]`: each patch's pixels (frame-major token order), every feature
    standardised to mean 0 and standard deviation 1 over the clip."""
    frames = _check_frames(frames).astype(np.float64) / 255.0
    f, h, w, c = frames.shape
    patches = frames.reshape(f, h // PATCH, PATCH, w // PATCH, PATCH, c).transpose(0, 1, 3, 2, 4, 5)
    x = patches.reshape(f * (h // PATCH) * (w // PATCH), PATCH * PATCH * c)
    return (x - x.mean(axis=0)) / np.maximum(x.std(axis=0), 1e-6)


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
    import jax.numpy as jnp

    geometry = clip_geometry(frames)
    kinds = list(heads_kinds) if not isinstance(heads_kinds, str) else None
    if not kinds or any(kind not in CLIP_KINDS for kind in kinds):
        raise ValueError(f"heads_kinds must be a non-empty sequence of {' / '.join(map(repr, CLIP_KINDS))} "
                         f"(one per head), got {heads_kinds!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 2 (cos/sin pairs), got {head_dim!r}")
    if not content_length > 0 or not sharpness > 0 or not noise >= 0:
        raise ValueError(f"content_length and sharpness must be > 0 and noise >= 0, got content_length="
                         f"{content_length!r}, sharpness={sharpness!r}, noise={noise!r}")
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
        features = patch_features(frames)
        # the kernel width is l * sqrt(sharpness), so the softmax spreads over about l (structured_qkv's rule)
        width = content_length * median_distance(features, seed=seed) * math.sqrt(sharpness)
        f, r, c = np.meshgrid(np.arange(geometry.frames), np.arange(geometry.height), np.arange(geometry.width),
                              indexing="ij")
        coords = np.stack([f.ravel(), r.ravel(), c.ravel()], axis=1).astype(np.float64)
        place = coords / (np.asarray(default_locality(geometry)["spatial"]) * math.sqrt(sharpness))
        amp = math.sqrt(sharpness * math.sqrt(head_dim))
        for i in content:
            points = features / width
            if kinds[i] == "mixed":
                points = np.concatenate([points, place], axis=1)
            code = amp * fourier_code(points, head_dim // 2, rng)
            q[i] = code + noise * rng.standard_normal(code.shape)
            k[i] = code + noise * rng.standard_normal(code.shape)
            v[i] = rng.standard_normal(code.shape)
    return tuple(jnp.asarray(x, dtype=dtype) for x in (q, k, v)) + (geometry,)
