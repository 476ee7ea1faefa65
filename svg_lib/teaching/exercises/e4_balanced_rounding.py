"""E4, B3's balanced rounding: `check_balanced_rounding` and its hidden cases.

The reference is `Mask.tile_aligned(..., policy="balanced")`."""
from __future__ import annotations

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import Mask
from svg_lib.core.svg_masks import SVGMask
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish


class _TileCounts(Mask):
    """A mask known only by its kept pairs per `block` x `block` tile (for E4's designed cases)."""

    def __init__(self, counts, tokens: int, block: int):
        self.tokens, self.block = int(tokens), int(block)
        self.counts = np.asarray(counts, dtype=np.int64)

    def keep(self, q, k):
        raise NotImplementedError("_TileCounts only knows its pair counts per tile")

    def pair_counts(self, q_edges, k_edges):
        return self.counts.copy()


def _rounding_case(name, mask: Mask, block_q: int, block_kv: int) -> _Case:
    """Boundary tiles of `mask` (flat order), their kept pairs and areas, and svg_lib's balanced choice."""
    rounded = mask.tile_aligned(block_q, block_kv, policy="balanced")
    nq, nk = rounded.kept.shape
    q_edges = np.minimum(np.arange(nq + 1) * block_q, mask.tokens)
    k_edges = np.minimum(np.arange(nk + 1) * block_kv, mask.tokens)
    counts = mask.pair_counts(q_edges, k_edges)
    area = np.diff(q_edges)[:, None] * np.diff(k_edges)[None, :]
    boundary = (counts > 0) & (counts < area)
    report = rounded.report
    assert int(counts[boundary].sum()) == report.boundary_budget  # the same tiles as svg_lib's rounding
    return _Case(name, dict(kept=counts[boundary].astype(np.int64), area=area[boundary].astype(np.int64),
                            budget=int(report.boundary_budget), reference=rounded.kept[boundary]))


def _designed_case(name, kept_fraction_rows, tokens=None, block=128):
    """A case from a grid of kept counts: every tile with 0 < kept < area is a boundary tile."""
    counts = np.asarray(kept_fraction_rows, dtype=np.int64)
    nq, nk = counts.shape
    tokens = tokens or max(nq, nk) * block
    mask = _TileCounts(counts, tokens, block)
    return _rounding_case(name, mask, block, block)


def _rounding_cases(seed: int) -> list[_Case]:
    rng = np.random.default_rng(seed)
    A = 128 * 128
    cases = [
        _rounding_case("the SVG mask of 3 frames x 8 x 16 tokens at density 0.35, 128 x 128 tiles",
                       SVGMask.spatial(VideoGeometry(3, 8, 16), 0.35), 128, 128),
        _designed_case("no boundary tiles at all (every tile full or empty)", [[A, 0], [0, A]]),
        _designed_case("one boundary tile with 40 % of its pairs kept", [[A, int(0.4 * A)], [0, A]]),
        _designed_case("one boundary tile with 70 % of its pairs kept", [[A, int(0.7 * A)], [0, A]]),
        _designed_case("four boundary tiles, each exactly half kept (a tie in the ranking)",
                       [[A // 2, A // 2], [A // 2, A // 2]]),
        _designed_case("ten boundary tiles at 30 % each: the budget asks for three of them whole",
                       [[int(0.3 * A)] * 5, [int(0.3 * A)] * 5] + [[0] * 5] * 3),
        _designed_case("nine boundary tiles at 90 % each: the budget asks to drop about one",
                       [[int(0.9 * A)] * 3] * 3),
        # 200 tokens in tiles of 128: the last row and column of tiles are cut short by the sequence's end,
        # so a tile keeping fewer pairs can keep a larger fraction of them
        _designed_case("tiles of different areas (the sequence ends inside the last row and column of tiles)",
                       [[9000, 4000], [3000, 5000]], tokens=200),
        _designed_case("two tiles whose prefixes sit equally far from the budget (either choice is right)",
                       [[int(0.75 * A), int(0.75 * A)], [0, 0]]),
    ]
    geometries = [VideoGeometry(3, 8, 16), VideoGeometry(5, 6, 20), VideoGeometry(4, 10, 13, text_tokens=30),
                  VideoGeometry(21, 8, 15), VideoGeometry(7, 9, 9)]
    for _ in range(8):
        g = geometries[int(rng.integers(len(geometries)))]
        density = float(rng.uniform(0.15, 0.6))
        sink = bool(rng.random() < 0.7)
        bq, bkv = (int(x) * 128 for x in rng.integers(1, 4, 2))
        mask = SVGMask.spatial(g, density, first_frame_sink=sink)
        cases.append(_rounding_case(f"random: SVG mask, {g}, density {density:.2f}"
                                    f"{'' if sink else ', no sink'}, {bq} x {bkv} tiles", mask, bq, bkv))
    return cases


def _check_rounding_case(fn, case) -> None:
    """One hidden case of B3's rounding: raise `_Fail` with what is wrong and a hint, or return."""
    kept, area, budget, ref = (case.data[x] for x in ("kept", "area", "budget", "reference"))
    try:
        got = _call(fn, "balanced_rounding", kept.copy(), area.copy(), budget)
    except _Fail as fail:
        if kept.size:
            raise
        raise _Fail(fail.detail, "here no tile is cut by the mask's edge (kept and area are empty): the only "
                    "prefix is the empty one, so return an empty bool array; count the empty prefix among the "
                    "candidates") from None
    try:
        chosen = np.asarray(got)
    except Exception:
        raise _Fail(f"balanced_rounding returned {type(got).__name__}, expected a bool array",
                    "return one True/False per boundary tile") from None
    if chosen.shape != kept.shape or (chosen.dtype != bool and chosen.size):
        kind = "indices" if chosen.dtype.kind in "iu" and chosen.shape != kept.shape else f"dtype {chosen.dtype}"
        raise _Fail(f"expected a bool array of shape {kept.shape}, got shape {chosen.shape} ({kind})",
                    "return a keep-whole flag per boundary tile (np.zeros(len(kept), bool), then set the chosen "
                    "ones), not the indices of the chosen tiles")
    chosen = chosen.astype(bool)
    got_pairs, ref_pairs = int(area[chosen].sum()), int(area[ref].sum())
    ref_gap = abs(ref_pairs - budget)
    n = kept.size
    if n and chosen.all() and ref_gap < abs(got_pairs - budget):
        raise _Fail(f"you keep all {n} boundary tiles whole ({got_pairs:,} pairs) for a budget of {budget:,} pairs",
                    "rounding every boundary tile up is lossless but computes every pair the edges add; "
                    "B3 keeps only as many as the budget pays for. " + (
                        "With one tile, the empty prefix (keep none) is a candidate too" if n == 1 else
                        "A prefix's total is its tiles' area: summed over kept, every prefix stays within the "
                        "budget and the whole ranking looks closest"))
    if n and not chosen.any() and ref_gap < abs(got_pairs - budget):
        raise _Fail(f"you drop all {n} boundary tiles (0 pairs) for a budget of {budget:,} pairs",
                    "rounding every boundary tile down loses every kept pair in them; some tiles should stay")
    # a prefix of the ranking: every kept tile covers at least the fraction of every dropped one
    if chosen.any() and (~chosen).any():
        ki, ai = kept[chosen].astype(object), area[chosen].astype(object)
        kd, ad = kept[~chosen].astype(object), area[~chosen].astype(object)
        worst_kept = min(range(ki.size), key=lambda t: (ki[t] / ai[t], t))
        best_dropped = max(range(kd.size), key=lambda t: (kd[t] / ad[t], -t))
        if ki[worst_kept] * ad[best_dropped] < kd[best_dropped] * ai[worst_kept]:
            a_idx = int(np.flatnonzero(chosen)[worst_kept])
            b_idx = int(np.flatnonzero(~chosen)[best_dropped])
            hint = ("rank the tiles by the fraction of their pairs the mask keeps, kept / area, and keep the "
                    "best-covered ones first")
            if kept[a_idx] > kept[b_idx]:
                hint += " (the fraction, not the number of kept pairs: tiles at the sequence's end are smaller)"
            raise _Fail(f"you keep tile {a_idx} ({kept[a_idx]:,} of {area[a_idx]:,} pairs kept, "
                        f"{kept[a_idx] / area[a_idx]:.1%}) but drop tile {b_idx} ({kept[b_idx]:,} of "
                        f"{area[b_idx]:,}, {kept[b_idx] / area[b_idx]:.1%})", hint)
    gap = abs(got_pairs - budget)
    if gap > ref_gap and chosen.sum() == ref.sum():
        raise _Fail(f"your {int(chosen.sum())} kept tiles hold {got_pairs:,} pairs, {gap:,} from the budget of "
                    f"{budget:,}; the same number of tiles in ranking order gets within {ref_gap:,}",
                    "ties in the ranking keep index order (a stable sort of -kept / area): "
                    "np.argsort(-kept / area, kind=\"stable\"), not a reversed ascending sort")
    if gap > ref_gap:
        side = "above" if got_pairs > budget else "below"
        fewer_more = "fewer" if got_pairs > budget else "more"
        raise _Fail(f"your {int(chosen.sum())} kept tiles hold {got_pairs:,} pairs, {gap:,} {side} the budget of "
                    f"{budget:,}; keeping {fewer_more} tiles of the ranking gets within {ref_gap:,}",
                    "among all prefixes of the ranking (including the empty one and all of it), take the one "
                    "whose total area is closest to the budget, on either side of it")


def check_balanced_rounding(fn, *, seed: int = 0) -> CheckResult:
    """E4: `fn(kept, area, budget) -> bool [tiles]` chooses the boundary tiles B3 keeps whole.

    kept, area: int arrays `[tiles]` (kept pairs and pairs of each boundary tile); budget: the
    pairs the kept tiles should add up to (the exact mask's pairs in boundary tiles). Accepted: a
    prefix of the tiles ranked by kept fraction (ties in any order) whose area is as close to the
    budget as svg_lib's `Mask.tile_aligned(..., policy="balanced")` gets.
    """
    return _finish("E4 balanced_rounding", _rounding_cases(seed), lambda case: _check_rounding_case(fn, case),
                   "SVG masks at random sizes, no boundary tiles, ties in the ranking and in the distance, "
                   "tiles cut short by the sequence's end")
