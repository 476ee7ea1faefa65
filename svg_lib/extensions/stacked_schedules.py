"""Several masks' schedules as one packed table, for a kernel that routes each head to its kind.

The in-kernel routing (`svg_lib.layers.routing`) runs spatial and temporal heads in one
block-sparse kernel: `stack_schedules` stacks their plans' schedules kind by kind into one int32
table `[ceil(kinds * nq * steps / 2)]`, which `kernels.forward.block_sparse_attention` reads with a
`[heads]` head_kind row. The lesson's `attention(...)` runs one mask, one plan's schedule
(`TilePlan.schedule`), and never stacks.
"""
from __future__ import annotations

import numpy as np

from svg_lib.core.planner import EMPTY, pack_schedule


def stack_schedules(plans) -> np.ndarray:
    """Several plans' schedules as one packed table of `len(plans) * nq` rows of `steps` entries.

    Row `kind * nq + i` is query tile i of `plans[kind]`; `steps` is the largest of the plans'.
    A shorter plan's rows start with extra idle steps (class EMPTY) on their first key tile: steps
    that fetch and compute nothing, like the planner's own. Used by kernels that pick each head's
    row by a per-head kind (the in-kernel routing).
    """
    plans = list(plans)
    if not plans or len({p.grid for p in plans}) != 1:
        raise ValueError(f"stack_schedules needs plans of one tile grid, got {[p.grid for p in plans]}")
    steps = max(p.steps for p in plans)
    kv, cls = [], []
    for p in plans:
        extra = steps - p.steps
        kv.append(np.concatenate([np.repeat(p.kv_index[:, :1], extra, axis=1), p.kv_index], axis=1))
        cls.append(np.concatenate([np.full((p.grid[0], extra), EMPTY, np.int8), p.step_class], axis=1))
    return pack_schedule(np.concatenate(kv), np.concatenate(cls))
