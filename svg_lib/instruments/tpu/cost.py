"""Per-tile cost on a TPU, read from the TPU compiler's own simulation (no TPU needed).

libtpu can dump, for every kernel it compiles, a *static LLO profile*: `estimated_cycles`
is a cycle-level simulation of one call of the whole kernel (every grid step, DMA waits
included), and the final VLIW bundles say how much code the kernel is. `svg_lib.instruments.tpu.probes`
compiles small *probe kernels* and reads both; this module turns them into what a cost model
needs, caches the results, keeps the committed reference measurements and models a plan:

    from svg_lib import tile_cost
    cost = tile_cost("v6e", block_q=512, block_kv=256)
    cost.cycles_per_step("svg_lib", "free"), cost.cycles_per_step("splash", "free")

    python -m svg_lib cost --target v6e --preset small [--json]

What it reports, per kernel (ours: "svg_lib"; JAX's Splash: "splash") and block size:
- cycles per grid step of each tile-body kind: "free" (mask-free), "svg_masked" (the SVG
  band-and-sink predicate evaluated elementwise), "padding_masked" (only `k < tokens`) and
  "idle" (a skipped step: no body, no DMA), and the roofline, "matmuls": the tile's two matmuls
  alone, nothing between them (svg_lib's probe only), against which every body is put
  (`TileCost.floor`, `vs_floor`, the table's "vs matmuls" column);
- cycles per query-tile row that do not depend on the steps (init, finish, q and output DMA);
- bundles: the probe kernel's total scheduled bundles, and per body kind the difference to
  the kernel without a body (the tile body's code size).

How the probes measure, and the instrument's limits: `svg_lib.instruments.tpu.probes`. No clock rate is
reported: compare cycles, never convert them to seconds. Results are cached per libtpu
version, jax version and the source of the kernels (`cache_dir()`, `probes.versions()`), so a
notebook rereads them instantly.

Evidence kind of every number here: *simulated by the TPU compiler's static profile*
(compile-only, nothing run).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from svg_lib import cache as cache_files  # `cache` is a parameter name here
from svg_lib.methods import BASELINE, METHODS, MODEL_METHODS, MethodPlans, check_method, method_plans
from svg_lib.chips import check_target
from svg_lib.environment import MissingCompiler, has_libtpu, missing_compiler_message
from svg_lib.core.masks import check_block_size
from svg_lib.core.planner import EMPTY, FULL, PARTIAL
from svg_lib.problem import BenchConfig, check_block_kv_compute, resolve_problem
from svg_lib.instruments.tpu.probes import (BACKWARD_KERNELS, BACKWARD_KINDS, BLOCKS_KIND, BODY_KINDS, CACHE_FORMAT, COST_KERNELS,
                                FAILING_KIND, FLOOR_KIND, PROBE_ROWS, PROBE_STEPS, SPLASH_KINDS, TILE_KINDS, Probe,
                                probes_for, run_probes, versions)

# who runs which backward kernels for one tile (BackwardCost.per_tile)
BACKWARD_PAIRS = {"svg_lib": ("svg_lib_dq", "svg_lib_dkv"), "svg_lib_fused": ("svg_lib_fused",),
                  "splash": ("splash_dq", "splash_dkv"), "splash_fused": ("splash_fused",)}
EVIDENCE = "simulated by the TPU compiler's static LLO profile (compile-only, not measured)"


def cache_dir() -> Path:
    """Where cost results live: beside the tuner's cache, in `.../svg_lib/cost`."""
    return cache_files.cache_dir("cost")


# -- the measurement --------------------------------------------------------------------------

@dataclass
class TileCost:
    """Simulated cost of each tile-body kind for one block size (see the module docstring).

    `per_step[kernel][kind]` cycles per grid step, `per_row[kernel]` cycles per query tile
    beyond its steps, `bundles[kernel][kind]` total scheduled bundles of the probe kernel, and
    `body_bundles[kernel][kind]` that less the bundles of the body-less probe (svg_lib only)."""

    target: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    per_step: dict
    per_row: dict
    bundles: dict
    body_bundles: dict
    versions: dict
    raw: list = field(default_factory=list)
    from_cache: bool = False
    cache_path: str | None = None
    evidence: str = EVIDENCE
    # {kind: why}: kinds asked for that this chip's static profile could not simulate
    unsimulated: dict = field(default_factory=dict)

    def cycles_per_step(self, kernel: str, kind: str) -> float | None:
        return self.per_step.get(kernel, {}).get(kind)

    @property
    def floor(self) -> float | None:
        """Cycles per step of the tile's two matmuls alone (`probes.FLOOR_KIND`): the roofline of a
        body at these blocks on this chip; None when it was not probed."""
        return self.cycles_per_step("svg_lib", FLOOR_KIND)

    def vs_floor(self, kernel: str, kind: str = "free") -> float | None:
        """`kernel`'s body of `kind` over the matmul floor (1.0: the body costs its matmuls alone)."""
        c, floor = self.cycles_per_step(kernel, kind), self.floor
        return None if c is None or not floor else c / floor

    def ratio(self, kind: str = "free") -> float | None:
        """svg_lib's cycles per step of `kind` over Splash's (<= 1: ours is as cheap or cheaper)."""
        ours, theirs = self.cycles_per_step("svg_lib", kind), self.cycles_per_step("splash", kind)
        return None if not ours or not theirs else ours / theirs

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("from_cache", "cache_path")}

    @classmethod
    def from_json(cls, data: dict, **extra) -> "TileCost":
        return cls(**{**data, **extra})

    def table(self) -> str:
        head = (f"tile cost on {self.target}, {self.block_q} x {self.block_kv} tiles (block_kv_compute "
                f"{self.block_kv_compute}), head_dim {self.head_dim}, bf16; {self.evidence}; "
                f"libtpu {self.versions.get('libtpu')}, jax {self.versions.get('jax')}")
        lines = [head, f"{'kernel':8} {'body':15} {'cycles/step':>12} {'vs splash':>10} {'vs matmuls':>11} "
                       f"{'bundles':>9} {'body bundles':>13}"]
        for kernel in COST_KERNELS:
            for kind in TILE_KINDS:
                c = self.cycles_per_step(kernel, kind)
                if c is None:
                    continue
                ref = self.cycles_per_step("splash", kind if kind in SPLASH_KINDS else "free")
                rel = f"{c / ref:.2f}x" if ref and kernel == "svg_lib" and kind not in ("idle", FLOOR_KIND) else ""
                floor = self.vs_floor(kernel, kind)
                roof = f"{floor:.2f}x" if floor is not None and kind not in ("idle", FLOOR_KIND) else ""
                b = self.bundles.get(kernel, {}).get(kind)
                bb = self.body_bundles.get(kernel, {}).get(kind)
                lines.append(f"{kernel:8} {kind:15} {c:12,.0f} {rel:>10} {roof:>11} {b or '':>9} "
                             f"{'' if bb is None else bb:>13}")
            if kernel in self.per_row:
                lines.append(f"{kernel:8} {'per q-tile row':15} {self.per_row[kernel]:12,.0f}")
        for kind, why in self.unsimulated.items():
            lines.append(f"(not simulated: {kind}; {why})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _cache_path(key: dict) -> Path:
    return cache_dir() / f"{cache_files.key_digest(key)}.json"


def _summarise(probes: list[Probe], rows: list[dict]) -> tuple[dict, dict, dict, dict]:
    cyc = {(p.kernel, p.kind, p.rows, p.steps): r.get("cycles") for p, r in zip(probes, rows)}
    bun = {(p.kernel, p.kind, p.rows, p.steps): r.get("bundles") for p, r in zip(probes, rows)}
    errors = [f"{p}: {r['error']}" for p, r in zip(probes, rows) if r.get("error")]
    if errors:
        raise RuntimeError("probe kernels failed to compile:\n" + "\n".join(errors))
    (r1, r2), (s1, s2) = PROBE_ROWS, PROBE_STEPS
    per_step, per_row, bundles, body_bundles = {}, {}, {}, {}
    for kernel, kind in sorted({(p.kernel, p.kind) for p in probes}):
        a, b = cyc[(kernel, kind, r1, s1)], cyc[(kernel, kind, r1, s2)]
        per_step.setdefault(kernel, {})[kind] = (b - a) / (s2 - s1)
        bundles.setdefault(kernel, {})[kind] = bun[(kernel, kind, r1, s1)]
    for kernel in per_step:
        two = cyc.get((kernel, "free", r2, s1))
        if two is not None:
            per_row[kernel] = (two - cyc[(kernel, "free", r1, s1)]) - s1 * per_step[kernel]["free"]
        base = bundles[kernel].get("idle")
        if base is not None:
            body_bundles[kernel] = {k: (v - base if v is not None else None) for k, v in bundles[kernel].items()}
    return per_step, per_row, bundles, body_bundles


def tile_cost(target: str = "v6e", config: BenchConfig | None = None, *, block_q: int | None = None,
              block_kv: int | None = None, block_kv_compute: int | None = None, head_dim: int | None = None,
              kernels=COST_KERNELS, kinds=TILE_KINDS, per_row: bool = True, refresh: bool = False) -> TileCost:
    """Simulated cycles per grid step of each tile-body kind, svg_lib's and Splash's (cached).

    The tiles: a `config`'s (`BenchConfig`: its blocks and head_dim; any given here wins), or
    `block_q`, `block_kv` given alone (head_dim 128 unless given).

    Compiles up to 14 small probe kernels in a subprocess the first time (a minute or two on
    a CPU at 512 x 256 tiles, much longer at the blog's 3328 x 1536), then reads the cache.
    `kernels` and `kinds` limit what is probed (Splash has only "free", "svg_masked" and "blocks");
    `per_row=False` leaves out the per-row probe (the model then counts no per-row cost)."""
    check_target(target)
    if config is not None:
        if not isinstance(config, BenchConfig):
            raise TypeError(f"config must be a BenchConfig (e.g. get_preset('small')), got {type(config).__name__}")
        block_q, block_kv = block_q or config.block_q, block_kv or config.block_kv
        block_kv_compute = block_kv_compute or config.block_kv_compute
        head_dim = head_dim or config.head_dim
    if block_q is None or block_kv is None:
        raise TypeError("tile_cost needs a BenchConfig, or block_q and block_kv")
    head_dim = 128 if head_dim is None else head_dim
    block_q, block_kv = check_block_size("block_q", block_q), check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    for k in kernels:
        if k not in COST_KERNELS:
            raise ValueError(f"unknown kernel {k!r}; tile_cost knows {COST_KERNELS}")
    for k in kinds:
        if k not in TILE_KINDS:
            raise ValueError(f"unknown tile-body kind {k!r}; tile_cost knows {TILE_KINDS}")
    v = versions("forward")
    path = _cache_path(_cache_key(target, block_q, block_kv, block_kv_compute, head_dim, kernels, kinds, v, per_row))
    if path.exists() and not refresh:
        return TileCost.from_json(json.loads(path.read_text()), from_cache=True, cache_path=str(path))
    if not has_libtpu():  # nothing to compile with: the committed cycles where they exist, else what to install
        committed = None if refresh else committed_tile_cost(target, block_q, block_kv, block_kv_compute, head_dim,
                                                             kernels, kinds)
        if committed is None:
            raise MissingCompiler(missing_compiler_message(
                f"simulating {target} cycles at {block_q} x {block_kv} tiles (compute {block_kv_compute}, head_dim "
                f"{head_dim}; the committed reference has {reference_tiles(kernels)})"))
        return committed
    probes = probes_for(block_q, block_kv, block_kv_compute, head_dim, kernels,
                        [k for k in kinds if k != BLOCKS_KIND], per_row)
    rows = run_probes(probes, target)
    unsimulated = {}
    if BLOCKS_KIND in kinds and "splash" in kernels:
        # in a process of its own: where the static profile cannot model its mask block's DMA (a
        # v5e), the compiler aborts, and only this kind is lost
        extra = probes_for(block_q, block_kv, block_kv_compute, head_dim, ("splash",), (BLOCKS_KIND,), False)
        try:
            rows += run_probes(extra, target)
            probes += extra
        except RuntimeError as e:
            if "Static LLO profiling" not in str(e):
                raise
            unsimulated[BLOCKS_KIND] = next(line for line in str(e).splitlines() if "Static LLO profiling" in line)
    return _store(path, target, probes, rows, v, unsimulated)


def _cache_key(target, block_q, block_kv, block_kv_compute, head_dim, kernels, kinds, v, per_row=True) -> dict:
    key = {"format": CACHE_FORMAT, "what": "tile_cost", "target": target, "block_q": block_q,
           "block_kv": block_kv, "block_kv_compute": block_kv_compute, "head_dim": head_dim,
           "kernels": list(kernels), **v}
    if tuple(kinds) != TILE_KINDS:
        key["kinds"] = list(kinds)
    if not per_row:
        key["per_row"] = False
    return key


def _store(path: Path, target: str, probes: list[Probe], rows: list[dict], v: dict, unsimulated=None) -> TileCost:
    p0 = probes[0]
    block_q, block_kv, block_kv_compute, head_dim = p0.block_q, p0.block_kv, p0.block_kv_compute, p0.head_dim
    per_step, per_row, bundles, body_bundles = _summarise(probes, rows)
    raw = [{**p.to_json(), **r} for p, r in zip(probes, rows)]
    result = TileCost(target, block_q, block_kv, block_kv_compute, head_dim, per_step, per_row, bundles,
                      body_bundles, v, raw, unsimulated=unsimulated or {})
    cache_files.write_json_atomic(path, result.to_json())
    result.cache_path = str(path)
    return result




@dataclass
class BackwardCost:
    """Simulated cycles per grid step of the backward kernels at one block size.

    `per_step[kernel][kind]` for kernel in BACKWARD_KERNELS. The split backwards, ours and Splash's
    default, run two steps per visited tile (one in the dq pass, one in the dk/dv pass), the fused
    kernels, ours and Splash's, one; `per_tile(who)` sums a tile's steps for who in BACKWARD_PAIRS.
    `floor`: the fused tile's five matmuls alone (`per_step["svg_lib_fused"]["matmuls"]`)."""

    target: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    per_step: dict
    versions: dict
    raw: list = field(default_factory=list)
    evidence: str = EVIDENCE

    def per_tile(self, who: str, kind: str = "free") -> float | None:
        steps = [self.per_step.get(k, {}).get(kind) for k in BACKWARD_PAIRS[who]]
        return None if None in steps else sum(steps)

    def ratio(self, kind: str = "free", versus: str = "splash", ours: str = "svg_lib") -> float | None:
        """`ours`' cycles per tile (our split backward, or "svg_lib_fused") over `versus`' (Splash's two
        kernels, or "splash_fused")."""
        mine, theirs = self.per_tile(ours, kind), self.per_tile(versus, kind)
        return None if not mine or not theirs else mine / theirs

    @property
    def floor(self) -> float | None:
        """The backward's roofline per tile: the fused tile's five matmuls alone."""
        return self.per_step.get("svg_lib_fused", {}).get(FLOOR_KIND)

    def vs_floor(self, who: str = "svg_lib_fused", kind: str = "free") -> float | None:
        tile = self.per_tile(who, kind)
        return None if not tile or not self.floor else tile / self.floor

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def table(self) -> str:
        lines = [f"backward tile cost on {self.target}, {self.block_q} x {self.block_kv} tiles (block_kv_compute "
                 f"{self.block_kv_compute}), head_dim {self.head_dim}, bf16; {self.evidence}; "
                 f"libtpu {self.versions.get('libtpu')}, jax {self.versions.get('jax')}",
                 f"{'kernel':12} {'body':11} {'cycles/step':>12}"]
        for kernel in BACKWARD_KERNELS:
            for kind, cycles in self.per_step.get(kernel, {}).items():
                lines.append(f"{kernel:12} {kind:11} {cycles:12,.0f}")
        for kind in BACKWARD_KINDS:
            if self.ratio(kind) is not None:
                lines.append(f"per tile, {kind}: svg_lib dq + dkv {self.per_tile('svg_lib', kind):,.0f}; Splash dq + dkv "
                             f"{self.per_tile('splash', kind):,.0f} ({self.ratio(kind):.2f}x); Splash fused "
                             f"{self.per_tile('splash_fused', kind):,.0f} ({self.ratio(kind, 'splash_fused'):.2f}x)")
            fused = self.ratio(kind, "splash_fused", ours="svg_lib_fused")
            mine = self.per_tile("svg_lib_fused", kind)
            if fused is None and mine and kind != FLOOR_KIND and self.per_tile("svg_lib_fused"):
                lines.append(f"per tile, {kind}: svg_lib fused {mine:,.0f} = {mine / self.per_tile('svg_lib_fused'):.2f}x "
                             f"its mask-free tile; svg_lib dq + dkv {self.per_tile('svg_lib', kind):,.0f}")
            if fused is not None:
                floor = f"; the five matmuls alone {self.floor:,.0f} ({self.vs_floor(kind=kind):.2f}x)" if self.floor else ""
                lines.append(f"per tile, {kind}: svg_lib fused {self.per_tile('svg_lib_fused', kind):,.0f} = "
                             f"{fused:.2f}x Splash fused{floor}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def backward_tile_cost(target: str = "v6e", *, block_q: int, block_kv: int, block_kv_compute: int | None = None,
                       head_dim: int = 128, kinds=("free",), refresh: bool = False) -> BackwardCost:
    """Simulated cycles per grid step of our dq and dk/dv kernels and Splash's fused backward
    (cached like `tile_cost`; compiled in a subprocess the first time). `kinds` beyond "free" are
    measured for our kernels only."""
    check_target(target)
    block_q, block_kv = check_block_size("block_q", block_q), check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    bad = [k for k in kinds if k not in BACKWARD_KINDS or k == FLOOR_KIND]
    if bad:
        raise ValueError(f"unknown backward body kind(s) {bad}; backward_tile_cost knows "
                         f"{tuple(k for k in BACKWARD_KINDS if k != FLOOR_KIND)} (and always measures the floor)")
    v = versions("backward")
    key = {**_cache_key(target, block_q, block_kv, block_kv_compute, head_dim, BACKWARD_KERNELS, BODY_KINDS, v),
           "what": "backward_tile_cost", "kinds": list(kinds)}
    path = _cache_path(key)
    if path.exists() and not refresh:
        return BackwardCost(**json.loads(path.read_text()))
    if not has_libtpu():  # the committed backward cycles where they cover this, else what to install
        committed = load_backward_reference()["costs"].get((target, block_q, block_kv))
        if committed is not None and (committed.block_kv_compute, committed.head_dim) == (block_kv_compute, head_dim) \
                and all(k in committed.per_step.get("svg_lib_dq", {}) for k in kinds):
            return committed
        raise MissingCompiler(missing_compiler_message(
            f"simulating the backward's {target} cycles at {block_q} x {block_kv} tiles"))
    # Splash's masked backward is left out: its mask-function probes simulate cheaper than its mask-free
    # ones at 512 x 256 (1,163 against 1,378 cycles for the fused kernel, v6e), so they do not measure a
    # masked tile, and its dq kernel's masked probe overflows the default scoped VMEM at the blog's tiles
    measured = [(kernel, kind) for kernel in BACKWARD_KERNELS for kind in kinds
                if kind == "free" or kernel.startswith("svg_lib")] + [("svg_lib_fused", FLOOR_KIND)]
    probes = [Probe(kernel, kind, block_q, block_kv, block_kv_compute, head_dim, PROBE_ROWS[0], steps)
              for kernel, kind in measured for steps in PROBE_STEPS]
    rows = run_probes(probes, target, bundles=False)
    errors = [f"{p}: {r['error']}" for p, r in zip(probes, rows) if r.get("error")]
    if errors:
        raise RuntimeError("backward probe kernels failed to compile:\n" + "\n".join(errors))
    cycles = {(p.kernel, p.kind, p.steps): r["cycles"] for p, r in zip(probes, rows)}
    (s1, s2) = PROBE_STEPS
    per_step = {}
    for kernel, kind in measured:
        per_step.setdefault(kernel, {})[kind] = (cycles[kernel, kind, s2] - cycles[kernel, kind, s1]) / (s2 - s1)
    result = BackwardCost(target, block_q, block_kv, block_kv_compute, head_dim, per_step, v,
                          [{**p.to_json(), **r} for p, r in zip(probes, rows)])
    cache_files.write_json_atomic(path, result.to_json())
    return result


# -- the committed reference measurements ----------------------------------------------------
# Compiling the probes at the blog's tiles takes many minutes on a CPU, so the series commits one
# set of results (svg_lib/data/cost_reference.json, written by tools/forward-reference.py) that notebooks
# read; `tile_cost` recomputes any of them on this machine.
REFERENCE_FILE = Path(__file__).resolve().parents[2] / "data" / "cost_reference.json"



def committed_tile_cost(target: str, block_q: int, block_kv: int, block_kv_compute: int, head_dim: int = 128,
                        kernels=COST_KERNELS, kinds=TILE_KINDS) -> TileCost | None:
    """The committed reference's cycles (group "after", the kernels as they are) for these tiles, or
    None where it has none with this compute slice, head_dim and every kernel asked for; what it
    lacks of `kinds` stays unprobed (Splash's block-mask body on a v5e is named in `unsimulated`).
    Its `cache_path` is the reference file, so a caller can say where the numbers came from."""
    cost = load_reference()["groups"]["after"].get((target, block_q, block_kv))
    if cost is None or (cost.block_kv_compute, cost.head_dim) != (block_kv_compute, head_dim):
        return None
    if any(k not in cost.per_step for k in kernels):
        return None
    if "splash" in kernels and BLOCKS_KIND in kinds and BLOCKS_KIND not in cost.per_step["splash"]:
        cost.unsimulated.setdefault(BLOCKS_KIND, "not in the committed reference (the static profile could not "
                                                 "simulate it on this chip)")
    return cost


def reference_tiles(kernels=COST_KERNELS) -> str:
    """The committed reference's (chip, block_q x block_kv) entries that hold every one of `kernels`, as words."""
    group = load_reference()["groups"]["after"]
    keys = sorted(key for key, cost in group.items() if all(k in cost.per_step for k in kernels))
    return ", ".join(f"{t} {bq} x {bkv}" for t, bq, bkv in keys)


def load_reference(path: Path = REFERENCE_FILE) -> dict:
    """The committed reference: {"date", "versions", "evidence", "note", "groups": {group: {(target,
    block_q, block_kv): TileCost}}}."""
    data = json.loads(Path(path).read_text())
    data["groups"] = {g: {(c["target"], c["block_q"], c["block_kv"]): TileCost.from_json(c, from_cache=True,
                                                                                       cache_path=str(path))
                          for c in costs} for g, costs in data["groups"].items()}
    return data


def filled_from(cost: TileCost, fallback: TileCost | None = None, *, padding_as_free: bool = False,
                blocks_as_free: bool = False) -> TileCost:
    """`cost` with the kernels, kinds, per-row costs and bundles it did not probe taken from `fallback`
    (the same block size; None: nothing taken). With `padding_as_free`, a missing padding_masked cost
    is taken as `cost`'s own mask-free cost instead; with `blocks_as_free`, a missing Splash "blocks"
    cost as Splash's mask-free one (a lower bound for B0 with padded keys: a v5e's static profile
    cannot simulate that body). Say so wherever the result is shown."""
    import copy

    if fallback is not None and (cost.block_q, cost.block_kv) != (fallback.block_q, fallback.block_kv):
        raise ValueError(f"block sizes differ: {cost.block_q} x {cost.block_kv} vs {fallback.block_q} x {fallback.block_kv}")
    out = copy.deepcopy(cost)
    if fallback is not None:
        for kernel, kinds in fallback.per_step.items():
            mine = out.per_step.setdefault(kernel, {})
            if padding_as_free and "padding_masked" not in mine and "free" in mine and "padding_masked" in kinds:
                mine["padding_masked"] = mine["free"]
            for kind, cycles in kinds.items():
                mine.setdefault(kind, cycles)
        for kernel, cycles in fallback.per_row.items():
            out.per_row.setdefault(kernel, cycles)
        for mine, theirs in ((out.bundles, fallback.bundles), (out.body_bundles, fallback.body_bundles)):
            for kernel, kinds in theirs.items():
                for kind, n in kinds.items():
                    mine.setdefault(kernel, {}).setdefault(kind, n)
    splash = out.per_step.get("splash", {})
    if blocks_as_free and BLOCKS_KIND not in splash and "free" in splash:
        splash[BLOCKS_KIND] = splash["free"]
    return out


# -- the cost model from the plan -------------------------------------------------------------

# the case study's measured ratios to B0 (one v6e, its problem and blocks), for comparison only
BLOG_RATIOS = {"splash_dense": 1.0, "b1": 96.37 / 78.70, "b2": 54.12 / 78.70, "b3": 32.76 / 78.70}


def step_kinds(method: str, plans=None) -> dict:
    """How many grid steps (per head) of each body kind `method` runs, and its query-tile rows.

    `plans`: a `MethodPlans` (B3 needs its tile-aligned plan), or one TilePlan, the mask's own;
    each method takes the plan its record says it walks (`MethodPlans.for_method`).

    splash_dense / dense: every tile (dense masks the key tiles that reach into padding;
    Splash needs no masking without padding, and with it runs its block-mask body on every
    tile, "blocks", as the series' B0 does at the blog's 75,600 tokens); b1: every visited tile masked with the SVG
    predicate; b2: full tiles free, partial tiles masked; b3: the tile-aligned plan, whose
    masked tiles mask only key padding. Idle steps pad each row to the plan's `steps`.
    """
    record = check_method(method, MODEL_METHODS)
    if not record.planned:  # every tile
        p = _plans(record, plans).grid_plan
        nq, nk = p.classes.shape
        padded = nk * p.block_kv != p.mask.tokens
        if record.splash:  # padded keys make Splash's mask blocks (kernels.splash.splash_mask)
            return {"rows": nq, BLOCKS_KIND if padded else "free": nq * nk}
        return {"rows": nq, "free": nq * (nk - padded), "padding_masked": nq * padded}
    sc = _plans(record, plans).for_method(record).step_class
    return {"rows": sc.shape[0], **_kinds(record.full_step, int((sc == FULL).sum()), record.partial_step,
                                          int((sc == PARTIAL).sum()), int((sc == EMPTY).sum()))}


def _plans(record, plans) -> MethodPlans:
    """`plans` as a MethodPlans, or an error saying what `record` needs."""
    if plans is None:
        raise ValueError(f"{record.name} needs its plan: pass MethodPlans.of(mask, block_q, block_kv) "
                         f"(or plan_tiles(mask, block_q, block_kv) for a method other than B3)")
    return method_plans(plans)


def _kinds(full_kind, full, partial_kind, partial, idle) -> dict:
    """Step counts by body kind (a FULL and a PARTIAL tile may run the same body: B1's)."""
    out = {full_kind: full}
    out[partial_kind] = out.get(partial_kind, 0) + partial
    out["idle"] = idle
    return out


def check_pass_rate(pass_rate: float) -> float:
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"pass_rate is the fraction of query tiles whose rows pass the bound's test, in [0, 1]; "
                         f"got {pass_rate}")
    return float(pass_rate)


def failing_delta(cost: TileCost) -> float:
    """Cycles per step a query tile that fails the bound's test pays over one that passes: the
    mask-free body's `FAILING_KIND` less its bounded cost (the same difference is added to masked
    steps, whose running-max bodies are not probed)."""
    ours = cost.per_step.get("svg_lib", {})
    if FAILING_KIND not in ours or "free" not in ours:
        raise ValueError(f"these costs ({cost.target}, {cost.block_q} x {cost.block_kv}) lack the "
                         f"{FAILING_KIND!r} probe that a pass rate below 1 needs: tile_cost(..., kinds=BODY_KINDS)")
    return ours[FAILING_KIND] - ours["free"]


def model_cycles(method: str, cost: TileCost, plans=None, heads: int = 1, pass_rate: float = 1.0) -> float:
    """Simulated cycles of one call of `method`: sum over grid steps of that step's body cost,
    plus the per-row cost of each query tile; `heads` times that (heads run one after another
    on one TensorCore). `plans`: as `step_kinds` takes them.

    `pass_rate`: the fraction of query tiles whose rows pass the bound's check (kernels.forward:
    they subtract the bound at every step; the others undo their first step and keep the running max). It depends on
    the activations, which a plan does not know: 1 prices every tile at the bounded body, 0 at the
    failing one (`failing_delta` more per body step). Splash has no bound: its cost does not move."""
    kinds = step_kinds(method, plans)
    kernel = check_method(method, MODEL_METHODS).family
    per_step = cost.per_step[kernel]
    missing = [k for k in kinds if k not in ("rows", *per_step)]
    if missing:
        why = "; ".join(f"{k}: {cost.unsimulated[k]}" for k in missing if k in cost.unsimulated)
        raise ValueError(f"{method} runs {missing} steps, which these costs ({cost.target}, {cost.block_q} x "
                         f"{cost.block_kv}) lack for {kernel}{' (' + why + ')' if why else ''}: probe them "
                         f"(tile_cost(...) probes every kind) or fill them (filled_from(cost, other) or, for "
                         f"Splash's blocks, filled_from(cost, blocks_as_free=True), a lower bound)")
    fails = 0.0 if kernel == "splash" or check_pass_rate(pass_rate) == 1.0 else (1.0 - pass_rate) * failing_delta(cost)
    total = kinds.pop("rows") * cost.per_row.get(kernel, 0.0)  # per-row cost unprobed: left out
    for kind, n in kinds.items():
        total += n * (per_step[kind] + (fails if kind != "idle" else 0.0))
    return heads * total


def cost_model(problem, costs, *, block_q: int | None = None, block_kv: int | None = None, heads: int | None = None,
               methods=MODEL_METHODS, pass_rate: float = 1.0) -> dict:
    """Model cycles of each method for `problem` at `block_q` x `block_kv`, from `costs` (a TileCost
    for that block size). Returns {method: cycles} and {method + "/b0": ratio to splash_dense}.
    `pass_rate`: the fraction of query tiles that take the bounded max (`model_cycles`).

    `problem`: a `BenchConfig` (its mask, blocks and heads; any given here wins) or a Mask (give
    the blocks; heads default to 1)."""
    mask, fields = resolve_problem(problem, needs=("block_q", "block_kv"), block_q=block_q, block_kv=block_kv,
                                   heads=heads)
    block_q, block_kv, heads = fields["block_q"], fields["block_kv"], fields["heads"] or 1
    plans = MethodPlans.of(mask, block_q, block_kv)
    out = {m: model_cycles(m, costs, plans, heads, pass_rate) for m in methods}
    if BASELINE in out:
        out.update({f"{m}/b0": out[m] / out[BASELINE] for m in methods})
    return out


# -- the training step: forward + backward from the plan ---------------------------------------

def backward_step_kinds(method: str, plans=None) -> dict:
    """Grid steps (per head) of each kind in `method`'s fused backward, which walks the transposed
    schedule (`TilePlan.transposed_tables`): per key tile, the query tiles that visit it, each row
    padded with idle steps to the longest. Dense and splash_dense: every tile, no idle step. B3's
    masked tiles mask only key padding, priced here as SVG-masked ones (the probe there is; an upper
    bound, on a handful of tiles). `plans`: as `step_kinds` takes them."""
    record = check_method(method, MODEL_METHODS)
    if not record.planned:
        nq, nk = _plans(record, plans).grid_plan.classes.shape
        return {"free": nq * nk}
    _, step_class, _ = _plans(record, plans).for_method(record).transposed_tables
    # the backward's only masked probe is the SVG predicate's: B3's padding tiles are priced at it
    return _kinds(record.full_step, int((step_class == FULL).sum()), "svg_masked", int((step_class == PARTIAL).sum()),
                  int((step_class == EMPTY).sum()))


def training_model(problem, forward: TileCost, backward: "BackwardCost", *, block_q: int | None = None,
                   block_kv: int | None = None, heads: int | None = None, methods=MODEL_METHODS,
                   pass_rate: float = 1.0) -> dict:
    """Model cycles of one training step's attention (forward, then `jax.grad`'s backward) per method,
    from the forward's and the backward's simulated costs at the problem's blocks.

    Forward: `cost_model`. Backward: splash_dense runs Splash's fused backward (one step a tile,
    every tile); dense, b1, b2 and b3 our fused backward over their transposed schedules
    (`backward_step_kinds`), idle steps priced at the forward's idle step (the backward's is not
    probed). Returns {method: {"forward", "backward", "total"}} and, where splash_dense is among the
    methods, {"ratios": {method: {"forward", "backward", "total"}}} against it. Simulated cycles: a
    model of the chip, not a measurement (`svg_lib.instruments.tpu.probes` says what the probes leave out)."""
    mask, fields = resolve_problem(problem, needs=("block_q", "block_kv"), block_q=block_q, block_kv=block_kv,
                                   heads=heads)
    blocks = (fields["block_q"], fields["block_kv"])
    for name, c in (("forward", forward), ("backward", backward)):
        if (c.block_q, c.block_kv) != blocks:
            raise ValueError(f"the {name}'s costs are at {c.block_q} x {c.block_kv} tiles, the problem's blocks are "
                             f"{blocks[0]} x {blocks[1]}: measure them there")
    heads = fields["heads"] or 1
    plans = MethodPlans.of(mask, *blocks)
    fwd = cost_model(mask, forward, block_q=blocks[0], block_kv=blocks[1], heads=heads, methods=methods,
                     pass_rate=pass_rate)
    idle = forward.per_step["svg_lib"]["idle"]
    out = {}
    for m in methods:
        kernel = f"{METHODS[m].family}_fused"
        per_step = {**backward.per_step[kernel], "idle": idle}
        missing = [k for k in backward_step_kinds(m, plans) if k not in per_step]
        if missing:
            raise ValueError(f"the backward costs lack {missing} for {kernel}: measure them "
                             f"(backward_tile_cost(..., kinds=('free', 'svg_masked')))")
        bwd = heads * sum(n * per_step[k] for k, n in backward_step_kinds(m, plans).items())
        out[m] = {"forward": fwd[m], "backward": bwd, "total": fwd[m] + bwd}
    if BASELINE in out:
        b0 = out[BASELINE]
        out["ratios"] = {m: {part: out[m][part] / b0[part] for part in b0} for m in methods}
    return out


BACKWARD_REFERENCE_FILE = REFERENCE_FILE.parent / "backward_cost_reference.json"


def load_backward_reference(path: Path = BACKWARD_REFERENCE_FILE) -> dict:
    """The committed backward costs: {(target, block_q, block_kv): BackwardCost}, and the file's
    "date", "versions", "note" and "command"."""
    data = json.loads(Path(path).read_text())
    data["costs"] = {(c["target"], c["block_q"], c["block_kv"]): BackwardCost(**c) for c in data["costs"]}
    return data


def save_backward_reference(costs, path: Path = BACKWARD_REFERENCE_FILE, note: str = "") -> Path:
    """Write `[BackwardCost, ...]` as the committed backward reference (`load_backward_reference`)."""
    import datetime

    data = {"evidence": EVIDENCE, "date": datetime.date.today().isoformat(), "versions": versions("backward"),
            "command": "python tools/backward-reference.py", "note": note,
            "costs": [{k: v for k, v in c.to_json().items() if k != "raw"} for c in costs]}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
