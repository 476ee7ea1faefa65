"""Tile-sized clusters: k-means whose every cluster holds exactly one kernel tile of tokens.

Sparse VideoGen 2 clusters q and k with ordinary k-means and runs a kernel whose blocks follow
the clusters. A TPU kernel's tiles are fixed (`block_q` x `block_kv`), and a cluster laid on
fixed tiles makes every tile it touches computed; so here each cluster *is* a tile: `block`
tokens, the last one short when the token count is not a multiple of it. Sorting the tokens by
cluster then puts cluster c exactly on tile c.

The assignment with exact capacities runs in rounds, all in jnp with static shapes (it traces
once, and runs inside `jax.jit`):

    each round, every token still unplaced asks for its nearest cluster that has room left;
    a cluster asked by more tokens than it has room for takes those that would lose the most
    by going elsewhere (the largest regret: distance to the next choice minus to this one).

A round is minima over the `[clusters, tokens]` distances, one-hot compares, and per cluster a
threshold on the regret found by halving (`_largest_within_room`): no sort, no sequential loop over
tokens, and no gather or scatter of single elements, which a TPU runs one element after another
(`inverse_order`). Ranking the askers by regret rather than by distance was measured better (CPU,
structured_qkv spatial / temporal / local3d heads, 3,072 tokens, 128-token tiles, 20 % of the
tiles, recall over 256 sampled queries; 10 iterations from a cold start): 0.90 / 0.90 / 0.85
against 0.88 / 0.86 / 0.81 by distance (2 iterations: 0.84 / 0.83 / 0.76 against 0.82 / 0.80 /
0.74). After `rounds` rounds the few tokens still unplaced fill the free places in token order, so
every cluster ends at exactly its capacity whatever the data. Then the centroids are the means of
their members, and k-means repeats for a fixed number of `iterations`, starting from the caller's
centroids (the previous denoising step's: a warm start) or from k-means++ seeding (a cold start).

What a TPU pays for it, simulated (v6e compile-only static profile, libtpu 0.0.42.1, one head of
16,384 tokens, 512 x 256 tiles, 2 iterations from a warm start,
`notebooks/data/12_semantic_cost.py`): the whole plan took 6.32 M cycles when each round ranked its
askers by two sorts of the tokens and laid the distances `[tokens, clusters]`; with the thresholds,
the `[clusters, tokens]` layout (`one_hot`), one sort for q's and k's orders together and the
k-means centroids reused as the tiles' means, it takes 1.02 M (12.4 M at 65,536 tokens, two thirds
of it the halvings). Halvings per round against recall on the clip's heads
(`notebooks/data/12_recall_tables.py`: 10 heads, 128 and 256-token tiles, 10 cold iterations): 24
give the sorted ranking's recall on every head exactly; 16 (the default) move a head's by at most
0.019, 12 by 0.023, 6 by 0.051, and the mean over the heads (0.862) by at most 0.001 in every case.

`cut_kmeans_order` is the alternative the issue measured first (ordinary k-means, tokens sorted
by label, then cut into tiles), and `tile_objective` the k-means objective of any tiling: they are
here so the two can be compared (tests/test_semantic.py; notebook 12).
"""
from __future__ import annotations

import numpy as np

DEFAULT_ROUNDS = 4
DEFAULT_HALVINGS = 16  # of each cluster's regret range per round (`_largest_within_room`)


def capacities(tokens: int, block: int) -> np.ndarray:
    """int32 `[ceil(tokens / block)]`: each cluster's size, `block` tokens, the last one what is left."""
    clusters = -(-tokens // block)
    sizes = np.full(clusters, block, np.int32)
    sizes[-1] = tokens - (clusters - 1) * block
    return sizes


def initial_centroids(x, clusters: int, seed: int = 0):
    """`[clusters, d]` f32 for a cold start: k-means++ seeding of `x` `[tokens, d]`.

    The first centroid is a token drawn uniformly, each next one a token drawn with probability
    proportional to its squared distance to the nearest centroid so far (one `[tokens]` distance
    update per centroid, a loop of `clusters` steps). Centroids spread over the data this way;
    tokens picked evenly along the sequence, tried first, often put two in one planted cluster,
    which the capacity-bound iterations then could not separate. `seed` fixes the draws.
    """
    import jax
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(seed), clusters)
    first = x[jax.random.randint(keys[0], (), 0, x.shape[0])]
    nearest = jnp.sum((x - first) ** 2, axis=1)

    def pick(j, state):
        c, nearest = state
        logits = jnp.log(jnp.maximum(nearest, 1e-30))  # proportional to the squared distance
        chosen = x[jax.random.categorical(keys[j], logits)]
        return c.at[j].set(chosen), jnp.minimum(nearest, jnp.sum((x - chosen) ** 2, axis=1))

    c = jnp.zeros((clusters, x.shape[1]), jnp.float32).at[0].set(first)
    return jax.lax.fori_loop(1, clusters, pick, (c, nearest))[0]


def squared_distances(x, centroids):
    """f32 `[tokens, clusters]`: |x_t - c_j|^2 for `x` `[tokens, d]` and `centroids` `[clusters, d]`
    (as |x|^2 - 2 x.c + |c|^2: one matmul, on the MXU on a TPU)."""
    import jax
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    c = centroids.astype(jnp.float32)
    cross = jnp.matmul(x, c.T, precision=jax.lax.Precision.HIGHEST)
    return jnp.sum(x * x, axis=1, keepdims=True) - 2.0 * cross + jnp.sum(c * c, axis=1)[None, :]


def inverse_order(order):
    """int32 `[..., n]`: the permutation that undoes `order` along its last axis
    (`inverse[..., order[..., i]] = i`).

    By a sort of (order, i) pairs on the order, not by a scatter of i to order. A TPU scatters one
    element after another (660,465 simulated cycles for one head of 75,600 tokens, v6e static
    profile); its sort costs about as much for one row (561,509 at 65,536 tokens) but sorts a row
    per sublane at once: 8 heads at 32,768 tokens take 260,358 cycles, one head 255,146."""
    import jax
    import jax.numpy as jnp

    places = jax.lax.broadcasted_iota(jnp.int32, order.shape, order.ndim - 1)
    return jax.lax.sort((order.astype(jnp.int32), places), dimension=order.ndim - 1, num_keys=1)[1]


def one_hot(label, n: int):
    """bool `[n, tokens]`: `label[t] == j`, for int `[tokens]` labels (a label outside [0, n) is all False).

    Clusters on the first axis and tokens on the last: a TPU lays the last axis along its vectors'
    128 lanes, so with tokens there every vector is full and a sum or minimum over the clusters is
    elementwise across vectors. Inside the k-means loop, one compare-and-count pass over 64 clusters
    and 16,384 tokens is priced at 2,817 simulated cycles this way and 24,938 laid `[tokens,
    clusters]` (v6e static profile, libtpu 0.0.42.1)."""
    import jax.numpy as jnp

    return jnp.arange(n, dtype=label.dtype)[:, None] == label[None, :]


def _largest_within_room(regret, asked, room, halvings: int):
    """bool `[tokens]`: the askers each cluster takes, those of largest regret and at most `room[j]`.

    regret f32 `[tokens]` (>= 0, +inf when a token has no other choice), asked bool `[clusters,
    tokens]` (at most one True per token: the cluster it asks), room int32 `[clusters]`. Per cluster,
    a threshold found by `halvings` halvings of [its askers' least regret, their largest]: the least
    value found that no more than `room` askers reach, all of them taken. Ties at the threshold,
    and askers within the last interval's width of it, wait for the next round. Each halving is one
    compare and count over `[clusters, tokens]`, vectors a TPU runs whole; ranks by sorting (the
    form this replaced: two sorts of the tokens a round) cost more than the rest of the round.
    """
    import jax
    import jax.numpy as jnp

    r = jnp.where(asked, regret[None, :], -jnp.inf)                   # [clusters, tokens]

    def count(threshold):
        return jnp.sum(r >= threshold[:, None], axis=1, dtype=jnp.int32)

    least = jnp.min(jnp.where(asked, regret[None, :], jnp.inf), axis=1)
    largest = jnp.max(r, axis=1)
    all_fit = jnp.sum(asked, axis=1, dtype=jnp.int32) <= room
    top_fits = count(largest) <= room
    # invariant: more than room askers reach a, no more than room reach b (b = +inf: none taken,
    # when even the ties at the largest regret overflow the room)
    a = least
    b = jnp.where(all_fit, least, jnp.where(top_fits, largest, jnp.inf))
    settled = all_fit | ~top_fits

    def halve(_, ab):
        a, b = ab
        mid = jnp.where(settled, b, a + (b - a) / 2)
        over = count(mid) > room
        return jnp.where(over, mid, a), jnp.where(over, b, mid)

    with jax.named_scope("halvings"):  # a loop, not unrolled: a smaller program to compile
        _, b = jax.lax.fori_loop(0, halvings, halve, (a, b))
    return jnp.any(r >= b[:, None], axis=0)


def assign_with_capacity(x, centroids, sizes, *, rounds: int = DEFAULT_ROUNDS, halvings: int = DEFAULT_HALVINGS):
    """int32 `[tokens]`: each token's cluster, cluster j receiving exactly `sizes[j]` tokens.

    x `[tokens, d]`, centroids `[clusters, d]`, sizes int `[clusters]` (NumPy, summing to tokens).
    Rounds of proposals (module docstring): in each, unplaced tokens ask for their nearest cluster
    with room, and each cluster takes, up to its room, the askers of largest regret (`halvings`
    halvings find its threshold). Tokens still unplaced after `rounds` fill the remaining places
    in token order.
    """
    import jax
    import jax.numpy as jnp

    tokens, clusters = x.shape[0], centroids.shape[0]
    sizes = np.asarray(sizes, np.int32)
    if sizes.shape != (clusters,) or int(sizes.sum()) != tokens or (sizes < 1).any():
        raise ValueError(f"sizes must be {clusters} positive cluster sizes summing to {tokens} tokens, "
                         f"got {sizes.tolist()}")
    if clusters == 1:  # fewer tokens than one tile: nothing to choose
        return jnp.zeros(tokens, jnp.int32)
    dist = squared_distances(x, centroids).T                          # [clusters, tokens]

    # Each round works on whole [clusters, tokens] arrays: a TPU runs those on vectors, where a
    # sort, or a gather or scatter of single elements, goes much slower.
    def round_(_, state):
        label, room = state
        unplaced = label < 0
        open_ = jnp.where(room[:, None] > 0, dist, jnp.inf)             # clusters with room only
        choice = jnp.argmin(open_, axis=0).astype(jnp.int32)             # the nearest, lowest index on ties
        chosen = one_hot(choice, clusters)
        nearest = jnp.min(open_, axis=0)
        second = jnp.min(jnp.where(chosen, jnp.inf, open_), axis=0)
        # what a token loses by not getting its choice; the last open cluster has no alternative
        regret = jnp.where(jnp.isfinite(second), second - nearest, jnp.inf)
        asked = chosen & unplaced[None, :]                               # placed tokens ask no one
        taken = _largest_within_room(regret, asked, room, halvings)
        label = jnp.where(taken, choice, label)
        room = room - jnp.sum(asked & taken[None, :], axis=1, dtype=jnp.int32)
        return label, room

    with jax.named_scope("rounds"):
        label, room = jax.lax.fori_loop(0, rounds, round_, (jnp.full(tokens, -1, jnp.int32), jnp.asarray(sizes)))
    return _fill_free_places(label, room)


def _fill_free_places(label, room):
    """Give the tokens still unplaced (label -1) the free places, in token order: the i-th unplaced
    token goes to the cluster holding the i-th free place (clusters' free places laid end to end)."""
    import jax.numpy as jnp

    unplaced = label < 0
    i = jnp.cumsum(unplaced) - 1                                   # rank among the unplaced
    # the cluster of free place i: how many clusters' free places all come before it
    cluster_of_place = jnp.sum(jnp.cumsum(room)[:, None] <= i[None, :], axis=0, dtype=jnp.int32)
    return jnp.where(unplaced, cluster_of_place, label)


def member_means(x, label, sizes):
    """f32 `[clusters, d]`: the mean of each cluster's members (sizes are exact, so no empty cluster).

    As a one-hot matrix `[clusters, tokens]` times x: a matmul (the MXU on a TPU), not a scatter-add."""
    import jax
    import jax.numpy as jnp

    members = one_hot(label, len(sizes)).astype(jnp.float32)
    sums = jnp.matmul(members, x.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return sums / jnp.asarray(sizes, jnp.float32)[:, None]


def tile_kmeans_labels(x, block: int, *, iterations: int, centroids=None, rounds: int = DEFAULT_ROUNDS,
                       halvings: int = DEFAULT_HALVINGS):
    """Size-constrained k-means of one head's tokens: `(label, centroids)`.

    x `[tokens, d]`; clusters of exactly `block` tokens (`capacities`). `iterations` rounds of
    assign-then-average from `centroids` `[clusters, d]` (None: `initial_centroids`). Returns
    `label` int32 `[tokens]` (each token's cluster, cluster j holding exactly `capacities[j]`
    tokens) and the final centroids `[clusters, d]` f32: the means of the clusters, which are the
    means of the tiles once the tokens are sorted by label (what the next step starts from).
    """
    import jax
    import jax.numpy as jnp

    sizes = capacities(x.shape[0], block)
    c = initial_centroids(x, len(sizes)) if centroids is None else centroids.astype(jnp.float32)
    label = jnp.zeros(x.shape[0], jnp.int32)

    def iteration(_, state):
        c, _ = state
        label = assign_with_capacity(x, c, sizes, rounds=rounds, halvings=halvings)
        return member_means(x, label, sizes), label

    with jax.named_scope("iterations"):
        c, label = jax.lax.fori_loop(0, iterations, iteration, (c, label))
    if iterations == 0:  # no iteration asked for: assign once to the given centroids
        label = assign_with_capacity(x, c, sizes, rounds=rounds, halvings=halvings)
        c = member_means(x, label, sizes)
    return label, c


def order_of_labels(label):
    """int32 `[..., tokens]`: the tokens sorted by label along the last axis, in token order within
    a label (a stable sort). With tile-sized clusters, tile c holds `order[c * block:(c + 1) * block]`.

    One sort serves every row given (heads, q and k stacked): a TPU sorts a row per sublane at once,
    so `[8, tokens]` costs about what one row costs (`inverse_order`)."""
    import jax.numpy as jnp

    return jnp.argsort(label, axis=-1, stable=True).astype(jnp.int32)


def places_of_labels(label, clusters: int):
    """int32 `[tokens]`: where each token sits in `order_of_labels(label)` (`place[order[i]] = i`),
    for int `label` `[tokens]` in [0, clusters): by counting, not by a second sort.

    A token's place is the number of tokens of a smaller label plus those of its own label before
    it. The second count comes from the one-hot `[clusters, tokens]` cut into blocks of 128 tokens:
    within a block a matmul with a triangle of ones, across blocks a matmul of the block totals
    (both on the MXU; the counts, at most 128 per block, are exact in bfloat16). Priced for a v6e by
    the static profile (simulated, libtpu 0.0.42.1, one row of 65,536 tokens): 9,662 cycles with 20
    clusters, 16,112 with 43, 82,432 with 256; inverting the order by a sort (`inverse_order`) costs
    about 562,000 whatever the clusters."""
    import jax
    import jax.numpy as jnp

    tokens, width = label.shape[-1], 128
    blocks = -(-tokens // width)
    padded = jnp.pad(label.astype(jnp.int32), (0, blocks * width - tokens), constant_values=clusters)
    hot = one_hot(padded, clusters).astype(jnp.bfloat16).reshape(clusters, blocks, width)
    earlier = jnp.arange(width)[:, None] < jnp.arange(width)[None, :]               # [from, to]
    within = jnp.einsum("cbt,tu->cbu", hot, earlier.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    totals = jnp.sum(hot.astype(jnp.float32), axis=2)                                  # [clusters, blocks]
    earlier_blocks = (jnp.arange(blocks)[:, None] < jnp.arange(blocks)[None, :]).astype(jnp.float32)
    before = jnp.matmul(totals, earlier_blocks, precision=jax.lax.Precision.HIGHEST)   # [clusters, blocks]
    sizes = jnp.sum(totals, axis=1)
    start = jnp.cumsum(sizes) - sizes                                                  # [clusters]
    rank = within + before[:, :, None] + start[:, None, None]
    place = jnp.sum(rank * hot.astype(jnp.float32), axis=0).reshape(-1)[:tokens]
    return place.astype(jnp.int32)


def tile_kmeans(x, block: int, *, iterations: int, centroids=None, rounds: int = DEFAULT_ROUNDS,
                halvings: int = DEFAULT_HALVINGS):
    """`tile_kmeans_labels` with the tokens sorted by cluster: `(order, centroids)`, `order` int32
    `[tokens]` (`x[order]` is x in cluster order, tile c holds `order[c * block:(c + 1) * block]`)."""
    label, c = tile_kmeans_labels(x, block, iterations=iterations, centroids=centroids, rounds=rounds,
                                  halvings=halvings)
    return order_of_labels(label), c


def tile_objective(x, order, block: int):
    """The k-means objective of a tiling: mean over tokens of |x_t - mean of its tile|^2, f32 `[]`.

    x `[tokens, d]`, order int `[tokens]` (x[order] cut into tiles of `block`, the last short)."""
    import jax.numpy as jnp

    sizes = capacities(x.shape[0], block)
    label = jnp.asarray(np.repeat(np.arange(len(sizes)), sizes))
    xs = x[order].astype(jnp.float32)
    means = member_means(xs, label, sizes)
    return jnp.mean(jnp.sum((xs - means[label]) ** 2, axis=1))


def lloyd_kmeans(x, clusters: int, *, iterations: int, centroids=None):
    """Ordinary (unconstrained) Lloyd k-means of `x` `[tokens, d]`: `(label int32 [tokens],
    centroids f32 [clusters, d])`. A cluster left empty keeps its centroid."""
    import jax
    import jax.numpy as jnp

    c = initial_centroids(x, clusters) if centroids is None else centroids.astype(jnp.float32)

    def iteration(_, c):
        label = jnp.argmin(squared_distances(x, c), axis=1)
        sums = jnp.zeros_like(c).at[label].add(x.astype(jnp.float32))
        counts = jnp.zeros(clusters, jnp.float32).at[label].add(1.0)
        return jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], c)

    c = jax.lax.fori_loop(0, iterations, iteration, c)
    return jnp.argmin(squared_distances(x, c), axis=1).astype(jnp.int32), c


def cut_kmeans_order(x, block: int, *, iterations: int, centroids=None):
    """The comparison: ordinary k-means (`lloyd_kmeans`) with one cluster per tile, tokens sorted
    by label, then cut into tiles of `block`. Returns `order` int32 `[tokens]`.

    A cluster bigger than a tile spills into the next one, a small one shares its tile."""
    label, _ = lloyd_kmeans(x, -(-x.shape[0] // block), iterations=iterations, centroids=centroids)
    return order_of_labels(label)


def check_iterations(iterations, rounds=DEFAULT_ROUNDS, halvings=DEFAULT_HALVINGS) -> tuple[int, int, int]:
    """Validate the k-means iteration count (>= 0), the rounds of proposals per assignment (>= 1)
    and the halvings that find each round's thresholds (>= 1)."""
    for name, value, least in (("iterations", iterations, 0), ("rounds", rounds, 1), ("halvings", halvings, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(iterations), int(rounds), int(halvings)
