"""Semantic tiles: a mask computed from q and k at every step, on the device, run by the B3 kernels.

Sparse VideoGen 2's idea made tile-aligned. Per head:

1. cluster the queries into tiles of `block_q` tokens and the keys into tiles of `block_kv`
   (`semantic_clusters.tile_kmeans`: k-means with exact capacities, warm-started from the
   centroids the caller carries from the previous step);
2. score each (query tile, key tile) pair by its centroids, exp(c_i . c_j / sqrt(d)) times the key
   tile's size (the mass a query of tile i would put on tile j if every key sat on its centroid),
   and keep, per query tile, the best key tiles under a budget set by `density` (`select_tiles`);
3. gather q, k, v into cluster order, run the B3 forward (and, for `jax.grad`, the fused backward)
   over the selected tiles, whose tables the device planner makes (`extensions.device_plan`), and
   gather the output back into the original order.

Everything is jnp with static shapes: one compilation serves every step, however the clusters
move. The plan (`SemanticPlan`) is a pytree, so it crosses `jax.jit` and the centroids in it are
the state a denoising loop carries.

The kernels run one head at a time (`head_by_head`: a `lax.map` over the heads, a loop of
one-head kernel calls in one program, each slicing its head's q, k, v out first). Each head has
its own tables, and today's kernels cannot take per-head tables in one call: the backward reads
one table for all heads (`kernels.backward`), and the forward takes one predicate per kind of head
(kinds = heads would compile the padding-masked tile body once per head). Per-head tables in both
would let one pallas_call run all heads, with no slices and a megacore's two cores splitting them.

The backward's transposed schedule gets `steps_t = nq` steps per key tile, the most any selection
can ask for (a sink key tile is chosen by every query tile). At 20 % density most of them are idle
steps (no DMA, no compute, only the grid step's overhead); a selection that also caps the query
tiles per key tile would let a smaller static budget serve.

Compiled for a v6e at the case study's size (compile-only, libtpu 0.0.42.1, nothing run;
`tools/semantic-training-compile.py`): a training step's plan (2 warm iterations), forward and
gradient, 10 heads x 75,600 tokens x 128, bf16, 512 x 512 tiles, density 0.2, compiles in 32 s with
1,064 MiB of temporaries (1.2 GB of host memory at the compiler's peak). With the inverse orders
sorted and the gradients scattered back it took 91 s and 2.2 GB; with the clustering's earlier
form, vmapped over the heads and ranking by sorts, 295 s and 3,862 MiB of temporaries.

The permutation is a row gather per head (`gather_rows`), in and back: k and v travel as one row
twice as wide, the output goes back by the plan's inverse order (`q_place`, counted by the plan, not
sorted), and the gradients go back by the same gathers (`_permutation`; jax's own transpose of a
gather is a scatter-add). Priced by the TPU compiler's static profile (v6e, simulated, libtpu
0.0.42.1; `notebooks/data/12_semantic_cost.py`), q, k, v in and the output back cost 0.20-0.22 M
cycles per head at 16,384 tokens and 0.88 M at 65,536, and their gradients the same (with the
inverse order found by a sort and four gathers of 128 lanes laid end to end across the heads:
0.35-0.49 M and 1.57 M, and a scatter-add for each gradient).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from svg_lib.attention import prescaled
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import check_block_size, padding_only
from svg_lib.core.planner import KernelTables
from svg_lib.kernels.backward import attention_dq, attention_dkv, attention_fused
from svg_lib.extensions.device_plan import device_tables
from svg_lib.kernels.forward import block_sparse_attention
from svg_lib.kernels.reference import check_qkv
from svg_lib.layers.semantic_clusters import (DEFAULT_HALVINGS, DEFAULT_ROUNDS, capacities, check_iterations,
                                              inverse_order, member_means, order_of_labels, places_of_labels,
                                              tile_kmeans_labels)
from svg_lib.memory.budget import check_memory
from svg_lib.memory.smem import SmemOverflowError, schedule_smem
from svg_lib.methods import METHODS
from svg_lib.problem import check_block_kv_compute
from svg_lib.runtime import default_interpret

DEFAULT_ITERATIONS = 10  # from a cold start; SVG2 runs 50 at its first sparse step, then 2 warm


def _jax():
    import jax
    return jax


@dataclasses.dataclass(frozen=True)
class SemanticCentroids:
    """What a denoising loop carries from step to step: each head's tile centroids.

    q f32 `[heads, ceil(tokens / block_q), head_dim]`, k f32 `[heads, ceil(tokens / block_kv), head_dim]`.
    A pytree: it crosses `jax.jit`."""

    q: object
    k: object


@dataclasses.dataclass(frozen=True)
class SemanticPlan:
    """Which tiles semantic attention computes, and where each token sits (a pytree).

    `q_order`, `k_order` int32 `[heads, tokens]`: cluster order, `permuted[h, i] = x[h, order[h, i]]`
    (v follows k). `q_place`, `k_place` int32 `[heads, tokens]`: the inverse orders, where each token
    sits (`order[h, place[h, t]] = t`): the output goes back by `q_place`, and the gradients of q, k
    and v by both, each a gather. `tiles` bool `[heads, nq, nk]`: the computed (query tile, key
    tile) pairs in permuted order, `nq = ceil(tokens / block_q)`, `nk = ceil(tokens / block_kv)`; at
    most `steps` per query tile. `centroids`: the `SemanticCentroids` to pass to the next step's `semantic_plan`.
    Static (part of the tree's structure): `block_q`, `block_kv`, `steps`.
    """

    q_order: object
    k_order: object
    q_place: object
    k_place: object
    tiles: object
    centroids: SemanticCentroids
    block_q: int = dataclasses.field(metadata=dict(static=True))
    block_kv: int = dataclasses.field(metadata=dict(static=True))
    steps: int = dataclasses.field(metadata=dict(static=True))

    @property
    def tokens(self) -> int:
        return int(self.q_order.shape[1])

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(int(n) for n in self.tiles.shape[1:])


def _register_pytrees():
    jax = _jax()
    jax.tree_util.register_dataclass(SemanticCentroids, data_fields=["q", "k"], meta_fields=[])
    jax.tree_util.register_dataclass(SemanticPlan, data_fields=["q_order", "k_order", "q_place", "k_place", "tiles",
                                                                  "centroids"],
                                     meta_fields=["block_q", "block_kv", "steps"])


_register_pytrees()


# -- checking what comes in -------------------------------------------------------------------

def check_density(density) -> float:
    """The fraction of tiles to compute: a number in (0, 1]."""
    if isinstance(density, bool) or not isinstance(density, (int, float, np.floating, np.integer)) \
            or not 0.0 < float(density) <= 1.0:
        raise ValueError(f"density must be a number in (0, 1] (the fraction of tiles computed), got {density!r}")
    return float(density)


def tile_budget(density: float, key_tiles: int) -> int:
    """Key tiles per query tile for `density`: round(density * nk), at least 1. With equal tiles the
    computed pairs are then density x tokens^2, up to the rounding and the short last tiles."""
    return max(1, min(key_tiles, int(round(check_density(density) * key_tiles))))


def check_qk(q, k):
    """Validate `[heads, tokens, head_dim]` q and k of one shape; returns (heads, tokens, head_dim)."""
    for name, x in (("q", q), ("k", k)):
        if getattr(x, "ndim", None) != 3:
            raise ValueError(f"{name} must be shaped [heads, tokens, head_dim], got shape {getattr(x, 'shape', None)}")
    if tuple(q.shape) != tuple(k.shape):
        raise ValueError(f"q and k must have the same shape [heads, tokens, head_dim]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    return tuple(int(s) for s in q.shape)


def _check_centroids(centroids, heads, nq, nk, head_dim):
    if centroids is None:
        return None
    if not isinstance(centroids, SemanticCentroids):
        raise TypeError(f"centroids must be the SemanticCentroids of a previous plan (plan.centroids) or None, "
                        f"got {type(centroids).__name__}")
    for name, c, n in (("q", centroids.q, nq), ("k", centroids.k, nk)):
        if tuple(c.shape) != (heads, n, head_dim):
            raise ValueError(f"centroids.{name} must be shaped [heads, tiles, head_dim] = {(heads, n, head_dim)} for "
                             f"these q, k and blocks, got {tuple(c.shape)} (a plan made at other blocks or sizes?)")
    return centroids


# -- step 2: choosing the tiles ---------------------------------------------------------------

def tile_scores(q_centroids, k_centroids, k_sizes):
    """f32 `[heads, nq, nk]`: the log of each tile pair's estimated attention mass,
    c_i . c_j / sqrt(d) + log(size_j) (SVG2's exp(c_i . c_j / sqrt(d)) x |cluster j|, in logs)."""
    jax = _jax()
    import jax.numpy as jnp

    d = q_centroids.shape[-1]
    logits = jnp.einsum("hid,hjd->hij", q_centroids, k_centroids, precision=jax.lax.Precision.HIGHEST)
    return logits / math.sqrt(d) + jnp.log(jnp.asarray(k_sizes, jnp.float32))[None, None, :]


def select_tiles(scores, steps: int, *, top_p: float | None = None, pinned=None):
    """bool `[heads, nq, nk]`: per query tile, the `steps` key tiles of highest score (top-k).

    `top_p`: keep only the shortest prefix of those whose estimated mass (softmax of the row's
    scores) reaches `top_p` (SVG2's top-p, under the same budget). `pinned`: bool `[nk]`, key tiles
    every query tile computes (a sink), taken first and counted in the budget.
    """
    jax = _jax()
    import jax.numpy as jnp

    if pinned is not None:
        scores = jnp.where(jnp.asarray(pinned)[None, None, :], jnp.inf, scores)
    mass = jax.nn.softmax(jnp.where(jnp.isinf(scores), 0.0, scores), axis=-1)
    return top_tiles(scores, mass, steps, threshold=top_p)


def top_tiles(priority, mass, steps: int, *, threshold: float | None = None):
    """bool `[heads, nq, nk]`: per row of `priority` f32 `[heads, nq, nk]`, its `steps` highest
    entries (ties to the lower index, as `jax.lax.top_k`); with `threshold`, only the first of them
    until the `mass` (f32, same shape) of those ranked above reaches it, always the first and every
    +inf (pinned) one. Those kept are a prefix of the ranking, so a tile is kept when its rank is
    below their count: two sorts and compares, no scatter of the chosen indices (a TPU scatters
    element by element) and no [.., steps, nk] one-hot."""
    jax = _jax()
    import jax.numpy as jnp

    position = jax.lax.broadcasted_iota(jnp.int32, priority.shape, priority.ndim - 1)
    neg, ranked_mass, order = jax.lax.sort((-priority, mass, position), num_keys=1, is_stable=True)
    best = -neg[..., :steps]                                           # descending, as top_k gives them
    keep = jnp.ones(best.shape, bool)
    if threshold is not None:
        ranked_mass = ranked_mass[..., :steps]
        before = jnp.cumsum(ranked_mass, axis=-1) - ranked_mass      # mass of the better tiles
        keep = (before < threshold) | (jnp.arange(steps) == 0) | jnp.isinf(best)
    count = jnp.sum(keep, axis=-1, dtype=jnp.int32)
    return inverse_order(order) < count[..., None]


def sink_tiles(geometry: VideoGeometry | None, block_kv: int, tokens: int):
    """(pinned key tokens, pinned key tiles): with a `geometry`, the first frame's keys (SVG's
    first-frame sink) are held in the leading key tiles, which every query tile computes.

    Returns (None, None) without a geometry; else int `[sink]` token indices and bool `[nk]`."""
    if geometry is None:
        return None, None
    if not isinstance(geometry, VideoGeometry):
        raise TypeError(f"geometry must be a VideoGeometry or None, got {type(geometry).__name__}")
    if geometry.tokens != tokens:
        raise ValueError(f"the geometry has {geometry.tokens} tokens but q and k have {tokens}")
    if geometry.text_tokens:
        raise ValueError(f"semantic tiles take video tokens only for now; this geometry has "
                         f"{geometry.text_tokens} text tokens (their rows and columns would be dense)")
    sink = np.arange(geometry.frame_tokens)
    pinned = np.zeros(-(-tokens // block_kv), bool)
    pinned[:-(-sink.size // block_kv)] = True
    return sink, pinned


# -- step 1 and 2 together: the plan ------------------------------------------------------------

def semantic_plan(q, k, *, block_q: int, block_kv: int, density: float, iterations: int = DEFAULT_ITERATIONS,
                  centroids: SemanticCentroids | None = None, top_p: float | None = None,
                  rounds: int = DEFAULT_ROUNDS, halvings: int = DEFAULT_HALVINGS,
                  geometry: VideoGeometry | None = None) -> SemanticPlan:
    """Cluster q and k into tiles and choose the tiles to compute: a `SemanticPlan`.

    q, k `[heads, tokens, head_dim]` (any tokens; float32 or bfloat16). Queries cluster into tiles
    of exactly `block_q` tokens, keys of `block_kv` (the last of each short), by `iterations` of
    size-constrained k-means (`semantic_clusters.tile_kmeans`, `rounds` rounds of proposals per
    assignment, each cluster's threshold found by `halvings` halvings: fewer cost less on a TPU and
    may lose recall, the module docstring of `semantic_clusters` has the figures) from `centroids`
    (the previous plan's `plan.centroids`: a warm start) or a cold start. Each query tile then
    keeps its `round(density * nk)` best key tiles by centroid score (`select_tiles`; `top_p` trims
    each row to that share of its estimated mass). `geometry`: hold the first frame's keys in the
    leading key tiles, computed by every query tile (SVG's sink).

    Traceable: call it inside `jax.jit` (q, k traced; the blocks, density, iterations static).
    """
    jax = _jax()

    heads, tokens, head_dim = check_qk(q, k)
    block_q = check_block_size("block_q", block_q)
    block_kv = check_block_size("block_kv", block_kv)
    iterations, rounds, halvings = check_iterations(iterations, rounds, halvings)
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    steps = tile_budget(density, nk)
    centroids = _check_centroids(centroids, heads, nq, nk, head_dim)
    sink, pinned = sink_tiles(geometry, block_kv, tokens)
    if pinned is not None and pinned.sum() > steps:
        raise ValueError(f"the first frame's keys fill {pinned.sum()} key tiles, more than the {steps} a query tile "
                         f"may compute at density {density}; raise the density or the blocks")

    def cluster(x, c, block):  # labels and centroids of every head, one head after another
        def one(xc):
            return tile_kmeans_labels(xc[0], block, iterations=iterations, centroids=xc[1], rounds=rounds,
                                      halvings=halvings)

        # a loop over the heads, not a vmap: the TPU compiler's memory then stays about that of one
        # head (compiling 8 heads of 16,384 tokens with the static profile: 1.3 GB; vmapped, it
        # passed 19 GB and was stopped)
        with jax.named_scope("heads"):
            return jax.lax.map(one, (x, c))

    q_label, q_cent = cluster(q, None if centroids is None else centroids.q, block_q)
    if sink is not None:
        k_label, k_cent = _cluster_around_sink(k, None if centroids is None else centroids.k, sink, block_kv, cluster)
    else:
        k_label, k_cent = cluster(k, None if centroids is None else centroids.k, block_kv)
    # q and k sorted by label in one sort (their token counts are equal); the inverse orders by
    # counting (`places_of_labels`), not by a second sort
    orders = order_of_labels(jax.numpy.concatenate([q_label, k_label]))
    q_order, k_order = orders[:heads], orders[heads:]
    # the labels as arrays before the counting: without this barrier, compiling the plan for a v6e
    # (one head of 65,536 tokens, 512 x 256 tiles) passed 22 GB of host memory; with it, 12.7 GB
    q_label, k_label = jax.lax.optimization_barrier((q_label, k_label))
    with jax.named_scope("heads"):
        places = tuple(jax.lax.map(functools.partial(places_of_labels, clusters=n), label)
                       for label, n in ((q_label, nq), (k_label, nk)))
    return plan_from_orders(q, k, q_order, k_order, block_q=block_q, block_kv=block_kv, steps=steps, top_p=top_p,
                            pinned=pinned, means=(q_cent, k_cent), places=places)


def tile_means(x, place, block: int):
    """f32 `[heads, ceil(tokens / block), d]`: the mean of each tile of `x` `[heads, tokens, d]` in
    the order whose inverse is int `place` `[heads, tokens]` (the last tile averages its real tokens
    only). Each token's tile from its place, then `member_means`: a matmul, no gather of x."""
    jax = _jax()

    sizes = capacities(x.shape[1], block)
    tile_of_token = place // block
    return jax.vmap(lambda xh, th: member_means(xh, th, sizes))(x, tile_of_token)


def nonfinite_tiles(k, k_place, block_kv: int):
    """bool `[heads, nk]`: the key tiles (of the order whose inverse is `k_place` int `[heads, tokens]`)
    that hold a key of `k` `[heads, tokens, d]` with a NaN or an infinity: one mean per tile of a
    flag per key (`tile_means`, a matmul with one column; no scatter)."""
    jnp = _jax().numpy
    flag = jnp.logical_not(jnp.isfinite(k).all(axis=-1, keepdims=True)).astype(jnp.float32)
    return tile_means(flag, k_place, block_kv)[..., 0] > 0


def plan_from_orders(q, k, q_order, k_order, *, block_q: int, block_kv: int, steps: int, top_p=None,
                     pinned=None, means=None, places=None) -> SemanticPlan:
    """The plan of given token orders: tiles cut from `q_order` and `k_order` (int `[heads, tokens]`),
    scored by their means (`tile_scores`), `steps` key tiles kept per query tile (`select_tiles`).

    `semantic_plan` passes its tile-sized clusters, with `means` (f32 `[heads, nq, d]`, `[heads, nk,
    d]`: its k-means centroids, which are the tiles' means); any other order (token order, ordinary
    k-means sorted and cut: `semantic_clusters.cut_kmeans_order`) gives the plan to compare with,
    its tiles' means computed here (`tile_means`). `places`: the orders' inverses (`q_place`,
    `k_place`) if known, else found here by a sort (`inverse_order`)."""
    q_place, k_place = (inverse_order(q_order), inverse_order(k_order)) if places is None else places
    if means is None:
        q_cent, k_cent = tile_means(q, q_place, block_q), tile_means(k, k_place, block_kv)
    else:  # the tiles' means, known already (k-means' centroids): no sort to find each token's tile
        q_cent, k_cent = means
    scores = tile_scores(q_cent, k_cent, capacities(q.shape[1], block_kv))
    # a key tile holding a non-finite key ranks first for every query tile, so that its NaN reaches
    # the rows as in a softmax over every key: one NaN key turns every k-means centroid NaN, and
    # the scores of NaN centroids rank the tiles by index, which would drop it and hide the NaN
    scores = _jax().numpy.where(nonfinite_tiles(k, k_place, block_kv)[:, None, :], _jax().numpy.inf, scores)
    tiles = select_tiles(scores, steps, top_p=top_p, pinned=pinned)
    return SemanticPlan(q_order, k_order, q_place, k_place, tiles, SemanticCentroids(q_cent, k_cent), block_q,
                        block_kv, steps)


def _cluster_around_sink(k, ck, sink, block_kv, cluster):
    """(label int32 `[heads, tokens]`, centroids f32 `[heads, nk, d]`) of the keys with the sink first:
    the leading tiles hold the first frame's keys in token order (whole tiles of them; a label per
    tile), the other keys cluster into the tiles after (`ck`: all key tiles' centroids or None)."""
    import jax.numpy as jnp

    heads, tokens, d = k.shape
    sink_tiles_ = -(-sink.size // block_kv)
    held = sink_tiles_ * block_kv  # the tokens the sink tiles hold, in order
    if held >= tokens:
        raise ValueError("the first frame fills every key tile: nothing is left to cluster")
    label, cent = cluster(k[:, held:], None if ck is None else ck[:, sink_tiles_:], block_kv)
    head_label = jnp.broadcast_to(jnp.asarray(np.arange(held) // block_kv, jnp.int32), (heads, held))
    head_cent = jnp.mean(k[:, :held].astype(jnp.float32).reshape(heads, sink_tiles_, block_kv, d), axis=2)
    return jnp.concatenate([head_label, label + sink_tiles_], axis=1), jnp.concatenate([head_cent, cent], axis=1)


# -- step 3: attention in cluster order -------------------------------------------------------

def gather_rows(x, order):
    """`x[h, order[h, i], :]`: `[heads, tokens, head_dim]` x in the order of int `[heads, tokens]`.

    A gather per head, the heads in a loop (`lax.map`). One gather of the heads laid end to end
    costs more per row as the heads grow: priced by the v6e static profile (simulated, libtpu
    0.0.42.1), q, k, v in and the output back took 3.50 M cycles for 8 heads of 16,384 tokens laid
    end to end, 1.77 M head by head (one head alone: 0.20 M)."""
    jax = _jax()

    with jax.named_scope("heads"):
        return jax.lax.map(lambda x_order: x_order[0][x_order[1]], (x, order))


@functools.lru_cache(maxsize=None)
def _permutation():
    """`permute(x, order, place)`: `gather_rows(x, order)`, differentiated by `gather_rows(g, place)`.
    A permutation's transpose is its inverse, a gather, where XLA would transpose a gather into a
    scatter-add (one head of 65,536 tokens x 128, bf16, v6e static profile: 1.14 M simulated cycles
    against 0.25 M for the gather)."""
    jax = _jax()

    @jax.custom_vjp
    def permute(x, order, place):
        return gather_rows(x, order)

    def forward(x, order, place):
        return gather_rows(x, order), place

    def backward(place, g):
        return gather_rows(g, place), None, None

    permute.defvjp(forward, backward)
    return permute


def into_cluster_order(q, k, v, plan: SemanticPlan):
    """q, k, v `[heads, tokens, head_dim]` gathered into the plan's cluster order. k and v share their
    order, so they travel as one `[heads, tokens, 2 head_dim]` gather: rows twice as wide cost less
    than two gathers (v6e static profile, one head of 65,536 tokens, bf16: 350,282 cycles for 256
    lanes, 252,205 for 128; `notebooks/data/12_semantic_cost.json`)."""
    import jax.numpy as jnp

    d = k.shape[-1]
    kv = _permutation()(jnp.concatenate([k, v], axis=-1), plan.k_order, plan.k_place)
    return _permutation()(q, plan.q_order, plan.q_place), kv[..., :d], kv[..., d:]


def out_of_cluster_order(out, plan: SemanticPlan):
    """The output `[heads, tokens, head_dim]` of the queries in cluster order, back in token order."""
    return _permutation()(out, plan.q_place, plan.q_order)


def _one_head_b3(*, tokens, head_dim, dtype, block_q, block_kv, block_kv_compute, steps, steps_t, interpret,
                 generation, backward):
    """`run(q, k, v, schedule, schedule_t)` for one head `[1, tokens, head_dim]` (q pre-scaled) and its
    packed tables: the B3 forward, and for `jax.grad` the B3 backward over the same tiles.

    The tables are arguments, not constants: they are computed on the device at every step.
    Memory is checked here, once, on the tables' shapes."""
    jax = _jax()
    import jax.numpy as jnp

    nq, nk = -(-tokens // block_q), -(-tokens // block_kv)
    words, words_t = -(-nq * steps // 2), -(-nk * steps_t // 2)
    smem = schedule_smem(1, nq, steps, generation)
    if not smem.fits:
        raise SmemOverflowError(f"the semantic schedule of {nq} query tiles x {steps} steps overflows SMEM: {smem}; "
                                "use larger blocks or a lower density")
    shapes = KernelTables((nq, nk), np.zeros(words, np.int32), steps, np.zeros(words_t, np.int32), steps_t)
    budget = check_memory("b3", heads=1, head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv,
                          block_kv_compute=block_kv_compute, generation=generation, tables=shapes,
                          q_len=nq * block_q, backward=backward)
    blocks = dict(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=interpret)

    not_padding = padding_only(tokens)  # a selected tile is whole: inside it only key padding is masked

    def forward(q, k, v, schedule, residuals):
        head_kind = jnp.zeros((1,), jnp.int32)  # one head, one kind; made per call, never kept from a trace
        return block_sparse_attention(q, k, v, head_kind, schedule, steps=steps, method=METHODS["b3"], keep=not_padding,
                                      vmem_limit_bytes=budget.forward_limit, residuals=residuals, **blocks)

    @jax.custom_vjp
    def run(q, k, v, schedule, schedule_t):
        return forward(q, k, v, schedule, False)

    def run_fwd(q, k, v, schedule, schedule_t):
        out, lse = forward(q, k, v, schedule, True)
        return out, (q, k, v, out, lse, schedule, schedule_t)

    def run_bwd(res, do):
        q, k, v, out, lse, schedule, schedule_t = res
        form, limits = budget.backward_limits()
        do = do.astype(q.dtype)
        di = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)[:, None]  # [1, 1, tokens]
        common = dict(method=METHODS["b3"], keep=not_padding, **blocks)
        if form == "fused":
            dq, dk, dv = attention_fused(q, k, v, do, lse, di, schedule_t, steps_t=steps_t,
                                         vmem_limit_bytes=limits[0], **common)
        else:
            dq = attention_dq(q, k, v, do, lse, di, schedule, steps=steps, vmem_limit_bytes=limits[0], **common)
            dk, dv = attention_dkv(q, k, v, do, lse, di, schedule_t, steps_t=steps_t, vmem_limit_bytes=limits[1],
                                   **common)
        return dq, dk, dv, None, None

    run.defvjp(run_fwd, run_bwd)
    return run


def head_by_head(run, q, k, v, schedule, schedule_t):
    """`run` (one head's kernels, `[1, tokens, head_dim]`) over every head in a loop (`lax.map`):
    `[heads, tokens, head_dim]` q, k, v and `[heads, words]` tables in, the output out.

    Each head's slices pass an optimization barrier on their way in and its results on their way
    out (the gradients too: the barrier's transpose is a barrier), so that XLA keeps them as
    arrays in HBM instead of fusing the slicing and the stacking into the kernel call. Fused (as
    `jax.vmap` over the heads left them), XLA placed a head's dk and dv (18.5 MiB each at the case
    study's 75,600 tokens, head_dim 128, bf16) in VMEM around the fused backward's call, over its
    scoped limit: compile-only v6e, libtpu 0.0.42.1, 512 x 512 tiles, 2 heads: "Scoped allocation
    with size 74.54M and limit 68.91M" (10 heads: 37.62M, limit 32M). With the barriers the same
    gradient compiles (2 heads: 135 s, temporaries 412 MiB)."""
    jax = _jax()

    def one(args):
        q, k, v, s, t = jax.lax.optimization_barrier(args)
        return jax.lax.optimization_barrier(run(q[None], k[None], v[None], s, t)[0])

    return jax.lax.map(one, (q, k, v, schedule, schedule_t))


def check_plan(plan, heads: int, tokens: int):
    """Validate a `SemanticPlan` against q, k, v of `heads` x `tokens`."""
    if not isinstance(plan, SemanticPlan):
        raise TypeError(f"plan must be a SemanticPlan (svg_lib.semantic_plan(q, k, ...)), got {type(plan).__name__}")
    nq, nk = -(-tokens // plan.block_q), -(-tokens // plan.block_kv)
    expect = {"q_order": (heads, tokens), "k_order": (heads, tokens), "q_place": (heads, tokens),
              "k_place": (heads, tokens), "tiles": (heads, nq, nk)}
    for name, shape in expect.items():
        got = tuple(getattr(plan, name).shape)
        if got != shape:
            raise ValueError(f"plan.{name} is shaped {got} but q, k, v of {heads} heads x {tokens} tokens need "
                             f"{shape}: was the plan made from other q and k?")
    return plan


def semantic_attention(q, k, v, plan: SemanticPlan, *, block_kv_compute: int | None = None, interpret=None,
                       backward: str | None = None, generation: str | None = None):
    """Attention over the plan's tiles, returned in the original token order: `[heads, tokens, head_dim]`.

    q, k, v `[heads, tokens, head_dim]` float32 or bfloat16 (any tokens), `plan` from `semantic_plan`.
    q is gathered into `plan.q_order`, k and v into `plan.k_order`, the B3 kernels compute the
    selected tiles (tables made on the device, `extensions.device_plan`), and the output is gathered
    back. Softmax scale 1/sqrt(head_dim). Differentiable with `jax.grad` (the B3 backward over the
    same tiles: "fused", "split", or None for fused where it fits, as in `attention`). Runs inside
    `jax.jit`; a new plan of the same shapes is new data, not a new program.
    `interpret`: None runs compiled on a TPU and in interpret mode elsewhere.
    """
    heads, tokens, head_dim = check_qkv(q, k, v)
    if str(q.dtype) not in ("float32", "bfloat16"):
        raise ValueError(f"q, k, v must be float32 or bfloat16 (the kernels' dtypes), got {q.dtype}")
    plan = check_plan(plan, heads, tokens)
    fn = _built(heads, tokens, head_dim, str(q.dtype), plan.block_q, plan.block_kv, plan.steps, block_kv_compute,
                interpret, backward, generation)
    return fn(q, k, v, plan)


@functools.lru_cache(maxsize=16)
def _built(heads, tokens, head_dim, dtype, block_q, block_kv, steps, block_kv_compute, interpret, backward,
           generation):
    """The jitted `f(q, k, v, plan)` for one configuration (cached: repeated calls trace once).

    It may first be built under a caller's trace (`jax.jit`, `jax.grad`): it holds no array, so
    no tracer of that trace is kept for later calls."""
    jax = _jax()
    on_tiles = b3_on_tiles(tokens, head_dim, dtype, block_q, block_kv, steps, block_kv_compute, interpret, backward,
                           generation)

    def f(q, k, v, plan):
        return out_of_cluster_order(on_tiles(*into_cluster_order(q, k, v, plan), plan.tiles), plan)

    return jax.jit(f)


def b3_on_tiles(tokens, head_dim, dtype, block_q, block_kv, steps, block_kv_compute, interpret, backward, generation):
    """`f(q, k, v, tiles)`: the B3 kernels head by head on a bool tile selection `[heads, q tiles, k tiles]`,
    its tables made on the device (`device_tables`); q, k, v `[heads, tokens, head_dim]` in the order the
    tiles are in. Not jitted: the callers jit what they wrap around it."""
    nq = -(-tokens // block_q)
    block_kv_compute = check_block_kv_compute(block_kv, block_kv_compute, block_q)
    interpret = default_interpret() if interpret is None else interpret
    run = _one_head_b3(tokens=tokens, head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv,
                       block_kv_compute=block_kv_compute, steps=steps, steps_t=nq, interpret=interpret,
                       generation=generation, backward=backward)
    kernel = prescaled(functools.partial(head_by_head, run), head_dim=head_dim)

    def f(q, k, v, tiles):
        tables = device_tables(tiles, tokens=tokens, block_kv=block_kv, steps=steps, steps_t=nq)
        return kernel(q, k, v, tables.schedule, tables.schedule_t)

    return f


# -- what a plan computes, for checking and measuring ---------------------------------------------

def plan_keep(plan: SemanticPlan, rows=None):
    """bool `[heads, rows, tokens]`: which (query, key) pairs the plan computes, in the original order.

    `rows`: the query indices to answer for (int `[rows]`; None: every query, for small sizes)."""
    import jax.numpy as jnp

    tokens = plan.tokens
    rows = jnp.arange(tokens) if rows is None else jnp.asarray(rows)
    q_tile = plan.q_place[:, rows] // plan.block_q                            # [heads, rows]
    k_tile = plan.k_place // plan.block_kv                                    # [heads, tokens]
    h = jnp.arange(plan.tiles.shape[0])[:, None, None]
    return plan.tiles[h, q_tile[:, :, None], k_tile[:, None, :]]


def plan_recall(q, k, plan: SemanticPlan, rows):
    """float `[heads]`: the share of each head's dense softmax mass inside the plan's tiles,
    averaged over the query `rows` (int `[rows]`). Only heads x rows x tokens scores are formed."""
    jax = _jax()
    import jax.numpy as jnp

    rows = jnp.asarray(rows)
    s = jnp.einsum("hrd,hkd->hrk", q[:, rows].astype(jnp.float32), k.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST) / math.sqrt(q.shape[-1])
    p = jax.nn.softmax(s, axis=-1)
    return jnp.mean(jnp.sum(jnp.where(plan_keep(plan, rows), p, 0.0), axis=-1), axis=-1)


def computed_fraction(plan: SemanticPlan):
    """float `[heads]`: the share of all tokens x tokens pairs the plan computes (short tiles counted short)."""
    import jax.numpy as jnp

    rows = jnp.asarray(capacities(plan.tokens, plan.block_q), jnp.float32)
    cols = jnp.asarray(capacities(plan.tokens, plan.block_kv), jnp.float32)
    pairs = jnp.einsum("hij,i,j->h", plan.tiles.astype(jnp.float32), rows, cols)
    return pairs / float(plan.tokens) ** 2
