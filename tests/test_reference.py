"""Tests of svg_lib.kernels.reference and svg_lib.extensions.references: the ground-truth attention
every kernel is compared with.

It is checked against the textbook formula written here in float64 numpy.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import TileAlignedMask
from svg_lib.core.svg_masks import SVGMask
from svg_lib.kernels.reference import reference_attention
from svg_lib.extensions.tolerances import tolerance


def naive_attention(q, k, v, keep=None):
    """softmax(q k^T / sqrt(D)) v in float64, one row at a time; rows that keep nothing give 0."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    heads, n, d = q.shape
    out = np.zeros((heads, n, d))
    for h in range(heads):
        scores = q[h] @ k[h].T / np.sqrt(d)
        for i in range(n):
            cols = np.arange(n) if keep is None else np.flatnonzero(keep[i])
            if cols.size == 0:
                continue
            s = scores[i, cols]
            w = np.exp(s - s.max())
            out[h, i] = (w / w.sum()) @ v[h, cols]
    return out


def random_qkv(seed, heads, n, d, dtype=np.float32, sharpness=2.0):
    """Random q, k, v; `sharpness` scales q so the softmax is far from uniform."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, n, d)) * sharpness
    k = rng.standard_normal((heads, n, d))
    v = rng.standard_normal((heads, n, d))
    return tuple(jnp.asarray(x, dtype=dtype) for x in (q, k, v))


# the series' tolerances (svg_lib/extensions/tolerances.py); for bf16 the output's own rounding is what is left
F32, BF16 = tolerance("float32"), tolerance("bfloat16")

GEOMETRY = VideoGeometry(4, 6, 12, text_tokens=10)  # 298 tokens: several bands' worth
SPATIAL = SVGMask.spatial(GEOMETRY, 0.25)
MASKS = {
    "none": None,
    "spatial": SPATIAL,
    "temporal": SVGMask.temporal(GEOMETRY, 0.25),
    "tile_aligned": SPATIAL.tile_aligned(128, 128),
    "dense_bool": np.random.default_rng(7).random((GEOMETRY.tokens, GEOMETRY.tokens)) < 0.3,
}


def dense_of(mask):
    if mask is None:
        return None
    return mask if isinstance(mask, np.ndarray) else mask.to_dense()


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("d", [16, 64])
def test_float32_matches_naive(name, d):
    mask = MASKS[name]
    q, k, v = random_qkv(d, 2, GEOMETRY.tokens, d)
    got = reference_attention(q, k, v, mask)
    assert got.shape == q.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), naive_attention(q, k, v, dense_of(mask)), **F32)


@pytest.mark.parametrize("name", ["none", "spatial", "dense_bool"])
def test_bfloat16_matches_naive_on_the_same_inputs(name):
    mask = MASKS[name]
    q, k, v = random_qkv(3, 2, GEOMETRY.tokens, 32, dtype=jnp.bfloat16)
    got = reference_attention(q, k, v, mask)
    assert got.dtype == jnp.bfloat16 and got.shape == q.shape
    # the naive version sees exactly the bf16 values (upcast), so only accumulation and the
    # final rounding to bf16 separate the two
    expect = naive_attention(np.asarray(q, np.float32), np.asarray(k, np.float32), np.asarray(v, np.float32),
                             dense_of(mask))
    np.testing.assert_allclose(np.asarray(got, np.float32), expect, **BF16)


def test_mask_object_and_its_dense_array_agree():
    q, k, v = random_qkv(11, 3, GEOMETRY.tokens, 16)
    for name in ("spatial", "temporal", "tile_aligned"):
        mask = MASKS[name]
        np.testing.assert_array_equal(np.asarray(reference_attention(q, k, v, mask)),
                                      np.asarray(reference_attention(q, k, v, mask.to_dense())))


def test_all_true_mask_equals_no_mask():
    q, k, v = random_qkv(5, 2, 130, 8)
    ones = np.ones((130, 130), bool)
    np.testing.assert_allclose(np.asarray(reference_attention(q, k, v, ones)),
                               np.asarray(reference_attention(q, k, v)), rtol=1e-6, atol=1e-6)


def test_numpy_inputs_are_accepted():
    q, k, v = (np.asarray(x) for x in random_qkv(2, 1, 40, 8))
    got = reference_attention(q, k, v, np.tril(np.ones((40, 40), bool)))
    np.testing.assert_allclose(np.asarray(got), naive_attention(q, k, v, np.tril(np.ones((40, 40), bool))), **F32)


def test_large_logits_stay_finite():
    q, k, v = random_qkv(9, 2, 64, 16, sharpness=300.0)  # logits in the hundreds: exp overflows unshifted
    got = np.asarray(reference_attention(q, k, v))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, naive_attention(q, k, v), rtol=1e-4, atol=1e-4)


def test_rows_with_nothing_kept_give_zeros():
    n = 96
    q, k, v = random_qkv(4, 2, n, 8)
    keep = np.random.default_rng(0).random((n, n)) < 0.2
    empty_rows = [0, 5, 50, n - 1]
    keep[empty_rows] = False
    got = np.asarray(reference_attention(q, k, v, keep))
    assert np.isfinite(got).all()
    assert (got[:, empty_rows] == 0).all()
    np.testing.assert_allclose(got, naive_attention(q, k, v, keep), **F32)


def test_mask_object_with_empty_query_tiles_gives_zeros():
    # a tile mask whose middle query tile keeps nothing: every row of it must come out 0
    kept = np.array([[True, False, True], [False, False, False], [True, True, False]])
    tam = TileAlignedMask(300, 128, 128, kept)
    dense = tam.to_dense()
    empty = ~dense.any(axis=1)
    assert empty.sum() == 128
    q, k, v = random_qkv(6, 2, 300, 8)
    got = np.asarray(reference_attention(q, k, v, tam))
    assert np.isfinite(got).all() and (got[:, empty] == 0).all()
    np.testing.assert_allclose(got, naive_attention(q, k, v, dense), **F32)


@pytest.mark.parametrize("block_rows", [1, 100, 298, 5000])
def test_block_rows_chunking_changes_nothing(block_rows):
    q, k, v = random_qkv(8, 2, GEOMETRY.tokens, 16)
    whole = np.asarray(reference_attention(q, k, v, SPATIAL))
    chunked = np.asarray(reference_attention(q, k, v, SPATIAL, block_rows=block_rows))
    # each query row is computed on its own, so chunking may only move float32 rounding (a
    # one-row chunk takes XLA's matrix-vector path, which sums in another order: ~1 ulp)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=2e-6)


# -- bad input -------------------------------------------------------------------------------

def test_two_dimensional_input_raises():
    q = jnp.zeros((16, 8))
    with pytest.raises(ValueError, match=r"q must be shaped \[heads, tokens, head_dim\].*\(16, 8\)"):
        reference_attention(q, q, q)


def test_shape_mismatch_raises():
    q, k, v = random_qkv(0, 2, 32, 8)
    with pytest.raises(ValueError, match="same shape") as err:
        reference_attention(q, k[:, :16], v)
    assert "(2, 32, 8)" in str(err.value) and "(2, 16, 8)" in str(err.value)


def test_dtype_mismatch_raises():
    q, k, v = random_qkv(0, 2, 32, 8)
    with pytest.raises(ValueError, match="dtype") as err:
        reference_attention(q, k.astype(jnp.bfloat16), v)
    assert "bfloat16" in str(err.value)


def test_dense_mask_of_the_wrong_shape_raises():
    q, k, v = random_qkv(0, 1, 32, 8)
    with pytest.raises(ValueError, match=r"\(32, 32\)") as err:
        reference_attention(q, k, v, np.ones((32, 31), bool))
    assert "(32, 31)" in str(err.value)


def test_mask_for_another_sequence_raises():
    q, k, v = random_qkv(0, 1, 32, 8)
    with pytest.raises(ValueError, match="298") as err:
        reference_attention(q, k, v, SPATIAL)
    assert "32" in str(err.value)


@pytest.mark.parametrize("block_rows", [0, -4])
def test_bad_block_rows_raises_naming_it(block_rows):
    q, k, v = random_qkv(0, 1, 32, 8)
    with pytest.raises(ValueError, match="block_rows"):
        reference_attention(q, k, v, block_rows=block_rows)


def test_additive_float_mask_is_refused():
    # A 0 / -inf additive mask is a common convention elsewhere; read as bool it would keep
    # exactly the pairs it meant to drop. It must be refused, not silently inverted.
    q, k, v = random_qkv(0, 1, 32, 8)
    additive = np.where(np.tril(np.ones((32, 32), bool)), 0.0, -np.inf)
    with pytest.raises(ValueError, match="bool"):
        reference_attention(q, k, v, additive)


# -- the float64 references on the host ------------------------------------------------------

from svg_lib.extensions.references import (attention_float64, attention_gradients_float64,  # noqa: E402
                                          attention_rows_float64)


@pytest.mark.parametrize("name", list(MASKS))
def test_float64_reference_matches_naive(name):
    mask = MASKS[name]
    q, k, v = random_qkv(12, 2, GEOMETRY.tokens, 16)
    got = attention_float64(q, k, v, mask)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == q.shape
    np.testing.assert_allclose(got, naive_attention(q, k, v, dense_of(mask)), rtol=1e-12, atol=1e-12)


def test_float64_reference_reads_bf16_inputs_exactly():
    q, k, v = random_qkv(13, 1, 64, 8, dtype=jnp.bfloat16)
    exact = [np.asarray(x, np.float32) for x in (q, k, v)]  # bf16 -> float32 is exact
    np.testing.assert_allclose(attention_float64(q, k, v), naive_attention(*exact), rtol=1e-12, atol=1e-12)


def test_float64_rows_are_the_whole_references_rows():
    # sampled rows under a per-row key mask, a row that keeps nothing included (it gives 0)
    name = "spatial"
    dense = dense_of(MASKS[name])
    q, k, v = random_qkv(14, 2, GEOMETRY.tokens, 16)
    rows = np.array([0, 5, GEOMETRY.tokens - 1])
    keep = np.broadcast_to(dense[rows], (2, 3, GEOMETRY.tokens)).copy()
    keep[1, 2] = False
    got = attention_rows_float64(q, k, v, rows, keep)
    want = attention_float64(q, k, v, MASKS[name])[:, rows]
    want[1, 2] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="should be"):
        attention_rows_float64(q, k, v, rows, keep[:, :2])


def _finite_difference(q, k, v, dout, mask, which, index, h=1e-6):
    args = [np.asarray(x, np.float64) for x in (q, k, v)]
    up, down = [a.copy() for a in args], [a.copy() for a in args]
    up[which][index] += h
    down[which][index] -= h
    f = lambda a: float(np.sum(attention_float64(*a, mask) * dout))  # noqa: E731
    return (f(up) - f(down)) / (2 * h)


def test_float64_gradients_match_finite_differences():
    # an independent check of the closed form: central differences of the float64 loss
    n = 40
    keep = np.random.default_rng(3).random((n, n)) < 0.5
    keep[7] = False  # a row that keeps nothing: its dq must be 0
    q, k, v = (np.asarray(x, np.float64) for x in random_qkv(14, 1, n, 8))
    dout = np.random.default_rng(15).standard_normal((1, n, 8))
    grads = attention_gradients_float64(q, k, v, dout, keep)
    assert all(g.dtype == np.float64 and g.shape == q.shape for g in grads)
    assert (grads[0][:, 7] == 0).all()
    rng = np.random.default_rng(16)
    for which in range(3):
        for _ in range(4):
            index = (0, int(rng.integers(n)), int(rng.integers(8)))
            fd = _finite_difference(q, k, v, dout, keep, which, index)
            assert abs(grads[which][index] - fd) < 1e-7 * max(1.0, abs(fd)), (which, index)


def test_float64_gradients_agree_with_jax_grad_of_the_reference():
    import jax

    q, k, v = random_qkv(17, 2, GEOMETRY.tokens, 16)
    dout = random_qkv(18, 2, GEOMETRY.tokens, 16)[0]
    want = jax.grad(lambda q, k, v: jnp.sum(reference_attention(q, k, v, SPATIAL) * dout), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(attention_gradients_float64(q, k, v, dout, SPATIAL), want):
        np.testing.assert_allclose(g, np.asarray(w), **tolerance("float32", "gradients"))


def test_float64_references_refuse_bad_input():
    q, k, v = random_qkv(0, 1, 32, 8)
    with pytest.raises(ValueError, match="same shape"):
        attention_float64(q, k[:, :16], v)
    with pytest.raises(ValueError, match="bool"):
        attention_float64(q, k, v, np.zeros((32, 32)))
    with pytest.raises(ValueError, match="298"):
        attention_gradients_float64(q, k, v, q, SPATIAL)
    with pytest.raises(ValueError, match=r"dout must be shaped like q \(1, 32, 8\)"):
        attention_gradients_float64(q, k, v, q[:, :16])


# -- the tolerances ----------------------------------------------------------------------------

def test_tolerances_are_one_table_per_dtype():
    from svg_lib.extensions import tolerances

    assert tolerance(jnp.float32) == tolerance("float32") == tolerances.ATTENTION["float32"]
    assert tolerance(jnp.bfloat16, "gradients") == tolerances.GRADIENTS["bfloat16"]
    # bf16's tolerance admits its rounding, float32's is far tighter
    assert tolerance("float32")["atol"] * 100 <= tolerance("bfloat16")["atol"]
    tolerance("float32")["atol"] = 1.0  # a copy: callers cannot loosen the table
    assert tolerances.ATTENTION["float32"]["atol"] < 1.0
    with pytest.raises(ValueError, match="float16"):
        tolerance("float16")
    with pytest.raises(ValueError, match="kind"):
        tolerance("float32", "outputs")


def test_one_bf16_pass_slack_bounds_a_bf16_rounded_matmul():
    import ml_dtypes

    from svg_lib.extensions.tolerances import one_bf16_pass_slack

    rng = np.random.default_rng(19)
    a, b = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal((64, 8)).astype(np.float32)
    rounded = a.astype(ml_dtypes.bfloat16).astype(np.float64) @ b.astype(ml_dtypes.bfloat16).astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    slack = one_bf16_pass_slack(np.abs(a), np.abs(b))
    assert (np.abs(rounded - exact) <= slack).all()
    assert np.abs(rounded - exact).max() > slack.max() / 100  # a bound of the right size, not a huge one
