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

from dataclasses import dataclass

import numpy as np

from svg_lib.cache import content_key

LANES = 128  # TPU vector lane width: block sizes and band widths are multiples of it
DENSE_LIMIT_TOKENS = 16_384  # to_dense() refuses beyond this: 16k x 16k bools is already 256 MiB
BRUTE_FORCE_LIMIT_TOKENS = 32_768  # generic pair counting walks every pair; keep it bounded


def check_block_size(name: str, value) -> int:
    """Validate one block size: a positive int multiple of 128 (the TPU lane width); a float,
    even 128.0, is refused as not an int (every block size passes through here)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        raise ValueError(f"{name} must be an int, got {float(value)!r} (a float); pass the int {int(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % LANES:
        hint = ""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
            lo = max(LANES, value // LANES * LANES)
            hi = -(-value // LANES) * LANES
            hint = f" (the nearest valid sizes are {lo} and {hi})" if lo != hi else f" (try {lo})"
        raise ValueError(f"{name} must be a positive multiple of {LANES} (the TPU lane width), "
                         f"got {value!r}{hint}")
    return int(value)


def padding_only(tokens: int):
    """The `keep` of a tile whose pairs are all kept but for key padding (a whole kept tile, dense
    attention's tiles): keys at or past `tokens` are masked, nothing else."""
    def not_padding(q_ids, k_ids):
        return k_ids < tokens
    return not_padding


FAR_ABOVE = 4.0  # a mask keeping more than this many times the density asked for says why (DensityFloorWarning)


class DensityFloorWarning(UserWarning):
    """The mask keeps far more than the density asked for: the sink and the band's minimum width
    (one lane tile, 128 tokens) keep a share of the pairs that no smaller density can lower."""


def density_floor_note(mask) -> str | None:
    """Why a band mask (an `SVGMask`: `density`, `band_width`, `sink_tokens`) keeps over FAR_ABOVE
    times the density it was asked for, in one line; None when it keeps about what was asked, or
    for a mask without a requested density. The floor is what the same sink with the narrowest band
    (one lane tile) keeps: no smaller density can lower it."""
    density = getattr(mask, "density", None)
    if density is None or not hasattr(mask, "band_width") or not hasattr(mask, "sink_tokens"):
        return None
    kept = mask.pair_density
    if kept <= FAR_ABOVE * density:
        return None
    n, sink = mask.tokens, mask.sink_tokens
    floor = type(mask)(mask.geometry, min(LANES, n), sink).pair_density
    parts = ([f"the first-frame sink ({sink:,} keys every query sees)"] if sink else []) + \
        [f"the band's minimum width ({LANES} tokens, one lane tile)"]
    return (f"density {density:g} asks for {density:.2%} of the pairs but the mask keeps {kept:.1%} at {n:,} tokens: "
            f"{' and '.join(parts)} keep{'' if sink else 's'} {floor:.1%} whatever the density; the smallest density "
            f"that means something at this size is about {floor:.2g}")


def warn_density_floor(mask, stacklevel: int = 3) -> None:
    """Warn (DensityFloorWarning) with `density_floor_note(mask)` where there is one."""
    note = density_floor_note(mask)
    if note:
        import warnings

        warnings.warn(note, DensityFloorWarning, stacklevel=stacklevel)


def _is_numpy(*xs) -> bool:
    return all(isinstance(x, (np.ndarray, np.generic, int)) for x in xs)


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
        return type(self), self.tokens, self.block_q, self.block_kv, content_key(self.kept)

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
        return padding_only(self.tokens)  # the schedule visits only kept tiles: inside them only padding is masked

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
