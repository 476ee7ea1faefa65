"""Structured synthetic q, k, v with planted spatial or temporal locality, and quality metrics.

Random Gaussian q and k give near-uniform attention: every mask looks equally bad on them,
so they can neither test the profiler nor show what sparsity costs in accuracy. Here each
head gets q and k built from a positional code, so its attention is concentrated where a
spatial or a temporal head's would be.

Construction (per head). Every video token has grid coordinates x = (frame, row, col).
Draw m = head_dim / 2 frequency vectors w_j ~ Normal(0, diag(1/l_f^2, 1/l_h^2, 1/l_w^2)) and
use the code phi(x) = [cos(w_j . x), sin(w_j . x)]_j / sqrt(m). Then
phi(x) . phi(y) = mean_j cos(w_j . (x - y)), which is 1 at x = y and approximates the Gaussian
kernel exp(-|(x - y) / l|^2 / 2) (random Fourier features, error ~ 1/sqrt(2m)).

* spatial head: short lengths on every axis (own frame and its neighbour, a few rows and
  columns around the token);
* temporal head: a long length across frames and a short one within the frame, so a token
  matches the same spatial slot in many frames;
* local3d head: comparable lengths across frames, rows and columns, so attention decays with
  the 3-D distance in the latent video (the locality sliding tile attention bets on).

q = k = sqrt(sharpness * sqrt(head_dim)) * phi + noise, so the logit q.k / sqrt(head_dim) is
about `sharpness` times the kernel. Near the peak, exp(sharpness * kernel) is a Gaussian of
width l / sqrt(sharpness), so the lengths are drawn as l = locality * sqrt(sharpness): the
`locality` lengths (frames, rows, cols) are then roughly the standard deviation of the
attention weights around the token along each axis, whatever the sharpness. q and
k get independent Gaussian noise (std `noise`); v is standard Gaussian. Text tokens (if any)
get noise-only q and k.
"""
from __future__ import annotations

import math

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import Mask
from svg_lib.core.svg_masks import PermutedMask, SVGMask, TemporalMask
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.kernels.reference import reference_attention
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.routing import svg_attention
from svg_lib.methods import METHODS
from svg_lib.problem import PALLAS_METHODS, check_method

KINDS = ("spatial", "temporal", "local3d")


def default_locality(geometry: VideoGeometry) -> dict:
    """Attention spread (frames, rows, cols) per head kind used when `structured_qkv` is given none."""
    return {"spatial": (0.5, 2.0, 2.0),
            "temporal": (max(1.0, geometry.frames / 3.0), 0.3, 0.3),
            "local3d": (1.5, 2.0, 2.0)}


def _check_kinds(heads_kinds) -> list[str]:
    kinds = list(heads_kinds) if not isinstance(heads_kinds, str) else None
    if not kinds or any(kind not in KINDS for kind in kinds):
        raise ValueError(f"heads_kinds must be a non-empty sequence of {' / '.join(map(repr, KINDS))} (one per head), "
                         f"got {heads_kinds!r}")
    return kinds


def structured_qkv(geometry: VideoGeometry, heads_kinds, head_dim: int = 64, *, locality: dict | None = None,
                   sharpness: float = 10.0, noise: float = 0.3, seed: int = 0, dtype=None):
    """q, k, v `[heads, tokens, head_dim]` (frame-major) with planted locality, one head per entry of heads_kinds.

    heads_kinds: e.g. ["spatial", "temporal", "local3d", ...]. locality: {"spatial": (l_f, l_h, l_w),
    "temporal": (...), "local3d": (...)} in frames / rows / cols, overriding `default_locality(geometry)` per kind.
    sharpness: the logit of a token against itself (before noise). dtype: float32 by default.
    See the module docstring for the construction.
    """
    import jax.numpy as jnp

    if not isinstance(geometry, VideoGeometry):
        raise TypeError(f"geometry must be a VideoGeometry, got {type(geometry).__name__}")
    kinds = _check_kinds(heads_kinds)
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 2 (cos/sin pairs), got {head_dim!r}")
    lengths = default_locality(geometry)
    for kind, value in (locality or {}).items():
        if kind not in KINDS or np.shape(value) != (3,) or not np.all(np.asarray(value, dtype=float) > 0):
            raise ValueError(f"locality must map {' / '.join(map(repr, KINDS))} to 3 positive lengths (frames, rows, cols), "
                             f"got {kind!r}: {value!r}")
        lengths[kind] = tuple(float(x) for x in value)
    if not sharpness > 0 or not noise >= 0:
        raise ValueError(f"sharpness must be > 0 and noise >= 0, got sharpness={sharpness!r}, noise={noise!r}")
    dtype = jnp.float32 if dtype is None else dtype

    rng = np.random.default_rng(seed)
    F, H, W = geometry.frames, geometry.height, geometry.width
    f, h, w = np.meshgrid(np.arange(F), np.arange(H), np.arange(W), indexing="ij")
    coords = np.stack([f.ravel(), h.ravel(), w.ravel()], axis=1).astype(np.float64)  # frame-major order
    m = head_dim // 2
    amp = math.sqrt(sharpness * math.sqrt(head_dim))
    n, p = geometry.tokens, geometry.text_tokens
    q = np.empty((len(kinds), n, head_dim))
    k = np.empty_like(q)
    for i, kind in enumerate(kinds):
        scale = np.asarray(lengths[kind]) * math.sqrt(sharpness)  # kernel width giving that softmax spread
        freqs = rng.standard_normal((m, 3)) / scale[None, :]
        angle = coords @ freqs.T                                      # [video_tokens, m]
        code = np.concatenate([np.cos(angle), np.sin(angle)], axis=1) / math.sqrt(m)
        code = np.concatenate([amp * code, np.zeros((p, head_dim))], axis=0)  # text: noise only
        q[i] = code + noise * rng.standard_normal(code.shape)
        k[i] = code + noise * rng.standard_normal(code.shape)
    v = rng.standard_normal(q.shape)
    return tuple(jnp.asarray(x, dtype=dtype) for x in (q, k, v))


# -- metrics ------------------------------------------------------------------------------------

def relative_l2(out, ref, *, per_head: bool = False):
    """||out - ref|| / ||ref|| in float64 (over everything, or per head for `[heads, ...]` arrays)."""
    a = np.asarray(out, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"out and ref must have the same shape, got {a.shape} and {b.shape}")
    if per_head:
        axes = tuple(range(1, a.ndim))
        return np.sqrt(((a - b) ** 2).sum(axis=axes)) / np.maximum(np.sqrt((b ** 2).sum(axis=axes)), 1e-30)
    return float(np.sqrt(((a - b) ** 2).sum()) / max(np.sqrt((b ** 2).sum()), 1e-30))


def attention_recall(q, k, mask: Mask, rows) -> np.ndarray:
    """Share of each head's dense softmax mass that falls inside `mask`, float64 `[heads]`.

    q, k `[heads, tokens, head_dim]` frame-major; mask: any svg_lib Mask in frame-major
    coordinates (`SVGMask` for spatial heads, `TemporalMask` for temporal ones); rows: the
    query rows to average over (int array), or an int count sampled with seed 0. Only
    heads x rows x tokens scores are formed.
    """
    import jax
    import jax.numpy as jnp

    if q.ndim != 3 or q.shape != k.shape:
        raise ValueError(f"q and k must both be shaped [heads, tokens, head_dim], got {q.shape} and {k.shape}")
    n = int(q.shape[1])
    if not isinstance(mask, Mask) or mask.tokens != n:
        raise ValueError(f"mask must be an svg_lib Mask over {n} tokens, got {mask!r}")
    rows = sample_rows(n, rows) if isinstance(rows, (int, np.integer)) else np.asarray(rows, dtype=np.int64)
    if rows.ndim != 1 or rows.size == 0 or rows.min() < 0 or rows.max() >= n:
        raise ValueError(f"rows must be a non-empty 1-D array of query indices in [0, {n}), got {rows!r}")
    s = jnp.einsum("hrd,hkd->hrk", q[:, rows].astype(jnp.float32), k.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST) / math.sqrt(q.shape[-1])
    p = np.asarray(jax.nn.softmax(s, axis=-1), dtype=np.float64)
    keep = np.asarray(mask.keep(rows[:, None], np.arange(n)[None, :]), dtype=bool)
    return (p * keep[None]).sum(axis=-1).mean(axis=-1)


def computed_mask(mask: SVGMask, kind: str, method: str, block_q: int, block_kv: int) -> Mask:
    """The mask a head of `kind` really computes under `method`, in frame-major coordinates.

    b2 (and the other exact methods): the SVG mask, or `TemporalMask` for a temporal head. b3: the
    tile-aligned mask (rounded in the order the kernel sees), mapped back to frame-major for a
    temporal head.
    """
    check_method(method, PALLAS_METHODS)
    check_method(kind, ("spatial", "temporal"), "head kind")
    if METHODS[method].rounds_to_tiles:
        rounded = METHODS[method].computed_mask(mask, block_q, block_kv)
        if kind == "spatial":
            return rounded
        temporal = TemporalMask(mask)
        return PermutedMask(rounded, temporal.pos, temporal.order)
    return mask if kind == "spatial" else TemporalMask(mask)


def quality_table(geometry: VideoGeometry, densities, *, methods=("b2", "b3"), head_dim: int = 64,
                  block_q: int = 128, block_kv: int = 128, num_rows: int = 64, seed: int = 0,
                  sharpness: float = 10.0, noise: float = 0.3, interpret=None) -> list[dict]:
    """Accuracy of sparse attention on structured inputs: one row per (density, method, head kind).

    Two heads (one spatial, one temporal, planted with `structured_qkv`) run through
    `svg_attention` with the matching routing. Each row: density (asked), pair_density (what
    the computed mask keeps), method ("b2" exact, "b3" rounded to tiles), kind, rel_l2 (against
    dense attention, that head only) and recall (dense softmax mass inside the computed mask,
    on `num_rows` sampled rows).
    """
    import jax.numpy as jnp

    kinds = ["spatial", "temporal"]
    q, k, v = structured_qkv(geometry, kinds, head_dim, sharpness=sharpness, noise=noise, seed=seed)
    dense = np.asarray(reference_attention(q, k, v))
    flags = jnp.asarray(np.array([kind == "temporal" for kind in kinds]))
    rows = sample_rows(geometry.tokens, num_rows, seed)
    table = []
    for density in densities:
        mask = SVGMask.spatial(geometry, density)
        for method in methods:
            out = np.asarray(svg_attention(q, k, v, flags, mask, method=method, block_q=block_q, block_kv=block_kv,
                                           interpret=interpret))
            for h, kind in enumerate(kinds):
                used = computed_mask(mask, kind, method, block_q, block_kv)
                table.append({
                    "density": float(density), "pair_density": used.pair_count / float(geometry.tokens) ** 2,
                    "method": method, "kind": kind, "rel_l2": relative_l2(out[h], dense[h]),
                    "recall": float(attention_recall(q[h:h + 1], k[h:h + 1], used, rows)[0])})
    return table


def matching_density(geometry: VideoGeometry, pair_density: float, first_frame_sink: bool = True) -> float:
    """The SVG density whose spatial mask keeps closest to `pair_density` of the pairs.

    The band is rounded up to lanes and the sink adds pairs, so the density asked for and the
    pairs kept differ; this searches the band widths (multiples of 128) for the closest budget.
    """
    n = geometry.tokens
    best, best_gap = None, None
    for width in range(128, n + 128, 128):  # the band widths SVGMask can produce
        d_video = 1.0 - (1.0 - min(width, n) / n) ** 2  # the density whose rounded width is `width`
        density = min(1.0, d_video + 2.0 * geometry.text_tokens / n - 1e-9)
        if density <= 2.0 * geometry.text_tokens / n:
            continue
        gap = abs(SVGMask.spatial(geometry, density, first_frame_sink).pair_density - pair_density)
        if best_gap is None or gap < best_gap:
            best, best_gap = density, gap
    return best


def equal_budget_table(geometry: VideoGeometry, tile, window, *, kinds=KINDS, head_dim: int = 64,
                       block_q: int = 128, block_kv: int = 128, num_rows: int = 64, seed: int = 0,
                       sharpness: float = 10.0, noise: float = 0.3) -> list[dict]:
    """Band (B2), rounded band (B3) and sliding tiles at one pair budget: one row per (kind, method).

    The sliding-tile mask `SlidingTileMask(geometry, tile, window)` sets the budget; the SVG band
    is chosen (`matching_density`) to keep about as many pairs. Each head of `kinds` is planted
    with `structured_qkv`; B2 and B3 use the layout that suits the head (temporal-major for a
    temporal head, frame-major otherwise). Rows: kind, method ("b2", "b3", "sliding"),
    pair_density (of the mask computed), recall (dense softmax mass inside it, on `num_rows`
    sampled rows) and rel_l2 (against dense attention). Outputs come from `reference_attention`
    under each mask, which the kernels match (tests/test_kernels.py, tests/test_sliding.py);
    masks go to it dense, so `geometry.tokens` is limited to `to_dense`'s 16,384.
    """
    kinds = _check_kinds(kinds)
    q, k, v = structured_qkv(geometry, kinds, head_dim, sharpness=sharpness, noise=noise, seed=seed)
    dense = np.asarray(reference_attention(q, k, v))
    rows = sample_rows(geometry.tokens, num_rows, seed)
    sliding = SlidingTileMask(geometry, tile, window)
    band = SVGMask.spatial(geometry, matching_density(geometry, sliding.pair_density))
    n2 = float(geometry.tokens) ** 2
    table = []
    for h, kind in enumerate(kinds):
        layout = "temporal" if kind == "temporal" else "spatial"
        masks = {"b2": computed_mask(band, layout, "b2", block_q, block_kv),
                 "b3": computed_mask(band, layout, "b3", block_q, block_kv),
                 "sliding": sliding.frame_major()}
        for method, mask in masks.items():
            qh, kh, vh = q[h:h + 1], k[h:h + 1], v[h:h + 1]
            # a dense bool mask (numpy, built once) instead of evaluating `keep` per chunk in jax
            out = np.asarray(reference_attention(qh, kh, vh, mask.to_dense()))
            table.append({"kind": kind, "method": method, "layout": "tiles" if method == "sliding" else layout,
                          "pair_density": mask.pair_count / n2,
                          "recall": float(attention_recall(qh, kh, mask, rows)[0]),
                          "rel_l2": relative_l2(out[0], dense[h])})
    return table
