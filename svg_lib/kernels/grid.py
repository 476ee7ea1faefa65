"""The tile step of the forward kernels: which key tile a grid step visits, and which body runs it.

A forward kernel (dense, B1, B2, B3; the routed layer's kinds of head; the observed forward) walks a
grid `(heads, query tiles, steps)`; dense's steps are every key tile in order (`DenseSchedule`, no tables). At every step it does the same four things, whatever its tile
body computes:

    read      the step's entry of the scalar-prefetched schedule: (key tile, class)   `Schedule.entry`
    fetch     that key tile (the index maps read the same entry)                      `Schedule.kv_map`
    pick      the body the class asks for: mask-free, masked by the head's kind, none `dispatch`
    run       it, after the query tile's first step has set up and before its last finishes

This module owns those four; a kernel brings the rest (`tile_step_call`): the tile body, what a query
tile starts and finishes with, its outputs and scratch, and optional `Hooks` that ride along every
step (the observed forward's tile masses). `Pieces` replaces any of fetch, pick, the tile body and
the grid spec that lays the call out (`library_grid_spec`) with other code of the same contract
(the notebooks plug the learner's in); left at None, each is the library's own and the kernel
traces exactly as without it. The backward's kernels walk the same objects (dq the forward's schedule,
dk/dv and fused the transposed one, `KeyMajor`), laid out by the same `library_grid_spec`, and pick
their bodies by the same `dispatch`.

The sizes of a tile travel as one value, `TileSizes`: `[block_q, head_dim]` query blocks,
`[block_kv, head_dim]` key and value blocks, and the `[block_q, block_kv_compute]` score slices a
tile body folds in at a time.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib.core.planner import EMPTY, FULL, PARTIAL, schedule_entry
from svg_lib.kernels.refs import KernelRefs
from svg_lib.methods import Method


@dataclasses.dataclass(frozen=True)
class TileSizes:
    """One tile's sizes: `block_q` query rows, `block_kv` key rows fetched per step, folded in
    slices of `block_kv_compute` keys (a `[block_q, block_kv_compute]` score block bounds VMEM)."""

    block_q: int
    block_kv: int
    block_kv_compute: int

    def __post_init__(self):
        for name in ("block_q", "block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.block_kv % self.block_kv_compute:
            raise ValueError(f"block_kv_compute ({self.block_kv_compute}) must divide block_kv ({self.block_kv})")

    @property
    def slices(self) -> int:
        """Key slices per tile: how often a tile body runs its loop."""
        return self.block_kv // self.block_kv_compute


@dataclasses.dataclass(frozen=True, eq=False)
class ScheduleRows:
    """A packed schedule: int32 `table` `[ceil(rows * steps / 2)]`, `rows` rows of `steps` 16-bit
    entries, each the tile a grid step visits and its class, two entries to a word
    (`planner.pack_schedule`). The forward's rows are query tiles (one block of them per kind of
    head), the transposed schedule's key tiles."""

    table: object
    rows: int
    steps: int

    @classmethod
    def checked(cls, name: str, table, *, rows: int, steps: int):
        """`table` as `rows` x `steps` entries, its shape checked before anything is traced."""
        words = -(-rows * steps // 2)
        if tuple(table.shape) != (words,):
            raise ValueError(f"{name} must be int32 [{words}] for {rows} rows x {steps} steps "
                             f"(planner.pack_schedule), got {tuple(table.shape)}")
        return cls(table, rows, steps)

    def entry(self, table_ref, row, s):
        """(tile, class) of step `s` of row `row`, read from the table's SMEM ref: the kernels' one decoder."""
        return schedule_entry(table_ref, row * self.steps + s)


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """A block-sparse forward's (or backward's) scalar-prefetched tables and their decoder.

    `packed`: the `kinds * query_tiles` rows of the kinds' schedules, kind by kind
    (`extensions.stacked_schedules`; one kind for one mask). `head_kind` int32 `[heads]`: which kind head h
    follows (None, no table: one kind). `head_order`: None, or int32 `[heads]`, a permutation: grid row h
    runs head `head_order[h]`. All of them sit in SMEM, where the kernel and its index maps read them at every step.
    """

    head_kind: object
    packed: ScheduleRows
    query_tiles: int
    head_order: object = None

    @classmethod
    def checked(cls, q_shape, head_kind, table, *, steps: int, kinds: int, block_q: int, head_order=None):
        """The tables for q `[heads, tokens, head_dim]`, their shapes checked against the heads,
        `kinds`, the query tiles and `steps` before anything is traced."""
        heads, q_tokens, _ = q_shape
        nq = -(-q_tokens // block_q)
        words = -(-kinds * nq * steps // 2)
        if tuple(table.shape) != (words,) or tuple(head_kind.shape) != (heads,):
            raise ValueError(f"for {kinds} kind(s) x {nq} query tiles x {steps} steps and {heads} heads the "
                             f"schedule must be int32 [{words}] and head_kind int32 [{heads}] (planner.pack_schedule "
                             f"/ stack_schedules); got {tuple(table.shape)} and {tuple(head_kind.shape)}")
        if head_order is not None and tuple(head_order.shape) != (heads,):
            raise ValueError(f"head_order must be int32 [{heads}], a permutation of the heads; "
                             f"got {tuple(head_order.shape)}")
        return cls(head_kind, ScheduleRows(table, kinds * nq, steps), nq, head_order)

    @property
    def steps(self) -> int:
        """Grid steps per query tile."""
        return self.packed.steps

    @property
    def tables(self) -> tuple:
        """What `pallas_call` scalar-prefetches, in the order of `prefetch`."""
        return tuple(t for t in (self.head_kind, self.packed.table, self.head_order) if t is not None)

    @property
    def prefetch(self) -> tuple:
        """The tables' names for `KernelRefs` (head_kind_ref, head_order_ref arrive as None without one)."""
        return (("head_kind", self.head_kind is not None), "schedule", ("head_order", self.head_order is not None))

    @staticmethod
    def head(h, head_order_ref):
        """The head that grid row h runs: h, or head_order[h]."""
        return h if head_order_ref is None else head_order_ref[h]

    def entry(self, h, i, s, *, head_kind_ref, schedule_ref, head_order_ref):
        """(key tile, class) of grid step (h, i, s): entry (kind, i, s) of the table (one kind: row i)."""
        row = i if head_kind_ref is None else head_kind_ref[self.head(h, head_order_ref)] * self.query_tiles + i
        return self.packed.entry(schedule_ref, row, s)

    def q_map(self, h, i, s, **tables):
        """The query (and output) block of grid step (h, i, s): its head's query tile i."""
        return self.head(h, tables["head_order_ref"]), i, 0

    def kv_map(self, h, i, s, **tables):
        """The key and value block of grid step (h, i, s): the key tile its entry names."""
        return self.head(h, tables["head_order_ref"]), self.entry(h, i, s, **tables)[0], 0


def padding_class(kv_tile, block_kv: int, tokens: int):
    """The class of key tile `kv_tile` where every tile is visited: PARTIAL if it reaches past `tokens`
    (into key padding: it masks), else FULL."""
    return jnp.where((kv_tile + 1) * block_kv > tokens, PARTIAL, FULL)


@dataclasses.dataclass(frozen=True, eq=False)
class DenseSchedule:
    """`Schedule`'s contract for dense attention, read from the program ids with no tables: grid step
    (h, i, s) visits key tile s of `steps` (every one), of class `padding_class`. The compiler's static
    profile, which reads SMEM as zeros, then simulates each step as what it is."""

    query_tiles: int
    steps: int
    block_kv: int
    tokens: int
    head_order = None
    tables = ()
    prefetch = (("head_kind", False), ("schedule", False), ("head_order", False))  # absent: None
    head = staticmethod(Schedule.head)

    def entry(self, h, i, s, **tables):
        return s, padding_class(s, self.block_kv, self.tokens)

    def q_map(self, h, i, s, **tables):
        return h, i, 0

    def kv_map(self, h, i, s, **tables):
        return h, s, 0


class KeyMajor(Schedule):
    """A `Schedule` walked key-major, as the backward's dk/dv and fused kernels walk the transposed schedule
    (`TilePlan.transposed_tables`): grid `(heads, key tiles, steps)` (`query_tiles` counts its rows), row j's
    entries the query tiles that visit key tile j. The same reads, the index maps' roles traded: the query
    block (`q_map`) is the one the entry names, the key and value blocks (`kv_map`) the row's own."""

    q_map, kv_map = Schedule.kv_map, Schedule.q_map


class DenseKeyMajor(DenseSchedule):
    """`DenseSchedule` walked key-major (`KeyMajor`): step (h, j, s) visits query tile s of `steps` (every
    one), of key tile j's `padding_class` (`query_tiles` counts key tiles, `tokens` the keys)."""

    q_map, kv_map = DenseSchedule.kv_map, DenseSchedule.q_map

    def entry(self, h, j, s, **tables):
        return s, padding_class(j, self.block_kv, self.tokens)


@dataclasses.dataclass(frozen=True)
class Step:
    """Grid step (h, i, s) as a kernel sees it: `head` the head it runs, `kv_tile` and `cls` its
    schedule entry; `refs` every ref of the kernel by name (`q_ref`, `m_ref`, ...)."""

    h: object
    i: object
    s: object
    head: object
    kv_tile: object
    cls: object
    refs: dict


def dispatch(cls, free: Callable, masked: Callable, *, method: Method):
    """Run the body a step of class `cls` asks for, as `method`'s record says: `free()` on FULL tiles
    and `masked()` on PARTIAL ones, or, where it masks full tiles too (B1's cost), `masked()` on every
    tile that is not EMPTY. An EMPTY step runs nothing. Every branch is compiled, so a kernel holds
    one copy per body."""
    if method.masks_full_tiles:
        pl.when(cls != EMPTY)(masked)
    else:
        pl.when(cls == FULL)(free)
        pl.when(cls == PARTIAL)(masked)


@dataclasses.dataclass(frozen=True)
class Hooks:
    """Work that rides along a block-sparse kernel's steps without changing its result.

    `outputs`, `scratch`: `KernelRefs` entries of the extra refs, after the kernel's own; their
    `out_shapes(q_map)` -> `[(ShapeDtypeStruct, BlockSpec)]` (q_map: the query block's index map) and
    `scratch_shapes`. `body(body, step)` -> the tile body to run in place of the kernel's `body`
    (called once per step, inside the step's trace);
    `start(step)`, `finish(step)`: after the kernel's own start of a query tile and its own finish.
    `name`: what the kernel's name adds (its kernels are told apart in a profile).
    """

    name: str = ""
    outputs: tuple = ()
    scratch: tuple = ()
    out_shapes: Callable = lambda q_map: []
    scratch_shapes: tuple = ()
    body: Callable | None = None
    start: Callable | None = None
    finish: Callable | None = None


def library_step(step: Step, free: Callable, masked: Callable, *, method: Method, run: Callable):
    """What a step of class `step.cls` runs, by the library: `dispatch` (`run(keep)`, the tile with
    any predicate, is there for a replacement's use)."""
    dispatch(step.cls, free, masked, method=method)


def library_grid_spec(schedule: Schedule, sizes: TileSizes, *, q_shape, q_map, kv_map, extra_in_specs, out_specs,
                      scratch_shapes):
    """The tile step's `PrefetchScalarGridSpec`, by the library: the schedule's tables scalar-prefetched, grid
    `(heads, query tiles, steps)` (key tiles, `KeyMajor`), then the `[block_q, head_dim]` query block by `q_map`
    and the `[block_kv, head_dim]` key and value blocks by `kv_map` (the head squeezed away), the kernel's other
    inputs (`extra_in_specs`), its outputs' blocks and its scratch, as the builder hands them over."""
    heads, _, head_dim = q_shape
    return pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(schedule.tables),
        grid=(heads, schedule.query_tiles, schedule.steps),
        in_specs=[pl.BlockSpec((None, sizes.block_q, head_dim), q_map),
                  pl.BlockSpec((None, sizes.block_kv, head_dim), kv_map),
                  pl.BlockSpec((None, sizes.block_kv, head_dim), kv_map), *extra_in_specs],
        out_specs=out_specs,
        scratch_shapes=scratch_shapes)


@dataclasses.dataclass(frozen=True)
class Pieces:
    """The tile step's replaceable pieces; each None is the library's own.

    `kv_map(h, i, s, **tables)` -> `(head, key tile, 0)`: the key and value blocks' index map, with
    `Schedule.kv_map`'s contract (tables: `head_kind_ref`, `schedule_ref`, `head_order_ref`).
    `step(step, free, masked, *, method, run)`: what a grid step runs, `library_step`'s contract:
    `free()` the mask-free tile, `masked()` the tile under the head's kind's predicate, `run(keep)`
    the tile under any predicate (None: mask-free).
    `body`: a tile body with `forward.online_softmax_tile`'s contract, run in place of the kernel's
    own at every tile a step runs (a kernel given one runs it with the running max only, so that the
    body's own rescaling is what the output shows).
    `grid_spec(schedule, sizes, *, q_shape, q_map, kv_map, extra_in_specs, out_specs, scratch_shapes)`
    -> the call's `PrefetchScalarGridSpec`, `library_grid_spec`'s contract (`kv_map` is the piece's
    where there is one).
    """

    kv_map: Callable | None = None
    step: Callable | None = None
    body: Callable | None = None
    grid_spec: Callable | None = None


def tile_step_call(schedule: Schedule | DenseSchedule, sizes: TileSizes, *, q_shape, tile, start, finish, method: Method, keeps,
                   inputs, operands, extra_in_specs, outputs, out_shapes, scratch, scratch_shapes, hooks=None,
                   pieces=None, compiler_params, interpret, name):
    """A `pallas_call` over grid `(heads, query tiles, schedule.steps)` running the tile step.

    q_shape `(heads, tokens, head_dim)`. The inputs are q, k, v (`[heads, tokens, head_dim]`,
    blocks fetched by the schedule) then `extra_in_specs`' (named after them in `inputs`);
    `operands` all of them in that order. `outputs`: KernelRefs entries, their `out_shapes(q_map)`
    the `[(ShapeDtypeStruct, BlockSpec)]` of those present; `scratch` and `scratch_shapes` likewise.

    `method`: the record whose fields pick each step's body (`dispatch`). Per step: `tile(wrap, step)`
    -> `run(keep)`, where `wrap` is None (the kernel's own tile body) or maps that body to the one
    to run instead (`Hooks.body`), and `keep` None (a mask-free tile) or a predicate, one of `keeps`,
    one per kind of head; `start(step)` on a query tile's first step, `finish(step)` on its last.
    `pieces` (`Pieces`): the index map, the step, the tile body and the grid spec to use instead of the
    library's (`library_grid_spec` builds the call's).
    Returns the list of outputs.
    """
    hooks = Hooks() if hooks is None else hooks
    pieces = Pieces() if pieces is None else pieces
    run_step = library_step if pieces.step is None else pieces.step
    refs = KernelRefs(prefetch=schedule.prefetch, inputs=inputs, outputs=tuple(outputs) + tuple(hooks.outputs),
                      scratch=tuple(scratch) + tuple(hooks.scratch))

    def kernel(**named):
        h, i, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        tables = {n: named[n] for n in ("head_kind_ref", "schedule_ref", "head_order_ref")}
        head = schedule.head(h, tables["head_order_ref"])
        kv_tile, cls = schedule.entry(h, i, s, **tables)
        step = Step(h, i, s, head, kv_tile, cls, named)
        run = tile(_wrap(pieces.body, hooks.body, step), step)

        def masked_tile():  # the predicate of this head's kind (one kind unless routing)
            if len(keeps) == 1:
                return run(keeps[0])
            for kind, keep in enumerate(keeps):
                pl.when(named["head_kind_ref"][head] == kind)(lambda keep=keep: run(keep))

        @pl.when(s == 0)
        def _():
            start(step)
            if hooks.start is not None:
                hooks.start(step)

        run_step(step, lambda: run(None), masked_tile, method=method, run=run)

        @pl.when(s == schedule.steps - 1)
        def _():
            finish(step)
            if hooks.finish is not None:
                hooks.finish(step)

    q_map = refs.index_map(schedule.q_map)
    kv_map = refs.index_map(schedule.kv_map if pieces.kv_map is None else pieces.kv_map)
    shaped = list(out_shapes(q_map)) + list(hooks.out_shapes(q_map))
    make_spec = library_grid_spec if pieces.grid_spec is None else pieces.grid_spec
    outs = pl.pallas_call(
        refs.kernel(kernel),
        grid_spec=make_spec(schedule, sizes, q_shape=q_shape, q_map=q_map, kv_map=kv_map,
                            extra_in_specs=list(extra_in_specs), out_specs=[spec for _, spec in shaped],
                            scratch_shapes=list(scratch_shapes) + list(hooks.scratch_shapes)),
        out_shape=[shape for shape, _ in shaped],
        compiler_params=compiler_params,
        interpret=interpret,
        name=name,
    )(*schedule.tables, *operands)
    return list(outs)


def _wrap(piece, hook, step):
    """What `tile` gets as `wrap`: None (the kernel's own body), or the map from the kernel's body to
    the one to run: the piece in its place, then the hook's wrapper around whichever it is."""
    if piece is None and hook is None:
        return None

    def wrap(own):
        body = own if piece is None else piece
        return body if hook is None else hook(body, step)
    return wrap


def row_block(index_map, lanes: int):
    """A `[1, lanes]` row block per (head, query tile) of an output `[heads, 1, query tiles * lanes]`,
    from the index map of the query block (h, i, 0): a row that broadcasts down sublanes."""
    def row_map(*grid_and_tables):
        h, i, _ = index_map(*grid_and_tables)
        return h, 0, i
    return pl.BlockSpec((None, 1, lanes), row_map)

