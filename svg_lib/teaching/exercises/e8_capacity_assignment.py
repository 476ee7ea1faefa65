"""E8, the capacity-constrained assignment: `check_capacity_assignment` and its hidden cases.

The learner writes the step that makes k-means clusters tile-sized: every cluster takes exactly
its capacity of tokens, the tokens as near to it as the capacities allow. The reference is an
exact assignment solver (`scipy.optimize.linear_sum_assignment` over one column per place in a
cluster: the lowest total distance there is). Hand-made cases, each built so that one common
shortcut fails, must reach that optimum (up to 1 %); on random cases a good heuristic need not
be optimal, so up to `RANDOM_SLACK` times the optimum passes. Measured on 320 random cases
(seeds 0-39): serving the token of largest regret first, one token at a time (the solution), is
1.03 times the optimum at the median and 1.68 at worst; filling in token order 2.29 at the median,
sorting by nearest cluster and cutting 1.56."""
from __future__ import annotations

import numpy as np

from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish, _fmt

PLANTED_SLACK = 1.01   # hand-made cases: the optimum, up to float rounding and near-ties
RANDOM_SLACK = 2.0     # random cases: a reasonable heuristic passes, a shortcut that ignores distance does not


def optimal_assignment(dist, sizes) -> np.ndarray:
    """int64 `[tokens]`: the labels of least total distance with exactly `sizes[j]` tokens in cluster j.

    dist float `[tokens, clusters]`, sizes int `[clusters]` summing to tokens. One column per place
    (cluster j repeated sizes[j] times), then the linear assignment of tokens to places."""
    from scipy.optimize import linear_sum_assignment

    places = np.repeat(np.arange(len(sizes)), sizes)
    rows, cols = linear_sum_assignment(np.asarray(dist, np.float64)[:, places])
    label = np.empty(len(rows), np.int64)
    label[rows] = places[cols]
    return label


def total(dist, label) -> float:
    return float(np.asarray(dist, np.float64)[np.arange(len(label)), label].sum())


# -- the shortcuts the hints name ------------------------------------------------------------------

def _token_order(dist, sizes):
    return np.repeat(np.arange(len(sizes)), sizes)


def _sorted_and_cut(dist, sizes):
    order = np.argsort(np.argmin(dist, axis=1), kind="stable")
    label = np.empty(len(order), np.int64)
    label[order] = np.repeat(np.arange(len(sizes)), sizes)
    return label


def _clusters_in_turn(dist, sizes):
    label = np.full(dist.shape[0], -1)
    for j, size in enumerate(sizes):
        free = np.flatnonzero(label < 0)
        label[free[np.argsort(dist[free, j], kind="stable")[:size]]] = j
    return label


def _nearest_pairs_first(dist, sizes):
    label, room = np.full(dist.shape[0], -1), np.array(sizes)
    for flat in np.argsort(dist, axis=None, kind="stable"):
        t, j = np.unravel_index(flat, dist.shape)
        if label[t] < 0 and room[j] > 0:
            label[t], room[j] = j, room[j] - 1
    return label


SHORTCUTS = (  # matched in this order: the first equal to the answer names the mistake
    (_nearest_pairs_first, "you placed the nearest (token, cluster) pairs first: the token nearest a cluster took its "
                           "place, though another token had far more to lose without it. Serve "
                           "first the token of largest regret (distance to its second open cluster minus to its "
                           "first)"),
    (_clusters_in_turn, "the clusters chose in turn, each taking its nearest free tokens: the first cluster took "
                        "tokens that another cluster needed far more. Serve the tokens, not the clusters: first "
                        "the one that would lose most by going elsewhere"),
    (_sorted_and_cut, "you sorted the tokens by their nearest cluster and cut the sorted list into clusters "
                      "(ordinary k-means, then tiles): a cluster asked by more tokens than its room spills its "
                      "extra tokens by token order, not the ones that lose least by moving"),
    (_token_order, "you filled the clusters in token order, whatever the distances: the labels must come "
                   "from `dist` (nearest clusters first, as far as the capacities allow)"),
)


# -- the hidden cases ------------------------------------------------------------------------------

def _sq(x, c):
    return ((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=-1)


def _named_cases(rng):
    cases = []
    # three of four tokens nearest cluster 0, which has room for two
    x = np.array([[0.0], [0.2], [0.9], [3.0]])
    cases.append(("4 tokens, 2 clusters of 2: three tokens are nearest cluster 0", _sq(x, np.array([[0.0], [3.0]])),
                  [2, 2]))
    # planted groups, equal to the capacities, shuffled along the sequence
    centers = rng.normal(size=(4, 8)) * 6
    x = np.repeat(centers, 8, axis=0) + rng.normal(size=(32, 8)) * 0.5
    x = x[rng.permutation(32)]
    cases.append(("4 separated groups of 8 tokens, shuffled along the sequence", _sq(x, centers), [8] * 4))
    # one cluster asked by 12 tokens, room for 8; the 4 that should move come first in token order
    tight = np.c_[rng.uniform(-0.5, 0.5, 8), np.zeros(8)]
    bridge = np.c_[np.linspace(4.0, 4.6, 4), np.zeros(4)]
    near_c1 = np.c_[rng.uniform(9.5, 10.5, 4), np.zeros(4)]
    x = np.concatenate([bridge, tight, near_c1])
    cases.append(("a cluster asked by 12 tokens with room for 8 (its 4 farthest come first in token order)",
                  _sq(x, np.array([[0.0, 0.0], [10.0, 0.0]])), [8, 8]))
    # the first cluster's nearest tokens belong to the second
    x = np.array([[-10.0], [-9.0], [2.9], [3.1]])
    cases.append(("cluster 0's nearest tokens are far nearer cluster 1", _sq(x, np.array([[0.0], [3.0]])), [2, 2]))
    # the nearest pair is not the one to serve first: token 0 can move, token 1 cannot
    x = np.array([[1.0], [-5.0]])
    cases.append(("2 tokens, 2 clusters of 1: the token nearest a cluster is not the one that needs it most",
                  _sq(x, np.array([[0.0], [10.0]])), [1, 1]))
    # tokens not a multiple of the tile: the last cluster is short
    centers = rng.normal(size=(4, 4)) * 6
    x = np.concatenate([np.repeat(centers[:3], 4, axis=0), centers[3:] + np.zeros((2, 4))]) + rng.normal(size=(14, 4)) * 0.3
    x = x[rng.permutation(14)]
    cases.append(("14 tokens in clusters of 4, 4, 4 and 2 (the last tile short)", _sq(x, centers), [4, 4, 4, 2]))
    cases.append(("one cluster holds every token", _sq(rng.normal(size=(6, 3)), rng.normal(size=(1, 3))), [6]))
    cases.append(("every distance equal (any exact split is optimal)", np.ones((9, 3)), [3, 3, 3]))
    centers = rng.normal(size=(3, 2)) * 8
    x = np.repeat(centers, [1, 3, 3], axis=0) + rng.normal(size=(7, 2)) * 0.3
    cases.append(("a cluster of one token", _sq(x[rng.permutation(7)], centers), [1, 3, 3]))
    return cases


def _random_cases(rng, count):
    cases = []
    for _ in range(count):
        clusters, block = int(rng.integers(2, 9)), int(rng.choice([4, 8, 16, 32]))
        tokens = int(rng.integers((clusters - 1) * block + 1, clusters * block + 1))
        d = int(rng.integers(2, 17))
        blobs = rng.normal(size=(clusters, d)) * rng.uniform(0.5, 4.0)
        weights = rng.dirichlet(np.ones(clusters))                     # unequal groups: capacities bind
        x = blobs[rng.choice(clusters, tokens, p=weights)] + rng.normal(size=(tokens, d))
        centroids = blobs + rng.normal(size=blobs.shape) * 0.5             # k-means mid-way: near the groups
        sizes = [block] * (clusters - 1) + [tokens - (clusters - 1) * block]
        cases.append((f"random: {tokens} tokens, {clusters} clusters of {block} (the last {sizes[-1]}), d = {d}",
                      _sq(x, centroids), sizes))
    return cases


def check_capacity_assignment(fn, *, seed: int = 0) -> CheckResult:
    """E8: `fn(dist, sizes) -> int array [tokens]`, each token's cluster, cluster j taking exactly sizes[j].

    dist float64 `[tokens, clusters]` (squared distances to the centroids), sizes a list of ints.
    Hand-made cases must reach the optimum (exact solver) within 1 %, random ones within twice it."""
    rng = np.random.default_rng(seed)
    named = [_Case(name, dict(dist=dist, sizes=sizes, slack=PLANTED_SLACK)) for name, dist, sizes in _named_cases(rng)]
    rand = [_Case(name, dict(dist=dist, sizes=sizes, slack=RANDOM_SLACK))
            for name, dist, sizes in _random_cases(rng, 8)]

    def run(case):
        dist, sizes, slack = case.data["dist"], case.data["sizes"], case.data["slack"]
        tokens, clusters = dist.shape
        got = _call(fn, "assign_with_capacity", dist.copy(), list(sizes))
        try:
            label = np.asarray(got)
        except Exception:
            raise _Fail(f"returned {type(got).__name__}, expected an int array", "return a numpy int array") from None
        if label.shape != (tokens,):
            raise _Fail(f"expected shape ({tokens},) (one label per token), got {label.shape}",
                        "return one cluster index per token, not a [tokens, clusters] table or a list per cluster")
        if label.dtype.kind not in "iu":
            raise _Fail(f"expected an integer array, got dtype {label.dtype}",
                        "labels are cluster indices: start from np.full(tokens, -1) and write ints into it")
        if label.min() < 0 or label.max() >= clusters:
            order = np.array_equal(np.sort(label), np.arange(tokens))
            raise _Fail(f"labels must lie in 0 .. {clusters - 1}, got values from {label.min()} to {label.max()}",
                        "that looks like an order of the tokens (an argsort), not one cluster label per token"
                        if order else "a label of -1 left means a token was never placed: every token needs a cluster")
        counts = np.bincount(label, minlength=clusters)
        if not np.array_equal(counts, sizes):
            j = int(np.flatnonzero(counts != np.asarray(sizes))[0])
            detail = f"cluster {j} got {counts[j]} tokens, its capacity is {sizes[j]} (all counts {_fmt(counts)}, " \
                     f"capacities {_fmt(np.asarray(sizes))})"
            if np.array_equal(label, np.argmin(dist, axis=1)):
                hint = ("that is each token's nearest cluster, ignoring the capacities: a cluster must stop "
                        "taking tokens once it is full, and the tokens it refuses go to their next choice")
            else:
                hint = "count each cluster's room down as you place tokens, and never place a token in a full cluster"
            raise _Fail(detail, hint)
        best = optimal_assignment(dist, sizes)
        mine, least = total(dist, label), total(dist, best)
        if mine <= least * slack + 1e-9:
            return
        t = int(np.flatnonzero(label != best)[0])
        detail = (f"total distance {_fmt(mine)}, the optimum is {_fmt(least)} ({mine / max(least, 1e-30):.2f} times; "
                  f"at most {slack:g} times passes here); e.g. token {t} went to cluster {label[t]} "
                  f"(distance {_fmt(dist[t, label[t]])}), the optimum puts it in {best[t]} ({_fmt(dist[t, best[t]])})")
        hint = next((h for shortcut, h in SHORTCUTS if np.array_equal(label, shortcut(dist, sizes))),
                    "serve first the unplaced token of largest regret (distance to its second-nearest open "
                    "cluster minus to its nearest), give it its nearest open cluster, and repeat")
        raise _Fail(detail, hint)

    return _finish("E8 assign_with_capacity", named + rand, run,
                   "hand-made traps reached at the optimum, random unequal groups within twice it")
