"""The backward pass: gradients of q, k and v through the series' kernels, in Pallas.

With `s = q k^T` (q pre-scaled), `p = exp(s - lse)` the attention weights rebuilt from the
forward's per-row log-sum-exp `lse`, output `o = p v` and incoming gradient `do`:

    dv = p^T do        dp = do v^T        ds = p * (dp - D),  D = rowsum(do * o)
    dq = ds k          dk = ds^T q

(FlashAttention-2's backward). dq sums over key tiles, so its kernel walks the forward's
schedule: per query tile, the key tiles to visit. dk and dv sum over *query* tiles, so their
kernel walks the transposed schedule: per key tile, the query tiles that visit it
(`TilePlan.transposed_tables`). Both visit exactly the forward's non-empty tiles, FULL tiles
mask-free, PARTIAL tiles masked by the same predicate, idle steps on the resident block.

The dk/dv kernel computes its tile transposed (`s^T = k q^T`, `[block_kv_compute, block_q]`):
its accumulators are per key, so keys on rows keeps every matmul in the MXU's plain form, and
the per-query `lse` and `D` arrive as rows `[1, block_q]` that broadcast down sublanes for
free. The dq kernel keeps queries on rows like the forward and reads the same rows, turned
into columns (cheaper by the compiler's profile than lane-replicated blocks; see `_dq_tile`).

Arrays here are padded like the forward's: q `[heads, nq * block_q, head_dim]` (pre-scaled),
k, v `[heads, nk * block_kv, head_dim]`. Padded key columns are masked as in the forward;
padded query rows carry `do = 0`, so they add nothing to dk or dv.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib.core.planner import CLASS_BITS, EMPTY, FULL, PARTIAL, STEP_BITS, KernelTables
from svg_lib.kernels.forward import MASK_VALUE, MAX_UNROLLED_CHUNKS, NN, NT, _compiler_params, _dot


def _token_ids(start, n, axis):
    """Global token indices `start ... start + n - 1` laid along `axis` of a 2-D array:
    a column `[n, 1]` for axis 0, a row `[1, n]` for axis 1 (predicates broadcast them)."""
    return start + jax.lax.broadcasted_iota(jnp.int32, (n, 1) if axis == 0 else (1, n), axis)


def _dq_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_acc, *, keep, q_start, k_start,
             block_kv_compute):
    """Add one key tile's share of dq to `dq_acc` `[block_q, head_dim]` f32.

    q_ref, do_ref `[block_q, head_dim]`; k_ref, v_ref `[block_kv, head_dim]`; lse_ref, di_ref
    `[1, block_q]` f32 rows, turned into columns once per chunk. (Blocks `[block_q, 128]`
    replicated over lanes, like the forward's m and l, cost 37 % more cycles per step by the
    TPU compiler's static profile: 1,258 against 919 at 512 x 256, v6e, libtpu 0.0.42.1.)
    `keep` as in the forward's tile body.
    """
    block_q = q_ref.shape[0]

    def chunk(c, carry):
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k, v = k_ref[ks, :], v_ref[ks, :]
        s = _dot(q_ref[...], k, NT)                                  # [block_q, bkc]
        if keep is not None:
            q_ids, k_ids = _token_ids(q_start, block_q, 0), _token_ids(k_start + c * block_kv_compute,
                                                                       block_kv_compute, 1)
            s = jnp.where(keep(q_ids, k_ids), s, MASK_VALUE)
        p = jnp.exp(s - jnp.expand_dims(lse_ref[0], -1))
        dp = _dot(do_ref[...], v, NT)                                # [block_q, bkc]
        ds = p * (dp - jnp.expand_dims(di_ref[0], -1))
        dq_acc[...] += _dot(ds.astype(k.dtype), k, NN)               # [block_q, head_dim]
        return carry

    chunks = k_ref.shape[0] // block_kv_compute
    jax.lax.fori_loop(0, chunks, chunk, None, unroll=chunks <= MAX_UNROLLED_CHUNKS)


def _dkv_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, *, keep, q_start, k_start,
              block_kv_compute):
    """Add one query tile's share of dk and dv to `dk_acc`, `dv_acc` `[block_kv, head_dim]` f32.

    Computed transposed, keys on rows: lse_ref, di_ref are rows `[1, block_q]` f32.
    """
    block_q = q_ref.shape[0]

    def chunk(c, carry):
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k, v, q, do = k_ref[ks, :], v_ref[ks, :], q_ref[...], do_ref[...]
        s_t = _dot(k, q, NT)                                         # [bkc, block_q]
        if keep is not None:
            q_ids, k_ids = _token_ids(q_start, block_q, 1), _token_ids(k_start + c * block_kv_compute,
                                                                       block_kv_compute, 0)
            s_t = jnp.where(keep(q_ids, k_ids), s_t, MASK_VALUE)
        p_t = jnp.exp(s_t - lse_ref[...])
        dv_acc[ks, :] += _dot(p_t.astype(do.dtype), do, NN)          # [bkc, head_dim]
        dp_t = _dot(v, do, NT)                                       # [bkc, block_q]
        ds_t = p_t * (dp_t - di_ref[...])
        dk_acc[ks, :] += _dot(ds_t.astype(q.dtype), q, NN)           # [bkc, head_dim]
        return carry

    chunks = k_ref.shape[0] // block_kv_compute
    jax.lax.fori_loop(0, chunks, chunk, None, unroll=chunks <= MAX_UNROLLED_CHUNKS)


def _visit(stage, cls, tile):
    """Run `tile(masked)` for a step of class `cls`, the forward's way for `stage`."""
    if stage == "b1":  # every visited tile masks
        pl.when(cls != EMPTY)(functools.partial(tile, True))
    else:              # B2, B3 (and dense): FULL tiles mask-free
        pl.when(cls == FULL)(functools.partial(tile, False))
        pl.when(cls == PARTIAL)(functools.partial(tile, True))


def _step_reader(steps):
    """`step_at(schedule_ref, row, s) -> (tile, class)` for a packed one-kind schedule of `steps` per row."""
    def step_at(schedule_ref, row, s):
        n = row * steps + s
        entry = (schedule_ref[n >> 1] >> (STEP_BITS * (n & 1))) & 0xFFFF
        return entry >> CLASS_BITS, entry & ((1 << CLASS_BITS) - 1)
    return step_at


def _check_schedule(name, schedule, rows, steps):
    words = -(-rows * steps // 2)
    if tuple(schedule.shape) != (words,):
        raise ValueError(f"{name} must be int32 [{words}] for {rows} rows x {steps} steps "
                         f"(planner.pack_schedule), got {tuple(schedule.shape)}")


def attention_dq(q, k, v, do, lse_rows, di_rows, schedule, *, steps, stage, keep, block_q, block_kv, block_kv_compute,
                 interpret, vmem_limit_bytes=None):
    """dq `[heads, nq_pad, head_dim]` (w.r.t. the pre-scaled q) over the forward's schedule.

    lse_rows, di_rows: f32 `[heads, 1, nq_pad]`, the forward's log-sum-exp and rowsum(do * o).
    schedule: the forward's packed table, `[ceil(nq * steps / 2)]`.
    """
    heads, nq_pad, head_dim = q.shape
    nq = nq_pad // block_q
    _check_schedule("the forward schedule", schedule, nq, steps)
    step_at = _step_reader(steps)

    def kernel(schedule_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_ref, dq_acc):
        i, s = pl.program_id(1), pl.program_id(2)
        kv_tile, cls = step_at(schedule_ref, i, s)

        @pl.when(s == 0)
        def _():
            dq_acc[...] = jnp.zeros(dq_acc.shape, jnp.float32)

        def tile(masked):
            _dq_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_acc, keep=keep if masked else None,
                     q_start=i * block_q, k_start=kv_tile * block_kv, block_kv_compute=block_kv_compute)
        _visit(stage, cls, tile)

        @pl.when(s == steps - 1)
        def _():
            dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)

    def q_map(h, i, s, schedule_ref):
        return h, i, 0

    def kv_map(h, i, s, schedule_ref):
        return h, step_at(schedule_ref, i, s)[0], 0

    row = pl.BlockSpec((None, block_q, head_dim), q_map)
    kv = pl.BlockSpec((None, block_kv, head_dim), kv_map)
    per_query = pl.BlockSpec((None, 1, block_q), lambda h, i, s, schedule_ref: (h, 0, i))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(heads, nq, steps),
            in_specs=[row, kv, kv, row, per_query, per_query], out_specs=row,
            scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=_compiler_params(vmem_limit_bytes),
        interpret=interpret,
        name=f"{stage}_attention_dq",
    )(schedule, q, k, v, do, lse_rows, di_rows)


def attention_dkv(q, k, v, do, lse_rows, di_rows, schedule_t, *, steps_t, stage, keep, block_q, block_kv,
                  block_kv_compute, interpret, vmem_limit_bytes=None):
    """(dk, dv), each `[heads, nk_pad, head_dim]`, over the transposed schedule.

    lse_rows, di_rows: f32 `[heads, 1, nq_pad]`. schedule_t: `TilePlan.transposed_schedule`,
    `[ceil(nk * steps_t / 2)]`: per key tile, the query tiles to visit.
    """
    heads, nk_pad, head_dim = k.shape
    nk = nk_pad // block_kv
    _check_schedule("the transposed schedule", schedule_t, nk, steps_t)
    step_at = _step_reader(steps_t)

    def kernel(schedule_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_ref, dv_ref, dk_acc, dv_acc):
        j, s = pl.program_id(1), pl.program_id(2)
        q_tile, cls = step_at(schedule_ref, j, s)

        @pl.when(s == 0)
        def _():
            dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

        def tile(masked):
            _dkv_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, keep=keep if masked else None,
                      q_start=q_tile * block_q, k_start=j * block_kv, block_kv_compute=block_kv_compute)
        _visit(stage, cls, tile)

        @pl.when(s == steps_t - 1)
        def _():
            dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
            dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

    def kv_map(h, j, s, schedule_ref):
        return h, j, 0

    def q_map(h, j, s, schedule_ref):
        return h, step_at(schedule_ref, j, s)[0], 0

    row = pl.BlockSpec((None, block_q, head_dim), q_map)
    kv = pl.BlockSpec((None, block_kv, head_dim), kv_map)
    per_query = pl.BlockSpec((None, 1, block_q), lambda h, j, s, schedule_ref: (h, 0, q_map(h, j, s, schedule_ref)[1]))
    out = jax.ShapeDtypeStruct(k.shape, k.dtype)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(heads, nk, steps_t),
            in_specs=[row, kv, kv, row, per_query, per_query], out_specs=[kv, kv],
            scratch_shapes=[pltpu.VMEM((block_kv, head_dim), jnp.float32)] * 2),
        out_shape=[out, out],
        compiler_params=_compiler_params(vmem_limit_bytes),
        interpret=interpret,
        name=f"{stage}_attention_dkv",
    )(schedule_t, q, k, v, do, lse_rows, di_rows)


def with_backward(forward, tables: KernelTables, *, backward_limits, stage, keep, block_q, block_kv,
                  block_kv_compute, interpret):
    """`run(q, k, v)` on padded, pre-scaled arrays, differentiable by `jax.grad`.

    `forward(q, k, v, residuals)` returns the output, or `(out, lse)` with `residuals=True`.
    `tables`: the tiles the forward visits, as the planner packed them (`TilePlan.tables`, or
    `kernel_tables(dense_classes(...))`): `attention_dq` runs over `tables.schedule`,
    `attention_dkv` over `tables.schedule_t`. `backward_limits() -> (dq, dkv)` gives their VMEM
    limits (`MemoryBudget.backward_limits`); it is called when a gradient is traced, so blocks
    whose backward does not fit refuse there and a forward-only caller never meets it.
    """
    schedule, schedule_t = jnp.asarray(tables.schedule), jnp.asarray(tables.schedule_t)
    common = dict(stage=stage, keep=keep, block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute,
                  interpret=interpret)

    @jax.custom_vjp
    def run(q, k, v):
        return forward(q, k, v, False)

    def run_fwd(q, k, v):
        out, lse = forward(q, k, v, True)
        return out, (q, k, v, out, lse)

    def run_bwd(res, do):
        q, k, v, out, lse = res
        dq_limit, dkv_limit = backward_limits()
        do = do.astype(q.dtype)
        di = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)[:, None]  # [heads, 1, nq_pad]
        dq = attention_dq(q, k, v, do, lse, di, schedule, steps=tables.steps, vmem_limit_bytes=dq_limit,
                          **common)
        dk, dv = attention_dkv(q, k, v, do, lse, di, schedule_t, steps_t=tables.steps_t,
                               vmem_limit_bytes=dkv_limit, **common)
        return dq, dk, dv

    run.defvjp(run_fwd, run_bwd)
    return run
