"""SVG attention with heads sharded over a device mesh (`jax.shard_map`), and its communication.

In multi-chip inference the layer's activations arrive sequence-parallel: each of the P
devices holds all heads for N/P tokens, `[heads, tokens/P, head_dim]`. Attention needs every
token of a head in one place, so an all-to-all turns that into head-parallel data: each device
holds heads/P heads for all N tokens. After attention a second all-to-all returns to
sequence-parallel. With q, k, v in and the output back, a layer runs four all-to-alls.

Where the temporal permutation goes (the case study compared the two):

* `permute="after"` (the case study's choice): after the head all-to-all each device holds
  whole heads, all N tokens, so gathering its temporal heads into temporal-major order is a
  local memory shuffle (and the inverse one before the return all-to-all). No communication
  beyond the layer's four all-to-alls.
* `permute="before"`: the permutation runs on the sequence-sharded arrays, before the head
  exchange (and its inverse after the return exchange). Temporal-major order interleaves the
  frames, so the N/P tokens a device holds afterwards come from every device's shard: the
  permutation itself is communication. Its minimum is one more all-to-all per permuted array
  (each device sends every other device exactly the tokens that land there), which is how it
  is written here (`shard_exchange_tables`): eight all-to-alls per layer instead of four.
  Routing is data, so every head's tokens travel and spatial heads keep their unpermuted copy
  (`jnp.where`); block sizes are padded to the largest device-to-device share (at Wan's 21
  frames over 8 chips, 1,350 tokens against an average 1,181).

  Written instead as a global gather on the sequence-sharded array (`x[:, perm]` under jit),
  the permutation makes XLA all-gather the whole array onto every device first: P times the
  bytes of the all-to-all, for the same result (notebook 09 shows both).

Both placements give the same numbers, bit for bit; they differ in communication only.
Tokens that do not divide by the mesh size are padded with zeros at the end before the
exchange and sliced off after it, so the kernel always sees exactly the geometry's N tokens.

`hlo_collectives` reads the collectives (kind, count, bytes) out of an optimized HLO module,
the same way for a program compiled for simulated CPU devices (`collective_counts`) and for a
TPU slice compiled on this CPU (`svg_lib.instruments.tpu.sharded.compile_sharded_layer`, libtpu, compile-only).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from svg_lib.attention import build_attention
from svg_lib.core.geometry import inverse_temporal_major_permutation, temporal_major_permutation
from svg_lib.kernels.reference import check_qkv
from svg_lib.layers.routing import check_flags, check_spatial_mask, routed_attention

PLACEMENTS = ("after", "before")


def _axis_size(mesh, axis_name: str) -> int:
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh (axes: {mesh.axis_names})")
    return int(mesh.shape[axis_name])


# -- permuting a sequence-sharded array: one all-to-all ------------------------------------------

@dataclass(frozen=True, eq=False)   # holds arrays: compare fields, not objects
class ShardExchange:
    """Static tables that apply a token permutation to an array sharded on tokens over P devices.

    Device d holds tokens `[d*n, (d+1)*n)`; afterwards it must hold positions `[d*n, (d+1)*n)`
    of `x[perm]`. It sends device e a block of `block` tokens (padded: shares differ slightly),
    `send[d, e*block:(e+1)*block]` being indices into its own shard, in the order e needs them;
    one tiled all-to-all delivers the blocks; `recv[e]` (indices into the `[P*block]` received
    buffer) puts them in place.
    """

    send: np.ndarray   # int32 [P, P*block]
    recv: np.ndarray   # int32 [P, n]
    block: int
    shares: np.ndarray  # int [P, P]: tokens device d sends device e (the true payload)


def shard_exchange_tables(perm, devices: int) -> ShardExchange:
    """The `ShardExchange` for gather indices `perm` [tokens] over `devices` equal shards."""
    perm = np.asarray(perm, dtype=np.int64)
    tokens = perm.shape[0]
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
        raise ValueError(f"devices must be a positive integer, got {devices!r}")
    if tokens % devices:
        raise ValueError(f"{tokens} tokens do not split into {devices} equal shards; pad the token axis to a "
                         f"multiple of {devices} first")
    if not np.array_equal(np.sort(perm), np.arange(tokens)):
        raise ValueError("perm must be a permutation of 0 .. tokens-1")
    n = tokens // devices
    position = np.arange(tokens)
    dst, src = position // n, perm // n
    order = np.lexsort((position, src, dst))            # grouped by (dst, src), each group in position order
    shares = np.zeros((devices, devices), np.int64)
    np.add.at(shares, (src, dst), 1)
    group_start = np.concatenate([[0], np.cumsum(shares.T.ravel())[:-1]]).reshape(devices, devices)  # [dst, src]
    rank = np.empty(tokens, np.int64)
    rank[order] = np.arange(tokens) - group_start[dst[order], src[order]]
    block = max(int(shares.max()), 1)
    send = np.zeros((devices, devices * block), np.int32)
    send[src, dst * block + rank] = perm - src * n
    recv = np.zeros((devices, n), np.int32)
    recv[dst, position - dst * n] = src * block + rank
    return ShardExchange(send, recv, block, shares)


def _exchange(x, tables: ShardExchange, axis_name: str):
    """Inside shard_map: this device's `[heads, n, D]` shard of `x` -> its shard of `x[:, perm]`."""
    import jax
    import jax.numpy as jnp

    d = jax.lax.axis_index(axis_name)
    send = jnp.asarray(tables.send)[d]
    recv = jnp.asarray(tables.recv)[d]
    blocks = jnp.take(x, send, axis=1)     # [heads, P*block, D]: block e is what device e needs from here
    blocks = jax.lax.all_to_all(blocks, axis_name, split_axis=1, concat_axis=1, tiled=True)
    return jnp.take(blocks, recv, axis=1)  # block e now holds what device e sent here


# -- the layer ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _build(mask, mesh, axis_name, permute, method, heads, tokens, head_dim, dtype, block_q, block_kv,
           block_kv_compute, interpret):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = _axis_size(mesh, axis_name)
    local_heads = heads // devices
    padded = -(-tokens // devices) * devices
    geometry = mask.geometry
    kernel = build_attention(mask, method=method, heads=local_heads, tokens=tokens, head_dim=head_dim,
                             dtype=dtype, block_q=block_q, block_kv=block_kv,
                             block_kv_compute=block_kv_compute, interpret=interpret)
    if permute == "before":
        # the permutation of the padded sequence: padding tokens stay where they are
        tail = np.arange(tokens, padded)
        forward = shard_exchange_tables(np.concatenate([temporal_major_permutation(geometry), tail]), devices)
        inverse = shard_exchange_tables(np.concatenate([inverse_temporal_major_permutation(geometry), tail]),
                                        devices)

    def to_heads(x):    # [heads, padded/P, D] sequence shard -> [heads/P, padded, D] head shard
        return jax.lax.all_to_all(x, axis_name, split_axis=0, concat_axis=1, tiled=True)

    def to_tokens(x):   # [heads/P, padded, D] head shard -> [heads, padded/P, D] sequence shard
        return jax.lax.all_to_all(x, axis_name, split_axis=1, concat_axis=0, tiled=True)

    def local(q, k, v, flags):
        if permute == "before":
            # flags: all heads. Every head's tokens are exchanged (routing is data, shapes are static);
            # a spatial head keeps its own unpermuted copy.
            pick = flags[:, None, None]
            q, k, v = (jnp.where(pick, _exchange(x, forward, axis_name), x) for x in (q, k, v))
        q, k, v = (to_heads(x)[:, :tokens] for x in (q, k, v))  # drop the padding: the kernel sees N tokens
        if permute == "after":
            out = routed_attention(kernel, q, k, v, flags, geometry)  # flags: this device's heads; local gathers
        else:
            out = kernel(q, k, v)  # tokens arrived already permuted
        out = to_tokens(jnp.pad(out, ((0, 0), (0, padded - tokens), (0, 0))))
        if permute == "before":
            out = jnp.where(pick, _exchange(out, inverse, axis_name), out)
        return out

    seq = P(None, axis_name, None)
    flag_spec = P(axis_name) if permute == "after" else P()
    # check_vma=False: the kernels' pallas_call declares a plain out_shape (no per-axis "varying"
    # annotation), which shard_map's type check would reject; every value in `local` varies
    # over the axis anyway, so there is nothing for the check to catch here.
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(seq, seq, seq, flag_spec), out_specs=seq, check_vma=False)
    seq_sharding = NamedSharding(mesh, seq)

    def f(q, k, v, is_temporal):
        pad = ((0, 0), (0, padded - tokens), (0, 0))
        q, k, v = (jax.lax.with_sharding_constraint(jnp.pad(x, pad), seq_sharding) for x in (q, k, v))
        out = sharded(q, k, v, is_temporal)[:, :tokens]
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
    kernel. `permute`: "after" (permute head-local data after the all-to-all, the case study's
    choice; no extra communication) or "before" (permute the sequence-sharded arrays before it,
    one extra all-to-all per array: see the module docstring). Returns `[heads, tokens,
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


@dataclass(frozen=True)
class MeshChoice:
    """Which devices a notebook's mesh runs on, and why (see `choose_mesh_devices`).

    `source`: "default" (jax's default backend has enough devices: a TPU slice, or simulated CPU
    devices on a CPU), "cpu" (the accelerator has too few, e.g. one v5e or v6e chip, so the mesh
    runs on the CPU backend's simulated devices beside it) or "none" (fewer than `need` devices
    anywhere: no mesh can run here). `interpret`: whether kernels on these devices run in
    interpret mode (True on CPU devices, False on TPU chips).
    """

    devices: tuple
    source: str
    interpret: bool
    default_platform: str
    default_count: int

    @property
    def runs(self) -> bool:
        return self.source != "none"

    @property
    def platform(self) -> str:
        return str(self.devices[0].platform).lower() if self.devices else self.default_platform

    def describe(self) -> str:
        n = len(self.devices)
        kernels = "interpret mode" if self.interpret else "compiled through Mosaic"
        if self.source == "default":
            return f"mesh over {n} {self.platform} devices of jax's default backend; kernels {kernels}"
        if self.source == "cpu":
            return (f"fell back to the CPU backend: the default backend ({self.default_platform}) has "
                    f"{self.default_count} device{'s' if self.default_count != 1 else ''}, too few for a mesh, so the "
                    f"mesh runs over {n} simulated CPU devices beside it; kernels {kernels}")
        return (f"fell back to compiled evidence: {self.default_count} {self.default_platform} device"
                f"{'s' if self.default_count != 1 else ''} and no simulated CPU devices (XLA_FLAGS "
                "--xla_force_host_platform_device_count was not set before jax started), so no mesh runs here")


def choose_mesh_devices(most: int = 8, need: int = 2, *, default_devices=None, cpu_devices=None) -> MeshChoice:
    """Pick the devices for a mesh of up to `most` (a power of two) and at least `need` devices.

    jax's default devices first (chips on a TPU slice, simulated devices on a CPU). Where they are
    too few, e.g. Colab's single v5e or v6e chip, the CPU backend's devices: jax starts it beside
    the TPU, and `--xla_force_host_platform_device_count` in XLA_FLAGS (set before jax starts)
    multiplies them there too. Neither: `source="none"`, and `devices` holds the one default device.
    `default_devices` / `cpu_devices` replace `jax.devices()` / `jax.devices("cpu")` (for tests).
    """
    import jax

    default = list(jax.devices() if default_devices is None else default_devices)
    if cpu_devices is None:
        try:
            cpu_devices = jax.devices("cpu")
        except RuntimeError:   # a jax started with JAX_PLATFORMS naming no cpu backend
            cpu_devices = []
    cpu = list(cpu_devices)

    def largest(pool):
        sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= min(len(pool), most)]
        return max(sizes) if sizes else 0

    platform = str(default[0].platform).lower() if default else "none"
    n = largest(default)
    if n >= need:
        return MeshChoice(tuple(default[:n]), "default", platform != "tpu", platform, len(default))
    n = largest(cpu)
    if n >= need:
        return MeshChoice(tuple(cpu[:n]), "cpu", True, platform, len(default))
    return MeshChoice(tuple(default[:1]), "none", platform != "tpu", platform, len(default))


COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "collective-permute", "reduce-scatter")


@dataclass(frozen=True)
class Collective:
    """The collectives of one kind in a compiled module, per device (SPMD HLO is one device's program).

    `operand_bytes`: what the device hands to these ops, summed; `result_bytes`: what it gets
    back. An all-to-all keeps 1/g of its operand and swaps the rest with the g - 1 others of its
    group (g in `group_sizes`); an all-gather returns g times its operand, of which the device
    receives (g - 1)/g.
    """

    kind: str
    count: int = 0
    operand_bytes: int = 0
    result_bytes: int = 0
    shapes: tuple = ()        # result shape of each op, layout stripped: "bf16[40,9450,128]"
    group_sizes: tuple = ()   # distinct replica-group sizes (devices taking part in each op)


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape ("bf16[5,75600,128]{2,1,0:T(8,128)}", or a tuple of them)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        digits = re.search(r"\d+", dtype)   # bf16 -> 16, f8e4m3fn -> 8, s4 -> 4; token[] -> 0
        bits = 8 if dtype == "pred" else int(digits.group()) if digits else 0
        total += (int(np.prod([int(d) for d in dims.split(",") if d])) * bits + 7) // 8
    return total


def plain_shape(shape: str) -> str:
    """An HLO shape without its layout: "bf16[5,75600,128]{2,1,0:T(8,128)}" -> "bf16[5,75600,128]"."""
    return ", ".join(f"{dtype}[{dims}]" for dtype, dims in _ARRAY.findall(shape))


def _operand_names(rest: str) -> list:
    """Names of the operands in the text after an op's opening parenthesis."""
    depth, end = 1, len(rest)
    for i, ch in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            end = i
            break
    return re.findall(r"%([\w.\-]+)", rest[:end])


def _group_size(attributes: str):
    explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", attributes)
    if explicit:
        return len(explicit.group(1).split(","))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
    if iota:
        return int(iota.group(2))
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
    if named:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", named.group(1)))
        return int(np.prod([int(sizes[a]) for a in re.findall(r"'([^']+)'", named.group(2))]))
    return None


def hlo_collectives(hlo) -> dict:
    """The cross-device collectives in an optimized HLO module: `{kind: Collective}`, every kind listed.

    `hlo`: the module's text (`compiled.as_text()`) or a compiled object. Works alike for CPU
    and TPU modules; an async pair (`all-gather-start` / `-done`) counts once, its result read
    from the `-done`. Operand sizes come from the operands' own definitions in the module.
    """
    text = hlo if isinstance(hlo, str) else hlo.as_text()
    shapes, found, done_shape = {}, [], {}
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, shape, op, rest = match.groups()
        shapes[name] = shape
        base = op[:-len("-start")] if op.endswith("-start") else op
        if base in COLLECTIVES:
            found.append((name, base, shape, op != base, _operand_names(rest), _group_size(rest)))
        elif op.endswith("-done") and op[:-len("-done")] in COLLECTIVES:
            for start in _operand_names(rest)[:1]:
                done_shape[start] = shape
    tally = {kind: dict(count=0, operand_bytes=0, result_bytes=0, shapes=[], group_sizes=set()) for kind in COLLECTIVES}
    for name, kind, shape, is_async, operands, group in found:
        result = done_shape.get(name, shape) if is_async else shape
        entry = tally[kind]
        entry["count"] += 1
        entry["operand_bytes"] += sum(_shape_bytes(shapes.get(o, "")) for o in operands)
        entry["result_bytes"] += _shape_bytes(result)
        entry["shapes"].append(plain_shape(result))
        if group is not None:
            entry["group_sizes"].add(group)
    return {kind: Collective(kind, e["count"], e["operand_bytes"], e["result_bytes"], tuple(e["shapes"]),
                             tuple(sorted(e["group_sizes"]))) for kind, e in tally.items()}


def collective_counts(f, *args) -> dict:
    """How many of each cross-device collective XLA compiled into jitted `f(*args)`: {kind: count}.

    Read from the optimized HLO (`hlo_collectives`), so it shows the communication the SPMD
    partitioner really inserted, e.g. for the two `permute` placements.
    """
    return {kind: c.count for kind, c in hlo_collectives(f.lower(*args).compile()).items()}
