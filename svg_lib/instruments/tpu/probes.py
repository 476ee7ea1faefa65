"""The cost probes: small kernels compiled by libtpu whose static profile gives simulated cycles.

libtpu can dump, for every kernel it compiles, a *static LLO profile*: `estimated_cycles`
is a cycle-level simulation of one call of the whole kernel (every grid step, DMA waits
included), and the final VLIW bundles say how much code the kernel is. This module builds
the *probe kernels*, compiles them in a child process with the dump flags set
(`python -m svg_lib.instruments.tpu.probes --child <request>`) and reads both numbers back, one row per
probe; `svg_lib.instruments.tpu.cost` turns the rows into cycles per step and caches them.

The instrument's limits, and why the probes look as they do:
- The simulator follows branches on program ids exactly (an untaken `pl.when` costs
  nothing) but reads every scalar-prefetched (SMEM) value as 0, so the real B1/B2/B3 kernels,
  whose step classes come from SMEM tables, would simulate as all-idle. Each probe therefore
  takes its step class from the program id: every step of a probe is one kind.
- Splash has no idle or padding probe: its skipping is driven by SMEM tables. Its "free"
  probe is Splash's kernel with no mask tables (what a FullMask gives); its "svg_masked"
  probe is Splash's mask-function path with the SVG predicate on every step (how Splash
  handles a computable mask, e.g. the exact SVG mask at large sizes).
- Cycles per step = difference of `estimated_cycles` between probes with 2 and 4 steps
  (one query tile), divided by 2; per-row cost = the difference between 2 query tiles and 1
  (2 steps each), less 2 steps (`PROBE_STEPS`, `PROBE_ROWS`).
- LIBTPU_INIT_ARGS is read once, when libtpu starts, so the probes compile in a subprocess
  started with the dump flags set. `versions()` names what a result depends on (libtpu, jax,
  the source of the kernels the probes compile); `CACHE_FORMAT` covers the probes themselves.

Evidence kind of every number here: *simulated by the TPU compiler's static profile*
(compile-only, nothing run). jax is imported inside functions: the child process sets libtpu's
flags before jax starts.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from svg_lib.chips import check_target
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.environment import require_libtpu
from svg_lib.kernels import backward
from svg_lib.kernels import forward as kernels
from svg_lib.kernels.forward import MASK_VALUE
from svg_lib.progress import bar as progress_bar
from svg_lib.instruments.tpu.compiler import compile_fn
from svg_lib.instruments.tpu.errors import first_lines

BODY_KINDS = ("free", "svg_masked", "padding_masked", "idle", "matmuls", "free_running", "free_failing")
# "matmuls": the roofline's probe, svg_lib's only. The tile's two matmuls (`q k^T`, then `p v` with
# the scores cast to the input dtype) and nothing else: no max, exp, sum or rescale. Not a valid
# attention; its cycles are the floor a tile body of these blocks can approach on that chip.
FLOOR_KIND = "matmuls"
# svg_lib's "free", "svg_masked" and "padding_masked" probes run as the kernels do: a query tile's
# first step on the bound, then the check that keeps it (`kernels.start_bound`, `check_bound`), every
# later step with the bounded max. Cycles per step are then the bounded body's; the first step's extra
# cost lands in the per-row cost. "free_running": the mask-free body with the running max on every
# step, what a query tile whose rows fail the bound's check runs.
RUNNING_KIND = "free_running"
# "free_failing": a query tile whose rows fail the bound's check, through the kernels' own dispatch
# (`kernels.visit`): the first step runs on the bound, is checked, and runs again with the running max;
# every later step the running max with the flag saying the check failed. Its cycles per step are what
# such a tile pays per step; the first step's one-time cost lands in the per-row cost, as for "free".
FAILING_KIND = "free_failing"
COST_KERNELS = ("svg_lib", "splash")
# The backward's probes: our dq and dk/dv kernels and our fused kernel (svg_lib.kernels.backward),
# Splash's two backward kernels (dq; dk and dv), and Splash's fused backward kernel, which computes
# dq, dk and dv of a tile in one step (writing dq once per key tile, summed afterwards).
BACKWARD_KERNELS = ("svg_lib_dq", "svg_lib_dkv", "svg_lib_fused", "splash_dq", "splash_dkv", "splash_fused")
BACKWARD_KINDS = ("free", "svg_masked", "matmuls")
# "matmuls", the backward's roofline (svg_lib_fused only): the fused tile's five matmuls (k q^T, v do^T,
# p^T do, ds^T q, ds k) with the scores cast to the input dtype in between, and nothing else.
# Splash's idle and padding steps are table-driven: not probeable. "blocks": Splash's body when its
# mask comes as blocks of booleans (`kernels.splash.splash_mask_form` "blocks": B0 as this series
# runs it whenever the keys are padded, as at the blog's 75,600 tokens): every step on a full block
# reads the block's flag, ORs it into the resident mask block and selects, though every pair passes.
BLOCKS_KIND = "blocks"
SPLASH_KINDS = ("free", "svg_masked", BLOCKS_KIND)
TILE_KINDS = BODY_KINDS + (BLOCKS_KIND,)  # every kind `cost.tile_cost` probes by default
# Part of every cache key (svg_lib.instruments.tpu.cost): raise it when a probe kernel here changes what it measures.
CACHE_FORMAT = 7
PROBE_STEPS = (2, 4)      # kv steps of the two probes whose difference gives cycles per step
PROBE_ROWS = (1, 2)       # query tiles of the two probes whose difference gives the per-row cost


# What the source digest traces: every probe kind of both kernel families, forward and backward, at one
# block size with a single key chunk and at one with three (the unrolled chunk loop, the lane tiling).
DIGEST_BLOCKS = ((512, 256, 256), (1024, 1536, 512))


DIRECTIONS = ("forward", "backward")


def versions(direction: str | None = None) -> dict:
    """jax and libtpu versions, and a digest of what the probes compile (`probed_digest`): those of
    `direction` ("forward" or "backward"), or of both (None)."""
    import importlib.metadata as md

    import jax

    try:
        libtpu = md.version("libtpu")
    except md.PackageNotFoundError:
        libtpu = None
    return {"jax": jax.__version__, "libtpu": libtpu, "source": probed_digest(direction)}


@functools.lru_cache(maxsize=None)
def probed_digest(direction: str | None = None) -> str:
    """A digest of the jaxprs of the probe kernels (`DIGEST_BLOCKS`, every kind) of `direction`:
    "forward" (svg_lib's and Splash's forward tile bodies), "backward" (the backward kernels'), or None
    for both.

    A jaxpr is the program the probes hand the compiler, without names, comments or line numbers:
    renaming a function or regrouping a kernel's parameters keeps it, and with it the cache and the
    committed cycles; a change to what any probe computes (the tile body, the SVG predicate, the
    state's finish, Splash in a new jax) changes it, and the committed cycles are then stale
    (tests/test_cost.py says which). Each direction's cycles carry their own digest, so that a change
    to the forward alone leaves the backward's cycles current. Tracing only: no compiler, no libtpu."""
    import jax

    if direction not in (None, *DIRECTIONS):
        raise ValueError(f"direction is one of {DIRECTIONS} or None (both); got {direction!r}")
    probes = []
    for block_q, block_kv, chunk in DIGEST_BLOCKS:
        if direction in (None, "forward"):
            probes += probes_for(block_q, block_kv, chunk)
        if direction in (None, "backward"):
            probes += [Probe(kernel, kind, block_q, block_kv, chunk, 128, PROBE_ROWS[0], PROBE_STEPS[0])
                       for kernel in BACKWARD_KERNELS for kind in BACKWARD_KINDS
                       if kind != FLOOR_KIND or kernel == "svg_lib_fused"]
    digest = hashlib.sha256()
    for p in probes:
        fn, shapes = _probe_program(p, "probe", "v6e")
        args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
        digest.update(str(jax.make_jaxpr(fn)(*args)).encode())
    return digest.hexdigest()[:16]


# -- the probe kernels (compiled in the child process) --------------------------------------

@dataclass(frozen=True)
class Probe:
    """One probe kernel: `kernel` ("svg_lib" or "splash"), every step of body `kind`,
    `rows` query tiles x `steps` kv steps of one head."""

    kernel: str
    kind: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    head_dim: int
    rows: int
    steps: int
    bodies: tuple = ()     # extra, never-taken bodies compiled in (svg_lib only), to test branch cost

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _svg_predicate(block_q: int, tokens: int):
    """The SVG band-and-sink predicate, at a size where the probe's tiles straddle the band."""
    # A mask whose band edge runs through the probe's tiles; the kernel evaluates the predicate
    # on every element regardless, so only its arithmetic (not its geometry) affects the cost.
    g = VideoGeometry(max(2, tokens // 128), 8, 16)
    return SVGMask.spatial(g, 0.35).kernel_predicate(block_q, block_q)


def _matmul_floor_tile(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, keep, q_start, k_start, block_kv_compute,
                       interpret=False, bounded=False, unrolled=frozenset()):
    """The `FLOOR_KIND` body: the tile's two matmuls, chunked and unrolled as the real body
    (`kernels.online_softmax_tile`), with its refs and arguments, and nothing between them."""
    import jax
    from jax.experimental import pallas as pl

    chunks = k_ref.shape[0] // block_kv_compute

    def chunk(c, carry):
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        v = v_ref[ks, :]
        s = kernels.dot(q_ref[...], k_ref[ks, :], kernels.NT)
        acc_ref[...] += kernels.dot(s.astype(v.dtype), v, kernels.NN)
        return carry

    jax.lax.fori_loop(0, chunks, chunk, None, unroll=chunks <= kernels.MAX_UNROLLED_CHUNKS)


def _svg_lib_probe(p: Probe, name: str, target: str = "v6e"):
    """A kernel built on svg_lib's tile body whose step class comes from the program id."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    tokens = p.steps * p.block_kv
    svg_keep = _svg_predicate(p.block_q, tokens)

    def padding_keep(q_ids, k_ids):
        return k_ids < tokens - 1  # a run-time comparison, like the real kernels' padding test

    keeps = {"free": None, "svg_masked": svg_keep, "padding_masked": padding_keep, FLOOR_KIND: None,
             RUNNING_KIND: None, FAILING_KIND: None}
    bodies = [b for b in (p.kind, *p.bodies) if b != "idle"]
    bodies = list(dict.fromkeys(bodies))
    # one body as its own program: every kind unrolled up to MAX_UNROLLED_CHUNKS slices, what a kernel
    # within the program budget does with its hottest body (`kernels.unrolled_bodies`)
    one_body_unrolled = (frozenset(kernels.UNROLL_ORDER) if p.block_kv // p.block_kv_compute <= kernels.MAX_UNROLLED_CHUNKS
                         else frozenset())

    def kernel(q_ref, k_ref, v_ref, o_ref, *scratch):
        i, s = pl.program_id(1), pl.program_id(2)
        state, flag_ref = scratch[:3], scratch[3]

        def tile(keep, body=kernels.online_softmax_tile, **kwargs):
            body(q_ref, k_ref, v_ref, *state, keep=keep, q_start=i * p.block_q, k_start=s * p.block_kv,
                 block_kv_compute=p.block_kv_compute, interpret=False, unrolled=one_body_unrolled, **kwargs)

        begin = functools.partial(kernels.start_bound, q_ref, state[0], jnp.float32(1.0))  # any key norm will do
        check = functools.partial(kernels.check_bound, *state, flag_ref,
                                  threshold=p.block_kv * math.exp(-kernels.BOUND_SLACK))

        def first_step(keep):  # on the bound, then the check that keeps it or undoes the step
            begin()
            tile(keep, bounded=True)
            check()

        def as_the_kernels(keep):
            pl.when(s == 0)(functools.partial(first_step, keep))
            pl.when(s > 0)(functools.partial(tile, keep, bounded=True))

        def failing(keep):  # the kernels' dispatch after a failed check (the simulator cannot see the data)
            @pl.when(s == 0)
            def _():
                first_step(keep)
                flag_ref[0] = kernels.RUNNING

            kernels.visit(tile, keep, flag_ref, begin, check)

        # this step's kind: the probe's kind on every step, decided at run time from the
        # program id so that the compiler keeps every body and the simulator can follow it
        # (the simulator reads SMEM as 0, so the kernels' own flag would always say "running")
        code = jnp.where(s < p.steps, BODY_KINDS.index(p.kind), len(BODY_KINDS))

        @pl.when(s == 0)
        def _():
            kernels.init_state(*state, flag_ref)

        for body in bodies:
            if body == FLOOR_KIND:
                run = functools.partial(tile, None, _matmul_floor_tile)
            elif body == RUNNING_KIND:
                run = functools.partial(tile, None, bounded=False)
            elif body == FAILING_KIND:
                run = functools.partial(failing, None)
            else:
                run = functools.partial(as_the_kernels, keeps[body])
            pl.when(code == BODY_KINDS.index(body))(run)

        @pl.when(s == p.steps - 1)
        def _():
            kernels.finish(*state, o_ref)

    if p.kind == "idle":
        kv_map = lambda h, i, s: (h, 0, 0)  # an idle step repeats the resident block: no DMA
    else:
        kv_map = lambda h, i, s: (h, s, 0)
    call = pl.pallas_call(
        kernel,
        grid=(1, p.rows, p.steps),
        in_specs=[pl.BlockSpec((None, p.block_q, p.head_dim), lambda h, i, s: (h, i, 0)),
                  pl.BlockSpec((None, p.block_kv, p.head_dim), kv_map),
                  pl.BlockSpec((None, p.block_kv, p.head_dim), kv_map)],
        out_specs=pl.BlockSpec((None, p.block_q, p.head_dim), lambda h, i, s: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct((1, p.rows * p.block_q, p.head_dim), jnp.bfloat16),
        scratch_shapes=kernels.softmax_scratch(p.block_q, p.head_dim, bounded=True),
        compiler_params=kernels.compiler_params(_probe_vmem_limit(target)),
        name=name,
    )
    return call


def _probe_vmem_limit(target: str) -> int | None:
    """None (the compiler's default) where that default is a v6e's 32 MiB or more; else 3/4 of the
    chip's VMEM, so that large tiles compile on a chip whose default scoped VMEM is smaller."""
    t = check_target(target)
    return None if t.default_scoped_vmem >= 32 * 2**20 else t.vmem_bytes * 3 // 4


def _splash_probe(p: Probe, name: str, target: str = "v6e"):
    """Splash's forward kernel with no mask tables: every step runs (free), or every step runs
    its mask-function path with the SVG predicate (svg_masked); or with the tables of a block mask
    whose every block is full (blocks: one resident mask block, loaded once, OR-ed and selected on
    every step)."""
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    if p.kind not in SPLASH_KINDS:
        raise ValueError(f"Splash has no {p.kind!r} probe (its skipping reads SMEM tables); "
                         f"probeable: {SPLASH_KINDS}")
    tokens = p.steps * p.block_kv
    masked = p.kind == "svg_masked"
    if p.kind == BLOCKS_KIND:
        grid = (1, p.rows, p.steps)  # one head's tables, shared by every head as Splash stores them
        info = mi.MaskInfo(data_next=np.broadcast_to(np.arange(p.steps, dtype=np.int32), grid).copy(),
                           mask_next=np.zeros(grid, np.int32), block_mask=np.full(grid, 2, np.int32),
                           partial_mask_blocks=np.ones((1, p.block_q, p.block_kv), bool), q_sequence=None)
    else:
        info = mi.MaskInfo(data_next=None, mask_next=None, block_mask=None, partial_mask_blocks=None,
                           q_sequence=np.arange(p.rows * p.block_q, dtype=np.int32) if masked else None)
    sizes = sk.BlockSizes(block_q=p.block_q, block_kv=p.block_kv, block_kv_compute=p.block_kv_compute)
    predicate = _svg_predicate(p.block_q, tokens) if masked else None

    limit = _probe_vmem_limit(target)
    patches = {}
    if limit is not None:
        # Splash sets no VMEM limit of its own, so on a chip with a small default (a v5e's 16 MiB)
        # it does not compile at large tiles; the probe gives it the same limit as svg_lib's probes.
        original_params = sk.pltpu.CompilerParams
        patches[sk.pltpu, "CompilerParams"] = lambda **kw: original_params(**{"vmem_limit_bytes": limit, **kw})
    if p.kind == BLOCKS_KIND:
        # The static profile reads scalar-prefetched tables as zeros, and a zero block flag means
        # "skip": Splash's table lookup is given what a full block reads instead (run, keys j,
        # resident mask block 0), keeping the flag's run-time test that ORs the mask block.
        original_next = sk._next_nonzero

        def full_block(h, i, j, data_next_ref, block_mask_ref, m_next_ref, next_i=False):
            if block_mask_ref is None:
                return original_next(h, i, j, data_next_ref, block_mask_ref, m_next_ref, next_i)
            flag = block_mask_ref[0, i, j].astype(np.int32)
            return (i if next_i else j), 0, True, flag != 1
        patches[sk, "_next_nonzero"] = full_block

    def call(q, k, v):
        saved = {(owner, name): getattr(owner, name) for owner, name in patches}
        try:
            for (owner, name), value in patches.items():
                setattr(owner, name, value)
            return sk._splash_attention_forward(info, q, k, v, None, None, MASK_VALUE, False, sizes,
                                                None, False, predicate)
        finally:
            for (owner, name), value in saved.items():
                setattr(owner, name, value)
    return call


def _backward_probe(p: Probe, name: str, target: str = "v6e"):
    """svg_lib's dq or dk/dv kernel with every step of kind `p.kind` (from the program id), or
    Splash's fused backward with no mask tables (every step runs; "svg_masked": its
    mask-function path with the SVG predicate). dq: `rows` query tiles x `steps` key tiles;
    dk/dv and Splash's: `rows` key tiles x `steps` query tiles. Takes (q, k, v); the other
    operands (do, the log-sum-exp, D) are made from them outside the kernel."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if p.kind not in BACKWARD_KINDS or (p.kind == FLOOR_KIND and p.kernel != "svg_lib_fused"):
        raise ValueError(f"backward probes know {BACKWARD_KINDS} ({FLOOR_KIND!r}: svg_lib_fused only), "
                         f"not {p.kind!r} for {p.kernel}")
    tokens = (p.steps if p.kernel == "svg_lib_dq" else p.rows) * p.block_kv
    keep = _svg_predicate(p.block_q, tokens) if p.kind == "svg_masked" else None
    limit = _probe_vmem_limit(target)
    if p.kernel.startswith("splash"):
        return _splash_backward_probe(p, keep, limit)
    if p.kernel == "svg_lib_fused":
        return _fused_probe(p, name, keep, limit)
    dq = p.kernel == "svg_lib_dq"
    block_rows, block_cols = (p.block_q, p.block_kv) if dq else (p.block_kv, p.block_q)

    def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, *outs_and_scratch):
        r, s = pl.program_id(1), pl.program_id(2)
        outs, accs = outs_and_scratch[:-2 + dq], outs_and_scratch[-2 + dq:]

        @pl.when(s == 0)
        def _():
            for acc in accs:
                acc[...] = jnp.zeros(acc.shape, jnp.float32)

        q_start, k_start = (r * p.block_q, s * p.block_kv) if dq else (s * p.block_q, r * p.block_kv)
        body = backward._dq_tile if dq else backward._dkv_tile
        pl.when(s < p.steps)(lambda: body(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, *accs, keep=keep,
                                          q_start=q_start, k_start=k_start, block_kv_compute=p.block_kv_compute))

        @pl.when(s == p.steps - 1)
        def _():
            for out, acc in zip(outs, accs):
                out[...] = acc[...].astype(out.dtype)

    fixed = lambda h, r, s: (h, r, 0)   # noqa: E731  the row's own block
    moving = lambda h, r, s: (h, s, 0)  # noqa: E731  the step's block
    row_spec = pl.BlockSpec((None, block_rows, p.head_dim), fixed)
    col_spec = pl.BlockSpec((None, block_cols, p.head_dim), moving)
    q_spec, kv_spec = (row_spec, col_spec) if dq else (col_spec, row_spec)
    stat = pl.BlockSpec((None, 1, p.block_q), lambda h, r, s: (h, 0, r if dq else s))  # lse and D rows
    n_out = 1 if dq else 2
    out_rows = p.rows * block_rows
    call = pl.pallas_call(
        kernel, grid=(1, p.rows, p.steps),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, stat, stat],
        out_specs=[row_spec] * n_out,
        out_shape=[jax.ShapeDtypeStruct((1, out_rows, p.head_dim), jnp.bfloat16)] * n_out,
        scratch_shapes=[pltpu.VMEM((block_rows, p.head_dim), jnp.float32)] * n_out,
        compiler_params=kernels.compiler_params(limit), name=name)

    def fn(q, k, v):
        stat = q[:, None, :, 0].astype(jnp.float32)  # any per-query row: the cost does not depend on it
        return call(q, k, v, q, stat, stat)
    return fn


def _five_matmuls_tile(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, *, keep, q_start, k_start,
                       block_kv_compute, dq_acc):
    """The backward's `FLOOR_KIND` body: the fused tile's five matmuls, chunked and unrolled as the real
    body (`backward._dkv_tile` with dq), with its refs and arguments, and nothing between them."""
    import jax
    from jax.experimental import pallas as pl

    chunks = k_ref.shape[0] // block_kv_compute

    def chunk(c, carry):
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k, v, q, do = k_ref[ks, :], v_ref[ks, :], q_ref[...], do_ref[...]
        p_t = kernels.dot(k, q, kernels.NT).astype(do.dtype)
        dv_acc[ks, :] += kernels.dot(p_t, do, kernels.NN)
        ds_t = kernels.dot(v, do, kernels.NT).astype(q.dtype)
        dk_acc[ks, :] += kernels.dot(ds_t, q, kernels.NN)
        dq_acc[...] += kernels.dot(ds_t, k, backward.TN)
        return carry

    jax.lax.fori_loop(0, chunks, chunk, None, unroll=chunks <= kernels.MAX_UNROLLED_CHUNKS)


def _fused_probe(p: Probe, name: str, keep, limit):
    """svg_lib's fused backward, `rows` key tiles x `steps` query tiles, every step of kind `p.kind`
    (from the program id). Its dq accumulator holds `max(PROBE_STEPS)` query tiles whatever `steps`
    is, so that the probes of 2 and 4 steps differ only by their steps (the once-per-head copy of dq
    to HBM, `backward.write_dq`, is the same in both)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    body = _five_matmuls_tile if p.kind == FLOOR_KIND else backward._dkv_tile
    q_rows = max(PROBE_STEPS) * p.block_q

    def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_hbm, dk_ref, dv_ref, dq_acc, dk_acc, dv_acc, dq_out,
               sem):
        j, s = pl.program_id(1), pl.program_id(2)

        @pl.when((j == 0) & (s == 0))
        def _():
            dq_acc[...] = jnp.zeros(dq_acc.shape, jnp.float32)

        @pl.when(s == 0)
        def _():
            dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

        rows = pl.ds(pl.multiple_of(s * p.block_q, p.block_q), p.block_q)
        pl.when(s < p.steps)(lambda: body(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, keep=keep,
                                          q_start=s * p.block_q, k_start=j * p.block_kv,
                                          block_kv_compute=p.block_kv_compute, dq_acc=dq_acc.at[rows, :]))

        @pl.when(s == p.steps - 1)
        def _():
            dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
            dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

        @pl.when((j == p.rows - 1) & (s == p.steps - 1))
        def _():
            backward.write_dq(dq_acc, dq_out, dq_hbm.at[0], sem)

    q_spec = pl.BlockSpec((None, p.block_q, p.head_dim), lambda h, j, s: (h, s, 0))
    kv_spec = pl.BlockSpec((None, p.block_kv, p.head_dim), lambda h, j, s: (h, j, 0))
    stat = pl.BlockSpec((None, 1, p.block_q), lambda h, j, s: (h, 0, s))
    out = jax.ShapeDtypeStruct((1, p.rows * p.block_kv, p.head_dim), jnp.bfloat16)
    call = pl.pallas_call(
        kernel, grid=(1, p.rows, p.steps),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, stat, stat],
        out_specs=[pl.BlockSpec(memory_space=pl.ANY), kv_spec, kv_spec],
        out_shape=[jax.ShapeDtypeStruct((1, q_rows, p.head_dim), jnp.bfloat16), out, out],
        scratch_shapes=backward.fused_scratch(q_rows, p.block_q, p.block_kv, p.head_dim, jnp.bfloat16),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=limit),
        name=name)

    def fn(q, k, v):
        stat = q[:, None, :, 0].astype(jnp.float32)  # any per-query row: the cost does not depend on it
        return call(q, k, v, q, stat, stat)
    return fn


def _splash_backward_probe(p: Probe, predicate, limit):
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    q_len = (p.rows if p.kernel == "splash_dq" else p.steps) * p.block_q  # dq: query tiles are the rows
    info = mi.MaskInfo(data_next=None, mask_next=None, block_mask=None, partial_mask_blocks=None,
                       q_sequence=np.arange(q_len, dtype=np.int32) if predicate is not None else None)
    layout = sk.QKVLayout.HEAD_DIM_MINOR

    common = dict(is_mqa=False, mask_info=info, mask_value=MASK_VALUE, attn_logits_soft_cap=None,
                  q_layout=layout, k_layout=layout, v_layout=layout, mask_function=predicate, interpret=False)

    def fn(q, k, v):
        stat = q[:, :, 0].astype(jnp.float32)  # [heads, q_len]: logsumexp and D, as Splash holds them
        original = sk.pltpu.CompilerParams

        def with_limit(**kwargs):
            return original(**{"vmem_limit_bytes": limit, **kwargs})
        if limit is not None:  # the same limit as our probes (see _splash_probe)
            sk.pltpu.CompilerParams = with_limit
        try:
            if p.kernel == "splash_dq":  # Splash's dq kernel takes whole key tiles (no compute slices)
                return sk._splash_attention_bwd_dq(q, k, v, None, None, stat, q, stat, bq=p.block_q, bkv=p.block_kv,
                                                   **common)
            return sk._splash_attention_bwd_dkv(q, k, v, None, None, stat, q, stat, bq=p.block_q, bkv=p.block_kv,
                                                bkv_compute=p.block_kv_compute,
                                                use_fused_bwd_kernel=p.kernel == "splash_fused", **common)
        finally:
            sk.pltpu.CompilerParams = original
    return fn


def _probe_program(p: Probe, name: str, target: str):
    """`(fn, shapes)`: the probe's function and its arguments' `[(shape, dtype), ...]`."""
    if p.kernel == "svg_lib":
        fn = _svg_lib_probe(p, name, target)
    elif p.kernel == "splash":
        fn = _splash_probe(p, name, target)
    elif p.kernel in BACKWARD_KERNELS:
        fn = _backward_probe(p, name, target)
    else:
        raise ValueError(f"unknown kernel {p.kernel!r}; known: {COST_KERNELS + BACKWARD_KERNELS}")
    # rows run along the grid's second axis: query tiles for the forward and dq, key tiles for dk/dv
    by_query = p.kernel in ("svg_lib", "splash", "svg_lib_dq", "splash_dq")  # dk/dv and the fused ones: by key
    q_tiles, kv_tiles = (p.rows, p.steps) if by_query else (p.steps, p.rows)
    q = ((1, q_tiles * p.block_q, p.head_dim), "bfloat16")
    kv = ((1, kv_tiles * p.block_kv, p.head_dim), "bfloat16")
    return fn, [q, kv, kv]


def _compile_probe(p: Probe, target: str, name: str):
    compile_fn(*_probe_program(p, name, target), target)


_CYCLES = re.compile(r"estimated_cycles:\s*(\d+)")
_BUNDLES = re.compile(r"total scheduled bundles:\s*(\d+)")


def _read_dumps(profile_dir: str, bundle_dir: str | None) -> dict:
    """estimated_cycles and bundles of the one kernel compiled since the dirs were emptied."""
    cycles = []
    for path in glob.glob(os.path.join(profile_dir, "*_static_llo_profile.textproto")):
        cycles += [int(c) for c in _CYCLES.findall(Path(path).read_text())]
    out = {"cycles": max(cycles) if cycles else None}
    if bundle_dir is not None:
        bundles = None
        for path in glob.glob(os.path.join(bundle_dir, "*-00-schedule-analysis_final_bundles.txt")):
            if "TLP" in path or "<late" in path:
                continue  # the program around the kernel, not the kernel
            m = _BUNDLES.search(Path(path).read_text())
            if m:
                bundles = max(bundles or 0, int(m.group(1)))
        out["bundles"] = bundles
    return out


def _clear(*dirs):
    for d in dirs:
        if d:
            for path in glob.glob(os.path.join(d, "*")):
                os.remove(path)


def _child(request: dict) -> list[dict]:
    """In the child process (dump flags already set): compile each probe, read its dumps."""
    # `python -m svg_lib.instruments.tpu.probes` has run svg_lib/__init__.py first: libtpu sharing is set up
    profile_dir, bundle_dir = request["profile_dir"], request.get("bundle_dir")
    results = []
    for n, raw in enumerate(request["probes"]):
        p = Probe(**{**raw, "bodies": tuple(raw.get("bodies", ()))})
        _clear(profile_dir, bundle_dir)
        start = time.perf_counter()
        try:
            _compile_probe(p, request["target"], f"cost_probe_{n}")
            row = _read_dumps(profile_dir, bundle_dir)
        except Exception as err:  # report, keep going: one failing probe should not lose the rest
            row = {"cycles": None, "error": first_lines(err, 3)}
        row["compile_s"] = round(time.perf_counter() - start, 2)
        results.append(row)
        print(json.dumps({"done": n + 1, "of": len(request["probes"])}), file=sys.stderr, flush=True)
    _clear(profile_dir, bundle_dir)
    return results


_DONE = re.compile(r'\{"done": (\d+)')  # the child's line after each probe


def _follow(proc, log_path: str, total: int, target: str, timeout: float) -> None:
    """Wait for the compiler process, a progress bar advanced by the `{"done": n}` lines it logs
    (a probe at the case study's tiles takes a minute or more); killed past `timeout` seconds."""
    shown = progress_bar(total=total, desc=f"compiling cost probes for {target}", unit="probe")
    start, done = time.perf_counter(), 0
    while proc.poll() is None:
        if time.perf_counter() - start > timeout:
            proc.kill()
            proc.wait()
            shown.close()
            raise RuntimeError(f"the probe compiler process ran past {timeout:.0f} s and was stopped")
        time.sleep(0.5)
        with open(log_path) as log:
            counts = [int(m.group(1)) for m in map(_DONE.match, log) if m]
        if counts and counts[-1] > done:
            shown.update(counts[-1] - done)
            done = counts[-1]
    shown.close()


def run_probes(probes: list[Probe], target: str, *, bundles: bool = True, timeout: float = 3600) -> list[dict]:
    """Compile `probes` for `target` in one subprocess with the compiler's dump flags set.

    Returns one dict per probe: cycles (estimated_cycles), bundles, compile_s (or error)."""
    require_libtpu()
    check_target(target)
    with tempfile.TemporaryDirectory(prefix="svg_cost_") as tmp:
        profile_dir = os.path.join(tmp, "profile")
        bundle_dir = os.path.join(tmp, "bundles") if bundles else None
        os.makedirs(profile_dir)
        flags = [f"--xla_jf_dump_static_llo_profile_to={profile_dir}"]
        if bundle_dir:
            os.makedirs(bundle_dir)
            flags += [f"--xla_jf_dump_to={bundle_dir}", "--xla_jf_dump_llo_text=true",
                      "--xla_jf_dump_llo_pass_label_regex=final_bundles"]
        env = dict(os.environ)
        env["LIBTPU_INIT_ARGS"] = " ".join([env.get("LIBTPU_INIT_ARGS", ""), *flags]).strip()
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH", "")])
        request = {"target": target, "profile_dir": profile_dir, "bundle_dir": bundle_dir,
                   "probes": [p.to_json() for p in probes]}
        req_path = os.path.join(tmp, "request.json")
        Path(req_path).write_text(json.dumps(request))
        log_path = os.environ.get("SVG_LIB_COST_LOG") or os.path.join(tmp, "child.log")
        with open(log_path, "w") as log:  # libtpu is chatty on stderr; keep it out of the caller's output
            proc = subprocess.Popen([sys.executable, "-m", "svg_lib.instruments.tpu.probes", "--child", req_path],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
            _follow(proc, log_path, len(probes), target, timeout)
        out_path = req_path + ".out"
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = "\n".join(Path(log_path).read_text().strip().splitlines()[-8:])
            raise RuntimeError(f"the probe compiler process failed (exit {proc.returncode}):\n{tail}")
        return json.loads(Path(out_path).read_text())


def probes_for(block_q: int, block_kv: int, block_kv_compute: int, head_dim: int = 128,
               kernels=COST_KERNELS, kinds=TILE_KINDS, per_row: bool = True) -> list[Probe]:
    """Every probe `tile_cost` compiles for one block size (the per-row probe needs "free")."""
    out = []
    for kernel in kernels:
        probeable = BODY_KINDS if kernel == "svg_lib" else SPLASH_KINDS
        for kind in [k for k in probeable if k in kinds]:
            for steps in PROBE_STEPS:
                out.append(Probe(kernel, kind, block_q, block_kv, block_kv_compute, head_dim, PROBE_ROWS[0], steps))
        if per_row and "free" in kinds:
            out.append(Probe(kernel, "free", block_q, block_kv, block_kv_compute, head_dim, PROBE_ROWS[1],
                             PROBE_STEPS[0]))
    return out


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _request_path = sys.argv[2]
    _out = _child(json.loads(Path(_request_path).read_text()))
    Path(_request_path + ".out").write_text(json.dumps(_out))
