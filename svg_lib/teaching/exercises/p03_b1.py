"""Notebook 03's three your-code pieces, B1 written by the learner: the key/value index map that reads
the packed schedule (`check_b1_kv_map`), B1's masked step (`check_b1_step`) and the scalar-prefetch
grid spec the call is laid out by (`check_b1_grid_spec`), with svg_lib's B1 that runs them in place
of its own (`b1_learner_attention`), a dry run of the first two at any size (`b1_dry_run`), the
library's own pieces and the hints.

The references are the planner's tables (`plan_tiles`: `kv_index`, `step_class`) and
`reference_attention`.
"""
from __future__ import annotations

import functools

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import Mask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles, schedule_entry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.kernels.grid import Pieces, library_grid_spec
from svg_lib.kernels.reference import reference_attention
from svg_lib.extensions.tolerances import tolerance
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish
from svg_lib.teaching.exercises.plugged import (MASK_FREE, MASKED, OWN_SCRATCH, b1_step_piece, grid_spec_piece,
                                                kv_map_piece, path_words, plugged_attention)
from svg_lib.teaching.yourcode import Hints


# -- the library's pieces (what choose() falls back to) ---------------------------------------

def library_kv_map(h, i, s, schedule_ref, *, steps):
    """Block index `(head, key tile, 0)` of the key/value block grid step (h, i, s) fetches."""
    kv_tile, _ = schedule_entry(schedule_ref, i * steps + s)
    return h, kv_tile, 0


def library_b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    """B1's step: a visited step runs the masked tile body at its tiles' first tokens; an idle one nothing."""
    from jax.experimental import pallas as pl

    @pl.when(cls != EMPTY)
    def _():
        tile(keep, q_start=i * block_q, k_start=kv_tile * block_kv)


KV_MAP_SOLUTION = '''def kv_map(h, i, s, schedule_ref, *, steps):
    kv_tile, _ = schedule_entry(schedule_ref, i * steps + s)   # entry n = i * steps + s
    return h, kv_tile, 0'''

STEP_SOLUTION = '''def b1_step(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv):
    @pl.when(cls != EMPTY)                    # idle steps compute nothing
    def _():
        tile(keep, q_start=i * block_q, k_start=kv_tile * block_kv)'''


def kv_map_hints():
    return Hints("kv_map", (
        "Grid step (h, i, s) reads entry n = i * steps + s of the packed schedule: row i of the plan holds "
        "`steps` entries, one per step.",
        "schedule_entry(schedule_ref, n) decodes entry n into (key tile, class); the index map needs the key "
        "tile only. Do not shift or mask the word yourself.",
        "An index map returns one block index per dimension of the BlockSpec (None, block_kv, head_dim): the "
        "head h, the key tile, and 0. Idle steps need no special case: the planner wrote the resident tile "
        "into their entries, so the pipeline copies nothing for them.",
    ), KV_MAP_SOLUTION)


def step_hints():
    return Hints("b1_step", (
        "Only a step whose class is not EMPTY computes. `cls` is read from SMEM while the kernel runs, so "
        "the test goes in pl.when(...), not in a Python `if`.",
        "B1 masks every step it visits, FULL or PARTIAL: call tile(keep, ...) with the predicate you were "
        "given, never tile(None, ...) (that is B2's mask-free path).",
        "keep(q_ids, k_ids) takes global token indices: the query tile starts at token i * block_q, the key "
        "tile this step holds at kv_tile * block_kv (not s * block_kv: s counts steps, not key tiles).",
    ), STEP_SOLUTION)


GRID_SPEC_SOLUTION = '''def b1_grid_spec(tables, *, heads, query_tiles, steps, block_q, block_kv, head_dim, kv_map,
                 out_specs, more_in_specs, more_scratch):
    def q_map(h, i, s, *table_refs):              # query tile i, the same block all its steps
        return h, i, 0

    return pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),          # head_kind and the schedule, into SMEM
        grid=(heads, query_tiles, steps),         # steps last: they carry the softmax state
        in_specs=[pl.BlockSpec((None, block_q, head_dim), q_map),
                  pl.BlockSpec((None, block_kv, head_dim), kv_map),
                  pl.BlockSpec((None, block_kv, head_dim), kv_map), *more_in_specs],
        out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((block_q, 128), jnp.float32),        # m
                        pltpu.VMEM((block_q, 128), jnp.float32),        # l
                        pltpu.VMEM((block_q, head_dim), jnp.float32),   # acc
                        *more_scratch])'''


def grid_spec_hints():
    return Hints("b1_grid_spec", (
        "num_scalar_prefetch counts the call's leading arguments that go to SMEM: all the tables you are "
        "given (len(tables)), not the schedule alone. The grid is (heads, query_tiles, steps): one step per "
        "schedule entry, steps last, so a query tile's state stays in scratch while its steps run.",
        "Every block is one head's: (None, rows, head_dim), the None squeezing the head axis away. q takes "
        "block_q rows, k and v block_kv rows. An index map gets (h, i, s, *table_refs) and returns three "
        "block indices: q's is (h, i, 0), whatever s; k and v take the kv_map you are given.",
        "in_specs: q, k, v, then more_in_specs; out_specs as given. scratch_shapes: m and l as "
        "pltpu.VMEM((block_q, 128), jnp.float32) (one number per query row, across a vector register's 128 "
        "lanes), acc as pltpu.VMEM((block_q, head_dim), jnp.float32), then more_scratch.",
    ), GRID_SPEC_SOLUTION)


# -- the kernel the pieces make ------------------------------------------------------------

def b1_learner_attention(q, k, v, mask: Mask, *, kv_map=library_kv_map, step=library_b1_step, grid_spec=None,
                         block_q: int = 128, block_kv: int = 128, interpret=True, record: bool = False):
    """svg_lib's B1 (`forward.block_sparse_attention`, built by `grid.tile_step_call`) with its
    key/value index map and its step replaced by `kv_map` and `step`, and its grid spec by
    `grid_spec` (None: the library's, `grid.library_grid_spec`) (`plugged`).

    q, k, v `[heads, tokens, head_dim]` (unscaled; scaled by 1/sqrt(head_dim) here). `kv_map(h, i, s,
    schedule_ref, *, steps)` is the key and value BlockSpecs' index map; `step(i, s, kv_tile, cls, tile,
    keep, *, block_q, block_kv)` runs at every grid step between the library's init (s == 0) and finish
    (last step), with `tile(keep, q_start, k_start)` the library's tile body (the running max; `keep=None`
    mask-free) over the resident blocks. Returns the output `[heads, tokens, head_dim]`, and with
    `record` also `(out, paths, q_starts, k_starts, plan)`: per grid step `[heads, nq, steps]` int32, the
    bodies run (MASK_FREE per mask-free run plus MASKED per masked run) and the offsets the last run was
    given (-1: none).
    """
    plan = plan_tiles(mask, block_q, block_kv)
    keep = mask.kernel_predicate(block_q, block_kv)
    pieces = Pieces(kv_map=kv_map_piece(kv_map, steps=plan.kv_index.shape[1]),
                    step=b1_step_piece(step, keep, block_q=block_q, block_kv=block_kv),
                    grid_spec=None if grid_spec is None else grid_spec_piece(grid_spec))
    outs = plugged_attention(q, k, v, plan, stage="b1", keep=keep, pieces=pieces, record=record, interpret=interpret)
    return (*outs, plan) if record else outs


def b1_dry_run(plan, *, kv_map=library_kv_map, step=library_b1_step):
    """The two pieces over `plan` (any size: the case study's too) in a kernel that copies blocks but
    computes nothing: key block j of a dummy array holds the number j, the kernel reads which tile the
    pipeline made resident at each step, and `tile` records what ran. Returns `(resident, paths)`,
    both `[nq, steps]` int: the key tile in VMEM at each grid step, and the bodies the step ran
    (MASK_FREE / MASKED per run). One head; 8 x 128 float32 blocks; interpret mode."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    nq, steps = plan.kv_index.shape
    nk = plan.grid[1]
    keys = jnp.repeat(jnp.arange(nk, dtype=jnp.float32), 8)[None, :, None] * jnp.ones((1, 1, 128))

    def kernel(schedule_ref, k_ref, resident_ref, paths_ref):
        i, s = pl.program_id(1), pl.program_id(2)
        kv_tile, cls = schedule_entry(schedule_ref, i * steps + s)
        resident_ref[i, s] = k_ref[0, 0].astype(jnp.int32)
        paths_ref[i, s] = 0

        def tile(keep, q_start, k_start):
            paths_ref[i, s] += MASK_FREE if keep is None else MASKED

        step(i, s, kv_tile, cls, tile, plan.mask.kernel_predicate(plan.block_q, plan.block_kv),
             block_q=plan.block_q, block_kv=plan.block_kv)

    whole = pl.BlockSpec((None, nq, steps), lambda h, i, s, schedule_ref: (h, 0, 0))
    resident, paths = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1, nq, steps),
            in_specs=[pl.BlockSpec((None, 8, 128), functools.partial(kv_map, steps=steps))],
            out_specs=[whole, whole]),
        out_shape=[jax.ShapeDtypeStruct((1, nq, steps), jnp.int32)] * 2,
        interpret=True, name="b1_dry_run")(jnp.asarray(plan.schedule, jnp.int32), keys)
    return np.asarray(resident)[0], np.asarray(paths)[0]


def copies(resident) -> int:
    """Key-tile copies a grid makes for one head: the first step, then each step whose tile changes."""
    order = np.asarray(resident).ravel()
    return 1 + int(np.count_nonzero(np.diff(order)))


# -- the checkers ------------------------------------------------------------------------------

_TRACED_HINTS = {
    "TracerBool": ("`cls` is read from SMEM while the kernel runs, so a Python `if` cannot see its value when "
                   "the kernel is traced: put the test in pl.when(condition)"),
    "Concretization": ("a value read from SMEM is known only when the kernel runs: compare it inside "
                       "pl.when(...) instead of converting it to a Python value"),
}


_KV_MAP_HINTS = {**_TRACED_HINTS,
                 "TracerBool": ("an index map tests nothing: return the key tile the entry names, idle steps "
                                "included (a Python `if` cannot see a value read from SMEM)")}


_STEP_HINTS = {**_TRACED_HINTS,
               "not callable": ("tile takes the predicate itself, keep, and builds the indices from q_start and "
                                "k_start: tile(keep, q_start, k_start), not keep(...)'s values")}


def _cases(rng):
    """Small SVG problems: padding in both axes, idle steps, visited tiles that are not tile s (the sink),
    two heads, block_q != block_kv (an offset computed with the wrong block size shows), and a head_dim
    other than 128 (acc's shape then differs from m's and l's, so the scratch's order shows)."""
    specs = [("4 frames of 8 x 15 tokens (480 tokens), 2 heads, 128 x 128 tiles, density 0.2 with the sink: "
              "key padding, idle steps, and rows that jump from the sink to the band", VideoGeometry(4, 8, 15), 0.2,
              128, 128),
             ("6 frames of 8 x 16 tokens (768 tokens), 2 heads of dimension 64, 256 x 128 tiles, density 0.3 "
              "with the sink", VideoGeometry(6, 8, 16), 0.3, 256, 128, 64)]
    return [_Case(name, dict(geometry=g, density=d, block_q=bq, block_kv=bkv, head_dim=rest[0] if rest else 128,
                             seed=int(rng.integers(2**31))))
            for name, g, d, bq, bkv, *rest in specs]


def _learner_run(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, where a NotImplementedError that is not the stub's (JAX raises one for a
    primitive a backend lacks) reads as an error, not as "still the stub"."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        if "your code here" in str(exc):
            raise
        raise RuntimeError(f"NotImplementedError: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''} "
                           "(use the arguments you are given; pl.program_id cannot run inside pl.when here)") from None


def _qkv(case, heads=2):
    import jax
    import jax.numpy as jnp
    keys = jax.random.split(jax.random.key(case.data["seed"]), 3)
    shape = (heads, case.data["geometry"].tokens, case.data["head_dim"])
    return tuple(jax.random.normal(key, shape, jnp.float32) for key in keys)


def _mask(case):
    return SVGMask.spatial(case.data["geometry"], case.data["density"])


def _compare_output(out, q, k, v, mask, hint):
    want = np.asarray(reference_attention(q, k, v, mask))
    got = np.asarray(out)
    if not np.allclose(got, want, **tolerance("float32")):
        err = float(np.nanmax(np.abs(got - want)))
        raise _Fail(f"the output differs from reference attention under the mask (max error {err:.2g})", hint)


def _map_table(kv_map, plan, heads):
    """Every grid step's block index from `kv_map`, evaluated as Pallas does: traced int32 grid indices."""
    import jax
    import jax.numpy as jnp
    nq, steps = plan.kv_index.shape
    h, i, s = (jnp.asarray(a.ravel(), jnp.int32) for a in np.indices((heads, nq, steps)))
    schedule = jnp.asarray(plan.schedule, jnp.int32)
    result = jax.jit(jax.vmap(lambda h, i, s: tuple(kv_map(h, i, s, schedule, steps=steps))))(h, i, s)
    if len(result) != 3:
        raise _Fail(f"your kv_map returned {len(result)} block indices, expected 3",
                    "the BlockSpec is (None, block_kv, head_dim): return three block indices, (head, key tile, 0)")
    if any(isinstance(r, (tuple, list)) for r in result):
        n = next(n for n, r in enumerate(result) if isinstance(r, (tuple, list)))
        raise _Fail(f"your kv_map's block index {n} is a pair, not one number",
                    "schedule_entry returns (key tile, class): unpack it, tile, cls = schedule_entry(schedule_ref, n), "
                    "and return the tile")
    return [np.broadcast_to(np.asarray(r), (heads * nq * steps,)).reshape(heads, nq, steps) for r in result]


def check_b1_kv_map(fn, *, seed: int = 0) -> CheckResult:
    """`fn(h, i, s, schedule_ref, *, steps)`, the key/value index map of B1 over the packed schedule.

    On each hidden case: the block index it returns at every grid step (evaluated on traced grid
    indices, as Pallas traces an index map) against (h, the plan's kv_index[i, s], 0), idle steps
    included (they name the row's first tile; another would start a copy nobody uses); then the
    B1 kernel with `fn` as its key/value index map, against reference attention."""
    rng = np.random.default_rng(seed)

    def run(case):
        mask, bq, bkv = _mask(case), case.data["block_q"], case.data["block_kv"]
        plan = plan_tiles(mask, bq, bkv)
        heads = 2
        hs, tiles, third = _call(_learner_run, "your kv_map", _map_table, fn, plan, heads, hints=_KV_MAP_HINTS)
        nq, steps = plan.kv_index.shape
        want = np.broadcast_to(plan.kv_index, (heads, nq, steps))
        grid = np.indices((heads, nq, steps))
        if (hs != grid[0]).any():
            h, i, s = (int(x) for x in np.argwhere(hs != grid[0])[0])
            raise _Fail(f"at grid step (h={h}, i={i}, s={s}) your first block index is {int(hs[h, i, s])}, "
                        f"expected the head, {h}", "the first block index picks the head: return h unchanged")
        if (third != 0).any():
            raise _Fail(f"your last block index is {int(third[third != 0][0])}, expected 0",
                        "the block spans all of head_dim, so the last block index is always 0")
        idle_steps = np.broadcast_to(plan.step_class == EMPTY, want.shape)
        bad = tiles != want
        wrong_visited, wrong_idle = np.argwhere(bad & ~idle_steps), np.argwhere(bad & idle_steps)
        wrong = wrong_visited if wrong_visited.size else wrong_idle   # visited steps first: they say more
        if wrong.size:
            h, i, s = (int(x) for x in wrong[0])
            got, j = int(tiles[h, i, s]), int(want[h, i, s])
            idle = bool(idle_steps[h, i, s])
            detail = (f"grid step (h={h}, i={i}, s={s}), {'an idle step' if idle else 'a visited step'}: expected key "
                      f"tile {j}, your kv_map returned {got}")
            entries = (plan.kv_index.astype(np.int64) << 2) | plan.step_class
            packed = tiles == np.broadcast_to(entries, tiles.shape)   # small tiles match an entry by chance
            if packed[h, i, s] and packed[~idle_steps].all():
                hint = ("that is the packed entry itself (key tile << 2 | class): decode it with "
                        "schedule_entry(schedule_ref, n), which returns (key tile, class)")
            elif idle:
                hint = ("every visited step is right; an idle step must fetch the tile its entry names (the row's "
                        "first, copied early so its visit needs no copy): a different tile starts a copy nobody uses")
            elif (tiles == np.broadcast_to(plan.step_class, tiles.shape))[~idle_steps].all():  # whole tables first
                hint = ("that is the step's class (EMPTY 0, PARTIAL 1, FULL 2), not its key tile: "
                        "schedule_entry(schedule_ref, n) returns (key tile, class), in that order")
            elif (tiles == want * bkv)[~idle_steps].all():
                hint = (f"a block index counts blocks, not elements: return the key tile itself, not key tile * "
                        f"block_kv ({bkv})")
            elif got == s:
                hint = ("s counts the row's steps, not key tiles: the key tile comes from the schedule, "
                        "entry i * steps + s")
            elif got >= plan.grid[1] or got < 0:
                hint = (f"key tile {got} does not exist (a row has {plan.grid[1]} key tiles): decode the entry with "
                        "schedule_entry(schedule_ref, n), which reads its half of an int32 word (two 16-bit "
                        "entries to a word)")
            else:
                hint = "grid step (h, i, s) reads entry n = i * steps + s: row i of the schedule holds `steps` entries"
            raise _Fail(detail, hint)
        q, k, v = _qkv(case, heads)
        out = _call(_learner_run, "the B1 kernel with your kv_map", b1_learner_attention, q, k, v, mask, kv_map=fn,
                    block_q=bq, block_kv=bkv)
        _compare_output(out, q, k, v, mask, "the block indices matched the plan's: check that kv_map has no side "
                        "effects and returns the same values inside the kernel")

    return _finish("03 kv_map", _cases(rng), run,
                   "every grid step fetches the plan's key tile, idle steps included, and B1 with your map "
                   "matches reference attention")


def check_b1_step(fn, *, seed: int = 0) -> CheckResult:
    """`fn(i, s, kv_tile, cls, tile, keep, *, block_q, block_kv)`, one grid step of B1.

    Runs B1 (the library's kv_map, `fn` as its step) in interpret mode on each hidden case and checks,
    for every grid step, which tile body ran (visited steps: the masked body once; idle steps:
    nothing), the token offsets it was given (i * block_q and kv_tile * block_kv), then the output
    against reference attention."""
    rng = np.random.default_rng(seed)

    def run(case):
        mask, bq, bkv = _mask(case), case.data["block_q"], case.data["block_kv"]
        q, k, v = _qkv(case)
        out, paths, q_starts, k_starts, plan = _call(
            _learner_run, "your b1_step (inside the kernel)", b1_learner_attention, q, k, v, mask, step=fn,
            block_q=bq, block_kv=bkv, record=True, hints=_STEP_HINTS)
        visited = plan.step_class != EMPTY
        expected = np.where(visited, MASKED, 0)
        for h in range(paths.shape[0]):
            wrong = np.argwhere(paths[h] != expected)
            if wrong.size:
                i, s = (int(x) for x in wrong[0])
                cls, got = int(plan.step_class[i, s]), int(paths[h, i, s])
                what = {FULL: "a FULL tile", PARTIAL: "a PARTIAL (edge) tile", EMPTY: "an idle step (class EMPTY)"}[cls]
                detail = (f"grid step (h={h}, i={i}, s={s}) is {what}: expected {path_words(int(expected[i, s]))}, "
                          f"your step ran {path_words(got)}")
                if cls == EMPTY:
                    hint = ("an idle step must leave the state alone: its key tile was folded in at the step before, "
                            "so running the body adds that tile's keys a second time")
                elif got % MASKED and cls == FULL and not (paths[h][plan.step_class == PARTIAL] % MASKED).any():
                    hint = ("B1 masks every visited tile, FULL ones too: the mask-free path for FULL tiles is B2, "
                            "notebook 04's piece")
                elif got % MASKED:
                    hint = "B1's tile body always takes the mask: pass `keep`, not None"
                elif got > MASKED:
                    hint = "a visited step runs the tile body exactly once"
                else:
                    hint = "every visited step (class FULL or PARTIAL) runs the masked body once"
                raise _Fail(detail, hint)
            for name, got_starts, want, block in (
                    ("q_start", q_starts[h], np.arange(plan.grid[0])[:, None] * bq, "i * block_q"),
                    ("k_start", k_starts[h], plan.kv_index * bkv, "kv_tile * block_kv")):
                wrong = np.argwhere(visited & (got_starts != want))
                if wrong.size:
                    i, s = (int(x) for x in wrong[0])
                    want_is = int(np.broadcast_to(want, visited.shape)[i, s])
                    detail = (f"grid step (h={h}, i={i}, s={s}), key tile {int(plan.kv_index[i, s])}: {name} should be "
                              f"{want_is}, your step gave {int(got_starts[i, s])}")
                    hint = (f"keep takes global token indices: {name} is the first token of the tile, {block}"
                            + (" (s counts steps, not key tiles)" if name == "k_start" else "")
                            + ("; block_q and block_kv differ here" if bq != bkv else ""))
                    raise _Fail(detail, hint)
        _compare_output(out, q, k, v, mask, "pass the `keep` you were given to the tile body, unchanged")

    return _finish("03 b1_step", _cases(rng), run,
                   "every visited step ran the masked body once at the right token offsets, idle steps nothing, "
                   "and the outputs match reference attention")


class _SpecsBuilt(Exception):
    """Stops the library's B1 once both grid specs are built: inspecting them needs nothing to run."""


def _built_specs(fn, q, k, v, mask, bq, bkv):
    """`(yours, library's, grid indices' table values)`: the spec `fn` returns and the library's, both
    given what the library's B1 builder hands its grid spec over this problem (no kernel runs)."""
    plan = plan_tiles(mask, bq, bkv)
    built = {}

    def capture(schedule, sizes, **given):
        built["yours"] = _call(_learner_run, "your b1_grid_spec", grid_spec_piece(fn), schedule, sizes, **given)
        built["library"] = library_grid_spec(schedule, sizes, **given)
        built["tables"] = schedule.tables
        raise _SpecsBuilt

    try:
        plugged_attention(q, k, v, plan, stage="b1", keep=mask.kernel_predicate(bq, bkv),
                          pieces=Pieces(grid_spec=capture))
    except _SpecsBuilt:
        pass
    return built["yours"], built["library"], built["tables"]


def _block_indices(index_map, grid, tables, what):
    """The block index `index_map` returns at every grid step `[n_dims, *grid]`, on traced int32 grid
    indices and the tables' values, as Pallas evaluates an index map."""
    import jax
    import jax.numpy as jnp
    idx = [jnp.asarray(a.ravel(), jnp.int32) for a in np.indices(grid)]
    try:
        result = jax.jit(jax.vmap(lambda *g: tuple(index_map(*g, *tables))))(*idx)
    except Exception as exc:  # the learner's index map
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise _Fail(f"{what}'s index map raised {type(exc).__name__}: {first}",
                    "an index map gets the grid indices (h, i, s) and then every table's ref: "
                    "def q_map(h, i, s, *table_refs)") from None
    if len(result) != 3:
        raise _Fail(f"{what}'s index map returned {len(result)} block indices, expected 3",
                    "the block is (None, rows, head_dim): one block index per axis, (head, tile, 0)")
    return np.stack([np.broadcast_to(np.asarray(r), (idx[0].size,)).reshape(grid) for r in result])


def _shape(block_shape):
    """A block shape with the squeezed axis as None, whatever the jax version calls it."""
    if block_shape is None:
        return None
    return tuple(None if b is None or "squeezed" in type(b).__name__.lower() else int(b) for b in block_shape)


def _scratch_words(ref) -> str:
    return f"{str(ref.memory_space).upper()} {tuple(ref.shape)} {np.dtype(ref.dtype).name}"


_SCRATCH_HINTS = {
    "m": "m holds one float32 per query row (the running max), across a vector register's 128 lanes: "
         "pltpu.VMEM((block_q, 128), jnp.float32)",
    "l": "l holds one float32 per query row (the running sum), across a vector register's 128 lanes: "
         "pltpu.VMEM((block_q, 128), jnp.float32)",
    "acc": "acc holds the query tile's unnormalised output, float32 whatever the inputs' dtype: "
           "pltpu.VMEM((block_q, head_dim), jnp.float32)",
}


def _check_spec(yours, library, tables, *, bq, bkv):
    """Name the first way `yours` differs from the library's spec (the grid spec's common mistakes)."""
    from jax.experimental.pallas import tpu as pltpu

    if not isinstance(yours, pltpu.PrefetchScalarGridSpec):
        raise _Fail(f"your b1_grid_spec returned {type(yours).__name__}, not a PrefetchScalarGridSpec",
                    "return pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=..., grid=..., in_specs=[...], "
                    "out_specs=out_specs, scratch_shapes=[...])")
    if yours.num_scalar_prefetch != library.num_scalar_prefetch:
        raise _Fail(f"num_scalar_prefetch is {yours.num_scalar_prefetch}, expected {library.num_scalar_prefetch}",
                    f"the call's first {library.num_scalar_prefetch} arguments are tables (head_kind, then the packed "
                    "schedule), and all go to SMEM: num_scalar_prefetch=len(tables)")
    grid, want = tuple(yours.grid), tuple(library.grid)
    if grid != want:
        heads, nq, steps = want
        if len(grid) == 3 and sorted(grid) == sorted(want):
            hint = ("the axes are swapped: (heads, query_tiles, steps), steps last, so that each query tile's steps "
                    "run one after the other while its softmax state stays in scratch")
        elif len(grid) < 3:
            hint = ("an axis is missing: one grid step per schedule entry, (heads, query_tiles, steps); the index "
                    "maps get (h, i, s)")
        else:
            hint = "the grid is (heads, query_tiles, steps): the sizes you are given, in that order"
        raise _Fail(f"the grid is {grid}, expected {want} (heads {heads}, query tiles {nq}, steps {steps})", hint)
    if len(yours.in_specs) != len(library.in_specs):
        raise _Fail(f"in_specs has {len(yours.in_specs)} entries, expected {len(library.in_specs)}",
                    "in_specs: the q, k and v blocks, then more_in_specs (what the library's kernel reads besides)")
    rows = {"q": bq, "k": bkv, "v": bkv}
    for name, got, lib in zip("qkv", yours.in_specs, library.in_specs):
        got_shape, lib_shape = _shape(got.block_shape), _shape(lib.block_shape)
        if got_shape != lib_shape:
            if got_shape is not None and len(got_shape) == 2:
                hint = ("a leading None squeezes the head axis away: (None, rows, head_dim), and the kernel gets "
                        "one head's [rows, head_dim] block")
            elif (got_shape is not None and len(got_shape) == 3 and got_shape[1] in (bq, bkv)
                  and got_shape[1] != rows[name]):
                hint = (f"{name} blocks are {'block_q' if name == 'q' else 'block_kv'} rows: block_q and block_kv "
                        "differ here")
            else:
                hint = "every block is one head's: (None, rows, head_dim)"
            raise _Fail(f"the {name} block shape is {got_shape}, expected {lib_shape}", hint)
    grid_idx = np.indices(want)
    expect = {name: _block_indices(lib.index_map, want, tables, f"the library's {name}")
              for name, lib in zip("qkv", library.in_specs)}
    by_query_tile = np.stack([grid_idx[0], grid_idx[1], 0 * grid_idx[0]])
    by_step = np.stack([grid_idx[0], grid_idx[2], 0 * grid_idx[0]])
    for name, got in zip("qkv", yours.in_specs):
        blocks = _block_indices(got.index_map, want, tables, f"your {name} block")
        if np.array_equal(blocks, expect[name]):
            continue
        h, i, s = (int(x) for x in np.argwhere((blocks != expect[name]).any(axis=0))[0])
        detail = (f"grid step (h={h}, i={i}, s={s}): your {name} block is {tuple(int(b) for b in blocks[:, h, i, s])}, "
                  f"expected {tuple(int(b) for b in expect[name][:, h, i, s])}")
        if name == "q" and np.array_equal(blocks, expect["k"]):
            hint = ("the q block follows the key tile: the query block is the grid's query tile i on every step, "
                    "q_map(h, i, s, *table_refs) -> (h, i, 0); kv_map is for k and v")
        elif name == "q":
            hint = "the query block of grid step (h, i, s) is its head's query tile i, whatever s: (h, i, 0)"
        elif np.array_equal(blocks, by_query_tile):
            hint = (f"the {name} block follows the query tile, not the schedule: k and v take the kv_map you are "
                    "given, which reads the step's key tile from the schedule")
        elif np.array_equal(blocks, by_step):
            hint = (f"the {name} block walks the key tiles like a dense grid (s counts steps, not key tiles): use the "
                    "kv_map you are given")
        else:
            hint = f"the {name} block follows the schedule: use the kv_map you are given as its index map"
        raise _Fail(detail, hint)
    for n, (got, lib) in enumerate(zip(yours.in_specs[3:], library.in_specs[3:])):
        if got is not lib:
            raise _Fail(f"in_specs[{3 + n}] is not the spec handed over in more_in_specs",
                        "after q, k and v, pass more_in_specs unchanged: *more_in_specs")
    outs, lib_outs = yours.out_specs, library.out_specs
    if (not isinstance(outs, (list, tuple)) or len(outs) != len(lib_outs)
            or any(a is not b for a, b in zip(outs, lib_outs))):
        held = (f"{len(outs)} spec(s) of its own" if isinstance(outs, (list, tuple)) else f"a {type(outs).__name__}")
        raise _Fail(f"your out_specs is {held}, not the list of {len(lib_outs)} output spec(s) handed over",
                    "the library's kernel brings its output blocks: out_specs=out_specs, unchanged")
    scratch, lib_scratch = list(yours.scratch_shapes), list(library.scratch_shapes)
    own = len(OWN_SCRATCH)
    if len(scratch) != len(lib_scratch):
        raise _Fail(f"scratch_shapes has {len(scratch)} entries, expected {len(lib_scratch)}: "
                    f"{', '.join(OWN_SCRATCH)}, then the {len(lib_scratch) - own} of more_scratch",
                    "scratch_shapes=[m, l, acc, *more_scratch]: the softmax state yours, the rest the library's")
    for n, (got, lib) in enumerate(zip(scratch, lib_scratch)):
        name = OWN_SCRATCH[n] if n < own else f"more_scratch[{n - own}]"
        if not hasattr(got, "memory_space"):  # e.g. jax.ShapeDtypeStruct: a shape with no place to live
            raise _Fail(f"scratch {name} is a {type(got).__name__}, which says no memory space",
                        "a scratch buffer is declared where it lives: pltpu.VMEM(shape, dtype) "
                        "(jax.ShapeDtypeStruct describes a call's output, not scratch)")
        same = (tuple(got.shape) == tuple(lib.shape) and np.dtype(got.dtype) == np.dtype(lib.dtype)
                and str(got.memory_space) == str(lib.memory_space)) if hasattr(got, "shape") else False
        if not same:
            got_words = _scratch_words(got) if hasattr(got, "shape") else type(got).__name__
            hint = _SCRATCH_HINTS.get(name, "after m, l and acc, pass more_scratch unchanged: *more_scratch")
            sig = lambda x: (tuple(x.shape), str(x.dtype), str(x.memory_space))  # noqa: E731
            if n < own and sig(got) in map(sig, lib_scratch[own:]) and sig(got) not in map(sig, lib_scratch[:own]):
                hint = "the softmax state comes first: [m, l, acc, *more_scratch], the order the kernel reads it in"
            elif hasattr(got, "dtype") and np.dtype(got.dtype) != np.dtype(lib.dtype) and n < own:
                hint = f"{name} accumulates over many key tiles: float32. " + hint
            elif n < own and str(got.memory_space) != str(lib.memory_space):
                hint = f"{name} lives in VMEM, beside the vector units that update it, not in SMEM: " + hint
            elif n < own and tuple(got.shape) in [tuple(x.shape) for x in lib_scratch[:own]]:
                hint = ("the state's order is m, l, acc, the order the kernel reads its scratch in. " + hint)
            raise _Fail(f"scratch {name} is {got_words}, expected {_scratch_words(lib)}", hint)


def check_b1_grid_spec(fn, *, seed: int = 0) -> CheckResult:
    """`fn(tables, *, heads, query_tiles, steps, block_q, block_kv, head_dim, kv_map, out_specs,
    more_in_specs, more_scratch)` -> B1's `PrefetchScalarGridSpec`.

    On each hidden case: the spec `fn` returns, given what the library's B1 builder hands over, against
    the library's (`grid.library_grid_spec`): the tables prefetched, the grid, each block's shape and its
    index map at every grid step, the output blocks, the scratch; then svg_lib's B1 laid out by `fn`
    (`Pieces.grid_spec`) against svg_lib's own B1."""
    rng = np.random.default_rng(seed)

    def run(case):
        mask, bq, bkv = _mask(case), case.data["block_q"], case.data["block_kv"]
        q, k, v = _qkv(case)
        yours, library, tables = _built_specs(fn, q, k, v, mask, bq, bkv)
        _check_spec(yours, library, tables, bq=bq, bkv=bkv)
        out = _call(_learner_run, "svg_lib's B1 laid out by your grid spec", b1_learner_attention, q, k, v, mask,
                    grid_spec=fn, block_q=bq, block_kv=bkv)
        want = b1_learner_attention(q, k, v, mask, block_q=bq, block_kv=bkv)
        if not np.allclose(np.asarray(out), np.asarray(want), **tolerance("float32")):
            err = float(np.nanmax(np.abs(np.asarray(out) - np.asarray(want))))
            raise _Fail(f"svg_lib's B1 laid out by your spec differs from its own (max error {err:.2g})",
                        "every part of the spec matched the library's: check that b1_grid_spec builds a fresh spec "
                        "from its arguments each call")

    return _finish("03 b1_grid_spec", _cases(rng), run,
                   "the tables, the grid, the q, k and v blocks and their index maps, the outputs and the scratch "
                   "match the library's, and svg_lib's B1 laid out by your spec gives its output")
