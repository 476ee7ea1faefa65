"""Tests of Radial Attention's block mask (RadialMask): against a port of the reference, planned, run.

The fixture. `port_block_mask` below rebuilds the block mask the way the reference does it
(mit-han-lab/radial-attention, radial_attn/attn_mask.py, read at commit 72788d4: its
`gen_log_mask_shrinked` with the window rule of `get_window_width`, the every-n-th-frame rule of
`get_diagonal_split_mask` and the shrink of `shrinkMaskStrict`), rewritten here in NumPy: for each
frame pair it builds the *token-level* pattern, lays it at its offset in a zero-padded array,
shrinks it with the reference's float32 density tests and ORs it into a table of
`seq_blocks` x `seq_blocks`. `RadialMask` computes the same table by counting (no token-level
pattern), so the two are independent constructions of one rule.

The geometries are the ones the reference's scripts run (scripts/wan_t2v_inference.sh,
scripts/hunyuan_t2v_inference.sh): Wan 2.1 at 768 x 1280, 69 frames (18 latent frames of
48 x 80 tokens, decay 0.2, no text) and HunyuanVideo at 768 x 1280, 117 frames (30 latent frames of
48 x 80, decay 0.95, its 256 text tokens after the video), plus HunyuanVideo at 720 x 1280, 129 frames
(33 frames of 45 x 80 = 3,600 tokens), where frames start part-way into a block. At Wan 2.1's
720p 81 frames (21 x 3,600 = 75,600 tokens) the reference's table of floor(75,600 / 128) = 590
blocks is too small for its last frame's blocks (the port raises, as the reference's slice
assignment would): there it is compared with the reference's padded convention (its demo pads the
sequence to whole blocks), which RadialMask follows.
"""
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svg_lib import VideoGeometry, attention, b3_mask, reference_attention
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, plan_tiles
from svg_lib.extensions.radial import RadialMask

BLOCK = 128
F32 = np.float32


def port_window(i, j, frame_tokens, decay, model):
    """The band's half-width of a frame pair, as the reference's window rule gives it."""
    dist = abs(i - j)
    if dist <= 1:  # both models: own and neighbouring frames whole
        return frame_tokens
    length = 2 ** frame_tokens.bit_length() / 2 ** dist.bit_length() * decay
    return length if length >= BLOCK else BLOCK


def port_frame_on(i, j, frame_tokens):
    """The reference's every-n-th-frame rule: once the (undecayed) band is under a block, a pair is on
    only when its distance is a multiple of 128 / band."""
    dist = abs(i - j)
    length = 2 ** frame_tokens.bit_length() / 2 ** dist.bit_length()
    return length >= BLOCK or dist % int(BLOCK / length) == 0


def port_shrink(padded):
    """The reference's shrink of one padded frame-pair pattern: blocks from its top-left corner, as
    many as whole blocks fit its *rows*, judged in float32 (dense column: > 1/3 of the block's rows;
    kept block: > 0.6 of the live columns dense)."""
    m = padded.shape[0] // BLOCK
    cut = padded[:m * BLOCK, :m * BLOCK].reshape(m, BLOCK, m, BLOCK)
    col_density = cut.sum(axis=1).astype(F32) / F32(BLOCK)              # [m, m, BLOCK]
    live = (col_density > 0).sum(axis=-1)
    dense = (col_density > F32(1 / 3)).sum(axis=-1)
    frac = dense.astype(F32) / (live.astype(F32) + F32(1e-9))
    return frac > F32(0.6)


def port_block_mask(frames, frame_tokens, video_tokens, seq_blocks, model, decay, query_frames=None):
    """The reference's block table `[seq_blocks, seq_blocks]` (see the module docstring).

    `query_frames`: build only the frame pairs of these query frames (to keep a test short); the
    rows of blocks made only of those frames' tokens are then complete."""
    S = frame_tokens
    out = np.zeros((seq_blocks, seq_blocks), dtype=bool)
    border = video_tokens // BLOCK
    out[border:] = True
    out[:, border:] = True
    r = np.arange(S)
    m = -(-S // BLOCK)
    patterns = {}
    for i in (range(frames) if query_frames is None else query_frames):
        for j in range(frames):
            sink = model == "wan" and j == 0
            rem_r, rem_c = (i * S) % BLOCK, (j * S) % BLOCK
            key = (sink, port_window(i, j, S, decay, model), sink or port_frame_on(i, j, S), rem_r, rem_c)
            if key not in patterns:
                if sink:
                    local = np.ones((S, S), dtype=bool)
                else:
                    local = np.abs(r[None, :] - r[:, None]) <= key[1]
                    local &= key[2]
                padded = np.zeros((rem_r + m * BLOCK, rem_c + m * BLOCK), dtype=bool)
                padded[rem_r:rem_r + S, rem_c:rem_c + S] = local
                patterns[key] = port_shrink(padded)
            blocks = patterns[key]
            bi, bj = (i * S) // BLOCK, (j * S) // BLOCK
            if bi + blocks.shape[0] > seq_blocks or bj + blocks.shape[1] > seq_blocks:
                raise IndexError(f"frame pair ({i}, {j}) reaches block {max(bi, bj) + blocks.shape[0] - 1}, past "
                                 f"the table's {seq_blocks} (the reference fails here on a shape mismatch)")
            out[bi:bi + blocks.shape[0], bj:bj + blocks.shape[1]] |= blocks
    return out


# -- equal to the reference's table --------------------------------------------------------------

SCRIPT_GEOMETRIES = {  # (geometry, model, decay): the reference's own scripts (see the module docstring)
    "wan21_768p_69f": (VideoGeometry(18, 48, 80), "wan", 0.2),
    "hunyuan_768p_117f": (VideoGeometry(30, 48, 80, text_tokens=256), "hunyuan", 0.95),
}


@pytest.mark.parametrize("name", list(SCRIPT_GEOMETRIES))
def test_equals_the_reference_table_at_its_script_geometries(name):
    g, model, decay = SCRIPT_GEOMETRIES[name]
    expect = port_block_mask(g.frames, g.frame_tokens, g.video_tokens, g.tokens // BLOCK, model, decay)
    mask = RadialMask(g, model, decay)
    defined = g.tokens // BLOCK
    np.testing.assert_array_equal(mask.kept[:defined, :defined], expect)
    assert mask.kept[defined:].all() and mask.kept[:, defined:].all()  # the text's last partial block
    assert 0.2 < mask.pair_density < 0.4  # sparse, and not trivially so


def test_equals_the_reference_where_frames_start_inside_a_block():
    # HunyuanVideo 720p: 3,600 tokens a frame, so frame i starts 16 i mod 128 tokens into a block.
    # Four query frames (two pairs of neighbours, at the start and the end) against every key frame.
    g, model, decay = VideoGeometry(33, 45, 80, text_tokens=256), "hunyuan", 0.95
    S, seq_blocks = g.frame_tokens, g.tokens // BLOCK
    frames = [0, 1, 31, 32]
    expect = port_block_mask(g.frames, S, g.video_tokens, seq_blocks, model, decay, query_frames=frames)
    kept = RadialMask(g, model, decay).kept
    for first in (0, 31):  # block rows made only of tokens of frames first and first + 1
        rows = slice(-(-first * S // BLOCK), (first + 2) * S // BLOCK)
        np.testing.assert_array_equal(kept[rows, :seq_blocks], expect[rows])
    assert (kept[:seq_blocks, :seq_blocks] != RadialMask(g, "wan", decay).kept[:seq_blocks, :seq_blocks]).any()


def test_wan21_720p_follows_the_reference_padded_to_whole_blocks():
    g = VideoGeometry(21, 45, 80)  # the case study's 75,600 tokens
    with pytest.raises(IndexError, match="past the table"):
        port_block_mask(g.frames, g.frame_tokens, g.video_tokens, g.tokens // BLOCK, "wan", 1.0, query_frames=[20])
    S, padded_blocks = g.frame_tokens, -(-g.tokens // BLOCK)
    expect = port_block_mask(g.frames, S, g.video_tokens, padded_blocks, "wan", 1.0, query_frames=[0, 1, 19, 20])
    kept = RadialMask(g, "wan", 1.0).kept
    for first in (0, 19):  # block rows made only of tokens of frames first and first + 1 (and the padded end)
        rows = slice(-(-first * S // BLOCK), padded_blocks if first == 19 else (first + 2) * S // BLOCK)
        np.testing.assert_array_equal(kept[rows], expect[rows])
    assert kept[-1].all() and kept[:, -1].all()  # the block holding the video's end, whole (the padded rule)


@st.composite
def small_geometry(draw):
    frames = draw(st.integers(1, 12))
    height, width = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    text = draw(st.sampled_from([0, 0, 7, 130]))
    return (VideoGeometry(frames, height, width, text_tokens=text), draw(st.sampled_from(["wan", "hunyuan"])),
            draw(st.sampled_from([0.2, 0.5, 0.95, 1.0, 3.0])))


@given(small_geometry())
@settings(max_examples=60, deadline=None, database=None)
def test_equals_the_reference_padded_on_small_adversarial_geometries(case):
    # frames smaller than a block (several frame pairs OR-ed into one block), frames that straddle
    # blocks, text or none: the padded convention everywhere
    g, model, decay = case
    expect = port_block_mask(g.frames, g.frame_tokens, g.video_tokens, -(-g.tokens // BLOCK), model, decay)
    np.testing.assert_array_equal(RadialMask(g, model, decay).kept, expect)


def test_window_shrinks_with_frame_distance():
    # the band each query frame keeps of a key frame narrows as the frames part (no sink: hunyuan)
    g = VideoGeometry(16, 32, 64)  # 2,048 tokens a frame: 16 blocks
    mask = RadialMask(g, "hunyuan", 1.0)
    m = g.frame_tokens // BLOCK
    per_distance = [int(mask.kept[:m, d * m:(d + 1) * m].sum()) for d in range(g.frames)]
    assert per_distance[0] == per_distance[1] == m * m
    assert per_distance[2] > per_distance[4] > per_distance[8] > 0
    assert per_distance == sorted(per_distance, reverse=True)


def test_bad_arguments_raise():
    g = VideoGeometry(3, 8, 16)
    with pytest.raises(ValueError, match="model must be one of"):
        RadialMask(g, "mochi")
    with pytest.raises(ValueError, match="decay_factor must be a positive number"):
        RadialMask(g, "wan", 0)
    with pytest.raises(TypeError, match="VideoGeometry"):
        RadialMask((3, 8, 16))


# -- planned and run ------------------------------------------------------------------------------

SMALL = (VideoGeometry(9, 12, 20, text_tokens=5), "wan", 0.5)  # 2,165 tokens: 17 blocks, the last short


def test_plans_as_whole_tiles_and_only_padded_keys_mask():
    g, model, decay = SMALL
    mask = RadialMask(g, model, decay)
    plan = plan_tiles(mask, BLOCK, BLOCK)
    assert set(np.unique(plan.classes)) <= {EMPTY, FULL, PARTIAL}
    partial = plan.classes == PARTIAL
    assert partial[:, :-1].sum() == 0 and partial[:, -1].any()  # only the last key tile (padded keys)
    assert ((plan.classes != EMPTY) == mask.kept).all()
    counts = mask.pair_counts(np.arange(0, 18 * BLOCK, BLOCK), np.arange(0, 18 * BLOCK, BLOCK))
    dense = mask.to_dense()
    assert counts.sum() == dense.sum() == mask.pair_count


@pytest.mark.parametrize("blocks", [(128, 128), (256, 128)])
def test_b3_runs_exact_against_masked_attention(blocks):
    g, model, decay = SMALL
    mask = RadialMask(g, model, decay)
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.standard_normal((2, g.tokens, 64)), jnp.float32) for _ in range(3))
    out = attention(q, k, v, mask, method="b3", block_q=blocks[0], block_kv=blocks[1], interpret=True)
    computed = b3_mask(mask, *blocks)
    assert (computed is mask) == (blocks == (128, 128))  # at 128 x 128 B3 runs the table as it is
    expect = reference_attention(q, k, v, computed)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expect), rtol=1e-5, atol=1e-5)


def test_b3_compiles_for_tpu_on_a_radial_mask(tpu_compiler):
    from svg_lib import build_attention

    g, model, decay = SMALL
    mask = RadialMask(g, model, decay)
    for chip in ("v5e", "v6e"):
        fn = build_attention(mask, method="b3", heads=2, tokens=mask.tokens, head_dim=128, dtype=jnp.bfloat16,
                             block_q=BLOCK, block_kv=BLOCK, interpret=False, generation=chip)
        compiled, _ = tpu_compiler.compile_fn(fn, [((2, mask.tokens, 128), "bfloat16")] * 3, chip)
        assert compiled.memory_analysis().argument_size_in_bytes == 3 * 2 * mask.tokens * 128 * 2
