"""The block-sparse forward that also reports what each tile weighed, and skip-softmax beside it.

`observed_block_sparse_attention` is `forward.block_sparse_attention` (the same grid, schedule,
tile body, bounded max and finish: its output and lse are bit-identical) with two options, added as
`grid.Hooks` on that kernel's tile step:

* `tile_mass` (on by default here): a side output f32 `[heads, nq * steps]`, aligned with the
  schedule: for grid step (h, i, s) the softmax mass of the tile it visited, for planning the next
  denoising step's tiles from this one's (`layers.next_plan`). 0 at idle steps.
* `skip_below` (off by default): skip-softmax, a lossy branch (`skip_softmax_tile`).

Without these hooks the series' kernels in `forward` trace exactly as before (the probes' digest
reads them); the hooks only add their own work beside the tile body, the start and the finish.

The statistic: the tile's softmax mass, the share of each row's probability (over the keys the row
computes) that falls in the tile, averaged over the query tile's real rows. It is exact (no bound,
no estimate), sums to 1 over a query tile's steps, and is what recall counts. The other candidate,
the tile's largest score against the row's final max, would cost a max over every score in the
bounded body (which computes no max: a VPU op per element), and the final max is known only at finish.

How it is kept cheap: the kernel already sums each row's p into l. At the end of each visited
step's tile body the row's l so far (summed across its lanes) goes into lane s of a per-row record
`[block_q, lanes]` (lanes: steps rounded up to 128): a cross-lane sum and a select per step, nothing
per key slice. A running-max body (every step of a tile that failed the bound's check, its first
step run again included) also puts the row's m into lane s of a second record; a body on the bound
never moves m, so its lanes need none (they keep +inf, read as "in the final m's units"). At finish
each lane is brought to the final m (exp(m_s - m)), divided by the row's final l, averaged over the
rows, and lane s less lane s - 1 is step s's mass (the difference is linear, so it is taken after the
mean, on one row). Idle steps record nothing; they come after a query tile's visited steps in every
schedule (`planner.schedule_rows`, `device_plan.schedule_rows`), so a difference below 0 there reads
0. A mass carries the rounding of the cumulative sum: about 1e-7 absolute.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib.kernels.forward import (LANES, MASK_VALUE, NN, NT, _lane_sum, _lanes, block_sparse_attention, dot,
                                     online_softmax_tile, partial_tail, plain_interpreter, real_part, token_ids)
from svg_lib.kernels.grid import Hooks, row_block


# -- the tile mass ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TileMass:
    """The side output's scratch: `record_ref` `[block_q, lanes]` f32, each row's l so far at each
    visited step; `m_record_ref` `[block_q, lanes]` f32, the row's m at steps that ran the running max
    (+inf elsewhere); `step` the grid step (its lane); `interpret` as the tile body's."""

    record_ref: object
    m_record_ref: object
    step: object
    interpret: bool = False

    def start(self):
        self.record_ref[...] = jnp.zeros(self.record_ref.shape, jnp.float32)
        self.m_record_ref[...] = jnp.full(self.m_record_ref.shape, jnp.inf, jnp.float32)

    def record(self, l_ref, m_ref, bounded: bool):
        """At the end of a tile body: lane `step` := each row's l, summed across its lanes; and, from a
        running-max body (`bounded` False, known when tracing), its m. Called inside the body's own
        branch: a separate branch after it cost the static profile 4 times as much (its work could not
        overlap the tile's matmuls)."""
        rows, lanes = self.record_ref.shape
        lane = jax.lax.broadcasted_iota(jnp.int32, (1, lanes), 1) == self.step
        row_sum = jnp.broadcast_to(jnp.sum(l_ref[...], axis=1, keepdims=True), (rows, LANES))
        self.record_ref[...] = jnp.where(lane, _lanes(row_sum, lanes, self.interpret), self.record_ref[...])
        if not bounded:
            self.m_record_ref[...] = jnp.where(lane, _lanes(m_ref[...], lanes, self.interpret), self.m_record_ref[...])


def recording_tile(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, mass: TileMass, body=None, bounded=False, **kwargs):
    """A tile body (`body`, default `forward.online_softmax_tile`) followed by the tile mass's record,
    in the same branch. A switch to the bound after it needs nothing: the lane keeps the (l, m) pair
    it was recorded with."""
    (online_softmax_tile if body is None else body)(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, bounded=bounded,
                                                     **kwargs)
    mass.record(l_ref, m_ref, bounded)


def tile_mass_lanes(steps: int) -> int:
    """Lanes of the per-row records: `steps` rounded up to a multiple of 128."""
    return -(-steps // LANES) * LANES


def finish_tile_mass(m_ref, l_ref, mass: TileMass, mass_ref, *, q_start, q_tokens: int, interpret=False):
    """mass_ref `[1, lanes]` := lane s holds step s's tile mass (module docstring). A row that saw no
    kept key adds 0 (like its output); a NaN row makes its query tile's masses NaN (as its output is NaN)."""
    rows, lanes = mass.record_ref.shape
    m = m_ref[...]
    row_sum = jnp.broadcast_to(jnp.sum(l_ref[...], axis=1, keepdims=True), m.shape)   # [rows, 128]
    seen = jnp.logical_not(m <= 0.5 * MASK_VALUE) | jnp.isnan(row_sum)
    real = token_ids(q_start, rows, 0) < q_tokens                                     # [rows, 1]
    weight = jnp.where(seen & real, 1.0 / jnp.where(seen, row_sum, 1.0), 0.0)         # [rows, 128]
    m_rec = mass.m_record_ref[...]
    to_final = jnp.where(m_rec == jnp.inf, 1.0, jnp.exp(m_rec - _lanes(m, lanes, interpret)))
    real_rows = jnp.minimum(q_tokens - q_start, rows).astype(jnp.float32)
    # rows past the end hold garbage (NaN * 0 is NaN): selected out, not weighted out
    share = jnp.where(real, mass.record_ref[...] * to_final * _lanes(weight, lanes, interpret), 0.0)
    cumulative = jnp.sum(share, axis=0, keepdims=True) / real_rows                    # [1, lanes]
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, lanes), 1)
    shifted = jnp.roll(cumulative, 1, axis=1) if interpret else pltpu.roll(cumulative, 1, 1)
    own = cumulative - jnp.where(lane == 0, 0.0, shifted)                             # lane s less lane s - 1
    mass_ref[...] = jnp.where(own < 0.0, 0.0, own)  # a select, not a max: NaN passes (idle lanes: below 0)


# -- skip-softmax: an optional, lossy tile body ---------------------------------------------------
# After q k^T, a slice whose every score lies more than `threshold` below its row's running max adds
# terms of at most exp(-threshold) of the row's largest: skip its exp, row sum and `p @ v` (BLASST;
# LiteAttention carries the skips to later steps). One test per slice for the whole block, so that it
# takes one branch: a row max of the scores (the running body takes it anyway; the bounded body pays
# for it, a VPU op per score) and a max over the block's rows. The bounded body's m is the
# Cauchy-Schwarz bound, up to BOUND_SLACK above the real max: testing against it would skip slices that
# hold a row's largest terms. So the running max is kept beside it (`seen_ref`, MASK_VALUE at a query
# tile's start, so that its first slice always runs), written by the running body and raised by every
# bounded slice that runs; a skipped slice never holds a new max (all its scores are below the old
# one). A NaN score may be skipped where the backend's max drops NaN.
# Priced by tools/tile-mass-profile.py.

def skip_softmax_tile(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, keep, q_start, k_start, block_kv_compute,
                      interpret=False, bounded=False, threshold: float, seen_ref, gate=None, kv_tokens=None,
                      q_tokens=None, unrolled=frozenset()):
    """`forward.online_softmax_tile` with skip-softmax: each key slice whose every score lies more than
    `threshold` below its row's running max (`seen_ref` `[block_q, 128]` f32 beside the bound; m itself
    with the running max) skips its exp, row sum and `p @ v`. `gate`: None, or `gate(run) -> run`
    applied to the test's outcome (the cost probes force each branch with it: the profile cannot see data).
    `kv_tokens` as in the tile body; `q_tokens` (None, or the query count where the last query tile is
    partial) leaves the garbage rows past it out of the skip test."""
    block_q = q_ref.shape[0]
    head_dim = acc_ref.shape[1]
    chunks = k_ref.shape[0] // block_kv_compute
    gate = (lambda run: run) if gate is None else gate

    def chunk(c, carry):
        q = q_ref[...]
        ks = pl.ds(pl.multiple_of(c * block_kv_compute, block_kv_compute), block_kv_compute)
        k = k_ref[ks, :]
        v = v_ref[ks, :]
        s = dot(q, k, NT)
        if keep is not None:
            if kv_tokens is not None:
                v = real_part(v, k_start + c * block_kv_compute, kv_tokens)
            q_ids = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
            k_ids = k_start + c * block_kv_compute + jax.lax.broadcasted_iota(jnp.int32, (1, block_kv_compute), 1)
            s = jnp.where(keep(q_ids, k_ids), s, MASK_VALUE)
        row_max = jnp.max(s, axis=1, keepdims=True)                          # [block_q, 1]
        seen = seen_ref if bounded else m_ref                                # the running max
        gap = real_part(row_max - seen[...], q_start, q_tokens, fill=-jnp.inf)
        pl.when(gate(jnp.max(gap) >= -threshold))(functools.partial(update, s, v, row_max))
        return carry

    def update(s, v, row_max):
        if bounded:
            seen_ref[...] = jnp.maximum(seen_ref[...], row_max)
            p = jnp.exp(s - _lanes(m_ref[...], block_kv_compute, interpret))
            l_ref[...] += _lane_sum(p)
            acc_ref[...] += dot(p.astype(v.dtype), v, NN)
            return
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, row_max)
        p = jnp.exp(s - _lanes(m_next, block_kv_compute, interpret))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_ref[...] + _lane_sum(p)
        m_ref[...] = m_next
        seen_ref[...] = m_next
        acc_ref[...] = _lanes(alpha, head_dim, interpret) * acc_ref[...] + dot(p.astype(v.dtype), v, NN)

    jax.lax.fori_loop(0, chunks, chunk, None, unroll=(bounded, keep is not None) in unrolled)


# -- the observed forward -----------------------------------------------------------------------

def observed_block_sparse_attention(q, k, v, head_kind, schedule, *, steps, method, keep, block_q, block_kv,
                                    block_kv_compute, interpret, vmem_limit_bytes=None, residuals=False,
                                    head_order=None, tile_mass=True, skip_below=None):
    """`forward.block_sparse_attention` (same arguments, same output and lse) with the tile masses
    appended to what it returns when `tile_mass`: f32 `[heads, nq * steps]` aligned with the schedule
    (module docstring); and with `skip_below` (None: off), skip-softmax at that threshold (a step whose
    slices were all skipped records mass 0). The extra VMEM: two `[block_q, lanes]` f32 records (and one
    `[block_q, 128]` with skip-softmax), not counted by the memory budget."""
    if skip_below is not None and (isinstance(skip_below, bool) or not isinstance(skip_below, (int, float))
                                   or not skip_below > 0):
        raise ValueError(f"skip_below must be None or a number > 0 (a gap in logits), got {skip_below!r}")
    on_cpu = plain_interpreter(interpret)
    heads, q_tokens, _ = q.shape
    lanes = tile_mass_lanes(steps)

    def mass(step):
        return TileMass(step.refs["record_ref"], step.refs["m_record_ref"], step.s, on_cpu)

    def body(default, step):
        """The tile body with skip-softmax in its place and the tile mass's record after it."""
        tile_body = default
        if skip_below is not None:
            tile_body = functools.partial(skip_softmax_tile, threshold=float(skip_below),
                                          seen_ref=step.refs["seen_ref"], q_tokens=partial_tail(q_tokens, block_q))
        return functools.partial(recording_tile, mass=mass(step), body=tile_body) if tile_mass else tile_body

    def start(step):
        if tile_mass:
            mass(step).start()
        if skip_below is not None:  # no score seen yet: the first slice runs (the module's skip-softmax note)
            step.refs["seen_ref"][...] = jnp.full(step.refs["seen_ref"].shape, MASK_VALUE, jnp.float32)

    def finish_mass(step):
        finish_tile_mass(step.refs["m_ref"], step.refs["l_ref"], mass(step), step.refs["mass_ref"],
                         q_start=step.i * block_q, q_tokens=q_tokens, interpret=on_cpu)

    nq = -(-q_tokens // block_q)
    hooks = Hooks(
        name="observed",
        outputs=(("mass", tile_mass),),
        scratch=(("record", tile_mass), ("m_record", tile_mass), ("seen", skip_below is not None)),
        out_shapes=lambda q_map: ([(jax.ShapeDtypeStruct((heads, 1, nq * lanes), jnp.float32), row_block(q_map, lanes))]
                                  if tile_mass else []),
        scratch_shapes=(([pltpu.VMEM((block_q, lanes), jnp.float32)] * 2 if tile_mass else [])
                        + ([pltpu.VMEM((block_q, LANES), jnp.float32)] if skip_below is not None else [])),
        body=body,
        start=start if tile_mass or skip_below is not None else None,
        finish=finish_mass if tile_mass else None)
    outs = block_sparse_attention(q, k, v, head_kind, schedule, steps=steps, method=method, keep=keep, block_q=block_q,
                                  block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret,
                                  vmem_limit_bytes=vmem_limit_bytes, residuals=residuals, head_order=head_order,
                                  hooks=hooks)
    if not tile_mass:
        return outs
    masses = outs[-1].reshape(heads, nq, lanes)[:, :, :steps].reshape(heads, nq * steps)
    return (*outs[:-1], masses) if len(outs) > 2 else (outs[0], masses)
