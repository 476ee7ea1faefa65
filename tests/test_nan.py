"""NaN propagates through every method as through a softmax: it is never hidden (interpret mode).

The contract, written as a boolean model (`nan_model`) of what each kernel computes. With K the pairs
the method's mask keeps and C the pairs it computes (the pairs of the tiles it visits: every pair for
the reference and the dense methods, K's non-empty tiles for b1, b2 and Splash, the rounded mask's
tiles for b3 and semantic tiles), an output row that keeps no key is exactly 0, and any other row i
is NaN exactly when

    q_i holds a NaN, or a key j with (i, j) in K has a NaN in k_j (its score), or
    a key j with (i, j) in C has a NaN in v_j (p @ v meets it: 0 * NaN = NaN where p is 0).

So a NaN in k reaches exactly the rows that keep that key, as in `jax.nn.dot_product_attention` with
the same boolean mask; a NaN in v reaches the rows of every query tile that computes its key tile, as
a dense `softmax @ v` reaches every row. The gradients follow the backward's matmuls over C in the
same way (`nan_model`'s last lines). Each case puts one NaN in each of three heads (in q, in k, in v),
so that one forward and one gradient per method check all three against the model, pattern for
pattern, and every value that is not NaN is finite.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import svg_lib
from svg_lib import Mask, attention, b3_mask, plan_tiles
from svg_lib.extensions.bounded_max import bound_test
from svg_lib.extensions.references import attention_float64, attention_gradients_float64
from svg_lib.layers.semantic import plan_keep
from svg_lib.methods import METHODS

BLOCK = 128
N = 400          # 4 x 4 tiles of 128, the last one short (112 rows of padding past the end)
HEAD_DIM = 64
NAN_Q_ROWS = (300, 3, 150)  # head 0: q NaN in a row keeping keys, a row keeping none, a row of an empty tile
NAN_K = 260             # head 1: key 260 kept by rows 110..127 of query tile 0, not by rows 0..109
NAN_V = 260             # head 2: the same key's value: query tile 0 computes its tile, so all its rows meet it


class HoleyBand(Mask):
    """A band of half-width 150 in which every row q with q % 7 == 3 keeps nothing, and query tile 1
    (rows 128..255) keeps nothing at all. Tiles (0, 3) and (3, 0) are empty, (0, 2) partial: keys
    256..277 are kept by the last rows of query tile 0 only. Arithmetic only, so kernels can evaluate it."""

    tokens = N

    def keep(self, q, k):
        return ((q - k <= 150) & (k - q <= 150) & (q % 7 != 3) & (q // BLOCK != 1) & (q < N) & (k < N))

    def cache_key(self):
        return ("test_nan.HoleyBand",)


MASK = HoleyBand()


def tiles_to_pairs(visited, n=N, block=BLOCK):
    """bool [n, n]: the pairs of the visited [nq, nk] tiles."""
    return np.kron(visited, np.ones((block, block), bool))[:n, :n]


def nan_model(keep, computed, q_nan, k_nan, v_nan, autodiff=False):
    """Which outputs and gradients are NaN, for one head: keep, computed bool [n, n] (K and C above),
    q_nan, k_nan, v_nan bool [n] (a NaN somewhere in that row). Returns (out, dq, dk, dv), bool [n] each.

    The backward rebuilds p = exp(s - lse): the forward's lse of a row with a kept NaN score is NaN, so
    p is NaN over the whole row of C (masked pairs too: MASK_VALUE - NaN); D = rowsum(do * out) is NaN
    for a NaN output row; ds = p (dp - D) with dp = do v^T. Then dv = p^T do, dk = ds^T q, dq = ds k,
    each a matmul over C, where 0 * NaN = NaN. `autodiff`: the jnp reference differentiated by jax,
    whose select of the masked scores gives ds = 0 on masked pairs, so a row keeping nothing has
    ds = 0 (the kernels' p = 0 there still meets a NaN dp: 0 * NaN). For a row keeping a key the
    difference never shows: a NaN ds anywhere in it (a NaN lse, D or v_j over C) is NaN on its kept pairs."""
    has = keep.any(1)
    lse = has & (q_nan | (keep & k_nan[None]).any(1))
    out = has & (lse | (computed & v_nan[None]).any(1))
    p = computed & lse[:, None]
    ds = computed & (p | v_nan[None] | out[:, None])
    if autodiff:
        ds &= has[:, None]
    dv = p.any(0)
    dk = (computed & (ds | q_nan[:, None])).any(0)
    dq = (computed & (ds | k_nan[None])).any(1)
    return out, dq, dk, dv


def rows(*ids):
    x = np.zeros(N, bool)
    x[list(ids)] = True
    return x


NONE = np.zeros(N, bool)
PLACED = [(rows(*NAN_Q_ROWS), NONE, NONE), (NONE, rows(NAN_K), NONE), (NONE, NONE, rows(NAN_V))]  # per head


@functools.lru_cache(maxsize=None)
def inputs():
    """q, k, v [3, N, HEAD_DIM] f32 with the NaNs of PLACED, the cotangent w, and the clean q, k, v."""
    rng = np.random.default_rng(0)
    clean = [rng.standard_normal((3, N, HEAD_DIM)).astype(np.float32) for _ in range(3)]
    dirty = [x.copy() for x in clean]
    for h, where in enumerate(PLACED):
        for x, at in zip(dirty, where):
            x[h, at, 5] = np.nan
    w = rng.standard_normal((3, N, HEAD_DIM)).astype(np.float32)
    return tuple(map(jnp.asarray, dirty)), jnp.asarray(w), tuple(map(jnp.asarray, clean))


def expected(keep, computed, autodiff=False):
    """(out, dq, dk, dv) bool [3, N]: the model per head; keep, computed [n, n] or [3, n, n]."""
    keep, computed = (np.broadcast_to(x, (3, N, N)) for x in (keep, computed))
    return tuple(np.stack(x) for x in zip(*(nan_model(keep[h], computed[h], *PLACED[h], autodiff=autodiff)
                                            for h in range(3))))


def nan_rows(x):
    """bool [heads, tokens]: rows holding a NaN; asserts the rest are finite (no inf either)."""
    x = np.asarray(x, np.float64)
    bad = np.isnan(x).any(-1)
    assert np.isfinite(x[~bad]).all()
    return bad


def run(f):
    """(out, (dq, dk, dv)) of f(q, k, v) on the NaN inputs; the gradient of sum(out * w)."""
    (q, k, v), w, _ = inputs()
    out, pullback = jax.vjp(f, q, k, v)
    return out, pullback(w)


def check(out, grads, keep, computed, autodiff=False):
    want = expected(keep, computed, autodiff)
    keeps_none = ~np.broadcast_to(keep, (3, N, N)).any(-1)
    assert (np.asarray(out)[keeps_none] == 0).all(), "a row that keeps no key is not exactly 0"
    np.testing.assert_array_equal(nan_rows(out), want[0], err_msg="NaN rows of the output")
    for name, got, w in zip(("dq", "dk", "dv"), grads, want[1:]):
        np.testing.assert_array_equal(nan_rows(got), w, err_msg=f"NaN rows of {name}")


def method_masks(method):
    """(K, C) bool [N, N] of `method` on MASK at 128 x 128 tiles, read off the method table."""
    record = METHODS[method]
    keep = record.computed_mask(MASK, BLOCK, BLOCK)
    everything = np.ones((N, N), bool)
    if keep is None:                          # the dense baselines: every pair kept and computed
        return everything, everything
    if not (record.pallas or record.splash):  # the reference: a softmax over every masked score
        return keep.to_dense(), everything
    return keep.to_dense(), tiles_to_pairs(plan_tiles(keep, BLOCK, BLOCK).visited)


def test_the_problem_exercises_what_it_claims():
    keep, computed = method_masks("b1")
    assert not computed.all() and (computed & ~keep).any()          # empty tiles, and partial ones
    holes = np.arange(N) % 7 == 3
    assert (keep[110:128, NAN_K] == ~holes[110:128]).all() and not keep[:110, NAN_K].any()
    assert computed[:128, NAN_K].all()
    assert keep[NAN_Q_ROWS[0]].any() and not keep[NAN_Q_ROWS[1]].any() and not computed[NAN_Q_ROWS[2]].any()
    # the bounded max is taken where the data allow it (the v head's tiles, by dense's first tiles) and
    # refused where a NaN makes the bound NaN (the q row's tile; every tile of the k head)
    (q, k, _), _, _ = inputs()
    passes = bound_test(q, k, block_q=BLOCK, block_kv=BLOCK)
    assert passes[2].all() and not passes[1].any() and not passes[0, NAN_Q_ROWS[0] // BLOCK]
    out = expected(*method_masks("b1"))[0]
    assert out[0, NAN_Q_ROWS[0]] and out[0].sum() == 1              # q: its row only
    assert out[1, :128].sum() == 18 - 2 and out[1, 110:128].sum() == 16  # k: rows 110..127 less 2 holes
    assert out[2, :128].sum() == 128 - 18                            # v: query tile 0, less its holes


@pytest.mark.parametrize("method", list(METHODS))
def test_nan_reaches_exactly_the_rows_the_model_says(method):
    out, grads = run(lambda q, k, v: attention(q, k, v, MASK, method=method, block_q=BLOCK, block_kv=BLOCK,
                                               interpret=True))
    check(out, grads, *method_masks(method), autodiff=not (METHODS[method].pallas or METHODS[method].splash))


@pytest.mark.parametrize("method", ["reference", "b1"])
def test_q_and_k_nan_match_jax_dot_product_attention(method):
    """jax's own attention with the same boolean mask puts NaN in the same rows, for q and for k (a NaN in
    v reaches every row there: the model's C of all pairs, which the reference and dense share)."""
    (q, k, v), _, _ = inputs()
    keep = MASK.to_dense()
    ours = nan_rows(attention(q, k, v, MASK, method=method, block_q=BLOCK, block_kv=BLOCK, interpret=True))
    theirs = jax.nn.dot_product_attention(*(x.transpose(1, 0, 2)[None] for x in (q, k, v)),
                                          mask=jnp.asarray(keep)[None, None])[0].transpose(1, 0, 2)
    theirs = np.isnan(np.asarray(theirs)).any(-1) & keep.any(1)[None]  # rows keeping nothing: ours are 0
    np.testing.assert_array_equal(ours[:2], theirs[:2])
    if method == "reference":
        np.testing.assert_array_equal(ours[2], theirs[2])


def test_dense_gradients_match_jax_dot_product_attention():
    (q, k, v), w, _ = inputs()

    def theirs(q, k, v):
        t = [x.transpose(1, 0, 2)[None] for x in (q, k, v)]
        return jax.nn.dot_product_attention(*t)[0].transpose(1, 0, 2)

    def ours(q, k, v):
        return attention(q, k, v, MASK, method="dense", block_q=BLOCK, block_kv=BLOCK, interpret=True)  # mask ignored

    for f in (ours, theirs):
        out, pullback = jax.vjp(f, q, k, v)
        got = [nan_rows(out)] + [nan_rows(g) for g in pullback(w)]
        if f is ours:
            first = got
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, got):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_float64_references_follow_the_model():
    (q, k, v), w, _ = inputs()
    keep, computed = method_masks("reference")
    out = attention_float64(q, k, v, MASK)
    grads = attention_gradients_float64(q, k, v, w, MASK)
    check(out, grads, keep, computed)


def test_semantic_attention():
    """Over a given plan's tiles (K = C: whole tiles), made from the clean q and k. (A plan made from the
    NaN inputs themselves is another matter: one NaN key makes every k-means centroid of its head NaN.)"""
    (q, k, v), w, (cq, ck, _) = inputs()
    plan = svg_lib.semantic_plan(cq, ck, block_q=BLOCK, block_kv=BLOCK, density=0.5, iterations=1)  # the tiles, from clean q, k
    keep = np.asarray(plan_keep(plan))                                                # [3, N, N], whole tiles
    out, grads = run(lambda q, k, v: svg_lib.semantic_attention(q, k, v, plan, interpret=True))
    check(out, grads, keep, keep)


def test_a_plan_from_nan_keys_computes_their_tile():
    """A plan made from the NaN inputs: one NaN key turns its head's centroids NaN, and the tile it was
    put in is still computed by every query tile, so the NaN reaches every row of that head, as it
    would in a softmax over all keys; the other heads' plans see no NaN key and rank by score."""
    (q, k, v), _, (_, ck, _) = inputs()
    plan = svg_lib.semantic_plan(q, k, block_q=BLOCK, block_kv=BLOCK, density=0.5, iterations=1)
    nan_tile = int(np.asarray(plan.k_place)[1, NAN_K]) // BLOCK
    tiles = np.asarray(plan.tiles)
    assert tiles[1, :, nan_tile].all()
    assert not np.isfinite(np.asarray(plan.centroids.k)[1]).all()       # the centroids did go NaN
    clean = svg_lib.semantic_plan(q, ck, block_q=BLOCK, block_kv=BLOCK, density=0.5, iterations=1)
    np.testing.assert_array_equal(tiles[2], np.asarray(clean.tiles)[2])  # a clean head: the same plan
    out = nan_rows(svg_lib.semantic_attention(q, k, v, plan, interpret=True))
    assert out[1].all()


def test_finite_inputs_are_untouched():
    """The clean inputs give finite outputs and gradients, and rows keeping nothing are exactly 0."""
    _, w, (q, k, v) = inputs()
    for method in ("b1", "b3"):
        out, pullback = jax.vjp(lambda q, k, v: attention(q, k, v, MASK, method=method, block_q=BLOCK,
                                                          block_kv=BLOCK, interpret=True), q, k, v)
        keep = method_masks(method)[0]
        assert np.isfinite(np.asarray(out)).all() and (np.asarray(out)[:, ~keep.any(1)] == 0).all()
        assert all(np.isfinite(np.asarray(g)).all() for g in pullback(w))


@pytest.mark.parametrize("method", ["b2", "b3"])
def test_padding_inside_the_sequence_stays_zero(method):
    """A sliding-tile mask pads each 3-D cube inside the sequence: its padded query rows are computed
    unmasked by the kernels and then zeroed. They stay exactly 0 with a NaN in their own q and with a
    NaN in a v their tiles compute; the real rows follow the model (forward)."""
    from svg_lib import SlidingTileMask, VideoGeometry

    mask = SlidingTileMask(VideoGeometry(3, 5, 16), (1, 4, 32), (1, 3, 1))  # 128-token cubes, padding inside
    n = mask.tokens
    padding = mask.real_tokens_in(np.arange(n + 1)) == 0
    kernel_mask = b3_mask(mask, BLOCK, BLOCK) if method == "b3" else mask
    keep = kernel_mask.to_dense()
    computed = tiles_to_pairs(plan_tiles(kernel_mask, BLOCK, BLOCK).visited, n)
    pad_row = int(np.nonzero(padding)[0][0])
    real_key = int(np.nonzero(computed[pad_row] & ~padding)[0][0])  # a real key the padding row's tile computes
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, n, HEAD_DIM)).astype(np.float32) for _ in range(3))
    q[0, pad_row, 0] = np.nan
    v[1, real_key, 0] = np.nan
    out = np.asarray(attention(*map(jnp.asarray, (q, k, v)), mask, method=method, block_q=BLOCK, block_kv=BLOCK,
                               interpret=True))
    assert padding.any() and (out[:, padding] == 0).all()
    none = np.zeros(n, bool)
    v_nan = none.copy()
    v_nan[real_key] = True
    want = nan_model(keep, computed, none, none, v_nan)[0] & ~padding
    np.testing.assert_array_equal(nan_rows(out), np.stack([none, want]))
    assert want.any()
