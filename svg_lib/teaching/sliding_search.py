"""The search notebook 10 runs at the case study's size: which cubes and windows of sliding tile
attention come near the band's pair budget, and what their tile plans cost.

A cube `(tt, th, tw)` of `tt * th * tw` tokens suits a TPU when its token count is a multiple of 128
(lane-aligned blocks) and a block that divides it keeps every tile inside one pair of cubes. For each
cube of a short list of shapes, every odd window up to the whole video is tried; the ones whose
pair density lies within `tolerance` of the budget are planned with the largest blocks the cube
allows up to `max_blocks`. Analytic: closed-form pair counts per tile, no N x N array, no kernel.
"""
from __future__ import annotations

import itertools

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.planner import plan_tiles
from svg_lib.extensions.sliding import SlidingTileMask, TileLayout

FRAMES, ROWS, COLS = (1, 3, 7), (8, 16, 24, 48), (16, 40, 80)   # the cube shapes notebook 10 tries


def cube_shapes(frames=FRAMES, rows=ROWS, cols=COLS):
    """Every `(tt, th, tw)` of the short list, in order."""
    return list(itertools.product(frames, rows, cols))


def windows(geometry: VideoGeometry, cube) -> list[tuple]:
    """Every window of odd extent, up to one cube past the video on each axis."""
    return list(itertools.product(*[range(1, c + 2, 2) for c in TileLayout(geometry, cube).cubes]))


def sliding_candidates(geometry: VideoGeometry, budget: float, *, volumes=(1024, 8192), tolerance: float = 0.03,
                       max_blocks=(3840, 1920), shapes=None) -> list[tuple]:
    """`[(plan, mask)]` for every cube of `shapes` (default `cube_shapes()`) with a lane-aligned token
    count in `volumes` (inclusive) and every window whose pair density is within `tolerance` of
    `budget`, planned with the largest multiples of 128 dividing the cube up to `max_blocks`
    (query, key); sorted by grid steps, then masked tiles."""
    found = []
    for cube in cube_shapes() if shapes is None else shapes:
        volume = int(np.prod(cube))
        if volume % 128 or not volumes[0] <= volume <= volumes[1]:
            continue
        divisors = [b for b in range(128, volume + 1, 128) if volume % b == 0]
        block_q = max(b for b in divisors if b <= max_blocks[0])
        block_kv = max(b for b in divisors if b <= max_blocks[1])
        for window in windows(geometry, cube):
            mask = SlidingTileMask(geometry, cube, window)
            if abs(mask.pair_density - budget) < tolerance:
                found.append((plan_tiles(mask, block_q, block_kv), mask))
    found.sort(key=lambda pm: (pm[0].stats["grid_steps"], pm[0].stats["tiles_masked"]))
    return found


def nearest_windows(geometry: VideoGeometry, cube, budget: float, count: int = 2) -> list[SlidingTileMask]:
    """The `count` windows of `cube` whose pair density is nearest to `budget`, nearest first."""
    masks = (SlidingTileMask(geometry, cube, window) for window in windows(geometry, cube))
    return sorted(masks, key=lambda m: abs(m.pair_density - budget))[:count]
