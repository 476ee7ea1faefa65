"""Sparse VideoGen's masks: the spatial band with its first-frame sink, and the temporal head's.

`SVGMask` is a diagonal band plus a first-frame sink (plus text rows and columns), counted in
closed form (`_band_pairs`); `TemporalMask` is the same mask seen through the temporal-major
permutation of the tokens, a `PermutedMask`, which any mask can be put through. The protocol
they answer (`keep`, `pair_counts`, `tile_aligned`, ...) is `svg_lib.core.masks.Mask`.
"""
from __future__ import annotations

import math

import numpy as np

from svg_lib.cache import content_key
from svg_lib.core.geometry import VideoGeometry, inverse_temporal_major_permutation, temporal_major_permutation
from svg_lib.core.masks import LANES, Mask, _grid_cells, _is_numpy


def _diagonal_pairs(a0, a1, b0, b1, lo, hi):
    """Number of (x, y) with a0 <= x < a1, b0 <= y < b1 and lo <= x - y <= hi (int64, broadcasting).

    For one row x the count is C(x - lo) - C(x - hi - 1) with C(t) = clip(t - b0 + 1, 0, L),
    L = b1 - b0 (keys y <= t); summed over x, each term is a sum of a clipped ramp, which has a
    closed form. An empty range (lo > hi) counts nothing.
    """
    a0, a1, b0, b1, lo, hi = (np.asarray(x, dtype=np.int64) for x in (a0, a1, b0, b1, lo, hi))
    a1 = np.maximum(a1, a0)
    hi = np.maximum(hi, lo - 1)
    length = np.maximum(b1 - b0, 0)

    def ramp_sum(x):  # sum of clip(y, 0, length) over all integers y < x
        m = np.clip(x - 1, 0, length)
        return m * (m + 1) // 2 + length * np.maximum(x - 1 - length, 0)

    upper = 1 - lo - b0
    lower = -hi - b0
    return (ramp_sum(a1 + upper) - ramp_sum(a0 + upper)) - (ramp_sum(a1 + lower) - ramp_sum(a0 + lower))


def _band_pairs(a0, a1, b0, b1, w):
    """Number of (q, k) with a0 <= q < a1, b0 <= k < b1 and |q - k| <= w (int64, broadcasting)."""
    return _diagonal_pairs(a0, a1, b0, b1, -np.asarray(w), np.asarray(w))


class SVGMask(Mask):
    """Sparse VideoGen's mask: a diagonal band plus a first-frame sink (plus text rows/columns).

    keep(q, k) = |q - k| <= band_width  or  k < sink_tokens  or  q, k is a text token.
    Build it with `SVGMask.spatial(...)`; a temporal head uses the very same mask on tokens
    permuted to temporal-major order (see `SVGMask.temporal`).
    """

    def __init__(self, geometry: VideoGeometry, band_width: int, sink_tokens: int, density: float | None = None):
        self.geometry = geometry
        self.tokens = geometry.tokens
        self.band_width = int(band_width)
        self.sink_tokens = int(sink_tokens)
        self.density = density  # the density asked for; pair_density is what the mask really keeps

    @classmethod
    def spatial(cls, geometry: VideoGeometry, density: float, first_frame_sink: bool = True) -> "SVGMask":
        """The spatial-head mask (frame-major order) keeping about `density` of all pairs.

        `density` is the band's share of the pairs, as the case study defines its configuration;
        `pair_density` is what the mask really keeps (the sink and the rounding add to it).
        Band width W = N * (1 - sqrt(1 - d')), d' = density - 2P/N (text rows and columns are
        always kept), rounded up to a multiple of 128, the case study's convention. The band's
        edge is a diagonal, so that does not put it on lane boundaries: it only makes a
        128 x 128 block on the edge be cut exactly along its diagonal (notebook 02).
        """
        if not isinstance(geometry, VideoGeometry):
            raise TypeError(f"geometry must be a VideoGeometry, got {type(geometry).__name__}")
        if isinstance(density, bool) or not isinstance(density, (int, float, np.floating, np.integer)) \
                or not math.isfinite(density) or not 0.0 < density <= 1.0:
            raise ValueError(f"density must be a number in (0, 1] (the band's share of the pairs, as the case study defines it), got {density!r}")
        n, p = geometry.tokens, geometry.text_tokens
        d_video = density - 2.0 * p / n
        if d_video <= 0:
            raise ValueError(f"density {density} is too low for {p} text tokens out of {n}: text rows and "
                             f"columns alone keep {2 * p / n:.3f} of the pairs; use a density above that")
        width = n * (1.0 - math.sqrt(max(0.0, 1.0 - d_video)))
        width = min(-(-math.ceil(width - 1e-9) // LANES) * LANES, n)
        sink = geometry.frame_tokens if first_frame_sink else 0
        return cls(geometry, width, sink, float(density))

    @classmethod
    def temporal(cls, geometry: VideoGeometry, density: float, first_frame_sink: bool = True) -> "TemporalMask":
        """A temporal head's mask seen in frame-major order (strided diagonals).

        Kernels do not use this form: they permute the tokens to temporal-major order and apply
        the spatial mask (`.permuted` on the returned object). It is here to be looked at and to
        check that both views agree.
        """
        return TemporalMask(cls.spatial(geometry, density, first_frame_sink))

    @property
    def video_tokens(self) -> int:
        return self.geometry.video_tokens

    def cache_key(self):
        # `density` is left out: it is the request the band width was rounded from, and two
        # requests that round to the same band keep the same pairs
        return type(self), self.geometry, self.band_width, self.sink_tokens

    def keep(self, q, k):
        w, v, n = self.band_width, self.video_tokens, self.tokens
        return (((q - k <= w) & (k - q <= w)) | (k < self.sink_tokens) | (q >= v) | (k >= v)) & (q < n) & (k < n)

    def kernel_predicate(self, block_q: int, block_kv: int):
        """`keep` for a kernel's masked tiles, in fewer per-pair operations (same pairs kept).

        `keep` spends about eleven elementwise operations per (query, key) pair of a tile; here
        every term that depends on one index only moves into a `[block_q, 1]` column or a
        `[1, block_kv]` row, computed once per tile, and a pair costs a subtraction, one unsigned
        comparison against the row's span, an `or` and the kernel's select. Each query row keeps
        the keys in [lo, lo + span]: its band for a video row, every real key for a text row (and
        for query padding, which the caller slices off). Key padding is moved far below every lo,
        so it falls outside every span; sink and text keys are kept by the key row. (Simulated by
        the compiler's static profile, libtpu 0.0.42.1, bounded-max body, bf16: at the blog's
        3328 x 1536 tiles on a v6e this took the masked tile body from 26,134 to 14,826 cycles
        per step, the mask-free one costing 10,436; on a v5e from 30,722 to 20,486, against 20,222.)
        """
        w, v, n, sink = self.band_width, self.video_tokens, self.tokens, self.sink_tokens

        def keep(q, k):
            import jax
            import jax.numpy as jnp

            text_row = q >= v
            lo = jnp.where(text_row, 0, q - w)                                # [block_q, 1]
            span = jnp.where(text_row, n - 1, 2 * w).astype(jnp.uint32)
            key = jnp.where(k < n, k, -(2 ** 30))                             # [1, block_kv]
            always = (k < sink) | ((k >= v) & (k < n))                        # sink and text keys
            offset = jax.lax.bitcast_convert_type(key - lo, jnp.uint32)       # negative -> huge
            return (offset <= span) | always
        return keep

    def pair_counts(self, q_edges, k_edges) -> np.ndarray:
        # Everything is kept except the pairs of video rows x non-sink video columns outside the band.
        q0, q1 = _grid_cells(q_edges, self.tokens)
        k0, k1 = _grid_cells(k_edges, self.tokens)
        q0, q1, k0, k1 = q0[:, None], q1[:, None], k0[None, :], k1[None, :]
        area = (q1 - q0) * (k1 - k0)
        rq0, rq1 = q0, np.maximum(np.minimum(q1, self.video_tokens), q0)
        rk0 = np.minimum(np.maximum(k0, self.sink_tokens), np.maximum(k1, k0))
        rk1 = np.maximum(np.minimum(k1, self.video_tokens), rk0)
        rest = (rq1 - rq0) * (rk1 - rk0)
        return area - (rest - _band_pairs(rq0, rq1, rk0, rk1, self.band_width))

    def __repr__(self) -> str:
        return (f"SVGMask({self.geometry}, band_width={self.band_width}, sink_tokens={self.sink_tokens}, "
                f"pair_density={self.pair_density:.4f})")


class PermutedMask(Mask):
    """`base` applied after a token permutation: keep(q, k) = base.keep(pos[q], pos[k]).

    `pos[i]` is where token i lands in the base mask's order; `order` is its inverse (the
    gather that builds that order). `.permuted` is the base mask itself.
    """

    def __init__(self, base: Mask, pos: np.ndarray, order: np.ndarray):
        self.permuted = base
        self.tokens = base.tokens
        self.pos = np.asarray(pos, dtype=np.int64)
        self.order = np.asarray(order, dtype=np.int64)

    @property
    def pair_count(self) -> int:
        return self.permuted.pair_count  # a permutation moves pairs, it does not add or drop any

    def cache_key(self):
        base = self.permuted.cache_key()
        if base is None:
            return None  # the base mask is known by identity only, and so is this view of it
        return type(self), self.tokens, base, content_key(self.pos), content_key(self.order)

    @property
    def band_width(self):
        return getattr(self.permuted, "band_width", None)

    def kernel_predicate(self, block_q: int, block_kv: int):
        raise ValueError(f"{type(self).__name__}.keep() reads a permutation table, which a kernel cannot "
                         "evaluate; permute the tokens instead (to_temporal_major) or use SVGMask.temporal, "
                         "whose positions are arithmetic")

    def keep(self, q, k):
        if _is_numpy(q, k):
            pos = np.concatenate([self.pos, [self.permuted.tokens]])  # padding maps to padding
            return self.permuted.keep(pos[np.minimum(q, self.tokens)], pos[np.minimum(k, self.tokens)])
        import jax.numpy as jnp
        pos = jnp.asarray(np.concatenate([self.pos, [self.permuted.tokens]]), dtype=jnp.int32)
        return self.permuted.keep(pos[jnp.minimum(q, self.tokens)], pos[jnp.minimum(k, self.tokens)])


class TemporalMask(PermutedMask):
    """A temporal head's mask in frame-major order: the SVG band applied at temporal-major positions.

    Token i < F*S sits at temporal-major position (i mod S) * F + i // S; text tokens stay.
    The position is computed arithmetically, so `keep` needs no lookup table and can be
    evaluated inside a kernel (the in-kernel alternative to permuting the tokens).
    """

    def __init__(self, base: SVGMask):
        g = base.geometry
        super().__init__(base, inverse_temporal_major_permutation(g), temporal_major_permutation(g))
        self.geometry = g

    def cache_key(self):
        base = self.permuted.cache_key()  # the permutation is the geometry's: no table to digest
        return None if base is None else (type(self), self.tokens, base)

    def position(self, i):
        """Temporal-major position of frame-major token index `i` (numpy or jax arrays)."""
        F, S, V = self.geometry.frames, self.geometry.frame_tokens, self.geometry.video_tokens
        if _is_numpy(i):
            video = (i % S) * F + i // S
        else:
            # Indices are never negative, so truncating div/rem equal floor ones; Python's % and //
            # lower to floor division, whose Mosaic rule needs the TPU generation and so fails to
            # export for TPU from a machine without one.
            import jax
            video = jax.lax.rem(i, S) * F + jax.lax.div(i, S)
        return video * (i < V) + i * (i >= V)  # arithmetic select: works for numpy and jnp alike

    def keep(self, q, k):
        return self.permuted.keep(self.position(q), self.position(k)) & (q < self.tokens) & (k < self.tokens)

    def pair_counts(self, q_edges, k_edges) -> np.ndarray:
        # Closed form from frame and slot ranges. Within one frame f a contiguous frame-major range
        # is one slot interval, and token (f, s) sits at temporal-major position s*F + f. For a
        # query frame fq and a key frame fk (df = fq - fk) the band |(sq - sk)*F + df| <= W is the
        # slot diagonal lo(df) <= sq - sk <= hi(df); the sink (positions < sink) is the key slots
        # below ceil((sink - fk) / F). A cell touches few frames, so only the (cell, frame) pieces
        # that exist are paired: no token pair is visited.
        g, n = self.geometry, self.tokens
        F, S, V = g.frames, g.frame_tokens, g.video_tokens
        w, sink = self.permuted.band_width, self.permuted.sink_tokens
        q0, q1 = _grid_cells(q_edges, n)
        k0, k1 = _grid_cells(k_edges, n)
        area = (q1 - q0)[:, None] * (k1 - k0)[None, :]
        frames = np.arange(F, dtype=np.int64)

        def pieces(c0, c1):  # the non-empty (cell, frame, slot interval) pieces of a grid
            lo = np.clip(np.minimum(c0, V)[:, None] - frames * S, 0, S)
            hi = np.clip(np.minimum(c1, V)[:, None] - frames * S, 0, S)
            cell, frame = np.nonzero(hi > lo)
            return cell, frame, lo[cell, frame], hi[cell, frame], np.maximum(hi - lo, 0).sum(axis=1)

        qc, qf, sa, sb, video_q = pieces(q0, q1)
        kc, kf, ta, tb, video_k = pieces(k0, k1)
        first_free = np.clip(-((kf - sink) // F), 0, S)  # ceil((sink - f) / F): key slots below are sink
        tn = np.minimum(np.maximum(ta, first_free), tb)   # non-sink key slots: [tn, tb)
        sink_k = np.bincount(kc, weights=tn - ta, minlength=k0.size).astype(np.int64)
        kept = video_q[:, None] * sink_k[None, :]         # every video query keeps the sink keys
        nk = k0.size
        chunk = max(1, 4_000_000 // max(1, kc.size))      # bound the [q pieces, k pieces] temporaries
        for start in range(0, qc.size, chunk):
            rows = slice(start, start + chunk)
            df = qf[rows, None] - kf[None, :]
            band = _diagonal_pairs(sa[rows, None], sb[rows, None], tn[None, :], tb[None, :],
                                   -((w + df) // F), (w - df) // F)
            cell_pair = (qc[rows, None] * nk + kc[None, :]).ravel()
            # float64 sums are exact: counts stay far below 2**53
            kept += np.rint(np.bincount(cell_pair, weights=band.ravel(), minlength=q0.size * nk)
                            ).astype(np.int64).reshape(q0.size, nk)
        # text rows and columns are always kept: drop only the video pairs outside the mask
        return area - (video_q[:, None] * video_k[None, :] - kept)

    def kernel_predicate(self, block_q: int, block_kv: int):
        return self.keep  # positions are arithmetic, so the kernel can evaluate this
