"""SMEM estimates of the schedule tables (svg_lib.memory.smem), checked against the TPU compiler.

The arithmetic tests run anywhere. Tests taking `tpu_compiler` compile for a v6e on this CPU
(libtpu, compile-only, nothing runs): the estimate must refuse exactly the schedules the
compiler refuses, and B2 / B3 at 1440p with the default 512 x 512 blocks must compile.
"""
import importlib
import re
import time

import jax.numpy as jnp
import pytest

from svg_lib.environment import installed_version

from svg_lib import SVGMask, VideoGeometry, build_attention, plan_tiles
from svg_lib.extensions.smem_forms import largest_fitting_steps, schedule_forms
from svg_lib.memory.smem import (FIXED_BYTES, FIXED_BYTES_BY_LIBTPU, KiB, VECTOR_WORDS, check_schedule_fits, estimate_smem,
                          fixed_bytes, schedule_smem, table_bytes)

WAN_1440P = VideoGeometry(21, 90, 160)  # 302,400 tokens


def test_padding_rule():
    assert table_bytes(()) == 4
    assert table_bytes((1,)) == table_bytes((128,)) == 512       # 1-D: whole 128-word rows
    assert table_bytes((129,)) == 1024
    assert table_bytes((591, 156)) == 592 * 256 * 4 == 606_208  # 2-D: (8, 128)-word tiles
    assert table_bytes((8, 128)) == 4096 and table_bytes((9, 129)) == 16 * 256 * 4
    with pytest.raises(ValueError, match="0-, 1- or 2-D"):
        table_bytes((2, 2, 2))


def test_fixed_overhead_is_the_installed_compilers():
    # fitted per libtpu release; a release we have not fitted gets the largest, the safe side
    assert fixed_bytes("0.0.42.1") == FIXED_BYTES_BY_LIBTPU["0.0.42"] == 3 * KiB
    assert fixed_bytes("0.0.21.1") == FIXED_BYTES_BY_LIBTPU["0.0.21"] > 3 * KiB
    assert fixed_bytes("0.0.30") == FIXED_BYTES == max(FIXED_BYTES_BY_LIBTPU.values())
    assert fixed_bytes("") == FIXED_BYTES  # no libtpu: interpret mode, the safe side


def test_schedule_estimate_counts_the_tables_the_kernel_gets():
    mask = SVGMask.spatial(VideoGeometry(21, 45, 80), 0.35)
    plan = plan_tiles(mask, 512, 512)
    e = schedule_smem(10, plan.grid[0], plan.steps, "v6e")
    assert dict((name, shape) for name, shape, _ in e.tables) == {
        "head_kind": (10,), "schedule": plan.schedule.shape, "key_norm_max": (10,), "bound_flag": (1,)}
    assert e.total == 2 * table_bytes((10,)) + table_bytes(plan.schedule.shape) + table_bytes((1,)) + fixed_bytes()
    assert e.fits and e.capacity == 1024 * KiB
    assert "KiB of SMEM" in str(e) and "v6e has 1,024 KiB per core" in str(e)


def test_forms_order_and_limits():
    forms = schedule_forms(1, 591, 260, "v6e")  # B2 at 1440p, density 0.35, 512 x 512
    assert forms["packed"].fits and forms["flat"].fits and not forms["two_tables"].fits
    assert forms["packed"].total < forms["flat"].total < forms["two_tables"].total
    packed, flat = largest_fitting_steps("packed"), largest_fitting_steps("flat")
    assert packed == 2 * flat and flat % VECTOR_WORDS == 0
    assert schedule_smem(1, 1, packed, "v6e").fits and not schedule_smem(1, 1, packed + 2 * VECTOR_WORDS, "v6e").fits


def test_unknown_generation_is_an_error():
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        estimate_smem({"t": (4,)}, "v9")


def test_unknown_method_is_an_error():
    plan = plan_tiles(SVGMask.spatial(VideoGeometry(2, 8, 16), 0.5), 128, 128)
    with pytest.raises(ValueError, match=r"^unknown method 'b5'; valid: dense, splash_dense, splash, b1, b2, b3$"):
        check_schedule_fits(plan, method="b5", heads=1)
    assert check_schedule_fits(plan, method="b2", heads=1).fits


def test_build_attention_refuses_an_overflowing_schedule_before_any_kernel(monkeypatch):
    """1440p at density 0.35 with 256 x 256 tiles: 1,182 x 516 steps do not fit; the error says
    so with the sizes and the capacity, and names larger blocks that fit."""
    attention_module = importlib.import_module("svg_lib.attention")  # where build_attention finds the kernel

    def must_not_run(*args, **kwargs):
        raise AssertionError("a kernel was built before the SMEM check")

    monkeypatch.setattr(attention_module, "block_sparse_attention", must_not_run)
    mask = SVGMask.spatial(WAN_1440P, 0.35)
    with pytest.raises(ValueError, match="overflows SMEM") as info:
        build_attention(mask, method="b2", heads=1, tokens=mask.tokens, head_dim=128, dtype=jnp.bfloat16,
                        block_q=256, block_kv=256, interpret=False)
    msg = str(info.value)
    plan = plan_tiles(mask, 256, 256)
    assert f"{plan.grid[0]} rows x {plan.steps} steps" in msg and "256x256 tiles over 302,400 tokens" in msg
    assert "v6e has 1,024 KiB per core" in msg
    found = re.search(r"block_q=(\d+), block_kv=(\d+) fits \(([\d,.]+) KiB\)", msg)
    assert found, msg
    bq, bkv = int(found.group(1)), int(found.group(2))
    bigger = plan_tiles(mask, bq, bkv)
    assert schedule_smem(1, bigger.grid[0], bigger.steps).fits and bq * bkv > 256 * 256


def test_check_names_the_stacked_kinds():
    plan = plan_tiles(SVGMask.spatial(WAN_1440P, 0.35), 512, 512)
    assert check_schedule_fits(plan, method="b2", heads=1).fits
    with pytest.raises(ValueError, match=r"b1 schedule of 1182 rows x 600 steps .* overflows SMEM.*no larger block"):
        check_schedule_fits(plan, method="b1", heads=1, kinds=2, steps=600, suggest=lambda bq, bkv: None)


# -- against the compiler ------------------------------------------------------------------------

def _compiles(compiler, words, *, heads=1, kinds=1, stage="b2", nq=2, block=512):
    """Compile the block-sparse kernel with a `words`-long schedule for v6e: True, or False when
    the compiler refuses it for SMEM (any other error propagates)."""
    from svg_lib.kernels.forward import block_sparse_attention
    from svg_lib.methods import METHODS

    n = nq * block
    steps = 2 * words // (nq * kinds)

    def f(q, k, v):
        head_kind = jnp.zeros((heads,), jnp.int32)
        schedule = jnp.zeros((words,), jnp.int32)
        keep = tuple((lambda qi, ki, c=c: ki < n - c) for c in range(kinds))
        return block_sparse_attention(q, k, v, head_kind, schedule, steps=steps, method=METHODS[stage], keep=keep,
                                      block_q=block, block_kv=block, block_kv_compute=block, interpret=False)
    try:
        compiler.compile_fn(f, [((heads, n, 128), "bfloat16")] * 3, target="v6e")
        return True
    except Exception as err:  # noqa: BLE001 - only an SMEM refusal is an answer here
        if "smem" not in str(err):
            raise
        return False


@pytest.mark.parametrize("heads,kinds,stage", [(1, 1, "b2"), (40, 2, "b1")])
def test_estimate_refuses_exactly_what_the_compiler_refuses(tpu_compiler, heads, kinds, stage):
    """The longest schedule the estimate accepts compiles; the next one (one more 128-word row of
    SMEM, or a whole kinds x 128 words for the two-kind kernel) is refused by both."""
    unit = VECTOR_WORDS * kinds  # keeps the steps a whole number for nq = 2 query tiles
    words = 0
    while schedule_smem(heads, 1, 2 * (words + unit), "v6e").fits:
        words += unit
    assert _compiles(tpu_compiler, words, heads=heads, kinds=kinds, stage=stage)
    assert not schedule_smem(heads, 1, 2 * (words + unit), "v6e").fits
    # Colab's libtpu 0.0.21 (with jax 0.7.2) pads a 1-D SMEM table to a multiple of 1,024 words, not
    # 128, so its refusal comes in 4 KiB steps; its fixed overhead is fitted to the largest kernel
    # here (40 heads, two kinds) and the estimate may stay up to 1,024 words on the safe side.
    spare = 1024 - unit if (installed_version("libtpu") or "").startswith("0.0.21") else 0
    assert not _compiles(tpu_compiler, words + unit + spare, heads=heads, kinds=kinds, stage=stage)


@pytest.mark.parametrize("method", ["b2", "b3"])
def test_1440p_compiles_with_default_blocks(tpu_compiler, method):
    """The issue's failing case: 21 x 90 x 160 tokens, density 0.35, 512 x 512, one head, bf16.
    Two [591, 260] int32 tables needed 1.74 MiB; the packed schedule needs about 304 KiB."""
    mask = SVGMask.spatial(WAN_1440P, 0.35)
    f = build_attention(mask, method=method, heads=1, tokens=mask.tokens, head_dim=128, dtype=jnp.bfloat16,
                        block_q=512, block_kv=512, interpret=False)
    start = time.perf_counter()
    compiled, _ = tpu_compiler.compile_fn(f, [((1, mask.tokens, 128), "bfloat16")] * 3, target="v6e")
    print(f"{method} 1440p compiled for v6e in {time.perf_counter() - start:.1f} s")
    assert compiled is not None
