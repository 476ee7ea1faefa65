"""The six axis orders of the video tokens, each with a static tile mask, as candidates for positional heads.

Video tokens are laid out (frame, height, width): frame-major, token (f, r, c) at f*H*W + r*W + c.
An *axis order* names which axis runs slowest and which fastest: "fhw" is that layout (the
identity), "hwf" puts a token's frames side by side (SVG's temporal-major permutation,
`core.geometry.temporal_major_permutation`), and "fwh", "hfw", "wfh", "whf" are the other four. In
its own order a head whose attention follows one axis finds its keys in a few tiles near the
diagonal, tiles a band can hold.

An order is a reshape and a transpose, no gather: `[heads, tokens, head_dim]` seen as `[heads, F,
H, W, head_dim]`, its three grid axes transposed, flattened back (`to_axis_order`,
`from_axis_order`); text tokens, if any, stay last. `order_permutation` gives the same order as
gather indices, for plans (`semantic.SemanticPlan`) and for checking.

Each order's tile mask is chosen once from a few sampled query rows (`order_tiles`): each row's
dense softmax mass, in the order, summed per key tile and pooled by the key tile's offset from the
tile holding the row's own position; every query tile then keeps the `round(density x nk)` key
tiles at the offsets that held the most mass. A band whose shape the head's own rows chose, the
same for every query tile, so query tiles no sampled row falls in are served too; every kept tile
is whole, so B3 runs it mask-free (only the key tiles reaching into padding mask their padding).

`axis_order_attention` runs one order for all heads given: q, k, v transposed in, the B3 kernels
over the tiles (`semantic.b3_on_tiles`), the output transposed back. `order_plan` is the same order
and tiles as a `SemanticPlan`, which the router (`semantic_router.route_orders`) mixes per head
with SVG's bands and semantic tiles in one program (there the permutation is a gather, as for
every plan).

What moving an order costs: `transpose_bytes` counts the bytes a transpose of q, k, v in and the
output back reads and writes (none for "fhw"); the cost model prices the attention
(`instruments.tools.axis_order_cost`).
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from svg_lib.core.geometry import VideoGeometry
from svg_lib.layers.semantic import SemanticPlan, b3_on_tiles, check_density, check_qk, tile_budget

AXES = "fhw"  # frame, height, width: the frame-major layout, slowest axis first
AXIS_ORDERS = tuple("".join(p) for p in itertools.permutations(AXES))  # fhw fwh hfw hwf wfh whf
TEMPORAL_ORDER = "hwf"  # SVG's temporal-major permutation


def _jax():
    import jax
    return jax


def check_order(order) -> str:
    """An axis order: a string of the letters f, h, w, each once (slowest axis first), one of AXIS_ORDERS."""
    if not isinstance(order, str) or order not in AXIS_ORDERS:
        raise ValueError(f"order must be one of {', '.join(AXIS_ORDERS)} (axes frame, height, width, slowest "
                         f"first; 'fhw' is the frame-major layout), got {order!r}")
    return order


def _check_geometry(geometry) -> VideoGeometry:
    if not isinstance(geometry, VideoGeometry):
        raise TypeError(f"geometry must be a VideoGeometry (frames, height, width), got {type(geometry).__name__}")
    return geometry


def order_axes(order: str) -> tuple[int, int, int]:
    """The transpose of the (frame, height, width) grid that gives `order`: e.g. "hwf" -> (1, 2, 0)."""
    return tuple(AXES.index(a) for a in check_order(order))


def order_permutation(geometry: VideoGeometry, order: str) -> np.ndarray:
    """int64 `[tokens]` gather indices: `to_axis_order(x)[:, j] == x[:, perm[j]]` (text tokens stay last)."""
    g = _check_geometry(geometry)
    video = np.arange(g.video_tokens, dtype=np.int64).reshape(g.frames, g.height, g.width)
    return np.concatenate([video.transpose(order_axes(order)).ravel(),
                           np.arange(g.video_tokens, g.tokens, dtype=np.int64)])


def _check_x(x, geometry: VideoGeometry):
    if getattr(x, "ndim", None) != 3 or x.shape[1] != geometry.tokens:
        raise ValueError(f"expected [heads, tokens, head_dim] with {geometry.tokens} tokens ({geometry}), got shape "
                         f"{tuple(getattr(x, 'shape', ()))}")


def _transposed(x, geometry: VideoGeometry, dims, axes):
    """The video tokens of x `[heads, tokens, d]` seen as `[heads, *dims, d]`, transposed by `axes`."""
    heads, _, d = x.shape
    V = geometry.video_tokens
    video = x[:, :V].reshape((heads,) + tuple(dims) + (d,)).transpose((0,) + tuple(1 + a for a in axes) + (4,))
    video = video.reshape(heads, V, d)
    if not geometry.text_tokens:
        return video
    if isinstance(x, np.ndarray):
        return np.concatenate([video, x[:, V:]], axis=1)
    import jax.numpy as jnp
    return jnp.concatenate([video, x[:, V:]], axis=1)


def to_axis_order(x, geometry: VideoGeometry, order: str):
    """`[heads, tokens, head_dim]` (NumPy or jax) from frame-major into `order`: a reshape and a transpose."""
    g = _check_geometry(geometry)
    _check_x(x, g)
    return _transposed(x, g, (g.frames, g.height, g.width), order_axes(order))


def from_axis_order(x, geometry: VideoGeometry, order: str):
    """Undo `to_axis_order`: `[heads, tokens, head_dim]` in `order` back to frame-major (the inverse transpose)."""
    g = _check_geometry(geometry)
    _check_x(x, g)
    axes = order_axes(order)
    dims = tuple((g.frames, g.height, g.width)[a] for a in axes)
    return _transposed(x, g, dims, tuple(int(i) for i in np.argsort(axes)))


# -- the tile mask of an order, from sampled rows -----------------------------------------------

def offset_mass(q, k, geometry: VideoGeometry, order: str, rows, *, block_q: int, block_kv: int):
    """f32 `[heads, 2 nk - 1]`: the sampled rows' mean softmax mass per key-tile offset, in `order`.

    q, k `[heads, tokens, head_dim]` frame-major; `rows` int `[r]` (frame-major query indices). Each
    row's mass (dense softmax, scale 1/sqrt(head_dim)) is summed per key tile of the order; offset
    o (index o + nk - 1) is the key tile o tiles after the one holding the row's own position.
    Only heads x rows x tokens scores are formed."""
    jax = _jax()
    import jax.numpy as jnp

    heads, tokens, d = check_qk(q, k)
    g = _check_geometry(geometry)
    if g.tokens != tokens:
        raise ValueError(f"q and k hold {tokens} tokens but the geometry {g} has {g.tokens}")
    perm = order_permutation(g, order)
    place = np.argsort(perm)
    rows = np.asarray(rows, np.int64)
    if rows.ndim != 1 or rows.size == 0 or rows.min() < 0 or rows.max() >= tokens:
        raise ValueError(f"rows must be a non-empty 1-D array of query indices in [0, {tokens}), got {rows!r}")
    nk = -(-tokens // block_kv)
    s = jnp.einsum("hrd,hkd->hrk", q[:, rows].astype(jnp.float32), k.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST) / math.sqrt(d)
    p = jax.nn.softmax(s, axis=-1)[:, :, perm]                                  # keys in the order
    p = jnp.pad(p, ((0, 0), (0, 0), (0, nk * block_kv - tokens)))
    tile_mass = p.reshape(heads, rows.size, nk, block_kv).sum(axis=-1)        # [heads, r, nk]
    own = place[rows] // block_kv                                             # the row's own key tile
    index = np.arange(nk)[None, :] - own[:, None] + nk - 1                    # [r, nk] -> offset index
    return jnp.zeros((heads, 2 * nk - 1), jnp.float32).at[:, index].add(tile_mass) / rows.size


def tiles_from_offsets(mass, tokens: int, *, block_q: int, block_kv: int, density: float):
    """bool `[heads, nq, nk]`: per query tile, the `tile_budget(density, nk)` key tiles at the offsets
    of most `mass` (f32 `[heads, 2 nk - 1]`, `offset_mass`), offsets counted from the key tile holding
    the query tile's middle token. Ties go to the nearer offset."""
    jax = _jax()
    import jax.numpy as jnp

    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    steps = tile_budget(check_density(density), nk)
    middle = np.minimum(np.arange(nq) * block_q + block_q // 2, tokens - 1) // block_kv       # [nq]
    offset = np.arange(nk)[None, :] - middle[:, None]                                         # [nq, nk]
    score = jnp.asarray(mass)[:, offset + nk - 1]                                             # [heads, nq, nk]
    score = score - 1e-9 * jnp.asarray(np.abs(offset), jnp.float32)  # ties: the nearer offset
    _, top = jax.lax.top_k(score, steps)                                                      # [heads, nq, steps]
    return jnp.zeros(score.shape, bool).at[jnp.arange(score.shape[0])[:, None, None],
                                           jnp.arange(nq)[None, :, None], top].set(True)


def order_tiles(q, k, geometry: VideoGeometry, order: str, rows, *, density: float, block_q: int, block_kv: int):
    """bool `[heads, nq, nk]`: `order`'s static tile mask for each head, chosen from the sampled `rows`
    (`offset_mass`, then `tiles_from_offsets`); tiles in the order's coordinates. Traceable."""
    mass = offset_mass(q, k, geometry, order, rows, block_q=block_q, block_kv=block_kv)
    return tiles_from_offsets(mass, geometry.tokens, block_q=block_q, block_kv=block_kv, density=density)


def order_plan(tiles, geometry: VideoGeometry, order: str, *, block_q: int, block_kv: int, centroids=None,
               steps: int | None = None) -> SemanticPlan:
    """`order` and its `tiles` (bool `[heads, nq, nk]`) as a `SemanticPlan`: every head's q and k in the
    order (`order_permutation`), the tiles as given. `steps`: the plan's budget per query tile (None:
    the most any row of `tiles` keeps, which needs concrete tiles). `centroids`: carried as they are
    (a router passes the semantic plan's)."""
    import jax.numpy as jnp

    heads = int(tiles.shape[0])
    perm = order_permutation(geometry, order)
    if steps is None:
        steps = max(int(np.asarray(tiles).sum(axis=-1).max()), 1)
    rows, places = (jnp.broadcast_to(jnp.asarray(o, jnp.int32), (heads, perm.size)) for o in (perm, np.argsort(perm)))
    return SemanticPlan(rows, rows, places, places, jnp.asarray(tiles, bool), centroids, block_q, block_kv, int(steps))


# -- attention in an order ----------------------------------------------------------------------

def axis_order_attention(q, k, v, geometry: VideoGeometry, order: str, tiles, *, block_q: int, block_kv: int,
                         steps: int | None = None, interpret=None, generation: str | None = None):
    """B3 attention of every head in `order` over `tiles`, returned frame-major: `[heads, tokens, head_dim]`.

    q, k, v `[heads, tokens, head_dim]` float32 or bfloat16, frame-major; `tiles` bool `[heads, nq, nk]`
    in the order's coordinates (`order_tiles`). q, k, v are transposed into the order, the B3
    kernels compute the tiles (tables made on the device), the output is transposed back. `steps`:
    the static budget per query tile (None: the most `tiles` keeps in a row; concrete tiles)."""
    g = _check_geometry(geometry)
    heads, tokens, head_dim = check_qk(q, k)
    if tuple(v.shape) != tuple(q.shape):
        raise ValueError(f"v must be shaped like q {tuple(q.shape)}, got {tuple(v.shape)}")
    _check_x(q, g)
    check_order(order)
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    if tuple(tiles.shape) != (heads, nq, nk):
        raise ValueError(f"tiles must be bool [heads, nq, nk] = {(heads, nq, nk)} for {tokens} tokens in "
                         f"{block_q} x {block_kv} tiles, got {tuple(tiles.shape)}")
    if steps is None:
        steps = max(int(np.asarray(tiles).sum(axis=-1).max()), 1)
    fn = _built_order(g, order, head_dim, str(q.dtype), block_q, block_kv, int(steps), interpret, generation)
    return fn(q, k, v, tiles)


@functools.lru_cache(maxsize=16)
def _built_order(geometry, order, head_dim, dtype, block_q, block_kv, steps, interpret, generation):
    jax = _jax()
    on_tiles = b3_on_tiles(geometry.tokens, head_dim, dtype, block_q, block_kv, steps, None, interpret, None,
                           generation)

    def f(q, k, v, tiles):
        into = [to_axis_order(x, geometry, order) for x in (q, k, v)]
        return from_axis_order(on_tiles(*into, tiles), geometry, order)

    return jax.jit(f)


# -- what an order's permutation moves ------------------------------------------------------------

def transpose_bytes(geometry: VideoGeometry, order: str, *, head_dim: int, itemsize: int = 2, heads: int = 1) -> int:
    """Bytes of HBM a transpose into `order` of q, k, v and of the output back reads and writes: each of
    the 4 arrays `[heads, video tokens, head_dim]` read once and written once; 0 for "fhw" (no transpose)."""
    g = _check_geometry(geometry)
    if check_order(order) == AXES:
        return 0
    return 4 * 2 * heads * g.video_tokens * head_dim * itemsize
