"""The forward's split form for megacore chips (v4, v5p): `block_sparse_attention(..., core_split=True)`.

The split grid `(2, heads, ceil(nq / 2), steps)` gives each TensorCore half of every head's query
tiles through one leading "parallel" axis. Checked here: it is exact against the float64 reference
and equal, bit for bit, to the default grid (same tiles, same order within each query tile), with odd
head counts, an odd number of query tiles (the second half's dummy row), and a query tile that keeps
nothing; it compiles for a v5p; and nothing picks it by default, because the compiler's static
profile finds the default grid already shared by both cores (svg_lib/data/megacore_split.json).
"""
import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from svg_lib import b3_mask
from svg_lib.core.planner import EMPTY, plan_tiles
from svg_lib.kernels.forward import block_sparse_attention
from svg_lib.kernels.reference import attention_float64
from svg_lib.kernels.tolerances import tolerance

from helpers import EMPTY_TILE_ROW, HOLEY, random_qkv

F32 = tolerance("float32")
DATA = Path(__file__).resolve().parents[1] / "svg_lib" / "data" / "megacore_split.json"


def _call(mask, method, heads, *, core_split, interpret=True, residuals=False, block=128):
    n = mask.tokens
    q, k, v = random_qkv(11, heads, n, 64, "float32")
    walked = mask if method in ("b1", "b2") else b3_mask(mask, block, block)
    plan = plan_tiles(walked, block, block)
    keep = mask.keep if method in ("b1", "b2") else (lambda qi, ki: ki < n)
    out = block_sparse_attention(q / math.sqrt(64), k, v, jnp.zeros((heads,), jnp.int32), jnp.asarray(plan.schedule),
                                 steps=plan.steps, stage=method, keep=keep, block_q=block, block_kv=block,
                                 block_kv_compute=block, interpret=interpret, residuals=residuals,
                                 core_split=core_split)
    return out, (q, k, v), walked, plan


HOLEY_ODD = HOLEY.__class__(600, 150)  # 5 query tiles of 128: uneven halves, rows that keep nothing
CASES = [(EMPTY_TILE_ROW, "b3"), (HOLEY, "b1"), (HOLEY, "b2"), (HOLEY, "b3"), (HOLEY_ODD, "b1"), (HOLEY_ODD, "b2"),
         (HOLEY_ODD, "b3")]


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("mask,method", CASES, ids=[f"{type(m).__name__}{m.tokens}-{s}" for m, s in CASES])
def test_split_form_is_exact_and_equals_the_default_grid(mask, method, heads):
    """EMPTY_TILE_ROW's predicate is a table (not computable in a kernel), so only b3, whose masked
    tiles mask key padding, walks it; the holey bands run b1 and b2 with their own predicate."""
    split, (q, k, v), walked, plan = _call(mask, method, heads, core_split=True)
    default, *_ = _call(mask, method, heads, core_split=False)
    np.testing.assert_array_equal(np.asarray(split), np.asarray(default))
    np.testing.assert_allclose(np.asarray(split, np.float64), attention_float64(q, k, v, walked.to_dense()), **F32)


def test_the_masks_cover_uneven_halves_and_an_empty_query_tile():
    """What the exactness test relies on: EMPTY_TILE_ROW has 5 query tiles (halves of 3 and 2, so the
    second core's last row is the dummy) and query tile 1, in the first half, visits no tile."""
    plan = plan_tiles(EMPTY_TILE_ROW, 128, 128)
    assert plan.step_class.shape[0] == 5
    assert (plan.step_class[1] == EMPTY).all() and (plan.step_class[[0, 2, 3, 4]] != EMPTY).any(axis=1).all()
    assert plan_tiles(HOLEY, 128, 128).step_class.shape[0] == 4


@pytest.mark.tpu_interpreter
def test_split_form_with_a_dummy_row_under_the_tpu_interpreter():
    """The interpreter that simulates a TPU's pipeline: the dummy row leaves the resident output
    block (query tile nq - 1, finished the step before) as it is, and the log-sum-exp rows too."""
    (split, lse), (q, k, v), walked, _ = _call(EMPTY_TILE_ROW, "b3", 3, core_split=True,
                                               interpret=pltpu.InterpretParams(), residuals=True)
    (default, lse0), *_ = _call(EMPTY_TILE_ROW, "b3", 3, core_split=False, interpret=True, residuals=True)
    np.testing.assert_allclose(np.asarray(split, np.float64), attention_float64(q, k, v, walked.to_dense()), **F32)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(lse0), rtol=1e-6)


def test_split_form_refuses_a_single_query_tile_and_bad_flags():
    with pytest.raises(ValueError, match="needs at least 2"):
        _call(EMPTY_TILE_ROW, "b3", 1, core_split=True, block=1024)  # 600 tokens: one query tile
    with pytest.raises(TypeError, match="core_split must be True or False"):
        _call(HOLEY, "b3", 1, core_split="yes")


def test_the_committed_measurement_says_the_default_grid_already_uses_both_cores():
    """The data the default rests on (tools/megacore-split.py): for 1, 2 and 3 heads on a v5p at each size
    the default grid's simulated cycles are within 3 % of the split form's and near half of one core
    running every step; with only the head axis parallel (the grid a split would have fixed), one
    head takes one core's whole time and three heads two thirds of it."""
    data = json.loads(DATA.read_text())
    assert data["target"] in ("v5p", "v4") and data["versions"]["libtpu"]
    rows = {(r["tokens"], r["heads"], r["form"]): r["cycles"] for r in data["rows"]}
    sizes = sorted({r["tokens"] for r in data["rows"]})
    assert len(sizes) >= 1 and min(sizes) >= 8192
    for tokens in sizes:
        for heads in (1, 2, 3):
            default, split, one_core = (rows[tokens, heads, form] for form in ("default", "split", "one_core"))
            assert abs(default / split - 1) < 0.03
            assert 0.45 < default / one_core < 0.55
        assert rows[tokens, 1, "heads_parallel"] / rows[tokens, 1, "one_core"] > 0.95
        assert 0.62 < rows[tokens, 3, "heads_parallel"] / rows[tokens, 3, "one_core"] < 0.72


def test_compile_split_form_for_a_megacore_v5p(tpu_compiler):
    """The split form compiles for a v5p (odd query tiles: the dummy row's selects and guard)."""
    n, heads, block = 1536, 3, 512
    plan = plan_tiles(b3_mask(HOLEY.__class__(n, 600), block, 256), block, 256)
    assert plan.step_class.shape[0] % 2 == 1

    def f(head_kind, schedule, q, k, v):
        return block_sparse_attention(q, k, v, head_kind, schedule, steps=plan.steps, stage="b3",
                                      keep=lambda qi, ki: ki < n, block_q=block, block_kv=256, block_kv_compute=256,
                                      interpret=False, core_split=True)

    args = tpu_compiler.shape_structs([((heads,), "int32"), (plan.schedule.shape, "int32")]
                                      + [((heads, n, 128), "bfloat16")] * 3, "v5p")
    compiled = tpu_compiler.compile_placed(f, args)
    assert "b3_block_sparse_attention" in compiled.as_text()
