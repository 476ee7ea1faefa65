"""Mixed-head attention: spatial and temporal heads in one layer, routed by per-head flags.

A spatial head runs the SVG mask on frame-major tokens. A temporal head runs the *same*
mask on tokens permuted to temporal-major order (brief, section 2), and its output is
permuted back. Two ways to do that are here, so they can be compared:

* `svg_attention` (physical permutation, the blog's choice): move each temporal head's
  q, k, v into temporal-major order (a reshape/transpose of the token axis and a per-head
  select, `permute_heads`: no gather), run one kernel with one mask over every head, move
  the output back. The kernel sees the band in both cases, so it visits the same few tiles.
* `svg_attention_in_kernel` (no data movement): temporal heads stay frame-major and one
  kernel, reading per-head flags from SMEM, follows each head's own tile schedule and
  evaluates the temporal mask (`TemporalMask`, arithmetic `keep`) in place. In
  frame-major order that mask is a set of strided diagonals that touch most tiles, so the
  kernel visits many more of them (`compare_temporal_tiles` counts them).

Routing never changes a shape: `is_temporal` is a bool `[heads]` array used only as data
(a `jnp.where` over the head axis picks each head's permuted or unpermuted rows; the in-kernel version
scalar-prefetches the flags), so under `jax.jit` a new routing is new data, not a new program
(`CompileCounter` counts XLA compilations to show it).
"""
from __future__ import annotations

import numpy as np

from svg_lib.attention import build_attention, prescaled
from svg_lib.cache import cached_build
from svg_lib.chips import TARGETS, parallel_split
from svg_lib.core.geometry import inverse_temporal_major_permutation, temporal_major_permutation
from svg_lib.core.masks import Mask, check_block_size
from svg_lib.core.svg_masks import SVGMask, TemporalMask
from svg_lib.core.planner import PARTIAL, plan_tiles
from svg_lib.extensions.stacked_schedules import stack_schedules
from svg_lib.extensions.token_order import to_frame_major, to_temporal_major
from svg_lib.kernels.forward import block_sparse_attention
from svg_lib.kernels.reference import check_qkv
from svg_lib.memory.smem import check_schedule_fits, schedule_smem
from svg_lib.memory.vmem import check_fits, estimate_vmem
from svg_lib.methods import METHODS, PLANNED_METHODS, check_method
from svg_lib.problem import check_block_kv_compute
from svg_lib.runtime import (check_head_split, default_interpret, detect_runtime, head_split_devices, run_split,
                             shard_heads)

# -- validation ------------------------------------------------------------------------------

def check_spatial_mask(mask, tokens: int | None = None) -> SVGMask:
    """The mask routing needs: the *spatial* SVG mask (temporal heads reuse it after the permutation)."""
    if isinstance(mask, TemporalMask) or (isinstance(mask, Mask) and not isinstance(mask, SVGMask)):
        raise TypeError(f"routing needs the spatial SVGMask (SVGMask.spatial(geometry, density)); got "
                        f"{type(mask).__name__}. Temporal heads use that same mask after the permutation, "
                        "so pass the spatial one and mark the temporal heads in is_temporal")
    if not isinstance(mask, SVGMask):
        raise TypeError(f"mask must be an SVGMask (SVGMask.spatial(geometry, density)), got {type(mask).__name__}")
    if tokens is not None and mask.tokens != tokens:
        raise ValueError(f"the mask covers {mask.tokens} tokens ({mask.geometry}) but q, k, v have {tokens}")
    return mask


def check_flags(is_temporal, heads: int):
    """`is_temporal` as a jnp bool `[heads]` array (traced arrays pass through unchanged)."""
    import jax.numpy as jnp

    if isinstance(is_temporal, (list, tuple, np.ndarray)):
        arr = np.asarray(is_temporal)
        if arr.dtype != bool:
            raise TypeError(f"is_temporal must be booleans (True = temporal head), got dtype {arr.dtype}")
        is_temporal = jnp.asarray(arr)
    shape, dtype = tuple(getattr(is_temporal, "shape", ())), getattr(is_temporal, "dtype", None)
    if shape != (heads,):
        raise ValueError(f"is_temporal must be shaped [heads] = ({heads},), got shape {shape}")
    if dtype != jnp.bool_:
        raise TypeError(f"is_temporal must be a bool array (True = temporal head), got dtype {dtype}")
    return is_temporal


# -- the per-head permutation ------------------------------------------------------------------

def head_gather_index(is_temporal, geometry, inverse: bool = False):
    """Per-head gather indices `[heads, tokens]` int32: the permutation for temporal heads, identity otherwise.

    One `jnp.where` over the head axis picks each head's row, so every head is gathered exactly
    once whatever the routing. `inverse=True` gives the indices that undo it. The layer itself
    permutes without indices (`permute_heads`); these say what it computes, as a gather.
    """
    import jax.numpy as jnp

    perm = inverse_temporal_major_permutation(geometry) if inverse else temporal_major_permutation(geometry)
    perm = jnp.asarray(perm, dtype=jnp.int32)
    ident = jnp.arange(geometry.tokens, dtype=jnp.int32)
    return jnp.where(is_temporal[:, None], perm[None, :], ident[None, :])


def gather_heads(x, index):
    """`x[h, index[h, t], :]` for `[heads, tokens, head_dim]` x and `[heads, tokens]` index."""
    import jax.numpy as jnp

    return jnp.take_along_axis(x, index[:, :, None], axis=1)


def permute_heads(x, is_temporal, geometry, inverse: bool = False):
    """`[heads, tokens, head_dim]` x with its temporal heads put in temporal-major order (or, with
    `inverse`, back), the other heads as they are.

    One reshape/transpose of the whole array (`to_temporal_major`) and a per-head select: no
    gather. The select reads both copies (the compiled program makes it a layout copy, then the
    select: two passes), still far cheaper on a TPU than the row gather `gather_heads(x, head_gather_index(...))` that computes
    the same array.
    """
    import jax.numpy as jnp

    moved = to_frame_major(x, geometry) if inverse else to_temporal_major(x, geometry)
    return jnp.where(is_temporal[:, None, None], moved, x)


def routed_attention(kernel, q, k, v, is_temporal, geometry):
    """Route through an already built `kernel(q, k, v)`: permute temporal heads, run, permute back.

    The building block shared by `svg_attention` and the sharded layer (which calls it on its
    head-local slice). All arrays `[heads, tokens, head_dim]`, frame-major; is_temporal `[heads]`.
    """
    q, k, v = (permute_heads(x, is_temporal, geometry) for x in (q, k, v))
    return permute_heads(kernel(q, k, v), is_temporal, geometry, inverse=True)


# -- megacore: both TensorCores get an equal share of each kind of head ----------------------------
#
# On a v4 or v5p the chip's two TensorCores are one jax device and split the kernel's leading
# "parallel" grid axis, the heads, into contiguous halves (`chips.parallel_split`). With the
# in-kernel routing a temporal head visits more tiles than a spatial one, so temporal heads
# clustered in one half leave the other core idle. The kernel's grid therefore runs the heads in
# an order where each core's half holds one head of every pair (2i, 2i + 1), the pair's members
# swapped where that evens the kinds out: a `[heads]` int32 table computed from the flags at run
# time (no new program when the routing changes) and scalar-prefetched by the kernel, whose index
# maps read each grid row's head from it (`block_sparse_attention(..., head_order=)`). No array
# moves: q, k and v are read, and the output written, where they are.

def pair_swaps(is_temporal):
    """bool `[heads // 2]`: which pairs (2i, 2i + 1) to swap so that both halves get an equal share
    of each kind (`balance_heads`). Works on NumPy and jnp (traced) flags alike; heads must be even.

    Each half gets one head of every pair, so same-kind pairs split evenly by themselves; the mixed
    pairs alternate which half gets their temporal head (the first mixed pair's goes to core 0).
    The halves then differ by at most one head of each kind, the fewest any order can reach.
    """
    xp = np if isinstance(is_temporal, np.ndarray) else _jnp()
    heads = int(is_temporal.shape[0])
    if heads % 2:
        raise ValueError(f"balancing heads over two cores pairs them up: {heads} heads is odd; use an even head "
                         "count, or balance_cores=False")
    pairs = is_temporal.reshape(heads // 2, 2)  # not x[0::2]: older jax lowers a strided slice to a gather
    first, second = pairs[:, 0], pairs[:, 1]
    mixed = first != second
    rank = xp.cumsum(mixed.astype(xp.int32)) - mixed.astype(xp.int32)   # mixed pairs before this one
    return mixed & (first != (rank % 2 == 0))  # swap where core 0's member is not the kind it should get


def balance_heads(x, swaps):
    """`x` `[heads, ...]` in the balanced order: position i < heads/2 holds pair i's first member
    (after its swap), position heads/2 + i its second."""
    xp = np if isinstance(x, np.ndarray) else _jnp()
    heads = x.shape[0]
    pairs = x.reshape((heads // 2, 2) + x.shape[1:])
    pick = swaps.reshape((heads // 2, 1) + (1,) * (x.ndim - 1))
    pairs = xp.where(pick, pairs[:, ::-1], pairs)
    return xp.swapaxes(pairs, 0, 1).reshape(x.shape)


def _jnp():
    import jax.numpy as jnp
    return jnp


def balanced_order(is_temporal):
    """int32 `[heads]`: the head each grid row runs in the balanced order (`balance_heads` of the
    head indices). NumPy flags give a NumPy order; jnp (traced) flags a jnp one, the kernel's
    `head_order` table."""
    if isinstance(is_temporal, np.ndarray) or not hasattr(is_temporal, "dtype"):
        flags = np.asarray(is_temporal, dtype=bool)
        return balance_heads(np.arange(flags.shape[0], dtype=np.int32), pair_swaps(flags))
    jnp = _jnp()
    flags = is_temporal.astype(bool)
    return balance_heads(jnp.arange(flags.shape[0], dtype=jnp.int32), pair_swaps(flags))


def megacore_balance(mask: SVGMask, is_temporal, *, method: str = "b2", block_q: int = 512,
                     block_kv: int = 512) -> dict:
    """How the in-kernel layer's work falls on a megacore chip's two TensorCores, in the heads' own
    order ("before") and in the balanced order ("after"); analytic, from the two kinds' tile plans.

    A head's work: the tiles it visits (`visited`, every grid step that fetches and computes) and how
    many of them evaluate the mask (`masked`; b1 masks all, b2 the partial ones, b3 padding only). Each core runs a contiguous share of the heads
    (`chips.parallel_split`). Returns {"per_head": {kind: {"visited", "masked"}}, "steps": the grid
    steps every head runs, "before"/"after": {"visited": [per core], "masked": [...], "temporal": [heads
    per core], "balance": mean / max of visited}}; balance 1.0 means both cores finish together.
    """
    mask = check_spatial_mask(mask)
    record = check_method(method, PLANNED_METHODS, what="in-kernel layer method")
    flags = np.asarray(is_temporal)
    if flags.dtype != bool or flags.ndim != 1:
        raise TypeError(f"is_temporal must be a 1-D bool array (True = temporal head), got {flags.dtype} "
                        f"shaped {flags.shape}")
    plans = [plan_kind(mask, kind, block_q, block_kv, rounded=record.rounds_to_tiles) for kind in (0, 1)]
    per_head = {name: {"visited": int(p.visited.sum()),   # b1 masks every tile it visits
                       "masked": int((record.step_classes(p.classes) == PARTIAL).sum())}
                for name, p in zip(("spatial", "temporal"), plans)}

    def split(order):
        kinds = flags[order]
        out = {"visited": [], "masked": [], "temporal": []}
        for share in parallel_split(len(order), 2):
            t = int(kinds[share.start:share.stop].sum())
            s_ = len(share) - t
            out["temporal"].append(t)
            for key in ("visited", "masked"):
                out[key].append(t * per_head["temporal"][key] + s_ * per_head["spatial"][key])
        out["balance"] = float(np.mean(out["visited"]) / max(max(out["visited"]), 1))
        return out

    return {"per_head": per_head, "steps": max(p.steps for p in plans), "method": method,
            "blocks": (block_q, block_kv), "before": split(np.arange(len(flags))),
            "after": split(balanced_order(flags))}


def megacore_chip() -> bool:
    """True where the attached chip is a megacore (v4, v5p): two TensorCores as one jax device."""
    target = TARGETS.get(detect_runtime().tpu_generation)
    return target is not None and target.megacore


# -- planning each kind of head in frame-major order ----------------------------------------------

def plan_kind(mask: SVGMask, kind: int, block_q: int, block_kv: int, rounded: bool = False):
    """The tile plan of one kind of head as the in-kernel kernel sees it (frame-major order):
    kind 0 the spatial mask itself, kind 1 `TemporalMask(mask)`; `rounded` plans B3's
    tile-aligned version."""
    if kind == 0:
        m = mask.tile_aligned(block_q, block_kv) if rounded else mask
        return plan_tiles(m, block_q, block_kv)
    temporal = TemporalMask(mask)  # counts its pairs per tile in closed form, at any size
    return plan_tiles(temporal.tile_aligned(block_q, block_kv) if rounded else temporal, block_q, block_kv)


# -- building and caching ----------------------------------------------------------------------

def build_svg_attention(mask: SVGMask, *, method: str = "b2", heads: int, tokens: int, head_dim: int, dtype,
                        block_q: int = 512, block_kv: int = 512, block_kv_compute: int | None = None,
                        interpret=None, devices=None):
    """A jitted `f(q, k, v, is_temporal) -> out` (physical permutation); plans the kernel once.

    q, k, v `[heads, tokens, head_dim]` frame-major, is_temporal bool `[heads]`. Use it to
    time the layer (time f, not svg_attention) and to count compilations across routings.
    `devices`: as `attention.build_attention`'s (a v7x chip's two devices split the heads).
    """
    import jax

    if devices is not None:
        devices = check_head_split(devices, heads)
        local = build_svg_attention(mask, method=method, heads=heads // len(devices), tokens=tokens,
                                    head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv,
                                    block_kv_compute=block_kv_compute, interpret=interpret)
        return jax.jit(shard_heads(local, devices, heads, per_head=1))
    mask = check_spatial_mask(mask, tokens)
    kernel = build_attention(mask, method=method, heads=heads, tokens=tokens, head_dim=head_dim, dtype=dtype,
                             block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute,
                             interpret=interpret)
    geometry = mask.geometry

    def f(q, k, v, is_temporal):
        return routed_attention(kernel, q, k, v, is_temporal, geometry)

    return jax.jit(f)


def build_svg_attention_in_kernel(mask: SVGMask, *, method: str = "b2", heads: int, tokens: int, head_dim: int,
                                  dtype, block_q: int = 512, block_kv: int = 512,
                                  block_kv_compute: int | None = None, interpret=None, balance_cores=None,
                                  devices=None):
    """A jitted `f(q, k, v, is_temporal) -> out`: the block-sparse kernel following each head's kind.

    Both tile plans (the band for spatial heads, the frame-major `TemporalMask` for temporal
    heads) are stacked by the planner into one schedule table (`stack_schedules`: kind 0 rows,
    then kind 1 rows), and `kernels.block_sparse_attention` gets the flags as its per-head
    `head_kind` and one predicate per kind: a head fetches its own kind's tiles, and partial
    tiles evaluate its own kind's mask (`TemporalMask.keep` is arithmetic, so it runs inside the
    kernel). No token is moved. Methods b1, b2, b3 (b3 rounds each kind's mask in the order the
    kernel sees it, here the scattered frame-major one).

    Cost: each head does only its own kind's work, but every head runs the grid's step count,
    the larger of the two plans (the temporal one); a spatial head's extra steps are idle
    (no DMA, no compute, only the grid-step overhead).

    `balance_cores`: on a megacore chip (v4, v5p) the two TensorCores take contiguous halves of the
    heads, so the grid runs the heads in an order that gives each half an equal share of each kind
    (`balanced_order`, the kernel's `head_order` table; no array is moved). None: when the attached
    chip is a megacore and the head count is even; True: always (odd heads raise); False: never.
    `devices`: as `attention.build_attention`'s (a v7x chip's two devices split the heads).
    """
    import functools

    import jax
    import jax.numpy as jnp

    if devices is not None:
        devices = check_head_split(devices, heads)
        local = build_svg_attention_in_kernel(mask, method=method, heads=heads // len(devices), tokens=tokens,
                                              head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv,
                                              block_kv_compute=block_kv_compute, interpret=interpret,
                                              balance_cores=balance_cores)
        return jax.jit(shard_heads(local, devices, heads, per_head=1))

    mask = check_spatial_mask(mask, tokens)
    record = check_method(method, PLANNED_METHODS, what="in-kernel layer method")
    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    vmem = check_fits(estimate_vmem(method, block_q, block_kv, head_dim, dtype, block_kv_compute))
    interpret = default_interpret() if interpret is None else interpret

    def kind_plans(bq, bkv):  # kind 0 = spatial, kind 1 = temporal
        return [plan_kind(mask, kind, bq, bkv, rounded=record.rounds_to_tiles) for kind in (0, 1)]

    if balance_cores is None:
        balance_cores = heads % 2 == 0 and megacore_chip()
    elif balance_cores is not True and balance_cores is not False:
        raise TypeError(f"balance_cores must be None, True or False, got {balance_cores!r}")
    elif balance_cores and heads % 2:
        raise ValueError(f"balance_cores=True pairs the heads up over two cores: {heads} heads is odd; use an "
                         "even head count, or balance_cores=False / None")

    def suggest(bq, bkv):
        plans = kind_plans(bq, bkv)
        return schedule_smem(heads, 2 * plans[0].grid[0], max(p.steps for p in plans),
                             head_order=balance_cores)

    plans = kind_plans(block_q, block_kv)
    steps = max(p.steps for p in plans)
    check_schedule_fits(plans[0], method=method, heads=heads, kinds=2, steps=steps, suggest=suggest,
                        head_order=balance_cores)
    keeps = tuple(p.mask.kernel_predicate(block_q, block_kv) for p in plans)  # b3: key padding only
    schedule = jnp.asarray(stack_schedules(plans))
    kernel = functools.partial(block_sparse_attention, steps=steps, method=METHODS[method], keep=keeps, block_q=block_q,
                               block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret,
                               vmem_limit_bytes=vmem.vmem_limit_bytes)

    def run(q, k, v, is_temporal):
        order = balanced_order(is_temporal) if balance_cores else None
        return kernel(q, k, v, is_temporal.astype(jnp.int32), schedule, head_order=order)

    return jax.jit(prescaled(run, head_dim=head_dim))


# -- the public layer ------------------------------------------------------------------------

def svg_attention(q, k, v, is_temporal, mask: SVGMask, *, method: str = "b2", block_q: int = 512,
                  block_kv: int = 512, block_kv_compute: int | None = None, interpret=None, split_heads=None):
    """SVG attention with per-head routing, temporal heads permuted physically.

    q, k, v: `[heads, tokens, head_dim]` in frame-major order. is_temporal: bool `[heads]`
    (True = temporal head; may be traced). mask: the spatial `SVGMask`. Each temporal head's
    q, k, v are gathered into temporal-major order, every head runs the same `method` kernel
    with the same mask (b3 rounds it to tiles, as `attention` does), and temporal heads'
    outputs are gathered back. Returns `[heads, tokens, head_dim]`, frame-major.

    The kernel is built once per (mask, shapes, config) and cached; the routing is data, so
    under `jax.jit` any new `is_temporal` reuses the compiled program. `split_heads`: as
    `attention`'s (on a v7x, by default, the heads split over the chip's two devices).
    """
    return _routed_layer(build_svg_attention, q, k, v, is_temporal, mask, split_heads, method=method,
                         block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret)


def _routed_layer(builder, q, k, v, is_temporal, mask, split_heads, **config):
    """Check the inputs, build (cached) and run a routed layer, split over a v7x's two devices where
    `runtime.head_split_devices` says so.

    Split, each device takes a contiguous half of the heads, so temporal heads (more tiles each)
    clustered in one half would leave the other device idle for the difference. The heads go in
    `balanced_order` instead (one head of every pair on each device, mixed pairs alternating: the
    halves differ by at most one head of each kind), a gather on the head axis computed from the
    flags at run time, so a new routing compiles nothing; the output is gathered back.
    `balance_cores=False` keeps contiguous halves."""
    heads, tokens, _ = check_qkv(q, k, v)
    mask = check_spatial_mask(mask, tokens)
    is_temporal = check_flags(is_temporal, heads)
    devices = head_split_devices(q, heads, split_heads)
    f = cached_build(builder, mask, q, devices=devices, **config)
    if devices is None:
        return f(q, k, v, is_temporal)
    if config.get("balance_cores") is False or heads % 2:
        return run_split(f, devices, q, k, v, is_temporal)
    jnp = _jnp()
    order = balanced_order(jnp.asarray(is_temporal))
    out = run_split(f, devices, *(jnp.take(x, order, axis=0) for x in (q, k, v, is_temporal)))
    return jnp.take(out, jnp.argsort(order), axis=0)


def svg_attention_in_kernel(q, k, v, is_temporal, mask: SVGMask, *, method: str = "b2", block_q: int = 512,
                            block_kv: int = 512, block_kv_compute: int | None = None, interpret=None,
                            balance_cores=None, split_heads=None):
    """The in-kernel alternative to `svg_attention`: no permutation, the kernel follows the temporal layout.

    Same arguments and result. Temporal heads stay frame-major and use `TemporalMask(mask)`,
    whose `keep` computes temporal-major positions arithmetically inside the kernel; the
    planner classifies tiles of that scattered mask directly (`TemporalMask` counts its pairs
    per tile in closed form, at any size). b3 rounds the scattered mask to tiles in frame-major order.

    One pallas_call serves both kinds: the per-head flags are scalar-prefetched beside both
    kinds' schedule tables, so a head fetches and masks only its own kind's tiles (see
    `build_svg_attention_in_kernel`). What it costs instead of the permutation: the temporal
    mask is scattered in frame-major order, so temporal heads visit (and mask) far more tiles
    than the band (`compare_temporal_tiles`), and every head runs that longer grid row (a
    spatial head's extra steps are idle). Methods: b1, b2, b3. `balance_cores`: see
    `build_svg_attention_in_kernel` (on a v4 or v5p, by default, both cores get an equal share of each
    kind). `split_heads`: as `attention`'s (on a v7x, by default, the heads split over its two devices).
    """
    return _routed_layer(build_svg_attention_in_kernel, q, k, v, is_temporal, mask, split_heads, method=method,
                         block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret,
                         balance_cores=balance_cores)


# -- comparing the two placements of the permutation ------------------------------------------------

def compare_temporal_tiles(mask: SVGMask, block_q: int, block_kv: int) -> dict:
    """Tiles a temporal head visits: physical permutation (band) vs in-kernel (scattered), as plan stats.

    Returns {"physical": stats, "in_kernel": stats} with the `TilePlan.stats` dicts of the band
    (what the kernel sees after the permutation) and of `TemporalMask(mask)` in frame-major
    order. Both plans are closed-form counts: at the blog's 75,600 tokens this takes well under a second.
    """
    mask = check_spatial_mask(mask)
    return {"physical": plan_tiles(mask, block_q, block_kv).stats,
            "in_kernel": plan_kind(mask, 1, block_q, block_kv).stats}


# -- counting compilations ----------------------------------------------------------------------

class CompileCounter:
    """Counts XLA backend compilations while active (a jax.monitoring listener).

    >>> with CompileCounter() as c:          # doctest: +SKIP
    ...     f(q, k, v, flags_a); f(q, k, v, flags_b)
    >>> c.count                              # doctest: +SKIP
    1

    jax records the event "/jax/core/compile/backend_compile_duration" once per executable it
    compiles (cache hits record nothing), so this counts real compilations of any program,
    jitted functions and eager ops alike: warm up eager helpers before counting.
    """

    EVENT = "/jax/core/compile/backend_compile_duration"
    # One listener for the whole process, registered on first use and never removed: jax before
    # 0.8.1 has no public way to unregister a listener (Colab's 0.7.2 among them), so counters
    # come and go from this list instead.
    _active: list = []
    _registered = False

    def __init__(self):
        self.count = 0

    @classmethod
    def _dispatch(cls, event, duration, **kwargs):
        if event == cls.EVENT:
            for counter in cls._active:
                counter.count += 1

    def __enter__(self):
        import jax

        if not CompileCounter._registered:
            jax.monitoring.register_event_duration_secs_listener(CompileCounter._dispatch)
            CompileCounter._registered = True
        CompileCounter._active.append(self)
        return self

    def __exit__(self, *exc):
        CompileCounter._active.remove(self)
        return False
