"""The tile planner: from a mask to the small tables a block-sparse kernel consumes.

The planner knows masks; kernels know tables. For `block_q` x `block_kv` tiles it
classifies every tile (EMPTY / PARTIAL / FULL) from exact pair counts (no N x N
array), and lays out a compressed schedule: for each query tile, the key/value
tiles to visit in order, after idle steps that pad it to a common length and point
at its first tile, so that tile is copied once, while the row above still computes.

The kernel receives that schedule as one flat int32 table in SMEM (`TilePlan.schedule`):
each grid step is a 16-bit entry `kv_index << CLASS_BITS | step_class`, two entries to a
word, row after row. Two separate `[nq, steps]` int32 tables would cost about four times as
much SMEM, more with Mosaic's (8, 128)-word tiling of 2-D SMEM arrays; `svg_lib.memory.smem` has the
arithmetic, `svg_lib.extensions.smem_forms` the sizes where each form stops fitting.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from svg_lib.core.masks import Mask, check_block_size, warn_density_floor
from svg_lib.progress import bar as progress_bar

PROGRESS_TOKENS = 2**20  # plans of this many tokens or more show a progress bar (svg_lib.progress)

EMPTY, PARTIAL, FULL = 0, 1, 2  # the same codes as Splash attention's block classes
CLASS_NAMES = {EMPTY: "empty", PARTIAL: "partial", FULL: "full"}
CLASS_BITS = 2   # a step's class takes the low two bits of its schedule entry, its key tile the rest
STEP_BITS = 16   # one schedule entry per grid step, two entries per int32 word of SMEM
MAX_KV_TILES = 1 << (STEP_BITS - CLASS_BITS)  # 16,384 key tiles: 8.4M tokens at 512-token tiles


@dataclass
class TilePlan:
    """Tile classes and the scalar-prefetch schedule of one mask at one block size.

    Shapes: `nq = ceil(tokens / block_q)` query tiles, `nk = ceil(tokens / block_kv)` key tiles,
    `steps` = the most tiles any query tile visits (at least 1).
    """

    mask: Mask
    block_q: int
    block_kv: int
    counts: np.ndarray           # int64 [nq, nk] kept pairs per tile
    areas: np.ndarray            # int64 [nq, nk] real (unpadded) pairs per tile
    classes: np.ndarray          # int8  [nq, nk] EMPTY / PARTIAL / FULL
    touches_padding: np.ndarray  # bool  [nq, nk] tile holds padding rows or columns (past the last token,
    #                              or declared by the mask's real_tokens_in)
    kv_index: np.ndarray         # int32 [nq, steps] key tile to fetch at each step
    step_class: np.ndarray       # int8  [nq, steps] class of that step's tile; EMPTY for idle steps (first)
    num_steps: np.ndarray        # int32 [nq] how many steps of each row are real visits
    _stats: dict | None = field(default=None, repr=False)
    _tables: "KernelTables | None" = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return self.mask.tokens

    @property
    def grid(self) -> tuple[int, int]:
        """(query tiles, key tiles)."""
        return self.classes.shape

    @property
    def steps(self) -> int:
        """Grid steps per query tile in the compressed schedule."""
        return self.kv_index.shape[1]

    @property
    def visited(self) -> np.ndarray:
        """bool [nq, nk]: tiles a block-sparse kernel computes (every non-empty tile)."""
        return self.classes != EMPTY

    @property
    def needs_mask(self) -> np.ndarray:
        """bool [nq, nk]: visited tiles that need an elementwise mask in B2.

        Boundary tiles, and tiles holding key padding (padded key columns must not enter the
        softmax). Padded query rows need no mask: they are computed and thrown away.
        """
        return self.classes == PARTIAL

    @property
    def schedule(self) -> np.ndarray:
        """The table the block-sparse kernel reads: int32 `[ceil(nq * steps / 2)]`, see `pack_schedule`."""
        return pack_schedule(self.kv_index, self.step_class)

    @property
    def transposed_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The schedule seen from the keys, for the backward's dk/dv kernel.

        `(q_index, step_class, num_steps)`: `[nk, steps_t]`, `[nk, steps_t]`, `[nk]`; row j lists
        the query tiles that visit key tile j (the columns of `classes`), in ascending order,
        after its idle steps (`schedule_rows`). Same classes, so the same tiles mask.
        """
        return schedule_rows(self.classes.T)

    @property
    def transposed_schedule(self) -> np.ndarray:
        """`transposed_tables` packed like `schedule`: int32 `[ceil(nk * steps_t / 2)]`."""
        q_index, step_class, _ = self.transposed_tables
        return pack_schedule(q_index, step_class)

    @property
    def tables(self) -> "KernelTables":
        """Every table the kernels of this plan read, forward and backward (`KernelTables`)."""
        if self._tables is None:
            q_index, step_class_t, _ = self.transposed_tables
            self._tables = KernelTables(self.grid, self.schedule, self.steps, pack_schedule(q_index, step_class_t),
                                        q_index.shape[1])
        return self._tables

    @property
    def stats(self) -> dict:
        """Plan statistics; the keys of `python -m svg_lib plan --json`."""
        if self._stats is None:
            self._stats = _plan_stats(self)
        return self._stats

    def __str__(self) -> str:
        s = self.stats
        b3 = ("B3 refused" if s["b3_refused"] else
              f"B3 {s['b3_tiles_visited']} visited, {s['b3_tiles_masked']} masked")
        return (f"{self.block_q}x{self.block_kv} tiles over {s['tokens']:,} tokens: "
                f"{s['tiles_visited']}/{s['tiles_total']} visited, {s['tiles_masked']} masked; {b3}")


@dataclass(frozen=True)
class KernelTables:
    """The tables one tile grid's kernels read from SMEM, both directions, packed (`pack_schedule`).

    `grid` = (nq, nk) tiles. `schedule` int32 `[ceil(nq * steps / 2)]`: per query tile, the key
    tiles to visit (the forward and the backward's dq pass). `schedule_t` int32
    `[ceil(nk * steps_t / 2)]`: per key tile, the query tiles that visit it (the dk/dv pass).
    """

    grid: tuple[int, int]
    schedule: np.ndarray
    steps: int
    schedule_t: np.ndarray
    steps_t: int


def plan_tiles(mask: Mask, block_q: int, block_kv: int) -> TilePlan:
    """Classify every `block_q` x `block_kv` tile of `mask` and build its schedule tables.

    Padding (positions past `mask.tokens`, and any the mask declares with `Mask.real_tokens_in`)
    is treated by role: a tile holding padded keys must mask them, so it is never FULL; padded
    query rows are computed and thrown away, so they neither make a tile PARTIAL nor keep a tile
    of nothing but padded rows from being EMPTY.
    """
    if not isinstance(mask, Mask):
        raise TypeError(f"plan_tiles needs an svg_lib Mask (e.g. SVGMask.spatial(...)), got {type(mask).__name__}")
    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    warn_density_floor(mask)  # a band mask keeping far more than the density asked for says why
    n = mask.tokens
    nq, nk = -(-n // block_q), -(-n // block_kv)
    q_edges = np.arange(nq + 1, dtype=np.int64) * block_q
    k_edges = np.arange(nk + 1, dtype=np.int64) * block_kv
    if n < PROGRESS_TOKENS:
        counts = np.asarray(mask.pair_counts(q_edges, k_edges), np.int64)
    else:  # a million tokens or more: minutes; counted a band of query tiles at a time, with a bar
        step = max(1, -(-nq // 64))
        with progress_bar(total=nq, desc=f"plan: counting kept pairs of {nq:,} x {nk:,} tiles ({n:,} tokens)",
                          unit="row") as shown:
            parts = []
            for i in range(0, nq, step):
                parts.append(np.asarray(mask.pair_counts(q_edges[i:i + step + 1], k_edges), np.int64))
                shown.update(min(step, nq - i))
        counts = np.concatenate(parts, axis=0)
    rows = np.asarray(mask.real_tokens_in(q_edges), np.int64)  # real query rows per query tile
    cols = np.asarray(mask.real_tokens_in(k_edges), np.int64)  # real keys per key tile
    areas = rows[:, None] * cols[None, :]
    if (counts > areas).any():
        raise ValueError(f"{type(mask).__name__} keeps pairs on positions its real_tokens_in calls padding; "
                         "a mask must keep no pair on a padding position (keep(q, k) False there)")
    kv_padded = (cols < block_kv)[None, :]  # padded keys inside: the tile must mask them
    q_padded = (rows < block_q)[:, None]    # padded query rows: computed and dropped, no mask needed

    classes = np.full((nq, nk), PARTIAL, dtype=np.int8)
    classes[counts == 0] = EMPTY  # also every tile whose query rows are all padding (areas 0)
    classes[(counts == areas) & (counts > 0) & ~kv_padded] = FULL

    kv_index, step_class, num_steps = schedule_rows(classes)
    return TilePlan(mask, block_q, block_kv, counts, areas, classes, q_padded | kv_padded,
                    kv_index, step_class, num_steps)


def schedule_rows(classes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compressed schedule of a `[rows, cols]` table of tile classes.

    Returns `index` int32 `[rows, steps]` (the column tile to fetch at each step),
    `step_class` int8 `[rows, steps]` and `num_steps` int32 `[rows]`, with `steps` the most
    non-empty tiles of any row (at least 1). Each row starts with its idle steps (class EMPTY), on
    the row's first tile, then lists its non-empty tiles in ascending order: the copy of that first
    tile then overlaps the last tile the row above computes, not an idle step (faster on a v5e:
    tpu_experiments.json). For the forward pass rows are query tiles and columns key tiles; for
    the backward's dk/dv pass, the transpose (`TilePlan.transposed_tables`).
    """
    classes = np.asarray(classes)
    visited = classes != EMPTY
    num_steps = visited.sum(axis=1).astype(np.int32)
    steps = max(int(num_steps.max(initial=0)), 1)
    visits = np.argsort(~visited, axis=1, kind="stable")[:, :steps]  # each row's visited tiles, ascending
    last = np.take_along_axis(visits, np.maximum(num_steps - 1, 0)[:, None], axis=1)[:, 0]
    visit = np.arange(steps)[None, :] - (steps - num_steps)[:, None]  # which visit a step makes; < 0: idle
    order = np.take_along_axis(visits, np.maximum(visit, 0), axis=1)
    idle = visit < 0
    index = np.where(idle, _idle_tiles(visits[:, 0], last, num_steps)[:, None], order).astype(np.int32)
    step_class = np.where(idle, EMPTY, np.take_along_axis(classes, order, axis=1)).astype(np.int8)
    return index, step_class, num_steps


def _idle_tiles(first: np.ndarray, last: np.ndarray, num_steps: np.ndarray) -> np.ndarray:
    """Each row's idle-step key tile `[nq]`: its first visited tile, or for a row that visits nothing,
    the tile already resident when it runs (grid order: query tile, then step): the last tile of the
    nearest visiting row above, before the first visiting row that row's first tile. No idle step
    then issues a DMA of its own. `first`, `last` `[nq]`: each row's first and last visited tile.
    """
    has = num_steps > 0
    if not has.any():
        return np.zeros_like(first)
    above = np.where(has, np.arange(first.size), -1)
    np.maximum.accumulate(above, out=above)  # index of the nearest visiting row at or above
    return np.where(has, first, np.where(above >= 0, last[np.maximum(above, 0)], first[np.argmax(has)]))


def pack_schedule(kv_index: np.ndarray, step_class: np.ndarray) -> np.ndarray:
    """The kernel's schedule table: int32 `[ceil(rows * steps / 2)]` from two `[rows, steps]` tables.

    Step s of row r is entry n = r * steps + s, the 16-bit value `kv_index << CLASS_BITS |
    step_class`, stored in the low half of word n // 2 when n is even and the high half when
    odd. Rows are query tiles (or, stacked by `extensions.stacked_schedules`, query tiles of several masks).
    """
    kv_index, step_class = np.asarray(kv_index, np.int64), np.asarray(step_class, np.int64)
    if kv_index.shape != step_class.shape or kv_index.ndim != 2:
        raise ValueError(f"kv_index and step_class must be [rows, steps] of one shape, got "
                         f"{kv_index.shape} and {step_class.shape}")
    if kv_index.size and (kv_index.min() < 0 or kv_index.max() >= MAX_KV_TILES):
        raise ValueError(f"key tile indices must lie in [0, {MAX_KV_TILES:,}) to fit a {STEP_BITS}-bit schedule "
                         f"entry, got {kv_index.min()}..{kv_index.max()}; use larger key tiles (block_kv)")
    if not np.isin(step_class, list(CLASS_NAMES)).all():
        raise ValueError(f"step classes must be EMPTY, PARTIAL or FULL ({sorted(CLASS_NAMES)})")
    entries = ((kv_index << CLASS_BITS) | step_class).ravel()
    entries = np.concatenate([entries, np.zeros(entries.size % 2, np.int64)])  # whole words
    words = entries[0::2] | (entries[1::2] << STEP_BITS)
    return words.astype(np.uint32).view(np.int32)  # a key tile >= 8,192 sets the sign bit: fine


def schedule_entry(schedule, n):
    """Entry `n` of a packed schedule (`pack_schedule`) as `(key tile, class)`: the series' one decoder.

    `schedule` is anything indexed by word: the int32 NumPy table, or inside a kernel the table's
    SMEM ref, which the kernels and their index maps read at every grid step; `n` an int, a NumPy
    array of them, or a traced int32. Entry n is the low half of word n // 2 when n is even, the
    high half when odd (an arithmetic shift of a word with its sign bit set is undone by the mask).
    """
    entry = (schedule[n >> 1] >> (STEP_BITS * (n & 1))) & 0xFFFF
    return entry >> CLASS_BITS, entry & ((1 << CLASS_BITS) - 1)


def unpack_schedule(schedule: np.ndarray, rows: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `pack_schedule`: the table -> (kv_index, step_class), each `[rows, steps]`."""
    tile, cls = schedule_entry(np.asarray(schedule, np.int32), np.arange(rows * steps))
    return tile.astype(np.int64).reshape(rows, steps), cls.astype(np.int64).reshape(rows, steps)


def _plan_stats(plan: TilePlan) -> dict:
    mask = plan.mask
    nq, nk = plan.grid
    visited = int(plan.visited.sum())
    masked = int(plan.needs_mask.sum())
    exact_pairs = int(plan.counts.sum())
    band = getattr(mask, "band_width", None)
    stats = {
        "tokens": int(mask.tokens),
        "band_width": None if band is None else int(band),
        "pair_density": exact_pairs / float(mask.tokens) ** 2,
        "block_q": plan.block_q,
        "block_kv": plan.block_kv,
        "q_tiles": nq,
        "kv_tiles": nk,
        "tiles_total": nq * nk,
        "tiles_visited": visited,
        "tiles_full": int((plan.classes == FULL).sum()),
        "tiles_masked": masked,
        "tiles_touching_padding": int(plan.touches_padding.sum()),
        "visited_fraction": visited / (nq * nk),
        "masked_fraction": masked / max(visited, 1),
        "grid_steps": nq * plan.steps,
        "computed_pairs": int(plan.areas[plan.visited].sum()),
    }
    try:
        b3 = mask.tile_aligned(plan.block_q, plan.block_kv, policy="balanced")
    except ValueError as err:  # B3 cannot run this mask at these blocks (sliding tiles cut through padding)
        stats.update(dict.fromkeys(("b3_tiles_visited", "b3_tiles_masked", "b3_visited_fraction", "b3_pairs",
                                    "b3_budget_error"), None), b3_refused=str(err))
        return stats
    b3_plan = plan if b3 is mask else plan_tiles(b3, plan.block_q, plan.block_kv)
    b3_visited = int(b3_plan.visited.sum())
    stats.update({
        "b3_tiles_visited": b3_visited,
        "b3_tiles_masked": int(b3_plan.needs_mask.sum()),
        "b3_visited_fraction": b3_visited / (nq * nk),
        "b3_pairs": int(b3_plan.counts.sum()),
        "b3_budget_error": (int(b3_plan.counts.sum()) - exact_pairs) / max(exact_pairs, 1),
        "b3_refused": None,  # or why B3 cannot run the mask at these blocks (then the b3_ values are None)
    })
    return stats
