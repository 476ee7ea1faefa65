"""Structured synthetic inputs and the quality metrics (svg_lib.layers.synthetic)."""
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import (SVGMask, TemporalMask, VideoGeometry, attention_recall, quality_table, reference_attention,
                     relative_l2, structured_qkv)
from svg_lib.layers.synthetic import computed_mask

GEOMETRY = VideoGeometry(8, 16, 16)  # band at density 0.2 (128) is narrower than a frame (256)
ROWS = np.arange(0, GEOMETRY.tokens, 5)


def test_shapes_dtype_and_determinism():
    g = VideoGeometry(3, 4, 8, text_tokens=16)
    q, k, v = structured_qkv(g, ["spatial", "temporal", "spatial"], 32, seed=1, dtype=jnp.bfloat16)
    assert q.shape == k.shape == v.shape == (3, g.tokens, 32) and q.dtype == jnp.bfloat16
    again = structured_qkv(g, ["spatial", "temporal", "spatial"], 32, seed=1, dtype=jnp.bfloat16)
    other = structured_qkv(g, ["spatial", "temporal", "spatial"], 32, seed=2, dtype=jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(q, np.float32), np.asarray(again[0], np.float32))
    assert not np.array_equal(np.asarray(q, np.float32), np.asarray(other[0], np.float32))


@pytest.mark.parametrize("kinds", [["spatial"], ["temporal", "spatial", "temporal"]])
def test_recall_is_higher_inside_the_matching_mask(kinds):
    mask = SVGMask.spatial(GEOMETRY, 0.2)
    q, k, _ = structured_qkv(GEOMETRY, kinds, 64, seed=0)
    spatial = attention_recall(q, k, mask, ROWS)
    temporal = attention_recall(q, k, TemporalMask(mask), ROWS)
    for h, kind in enumerate(kinds):
        matching, other = (spatial[h], temporal[h]) if kind == "spatial" else (temporal[h], spatial[h])
        assert matching > other + 0.1, (kind, spatial[h], temporal[h])


def test_recall_is_one_for_a_mask_keeping_everything_and_low_for_random_heads():
    g = VideoGeometry(4, 8, 8)
    q, k, _ = structured_qkv(g, ["spatial", "temporal"], 32)
    full = SVGMask.spatial(g, 1.0)
    np.testing.assert_allclose(attention_recall(q, k, full, 40), 1.0, rtol=1e-6)
    rng = np.random.default_rng(0)
    qr, kr = (jnp.asarray(rng.standard_normal((1, g.tokens, 32)) * 0.01, jnp.float32) for _ in range(2))
    sparse = SVGMask.spatial(g, 0.3)
    # near-uniform attention: recall is about the share of keys the mask keeps in those rows
    rows = np.arange(g.tokens)
    kept = np.asarray(sparse.keep(rows[:, None], rows[None, :])).mean()
    assert attention_recall(qr, kr, sparse, rows)[0] == pytest.approx(kept, abs=0.01)


def test_relative_l2():
    x = np.random.default_rng(0).standard_normal((2, 5, 3))
    assert relative_l2(2 * x, x) == pytest.approx(1.0)
    assert relative_l2(x, x) == 0.0
    per_head = relative_l2(x + np.array([0.0, 1.0])[:, None, None] * x, x, per_head=True)
    np.testing.assert_allclose(per_head, [0.0, 1.0])
    with pytest.raises(ValueError, match="same shape"):
        relative_l2(x, x[:1])


def test_quality_table_rows():
    g = VideoGeometry(4, 8, 16)  # 512 tokens, 4 x 4 tiles of 128
    table = quality_table(g, [0.2, 0.5], block_q=128, block_kv=128, num_rows=64)
    assert len(table) == 2 * 2 * 2
    assert {(r["density"], r["method"], r["kind"]) for r in table} == {
        (d, m, kind) for d in (0.2, 0.5) for m in ("b2", "b3") for kind in ("spatial", "temporal")}
    row = {(r["density"], r["method"], r["kind"]): r for r in table}
    for kind in ("spatial", "temporal"):
        # the bands are nested, so a denser exact mask keeps at least as much mass and errs less
        assert row[0.5, "b2", kind]["recall"] >= row[0.2, "b2", kind]["recall"]
        assert row[0.5, "b2", kind]["rel_l2"] <= row[0.2, "b2", kind]["rel_l2"] + 1e-6
        for d in (0.2, 0.5):
            assert 0.0 < row[d, "b3", kind]["recall"] <= 1.0
    # rel_l2 of b2 is the error of the exact masked attention against dense (checked independently)
    q, k, v = structured_qkv(g, ["spatial", "temporal"], 64)
    mask = SVGMask.spatial(g, 0.2)
    dense = reference_attention(q, k, v)
    for h, kind in enumerate(("spatial", "temporal")):
        masked = reference_attention(q[h:h + 1], k[h:h + 1], v[h:h + 1], computed_mask(mask, kind, "b2", 128, 128))
        assert row[0.2, "b2", kind]["rel_l2"] == pytest.approx(relative_l2(masked[0], dense[h]), rel=1e-3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="heads_kinds"):
        structured_qkv(GEOMETRY, ["spatial", "diagonal"])
    with pytest.raises(ValueError, match="head_dim"):
        structured_qkv(GEOMETRY, ["spatial"], head_dim=63)
    with pytest.raises(ValueError, match="locality"):
        structured_qkv(GEOMETRY, ["spatial"], locality={"spatial": (1.0, 2.0)})


# -- the local3d head and the equal-budget comparison with sliding tiles ---------------------------

def test_local3d_attention_decays_with_distance_in_frames_rows_and_cols():
    g = GEOMETRY
    q, k, _ = structured_qkv(g, ["spatial", "local3d"], 64, seed=0)
    f0, r0, c0 = 4, 8, 8  # a token in the middle of the video
    i = (f0 * g.height + r0) * g.width + c0
    s = np.einsum("hd,hkd->hk", np.asarray(q[:, i], np.float64), np.asarray(k, np.float64)) / 8.0
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p = p.reshape(2, g.frames, g.height, g.width)
    local = p[1]
    for axis, centre in ((0, f0), (1, r0), (2, c0)):
        mass = local.sum(axis=tuple(a for a in range(3) if a != axis))  # marginal along that axis
        assert mass[centre] > mass[centre + 1] > mass[centre + 3], (axis, mass)
    # it spreads across frames much more than a spatial head, which stays in its own frame
    assert p[0, f0].sum() > 0.8 and local[f0].sum() < 0.6


@pytest.fixture(scope="module")
def budget_table():
    from svg_lib.layers.synthetic import equal_budget_table
    return equal_budget_table(GEOMETRY, (1, 8, 16), (3, 3, 1), num_rows=32)


def test_equal_budget_table_rows_and_budgets(budget_table):
    from svg_lib.extensions.sliding import SlidingTileMask
    budget = SlidingTileMask(GEOMETRY, (1, 8, 16), (3, 3, 1)).pair_density
    assert budget == pytest.approx(6 / 16)
    assert [(r["kind"], r["method"]) for r in budget_table] == [
        (kind, method) for kind in ("spatial", "temporal", "local3d") for method in ("b2", "b3", "sliding")]
    for row in budget_table:
        # the same budget up to the band's granularity: one 128-token step of the band moves
        # ~0.08 of the pairs at 2,048 tokens, so the closest band is within half of that (+ B3's rounding)
        assert abs(row["pair_density"] - budget) < 0.05
        assert 0.0 < row["recall"] <= 1.0 + 1e-9 and row["rel_l2"] >= 0.0


def test_sliding_tiles_suit_3d_local_heads_and_not_temporal_ones(budget_table):
    rows = {(r["kind"], r["method"]): r for r in budget_table}
    assert rows["local3d", "sliding"]["recall"] > rows["local3d", "b2"]["recall"] + 0.05
    assert rows["local3d", "sliding"]["rel_l2"] < rows["local3d", "b2"]["rel_l2"]
    assert rows["temporal", "b2"]["recall"] > rows["temporal", "sliding"]["recall"] + 0.2


def test_computed_mask_refuses_unknown_methods_and_kinds():
    mask = SVGMask.spatial(VideoGeometry(2, 8, 16), 0.35)
    with pytest.raises(ValueError, match=r"^unknown method 'b5'; valid: dense, splash_dense, splash, b1, b2, b3$"):
        computed_mask(mask, "spatial", "b5", 128, 128)
    with pytest.raises(ValueError, match=r"^unknown head kind 'local3d'; valid: spatial, temporal$"):
        computed_mask(mask, "local3d", "b2", 128, 128)  # was silently the temporal head's
