"""svg_lib: tile-aligned sparse attention for video diffusion on TPU, as taught by the notebook series."""
from .geometry import (VideoGeometry, inverse_temporal_major_permutation, temporal_major_permutation,
                       to_frame_major, to_temporal_major)
from .masks import Mask, PermutedMask, RoundingReport, SVGMask, TileAlignedMask, check_block_size
from .planner import EMPTY, FULL, PARTIAL, TilePlan, plan_tiles
from .reference import reference_attention

__version__ = "0.1.0"
