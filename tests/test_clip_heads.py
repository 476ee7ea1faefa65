"""Heads built from the committed real clip (svg_lib.layers.clip_heads)."""
import numpy as np
import pytest

from svg_lib.core.geometry import VideoGeometry
from svg_lib.layers.clip_heads import clip_geometry, clip_qkv, load_clip, patch_features
from svg_lib.layers.synthetic import structured_qkv


@pytest.fixture(scope="module")
def frames():
    return load_clip()


@pytest.fixture(scope="module")
def small(frames):
    # 4 frames, a 32 x 48-pixel crop: 4 x 8 x 12 = 384 tokens, small enough for dense softmax
    crop = frames[:4, 32:64, 48:96]
    return crop, clip_qkv(crop, ["content", "mixed", "spatial", "temporal"], head_dim=32, seed=3)


def test_the_committed_clip_is_small_real_footage(frames):
    assert frames.dtype == np.uint8 and frames.shape == (8, 96, 160, 3)
    assert clip_geometry(frames) == VideoGeometry(8, 24, 40)  # 7,680 tokens
    # real pictures: varied within a frame, and the frames differ (things move)
    assert frames.std(axis=(1, 2, 3)).min() > 20
    assert np.abs(np.diff(frames.astype(np.int16), axis=0)).mean() > 2


def test_shapes_dtypes_and_determinism(small):
    crop, (q, k, v, geometry) = small
    assert geometry == VideoGeometry(4, 8, 12)
    for x in (q, k, v):
        assert x.shape == (4, 384, 32) and x.dtype == np.float32 and np.isfinite(np.asarray(x)).all()
    again = clip_qkv(crop, ["content", "mixed", "spatial", "temporal"], head_dim=32, seed=3)
    for a, b in zip((q, k, v), again[:3]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = clip_qkv(crop, ["content", "mixed", "spatial", "temporal"], head_dim=32, seed=4)
    assert not np.array_equal(np.asarray(q), np.asarray(other[0]))


def test_position_heads_are_structured_qkv_on_the_clip_grid(small):
    crop, (q, k, v, geometry) = small
    sq, sk, sv = structured_qkv(geometry, ["spatial", "temporal"], 32, seed=3)
    np.testing.assert_array_equal(np.asarray(q[2:]), np.asarray(sq))
    np.testing.assert_array_equal(np.asarray(k[2:]), np.asarray(sk))


def _softmax(q, k):
    s = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def test_content_heads_attend_to_look_alike_patches_position_heads_do_not(small):
    crop, (q, k, _, geometry) = small
    feats = patch_features(crop)
    dist = np.linalg.norm(feats[:, None] - feats[None], axis=-1)            # appearance distance
    f, r, c = np.unravel_index(np.arange(geometry.tokens), (geometry.frames, geometry.height, geometry.width))
    place = np.abs(r[:, None] - r[None]) + np.abs(c[:, None] - c[None])        # in-frame grid distance
    when = np.abs(f[:, None] - f[None])                                        # frames apart
    look, where, apart = ({h: (_softmax(q[h], k[h]) * d).sum(axis=1).mean() for h in range(4)}
                          for d in (dist, place, when))
    # content: mass on patches that look alike, whatever their place; position heads: by place, whatever the look
    assert look[0] < 0.6 * look[2] and look[0] < 0.6 * look[3] and look[0] < 0.3 * dist.mean()
    assert apart[2] < 0.5 * apart[0]      # spatial: its own frame
    assert where[3] < 0.5 * where[0]      # temporal: its own slot in other frames
    # mixed: look-alike *and* nearby
    assert look[1] < look[2] and where[1] < where[0]


def test_content_attention_follows_the_pictures_not_the_seed(small):
    # the same clip, another seed: the content head's attention lands on the same patches
    crop, (q, k, _, _) = small
    q2, k2, _, _ = clip_qkv(crop, ["content"], head_dim=32, seed=11)
    p1, p2 = _softmax(q[0], k[0]), _softmax(q2[0], k2[0])
    overlap = np.minimum(p1, p2).sum(axis=1).mean()                            # 1: the same distribution
    shuffled = np.minimum(p1, p2[np.random.default_rng(0).permutation(len(p2))]).sum(axis=1).mean()
    assert overlap > 0.4 and overlap > 3 * shuffled


def test_bad_input_says_what_would_work(frames, tmp_path):
    with pytest.raises(ValueError, match="heads_kinds"):
        clip_qkv(frames[:1, :8, :8], ["semantic"])
    with pytest.raises(ValueError, match="uint8 RGB"):
        clip_qkv(frames[:1, :8, :8].astype(np.float32), ["content"])
    with pytest.raises(ValueError, match="multiples of the 4-pixel patch"):
        clip_qkv(frames[:1, :6, :8], ["content"])
    with pytest.raises(ValueError, match="head_dim"):
        clip_qkv(frames[:1, :8, :8], ["content"], head_dim=7)
    with pytest.raises(FileNotFoundError, match="extract-clip"):
        load_clip(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", pictures=frames[:1])
    with pytest.raises(ValueError, match="'frames'"):
        load_clip(tmp_path / "other.npz")


# -- the case study's size: 21 x 45 x 80 patches of 16 x 16 pixels --------------------------------

def test_the_case_study_patches_are_small_and_give_the_case_study_geometry():
    from svg_lib.layers.clip_heads import CASE_PATCHES, load_case_patches

    assert CASE_PATCHES.stat().st_size < 5_000_000
    with np.load(CASE_PATCHES) as data:
        assert data["features"].dtype == np.float16 and data["features"].shape == (75_600, 18)
        assert data["frame_index"].tolist() == list(range(0, 81, 4))
    features, geometry = load_case_patches()
    assert geometry == VideoGeometry(21, 45, 80) and geometry.tokens == 75_600
    np.testing.assert_allclose(features.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(features.std(axis=0), 1, atol=1e-6)
    # real footage: neighbouring patches' colours alike more than random pairs', and the frames move
    grid = features.reshape(21, 45, 80, 18)
    rng = np.random.default_rng(0)
    a, b = (features[rng.integers(0, 75_600, 4096)] for _ in range(2))
    beside = np.linalg.norm(grid[:, :, 1:, :3] - grid[:, :, :-1, :3], axis=-1).mean()   # mean RGB
    assert beside < 0.3 * np.linalg.norm(a[:, :3] - b[:, :3], axis=-1).mean()
    assert np.linalg.norm(grid[1:] - grid[:-1], axis=-1).mean() > 0.2 * np.linalg.norm(a - b, axis=-1).mean()


def test_content_heads_at_the_case_study_size_attend_to_look_alike_patches():
    # sampled query rows only: [rows, 75,600] scores, never 75,600 x 75,600
    from svg_lib.layers.clip_heads import case_study_qkv, load_case_patches

    q, k, v, geometry = case_study_qkv(["content", "spatial"], head_dim=32, seed=0)
    assert geometry.tokens == 75_600 and q.shape == k.shape == v.shape == (2, 75_600, 32)
    features, _ = load_case_patches()
    rows = np.random.default_rng(1).choice(75_600, 48, replace=False)
    look = []
    for h in range(2):  # the appearance distance to the keys attended (the query itself left out), over the mean
        s = np.asarray(q[h], np.float64)[rows] @ np.asarray(k[h], np.float64).T / np.sqrt(32)
        s[np.arange(48), rows] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dist = np.linalg.norm(features[rows][:, None] - features[None], axis=-1)
        look.append((p * dist).sum(axis=1).mean() / dist.mean())
    assert look[0] < 0.75 and look[0] < 0.8 * look[1]     # measured: 0.65 (content) and 0.95 (spatial)
