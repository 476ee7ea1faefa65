"""svg_lib: tile-aligned sparse attention for video diffusion on TPU, as taught by the notebook series."""
from ._environment import check_environment

check_environment()  # before anything imports jax: a missing or too old package is named, with what to run

from .compiler import allow_shared_libtpu

allow_shared_libtpu()  # before jax sets up its backends: see svg_lib.compiler

from .geometry import (VideoGeometry, inverse_temporal_major_permutation, temporal_major_permutation,
                       to_frame_major, to_temporal_major)
from .masks import Mask, PermutedMask, RoundingReport, SVGMask, TemporalMask, TileAlignedMask, check_block_size
# 3-D sliding tiles (helper: sliding)
from .geometry import TileLayout, from_tile_major, inverse_tile_major_permutation, tile_major_permutation, to_tile_major
from .masks import SlidingTileMask
from .planner import EMPTY, FULL, PARTIAL, TilePlan, plan_tiles
from .reference import reference_attention

__version__ = "0.1.0"
# runtime detection, problem-size presets, plots (helper: runtime/plots/cli)
from .runtime import PRESETS, Preset, Runtime, default_interpret, detect_runtime, get_preset, parse_tpu_generation
from .plots import TILE_COLORS, ascii_tile_map, kept_fraction_grid, plot_mask, plot_tile_map, plot_tile_map_grid
from .attention import METHODS, attention, b3_mask, build_attention
from .vmem import VmemEstimate, estimate_vmem
from .bench import BLOG_SWEEP_V6E_MS, BLOG_V6E_MS, BenchConfig, BenchResult, run_benchmark
# compiled for TPU on this CPU by libtpu (helper: compile)
from .compiler import TARGETS, CompileReport, compile_for_tpu
# block-size tuner, interactive explorers, grid traversal view
from .tuner import TuneResult, tune
from .explorer import mask_explorer
from .traversal import grid_trace, plot_traversal, recorded_grid_trace
# mixed-head routing, online profiling, structured synthetic inputs, multi-chip (helper: routing/profiling/multichip)
from .routing import (CompileCounter, build_svg_attention, build_svg_attention_in_kernel, compare_temporal_tiles,
                      svg_attention, svg_attention_in_kernel)
from .profiling import HeadProfile, profile_heads
from .synthetic import attention_recall, equal_budget_table, quality_table, relative_l2, structured_qkv
from .multichip import (ShardedCompileReport, build_sharded_svg_attention, compile_sharded_layer, make_mesh,
                        sharded_svg_attention)
# per-tile cost simulated by the TPU compiler, and the plan's cost model
from .cost import TileCost, cost_model, tile_cost
