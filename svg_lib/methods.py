"""The series' methods, one record each: the only place that knows what a method's name means.

Every other module asks this table (`METHODS`, `method(name)`, `check_method`) what a method
runs, whether it takes a mask, which mask its kernel computes at given tiles, how its VMEM is
estimated and which bodies its grid steps run, instead of comparing names. A new stage is a new
record here plus its kernel (ARCHITECTURE.md, "Where a change goes").

The step kinds name the tile bodies the cost model prices (`svg_lib.instruments.tpu.cost`, from the probes):
"free" (mask-free), "svg_masked" (the mask's predicate on every element), "padding_masked" (only the
keys past the end), "blocks" (Splash's block-mask path), "idle" (a step that fetches and computes
nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svg_lib.core.planner import EMPTY, PARTIAL, TilePlan, plan_tiles


@dataclass(frozen=True)
class Method:
    """One method of the series.

    name: what `attention(..., method=name)` takes. label: how tables and plots name it (the case
    study's stage names). family: "reference" (float32 jnp), "svg_lib" (the series' Pallas kernels),
    "splash" (JAX's Splash attention). stage: the svg_lib kernel's schedule stage ("dense", "b1",
    "b2", "b3"), None for the others. needs_mask: refuses to run without a mask. computes: the pairs
    its kernel computes, "all" (dense attention), "exact" (the mask as given) or "tile_aligned" (the
    mask rounded to whole tiles, `Mask.tile_aligned`). full_step / partial_step: the body a FULL /
    PARTIAL tile of its plan runs (None: not a planned method). backward: whether the series has a
    backward kernel of its own for it (`svg_lib.kernels.backward`). tile_masks: whether its kernel
    builds a mask in VMEM on the tiles it masks, two int32 index slices and a bool per score element
    (`svg_lib.memory.vmem`; dense's on the key tile past the end); Splash's depends on its mask's
    form, which the record cannot know.
    """

    name: str
    label: str
    family: str
    stage: str | None
    needs_mask: bool
    computes: str
    full_step: str | None = None
    partial_step: str | None = None
    backward: bool = False
    tile_masks: bool = False

    @property
    def pallas(self) -> bool:
        """A Pallas kernel (lowered and compiled for a TPU; `reference` is plain jnp)."""
        return self.family != "reference"

    @property
    def splash(self) -> bool:
        return self.family == "splash"

    @property
    def planned(self) -> bool:
        """Walks a planner schedule (B1-B3): its cost follows the plan's tile classes."""
        return self.full_step is not None

    @property
    def masks_full_tiles(self) -> bool:
        """Evaluates the mask even on tiles it keeps whole (B1's cost: the naive kernel)."""
        return self.full_step is not None and self.full_step != "free"

    @property
    def mask_free_body(self) -> bool:
        """Its kernel compiles a mask-free tile body (`forward.body_copies`): all but B1, which masks every tile."""
        return not self.masks_full_tiles

    @property
    def rounds_to_tiles(self) -> bool:
        """Computes the mask rounded to whole tiles (B3): its plan is the tile-aligned mask's."""
        return self.computes == "tile_aligned"

    def step_classes(self, classes):
        """The tile classes `[nq, nk]` (or any array of them) as its kernel runs them: a kernel that
        masks full tiles too (B1) runs every visited tile as PARTIAL; the others run the plan's own."""
        classes = np.asarray(classes)
        if self.masks_full_tiles:
            return np.where(classes != EMPTY, PARTIAL, EMPTY).astype(classes.dtype)
        return classes

    @property
    def dense(self) -> bool:
        """Computes every pair (the baselines): it ignores any mask."""
        return self.computes == "all"

    def computed_mask(self, mask, block_q: int, block_kv: int):
        """The mask whose pairs the kernel computes at `block_q` x `block_kv`: None for dense
        attention, `mask` for an exact method, `mask.tile_aligned(...)` for B3."""
        if self.computes == "all" or mask is None:
            return None
        return mask.tile_aligned(block_q, block_kv) if self.rounds_to_tiles else mask


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("reference", "reference", "reference", None, False, "exact"),
    Method("dense", "dense", "svg_lib", "dense", False, "all", backward=True, tile_masks=True),
    Method("splash_dense", "B0", "splash", None, False, "all"),
    Method("splash", "Splash", "splash", None, True, "exact"),
    Method("b1", "B1", "svg_lib", "b1", True, "exact", "svg_masked", "svg_masked", backward=True, tile_masks=True),
    Method("b2", "B2", "svg_lib", "b2", True, "exact", "free", "svg_masked", backward=True, tile_masks=True),
    Method("b3", "B3", "svg_lib", "b3", True, "tile_aligned", "free", "padding_masked", backward=True, tile_masks=True),
)}

BASELINE = "splash_dense"  # B0, what the case study's speedups are against
BLOG_SWEEP_METHOD = "b2"   # the stage the case study swept block sizes with

# The method tuples other modules take their defaults from, all read off the table.
PALLAS_METHODS = tuple(n for n, m in METHODS.items() if m.pallas)
SPLASH_METHODS = tuple(n for n, m in METHODS.items() if m.splash)
PLANNED_METHODS = tuple(n for n, m in METHODS.items() if m.planned)
STAGES = tuple(m.stage for m in METHODS.values() if m.stage)          # the svg_lib kernels' stages
MASKED_METHODS = tuple(n for n, m in METHODS.items() if m.needs_mask)
BACKWARD_METHODS = tuple(n for n, m in METHODS.items() if m.backward)  # the stages with backward kernels
SERIES_METHODS = tuple(n for n, m in METHODS.items() if m.family == "svg_lib")  # the series' own kernels
# The orders the benchmarks, the cost model and the measurements list methods in: B0 first (what
# speedups are against), or Splash's two first.
DEFAULT_METHODS = (BASELINE,) + tuple(n for n in PALLAS_METHODS if n != BASELINE)  # every Pallas kernel
MODEL_METHODS = (BASELINE,) + SERIES_METHODS  # what the probes price: Splash's own steps only unmasked
SPLASH_FIRST_METHODS = SPLASH_METHODS + SERIES_METHODS
SERIES_FIRST_METHODS = SERIES_METHODS + SPLASH_METHODS  # the VMEM estimates' order


def check_method(name, among=None, *, what: str = "method") -> Method:
    """The record of method `name`, or a ValueError naming the bad value and the valid ones (worded
    as `problem.check_method`, which checks any name against a list and returns the name).

    `among`: the names this caller accepts (default: every method)."""
    allowed = tuple(METHODS) if among is None else tuple(among)
    if not isinstance(name, str) or name not in allowed:
        close = [m for m in allowed if isinstance(name, str) and m == name.strip().lower()]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown {what} {name!r}{hint}; valid: {', '.join(allowed)}")
    return METHODS[name]


def check_record(record, among=None, *, what: str = "method") -> Method:
    """`record`, a record of the table (one of `among`'s names, default every method), or an error
    saying what was given and what would work: what the kernels take in place of a name."""
    if not isinstance(record, Method):
        raise TypeError(f"{what} must be a record of svg_lib.methods.METHODS (e.g. METHODS['b3']), "
                        f"got {record!r}")
    check_method(record.name, among, what=what)
    return record


def check_methods(names, among=None, *, what: str = "method") -> tuple:
    """`check_method` for each of `names` (a tuple of method names), returned as a tuple of names."""
    names = tuple(names)
    if not names:
        raise ValueError(f"give at least one {what}; choose from {', '.join(METHODS if among is None else among)}")
    for name in names:
        check_method(name, among, what=what)
    return names


@dataclass(frozen=True, eq=False)  # compared by identity: its plans hold arrays
class MethodPlans:
    """The plans the methods run over at one tile size, each method handed its own (`for_method`).

    mask: the `TilePlan` of the mask as given, which the exact methods (B1, B2, Splash) walk.
    tile_aligned: the plan of that mask rounded to whole tiles (`Mask.tile_aligned`), which B3 walks;
    None where B3 is not priced. Either may be None, not both; given both, they share one `[nq, nk]`
    grid. Which plan a method walks is its record's business (`Method.rounds_to_tiles`), not the
    caller's: a caller passes this one value wherever a method's plan is needed.
    """

    mask: TilePlan | None = None
    tile_aligned: TilePlan | None = None

    def __post_init__(self):
        given = [p for p in (self.mask, self.tile_aligned) if p is not None]
        if not given:
            raise ValueError("MethodPlans needs a plan: MethodPlans(plan_tiles(mask, block_q, block_kv)) or "
                             "MethodPlans.of(mask, block_q, block_kv)")
        if len({(p.block_q, p.block_kv) + tuple(p.grid) for p in given}) > 1:
            raise ValueError(f"the mask's plan ({self.mask.block_q} x {self.mask.block_kv} tiles, grid "
                             f"{self.mask.grid}) and the tile-aligned plan ({self.tile_aligned.block_q} x "
                             f"{self.tile_aligned.block_kv}, grid {self.tile_aligned.grid}) must share one tile size")

    @classmethod
    def of(cls, mask, block_q: int, block_kv: int, *, tile_aligned: bool = True) -> MethodPlans:
        """Both plans of `mask` at `block_q` x `block_kv`: its own and its tile-aligned mask's (one plan
        where the mask already is tile-aligned there; rounding a mask that cannot be rounded raises).
        `tile_aligned=False`: the mask's own plan only (B3 not priced, no rounding paid for)."""
        plan = plan_tiles(mask, block_q, block_kv)
        if not tile_aligned:
            return cls(plan)
        aligned = mask.tile_aligned(block_q, block_kv)
        return cls(plan, plan if aligned is mask else plan_tiles(aligned, block_q, block_kv))

    @property
    def grid_plan(self) -> TilePlan:
        """Either plan: what the dense methods read (every tile of the shared grid, its tokens)."""
        return self.mask if self.mask is not None else self.tile_aligned

    def for_method(self, method) -> TilePlan:
        """The plan `method` (a name or a record) walks, or a ValueError saying which plan is missing
        and how to pass it."""
        record = method if isinstance(method, Method) else check_method(method)
        if record.dense:
            return self.grid_plan
        if record.rounds_to_tiles:
            if self.tile_aligned is None:
                raise ValueError(f"{record.name} walks the tile-aligned mask's plan and these plans have none: pass "
                                 f"MethodPlans.of(mask, block_q, block_kv), or MethodPlans(plan, tile_aligned="
                                 f"plan_tiles(mask.tile_aligned(block_q, block_kv), block_q, block_kv))")
            return self.tile_aligned
        if self.mask is None:
            raise ValueError(f"{record.name} walks the mask's own plan and these plans have only the tile-aligned "
                             f"one: pass MethodPlans.of(mask, block_q, block_kv) or MethodPlans(plan_tiles(mask, "
                             f"block_q, block_kv), tile_aligned=...)")
        return self.mask


def method_plans(plans) -> MethodPlans:
    """`plans` as a MethodPlans: one as is, a bare `TilePlan` as the mask's own plan (enough for every
    method but B3)."""
    if isinstance(plans, MethodPlans):
        return plans
    if isinstance(plans, TilePlan):
        return MethodPlans(plans)
    raise TypeError(f"plans must be a MethodPlans (or one TilePlan, the mask's), got {type(plans).__name__}")
