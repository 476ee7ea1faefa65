"""Tests of svg_lib.core.geometry: token counts and the temporal-major permutation.

The expected permutations are rebuilt here from the brief's formulas with plain
Python loops, so a slip in the vectorised library code cannot hide behind itself.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svg_lib.core.geometry import VideoGeometry, inverse_temporal_major_permutation, temporal_major_permutation
from svg_lib.extensions.tile_layout import (TileLayout, from_tile_major, inverse_tile_major_permutation,
                                            tile_major_permutation, to_tile_major)
from svg_lib.extensions.token_order import to_frame_major, to_temporal_major

# database=None: keep hypothesis from writing a .hypothesis folder into the repository
FAST = settings(max_examples=40, deadline=None, database=None)

geometries = st.builds(VideoGeometry, frames=st.integers(1, 9), height=st.integers(1, 7),
                       width=st.integers(1, 7), text_tokens=st.integers(0, 20))


# -- token arithmetic ---------------------------------------------------------------------

@given(geometries)
@FAST
def test_token_counts(g):
    assert g.frame_tokens == g.height * g.width
    assert g.video_tokens == g.frames * g.height * g.width
    assert g.tokens == g.frames * g.height * g.width + g.text_tokens


def test_wan_720p_geometry_matches_the_brief():
    g = VideoGeometry(21, 45, 80)
    assert (g.frame_tokens, g.video_tokens, g.tokens) == (3600, 75_600, 75_600)
    assert "75,600" in str(g)


def test_text_tokens_are_counted_and_shown():
    g = VideoGeometry(3, 2, 5, text_tokens=7)
    assert g.tokens == 37
    assert "7 text" in str(g)


# -- the permutation against the brief's formulas -------------------------------------------

def brief_permutation(g):
    """New position j holds old token (j mod F)*S + j//F; text tokens stay in place."""
    F, S = g.frames, g.frame_tokens
    return [(j % F) * S + j // F if j < F * S else j for j in range(g.tokens)]


def brief_inverse(g):
    """Old token i goes to position (i mod S)*F + i//S; text tokens stay in place."""
    F, S = g.frames, g.frame_tokens
    return [(i % S) * F + i // S if i < F * S else i for i in range(g.tokens)]


@given(geometries)
@FAST
def test_permutations_follow_the_brief(g):
    perm = temporal_major_permutation(g)
    inv = inverse_temporal_major_permutation(g)
    assert perm.dtype == np.int64 and inv.dtype == np.int64
    assert perm.shape == inv.shape == (g.tokens,)
    assert perm.tolist() == brief_permutation(g)
    assert inv.tolist() == brief_inverse(g)


@given(geometries)
@FAST
def test_permutation_and_inverse_are_inverse_both_ways(g):
    perm = temporal_major_permutation(g)
    inv = inverse_temporal_major_permutation(g)
    identity = np.arange(g.tokens)
    assert sorted(perm.tolist()) == identity.tolist()  # a permutation at all
    np.testing.assert_array_equal(perm[inv], identity)
    np.testing.assert_array_equal(inv[perm], identity)


@given(geometries)
@FAST
def test_text_tokens_stay_in_place(g):
    v = g.video_tokens
    tail = np.arange(v, g.tokens)
    np.testing.assert_array_equal(temporal_major_permutation(g)[v:], tail)
    np.testing.assert_array_equal(inverse_temporal_major_permutation(g)[v:], tail)
    # and no video token is sent into the text range
    assert temporal_major_permutation(g)[:v].max() < v


@given(geometries)
@FAST
def test_same_slot_in_consecutive_frames_becomes_adjacent(g):
    F, S = g.frames, g.frame_tokens
    inv = inverse_temporal_major_permutation(g)  # where each frame-major token lands
    for s in range(S):
        landed = [int(inv[f * S + s]) for f in range(F)]
        # the F copies of slot s occupy one contiguous run, in frame order
        assert landed == list(range(landed[0], landed[0] + F))
        assert landed[0] == s * F


# -- moving arrays between the two orders --------------------------------------------------

def tagged_tokens(g, heads=2, dim=3):
    """[heads, tokens, dim] float array whose entries name (head, token, channel) uniquely."""
    h, t, d = np.meshgrid(np.arange(heads), np.arange(g.tokens), np.arange(dim), indexing="ij")
    return (h * 1_000_000 + t * 10 + d).astype(np.float64)


@given(geometries, st.integers(1, 3), st.integers(1, 4))
@FAST
def test_round_trip_numpy(g, heads, dim):
    x = tagged_tokens(g, heads, dim)
    t = to_temporal_major(x, g)
    assert t.shape == x.shape
    np.testing.assert_array_equal(to_frame_major(t, g), x)
    np.testing.assert_array_equal(to_temporal_major(to_frame_major(x, g), g), x)
    # position j of the temporal-major array holds the brief's token
    np.testing.assert_array_equal(t, x[:, brief_permutation(g)])


@given(geometries)
@settings(max_examples=10, deadline=None, database=None)
def test_round_trip_jax(g):
    x_np = tagged_tokens(g, 2, 4).astype(np.float32)
    x = jnp.asarray(x_np)
    t = to_temporal_major(x, g)
    assert isinstance(t, type(x))
    np.testing.assert_array_equal(np.asarray(t), x_np[:, brief_permutation(g)])
    np.testing.assert_array_equal(np.asarray(to_frame_major(t, g)), x_np)
    np.testing.assert_array_equal(np.asarray(to_temporal_major(to_frame_major(x, g), g)), x_np)


@pytest.mark.parametrize("axis", [0, 1, -3])
def test_any_token_axis(axis):
    g = VideoGeometry(3, 2, 5, text_tokens=4)
    shape = [2, 3, 4]
    shape[axis] = g.tokens
    x = np.arange(np.prod(shape)).reshape(shape)
    perm = temporal_major_permutation(g)
    np.testing.assert_array_equal(to_temporal_major(x, g, axis=axis), x.take(perm, axis=axis))
    np.testing.assert_array_equal(to_frame_major(to_temporal_major(x, g, axis=axis), g, axis=axis), x)


@pytest.mark.parametrize("move", [to_temporal_major, to_frame_major])
def test_the_permutation_compiles_to_no_gather(move):
    """A reshape and a transpose, not a gather: the lowered program holds neither a gather nor
    the permutation as a constant index table (checked in the StableHLO jax emits)."""
    g = VideoGeometry(21, 4, 6, text_tokens=8)
    text = jax.jit(lambda x: move(x, g)).lower(jax.ShapeDtypeStruct((2, g.tokens, 128), jnp.bfloat16)).as_text()
    assert not re.search(r"stablehlo\.(dynamic_)?gather", text) and "stablehlo.transpose" in text


def test_temporal_major_rows_walk_frames_of_one_slot():
    g = VideoGeometry(4, 2, 3, text_tokens=2)  # S = 6
    F, S = g.frames, g.frame_tokens
    # one row per token carrying (frame, slot); text rows carry (-1, -1)
    idx = np.arange(g.tokens)
    frame = np.where(idx < g.video_tokens, idx // S, -1)
    slot = np.where(idx < g.video_tokens, idx % S, -1)
    x = np.stack([frame, slot], axis=-1)[None]  # [1, tokens, 2]
    t = to_temporal_major(x, g)[0]
    for j in range(g.video_tokens):
        assert tuple(t[j]) == (j % F, j // F)
    np.testing.assert_array_equal(t[g.video_tokens:], -1)


# -- bad input --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(frames=0, height=4, width=4), "frames"),
    (dict(frames=-2, height=4, width=4), "frames"),
    (dict(frames=3, height=0, width=4), "height"),
    (dict(frames=3, height=4, width=-1), "width"),
    (dict(frames=2.0, height=4, width=4), "frames"),
    (dict(frames=3, height=4, width=4, text_tokens=-1), "text_tokens"),
    (dict(frames=3, height=4, width=4, text_tokens=1.5), "text_tokens"),
])
def test_bad_geometry_raises_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        VideoGeometry(**kwargs)
    assert "integer" in str(err.value)


def test_bool_is_not_a_frame_count():
    # True is an int to Python, but VideoGeometry(True, ...) is a mistake, not one frame;
    # check_block_size already refuses booleans for the same reason.
    with pytest.raises(ValueError, match="frames"):
        VideoGeometry(True, 4, 4)


def test_numpy_integers_are_accepted():
    g = VideoGeometry(np.int64(2), np.int32(3), 4, text_tokens=np.int64(1))
    assert g.tokens == 25


@pytest.mark.parametrize("convert", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
@pytest.mark.parametrize("move", [to_temporal_major, to_frame_major])
def test_wrong_token_count_raises(convert, move):
    g = VideoGeometry(2, 3, 4)  # 24 tokens
    x = convert(np.zeros((2, 25, 8), np.float32))
    with pytest.raises(ValueError) as err:
        move(x, g)
    message = str(err.value)
    assert "25" in message and "24" in message and "tokens" in message


@pytest.mark.parametrize("move", [to_temporal_major, to_frame_major])
def test_one_dimensional_input_raises(move):
    g = VideoGeometry(2, 3, 4)
    with pytest.raises(ValueError, match=r"\[heads, tokens, head_dim\]"):
        move(np.zeros(g.tokens), g)


# -- 3-D tiles: tile-major order ------------------------------------------------------------

tiles = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))


def brief_tile_major(g, tile):
    """Tile-major order by plain loops: cubes in raster order, raster order inside; None = padding."""
    tt, th, tw = tile
    out = []
    for ct in range(-(-g.frames // tt)):
        for ch in range(-(-g.height // th)):
            for cw in range(-(-g.width // tw)):
                for f in range(ct * tt, ct * tt + tt):
                    for r in range(ch * th, ch * th + th):
                        for c in range(cw * tw, cw * tw + tw):
                            real = f < g.frames and r < g.height and c < g.width
                            out.append((f * g.height + r) * g.width + c if real else None)
    return out + list(range(g.video_tokens, g.tokens))


@given(geometries, tiles)
@FAST
def test_tile_major_permutation_follows_the_loops(g, tile):
    layout = TileLayout(g, tile)
    expect = brief_tile_major(g, tile)
    perm = tile_major_permutation(g, tile)
    assert perm.dtype == np.int64 and perm.shape == (layout.tokens,) == (len(expect),)
    assert perm.tolist() == [g.tokens if e is None else e for e in expect]  # padding reads the zero row
    assert layout.padding_tokens == expect.count(None) == layout.video_tokens - g.video_tokens
    assert layout.padding_overhead == pytest.approx(expect.count(None) / g.video_tokens)
    inv = inverse_tile_major_permutation(g, tile)
    np.testing.assert_array_equal(perm[inv], np.arange(g.tokens))  # every real token, once


@given(geometries, tiles, st.integers(1, 3), st.integers(1, 4))
@FAST
def test_tile_major_round_trip_and_zero_padding(g, tile, heads, dim):
    x = np.random.default_rng(0).standard_normal((heads, g.tokens, dim)) + 5.0  # never zero
    y = to_tile_major(x, g, tile)
    layout = TileLayout(g, tile)
    assert y.shape == (heads, layout.tokens, dim)
    padding = (y == 0).all(axis=(0, 2))
    assert padding.sum() == layout.padding_tokens
    np.testing.assert_array_equal(from_tile_major(y, g, tile), x)


def test_tile_major_on_jax_arrays_and_a_cube_is_contiguous():
    g, tile = VideoGeometry(5, 6, 7, text_tokens=3), (2, 3, 4)
    x = jnp.arange(g.tokens * 2, dtype=jnp.float32).reshape(1, g.tokens, 2) + 1
    y = to_tile_major(x, g, tile)
    np.testing.assert_array_equal(np.asarray(from_tile_major(y, g, tile)), np.asarray(x))
    # the first cube's 24 positions are frames 0-1, rows 0-2, cols 0-3 of the video, in raster order
    first = np.asarray(y[0, :24, 0]).astype(int) - 1
    frame, rest = np.divmod(first // 2, g.frame_tokens)
    row, col = np.divmod(rest, g.width)
    assert set(frame) == {0, 1} and set(row) == {0, 1, 2} and set(col) == {0, 1, 2, 3}


def test_blog_layout_padding():
    layout = TileLayout(VideoGeometry(21, 45, 80), (3, 8, 16))
    assert layout.cubes == (7, 6, 5) and layout.cube_tokens == 384
    assert layout.padding_tokens == 7 * 6 * 5 * 384 - 75_600 == 5_040


@pytest.mark.parametrize("tile", [(2, 2), (0, 2, 2), (1.5, 2, 2), (True, 2, 2), "222"])
def test_bad_tile_raises(tile):
    with pytest.raises(ValueError, match="tile must be 3 positive integers"):
        TileLayout(VideoGeometry(2, 2, 2), tile)


def test_from_tile_major_checks_the_token_count():
    g = VideoGeometry(2, 3, 3)
    with pytest.raises(ValueError, match="tile-major tokens"):
        from_tile_major(np.zeros((1, g.tokens, 2)), g, (2, 2, 2))
