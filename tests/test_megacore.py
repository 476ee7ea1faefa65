"""Megacore chips (v4, v5p: two TensorCores joined as one jax device): what the compiler's static profile
of a v5p found, and the backward form `backward=None` picks there.

The forward needs nothing of its own: a megacore shares the steps of all "parallel" grid axes, and the
forward's heads and query tiles are both parallel (svg_lib/data/megacore_split.json). The fused backward
has only its head axis parallel, so with one head one core idles; the split backward keeps both busy
and is faster there, but not at 2, 3 or 5 heads (svg_lib/data/megacore_backward.json), so None picks it
for one head only (`runtime.split_backward_is_faster`). Both forms give the same gradients.
"""
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib.attention import build_attention
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.memory.budget import check_memory
from svg_lib.runtime import MEGACORE_SPLIT_PER_HEAD, split_backward_is_faster

from helpers import random_qkv
from test_backward import _kernel_name, _pallas_calls

DATA = Path(__file__).resolve().parents[1] / "svg_lib" / "data"
MASK = SVGMask.spatial(VideoGeometry(3, 7, 15), 0.35)  # 315 tokens: padding in both directions
BLOCKS = dict(block_q=128, block_kv=256, block_kv_compute=128)


def test_the_committed_measurement_says_the_forward_grid_already_uses_both_cores():
    """The forward's default grid (heads and query tiles parallel) runs 1, 2 and 3 heads near half of one
    core's cycles on a v5p; with only the head axis parallel, one head takes one core's whole time and
    three heads two thirds of it (tools/megacore-split.py)."""
    data = json.loads((DATA / "megacore_split.json").read_text())
    assert data["target"] in ("v5p", "v4") and data["versions"]["libtpu"]
    rows = {(r["tokens"], r["heads"], r["form"]): r["cycles"] for r in data["rows"]}
    sizes = sorted({r["tokens"] for r in data["rows"]})
    assert len(sizes) >= 1 and min(sizes) >= 8192
    for tokens in sizes:
        for heads in (1, 2, 3):
            assert 0.45 < rows[tokens, heads, "default"] / rows[tokens, heads, "one_core"] < 0.55
        assert rows[tokens, 1, "heads_parallel"] / rows[tokens, 1, "one_core"] > 0.95
        assert 0.62 < rows[tokens, 3, "heads_parallel"] / rows[tokens, 3, "one_core"] < 0.72


def test_the_committed_backward_measurement_grounds_the_rule():
    """tools/megacore-backward.py on a v5p: the rule's constant is the measured split / fused ratio at one
    head (rounded up by less than 0.01), and at every measured size and head count the rule names the
    form with fewer simulated cycles."""
    data = json.loads((DATA / "megacore_backward.json").read_text())
    assert data["target"] in ("v5p", "v4") and data["versions"]["libtpu"]
    rows = {(r["tokens"], r["heads"], r["form"]): r for r in data["rows"]}
    sizes = sorted({r["tokens"] for r in data["rows"]})
    assert min(sizes) >= 8192 and {1, 2, 3} <= {r["heads"] for r in data["rows"]}
    one_head = [rows[t, 1, "split"]["cycles"] / rows[t, 1, "fused"]["cycles"] for t in sizes]
    assert 0 <= MEGACORE_SPLIT_PER_HEAD - max(one_head) < 0.01, one_head
    for (tokens, heads, form), row in rows.items():
        if form != "split":
            continue
        assert sum(row["kernels"].values()) == row["cycles"] and set(row["kernels"]) == {"attention_dq", "attention_dkv"}
        split_faster = row["cycles"] < rows[tokens, heads, "fused"]["cycles"]
        assert split_faster == split_backward_is_faster(heads, data["target"]), (tokens, heads)
    # the fused kernel's heads split between the cores: 2 heads cost what 1 does, 3 what about 2 do
    for tokens in sizes:
        fused = [rows[tokens, h, "fused"]["cycles"] for h in (1, 2, 3)]
        assert abs(fused[1] / fused[0] - 1) < 0.05 and abs(fused[2] / fused[0] - 2) < 0.1, fused


@pytest.mark.parametrize("generation", ["v5p", "v4"])
def test_megacore_chips_take_the_split_backward_for_one_head_only(generation):
    assert split_backward_is_faster(1, generation)
    for heads in (2, 3, 4, 5, 8):
        assert not split_backward_is_faster(heads, generation), heads


@pytest.mark.parametrize("generation", ["v5e", "v6e"])
def test_other_chips_keep_the_fused_backward(generation):
    assert not any(split_backward_is_faster(heads, generation) for heads in (1, 2, 3, 5))


def test_the_budget_picks_the_form_by_chip_and_heads():
    """check_memory's choice where the fused kernel fits: split for one head on a v5p or v4, fused for two
    or three heads there and for any on a v6e; a form asked for is kept."""
    plan_args = dict(head_dim=128, dtype=jnp.bfloat16, block_q=512, block_kv=256, q_len=16384,
                     tables=_tables(16384))
    form = lambda heads, generation, backward=None: check_memory(  # noqa: E731
        "b3", heads=heads, generation=generation, backward=backward, **plan_args).backward_form
    assert form(1, "v5p") == "split" and form(1, "v4") == "split"
    assert form(2, "v5p") == form(3, "v5p") == form(3, "v4") == "fused"
    assert form(1, "v6e") == form(3, "v6e") == form(1, "v5e") == "fused"
    assert form(1, "v5p", "fused") == "fused" and form(2, "v5p", "split") == "split"


def _tables(tokens):
    """Kernel tables of a B3 band plan at 512 x 256 (only their shapes matter to check_memory)."""
    from svg_lib.core.planner import KernelTables
    nq, nk, steps, steps_t = tokens // 512, tokens // 256, 8, 5
    return KernelTables((nq, nk), np.zeros(math.ceil(nq * steps / 2), np.int32), steps,
                        np.zeros(math.ceil(nk * steps_t / 2), np.int32), steps_t)


def _grad_of(generation, heads, backward=None):
    f = build_attention(MASK, method="b3", heads=heads, tokens=MASK.tokens, head_dim=128, dtype=jnp.float32,
                        interpret=True, generation=generation, backward=backward, **BLOCKS)
    return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * jnp.cos(f(q, k, v))), argnums=(0, 1, 2))


@pytest.mark.parametrize("generation, heads, want", [("v5p", 1, "split"), ("v5p", 3, "fused"), ("v4", 1, "split"),
                                                     ("v6e", 1, "fused")])
def test_a_gradient_runs_the_chosen_kernels(generation, heads, want):
    q, k, v = random_qkv(3, heads, MASK.tokens, 128, "float32")
    names = {_kernel_name(c) for c in _pallas_calls(jax.make_jaxpr(_grad_of(generation, heads))(q, k, v).jaxpr)}
    backward = {n for n in names if "bwd" in n or "attention_d" in n}
    assert backward == ({"b3_attention_fused_bwd"} if want == "fused" else {"b3_attention_dq", "b3_attention_dkv"})


def test_both_backward_forms_give_the_same_gradients():
    """What None picks on a v5p with one head (split) against the fused form, under the interpreter: the
    same gradients, bit for bit (each sums a tile's terms in the same order; test_backward checks both
    forms against float64)."""
    q, k, v = random_qkv(5, 1, MASK.tokens, 128, "float32")
    split = _grad_of("v5p", 1)(q, k, v)
    fused = _grad_of("v5p", 1, "fused")(q, k, v)
    for name, a, b in zip(("dq", "dk", "dv"), split, fused):
        assert np.isfinite(np.asarray(a)).all() and np.abs(np.asarray(a)).max() > 0, name
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
