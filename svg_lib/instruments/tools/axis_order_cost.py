"""What each router candidate costs per head: its attention by the cost model, plus its permutation.

The router's candidates (`layers.semantic_router.candidate_plans`): SVG's spatial and temporal
bands, semantic tiles, and the six axis orders of the video grid (`layers.axis_orders`). Each is a
tile selection `[heads, nq, nk]` in its own token order; per head:

* attention: `tpu.cost.model_cycles("b3", ...)` of that head's tiles as a `TileAlignedMask`
  (simulated cycles per grid step of each body kind, from the TPU compiler's static profile,
  plus each query tile's per-row cost);
* permutation: q, k, v into the order and the output back. `permutation_cycles` prices each kind
  of candidate from `permutation` (a dict name -> cycles per head, e.g. compile-only static-profile
  records of the transposes) where given, else from the bytes it moves over the chip's HBM
  bandwidth (`axis_orders.transpose_bytes` / `chips.TpuTarget.hbm_gbps`, at the clock
  `chips.clock_hz` assumes): a lower bound, said so by `permutation_source`. The spatial band and
  the "fhw" order move nothing; the temporal band is the "hwf" transpose; semantic tiles' gathers
  move at least the same bytes as a transpose.
"""
from __future__ import annotations

import numpy as np

from svg_lib.chips import check_target, clock_hz
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.planner import plan_tiles
from svg_lib.methods import MethodPlans
from svg_lib.layers.axis_orders import AXES, TEMPORAL_ORDER, transpose_bytes
from svg_lib.instruments.tpu.cost import model_cycles

# which transpose (or movement as large as one) each non-order candidate pays
BAND_MOVES = {"spatial": AXES, "temporal": TEMPORAL_ORDER, "semantic": "gather"}


def order_of(candidate: str) -> str:
    """The axis order a candidate name moves its tokens by ("order:hfw" -> "hfw", "temporal" -> "hwf"),
    "gather" for semantic tiles."""
    if candidate.startswith("order:"):
        return candidate[len("order:"):]
    if candidate not in BAND_MOVES:
        raise ValueError(f"unknown candidate {candidate!r}: spatial, temporal, semantic or order:<fhw...>")
    return BAND_MOVES[candidate]


def bandwidth_cycles(nbytes: int, target: str) -> float:
    """Cycles to move `nbytes` through HBM at the chip's spec-sheet bandwidth, at `clock_hz`'s clock."""
    t = check_target(target)
    return nbytes / (t.hbm_gbps * 1e9) * clock_hz(target)


def permutation_cycles(candidate: str, geometry: VideoGeometry, *, head_dim: int = 128, itemsize: int = 2,
                       target: str = "v6e", permutation: dict | None = None) -> float:
    """Cycles per head of moving q, k, v into `candidate`'s order and the output back: `permutation[order]`
    if given (cycles per head), else `transpose_bytes` over HBM bandwidth (0 for the frame-major order)."""
    order = order_of(candidate)
    if permutation and order in permutation:
        return float(permutation[order])
    if order == AXES:
        return 0.0
    return bandwidth_cycles(transpose_bytes(geometry, TEMPORAL_ORDER if order == "gather" else order,
                                            head_dim=head_dim, itemsize=itemsize), target)


def permutation_source(candidate: str, permutation: dict | None = None) -> str:
    """Where `permutation_cycles` took its figure from, in words."""
    order = order_of(candidate)
    if permutation and order in permutation:
        return "static profile"
    return "none moved" if order == AXES else "bytes / HBM bandwidth"


def attention_cycles(tiles, tokens: int, cost, *, block_q: int, block_kv: int) -> np.ndarray:
    """f64 `[heads]`: B3's simulated cycles per head over each head's `tiles` (bool `[heads, nq, nk]`),
    `model_cycles("b3", cost, MethodPlans(tile_aligned=...))`; `cost` a `TileCost` at these blocks."""
    if (cost.block_q, cost.block_kv) != (block_q, block_kv):
        raise ValueError(f"the costs are for {cost.block_q} x {cost.block_kv} tiles, the plan's {block_q} x {block_kv}")
    tiles = np.asarray(tiles, bool)
    out = []
    for kept in tiles:
        plan = plan_tiles(TileAlignedMask(tokens, block_q, block_kv, kept), block_q, block_kv)
        out.append(model_cycles("b3", cost, MethodPlans(tile_aligned=plan)))
    return np.asarray(out, np.float64)


def candidate_cycles(plans, names, geometry: VideoGeometry, cost, *, head_dim: int = 128, itemsize: int = 2,
                     target: str = "v6e", permutation: dict | None = None) -> np.ndarray:
    """f64 `[heads, candidates]`: each head's attention cycles under each candidate plan (`plans`, as
    `candidate_plans` returns them, named `names`) plus the candidate's permutation cycles."""
    if len(plans) != len(names):
        raise ValueError(f"{len(plans)} plans but {len(names)} names")
    cols = []
    for plan, name in zip(plans, names):
        att = attention_cycles(plan.tiles, plan.tokens, cost, block_q=plan.block_q, block_kv=plan.block_kv)
        cols.append(att + permutation_cycles(name, geometry, head_dim=head_dim, itemsize=itemsize, target=target,
                                             permutation=permutation))
    return np.stack(cols, axis=1)
