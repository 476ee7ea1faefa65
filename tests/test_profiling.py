"""Online profiling (svg_lib.profile_heads) on planted and random heads.

Planted heads come from `structured_qkv`: a spatial head's softmax mass sits in its own frame
around the token, a temporal head's on the same spatial slot across frames. At 8 frames of 16 x 16
tokens and density 0.2 the band (128 tokens) is narrower than a frame (256), so the two masks keep
different neighbourhoods and the right one is measurably closer to dense.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import HeadProfile, SVGMask, TemporalMask, VideoGeometry, profile_heads, reference_attention, structured_qkv
from svg_lib.layers.profiling import sample_rows

GEOMETRY = VideoGeometry(8, 16, 16)


@pytest.fixture(scope="module")
def mask():
    return SVGMask.spatial(GEOMETRY, 0.2)


@pytest.mark.parametrize("seed, kinds", [
    (0, ["spatial", "temporal", "spatial", "temporal"]),
    (1, ["temporal", "spatial", "spatial", "temporal"]),
    (2, ["temporal", "temporal", "spatial", "spatial"]),
])
def test_profiler_recovers_planted_heads(seed, kinds, mask):
    q, k, v = structured_qkv(GEOMETRY, kinds, 64, seed=seed)
    flags = profile_heads(q, k, v, mask, num_samples=64, seed=seed)
    np.testing.assert_array_equal(np.asarray(flags), np.array(kinds) == "temporal")


def test_profiler_on_random_inputs_returns_flags(mask):
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal((3, GEOMETRY.tokens, 64)), jnp.float32) for _ in range(3))
    flags = profile_heads(q, k, v, mask)
    assert flags.shape == (3,) and flags.dtype == jnp.bool_


def test_errors_and_rows_are_reported(mask):
    q, k, v = structured_qkv(GEOMETRY, ["spatial", "temporal"], 64, seed=4)
    prof = profile_heads(q, k, v, mask, num_samples=32, seed=5, return_errors=True)
    assert isinstance(prof, HeadProfile)
    np.testing.assert_array_equal(np.asarray(prof.is_temporal), np.asarray(prof.mse_temporal < prof.mse_spatial))
    np.testing.assert_array_equal(prof.rows, sample_rows(GEOMETRY.tokens, 32, 5))
    assert prof.rows.size == 32 and np.all(np.diff(prof.rows) > 0)
    assert not np.array_equal(prof.rows, sample_rows(GEOMETRY.tokens, 32, 6))


def test_errors_match_full_reference_when_every_row_is_sampled():
    g = VideoGeometry(4, 4, 8)  # 128 tokens: sample them all and compare with whole-matrix attention
    m = SVGMask.spatial(g, 0.3)
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.standard_normal((2, g.tokens, 32)), jnp.float32) for _ in range(3))
    prof = profile_heads(q, k, v, m, num_samples=10_000, return_errors=True)
    dense = reference_attention(q, k, v)
    for masked, mse in ((reference_attention(q, k, v, m), prof.mse_spatial),
                        (reference_attention(q, k, v, TemporalMask(m)), prof.mse_temporal)):
        np.testing.assert_allclose(mse, jnp.mean((masked - dense) ** 2, axis=(1, 2)), rtol=1e-4, atol=1e-9)


def test_bad_arguments(mask):
    q, k, v = structured_qkv(GEOMETRY, ["spatial"], 64)
    with pytest.raises(ValueError, match="num_samples"):
        profile_heads(q, k, v, mask, num_samples=0)
    with pytest.raises(TypeError, match="spatial SVGMask"):
        profile_heads(q, k, v, TemporalMask(mask))
