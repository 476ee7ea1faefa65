"""Semantic plans reused across denoising steps: when to refresh, what reuse loses, what it saves.

A `semantic.SemanticPlan` made at one sampler step (the anchor) can serve the next ones: its
orders and tiles stay valid arrays, only less fitting as q and k move. Published methods reuse
their masks (AdaSpa searches at 2 of 50 steps; PAROAttention keeps one for the later half;
HASTE refreshes a head only when the L1 drift of the token-mean of its q and k from the anchor
step passes a threshold). Here, per head:

* `token_mean_drift`: HASTE's statistic, made scale-free: the L1 distance between the token-means
  of q (and of k) at the anchor and now, over the anchor's mean L1 norm of a token, q and k averaged.
  It costs one mean per head. A move that keeps the token-mean (a zero-mean change) is invisible to it.
* `tile_mean_drift`: the plan's own view: the L1 distance between the plan's centroids and the
  means of today's q and k over the plan's tiles (`semantic.tile_means`), over the centroids'
  L1 norm. 0 for a fresh plan (its centroids are its tiles' means), it sees per-tile moves that
  cancel in the token-mean; a matmul per head (`member_means`), no gather.
* `RefreshPolicy`: refresh a head every `every` steps, or when its drift passes `threshold`, or both.
* `reuse_run`: a sampler run under a policy: cold plan at the first step, then per step and head
  reuse or refresh (a warm start from the last plan's centroids, `warm_iterations` k-means
  iterations, as SVG2 runs 2 after its first); recall on sampled query rows per step and head.
* `amortized_plan_cycles`: a plan's cost spread over the steps it serves.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from svg_lib.layers.semantic import SemanticPlan, plan_recall, semantic_plan, tile_means

STATISTICS = ("token_mean", "tile_mean")


def _l1_rows(x):
    import jax.numpy as jnp

    return jnp.mean(jnp.sum(jnp.abs(x.astype(jnp.float32)), axis=-1), axis=-1)          # [heads]


def token_mean_drift(q_anchor, k_anchor, q, k) -> np.ndarray:
    """float64 `[heads]`: (|mean(q) - mean(q_anchor)|_1 / mean_i |q_anchor,i|_1 + the same for k) / 2,
    means over the tokens of `[heads, tokens, head_dim]` arrays (HASTE's drift, scale-free)."""
    import jax.numpy as jnp

    for name, x in (("q_anchor", q_anchor), ("k_anchor", k_anchor), ("q", q), ("k", k)):
        if getattr(x, "ndim", None) != 3 or tuple(x.shape) != tuple(q_anchor.shape):
            raise ValueError(f"{name} must be shaped [heads, tokens, head_dim] like q_anchor {tuple(q_anchor.shape)}, "
                             f"got {getattr(x, 'shape', None)}")

    def one(a, b):
        moved = jnp.sum(jnp.abs(jnp.mean(b.astype(jnp.float32), axis=1) - jnp.mean(a.astype(jnp.float32), axis=1)),
                        axis=-1)
        return moved / jnp.maximum(_l1_rows(a), 1e-30)

    return np.asarray((one(q_anchor, q) + one(k_anchor, k)) / 2, np.float64)


def tile_mean_drift(plan: SemanticPlan, q, k) -> np.ndarray:
    """float64 `[heads]`: (|tile means of q - plan's q centroids|_1 / |q centroids|_1 + the same for k) / 2,
    summed over the plan's tiles: how far today's q and k moved inside the tiles the plan cut."""
    import jax.numpy as jnp

    if not isinstance(plan, SemanticPlan):
        raise TypeError(f"plan must be a SemanticPlan, got {type(plan).__name__}")
    if tuple(q.shape[:2]) != tuple(plan.q_order.shape) or tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"q and k must be [heads, tokens, head_dim] with the plan's {tuple(plan.q_order.shape)} "
                         f"heads x tokens, got q {tuple(q.shape)}, k {tuple(k.shape)}")

    def one(x, place, block, centroids):
        means = tile_means(x.astype(jnp.float32), place, block)
        c = centroids.astype(jnp.float32)
        return jnp.sum(jnp.abs(means - c), axis=(1, 2)) / jnp.maximum(jnp.sum(jnp.abs(c), axis=(1, 2)), 1e-30)

    drift = (one(q, plan.q_place, plan.block_q, plan.centroids.q) + one(k, plan.k_place, plan.block_kv,
                                                                          plan.centroids.k)) / 2
    return np.asarray(drift, np.float64)


@dataclasses.dataclass(frozen=True)
class RefreshPolicy:
    """When a head's plan is made again: every `every` steps (its age reaching `every`), or when
    its drift (`statistic`: "token_mean" or "tile_mean") passes `threshold`, whichever comes first.
    `every=None` and `threshold=None`: never after the first plan."""

    every: int | None = None
    threshold: float | None = None
    statistic: str = "token_mean"

    def __post_init__(self):
        if self.every is not None and (isinstance(self.every, bool) or not isinstance(self.every, (int, np.integer))
                                       or self.every < 1):
            raise ValueError(f"every must be None or a positive integer (steps between refreshes), got {self.every!r}")
        if self.threshold is not None and (isinstance(self.threshold, bool) or not self.threshold >= 0):
            raise ValueError(f"threshold must be None or a number >= 0 (a drift), got {self.threshold!r}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {self.statistic!r}")

    @property
    def name(self) -> str:
        parts = ([f"every {self.every}"] if self.every is not None else []) + \
                ([f"{self.statistic} drift > {self.threshold:g}"] if self.threshold is not None else [])
        return " or ".join(parts) if parts else "never"

    def refresh(self, age, drift) -> np.ndarray:
        """bool `[heads]`: which heads refresh, given each head's plan `age` (steps since its plan
        was made, int `[heads]`) and `drift` (float `[heads]`, this policy's statistic)."""
        age, drift = np.asarray(age), np.asarray(drift, np.float64)
        out = np.zeros(np.broadcast(age, drift).shape, bool)
        if self.every is not None:
            out |= age >= self.every
        if self.threshold is not None:
            out |= drift > self.threshold
        return out


def merge_plans(old: SemanticPlan, new: SemanticPlan, take) -> SemanticPlan:
    """The plan whose head h is `new`'s where `take[h]` (bool `[heads]`), else `old`'s."""
    import jax
    import jax.numpy as jnp

    take = jnp.asarray(take, bool)

    def pick(a, b):
        return jnp.where(take.reshape((-1,) + (1,) * (a.ndim - 1)), b, a)

    return jax.tree.map(pick, old, new)


def amortized_plan_cycles(plan_cycles_per_head: float, refreshes, steps: int) -> np.ndarray:
    """float64 `[heads]`: a plan's cycles per head times the head's `refreshes` (int `[heads]`, the
    first plan included) over the `steps` they served: the plan's cost per step."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not plan_cycles_per_head >= 0:
        raise ValueError(f"plan_cycles_per_head must be >= 0, got {plan_cycles_per_head!r}")
    return float(plan_cycles_per_head) * np.asarray(refreshes, np.float64) / steps


def planner(*, block_q: int, block_kv: int, density: float, iterations: int = 10, warm_iterations: int = 2):
    """(cold, warm): jitted `cold(q, k) -> plan` (`iterations` from a cold start) and
    `warm(q, k, centroids) -> plan` (`warm_iterations` from a previous plan's centroids)."""
    import jax

    common = dict(block_q=block_q, block_kv=block_kv, density=density)
    cold = jax.jit(lambda q, k: semantic_plan(q, k, iterations=iterations, **common))
    warm = jax.jit(lambda q, k, c: semantic_plan(q, k, iterations=warm_iterations, centroids=c, **common))
    return cold, warm


def reuse_run(step_qk, policy: RefreshPolicy, rows, *, block_q: int, block_kv: int, density: float,
              iterations: int = 10, warm_iterations: int = 2, plans=None) -> dict:
    """A sampler run with plans reused under `policy`: per step and head, recall and what was done.

    step_qk: an iterable of (q, k) per step (`[heads, tokens, head_dim]`; e.g. `(s.q, s.k) for s in
    DenoisingProxy(...)`). The first step plans every head cold (`iterations`); at each later step
    the heads the policy picks (from their age and drift against their anchor) are planned again,
    warm-started from their last plan (`warm_iterations`). Recall (`semantic.plan_recall`) on the
    query `rows`. `plans`: the (cold, warm) of `planner(...)` to reuse compiled functions.

    Returns float64 / int / bool NumPy arrays `[steps, heads]`: "recall", "refreshed" (the step
    planned this head; all heads at step 0), "age" (of the plan used, after any refresh), "drift"
    (the policy's statistic before the decision; 0 at step 0), and "refreshes" `[heads]`.
    """
    cold, warm = plans or planner(block_q=block_q, block_kv=block_kv, density=density, iterations=iterations,
                                  warm_iterations=warm_iterations)
    recall, refreshed, ages, drifts = [], [], [], []
    plan = anchor = age = None
    for step, (q, k) in enumerate(step_qk):
        if plan is None:
            plan, anchor = cold(q, k), (q, k)
            age = np.zeros(q.shape[0], np.int64)
            take, drift = np.ones(q.shape[0], bool), np.zeros(q.shape[0])
        else:
            age = age + 1
            drift = (token_mean_drift(*anchor, q, k) if policy.statistic == "token_mean"
                     else tile_mean_drift(plan, q, k))
            take = policy.refresh(age, drift)
            if take.any():
                plan = merge_plans(plan, warm(q, k, plan.centroids), take)
                anchor = tuple(merge_plans_arrays(a, b, take) for a, b in zip(anchor, (q, k)))
                age = np.where(take, 0, age)
        recall.append(np.asarray(plan_recall(q, k, plan, rows), np.float64))
        refreshed.append(take)
        ages.append(age.copy())
        drifts.append(np.asarray(drift, np.float64))
    out = {"recall": np.stack(recall), "refreshed": np.stack(refreshed), "age": np.stack(ages),
           "drift": np.stack(drifts)}
    out["refreshes"] = out["refreshed"].sum(axis=0)
    return out


def merge_plans_arrays(old, new, take):
    """`[heads, ...]` array: `new`'s head h where `take[h]`, else `old`'s."""
    import jax.numpy as jnp

    return jnp.where(jnp.asarray(take, bool).reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
