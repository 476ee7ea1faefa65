"""svg_lib: tile-aligned sparse attention for video diffusion on TPU, as taught by the notebook series.

The package in layers, bottom to top; a module imports only from its own layer and those below
(import-linter checks it: pyproject.toml, tests/test_layers.py; ARCHITECTURE.md says where a change
of each kind goes):

    environment   stdlib only: the package floors, libtpu present or not
    chips, cache  facts about TPU generations (TARGETS); where slow results are kept
    core/         NumPy only: geometry -> masks -> svg_masks, sliding -> planner (a mask becomes
                  small tables, forward and backward)
    problem, runtime
                  the problem, described once (BenchConfig; presets are named ones); where the
                  code runs
    memory/       arithmetic: vmem, smem estimates, known before building; budget checks both once
    kernels/      Pallas: forward (one tile body), backward, splash, reference
    attention     attention() and build_attention(): plan once, check memory once, build
    layers/       built on attention(): routing, profiling, multichip, synthetic, semantic tiles
    tpu/          TPU tooling without a TPU: lowering, compiler, errors, checks, sharded, probes
                  -> cost
    tools/        measuring: bench, tuner, frontier (recall against predicted time per mask)
    teaching/     plots -> charts, explorer, traversal, inspection, exercises/ (one checker each)
    cli/          every command line (`python -m svg_lib ...`)

This module gathers the public API from all of them; nothing inside the package imports it.
"""
from svg_lib.environment import check_environment

check_environment()  # before anything imports jax: a missing or too old package is named, with what to run

from svg_lib.environment import allow_shared_libtpu  # noqa: E402

allow_shared_libtpu()  # before jax sets up its backends: see svg_lib.environment

__version__ = "0.1.0"

# chips and the problem
from svg_lib.chips import TARGETS, parse_tpu_generation  # noqa: E402
from svg_lib.problem import (BLOG_SWEEP_V6E_MS, BLOG_V6E_MS, PRESETS, BenchConfig, Preset,  # noqa: E402
                             get_preset)
from svg_lib.runtime import Runtime, chip_devices, default_interpret, detect_runtime  # noqa: E402
# geometry, masks, the planner (3-D sliding tiles included)
from svg_lib.core.geometry import (VideoGeometry, inverse_temporal_major_permutation,  # noqa: E402
                                   temporal_major_permutation)
from svg_lib.extensions.token_order import to_frame_major, to_temporal_major  # noqa: E402
from svg_lib.extensions.tile_layout import (TileLayout, from_tile_major,  # noqa: E402
                                            inverse_tile_major_permutation, tile_major_permutation, to_tile_major)
from svg_lib.core.masks import Mask, RoundingReport, TileAlignedMask, check_block_size
from svg_lib.core.svg_masks import PermutedMask, SVGMask, TemporalMask
from svg_lib.extensions.sliding import SlidingTileMask
from svg_lib.extensions.radial import RadialMask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, TilePlan, plan_tiles  # noqa: E402
# memory, kernels, attention()
from svg_lib.memory.vmem import VmemEstimate, estimate_vmem  # noqa: E402
from svg_lib.kernels.reference import reference_attention  # noqa: E402
from svg_lib.attention import METHODS, attention, b3_mask, build_attention  # noqa: E402
# layers built on attention(): mixed-head routing, online profiling, synthetic inputs, multi-chip
from svg_lib.layers.routing import (CompileCounter, build_svg_attention, build_svg_attention_in_kernel,  # noqa: E402
                                    compare_temporal_tiles, megacore_balance, svg_attention,
                                    svg_attention_in_kernel)
from svg_lib.layers.profiling import HeadProfile, profile_heads  # noqa: E402
from svg_lib.layers.synthetic import (attention_recall, equal_budget_table, quality_table,  # noqa: E402
                                      relative_l2, structured_qkv)
from svg_lib.layers.multichip import build_sharded_svg_attention, make_mesh, sharded_svg_attention  # noqa: E402
# semantic tiles: masks computed from q and k on the device, run by the B3 kernels
from svg_lib.layers.semantic import SemanticCentroids, SemanticPlan, semantic_attention, semantic_plan  # noqa: E402
# pooled estimates: mean-pooled q and k per tile choose the tiles, on the device
from svg_lib.layers.pooled import PooledPlan, pooled_attention, pooled_plan  # noqa: E402
# compiled for TPU on this CPU by libtpu; per-tile cost simulated by the compiler
from svg_lib.instruments.tpu.compiler import CompileReport, compile_for_tpu  # noqa: E402
from svg_lib.instruments.tpu.sharded import (ShardedCompileReport, SplitCompileReport, compile_sharded_layer,  # noqa: E402
                                compile_split_attention)
from svg_lib.instruments.tpu.cost import TileCost, cost_model, tile_cost  # noqa: E402
# the benchmark and the block-size tuner
from svg_lib.instruments.tools.bench import BenchResult, run_benchmark  # noqa: E402
from svg_lib.instruments.tools.tuner import tune
from svg_lib.instruments.tools.tune_result import TuneResult  # noqa: E402
# plots, the mask explorer, the grid traversal view
from svg_lib.teaching.plots import (TILE_COLORS, ascii_tile_map, kept_fraction_grid, plot_mask,  # noqa: E402
                                    plot_tile_map, plot_tile_map_grid)
from svg_lib.teaching.explorer import mask_explorer  # noqa: E402
from svg_lib.teaching.traversal import grid_trace, plot_traversal, recorded_grid_trace  # noqa: E402
