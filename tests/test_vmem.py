"""Tests of svg_lib.vmem: the VMEM arithmetic that jax.export cannot do for us.

The byte counts are recomputed here from what each buffer is (not from vmem.py's formulas),
capacities are checked against jax's own TPU table, and the errors are checked for the
numbers they name and for suggestions that really fit.
"""
import importlib
import re

import jax.numpy as jnp
import pytest

from svg_lib import SVGMask, VideoGeometry, attention
from svg_lib.vmem import (DEFAULT_SCOPED_BYTES, HEADROOM, VMEM_BYTES, check_block_kv_compute, check_fits,
                          estimate_vmem)

MiB = 2**20
BLOG = dict(block_q=3328, block_kv=1536, head_dim=128, dtype=jnp.bfloat16)


def expected_bytes(block_q, block_kv, block_kv_compute, head_dim, itemsize):
    """(pipeline, scratch, intermediates) of one attention kernel, buffer by buffer."""
    q_block = out_block = block_q * head_dim * itemsize
    k_block = v_block = block_kv * head_dim * itemsize
    pipeline = 2 * (q_block + out_block + k_block + v_block)  # every block double-buffered
    running_max = running_sum = block_q * 128 * 4  # f32, replicated over the 128 lanes
    accumulator = block_q * head_dim * 4             # f32
    scratch = running_max + running_sum + accumulator
    n = block_q * block_kv_compute                   # one score slice
    scores, probs_f32, probs_cast = 4 * n, 4 * n, itemsize * n
    q_ids, k_ids, keep = 4 * n, 4 * n, 1 * n         # int32 iotas and the bool mask of a masking tile
    return pipeline, scratch, scores + probs_f32 + probs_cast + q_ids + k_ids + keep


@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3", "splash", "splash_dense"])
def test_blog_configuration_bytes(method):
    e = estimate_vmem(method, **BLOG, generation="v6e")
    # default compute slice: the largest multiple of 128 dividing 1536 whose score slice
    # stays within 2M elements: 3328 * 512 = 1.7M, 3328 * 768 = 2.6M
    assert e.block_kv_compute == 512
    pipeline, scratch, inter = expected_bytes(3328, 1536, 512, 128, 2)
    assert (e.pipeline, e.scratch, e.intermediates) == (pipeline, scratch, inter)
    assert e.total == pipeline + scratch + inter
    assert 40 * MiB < e.total < 41 * MiB  # the number the notebooks quote


def test_float32_and_explicit_compute_slice():
    e = estimate_vmem("b2", 1024, 1024, 64, jnp.float32, block_kv_compute=256, generation="v5p")
    assert (e.pipeline, e.scratch, e.intermediates) == expected_bytes(1024, 1024, 256, 64, 4)
    assert e.dtype == "float32" and e.generation == "v5p"
    assert "b2 1024x1024 (compute 256)" in str(e) and "v5p budget 54 MiB" in str(e)


def test_smaller_compute_slice_shrinks_only_intermediates():
    big = estimate_vmem("b2", **BLOG, block_kv_compute=1536, generation="v6e")
    small = estimate_vmem("b2", **BLOG, block_kv_compute=256, generation="v6e")
    assert (big.pipeline, big.scratch) == (small.pipeline, small.scratch)
    assert big.intermediates == 6 * small.intermediates


def test_capacities_match_jax_tpu_table():
    # jax's own per-chip table (private module of the pinned jax version)
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info", reason="private; older jax has no such table")
    if not hasattr(tpu_info, "_get_tpu_info_impl"):
        pytest.skip("this jax's tpu_info has no _get_tpu_info_impl (private; the pinned jax 0.10.2 has it)")
    names = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v7": "7"}
    for gen, chip in names.items():
        info = tpu_info._get_tpu_info_impl(tpu_info.ChipVersion(chip), 1)
        assert VMEM_BYTES[gen] == info.vmem_capacity_bytes, gen
    assert set(VMEM_BYTES) == set(DEFAULT_SCOPED_BYTES) == set(names)


def test_budget_and_fits_per_generation():
    fits = {}
    for gen in VMEM_BYTES:
        e = estimate_vmem("b2", **BLOG, generation=gen)
        assert e.capacity == VMEM_BYTES[gen] and e.budget == int(VMEM_BYTES[gen] * HEADROOM)
        assert e.fits == (e.total <= e.budget)
        fits[gen] = e.fits
    # 40.5 MiB: fits in 128 MiB (v5e, v6e) and 64 MiB (v5p, v7) chips, not in v4's 16 MiB
    assert fits == {"v4": False, "v5e": True, "v5p": True, "v6e": True, "v7": True}


def test_unknown_generation():
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'.*v6e"):
        estimate_vmem("b2", **BLOG, generation="v9")


def test_offline_generation_is_v6e():
    # no TPU here: plans are made for the blog's chip
    assert estimate_vmem("b2", **BLOG).generation == "v6e"


# -- vmem_limit_bytes ----------------------------------------------------------------------
# A mid-size tile: 12.5 MiB. With the estimate's 25 % + 2 MiB margin it wants ~17.6 MiB,
# more than v5e's 16 MiB default scoped limit, less than v6e's 32 MiB.
MID = dict(block_q=1024, block_kv=512, head_dim=128, dtype=jnp.bfloat16)


def test_no_limit_needed_under_the_default():
    small = estimate_vmem("dense", 128, 128, 64, jnp.float32, generation="v6e")
    assert small.total < MiB and small.vmem_limit_bytes is None
    mid = estimate_vmem("b2", **MID, generation="v6e")
    assert 12 * MiB < mid.total < 13 * MiB
    assert mid.vmem_limit_bytes is None


@pytest.mark.parametrize("gen,config", [("v5e", MID), ("v6e", BLOG), ("v5p", BLOG)])
def test_limit_is_set_above_the_default(gen, config):
    e = estimate_vmem("b2", **config, generation=gen)
    assert e.fits
    limit = e.vmem_limit_bytes
    assert limit is not None
    assert limit > DEFAULT_SCOPED_BYTES[gen]  # asking for it raises the default ...
    assert e.total < limit <= e.budget         # ... enough for the estimate, never past the budget
    assert limit % MiB == 0


def test_limit_is_capped_at_the_budget():
    # the largest block_q whose estimate still fits v6e: its margin would go past the budget
    bq = max(b for b in range(128, 16384, 128)
             if estimate_vmem("b2", b, 1536, 128, jnp.bfloat16, 512, "v6e").fits)
    e = estimate_vmem("b2", bq, 1536, 128, jnp.bfloat16, 512, "v6e")
    assert e.total * 1.25 > e.budget
    assert e.vmem_limit_bytes == e.budget


def test_limit_never_lowers_the_default():
    e = estimate_vmem("b2", **MID, generation="v4")
    assert e.fits
    assert e.vmem_limit_bytes is None or e.vmem_limit_bytes > DEFAULT_SCOPED_BYTES["v4"]


# -- check_fits ----------------------------------------------------------------------------

def test_check_fits_passes_a_fitting_estimate_through():
    e = estimate_vmem("b3", **BLOG, generation="v6e")
    assert check_fits(e) is e


@pytest.mark.parametrize("gen,config", [
    ("v6e", dict(block_q=8192, block_kv=8192, head_dim=128, dtype=jnp.bfloat16, block_kv_compute=8192)),
    ("v4", dict(BLOG)),
])
def test_check_fits_names_the_numbers_and_a_fitting_configuration(gen, config):
    e = estimate_vmem("b2", **config, generation=gen)
    assert not e.fits
    with pytest.raises(ValueError, match="overflows VMEM") as info:
        check_fits(e)
    msg = str(info.value)
    assert f"{e.total / MiB:.1f} MiB" in msg and f"budget {e.budget / MiB:.0f} MiB" in msg
    assert f"{e.block_q}x{e.block_kv}" in msg and gen in msg
    found = re.search(r"block_q=(\d+), block_kv=(\d+), block_kv_compute=(\d+) fits \(([\d.]+) MiB\)", msg)
    assert found, msg
    bq, bkv, c = (int(x) for x in found.groups()[:3])
    suggestion = estimate_vmem("b2", bq, bkv, config["head_dim"], config["dtype"], c, gen)
    assert suggestion.fits
    assert f"{suggestion.total / MiB:.1f}" == found.group(4)
    assert bkv == e.block_kv and bkv % c == 0 and bq <= e.block_q


def test_check_fits_without_any_fitting_block_q():
    # k and v blocks alone overflow: no block_q or compute slice can help
    e = estimate_vmem("b2", 128, 128 * 2048, 128, jnp.bfloat16, 128, "v6e")
    assert e.pipeline > e.budget
    with pytest.raises(ValueError, match="overflows VMEM.*reduce block_kv"):
        check_fits(e)


# -- block_kv_compute ----------------------------------------------------------------------

def test_block_kv_compute_default_and_explicit():
    assert check_block_kv_compute(1536, None, 3328) == 512
    assert check_block_kv_compute(1024, None, 128) == 1024  # small q tiles: no slicing needed
    assert check_block_kv_compute(1536, 768, 3328) == 768


@pytest.mark.parametrize("value,match", [
    (384, r"block_kv_compute=384 must divide block_kv=1024; valid choices: \[128, 256, 512, 1024\]"),
    (100, r"block_kv_compute must be a positive multiple of 128.*got 100"),
    (0, r"block_kv_compute must be a positive multiple of 128"),
    (2048, r"must divide block_kv=1024"),
])
def test_bad_block_kv_compute(value, match):
    with pytest.raises(ValueError, match=match):
        estimate_vmem("b2", 512, 1024, 128, jnp.bfloat16, block_kv_compute=value)


# -- attention() refuses an overflowing configuration before doing any work ----------------

@pytest.mark.parametrize("method", ["dense", "splash", "b2", "b3"])
def test_attention_refuses_overflow_before_running(method, monkeypatch):
    attention_module = importlib.import_module("svg_lib.attention")
    kernels = importlib.import_module("svg_lib.kernels")
    splash = importlib.import_module("svg_lib.splash")

    def must_not_run(*args, **kwargs):
        raise AssertionError("planning or a kernel ran before the VMEM check")

    monkeypatch.setattr(attention_module, "plan_tiles", must_not_run)
    monkeypatch.setattr(kernels, "dense_flash_attention", must_not_run)
    monkeypatch.setattr(kernels, "block_sparse_attention", must_not_run)
    monkeypatch.setattr(splash, "make_splash", must_not_run)
    mask = SVGMask.spatial(VideoGeometry(2, 8, 16), 0.5)
    q = jnp.zeros((1, mask.tokens, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"overflows VMEM.*block_q=\d+, block_kv=8192, block_kv_compute=\d+ fits"):
        attention(q, q, q, mask, method=method, block_q=8192, block_kv=8192, block_kv_compute=8192)
