"""Attention masks that know their own tile structure.

A mask here is never an N x N array unless you ask for one. Each mask answers two
questions:

* `keep(q, k)`: a vectorised predicate on (broadcastable) token index arrays, in
  numpy or jax.numpy, used by kernels that evaluate the mask elementwise;
* `pair_counts(q_edges, k_edges)`: how many kept (query, key) pairs fall in each
  cell of a grid, exactly and without building the N x N mask. The tile planner,
  the rounding of B3 and every statistic in the series are built on this.

Indices at or past `tokens` (sequence padding) are never kept.

Masks are values: two masks of the same class built from the same parameters (geometry, band
width, sink, tile and window, block sizes, the contents of any table they hold) compare and
hash equal (`Mask.cache_key`), so `attention(...)` reuses a kernel built for an equal mask
instead of planning and compiling again. Treat a mask as immutable once built: its key is
read from its attributes when asked for.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from svg_lib.core.geometry import VideoGeometry, inverse_temporal_major_permutation, temporal_major_permutation

LANES = 128  # TPU vector lane width: block sizes and band widths are multiples of it
DENSE_LIMIT_TOKENS = 16_384  # to_dense() refuses beyond this: 16k x 16k bools is already 256 MiB
BRUTE_FORCE_LIMIT_TOKENS = 32_768  # generic pair counting walks every pair; keep it bounded


def check_block_size(name: str, value) -> int:
    """Validate one block size: a positive multiple of 128 (the TPU lane width)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % LANES:
        hint = ""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
            lo = max(LANES, value // LANES * LANES)
            hi = -(-value // LANES) * LANES
            hint = f" (the nearest valid sizes are {lo} and {hi})" if lo != hi else f" (try {lo})"
        raise ValueError(f"{name} must be a positive multiple of {LANES} (the TPU lane width), "
                         f"got {value!r}{hint}")
    return int(value)


def _content_key(array) -> tuple:
    """A value key for a numpy table: dtype, shape and a 128-bit digest of its bytes.

    A digest rather than the bytes themselves keeps keys small (a permutation of 75,600 tokens
    is 600 KB); hashing it costs about a millisecond, and is done each time a key is asked for.
    """
    a = np.ascontiguousarray(array)
    return a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()


def _is_numpy(*xs) -> bool:
    return all(isinstance(x, (np.ndarray, np.generic, int)) for x in xs)


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


def _grid_cells(edges, tokens):
    """Cell starts and ends [cells] of a grid, clipped to the real tokens [0, tokens)."""
    edges = np.asarray(edges, dtype=np.int64)
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) < 0) or edges[0] < 0:
        raise ValueError(f"grid edges must be a non-decreasing 1-D array of at least 2 non-negative "
                         f"indices, got {edges!r}")
    return np.minimum(edges[:-1], tokens), np.minimum(edges[1:], tokens)


def _check_policy(policy):
    if policy not in ("balanced", "up", "down"):
        raise ValueError(f"policy must be 'balanced', 'up' or 'down', got {policy!r}")


@dataclass(frozen=True)
class RoundingReport:
    """What B3's rounding to whole tiles changed, in (query, key) pairs."""

    policy: str
    block_q: int
    block_kv: int
    exact_pairs: int        # pairs the exact mask keeps
    rounded_pairs: int      # pairs the tile-aligned mask keeps
    boundary_tiles: int     # tiles the exact mask cuts through
    boundary_kept: int      # of those, kept whole ("round up"); the rest are dropped
    boundary_budget: int    # exact pairs inside boundary tiles: what the kept ones should add up to
    pairs_added: int        # pairs the exact mask drops but a kept boundary tile computes
    pairs_dropped: int      # pairs the exact mask keeps but a dropped boundary tile loses

    @property
    def budget_error(self) -> float:
        """(rounded - exact) / exact: the relative change in computed pairs."""
        return (self.rounded_pairs - self.exact_pairs) / max(self.exact_pairs, 1)

    def __str__(self) -> str:
        return (f"rounded to {self.block_q}x{self.block_kv} tiles ({self.policy}): kept "
                f"{self.boundary_kept}/{self.boundary_tiles} boundary tiles, +{self.pairs_added:,} / "
                f"-{self.pairs_dropped:,} pairs, budget error {self.budget_error:+.3%}")


class Mask:
    """Base class: a boolean attention mask over `tokens` x `tokens` (query rows, key columns)."""

    tokens: int

    # -- the two questions every mask answers -------------------------------------------
    def keep(self, q, k):
        """Bool array: whether query index `q` may attend key index `k` (arrays broadcast)."""
        raise NotImplementedError

    def pair_counts(self, q_edges, k_edges) -> np.ndarray:
        """Kept pairs per grid cell, int64 `[len(q_edges) - 1, len(k_edges) - 1]`.

        Cell (i, j) covers queries [q_edges[i], q_edges[i+1]) and keys [k_edges[j], k_edges[j+1]);
        edges may run past `tokens` (padding counts nothing). This generic version walks every
        pair in row chunks; subclasses with structure override it with a closed form.
        """
        n = self.tokens
        if n > BRUTE_FORCE_LIMIT_TOKENS:
            raise ValueError(f"{type(self).__name__} has no closed-form pair count and {n:,} tokens is "
                             f"too many to count pair by pair (limit {BRUTE_FORCE_LIMIT_TOKENS:,}); "
                             "use a mask with structure (SVGMask, TileAlignedMask) at this size")
        q0, q1 = _grid_cells(q_edges, n)
        k0, k1 = _grid_cells(k_edges, n)
        out = np.zeros((q0.size, k0.size), dtype=np.int64)
        keys = np.arange(n)
        # cumulative kept count per row at every key edge, then differences give cells
        k_lo, k_hi = np.minimum(k0, n), np.minimum(k1, n)
        for i in range(q0.size):
            for start in range(int(q0[i]), int(q1[i]), 1024):
                rows = np.arange(start, min(start + 1024, int(q1[i])))
                kept = np.asarray(self.keep(rows[:, None], keys[None, :]), dtype=bool)
                csum = np.concatenate([np.zeros((rows.size, 1), np.int64), np.cumsum(kept, axis=1)], axis=1)
                out[i] += (csum[:, k_hi] - csum[:, k_lo]).sum(axis=0)
        return out

    def real_tokens_in(self, edges) -> np.ndarray:
        """Real tokens (not padding) in each cell of a grid, int64 `[len(edges) - 1]`.

        The planner's padding hook. Positions at or past `tokens` are always padding; a mask whose
        sequence also holds padding *inside* `tokens` (sliding tiles: cubes padded to whole size)
        counts only its real tokens here, and must keep no pair on a padding position. The
        planner then treats padding by role: a padded *query* row is computed and thrown away,
        so it needs no mask and a tile of nothing but padded rows is skipped; a padded *key*
        must never enter the softmax, so every tile holding one masks. Default: every position
        below `tokens` is real.
        """
        c0, c1 = _grid_cells(edges, self.tokens)
        return c1 - c0

    def kernel_predicate(self, block_q: int, block_kv: int):
        """The `keep` a kernel evaluates on its masked tiles of `block_q` x `block_kv`.

        Kernels can only evaluate predicates made of arithmetic on index arrays (no lookup
        tables: a kernel cannot capture a numpy array). By default that is `keep` itself;
        masks whose `keep` reads a table override this.
        """
        return self.keep

    # -- equality: a mask is the value of its defining parameters --------------------------
    def cache_key(self):
        """A hashable value that names this mask's contents, or None if it has none.

        Masks with equal keys keep the same pairs and tile the same way, so a kernel built for
        one serves the other (`attention`'s cache keys on this). Subclasses here key on their
        class and defining parameters; a table they hold enters by a digest of its contents.
        The base class returns None: a mask defined elsewhere, whose parameters svg_lib cannot
        know, is equal only to itself (as Python objects are by default).
        """
        return None

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Mask):
            return NotImplemented
        key = self.cache_key()
        return key is not None and key == other.cache_key()

    def __hash__(self):
        key = self.cache_key()
        return object.__hash__(self) if key is None else hash(key)

    # -- everything else follows from them -----------------------------------------------
    @property
    def pair_count(self) -> int:
        """Number of kept (query, key) pairs."""
        return int(self.pair_counts([0, self.tokens], [0, self.tokens])[0, 0])

    @property
    def pair_density(self) -> float:
        """Fraction of all tokens x tokens pairs that are kept."""
        return self.pair_count / float(self.tokens) ** 2

    def to_dense(self) -> np.ndarray:
        """The mask as a bool array `[tokens, tokens]`; refuses sizes that would not fit comfortably."""
        n = self.tokens
        if n > DENSE_LIMIT_TOKENS:
            gib = n * n / 2**30
            raise ValueError(
                f"a dense mask of {n:,} x {n:,} tokens would take {gib:.1f} GiB; to_dense() stops at "
                f"{DENSE_LIMIT_TOKENS:,} tokens. Use plan_tiles(mask, block_q, block_kv) or "
                "mask.pair_counts(...) for tile-level facts, or mask.keep(rows, cols) on a slice")
        idx = np.arange(n)
        return np.asarray(self.keep(idx[:, None], idx[None, :]), dtype=bool)

    def tile_aligned(self, block_q: int, block_kv: int, policy: str = "balanced") -> "TileAlignedMask":
        """B3: round this mask to whole `block_q` x `block_kv` tiles, preserving the pair budget.

        Full tiles stay, empty tiles stay empty. Each boundary tile (cut by the mask) is kept
        whole or dropped. `policy`:
          * "balanced": rank boundary tiles by the fraction of their pairs the mask keeps and keep
            the best prefix whose area is closest to the exact boundary-pair budget;
          * "up": keep every boundary tile (a superset of the mask: lossless, most work);
          * "down": drop every boundary tile (a subset: least work).
        """
        block_q = check_block_size("block_q", block_q)
        block_kv = check_block_size("block_kv", block_kv)
        _check_policy(policy)
        n = self.tokens
        q_edges = np.arange(0, -(-n // block_q) * block_q + 1, block_q)
        k_edges = np.arange(0, -(-n // block_kv) * block_kv + 1, block_kv)
        counts = self.pair_counts(q_edges, k_edges)
        q0, q1 = _grid_cells(q_edges, n)
        k0, k1 = _grid_cells(k_edges, n)
        area = (q1 - q0)[:, None] * (k1 - k0)[None, :]
        full = (counts == area) & (area > 0)
        boundary = (counts > 0) & ~full

        flat = np.flatnonzero(boundary)
        fraction = counts.flat[flat] / area.flat[flat]
        order = flat[np.argsort(-fraction, kind="stable")]  # best-covered tiles first
        budget = int(counts.flat[flat].sum())
        if policy == "up":
            n_keep = order.size
        elif policy == "down":
            n_keep = 0
        else:
            cum_area = np.concatenate([[0], np.cumsum(area.flat[order])])
            n_keep = int(np.argmin(np.abs(cum_area - budget)))
        kept = full.copy()
        kept.flat[order[:n_keep]] = True

        chosen, dropped = order[:n_keep], order[n_keep:]
        report = RoundingReport(
            policy=policy, block_q=block_q, block_kv=block_kv,
            exact_pairs=int(counts.sum()), rounded_pairs=int(area[kept].sum()),
            boundary_tiles=int(order.size), boundary_kept=int(n_keep), boundary_budget=budget,
            pairs_added=int((area.flat[chosen] - counts.flat[chosen]).sum()),
            pairs_dropped=int(counts.flat[dropped].sum()))
        return TileAlignedMask(n, block_q, block_kv, kept, report=report, source=self)


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
        return type(self), self.tokens, base, _content_key(self.pos), _content_key(self.order)

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


class TileAlignedMask(Mask):
    """A mask made of whole `block_q` x `block_kv` tiles: `kept[i, j]` keeps tile (i, j).

    Produced by `Mask.tile_aligned` (B3), which also leaves its `report` (what rounding changed)
    and `source` (the exact mask) here.
    """

    def __init__(self, tokens: int, block_q: int, block_kv: int, kept: np.ndarray,
                 report: RoundingReport | None = None, source: Mask | None = None):
        self.tokens = int(tokens)
        self.block_q = check_block_size("block_q", block_q)
        self.block_kv = check_block_size("block_kv", block_kv)
        self.kept = np.asarray(kept, dtype=bool)
        expect = (-(-self.tokens // self.block_q), -(-self.tokens // self.block_kv))
        if self.kept.shape != expect:
            raise ValueError(f"kept must be shaped {expect} for {tokens} tokens in {block_q}x{block_kv} "
                             f"tiles, got {self.kept.shape}")
        self.report = report
        self.source = source

    @property
    def band_width(self):
        return getattr(self.source, "band_width", None)

    def cache_key(self):
        # the kept tiles define it; `source` and `report` only say where they came from
        return type(self), self.tokens, self.block_q, self.block_kv, _content_key(self.kept)

    def keep(self, q, k):
        n = self.tokens
        if _is_numpy(q, k):
            qi, ki = np.minimum(q, n - 1) // self.block_q, np.minimum(k, n - 1) // self.block_kv
            return self.kept[qi, ki] & (q < n) & (k < n)
        import jax.numpy as jnp
        qi, ki = jnp.minimum(q, n - 1) // self.block_q, jnp.minimum(k, n - 1) // self.block_kv
        return jnp.asarray(self.kept)[qi, ki] & (q < n) & (k < n)

    def kernel_predicate(self, block_q: int, block_kv: int):
        if (block_q, block_kv) != (self.block_q, self.block_kv):
            raise ValueError(f"this TileAlignedMask is made of {self.block_q}x{self.block_kv} tiles; a kernel with "
                             f"{block_q}x{block_kv} blocks would need a table lookup per element. Use the same "
                             "block sizes (or method='b3', which rounds to its own blocks)")
        tokens = self.tokens

        def not_padding(q, k):  # the schedule visits only kept tiles: inside them only padding is masked
            return k < tokens
        return not_padding

    def tile_aligned(self, block_q: int, block_kv: int, policy: str = "balanced") -> "TileAlignedMask":
        block_q = check_block_size("block_q", block_q)
        block_kv = check_block_size("block_kv", block_kv)
        _check_policy(policy)
        if (block_q, block_kv) == (self.block_q, self.block_kv):
            return self  # already whole tiles: rounding changes nothing, under any policy
        return super().tile_aligned(block_q, block_kv, policy)

    def pair_counts(self, q_edges, k_edges) -> np.ndarray:
        # count = overlap_q @ kept @ overlap_k.T, where overlap[c, t] is how many tokens
        # grid cell c shares with tile t (float64 is exact far beyond any token count here)
        def overlap(edges, block):
            c0, c1 = _grid_cells(edges, self.tokens)
            t0 = np.arange(0, self.tokens, block)
            t1 = np.minimum(t0 + block, self.tokens)
            return np.clip(np.minimum(c1[:, None], t1[None, :]) - np.maximum(c0[:, None], t0[None, :]), 0, None)
        a = overlap(q_edges, self.block_q).astype(np.float64)
        b = overlap(k_edges, self.block_kv).astype(np.float64)
        return np.rint(a @ self.kept.astype(np.float64) @ b.T).astype(np.int64)

    def __repr__(self) -> str:
        return (f"TileAlignedMask(tokens={self.tokens}, tiles={self.block_q}x{self.block_kv}, "
                f"kept {int(self.kept.sum())}/{self.kept.size} tiles)")
