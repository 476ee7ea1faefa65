"""Notebook 06's your-code piece: B3's rounding, written by the learner.

`balanced_rounding(kept, area, budget) -> bool [tiles]` picks which boundary tiles B3 keeps whole
(the contract of E4, `e4_balanced_rounding`, whose hidden cases and checks this reuses, with two
more cases: the notebook's own mask at its knobs, and the case study's at 3328 x 1536).
`tile_aligned_with(mask, block_q, block_kv, rounding)` turns any such rounding into the
`TileAlignedMask` B3 computes, so the kernel, its plan and its cost are the learner's.
`svg_lib_rounding` is the library's piece (the ranking `Mask.tile_aligned` does); `ROUNDING_HINTS`
the hints and the solution.
"""
from __future__ import annotations

import inspect

import numpy as np

from svg_lib.attention import build_attention
from svg_lib.core.masks import Mask, RoundingReport, TileAlignedMask, check_block_size
from svg_lib.problem import get_preset
from svg_lib.teaching.exercises.common import CheckResult, _finish
from svg_lib.teaching.exercises.e4_balanced_rounding import _check_rounding_case, _rounding_case, _rounding_cases
from svg_lib.teaching.yourcode import Hints


def svg_lib_rounding(kept, area, budget):
    """svg_lib's balanced rounding (as `Mask.tile_aligned(..., policy="balanced")` ranks and keeps)."""
    kept, area = np.asarray(kept, np.int64), np.asarray(area, np.int64)
    order = np.argsort(-(kept / np.maximum(area, 1)), kind="stable")   # best-covered tiles first
    cum_area = np.concatenate([[0], np.cumsum(area[order])])
    chosen = np.zeros(kept.size, dtype=bool)
    chosen[order[:int(np.argmin(np.abs(cum_area - budget)))]] = True
    return chosen


def _solution(kept, area, budget):
    fraction = kept / area                      # the share of each tile's pairs the exact mask keeps
    order = np.argsort(-fraction, kind="stable")   # best-covered first; ties in index order, as svg_lib's
    totals = np.concatenate([[0], np.cumsum(area[order])])   # pairs of each prefix, the empty one first
    n_keep = int(np.argmin(np.abs(totals - budget)))         # the prefix closest to the budget
    chosen = np.zeros(len(kept), dtype=bool)
    chosen[order[:n_keep]] = True
    return chosen


ROUNDING_HINTS = Hints(
    "B3 rounding",
    ("A tile's rank is the share of its pairs the exact mask keeps: kept / area, not kept alone "
     "(tiles at the sequence's end are smaller).",
     "Sort the tiles best-covered first (np.argsort(-fraction, kind=\"stable\"): tied tiles keep their index "
     "order, as svg_lib's ranking does); the answer keeps a prefix of that order.",
     "Sum the areas along the order, starting from 0 for the empty prefix "
     "(np.concatenate([[0], np.cumsum(area[order])])); keep the prefix whose sum is closest to the budget, "
     "above or below it (np.argmin of the absolute difference).",
     "Return a bool array with one flag per tile, True for the tiles of that prefix, not their indices."),
    inspect.getsource(_solution).replace("def _solution", "def balanced_rounding"))


def _boundary(mask: Mask, block_q: int, block_kv: int):
    """Each tile's exact kept pairs and area, and which tiles are boundary tiles (analytic: no N x N)."""
    n = mask.tokens
    q_edges = np.minimum(np.arange(-(-n // block_q) + 1) * block_q, n)
    k_edges = np.minimum(np.arange(-(-n // block_kv) + 1) * block_kv, n)
    counts = mask.pair_counts(q_edges, k_edges)
    area = np.diff(q_edges)[:, None] * np.diff(k_edges)[None, :]
    return counts, area, (counts > 0) & (counts < area)


def tile_aligned_with(mask: Mask, block_q: int, block_kv: int, rounding) -> TileAlignedMask:
    """The tile-aligned mask B3 computes when `rounding(kept, area, budget)` picks the boundary tiles.

    Full tiles are kept, empty ones dropped; the boundary tiles (flat order) go to `rounding`, whose
    flags decide them. The result carries a `RoundingReport`, like `mask.tile_aligned(...)`'s.
    """
    block_q, block_kv = check_block_size("block_q", block_q), check_block_size("block_kv", block_kv)
    counts, area, boundary = _boundary(mask, block_q, block_kv)
    b_kept, b_area = counts[boundary].astype(np.int64), area[boundary].astype(np.int64)
    budget = int(b_kept.sum())
    chosen = np.asarray(rounding(b_kept.copy(), b_area.copy(), budget))
    if chosen.shape != b_kept.shape or chosen.dtype != bool:
        raise ValueError(f"the rounding must return one bool per boundary tile, shape {b_kept.shape}; got "
                         f"shape {chosen.shape}, dtype {chosen.dtype} (run its checker first)")
    kept = (counts == area) & (area > 0)
    kept[boundary] = chosen
    report = RoundingReport(
        policy="balanced", block_q=block_q, block_kv=block_kv, exact_pairs=int(counts.sum()),
        rounded_pairs=int(area[kept].sum()), boundary_tiles=int(b_kept.size), boundary_kept=int(chosen.sum()),
        boundary_budget=budget, pairs_added=int((b_area - b_kept)[chosen].sum()),
        pairs_dropped=int(b_kept[~chosen].sum()))
    return TileAlignedMask(mask.tokens, block_q, block_kv, kept, report=report, source=mask)


def b3_builder(rounding):
    """`builder(config) -> f(q, k, v)`: B3 on `rounding`'s tiles for a BenchConfig (the explorer's `kernels`)."""
    def build(config):
        aligned = tile_aligned_with(config.mask(), config.block_q, config.block_kv, rounding)
        return build_attention(aligned, method="b3", heads=config.heads, tokens=config.tokens,
                               head_dim=config.head_dim, dtype=config.dtype, block_q=config.block_q,
                               block_kv=config.block_kv, block_kv_compute=config.block_kv_compute)
    return build


def check_rounding(fn, mask: Mask | None = None, block_q: int | None = None, block_kv: int | None = None, *,
                   seed: int = 0) -> CheckResult:
    """Notebook 06: `fn(kept, area, budget) -> bool [tiles]`, B3's balanced rounding (E4's contract).

    The hidden cases: the notebook's `mask` at `block_q` x `block_kv` (its knobs) first, the case
    study's mask at its 3328 x 1536 tiles, then E4's (designed ties, tiles cut short by the
    sequence's end, random SVG masks)."""
    cases = []
    if mask is not None:
        cases.append(_rounding_case(f"this notebook's mask, {mask.tokens:,} tokens, {block_q} x {block_kv} tiles",
                                    mask, block_q, block_kv))
    blog = get_preset("blog")
    cases.append(_rounding_case(f"the case study's mask, {blog.tokens:,} tokens, {blog.block_q} x {blog.block_kv} "
                                "tiles", blog.mask(), blog.block_q, blog.block_kv))
    cases += _rounding_cases(seed)
    return _finish("B3 rounding", cases, lambda case: _check_rounding_case(fn, case),
                   "this notebook's mask at its tiles, the case study's, SVG masks at random sizes, no boundary "
                   "tiles, ties in the ranking and in the distance, tiles cut short by the sequence's end")
