"""SVG attention with heads sharded over a device mesh (`jax.shard_map`).

In multi-chip inference the layer's activations arrive sequence-parallel: each of the P
devices holds all heads for N/P tokens, `[heads, tokens/P, head_dim]`. Attention needs every
token of a head in one place, so an all-to-all turns that into head-parallel data: each device
holds heads/P heads for all N tokens. After attention a second all-to-all returns to
sequence-parallel.

Where the temporal permutation goes (brief, section 1):

* `permute="after"` (the blog's choice): inside shard_map, after the first all-to-all, each
  device gathers its own temporal heads into temporal-major order. The data is head-local
  and complete, so the gather is a local memory shuffle; the inverse gather runs before the
  return all-to-all.
* `permute="before"`: the permutation is applied to the global, still sequence-sharded array
  before the exchange (and undone after the return exchange). Temporal-major order interleaves
  tokens from every frame, i.e. from every device's shard, so XLA must move data between devices
  for each of the two gathers, on top of the two all-to-alls.

Both give the same numbers; they differ in communication. Tokens that do not divide by the
mesh size are padded with zeros at the end before the exchange and sliced off after it, so the
kernel always sees exactly the geometry's N tokens and the mask is untouched.
"""
from __future__ import annotations

import functools

import numpy as np

from .reference import check_qkv
from .routing import check_flags, check_spatial_mask, gather_heads, head_gather_index, routed_attention

PLACEMENTS = ("after", "before")


def _axis_size(mesh, axis_name: str) -> int:
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh (axes: {mesh.axis_names})")
    return int(mesh.shape[axis_name])


@functools.lru_cache(maxsize=16)
def _build(mask, mesh, axis_name, permute, method, heads, tokens, head_dim, dtype, block_q, block_kv,
           block_kv_compute, interpret):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from .attention import build_attention

    devices = _axis_size(mesh, axis_name)
    local_heads = heads // devices
    padded = -(-tokens // devices) * devices
    geometry = mask.geometry
    kernel = build_attention(mask, method=method, heads=local_heads, tokens=tokens, head_dim=head_dim,
                             dtype=dtype, block_q=block_q, block_kv=block_kv,
                             block_kv_compute=block_kv_compute, interpret=interpret)

    def to_heads(x):    # [heads, padded/P, D] sequence shard -> [heads/P, padded, D] head shard
        return jax.lax.all_to_all(x, axis_name, split_axis=0, concat_axis=1, tiled=True)

    def to_tokens(x):   # [heads/P, padded, D] head shard -> [heads, padded/P, D] sequence shard
        return jax.lax.all_to_all(x, axis_name, split_axis=1, concat_axis=0, tiled=True)

    def local(q, k, v, flags):
        q, k, v = (to_heads(x)[:, :tokens] for x in (q, k, v))  # drop the padding: the kernel sees N tokens
        if permute == "after":
            out = routed_attention(kernel, q, k, v, flags, geometry)  # head-local gathers
        else:
            out = kernel(q, k, v)  # tokens arrived already permuted
        out = jnp.pad(out, ((0, 0), (0, padded - tokens), (0, 0)))
        return to_tokens(out)

    seq, head = P(None, axis_name, None), P(axis_name)
    # check_vma=False: the kernels' pallas_call declares a plain out_shape (no per-axis "varying"
    # annotation), which shard_map's type check would reject; every value in `local` varies
    # over the axis anyway, so there is nothing for the check to catch here.
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(seq, seq, seq, head), out_specs=seq, check_vma=False)
    seq_sharding = NamedSharding(mesh, seq)

    def f(q, k, v, is_temporal):
        if permute == "before":
            # global gathers on sequence-sharded arrays: XLA inserts the cross-device traffic
            fwd = head_gather_index(is_temporal, geometry)
            q, k, v = (jax.lax.with_sharding_constraint(gather_heads(x, fwd), seq_sharding) for x in (q, k, v))
        pad = ((0, 0), (0, padded - tokens), (0, 0))
        q, k, v = (jax.lax.with_sharding_constraint(jnp.pad(x, pad), seq_sharding) for x in (q, k, v))
        out = sharded(q, k, v, is_temporal)[:, :tokens]
        if permute == "before":
            out = gather_heads(jax.lax.with_sharding_constraint(out, seq_sharding),
                               head_gather_index(is_temporal, geometry, inverse=True))
        return jax.lax.with_sharding_constraint(out, seq_sharding)  # hand back sequence-parallel data

    return jax.jit(f)


def build_sharded_svg_attention(mask, *, mesh, axis_name: str = "x", permute: str = "after", method: str = "b2",
                                heads: int, tokens: int, head_dim: int, dtype, block_q: int = 512,
                                block_kv: int = 512, block_kv_compute: int | None = None, interpret=None):
    """A jitted `f(q, k, v, is_temporal) -> out` over `mesh` (cached); see `sharded_svg_attention`."""
    import jax.numpy as jnp

    mask = check_spatial_mask(mask, tokens)
    if permute not in PLACEMENTS:
        raise ValueError(f"permute must be 'after' (the head exchange, head-local) or 'before', got {permute!r}")
    devices = _axis_size(mesh, axis_name)
    if heads % devices:
        raise ValueError(f"{heads} heads cannot be split evenly over the {devices} devices of mesh axis "
                         f"{axis_name!r}; use a head count divisible by {devices} or a smaller mesh")
    return _build(mask, mesh, axis_name, permute, method, int(heads), int(tokens), int(head_dim),
                  jnp.dtype(dtype), block_q, block_kv, block_kv_compute, interpret)


def sharded_svg_attention(q, k, v, is_temporal, mask, *, mesh, axis_name: str = "x", permute: str = "after",
                          method: str = "b2", block_q: int = 512, block_kv: int = 512,
                          block_kv_compute: int | None = None, interpret=None):
    """`svg_attention` with heads sharded over `mesh[axis_name]` (P devices); same result.

    q, k, v: `[heads, tokens, head_dim]`, frame-major, ideally sharded on tokens over the axis
    (`NamedSharding(mesh, PartitionSpec(None, axis_name, None))`; other layouts are resharded).
    is_temporal: bool `[heads]`. heads must divide by P (clear error otherwise); tokens need not:
    they are zero-padded to a multiple of P for the exchange and the padding never reaches the
    kernel. `permute`: "after" (permute head-local data after the all-to-all, the blog's choice)
    or "before" (permute the sequence-sharded array before it). Returns `[heads, tokens,
    head_dim]`, sequence-sharded when tokens divide by P (otherwise XLA picks the layout of the
    unpadded result; on simulated CPU devices it comes back replicated).
    """
    heads, tokens, head_dim = check_qkv(q, k, v)
    is_temporal = check_flags(is_temporal, heads)
    f = build_sharded_svg_attention(mask, mesh=mesh, axis_name=axis_name, permute=permute, method=method,
                                    heads=heads, tokens=tokens, head_dim=head_dim, dtype=q.dtype, block_q=block_q,
                                    block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret)
    return f(q, k, v, is_temporal)


def make_mesh(devices: int | None = None, axis_name: str = "x"):
    """A 1-D `jax.sharding.Mesh` over the first `devices` devices (all of them by default)."""
    import jax
    from jax.sharding import Mesh

    available = jax.devices()
    devices = len(available) if devices is None else devices
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or not 1 <= devices <= len(available):
        raise ValueError(f"devices must be an integer in [1, {len(available)}] (jax sees {len(available)}); got "
                         f"{devices!r}. On a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N "
                         "before jax is imported to simulate N devices")
    return Mesh(np.array(available[:devices]), (axis_name,))


COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "collective-permute", "reduce-scatter")


def collective_counts(f, *args) -> dict:
    """How many of each cross-device collective XLA compiled into jitted `f(*args)`: {op name: count}.

    Read from the optimized HLO text (`f.lower(*args).compile().as_text()`), so it shows the
    communication the SPMD partitioner really inserted, e.g. for the two `permute` placements.
    """
    import re

    text = f.lower(*args).compile().as_text()
    return {op: len(re.findall(rf"\b{op}(?:-start)?\(", text)) for op in COLLECTIVES}
