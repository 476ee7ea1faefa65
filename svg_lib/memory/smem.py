"""SMEM estimates for the block-sparse kernels' schedule tables, known before compiling.

A block-sparse kernel scalar-prefetches its schedule into SMEM, the TensorCore's small scalar
memory (1 MiB per core on v4 through v7x, jax's TPU info table). `jax.export` lowers any
schedule, however large; only the TPU compiler refuses one that does not fit ("Ran out of
memory in memory space smem"). This module does the compiler's arithmetic first.

How Mosaic lays a scalar-prefetched int32 array out in SMEM (libtpu 0.0.42.1, compile-only
v6e, read from the compiler's allocation report in its "Ran out of memory in memory space
smem" error):

* a 2-D `[rows, cols]` array is stored in (8, 128)-word tiles: rows padded to a multiple of
  8, cols to a multiple of 128 (`s32[591, 156]` took 592 x 256 words = 606,208 bytes);
* a 1-D `[n]` array is padded to a multiple of 128 words (`s32[1]` took 512 bytes);
* besides the tables the kernel needs a little more (1 KiB of register-allocator spill slots,
  a few words, and what the allocator loses to placement): an overhead fitted to the compiler's
  verdicts per libtpu release (`FIXED_BYTES_BY_LIBTPU`); a libtpu not in the table (or none:
  interpret mode) gets the largest, so the estimate never says "fits" where a compiler we have
  seen refuses. tests/test_smem.py re-checks both sides with the installed compiler.

The kernels pass the packed form (`planner.pack_schedule`): two 16-bit steps per int32 word,
plus a `[heads]` int32 row of per-head kinds; what the other forms would take is in
`svg_lib.extensions.smem_forms`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.planner import plan_tiles
from svg_lib.environment import installed_version
from svg_lib.problem import PALLAS_METHODS, check_method
from svg_lib.runtime import smem_capacity

KiB, MiB = 2**10, 2**20
WORD = 4                 # SMEM holds 32-bit words; scalar prefetch wants int32
TILE_ROWS, TILE_COLS = 8, 128  # a 2-D SMEM array's (rows, cols) tile, in words
VECTOR_WORDS = 128       # a 1-D SMEM array is padded to a multiple of this many words
# what else the kernel keeps in SMEM, by libtpu release (fitted: CONTRIBUTING.md)
FIXED_BYTES_BY_LIBTPU = {"0.0.42": 3 * KiB, "0.0.21": 6 * KiB}
FIXED_BYTES = max(FIXED_BYTES_BY_LIBTPU.values())  # for any other libtpu, or none


@functools.lru_cache(maxsize=1)
def _installed_libtpu() -> str | None:
    return installed_version("libtpu")


def fixed_bytes(libtpu: str | None = None) -> int:
    """The SMEM overhead beside the tables for `libtpu` ("0.0.42.1"; default: the installed one)."""
    libtpu = _installed_libtpu() if libtpu is None else libtpu
    release = ".".join((libtpu or "").split(".")[:3])
    return FIXED_BYTES_BY_LIBTPU.get(release, FIXED_BYTES)


def table_bytes(shape) -> int:
    """SMEM bytes of one int32 array of `shape` (0-D, 1-D or 2-D) after Mosaic's padding."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        words = 1
    elif len(shape) == 1:
        words = -(-shape[0] // VECTOR_WORDS) * VECTOR_WORDS
    elif len(shape) == 2:
        rows, cols = shape
        words = -(-rows // TILE_ROWS) * TILE_ROWS * (-(-cols // TILE_COLS) * TILE_COLS)
    else:
        raise ValueError(f"SMEM tables here are 0-, 1- or 2-D, got shape {shape}")
    return words * WORD


@dataclass(frozen=True)
class SmemEstimate:
    """SMEM one kernel needs: its scalar-prefetched tables (padded) plus a fixed overhead."""

    tables: tuple          # ((name, shape, padded bytes), ...)
    fixed: int
    generation: str
    capacity: int

    @property
    def total(self) -> int:
        return sum(b for _, _, b in self.tables) + self.fixed

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'} = {b / KiB:,.1f} KiB"
                          for name, shape, b in self.tables)
        return (f"{self.total / KiB:,.1f} KiB of SMEM ({parts}, fixed {self.fixed / KiB:.1f} KiB); "
                f"{self.generation} has {self.capacity / KiB:,.0f} KiB per core")


def estimate_smem(tables: dict, generation: str | None = None) -> SmemEstimate:
    """Estimate SMEM for a kernel whose scalar-prefetch operands are `tables` {name: shape or array}."""
    generation, capacity = smem_capacity(generation)
    rows = tuple((name, tuple(int(s) for s in getattr(t, "shape", t)), table_bytes(getattr(t, "shape", t)))
                 for name, t in tables.items())
    return SmemEstimate(rows, fixed_bytes(), generation, capacity)


def schedule_smem(heads: int, rows: int, steps: int, generation: str | None = None, *,
                  head_order: bool = False) -> SmemEstimate:
    """SMEM of `block_sparse_attention`: a `[heads]` kind row and the packed schedule, two
    16-bit steps per int32 word (`planner.pack_schedule`): `[ceil(rows * steps / 2)]`; beside
    them the bounded max's `[heads]` float32 key-norm maxima and its one-word switch flag
    (`kernels.forward.check_bound`), 32-bit words laid out like the int32 rows.

    rows = kinds x query tiles (one kind unless the in-kernel routing stacks two). `head_order`: the
    kernel also reads a `[heads]` order of the heads (the routed layer balancing a megacore's cores).
    """
    order = {"head_order": (heads,)} if head_order else {}
    return estimate_smem({"head_kind": (heads,), "schedule": (-(-rows * steps // 2),), **order,
                          **_bound_rows(heads)}, generation)


def _bound_rows(heads: int) -> dict:
    """What the bounded max keeps in SMEM beside any schedule: key-norm maxima and its flag."""
    return {"key_norm_max": (heads,), "bound_flag": (1,)}


class SmemOverflowError(ValueError):
    """A schedule that would not fit SMEM, refused before compiling (a ValueError)."""


def check_schedule_fits(plan, *, method: str, heads: int, kinds: int = 1, steps: int | None = None,
                        generation: str | None = None, suggest=None, head_order: bool = False) -> SmemEstimate:
    """Raise a ValueError naming the sizes, the capacity and blocks that fit, if `plan`'s schedule
    (stacked `kinds` times, `steps` per row, the plan's own by default) overflows SMEM.

    `suggest(block_q, block_kv) -> SmemEstimate | None` estimates another block size (None
    when it cannot be planned); by default the plan's mask is planned again at larger blocks.
    """
    check_method(method, PALLAS_METHODS)
    nq = plan.grid[0]
    steps = plan.steps if steps is None else steps
    estimate = schedule_smem(heads, kinds * nq, steps, generation, head_order=head_order)
    if estimate.fits:
        return estimate
    if suggest is None:
        def suggest(bq, bkv):
            mask = plan.mask  # B3's rounded mask is rounded again, from its source, at the new blocks
            if isinstance(mask, TileAlignedMask):
                if mask.source is None:
                    return None
                mask = mask.source.tile_aligned(bq, bkv)
            trial = plan_tiles(mask, bq, bkv)
            return schedule_smem(heads, kinds * trial.grid[0], trial.steps, estimate.generation,
                                 head_order=head_order)
    hint = "; no larger block up to 4096 fits either: split the sequence or use a mask with fewer tiles"
    for bq, bkv in _larger_blocks(plan.block_q, plan.block_kv):
        trial = suggest(bq, bkv)
        if trial is not None and trial.fits:
            hint = f"; block_q={bq}, block_kv={bkv} fits ({trial.total / KiB:,.1f} KiB)"
            break
    raise SmemOverflowError(f"{method} schedule of {kinds * nq} rows x {steps} steps "
                     f"({plan.block_q}x{plan.block_kv} tiles over {plan.tokens:,} tokens) overflows SMEM: "
                     f"{estimate}{hint}")


def _larger_blocks(block_q: int, block_kv: int, limit: int = 4096):
    """Block sizes to try, fewest tiles last: grow both sides by 128 lanes at a time, then each."""
    seen = set()
    for grow in range(128, limit, 128):
        for bq, bkv in ((block_q + grow, block_kv + grow), (block_q + grow, block_kv), (block_q, block_kv + grow)):
            if bq <= limit and bkv <= limit and (bq, bkv) not in seen:
                seen.add((bq, bkv))
                yield bq, bkv

