"""Structured synthetic inputs and the quality metrics (svg_lib.synthetic)."""
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import (SVGMask, TemporalMask, VideoGeometry, attention_recall, quality_table, reference_attention,
                     relative_l2, structured_qkv)
from svg_lib.synthetic import computed_mask

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
