"""Looking inside kernels: source excerpts, and the per-pair primitives of each traced tile body."""
import jax
import jax.numpy as jnp
import pytest

from svg_lib import get_preset
from svg_lib.kernels import forward as kernels
from svg_lib.teaching.inspection import TileBody, source_lines, tile_bodies, tile_body_table

COMPARES = {"lt", "le", "gt", "ge", "eq", "ne"}


@pytest.fixture(scope="module")
def mask():
    # the tiny preset's 384 tokens in 256 x 256 tiles: the keys are padded to 512, so the dense
    # kernel's last key tile masks padding
    return get_preset("tiny").mask()


@pytest.fixture(scope="module")
def bodies(mask):
    return {method: tile_bodies(mask, method) for method in ("dense", "b1", "b2")}


def test_source_lines_cut_from_first_to_last_match():
    text = source_lines(kernels.init_state, "m_ref[...]", "l_ref[...]")
    lines = text.splitlines()
    assert len(lines) == 2 and "MASK_VALUE" in lines[0] and lines[1].strip().startswith("l_ref[...] =")
    # the end is searched from the start line on, so a one-line excerpt is possible
    assert source_lines(kernels.init_state, "acc_ref[...]", "acc_ref").count("\n") == 0


def test_source_lines_name_what_was_not_found():
    with pytest.raises(ValueError, match="init_state contains 'no such line'"):
        source_lines(kernels.init_state, "no such line", "l_ref")
    with pytest.raises(ValueError, match="at or after 'acc_ref"):
        source_lines(kernels.init_state, "acc_ref[...]", "m_ref")


def by_kind(kernel_bodies):
    """{(masked, running): body} of one kernel's bodies, each kind present once."""
    out = {(b.masked, b.running): b for b in kernel_bodies}
    assert len(out) == len(kernel_bodies), "two bodies of one kind"
    return out


def test_b1_has_one_masked_body_b2_adds_a_mask_free_one(bodies):
    # every kind of tile comes twice: with the running max (until a query tile passes the
    # bound's test) and with the bounded max (every step after)
    b1, b2 = by_kind(bodies["b1"]), by_kind(bodies["b2"])
    assert set(b1) == {(True, True), (True, False)}
    assert set(b2) == {(False, True), (False, False), (True, True), (True, False)}
    for running in (True, False):
        free, masked = b2[False, running], b2[True, running]
        assert masked == b1[True, running]                # B2's masked tiles run B1's body
        assert free.matmuls == masked.matmuls == 2        # the same two matmuls either way
        assert not COMPARES & set(free.ops)               # the mask-free body compares nothing
        assert len(masked.elementwise) > len(free.elementwise)
    bounded, running = b2[False, False], b2[False, True]
    assert "reduce_max" not in bounded.ops and set(bounded.ops) < set(running.ops)


def test_masked_body_holds_the_predicates_tile_wide_work(mask, bodies):
    # Independently: trace the predicate alone on a column of query ids and a row of key ids, as
    # the tile body calls it, and keep the primitives whose result is a whole [256, 256] tile.
    col, row = jax.ShapeDtypeStruct((256, 1), jnp.int32), jax.ShapeDtypeStruct((1, 256), jnp.int32)
    predicate = jax.make_jaxpr(mask.kernel_predicate(256, 256))(col, row).jaxpr
    tile_wide = [e.primitive.name for e in predicate.eqns if e.outvars[0].aval.shape == (256, 256)]
    assert tile_wide and COMPARES & set(tile_wide)
    b1 = by_kind(bodies["b1"])[True, False]
    ops = iter(b1.ops)
    assert all(op in ops for op in tile_wide)             # a subsequence, in trace order


def test_dense_masks_padding_with_a_cheap_body(bodies):
    dense, b1 = by_kind(bodies["dense"]), by_kind(bodies["b1"])
    for running in (True, False):
        free, padding = dense[False, running], dense[True, running]
        assert not COMPARES & set(padding.ops)            # `k < tokens` is a compare on a key row only
        assert len(free.elementwise) < len(padding.elementwise) < len(b1[True, running].elementwise)


def test_key_chunks_of_128_are_refused(mask):
    with pytest.raises(ValueError, match="256 or more"):
        tile_bodies(mask, "b2", block_kv=128)


def test_table_has_a_line_per_body_within_its_width(bodies):
    text = tile_body_table({"b1": bodies["b1"], "b2": bodies["b2"]}, width=80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    labelled = sorted(tuple(line.split()[:3]) for line in lines[2:] if not line.startswith(" "))
    assert labelled == sorted([("b1", "masked", m) for m in ("running", "bounded")]
                              + [("b2", k, m) for k in ("mask-free", "masked") for m in ("running", "bounded")])


def test_tile_body_properties():
    body = TileBody(("dot_general", "le", "select_n", "exp", "dot_general"))
    assert body.masked and body.matmuls == 2 and body.elementwise == ("le", "select_n", "exp")
