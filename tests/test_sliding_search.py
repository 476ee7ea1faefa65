"""Notebook 10's search over sliding-tile cubes and windows (svg_lib.teaching.sliding_search)."""
import numpy as np

from svg_lib import SVGMask, VideoGeometry
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.teaching.sliding_search import cube_shapes, nearest_windows, sliding_candidates, windows


def test_candidates_keep_the_budget_and_tile_whole_cubes():
    geo = VideoGeometry(6, 16, 40)
    budget = SVGMask.spatial(geo, 0.35).pair_density
    found = sliding_candidates(geo, budget, volumes=(256, 2048), max_blocks=(1024, 512),
                               shapes=[(1, 8, 16), (1, 16, 40), (3, 8, 40), (2, 16, 16)])
    assert found
    for plan, mask in found:
        volume = int(np.prod(mask.tile))
        assert volume % 128 == 0 and 256 <= volume <= 2048
        assert abs(mask.pair_density - budget) < 0.03
        assert volume % plan.block_q == 0 and volume % plan.block_kv == 0
        assert plan.block_q <= 1024 and plan.block_kv <= 512
    keys = [(p.stats["grid_steps"], p.stats["tiles_masked"]) for p, _ in found]
    assert keys == sorted(keys)
    # nothing within the tolerance was left out, for one cube checked by brute force
    cube = (1, 16, 40)
    brute = {w for w in windows(geo, cube) if abs(SlidingTileMask(geo, cube, w).pair_density - budget) < 0.03}
    assert brute == {m.window for _, m in found if m.tile == cube}


def test_nearest_windows_are_the_closest_to_the_budget():
    geo = VideoGeometry(5, 8, 16)
    cube, budget = (1, 8, 16), 0.4
    near = nearest_windows(geo, cube, budget, count=3)
    gaps = sorted(abs(SlidingTileMask(geo, cube, w).pair_density - budget) for w in windows(geo, cube))
    assert [abs(m.pair_density - budget) for m in near] == gaps[:3]


def test_the_short_list_of_shapes():
    shapes = cube_shapes()
    assert len(shapes) == 3 * 4 * 3 and (3, 8, 80) in shapes and (1, 48, 80) in shapes
