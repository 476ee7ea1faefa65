"""`attention(...)`: one entry point for every method of the series.

It validates inputs, scales q and turns the mask into the tables the chosen kernel consumes
(the planner's job). The series' kernels take any token count as it is (their last tiles are
partial, their tails neutralised where they are read: `kernels.forward.real_part`); only Splash gets copies padded to
whole tiles, and its output sliced. Built kernels are cached, so calling it twice with an
equal mask (the same one, or one built again from the same parameters: `Mask.cache_key`) and
shapes traces and plans once (`svg_lib.cache.cached_build`).

Every method works inside a caller's `jax.jit` and `jax.grad`: the kernels carry their VMEM
limits in their own pallas_calls' compiler parameters (Splash's through `splash.with_vmem_limit`),
not in compiler options of a jit of ours, which jax would refuse below a caller's jit.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from svg_lib.cache import cached_build
from svg_lib.core.masks import Mask, TileAlignedMask, check_block_size, padding_only
from svg_lib.core.planner import plan_tiles
from svg_lib.kernels.backward import with_backward
from svg_lib.kernels.forward import block_sparse_attention, dense_flash_attention
from svg_lib.kernels.reference import check_mask, check_qkv, check_shape, reference_attention
from svg_lib.kernels.splash import make_splash, splash_mask_form
from svg_lib.memory.budget import check_memory
from svg_lib.methods import METHODS as TABLE
from svg_lib.methods import check_method
from svg_lib.problem import check_block_kv_compute
from svg_lib.runtime import check_head_split, default_interpret, head_split_devices, run_split, shard_heads

METHODS = tuple(TABLE)


def b3_mask(mask: Mask, block_q: int, block_kv: int) -> TileAlignedMask:
    """The tile-aligned mask B3 computes (`mask` itself if it already is one at these blocks)."""
    return TABLE["b3"].computed_mask(mask, block_q, block_kv)


def build_attention(mask: Mask | None, *, method: str, heads: int, tokens: int, head_dim: int, dtype,
                    block_q: int, block_kv: int, block_kv_compute: int | None = None, interpret=None,
                    generation: str | None = None, devices=None, backward: str | None = None):
    """A jitted `f(q, k, v) -> out` for `[heads, tokens, head_dim]` arrays of `dtype`.

    `devices`: None runs every head on one device; two or more devices (a v7x chip's two
    TensorCores: `runtime.chip_devices`) split the heads evenly between them, each device running
    the kernels built for its share (`runtime.shard_heads`).

    `generation` ("v6e", "v5e", ...) is the TPU whose VMEM the kernel is planned for: None
    means the attached TPU, or a v6e off TPU; name one to compile for another (svg_lib.instruments.tpu.compiler).
    `backward` (dense, b1, b2, b3): which backward `jax.grad` runs, "fused" (dq, dk and dv in one
    kernel), "split" (a dq kernel and a dk/dv kernel), or None: fused where one head's dq fits in
    VMEM beside it, except with one head on a megacore v4 or v5p, where the split kernels keep both
    TensorCores busy and are faster (`memory.budget.check_memory`, `split_backward_is_faster`).

    A mask's way through here runs one way: plan once (tile classes and the forward's and
    backward's schedules, `TilePlan.tables`; Splash's mask info), check memory once on that plan
    (`memory.budget.check_memory`), then build the kernels from the tables. The returned
    function only scales q and runs the kernel (Splash's: pads and slices too).
    """
    import jax
    import jax.numpy as jnp

    heads, tokens, head_dim = check_shape(heads, tokens, head_dim)
    if devices is not None:
        devices = check_head_split(devices, heads)
        local = build_attention(mask, method=method, heads=heads // len(devices), tokens=tokens, head_dim=head_dim,
                                dtype=dtype, block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute,
                                interpret=interpret, generation=generation, backward=backward)
        return jax.jit(shard_heads(local, devices, heads))
    record = check_method(method)
    if record.needs_mask and mask is None:
        raise ValueError(f"method {method!r} needs a mask (e.g. SVGMask.spatial(geometry, density)); "
                         "for dense attention use method='dense' or 'splash_dense'")
    if mask is not None and not isinstance(mask, Mask):
        raise TypeError(f"mask must be an svg_lib Mask or None, got {type(mask).__name__}")
    check_mask(mask, tokens)  # None or a Mask by now: its token count must be q's
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"q, k, v must be float32 or bfloat16, got {dtype}")

    if not record.pallas:
        return jax.jit(lambda q, k, v: reference_attention(q, k, v, mask))
    if record.dense:
        mask = None  # dense methods ignore any mask given; they are the baselines

    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    q_len, kv_len = nq * block_q, nk * block_kv
    if interpret is None:
        interpret = default_interpret()

    # 1. Plan once: the tiles each kernel visits and every table it reads, forward and backward.
    plan = tables = splash_mask = None
    if record.splash:
        splash_mask = splash_mask_form(mask, tokens, kv_len)  # Splash plans its own tables (make_splash)
    elif not record.planned:
        pass  # dense's kernels, forward and backward, take their tiles from program ids
    else:
        # B3 runs the tile-aligned mask, whose kernel predicate masks padding only
        kernel_mask = record.computed_mask(mask, block_q, block_kv)
        plan = plan_tiles(kernel_mask, block_q, block_kv)
        tables = plan.tables
    # 2. Check memory once, on that plan: the forward refuses now, the backward when a gradient is traced.
    budget = check_memory(method, heads=heads, head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv,
                          block_kv_compute=block_kv_compute, generation=generation, plan=plan, tables=tables,
                          splash_mask=splash_mask, q_len=q_len, backward=backward)
    blocks = dict(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret)

    # 3. Build the kernels from the tables and the limits.
    if record.splash:
        # Splash's kernels take the raised limit in their own CompilerParams, so it survives a
        # caller's jax.jit (a jit's compiler_options would only be accepted at the top level)
        kernel = make_splash(mask, tokens=tokens, heads=heads, q_len=q_len, kv_len=kv_len,
                             vmem_limit_bytes=budget.forward_limit, **blocks)
        # Splash leaves a row that keeps no key as an average of v (or unwritten, for a query
        # block with no kept block); the series' contract is zeros, as the reference.
        run = padded(_rows_zeroed(kernel, _rows_without_keys(mask, tokens, q_len)), tokens=tokens, q_len=q_len,
                     kv_len=kv_len)
    elif not record.planned:
        forward = functools.partial(dense_flash_attention, vmem_limit_bytes=budget.forward_limit, **blocks)
        run = with_backward(lambda q, k, v, residuals: forward(q, k, v, residuals=residuals), None,
                            backward_limits=budget.backward_limits, method=record, keep=padding_only(tokens),
                            **blocks)
    else:
        keep = kernel_mask.kernel_predicate(block_q, block_kv)
        head_kind = jnp.zeros((heads,), jnp.int32)  # one mask: every head follows schedule row block 0
        schedule = jnp.asarray(tables.schedule)

        def forward(q, k, v, residuals):
            return block_sparse_attention(q, k, v, head_kind, schedule, steps=tables.steps, method=record, keep=keep,
                                          vmem_limit_bytes=budget.forward_limit, residuals=residuals, **blocks)
        # jax.grad runs the backward kernels over the same tiles (svg_lib.kernels.backward)
        run = with_backward(forward, tables, backward_limits=budget.backward_limits, method=record, keep=keep,
                            **blocks)
        # the planner lets a mask's padding rows be computed unmasked; they are thrown away as zeros
        run = _rows_zeroed(run, _padding_rows(mask, tokens))

    return jax.jit(prescaled(run, head_dim=head_dim))


def prescaled(run, *, head_dim: int):
    """`f(q, k, v, *extra)` around a kernel `run(q, k, v, *extra)` that wants q pre-scaled:
    q `[heads, tokens, head_dim]` scaled by 1/sqrt(head_dim), in f32, then back to its dtype."""
    import jax.numpy as jnp

    scale = 1.0 / math.sqrt(head_dim)

    def f(q, k, v, *extra):
        return run((q.astype(jnp.float32) * scale).astype(q.dtype), k, v, *extra)

    return f


def padded(run, *, tokens: int, q_len: int, kv_len: int):
    """`f(q, k, v)` around a kernel `run(q, k, v)` that wants whole tiles (Splash): the token axis
    zero-padded to `q_len` (q) and `kv_len` (k, v) in HBM copies, the output sliced back to
    `tokens`. Splash masks the padded keys; the padded query rows are computed and dropped."""
    import jax.numpy as jnp

    def f(q, k, v):
        pad_q = ((0, 0), (0, q_len - tokens), (0, 0))
        pad_kv = ((0, 0), (0, kv_len - tokens), (0, 0))
        return run(jnp.pad(q, pad_q), jnp.pad(k, pad_kv), jnp.pad(v, pad_kv))[:, :tokens]

    return f


def _rows_zeroed(kernel, rows):
    """`kernel(q, k, v)` with the output rows where bool `rows` (NumPy, one per output row) is True set
    to zero; `kernel` itself where none is."""
    import jax.numpy as jnp

    if not rows.any():
        return kernel
    rows = jnp.asarray(rows)

    def run(q, k, v):
        return jnp.where(rows[None, :, None], 0, kernel(q, k, v)).astype(q.dtype)
    return run


def _padding_rows(mask, tokens):
    """bool [tokens]: query rows that are padding inside the sequence (`Mask.real_tokens_in`)."""
    return mask.real_tokens_in(np.arange(tokens + 1)) == 0


def _rows_without_keys(mask, tokens, q_len):
    """bool [q_len]: query rows that keep no key (none without a mask); where there are any, the padded
    rows past `tokens` too (`padded` slices them off)."""
    if mask is None:
        return np.zeros(q_len, bool)
    has_key = mask.pair_counts(np.arange(tokens + 1), [0, tokens])[:, 0] > 0
    return np.concatenate([~has_key, np.full(q_len - tokens, not has_key.all())])


def attention(q, k, v, mask: Mask | None = None, *, method: str, block_q: int = 512, block_kv: int = 512,
              block_kv_compute: int | None = None, interpret=None, split_heads=None, backward: str | None = None):
    """Attention over `[heads, tokens, head_dim]` q, k, v (float32 or bfloat16) by `method`.

    Methods: "reference" (jnp), "dense" (the series' flash kernel), "splash_dense" (B0,
    JAX's Splash with a full mask), "splash" (Splash with the exact mask), "b1", "b2",
    "b3" (the blog's stages; b3 computes attention under `mask.tile_aligned(block_q,
    block_kv)`). Any token count works: a last, partial tile never leaks into the result
    (the series' kernels clear it in VMEM; Splash gets padded copies). Softmax scale
    1/sqrt(head_dim). `interpret=None` runs compiled on a TPU and in
    interpret mode elsewhere; `pltpu.InterpretParams(...)` is passed through.

    Differentiable: `jax.grad` runs Pallas backward kernels over the same tiles for dense,
    b1, b2 and b3 (svg_lib.kernels.backward; b3's gradient is that of its rounded mask), and Splash's
    own backward for splash and splash_dense. `backward`: "fused" (one kernel computes dq, dk and dv
    of a tile), "split" (a dq kernel, then a dk/dv kernel), or None, fused where it fits in VMEM (split
    for one head on a megacore v4 or v5p, where it is faster).

    `split_heads`: on a v7x, whose two TensorCores jax shows as two devices, None (the default)
    splits the heads evenly over the chip's two devices (`runtime.head_split_devices` says when:
    an even head count, inputs not already spread over devices, no mesh of the caller's around);
    on every other chip None changes nothing. False keeps one device; True asks for the split and
    says why it cannot; a sequence of devices splits over exactly those.
    """
    heads = check_qkv(q, k, v)[0]
    devices = head_split_devices(q, heads, split_heads)
    fn = cached_build(build_attention, mask, q, method=method, block_q=block_q, block_kv=block_kv,
                      block_kv_compute=block_kv_compute, interpret=interpret, devices=devices, backward=backward)
    return fn(q, k, v) if devices is None else run_split(fn, devices, q, k, v)
