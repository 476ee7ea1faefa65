"""The backward pass: gradients of q, k and v through the series' kernels, in Pallas.

With `s = q k^T` (q pre-scaled), `p = exp(s - lse)` the attention weights rebuilt from the
forward's per-row log-sum-exp `lse`, output `o = p v` and incoming gradient `do`:

    dv = p^T do        dp = do v^T        ds = p * (dp - D),  D = rowsum(do * o)
    dq = ds k          dk = ds^T q

(FlashAttention-2's backward). dk and dv sum over *query* tiles, so the backward walks the
transposed schedule: per key tile, the query tiles that visit it (`TilePlan.transposed_tables`),
accumulating dk and dv in scratch over a key tile's row of steps. dq sums over key tiles, across
those rows, and comes in one of two forms:

    fused   `attention_fused`: one kernel; one head's whole dq stays in VMEM (f32) from the head's
            first step to its last, each tile adds its share to its query tile's rows, and p and ds
            are computed once per tile for all three gradients. The default where that dq fits.
    split   `attention_dq` walks the forward's schedule for dq, `attention_dkv` the transposed one
            for dk and dv; each rebuilds p. Where a head's dq does not fit in VMEM (1440p).

Either visits exactly the forward's non-empty tiles, FULL tiles mask-free, PARTIAL tiles masked by
the same predicate, idle steps first on a row's first block; dense takes its tiles from program ids.
The simulated cost per tile of each form, beside Splash's backward and the fused tile's five matmuls
alone, is `svg_lib/data/backward_cost_reference.json` (the TPU compiler's static profile,
`svg_lib.instruments.tpu.cost.backward_tile_cost`; `python -m svg_lib cost --backward`, notebook 11).

The dk/dv and fused kernels compute their tile transposed (`s^T = k q^T`, `[block_kv_compute,
block_q]`): their accumulators are per key, so keys on rows keeps four of the five matmuls in the
MXU's plain form (dq's takes `ds^T` turned back, `TN`), and the per-query `lse` and `D` arrive as
rows `[1, block_q]` that broadcast down sublanes for free. The dq kernel keeps queries on rows like
the forward and reads the same rows, turned into columns (cheaper by the compiler's profile than
lane-replicated blocks; see `_dq_tile`).

NaN passes through as in the forward: a row whose forward met a kept NaN score has a NaN lse, so its
p = exp(s - lse) is NaN across every tile the row computes (masked pairs too), and a NaN in v, q or k
reaches the gradients through the tiles' matmuls (0 * NaN = NaN); nothing here tests for it.

Arrays here are not padded, like the forward's: q, do `[heads, tokens, head_dim]` (q pre-scaled),
k, v the same, lse and D `[heads, 1, tokens]`. The part of a last, partial block past the end holds
unspecified values; as in the forward, no input block is written, and the tail is neutralised where it
is read (`forward.real_part`, a select on the loaded value): a masked tile (every tile that reaches key
padding is one) zeroes k and v past the end, and the transposed bodies, whose dk and dv sum over query
rows, zero q and do past the end and read lse as +inf (p exactly 0) and D as 0 there, in every tile of
a problem whose last query tile is partial. Key columns past the end are masked as in the forward;
query rows past it add nothing to dk or dv, and their dq rows are never written.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib.core.planner import KernelTables
from svg_lib.kernels.forward import MASK_VALUE, MAX_UNROLLED_CHUNKS, NN, NT, dot, partial_tail, real_part, token_ids
from svg_lib.kernels.grid import (DenseKeyMajor, DenseSchedule, KeyMajor, Schedule, ScheduleRows, TileSizes, dispatch,
                                  library_grid_spec, row_block)
from svg_lib.kernels.refs import KernelRefs
from svg_lib.methods import check_record

TN = (((0,), (0,)), ((), ()))  # dot_general dimensions of a^T @ b: contract both operands' first dims


def _real_keys(k, v, first, kv_tokens):
    """A masked slice's k and v `[block_kv_compute, head_dim]` (keys `first` on) with the rows past the
    keys' end zeroed: ds is 0 there, but 0 * NaN is NaN in the matmuls that meet k and v."""
    return real_part(k, first, kv_tokens), real_part(v, first, kv_tokens)


def _dq_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_acc, *, keep, q_start, k_start,
             block_kv_compute, kv_tokens=None):
    """Add one key tile's share of dq to `dq_acc` `[block_q, head_dim]` f32.

    q_ref, do_ref `[block_q, head_dim]`; k_ref, v_ref `[block_kv, head_dim]`; lse_ref, di_ref
    `[1, block_q]` f32 rows, turned into columns once per chunk. (Blocks `[block_q, 128]`
    replicated over lanes, like the forward's m and l, cost more cycles per step by the TPU
    compiler's static profile: CONTRIBUTING.md, "Measurements behind the kernels".)
    `keep` and `kv_tokens` as in the forward's tile body: a masked tile zeroes k and v past the
    end (ds is 0 there, but 0 * NaN is NaN). Query rows past the end only reach their own dq rows,
    which are never written.
    """
    block_q = q_ref.shape[0]

    def chunk(c, carry):
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k, v = k_ref[ks, :], v_ref[ks, :]
        if keep is not None and kv_tokens is not None:
            k, v = _real_keys(k, v, k_start + c * block_kv_compute, kv_tokens)
        s = dot(q_ref[...], k, NT)                                  # [block_q, bkc]
        if keep is not None:
            q_ids, k_ids = token_ids(q_start, block_q, 0), token_ids(k_start + c * block_kv_compute,
                                                                       block_kv_compute, 1)
            s = jnp.where(keep(q_ids, k_ids), s, MASK_VALUE)
        p = jnp.exp(s - jnp.expand_dims(lse_ref[0], -1))
        dp = dot(do_ref[...], v, NT)                                # [block_q, bkc]
        ds = p * (dp - jnp.expand_dims(di_ref[0], -1))
        dq_acc[...] += dot(ds.astype(k.dtype), k, NN)               # [block_q, head_dim]
        return carry

    chunks = k_ref.shape[0] // block_kv_compute
    jax.lax.fori_loop(0, chunks, chunk, None, unroll=chunks <= MAX_UNROLLED_CHUNKS)  # two small bodies


def _dkv_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, *, keep, q_start, k_start,
              block_kv_compute, dq_acc=None, q_tokens=None, kv_tokens=None):
    """Add one query tile's share of dk and dv to `dk_acc`, `dv_acc` `[block_kv, head_dim]` f32,
    and with `dq_acc` (the fused backward) that key tile's share of dq to `dq_acc` `[block_q, head_dim]` f32.

    Computed transposed, keys on rows: lse_ref, di_ref are rows `[1, block_q]` f32. The fused
    backward's one extra line is dq's matmul, `ds^T` turned back (`TN`): p and ds are computed
    once per tile for all three gradients, where the two-kernel form computes them twice.
    `q_tokens`, `kv_tokens`: None, or the token counts where the last query (key) tile is partial.
    dk and dv sum over the query rows, so rows past the end are neutralised in every tile (q and do
    zero, lse +inf, D zero: p and ds are exactly 0 there); a masked tile zeroes k and v past the end.
    """
    block_q = q_ref.shape[0]

    def chunk(c, carry):
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k, v, q, do = k_ref[ks, :], v_ref[ks, :], q_ref[...], do_ref[...]
        if q_tokens is not None:
            q, do = real_part(q, q_start, q_tokens), real_part(do, q_start, q_tokens)
        if keep is not None and kv_tokens is not None:
            k, v = _real_keys(k, v, k_start + c * block_kv_compute, kv_tokens)
        s_t = dot(k, q, NT)                                         # [bkc, block_q]
        if keep is not None:
            q_ids, k_ids = token_ids(q_start, block_q, 1), token_ids(k_start + c * block_kv_compute,
                                                                       block_kv_compute, 0)
            s_t = jnp.where(keep(q_ids, k_ids), s_t, MASK_VALUE)
        p_t = jnp.exp(s_t - real_part(lse_ref[...], q_start, q_tokens, axis=1, fill=jnp.inf))  # lse: [1, block_q]
        dv_acc[ks, :] += dot(p_t.astype(do.dtype), do, NN)          # [bkc, head_dim]
        dp_t = dot(v, do, NT)                                       # [bkc, block_q]
        ds_t = (p_t * (dp_t - real_part(di_ref[...], q_start, q_tokens, axis=1))).astype(q.dtype)
        dk_acc[ks, :] += dot(ds_t, q, NN)                           # [bkc, head_dim]
        if dq_acc is not None:
            dq_acc[...] += dot(ds_t, k, TN)                         # [block_q, head_dim]
        return carry

    chunks = k_ref.shape[0] // block_kv_compute
    jax.lax.fori_loop(0, chunks, chunk, None, unroll=chunks <= MAX_UNROLLED_CHUNKS)  # two small bodies


def _step(method, cls, tile, s, last, accs, outs):
    """One grid step of a backward kernel: the f32 accumulators `accs` zeroed at a row's first step (`s == 0`),
    `tile(masked)` run for a step of class `cls` the forward's way for `method` (a record) (`grid.dispatch`),
    and each accumulator written to its output block of `outs` at the row's last step (`s == last`)."""
    @pl.when(s == 0)
    def _():
        for acc in accs:
            acc[...] = jnp.zeros(acc.shape, jnp.float32)

    dispatch(cls, functools.partial(tile, False), functools.partial(tile, True), method=method)

    @pl.when(s == last)
    def _():
        for acc, out in zip(accs, outs):
            out[...] = acc[...].astype(out.dtype)


def _call(schedule, kernel, operands, sizes, *, outputs, out_shape, out_specs, scratch, scratch_shapes, semantics,
          vmem_limit_bytes, interpret, name):
    """A backward `pallas_call` walking `schedule` (`grid`'s), laid out as the forward's (`library_grid_spec`):
    of `operands`, q and do in `[block_q, head_dim]` blocks by its `q_map`, k and v `[block_kv, head_dim]`
    by its `kv_map`, lse and D in `[1, block_q]` rows of that query tile. `kernel(h, i, s, tile, cls, ins,
    **refs)` runs grid step (h, i, s): `(tile, cls)` its entry, `ins` the six input refs, then the output and
    scratch refs by the names `outputs` and `scratch` give; `out_specs(q_block, kv_block)` -> the outputs' blocks."""
    refs = KernelRefs(prefetch=schedule.prefetch, inputs=_INPUTS, outputs=outputs, scratch=scratch)
    q_map, kv_map = refs.index_map(schedule.q_map), refs.index_map(schedule.kv_map)
    q_block, kv_block = (pl.BlockSpec((None, rows, operands[0].shape[2]), index_map)
                         for rows, index_map in ((sizes.block_q, q_map), (sizes.block_kv, kv_map)))

    def step(**named):
        h, i, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        entry = schedule.entry(h, i, s, **{n: named.pop(n) for n in _TABLES})
        kernel(h, i, s, *entry, [named.pop(f"{n}_ref") for n in _INPUTS], **named)

    return pl.pallas_call(
        refs.kernel(step),
        grid_spec=library_grid_spec(schedule, sizes, q_shape=operands[0].shape, q_map=q_map, kv_map=kv_map,
                                    extra_in_specs=[q_block] + [row_block(q_map, sizes.block_q)] * 2,
                                    out_specs=out_specs(q_block, kv_block), scratch_shapes=scratch_shapes),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret, name=name)(*schedule.tables, *operands)


_TABLES, _INPUTS = ("head_kind_ref", "schedule_ref", "head_order_ref"), ("q", "k", "v", "do", "lse", "di")
# heads and the grid's rows are independent; the last axis carries an accumulator
_SPLIT_SEMANTICS = ("parallel", "parallel", "arbitrary")


def attention_dq(q, k, v, do, lse_rows, di_rows, schedule, *, steps, method, keep, block_q, block_kv, block_kv_compute,
                 interpret, vmem_limit_bytes=None):
    """dq `[heads, tokens, head_dim]` (w.r.t. the pre-scaled q) over the forward's schedule.

    lse_rows, di_rows: f32 `[heads, 1, tokens]`, the forward's log-sum-exp and rowsum(do * o).
    schedule: the forward's packed table, `[ceil(nq * steps / 2)]`; None for dense (every key
    tile, `steps` = nk, the one reaching past the end masked).
    """
    tokens, nq = k.shape[1], -(-q.shape[1] // block_q)
    walk = (DenseSchedule(nq, steps, block_kv, tokens) if schedule is None
            else Schedule(None, ScheduleRows.checked("the forward schedule", schedule, rows=nq, steps=steps), nq))

    def kernel(h, i, s, kv_tile, cls, ins, dq_ref, dq_acc_ref):
        def tile(masked):
            _dq_tile(*ins, dq_acc_ref, keep=keep if masked else None, q_start=i * block_q,
                     k_start=kv_tile * block_kv, block_kv_compute=block_kv_compute,
                     kv_tokens=partial_tail(tokens, block_kv))
        _step(method, cls, tile, s, steps - 1, [dq_acc_ref], [dq_ref])

    return _call(walk, kernel, (q, k, v, do, lse_rows, di_rows), TileSizes(block_q, block_kv, block_kv_compute),
                 outputs=("dq",), out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
                 out_specs=lambda q_block, _: q_block, scratch=("dq_acc",),
                 scratch_shapes=[pltpu.VMEM((block_q, q.shape[2]), jnp.float32)], semantics=_SPLIT_SEMANTICS,
                 vmem_limit_bytes=vmem_limit_bytes, interpret=interpret, name=f"{method.stage}_attention_dq")


def _key_major(schedule_t, steps_t, block_kv, tokens):
    """The dk/dv and fused kernels' walk: the transposed schedule, key-major (dense: every query tile)."""
    nk = -(-tokens // block_kv)
    if schedule_t is None:
        return DenseKeyMajor(nk, steps_t, block_kv, tokens)
    return KeyMajor(None, ScheduleRows.checked("the transposed schedule", schedule_t, rows=nk, steps=steps_t), nk)


def attention_dkv(q, k, v, do, lse_rows, di_rows, schedule_t, *, steps_t, method, keep, block_q, block_kv,
                  block_kv_compute, interpret, vmem_limit_bytes=None):
    """(dk, dv), each `[heads, tokens, head_dim]`, over the transposed schedule.

    lse_rows, di_rows: f32 `[heads, 1, tokens]`. schedule_t: `TilePlan.transposed_schedule`,
    `[ceil(nk * steps_t / 2)]`: per key tile, the query tiles to visit; None for dense (every
    query tile, `steps_t` = nq).
    """
    tokens, q_tokens, head_dim = k.shape[1], q.shape[1], k.shape[2]

    def kernel(h, j, s, q_tile, cls, ins, dk_ref, dv_ref, dk_acc_ref, dv_acc_ref):
        def tile(masked):
            _dkv_tile(*ins, dk_acc_ref, dv_acc_ref, keep=keep if masked else None, q_start=q_tile * block_q,
                      k_start=j * block_kv, block_kv_compute=block_kv_compute,
                      q_tokens=partial_tail(q_tokens, block_q), kv_tokens=partial_tail(tokens, block_kv))
        _step(method, cls, tile, s, steps_t - 1, [dk_acc_ref, dv_acc_ref], [dk_ref, dv_ref])

    out = jax.ShapeDtypeStruct(k.shape, k.dtype)
    return _call(_key_major(schedule_t, steps_t, block_kv, tokens), kernel, (q, k, v, do, lse_rows, di_rows),
                 TileSizes(block_q, block_kv, block_kv_compute), outputs=("dk", "dv"), out_shape=[out, out],
                 out_specs=lambda _, kv_block: [kv_block, kv_block], scratch=("dk_acc", "dv_acc"),
                 scratch_shapes=[pltpu.VMEM((block_kv, head_dim), jnp.float32)] * 2, semantics=_SPLIT_SEMANTICS,
                 vmem_limit_bytes=vmem_limit_bytes, interpret=interpret, name=f"{method.stage}_attention_dkv")


def fused_scratch(q_rows, block_q, block_kv, head_dim, dtype):
    """The fused kernel's VMEM scratch: one head's dq `[q_rows, head_dim]` f32, dk and dv
    `[block_kv, head_dim]` f32, a `[block_q, head_dim]` buffer of dq in the output dtype and the
    semaphore of its copies to HBM (`write_dq`)."""
    return ([pltpu.VMEM((q_rows, head_dim), jnp.float32)] + [pltpu.VMEM((block_kv, head_dim), jnp.float32)] * 2
            + [pltpu.VMEM((block_q, head_dim), dtype), pltpu.SemaphoreType.DMA(())])


def write_dq(dq_acc, dq_out, dq_hbm, sem):
    """Copy a head's finished dq, f32 `dq_acc` `[q_rows, head_dim]` in VMEM, to `dq_hbm` (that head's
    `[rows, head_dim]` in HBM, rows <= q_rows) in the output's dtype, one query tile at a time through
    `dq_out` `[block_q, head_dim]`: a cast of the whole would need a second head-sized buffer. Once
    per head, a few microseconds of DMA beside milliseconds of tiles. A last, partial tile is one
    shorter copy: DMA row counts must be whole sublane tiles, so `rows` is a multiple of 8
    (`dq_rows`)."""
    block_q = dq_out.shape[0]

    def copy(start, size):
        dq_out[...] = dq_acc[pl.ds(start, block_q), :].astype(dq_out.dtype)
        dma = pltpu.make_async_copy(dq_out.at[:size], dq_hbm.at[pl.ds(start, size), :], sem)
        dma.start()
        dma.wait()

    whole, rest = divmod(dq_hbm.shape[0], block_q)

    def tile(i, carry):
        copy(pl.multiple_of(i * block_q, block_q), block_q)
        return carry

    jax.lax.fori_loop(0, whole, tile, None)
    if rest:
        copy(whole * block_q, rest)


def dq_rows(tokens: int) -> int:
    """The fused kernel's dq rows in HBM: `tokens` rounded up to a multiple of 8, the sublane tile
    that DMA row counts must fill (`write_dq`); the rows past `tokens` are sliced off after."""
    return -(-tokens // 8) * 8


def attention_fused(q, k, v, do, lse_rows, di_rows, schedule_t, *, steps_t, method, keep, block_q, block_kv,
                    block_kv_compute, interpret, vmem_limit_bytes=None):
    """(dq, dk, dv) in one pass over the transposed schedule: p and ds once per visited tile.

    The dk/dv kernel's walk (per key tile, the query tiles that visit it) with dq added: a query
    tile's dq sums over key tiles, which this walk visits in separate grid rows, so one head's
    whole dq, f32 `[nq_pad, head_dim]`, stays in VMEM from the head's first step to its last and
    is written to HBM once, at the head's last step (`write_dq`; hence the key-tile axis is
    "arbitrary": one core walks all of a head's key tiles). Fits where one head's dq does
    (`estimate_vmem(f"{method.stage}:fused", ..., q_len=)`, which the case study's size passes at head_dim
    128); `with_backward` runs the two-kernel form where it does not.
    """
    (heads, q_tokens, head_dim), tokens = q.shape, k.shape[1]
    nq_pad, nk = -(-q_tokens // block_q) * block_q, -(-tokens // block_kv)

    def kernel(h, j, s, q_tile, cls, ins, dq_ref, dk_ref, dv_ref, dq_acc_ref, dk_acc_ref, dv_acc_ref, dq_out_ref,
               sem_ref):
        @pl.when((j == 0) & (s == 0))
        def _():
            dq_acc_ref[...] = jnp.zeros(dq_acc_ref.shape, jnp.float32)

        def tile(masked):
            rows = pl.ds(pl.multiple_of(q_tile * block_q, block_q), block_q)
            _dkv_tile(*ins, dk_acc_ref, dv_acc_ref, keep=keep if masked else None, q_start=q_tile * block_q,
                      k_start=j * block_kv, block_kv_compute=block_kv_compute, dq_acc=dq_acc_ref.at[rows, :],
                      q_tokens=partial_tail(q_tokens, block_q), kv_tokens=partial_tail(tokens, block_kv))
        _step(method, cls, tile, s, steps_t - 1, [dk_acc_ref, dv_acc_ref], [dk_ref, dv_ref])

        @pl.when((j == nk - 1) & (s == steps_t - 1))
        def _():  # the head's dq is complete; dq_ref is this call's whole dq in HBM
            write_dq(dq_acc_ref, dq_out_ref, dq_ref.at[h], sem_ref)

    out = jax.ShapeDtypeStruct(k.shape, k.dtype)
    # dq's output is pinned to HBM: left to XLA (`pl.ANY`), a small one may be placed in VMEM, and
    # the compiler's static profile cannot simulate `write_dq`'s copy then (a VMEM-to-VMEM DMA)
    dq, dk, dv = _call(_key_major(schedule_t, steps_t, block_kv, tokens), kernel, (q, k, v, do, lse_rows, di_rows),
                       TileSizes(block_q, block_kv, block_kv_compute), outputs=("dq", "dk", "dv"),
                       out_shape=[pltpu.HBM((heads, dq_rows(q_tokens), head_dim), q.dtype), out, out],
                       out_specs=lambda _, kv_block: [pl.BlockSpec(memory_space=pl.ANY), kv_block, kv_block],
                       scratch=("dq_acc", "dk_acc", "dv_acc", "dq_out", "sem"),
                       scratch_shapes=fused_scratch(nq_pad, block_q, block_kv, head_dim, q.dtype),
                       semantics=("parallel", "arbitrary", "arbitrary"), vmem_limit_bytes=vmem_limit_bytes,
                       interpret=interpret, name=f"{method.stage}_attention_fused_bwd")
    return (dq if dq.shape[1] == q_tokens else dq[:, :q_tokens]), dk, dv


def with_backward(forward, tables: KernelTables | None, *, backward_limits, method, keep, block_q, block_kv,
                  block_kv_compute, interpret):
    """`run(q, k, v)` on pre-scaled `[heads, tokens, head_dim]` arrays, differentiable by `jax.grad`.

    `forward(q, k, v, residuals)` returns the output, or `(out, lse)` with `residuals=True`.
    `tables`: the tiles the forward visits, as the planner packed them (`TilePlan.tables`): the
    backward walks `tables.schedule_t` (fused, or the dk/dv kernel) and `tables.schedule` (the dq
    kernel). None for dense, whose backward, like its forward, takes its tiles from program ids
    and masks the key tile that reaches past the end. `backward_limits() -> (form, limits)`
    says which backward runs, "fused" (`attention_fused`, limits `(fused,)`) or "split"
    (`attention_dq` then `attention_dkv`, limits `(dq, dkv)`), and with what VMEM limits
    (`MemoryBudget.backward_limits`); it is called when a gradient is traced, so blocks whose
    backward does not fit refuse there and a forward-only caller never meets it.
    """
    schedule = schedule_t = None
    if tables is not None:
        schedule, schedule_t = jnp.asarray(tables.schedule), jnp.asarray(tables.schedule_t)
    common = dict(method=check_record(method, what="backward method"), keep=keep, block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute,
                  interpret=interpret)

    @jax.custom_vjp
    def run(q, k, v):
        return forward(q, k, v, False)

    def run_fwd(q, k, v):
        out, lse = forward(q, k, v, True)
        return out, (q, k, v, out, lse)

    def run_bwd(res, do):
        q, k, v, out, lse = res
        form, limits = backward_limits()
        # dense: every key tile for each query tile's dq, every query tile for each key tile's dk, dv
        steps, steps_t = ((-(-k.shape[1] // block_kv), -(-q.shape[1] // block_q)) if tables is None
                          else (tables.steps, tables.steps_t))
        do = do.astype(q.dtype)
        di = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)[:, None]  # [heads, 1, tokens]
        if form == "fused":
            return attention_fused(q, k, v, do, lse, di, schedule_t, steps_t=steps_t, vmem_limit_bytes=limits[0],
                                   **common)
        dq = attention_dq(q, k, v, do, lse, di, schedule, steps=steps, vmem_limit_bytes=limits[0], **common)
        dk, dv = attention_dkv(q, k, v, do, lse, di, schedule_t, steps_t=steps_t, vmem_limit_bytes=limits[1],
                               **common)
        return dq, dk, dv

    run.defvjp(run_fwd, run_bwd)
    return run
