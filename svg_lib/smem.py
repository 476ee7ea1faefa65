"""SMEM estimates for the block-sparse kernels' schedule tables, known before compiling.

A block-sparse kernel scalar-prefetches its schedule into SMEM, the TensorCore's small scalar
memory (1 MiB per core on v4 through v7x, jax's TPU info table). `jax.export` lowers any
schedule, however large; only the TPU compiler refuses one that does not fit ("Ran out of
memory in memory space smem"). This module does the compiler's arithmetic first.

How Mosaic lays a scalar-prefetched int32 array out in SMEM (libtpu 0.0.42.1, compile-only
v6e; the compiler's own allocation report, see tests/test_smem.py):

* a 2-D `[rows, cols]` array is stored in (8, 128)-word tiles: rows padded to a multiple of
  8, cols to a multiple of 128. Two `[591, 260]` tables (B2 at 1440p, density 0.35, 512 x 512
  blocks: the series' old form) take 2 x 592 x 384 words = 1.73 MiB;
* a 1-D `[n]` array is padded to a multiple of `VECTOR_WORDS` words;
* besides the tables the kernel needs `FIXED_BYTES` (register-allocator spill slots and
  the like), fitted to the "Used" figures the compiler reports for several table sizes.

The kernels here pass one flat table, one packed word per grid step (planner.pack_schedule),
plus a `[heads]` int32 row of per-head kinds. SMEM bytes of the flat form (and of the old two
`[nq, steps]` tables), B2 / B3, 1 head, band + first-frame sink at density 0.35, Wan 2.1
latents of 21 frames (720p 45 x 80, 1080p 68 x 120, 1440p 90 x 160):

    geometry  tokens   blocks       nq x steps (B2)  flat       old two tables
    720p      75,600   512 x 512    148 x 68         39 KiB     152 KiB
    1080p    171,360   512 x 512    335 x 147        193 KiB    670 KiB
    1440p    302,400   512 x 512    591 x 260        600 KiB    1,776 KiB (refused)
    1440p    302,400   3328 x 1536  91 x 83          30 KiB     184 KiB

(`smem_table()` prints these rows for any geometry; the numbers above are its output.)
The flat form stops fitting at about 262,000 grid steps per head kind (nq x steps), e.g.
1440p at density ~0.55 with 512 x 512 blocks, or 1440p at density 0.35 with 384 x 384 blocks;
the old form stopped at 1440p density ~0.15. Larger blocks shrink both factors.
"""
from __future__ import annotations

from dataclasses import dataclass

KiB, MiB = 2**10, 2**20
WORD = 4                 # SMEM holds 32-bit words; scalar prefetch wants int32
TILE_ROWS, TILE_COLS = 8, 128  # a 2-D SMEM array's (rows, cols) tile, in words
VECTOR_WORDS = 128       # a 1-D SMEM array is padded to a multiple of this many words
FIXED_BYTES = 3 * KiB    # what else the kernel keeps in SMEM (fitted; see the module docstring)

# SMEM per TensorCore by generation (jax's TPU info table: 1 MiB from v4 on; 16 KiB on v2/v3).
SMEM_BYTES = {"v4": 1 * MiB, "v4i": 1 * MiB, "v5e": 1 * MiB, "v5p": 1 * MiB, "v6e": 1 * MiB,
              "v7": 1 * MiB, "v7x": 1 * MiB}


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
        parts = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'} int32 = {b / KiB:,.1f} KiB"
                          for name, shape, b in self.tables)
        return (f"{self.total / KiB:,.1f} KiB of SMEM ({parts}, fixed {self.fixed / KiB:.1f} KiB); "
                f"{self.generation} has {self.capacity / KiB:,.0f} KiB per core")


def smem_capacity(generation: str | None = None) -> tuple[str, int]:
    """(generation, SMEM bytes per core); the attached TPU's generation when None."""
    if generation is None:
        from .vmem import tpu_generation
        generation = tpu_generation()
    if generation not in SMEM_BYTES:
        raise ValueError(f"no SMEM capacity known for TPU generation {generation!r}; known: "
                         f"{', '.join(SMEM_BYTES)}")
    return generation, SMEM_BYTES[generation]


def estimate_smem(tables: dict, generation: str | None = None) -> SmemEstimate:
    """Estimate SMEM for a kernel whose scalar-prefetch operands are `tables` {name: shape or array}."""
    generation, capacity = smem_capacity(generation)
    rows = tuple((name, tuple(int(s) for s in getattr(t, "shape", t)), table_bytes(getattr(t, "shape", t)))
                 for name, t in tables.items())
    return SmemEstimate(rows, FIXED_BYTES, generation, capacity)


def schedule_smem(heads: int, rows: int, steps: int, generation: str | None = None) -> SmemEstimate:
    """SMEM of `block_sparse_attention`: a `[heads]` kind row and a flat `[rows * steps]` schedule.

    rows = kinds x query tiles (one kind unless the in-kernel routing stacks two).
    """
    return estimate_smem({"head_kind": (heads,), "schedule": (rows * steps,)}, generation)


def check_schedule_fits(plan, *, method: str, heads: int, kinds: int = 1, steps: int | None = None,
                        generation: str | None = None, suggest=None) -> SmemEstimate:
    """Raise a ValueError naming the sizes, the capacity and blocks that fit, if `plan`'s schedule
    (stacked `kinds` times, `steps` per row, the plan's own by default) overflows SMEM.

    `suggest(block_q, block_kv) -> SmemEstimate | None` estimates another block size (None
    when it cannot be planned); by default the plan's mask is planned again at larger blocks.
    """
    nq = plan.grid[0]
    steps = plan.steps if steps is None else steps
    estimate = schedule_smem(heads, kinds * nq, steps, generation)
    if estimate.fits:
        return estimate
    if suggest is None:
        def suggest(bq, bkv):
            from .masks import TileAlignedMask
            from .planner import plan_tiles
            mask = plan.mask  # B3's rounded mask is rounded again, from its source, at the new blocks
            if isinstance(mask, TileAlignedMask):
                if mask.source is None:
                    return None
                mask = mask.source.tile_aligned(bq, bkv)
            trial = plan_tiles(mask, bq, bkv)
            return schedule_smem(heads, kinds * trial.grid[0], trial.steps, estimate.generation)
    hint = "; no larger block up to 4096 fits either: split the sequence or use a mask with fewer tiles"
    for bq, bkv in _larger_blocks(plan.block_q, plan.block_kv):
        trial = suggest(bq, bkv)
        if trial is not None and trial.fits:
            hint = f"; block_q={bq}, block_kv={bkv} fits ({trial.total / KiB:,.1f} KiB)"
            break
    raise ValueError(f"{method} schedule of {kinds * nq} rows x {steps} steps "
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
