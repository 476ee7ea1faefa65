"""The series' Pallas TPU attention kernels: dense, B1, B2 and B3.

Every kernel is the same online-softmax loop over key/value tiles; they differ only
in which tiles the grid visits and which of them evaluate a mask:

    dense  grid (heads, q tiles, kv tiles)  every tile; padding mask on the last kv tile
    B1     grid (heads, q tiles, steps)     planner's non-empty tiles; mask on every one
    B2     same schedule as B1              FULL tiles skip the mask; PARTIAL tiles mask
    B3     schedule of the tile-aligned     like B2, but only tiles touching key padding
           mask                             mask, and only for padding

The tile body (`online_softmax_tile`) is shared by all four. Kernels never see a
Mask object's structure, only tables from the planner (scalar-prefetched into SMEM)
and an elementwise predicate `keep(q_ids, k_ids)` for the tiles that must mask. The
in-kernel routing (routing.py) runs the same block-sparse kernel with one schedule and
one predicate per kind of head.

NaN is never hidden: output row i is NaN when q_i holds a NaN, or k_j of a key j the row keeps, or
v_j of any key j in a tile the row's query tile computes (p @ v meets v_j even where p is 0, as a dense
softmax @ v would); a row that keeps no key stays exactly 0, and the backward's gradients follow
the same tiles (`finish`; tests/test_nan.py states it as a model and checks every method against it).

Arrays here are not padded: q `[heads, tokens, head_dim]` (pre-scaled by 1/sqrt(head_dim)), k and
v `[heads, tokens, head_dim]`, any token count. The grid has `ceil(tokens / block)` tiles per axis,
and where the last tile is partial its VMEM block reaches past the array's end: what lies there is
unspecified (the DMA copies only the array's rows; on a TPU the rest is whatever the buffer held,
both interpreters fill it with NaN). The kernels never write into an input block: they neutralise
the tail where they read it (`real_part`, a select on the loaded value). Key columns past the end are
masked (every tile reaching them is masked), and a masked tile selects its v slice's rows past the end
to zero, so that a NaN there never meets `p @ v` (0 * NaN is NaN); query rows past the end compute
garbage that is never written to HBM, and the bound's check leaves them out (`check_bound`). Writing
the tail in place gave wrong rows on a real TPU, and padded copies in HBM cost hundreds of MiB
(CONTRIBUTING.md, "Measurements behind the kernels").

The bounded max. The running max costs, at every slice of keys, a row max and a rescale of l and acc.
A query tile's first step instead subtracts each row's Cauchy-Schwarz bound |q_i| max|k| (`start_bound`,
with a margin float rounding cannot cross): exp, the row sum and the two matmuls. `check_bound` then
tests, once, whether each row's l shows a score within BOUND_SLACK of the bound: if all do, the tile
keeps the bound; if not, the step is undone and runs again with the running max, kept to the end.
Decided per query tile at run time (tests/test_bounded_max.py counts which body ran), so every input
gets the exact result, scores of 1e9 at their bound included. How often tiles pass depends on the
activations (`svg_lib.instruments.tpu.cost` prices both from the compiler's static profile).

Code size. Every `pl.when` branch is compiled: a kernel holds a tile body per kind it runs, running and
bounded each (dense, B2, B3 four, mask-free and masked; B1 two), each loop unrolled within the code
measured fast on a TPU (`unrolled_bodies`, `unroll_factor`, `CODE_BUDGET`).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib.kernels.grid import DenseSchedule, Pieces, Schedule, TileSizes, row_block, tile_step_call
from svg_lib.methods import METHODS, PLANNED_METHODS, check_record

# A finite "minus infinity": exp(MASK_VALUE - m) is exactly 0 for any real score m, and
# unlike -inf it never produces inf - inf = nan in a row that has seen no kept key yet.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
LANES = 128
# Code size. Mosaic compiles every `pl.when` branch and lays each vector op out over every vreg of its
# block, so a tile body's code grows with its slice, block_q x block_kv_compute, and an unrolled loop
# holds a copy per slice. On a v5e every forward program compiled past the budget ran slower, most
# 2.5-3x (rolled and single slices too: likely instruction memory overflowing, not verified); within it
# unrolling gained 1-7 % (data/tpu_measurements.json, tpu_code_sizes.json; `measured.unroll_evidence`).
# `code_bytes` prices a program before compiling it: a least-squares fit of the compiler's sizes.
CODE_FIXED_BYTES, CODE_BYTES_PER_ROW = 420_964, 252.65
CODE_BYTES_PER_ELEMENT = {(True, False): 0.22828, (True, True): 0.22461, (False, False): 0.31266, (False, True): 0.22305}
CODE_BUDGET = 4_489_685  # the largest `code_bytes` of a program measured fast
MAX_UNROLLED_CHUNKS = 3  # the most copies of a tile body one iteration of an unrolled key-slice loop holds
# The kinds of tile body, (bounded, masked), in the order they unroll: the hottest first (after a
# query tile's first step nearly every step runs a bounded body, most of them mask-free).
UNROLL_ORDER = ((True, False), (True, True), (False, False), (False, True))


def unroll_factor(slices: int) -> int:
    """The slices one iteration of an unrolled loop of `slices` runs, as many copies of the body: the largest
    divisor up to MAX_UNROLLED_CHUNKS (all of 2 or 3, two of 4, three of 6; 1 for one slice or a prime past it)."""
    return max(f for f in range(1, min(slices, MAX_UNROLLED_CHUNKS) + 1) if slices % f == 0)


def body_copies(masked_kinds: int = 1, mask_free: bool = True) -> dict:
    """{(bounded, masked): copies} of the tile bodies a forward kernel compiles: each kind once, its masked
    ones once per kind of head (`masked_kinds`; B1 has no mask-free body)."""
    return {(bounded, masked): masked_kinds if masked else int(mask_free) for bounded, masked in UNROLL_ORDER}


def code_bytes(sizes: TileSizes, unrolled=frozenset(), masked_kinds: int = 1, mask_free: bool = True) -> int:
    """The bytes of code a forward kernel compiles to, estimated: a fixed part, a part per query row, and
    per compiled copy of a tile body its kind's bytes per element of a `[block_q, block_kv_compute]`
    slice, `unroll_factor(sizes.slices)` copies for each body whose loop is `unrolled`."""
    slice_ = sizes.block_q * sizes.block_kv_compute
    return round(CODE_FIXED_BYTES + CODE_BYTES_PER_ROW * sizes.block_q + slice_ * sum(
        n * CODE_BYTES_PER_ELEMENT[kind] * (unroll_factor(sizes.slices) if kind in unrolled else 1)
        for kind, n in body_copies(masked_kinds, mask_free).items()))


def unrolled_bodies(sizes: TileSizes, masked_kinds: int = 1, mask_free: bool = True) -> frozenset:
    """The kinds of tile body, (bounded, masked), whose key-slice loop a forward kernel unrolls: in
    `UNROLL_ORDER`, each kind the kernel compiles whose unrolling keeps its `code_bytes` within
    `CODE_BUDGET`. Loops that `unroll_factor` leaves rolled stay as they are."""
    chosen = frozenset()
    if unroll_factor(sizes.slices) > 1:
        for kind, n in body_copies(masked_kinds, mask_free).items():
            if n and code_bytes(sizes, chosen | {kind}, masked_kinds, mask_free) <= CODE_BUDGET:
                chosen |= {kind}
    return chosen


NT = (((1,), (1,)), ((), ()))  # dot_general dimensions of a @ b^T: contract both operands' last dims
NN = (((1,), (0,)), ((), ()))  # a @ b


def matmul_precision(dtype):
    """The precision every matmul of the series states: HIGHEST for float32 operands, DEFAULT otherwise.

    With float32 operands Mosaic's and XLA:TPU's default is one bf16 pass of the MXU (about three
    significant digits); HIGHEST issues six passes and gives float32 results. Only the CPU
    interpreter computes true float32 by default. bf16 operands are exact in one pass: DEFAULT.
    """
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def dot(a, b, dims):
    """`dot_general` on the MXU with float32 results, at the precision of the operands' dtype."""
    return jax.lax.dot_general(a, b, dims, precision=matmul_precision(a.dtype), preferred_element_type=jnp.float32)


def _lanes(x, width: int, interpret: bool):
    """A lane-replicated `[rows, 128]` state array, widened to `[rows, width]`.

    On a TPU the state is one value per row repeated over the 128 lanes: repeating whole vregs
    (`jnp.tile`) is free, where `x[:, :1]` broadcasts lanes in every vreg (twice Splash's cycles a tile
    in the compiler's profile). The interpreter prefers the [rows, 1] column, free for XLA to broadcast.
    """
    if width == LANES:
        return x
    if interpret or (width > LANES and width % LANES):
        return x[:, :1]
    return x[:, :width] if width < LANES else jnp.tile(x, (1, width // LANES))


def _lane_sum(p):
    """`[rows, width]` -> `[rows, 128]`: sums of the 128-lane columns of `p`, added lane by lane: plain VPU
    work. Across the lanes of a vreg a sum takes the cross-lane unit (XLU): the tile body keeps l as
    these per-lane partial sums and crosses the lanes once per query tile, in `finish`."""
    parts = [p[:, i:i + LANES] for i in range(0, p.shape[1], LANES)]
    while len(parts) > 1:
        parts = [a + b for a, b in zip(parts[::2], parts[1::2])] + parts[len(parts) & ~1:]
    return parts[0]


def online_softmax_tile(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, keep, q_start, k_start,
                         block_kv_compute, interpret=False, bounded=False, kv_tokens=None, unrolled=frozenset()):
    """Fold one key/value tile into the running softmax state of one query tile.

    q_ref `[block_q, head_dim]`; k_ref, v_ref `[block_kv, head_dim]`; m_ref `[block_q, 128]` f32
    the max subtracted before exp (replicated over lanes, the layout the VPU likes); l_ref
    `[block_q, 128]` f32 the row sums of exp, kept as per-lane partial sums (`_lane_sum`; the row
    sum is the sum over lanes); acc_ref `[block_q, head_dim]` f32 unnormalised output. For each
    slice of `block_kv_compute` keys (the slice bounds the VMEM of the score block): scores
    `s = q k^T`, masked if `keep` is given, then the online-softmax update of m, l and acc.

    `bounded=False`: m is the running max: raised to each slice's row max, and l and acc rescaled
    by exp(m_old - m_new). `bounded=True`: m holds a fixed upper bound on every score of the row
    (set by `start_bound`; `check_bound` then checks it is close enough to the row's real max): no max,
    no rescale, only exp, the row sum and the two matmuls.

    `keep` is None (a mask-free tile: the MXU path with no per-element VPU work) or a
    predicate on global token indices, called with a `[block_q, 1]` column of query indices
    and a `[1, block_kv_compute]` row of key indices (it must broadcast them): a predicate on
    keys alone (padding) then costs one row, not a tile. `kv_tokens`: None, or the key count when
    the last key tile is partial: a masked tile then selects its v rows past it to zero (`real_part`;
    the predicate already masks their scores). `unrolled`: the kinds of body, (bounded, masked), whose
    loop the kernel unrolls (`unrolled_bodies`, `unroll_factor`). `interpret` (known at trace time) picks
    the broadcasts each backend does cheaply (see `_lanes`). Both matmuls go through `dot`, at the precision
    of the inputs' dtype (`matmul_precision`): float32 tiles get float32 products on a TPU too.

    Two choices serve the CPU interpreter, at no cost on a TPU: kernels call this only under
    `pl.when`, and blocks are read inside the loop. Without them the interpreter copies the
    whole q, k and v arrays at every grid step (XLA turns its write-back of a block into a copy).
    """
    block_q = q_ref.shape[0]
    head_dim = acc_ref.shape[1]
    chunks = k_ref.shape[0] // block_kv_compute

    def chunk(c, carry):
        q = q_ref[...]  # read inside the loop too, for the same interpreter reason
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k = k_ref[ks, :]
        v = v_ref[ks, :]
        s = dot(q, k, NT)                                                # q @ k^T
        if keep is not None:
            if kv_tokens is not None:  # NaN past the end must not meet p @ v
                v = real_part(v, k_start + c * block_kv_compute, kv_tokens)
            q_ids = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
            k_ids = k_start + c * block_kv_compute + jax.lax.broadcasted_iota(jnp.int32, (1, block_kv_compute), 1)
            s = jnp.where(keep(q_ids, k_ids), s, MASK_VALUE)
        if bounded:
            p = jnp.exp(s - _lanes(m_ref[...], block_kv_compute, interpret))
            l_ref[...] += _lane_sum(p)
            acc_ref[...] += dot(p.astype(v.dtype), v, NN)                # p @ v
            return carry
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [block_q, 128]
        p = jnp.exp(s - _lanes(m_next, block_kv_compute, interpret))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_ref[...] + _lane_sum(p)
        m_ref[...] = m_next
        pv = dot(p.astype(v.dtype), v, NN)                               # p @ v
        acc_ref[...] = _lanes(alpha, head_dim, interpret) * acc_ref[...] + pv
        return carry

    per = unroll_factor(chunks) if (bounded, keep is not None) in unrolled else 1
    if 1 < per < chunks:  # `per` slices an iteration of a rolled loop (Colab's jax lowers no partial unroll)
        def group(g, carry):
            for j in range(per):
                chunk(g * per + j, carry)
        jax.lax.fori_loop(0, chunks // per, group, None)
    else:
        jax.lax.fori_loop(0, chunks, chunk, None, unroll=per > 1)


# -- the bounded max ---------------------------------------------------------------------------
# The running max costs a row max of every score block and a rescale of l and acc at every slice.
# A fixed m works as well as long as (a) no score exceeds it (exp would overflow) and (b) it is not
# so far above the row's real max that the terms that matter underflow. Cauchy-Schwarz gives (a):
# q_i . k_j <= |q_i| max_j |k_j| =: b_i, in exact arithmetic. In float32 a computed score can exceed
# the computed b_i by its rounding error, at most about head_dim * 2^-24 of |q_i| max|k| (scores of
# 1e9 overflow exp by ~100 units: identical tokens, tied projections); so the bound carries a
# relative margin, BOUND_MARGIN = 2^-10, over 16 times that error at head_dim 1024, and no computed
# score reaches it. For (b), a query tile keeps the bound after its first step, run on it, only when
# every row's l = sum_j exp(s_ij - b_i) over that step's kept keys reaches block_kv exp(-BOUND_SLACK):
# as l <= block_kv exp(max_j s_ij - b_i), the row has seen a kept score within BOUND_SLACK of b_i
# (a test by ln(block_kv) stricter than a max). Then every term within 27 of the row's final max is at
# least exp(-87), a normal float32 (and bfloat16), and what is lost weighs less than exp(-27) each.
# Rows that saw no kept key, scores spanning more than BOUND_SLACK, huge scores whose margin alone
# exceeds it, inf or nan in the bound: the tile undoes that step and keeps the running max.
# One cost the shift has: p = exp(s - bound) can be as small as exp(-BOUND_SLACK) ~ 1e-26 for a
# row's largest term, so a product p * v underflows float32's normal range (1.2e-38, below which a
# TPU flushes to zero) where |v| is below ~1e-12; the running max keeps the largest p at 1.
BOUND_SLACK = 60.0
BOUND_MARGIN = 2.0 ** -10
# The per-query-tile state of the bound (`flag_ref[0]`): the check is made once, after the tile's
# first step; a tile that fails keeps the running max to its end with no further test (a test at
# every step cost more, in the static profile, than the running body it would save). The first step
# runs on the bound, checked after: faster on a v5e than the running max first (CONTRIBUTING).
# RUNNING is 0: the compiler's static profile reads scalar-prefetched SMEM (and perhaps this flag: not
# checked) as zeros (instruments.tpu.probes), so a simulated kernel takes a failing tile's path, never a loop of tests.
RUNNING, BOUNDED, UNDECIDED = 0, 1, 2


def key_norm_max(k):
    """`[heads, tokens, head_dim]` -> `[heads]` f32: the largest key norm of each head (an XLA
    reduction before the kernel; zero padding rows do not change it).

    The kernels take it as a whole-array SMEM input, not as a scalar-prefetched table: those are
    int32 and Mosaic cannot bitcast a scalar, and a fixed-point int32 row, tried, almost doubled the
    8-chip routed layer's temporaries per chip (compile-only v6e 2x4)."""
    kf = k.astype(jnp.float32)
    return jnp.sqrt(jnp.max(jnp.sum(kf * kf, axis=-1), axis=-1))


def start_bound(q_ref, m_ref, key_norm_max):
    """A query tile's first step starts on the bound (l and acc are still 0): m `[block_q, 128]` = each
    row's Cauchy-Schwarz bound |q_i| max|k| (1 + BOUND_MARGIN), replicated over lanes."""
    q = q_ref[...].astype(jnp.float32)
    bound = jnp.sqrt(jnp.sum(q * q, axis=1, keepdims=True)) * (key_norm_max * (1.0 + BOUND_MARGIN))
    m_ref[...] = jnp.broadcast_to(bound, m_ref.shape)


def check_bound(m_ref, l_ref, acc_ref, flag_ref, *, threshold, q_start=0, q_tokens=None):
    """After a query tile's first step, run on the bound: keep the bound if every row's l reached
    `threshold` = block_kv exp(-BOUND_SLACK) (see BOUND_SLACK), else undo the step and take the running
    max for good, this step included. `q_tokens`: None, or the query count when the last query tile is
    partial: rows past it (garbage, never written) are left out of the test."""
    row_sum = jnp.sum(l_ref[...], axis=1, keepdims=True)                      # [block_q, 1]
    short = real_part(threshold - row_sum, q_start, q_tokens, fill=-jnp.inf)
    # nan (an inf or nan input) fails: made +inf first, since a max may drop nan (the CPU interpreter's does)
    ok = jnp.max(jnp.where(jnp.isnan(short), jnp.inf, short)) <= 0.0
    flag_ref[0] = BOUNDED

    @pl.when(jnp.logical_not(ok))
    def _():
        init_state(m_ref, l_ref, acc_ref)
        flag_ref[0] = RUNNING


def visit(tile, keep, flag_ref, start, check):
    """One tile: the first on the bound (`start`), kept or undone by `check`; the rest with what was kept."""
    pl.when(flag_ref[0] == UNDECIDED)(start)
    pl.when(flag_ref[0] != RUNNING)(functools.partial(tile, keep=keep, bounded=True))
    pl.when(flag_ref[0] == UNDECIDED)(check)
    pl.when(flag_ref[0] == RUNNING)(functools.partial(tile, keep=keep, bounded=False))


def plain_interpreter(interpret) -> bool:
    """Whether a kernel given `interpret` runs in the plain CPU interpreter (`interpret=True`, `_lanes`'s
    cheap broadcasts); `pltpu.InterpretParams(...)` simulates a TPU and runs the code a TPU compiles."""
    return interpret is not None and interpret is not False and not isinstance(interpret, pltpu.InterpretParams)


def token_ids(start, n, axis):
    """Global token indices `start ... start + n - 1` laid along `axis` of a 2-D array:
    a column `[n, 1]` for axis 0, a row `[1, n]` for axis 1 (predicates broadcast them)."""
    return start + jax.lax.broadcasted_iota(jnp.int32, (n, 1) if axis == 0 else (1, n), axis)


def partial_tail(tokens: int, block: int):
    """`tokens` where a tiling of them in blocks of `block` ends in a partial block (whose VMEM tail
    holds unspecified values), else None: what `real_part` and the tile bodies take, known when tracing."""
    return tokens if tokens % block else None


def real_part(x, start, tokens, *, axis: int = 0, fill: float = 0.0):
    """`x` with its entries at token ids `tokens` and beyond set to `fill`: x holds the tokens `start
    ... start + x.shape[axis] - 1` along `axis`. A select on a loaded value: the input block itself is
    never written (writing an input block's tail corrupted the kernel's state on a real TPU; module
    docstring). `tokens` None (no partial block on that axis, `partial_tail`) returns x: nothing is
    emitted. Fill +inf for the backward's log-sum-exp makes p exactly 0 there."""
    if tokens is None:
        return x
    return jnp.where(token_ids(start, x.shape[axis], axis) < tokens, x, jnp.asarray(fill, x.dtype))


def init_state(m_ref, l_ref, acc_ref, flag_ref=None):
    m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    if flag_ref is not None:
        flag_ref[0] = UNDECIDED  # every query tile starts with the running max


def finish(m_ref, l_ref, acc_ref, o_ref, interpret=False, lse_ref=None):
    # A row whose max never rose above MASK_VALUE saw no kept key: it gets zeros, like the
    # reference, instead of the average of masked values.
    # (m is the running max or the bound; a query tile switches to the bound only once every row
    # has seen a kept key, so the test holds for both.) l is summed across its lanes here, once.
    # NaN is let through: a kept NaN score (a NaN in q_i or in a kept k_j) makes m or l NaN, and
    # such a row counts as seen (NaN <= x is False; NaN l is tested too, should a max drop NaN),
    # so its output is acc / l = NaN; a NaN in v reaches acc through p @ v. A row that saw no kept
    # key never has a NaN score (all masked), so it still gets exact zeros. Finite rows: unchanged.
    head_dim = acc_ref.shape[1]
    m = m_ref[...]
    row_sum = jnp.broadcast_to(jnp.sum(l_ref[...], axis=1, keepdims=True), m.shape)  # [block_q, 128]
    l = _lanes(row_sum, head_dim, interpret)
    seen = jnp.logical_not(_lanes(m, head_dim, interpret) <= 0.5 * MASK_VALUE) | jnp.isnan(l)
    o_ref[...] = jnp.where(seen, acc_ref[...] / jnp.where(seen, l, 1.0), 0.0).astype(o_ref.dtype)
    if lse_ref is not None:
        # log-sum-exp of each row's kept scores, for the backward to rebuild p: +inf for a row with no
        # kept key (exp(s - lse) is exactly 0 there), NaN for a NaN row (the floor below is a select, not
        # a max, so NaN l passes it). One value per row: the lane-replicated column, transposed once per
        # query tile, gives the `[1, block_q]` row both backward passes read. A TPU's float32 log errs by
        # up to ~1e-4 (its exp by a few 1e-6 relative), and an lse off by e scales every rebuilt p by
        # exp(-e): one Newton step on exp(y) = l, through the more exact exp, takes the log to exp's accuracy.
        seen_rows = jnp.logical_not(m <= 0.5 * MASK_VALUE) | jnp.isnan(row_sum)      # [block_q, 128]
        total = jnp.where(row_sum < 1e-30, 1e-30, row_sum)
        log_l = jnp.log(total)
        log_l = log_l + (total * jnp.exp(-log_l) - 1.0)
        lse = jnp.where(seen_rows, m + log_l, jnp.inf)
        lse_ref[...] = jnp.transpose(lse)[:1, :]


def _output_blocks(q, block_q, index_map, residuals):
    """`[(ShapeDtypeStruct, BlockSpec)]` of the output `[heads, tokens, head_dim]` and, with `residuals`, the
    per-row log-sum-exp `[heads, 1, tokens]` f32, one value per query row, the layout the backward's
    kernels read (a row that broadcasts down sublanes)."""
    heads, tokens, head_dim = q.shape
    shaped = [(jax.ShapeDtypeStruct(q.shape, q.dtype), pl.BlockSpec((None, block_q, head_dim), index_map))]
    if residuals:
        shaped.append((jax.ShapeDtypeStruct((heads, 1, tokens), jnp.float32), row_block(index_map, block_q)))
    return shaped


def softmax_scratch(block_q, head_dim, bounded=False):
    state = [pltpu.VMEM((block_q, LANES), jnp.float32),   # m: running max (or the bound)
             pltpu.VMEM((block_q, LANES), jnp.float32),   # l: running sum, per-lane partial sums
             pltpu.VMEM((block_q, head_dim), jnp.float32)]  # acc: unnormalised output
    return state + [pltpu.SMEM((1,), jnp.int32)] if bounded else state  # flag: switched to the bound


def compiler_params(vmem_limit_bytes):
    # heads and query tiles are independent; the kv axis carries the softmax state
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                vmem_limit_bytes=vmem_limit_bytes)


# -- dense ---------------------------------------------------------------------------------

def dense_flash_attention(q, k, v, *, block_q, block_kv, block_kv_compute, interpret,
                          vmem_limit_bytes=None, residuals=False):
    """Dense flash attention: every (query tile, key tile) pair, the block-sparse kernels' tile step
    walking every key tile in order (`grid.DenseSchedule`: from the program ids, no tables).

    Only the last key tile can reach past the keys' end, so only it masks (`k < tokens`).
    The test is made at run time even when there is no padding: a branch known at trace
    time would be folded away, and the interpreter's copies with it (see the tile body).
    With `residuals`, returns `(out, lse)`, lse f32 `[heads, 1, q tokens]` for the backward.
    """
    tokens = k.shape[1]
    plan = DenseSchedule(-(-q.shape[1] // block_q), -(-tokens // block_kv), block_kv, tokens)
    return _flash_call(q, k, v, plan, TileSizes(block_q, block_kv, block_kv_compute), METHODS["dense"],
                       (lambda q_ids, k_ids: k_ids < tokens,), interpret=interpret,
                       vmem_limit_bytes=vmem_limit_bytes, residuals=residuals, name="dense_flash_attention")


# -- block-sparse: B1, B2, B3 ---------------------------------------------------------------

def block_sparse_attention(q, k, v, head_kind, schedule, *, steps, method, keep, block_q, block_kv,
                           block_kv_compute, interpret, vmem_limit_bytes=None, residuals=False, head_order=None,
                           hooks=None, pieces=None):
    """B1 / B2 / B3 over a planner schedule, as `method`'s record (`methods.METHODS`) runs its steps.

    schedule: int32 `[ceil(kinds * nq * steps / 2)]` from the planner (`TilePlan.schedule`,
    or `extensions.stacked_schedules` for several masks): one 16-bit entry per grid step, the key tile to
    fetch and its class, two entries to a word; `steps` grid steps per query tile. head_kind:
    int32 `[heads]`, which of the `kinds` schedules (and predicates) head h follows; all zeros
    for one mask. Both are scalar-prefetched into SMEM so the index maps can read them. Grid
    step (h, i, s) fetches the key tile of its entry; idle steps (class EMPTY) open a row on its
    first tile, so the pipeline copies it once, as the row above computes. `keep(q_ids, k_ids)` is the
    elementwise predicate for masked tiles (the exact mask for B1/B2, padding only for B3), or
    a tuple of them, one per kind. With `residuals`, returns `(out, lse)`, lse f32
    `[heads, 1, q tokens]` for the backward (svg_lib.kernels.backward).

    head_order: None, or int32 `[heads]`, a permutation, scalar-prefetched too: grid row h runs head
    `head_order[h]`, reading that head's q, k, v and writing its output in place. A megacore chip
    splits the grid's head rows into contiguous halves between its two cores; the routed layer
    gives an order that balances the kinds between them (`routing.balanced_order`) without
    moving any array.

    The grid, the schedule's decoding and the choice of body per step are `grid.tile_step_call`'s;
    this kernel brings the online-softmax tile with its bounded max, its start and its finish.
    `hooks` (`grid.Hooks`, e.g. the observed forward's tile masses) append their outputs after these.
    `pieces` (`grid.Pieces`): an index map, a step or a tile body to run in place of the library's; a
    replaced tile body runs with the running max only (the bounded max would make its rescaling moot).
    """
    record = check_record(method, PLANNED_METHODS, what="block-sparse method")
    keeps = keep if isinstance(keep, tuple) else (keep,)
    plan = Schedule.checked(q.shape, head_kind, schedule, steps=steps, kinds=len(keeps), block_q=block_q,
                            head_order=head_order)
    name = f"{record.stage}_{'' if hooks is None else hooks.name + '_'}block_sparse_attention"
    return _flash_call(q, k, v, plan, TileSizes(block_q, block_kv, block_kv_compute), record, keeps,
                       interpret=interpret, vmem_limit_bytes=vmem_limit_bytes, residuals=residuals, hooks=hooks,
                       pieces=pieces, name=name)


def _flash_call(q, k, v, plan, sizes, record, keeps, *, interpret, vmem_limit_bytes, residuals, name, hooks=None,
                pieces=None):
    """The online-softmax forward over `plan` (a `grid.Schedule` or `grid.DenseSchedule`): the tile step's
    `pallas_call` (`grid.tile_step_call`) given the tile body with its bounded max, its start and its finish."""
    pieces = Pieces() if pieces is None else pieces
    block_q, block_kv, block_kv_compute = sizes.block_q, sizes.block_kv, sizes.block_kv_compute
    q_tokens, tokens = q.shape[1], k.shape[1]
    on_cpu = plain_interpreter(interpret)
    unrolled = unrolled_bodies(sizes, len(keeps), mask_free=record.mask_free_body)

    def tile(wrap, step):
        """`run(keep)`: this step's tile body under the bounded max (`visit`)."""
        r = step.refs
        body = functools.partial(online_softmax_tile if wrap is None else wrap(online_softmax_tile),
                                 r["q_ref"], r["k_ref"], r["v_ref"], r["m_ref"], r["l_ref"], r["acc_ref"],
                                 q_start=step.i * block_q, k_start=step.kv_tile * block_kv,
                                 block_kv_compute=block_kv_compute, interpret=on_cpu,
                                 kv_tokens=partial_tail(tokens, block_kv), unrolled=unrolled)
        if pieces.body is not None:
            return lambda keep: body(keep=keep, bounded=False)
        begin = functools.partial(start_bound, r["q_ref"], r["m_ref"], r["key_norm_ref"][step.head])
        check = functools.partial(check_bound, r["m_ref"], r["l_ref"], r["acc_ref"], r["flag_ref"],
                                  threshold=block_kv * math.exp(-BOUND_SLACK), q_start=step.i * block_q,
                                  q_tokens=partial_tail(q_tokens, block_q))
        return lambda keep: visit(body, keep, r["flag_ref"], begin, check)

    def start(step):
        init_state(*(step.refs[n] for n in ("m_ref", "l_ref", "acc_ref", "flag_ref")))

    def finish_tile(step):
        r = step.refs
        finish(r["m_ref"], r["l_ref"], r["acc_ref"], r["o_ref"], on_cpu, r["lse_ref"])

    outs = tile_step_call(
        plan, sizes, q_shape=q.shape, tile=tile, start=start, finish=finish_tile,
        method=record, keeps=keeps,
        inputs=("q", "k", "v", "key_norm"), operands=(q, k, v, key_norm_max(k)),
        extra_in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],  # [heads] f32 key-norm maxima
        outputs=("o", ("lse", residuals)), out_shapes=lambda q_map: _output_blocks(q, block_q, q_map, residuals),
        scratch=("m", "l", "acc", "flag"), scratch_shapes=softmax_scratch(block_q, q.shape[2], bounded=True),
        hooks=hooks, pieces=pieces, compiler_params=compiler_params(vmem_limit_bytes), interpret=interpret,
        name=name)
    return outs[0] if len(outs) == 1 else tuple(outs)
