"""Tests of svg_lib.memory.vmem: the VMEM arithmetic that jax.export cannot do for us.

The byte counts are recomputed here from what each buffer is (not from vmem.py's formulas),
capacities are checked against jax's own TPU table, and the errors are checked for the
numbers they name and for suggestions that really fit.
"""
import importlib
import re

import jax
import jax.numpy as jnp
import pytest

from svg_lib import SVGMask, VideoGeometry, attention
import svg_lib.runtime as runtime_module
from svg_lib.environment import libtpu_version
from svg_lib.extensions.top_level_vmem import compiler_options
from svg_lib.instruments.tpu import checks
from svg_lib.chips import TARGETS
from svg_lib.runtime import Runtime, tpu_memory
from svg_lib.memory.vmem import HEADROOM, check_fits, estimate_vmem
from svg_lib.problem import check_block_kv_compute

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


@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3"])
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


@pytest.mark.parametrize("form", ["full", "blocks", "computable"])
def test_splash_bytes_by_mask_form(form):
    e = estimate_vmem("splash_dense", **BLOG, generation="v6e", splash_mask=form)
    pipeline, scratch, inter = expected_bytes(3328, 1536, 512, 128, 2)
    # Splash's mask travels with q, k, v: a [block_q, block_kv] block of bools (int32 in VMEM), or
    # a [block_q, 128] int32 block of query indices for a computable mask; double-buffered
    table = {"full": 0, "blocks": 2 * 3328 * 1536 * 4, "computable": 2 * 3328 * 128 * 4}[form]
    n = 3328 * 512
    if form == "full":
        inter -= 9 * n                     # no index arrays, no mask
    inter += 512 * 128 * 4                 # Splash multiplies p by a f32 copy of the v chunk
    assert (e.pipeline, e.scratch, e.intermediates, e.mask_table) == (pipeline + table, scratch, inter, table)
    assert e.splash_mask == form and f"mask {form}" in str(e)


def test_splash_defaults_to_its_costliest_mask_form():
    assert estimate_vmem("splash", **BLOG, generation="v6e").splash_mask == "blocks"
    with pytest.raises(ValueError, match="splash_mask must be one of"):
        estimate_vmem("splash", **BLOG, generation="v6e", splash_mask="dense")
    with pytest.raises(ValueError, match="splash_mask applies to"):
        estimate_vmem("b2", **BLOG, generation="v6e", splash_mask="full")


def test_splash_limit_and_its_top_level_compiler_options():
    # the blog's tiles need more than a v6e's default scoped VMEM; build_attention gives Splash
    # that limit in its own CompilerParams (splash.with_vmem_limit), and compiler_options names
    # the same limit for a caller who compiles a bare Splash kernel at the top level
    e = estimate_vmem("splash_dense", **BLOG, generation="v6e")
    assert e.vmem_limit_bytes > TARGETS["v6e"].default_scoped_vmem
    assert compiler_options(e) == {"xla_tpu_scoped_vmem_limit_kib": str(e.vmem_limit_bytes // 2**10)}
    small = estimate_vmem("splash_dense", 512, 256, 128, jnp.bfloat16, generation="v6e")
    assert small.vmem_limit_bytes is None and compiler_options(small) == {}


def test_capacities_come_from_the_compile_targets():
    for gen, target in TARGETS.items():
        memory = tpu_memory(gen)
        assert (memory.vmem_bytes, memory.default_scoped, memory.smem_bytes) == (
            target.vmem_bytes, target.default_scoped_vmem, target.smem_bytes)
        e = estimate_vmem("b2", **BLOG, generation=gen)
        assert (e.capacity, e.default_scoped) == (target.vmem_bytes, target.default_scoped_vmem)


def test_compile_targets_match_jax_tpu_table():
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
    if not hasattr(tpu_info, "get_tpu_info_for_chip"):
        pytest.skip("this jax has no get_tpu_info_for_chip")
    for gen, target in TARGETS.items():
        chip = {"v7x": "7x"}.get(gen, gen)  # jax names the v7x "7x"
        info = tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion(chip), 1)
        assert target.vmem_bytes == info.vmem_capacity_bytes, gen
        assert target.smem_bytes == info.smem_capacity_bytes, gen


def test_budget_and_fits_per_generation():
    fits = {}
    for gen in TARGETS:
        e = estimate_vmem("b2", **BLOG, generation=gen)
        assert e.budget == int(TARGETS[gen].vmem_bytes * HEADROOM)
        assert e.fits == (e.total <= e.budget)
        fits[gen] = e.fits
    # 40.5 MiB: fits in 128 MiB (v5e, v6e) and 64 MiB (v5p) chips, not in v4's 16 MiB
    assert fits == {"v4": False, "v5e": True, "v5p": True, "v6e": True, "v7x": True}  # v7x: 64 MiB, like a v5p


# -- which TPU we plan for -----------------------------------------------------------------

class FakeInfo:
    def __init__(self, vmem, smem):
        self.vmem_capacity_bytes, self.smem_capacity_bytes = vmem, smem


def on_tpu(monkeypatch, device_kind, info):
    """Pretend jax reports a TPU of `device_kind` whose get_tpu_info() is `info` (None: no such function)."""
    runtime = Runtime(platform="tpu", device_kind=device_kind, device_count=1, jax_version="0.10.2", compiled=True)
    monkeypatch.setattr(runtime_module, "detect_runtime", lambda: runtime)
    monkeypatch.setattr(runtime_module, "_tpu_info", lambda: info)


def test_attached_tpu_capacity_comes_from_get_tpu_info(monkeypatch):
    # a chip jax knows but svg_lib's compile targets do not (the TPU8i)
    on_tpu(monkeypatch, "TPU8i", FakeInfo(64 * MiB, MiB))
    memory = tpu_memory()
    assert (memory.generation, memory.vmem_bytes, memory.smem_bytes) == ("v8i", 64 * MiB, MiB)
    assert "get_tpu_info" in memory.source
    e = estimate_vmem("b2", **BLOG)
    assert (e.generation, e.capacity, e.budget) == ("v8i", 64 * MiB, int(64 * MiB * HEADROOM))
    # no default scoped limit known for this chip: the kernel always states its limit
    assert e.default_scoped is None and e.vmem_limit_bytes is not None
    assert estimate_vmem("b2", **BLOG, generation="v8i").capacity == 64 * MiB


def test_attached_known_tpu_without_get_tpu_info_uses_the_table(monkeypatch):
    on_tpu(monkeypatch, "TPU v5", None)
    memory = tpu_memory()
    assert (memory.generation, memory.vmem_bytes) == ("v5p", TARGETS["v5p"].vmem_bytes)
    assert estimate_vmem("b2", **BLOG).budget == int(64 * MiB * HEADROOM)


@pytest.mark.parametrize("kind,info,match", [
    ("TPU v9 lite", FakeInfo(256 * MiB, MiB), "device_kind 'TPU v9 lite'.*does not recognise"),
    ("TPU8i", None, "v8i.*no pltpu.get_tpu_info"),
])
def test_unknown_tpu_is_an_error_not_a_v6e(monkeypatch, kind, info, match):
    on_tpu(monkeypatch, kind, info)
    with pytest.raises(RuntimeError, match=match):
        estimate_vmem("b2", **BLOG)
    with pytest.raises(RuntimeError, match=match):
        runtime_module.tpu_generation()


def test_unknown_generation():
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'.*v6e"):
        estimate_vmem("b2", **BLOG, generation="v9")


@pytest.mark.parametrize("method, message", [
    ("b5", r"unknown method 'b5'; valid: dense, splash_dense, splash, b1, b2, b3$"),
    ("B2", r"unknown method 'B2' \(did you mean 'b2'\?\); valid: dense, "),
    ("", r"unknown method ''; valid: "),
    (None, r"unknown method None; valid: "),
])
def test_unknown_method_is_refused_not_estimated(method, message):
    with pytest.raises(ValueError, match=message):
        estimate_vmem(method, **BLOG)


@pytest.mark.parametrize("dtype", ["float16", "int8", jnp.float16, "bf16"])
def test_unsupported_dtype_is_refused(dtype):
    args = {**BLOG, "dtype": dtype}
    with pytest.raises(ValueError, match=r"unsupported dtype .*; the kernels take float32 or bfloat16$"):
        estimate_vmem("b2", **args)
    assert estimate_vmem("b2", **{**BLOG, "dtype": jnp.bfloat16}).dtype == "bfloat16"


def test_integral_float_block_is_refused_as_a_float():
    with pytest.raises(ValueError, match=r"got 3328.0 \(a float\); pass the int 3328$"):
        estimate_vmem("b2", **{**BLOG, "block_q": 3328.0})


@pytest.mark.skipif(jax.devices()[0].platform == "tpu", reason="checks the plan off TPU")
def test_offline_generation_is_v6e():
    # no TPU here: plans are made for the blog's chip
    assert estimate_vmem("b2", **BLOG).generation == "v6e"
    assert runtime_module.tpu_generation() == "v6e"


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
    assert limit > TARGETS[gen].default_scoped_vmem  # asking for it raises the default ...
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
    assert e.vmem_limit_bytes is None or e.vmem_limit_bytes > TARGETS["v4"].default_scoped_vmem


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
def test_attention_refuses_overflow_before_building_a_kernel(method, monkeypatch):
    """The plan is made first (the memory check reads its tables), but no kernel is built or run."""
    attention_module = importlib.import_module("svg_lib.attention")  # where build_attention finds them

    def must_not_run(*args, **kwargs):
        raise AssertionError("a kernel was built or ran before the VMEM check")

    for name in ("dense_flash_attention", "block_sparse_attention", "make_splash", "with_backward"):
        monkeypatch.setattr(attention_module, name, must_not_run)
    mask = SVGMask.spatial(VideoGeometry(2, 8, 16), 0.5)
    q = jnp.zeros((1, mask.tokens, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"overflows VMEM.*block_q=\d+, block_kv=8192, block_kv_compute=\d+ fits"):
        attention(q, q, q, mask, method=method, block_q=8192, block_kv=8192, block_kv_compute=8192)


# -- the estimate against the TPU compiler (libtpu on this CPU, compile-only, nothing run) ----
# One head on a 2 x 2 grid of tiles per point (VMEM depends on the blocks, not the tokens).
# Each point says what the estimate must say and what the compiler must do, so both sides of
# each limit are covered: the estimate's budget (85 % of the chip), the compiler's scoped limit
# (the default, or what the kernel asks for), and the chip's whole VMEM.
#   (target, method, block_q, block_kv, block_kv_compute, dtype, splash_mask, estimate fits, compiles)
COMPILER_POINTS = [
    # every Pallas method at a mid tile on the blog's chip
    ("v6e", "dense", 1024, 512, None, "bfloat16", None, True, True),
    ("v6e", "b1", 1024, 512, None, "bfloat16", None, True, True),
    ("v6e", "b2", 1024, 512, None, "bfloat16", None, True, True),
    ("v6e", "b3", 1024, 512, None, "bfloat16", None, True, True),
    ("v6e", "splash_dense", 1024, 512, None, "bfloat16", "blocks", True, True),
    ("v6e", "splash", 1024, 512, None, "bfloat16", "computable", True, True),
    # float32 and two compute slices on a v5e
    ("v5e", "b2", 512, 1024, 256, "float32", None, True, True),
    ("v5e", "b2", 512, 1024, 1024, "float32", None, True, True),
    # k and v blocks alone exceed a v5e's 16 MiB default scoped limit: compiles only under the
    # limit the estimate asks for (see test_default_limit_is_not_enough). Keys in chunks of 512 (a
    # rolled loop): the same verdicts as one 256 x 16384 body, which takes minutes to compile
    ("v5e", "dense", 256, 16384, 512, "float32", None, True, True),
    ("v5e", "splash_dense", 1024, 2048, None, "bfloat16", "blocks", True, True),
    # v4: 16 MiB in all. The estimate refuses the first three. The compiler refuses the first
    # (double-buffered k and v blocks alone take the 16 MiB: "Used 22.69M of 16.00M vmem") and the
    # second (blocks and mask block fit, but the program with Splash's intermediates does not: "Used
    # 22.39M of 16.00M vmem"), and accepts the third: there the estimate is conservative.
    ("v4", "dense", 128, 8192, None, "float32", None, False, False),
    ("v4", "splash_dense", 1024, 1536, None, "bfloat16", "blocks", False, False),
    ("v4", "b1", 768, 1024, 1024, "bfloat16", None, False, True),
    ("v4", "b1", 512, 1024, 1024, "bfloat16", None, True, True),
]
# The verdicts above are libtpu 0.0.42's. Where another release we test (Colab's, in make
# test-colab) decides differently, on the estimate's safe side, it is recorded here:
# {(target, method, block_q, block_kv): {libtpu release: compiles}}.
OTHER_LIBTPU_VERDICTS = {
    # Colab's libtpu 0.0.21 fits Splash's intermediates in 16 MiB where 0.0.42 does not
    ("v4", "splash_dense", 1024, 1536): {"0.0.21": True},
}
# The same for the default scoped limit (test_default_limit_is_not_enough): {(target, method, block_q,
# block_kv): {libtpu release: compiles under the default}}.
DEFAULT_LIMIT_VERDICTS = {
    # dense at 256 x 16384, float32: since the kernels stopped selecting a whole key block's tail in place (a
    # block-sized temporary for k and for v), libtpu 0.0.21 fits it in the v5e's 16 MiB; 0.0.42 still refuses
    ("v5e", "dense", 256, 16384): {"0.0.21": True},
}


def _point_id(p):
    return f"{p[0]}-{p[1]}{'-' + p[6] if p[6] else ''}-{p[2]}x{p[3]}-c{p[4]}-{p[5]}"


def _colab_marks(p):
    """A point for a chip Colab does not offer runs in the pinned stage only (tests/conftest.py), except
    where another libtpu release is recorded to decide differently: the replica checks that record."""
    recorded = (p[0], p[1], p[2], p[3]) in OTHER_LIBTPU_VERDICTS
    return [] if p[0] in ("v5e", "v6e") or recorded else [pytest.mark.not_on_colab]


@pytest.mark.parametrize("point", [pytest.param(p, marks=_colab_marks(p)) for p in COMPILER_POINTS],
                         ids=[_point_id(p) for p in COMPILER_POINTS])
def test_estimate_agrees_with_the_compiler(tpu_compiler, point):
    target, method, bq, bkv, c, dtype, form, fits, compiles = point
    e = estimate_vmem(method, bq, bkv, 128, dtype, c, target, splash_mask=form)
    assert e.fits == fits, e
    check = checks.compile_check(e)
    release = ".".join((libtpu_version() or "").split(".")[:3])
    compiles = OTHER_LIBTPU_VERDICTS.get((target, method, bq, bkv), {}).get(release, compiles)
    assert check.compiled == compiles, check.error
    assert check.agrees  # where the estimate fits, it compiles; where the compiler refuses, so does it
    if check.reported is not None:  # the compiler's own count of scoped VMEM never exceeds ours
        assert check.reported <= e.total
        assert check.reported > check.limit


@pytest.mark.parametrize("target,method,bq,bkv,c,dtype,form", [
    ("v5e", "dense", 256, 16384, 512, "float32", None),
    ("v5e", "splash_dense", 1024, 2048, None, "bfloat16", "blocks"),
])
def test_default_limit_is_not_enough(tpu_compiler, target, method, bq, bkv, c, dtype, form):
    # the same kernels as above, under the chip's default scoped limit: the compiler refuses,
    # so the limit the estimate asks for (vmem_limit_bytes; Splash gets it by with_vmem_limit) is needed
    e = estimate_vmem(method, bq, bkv, 128, dtype, c, target, splash_mask=form)
    assert e.vmem_limit_bytes is not None
    check = checks.compile_check(e, limit=None)
    assert check.limit == TARGETS[target].default_scoped_vmem
    release = ".".join((libtpu_version() or "").split(".")[:3])
    if DEFAULT_LIMIT_VERDICTS.get((target, method, bq, bkv), {}).get(release, False):
        assert check.compiled, check.error  # this release needs less than the estimate asks: recorded above
        return
    assert not check.compiled
    assert check.limit < check.reported <= e.vmem_limit_bytes


def test_build_attention_raises_splash_limit(tpu_compiler):
    # build_attention hands Splash its limit in Splash's own pallas_call CompilerParams
    from svg_lib import build_attention

    tokens = 2 * 2048 - 128  # key padding: Splash gets a mask block of 1024 x 2048
    fn = build_attention(None, method="splash_dense", heads=1, tokens=tokens, head_dim=128, dtype="bfloat16",
                         block_q=1024, block_kv=2048, interpret=False, generation="v5e")
    tpu_compiler.compile_fn(fn, [((1, tokens, 128), "bfloat16")] * 3, target="v5e")


# -- reading the compiler's verdicts (no compiler needed) -----------------------------------

def test_reported_sizes_from_both_kinds_of_refusal():
    scoped = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: ... Scoped allocation with size 43.88M "
              "and limit 32.00M exceeded scoped vmem limit by 11.88M.")
    program = "XLA:TPU compile permanent error. Ran out of memory in memory space vmem. Used 22.39M of 16.00M vmem."
    assert checks.reported_scoped_bytes(scoped) == (int(43.88 * MiB), 32 * MiB)
    assert checks.reported_scoped_bytes(program) == (int(22.39 * MiB), 16 * MiB)
    assert checks.reported_scoped_bytes("Ran out of memory in memory space smem") is None


@pytest.mark.parametrize("fits,compiled,agrees,conservative", [
    (True, True, True, False), (True, False, False, False), (False, False, True, False), (False, True, True, True)])
def test_compiler_check_verdicts(fits, compiled, agrees, conservative):
    e = estimate_vmem("b2", **BLOG, generation="v4" if not fits else "v6e")
    assert e.fits == fits
    check = checks.CompilerCheck(e, e.generation, 16 * MiB, compiled, None, None, 1.0)
    assert (check.agrees, check.conservative) == (agrees, conservative)
    assert check.row()["agrees"] == agrees and ("DISAGREES" in str(check)) == (not agrees)


# -- the recorded compiler boundary (svg_lib/data/largest_block_q.json) ----------------------

def test_recorded_largest_block_q_is_labelled_and_above_the_estimate():
    doc = checks.load_largest_block_q()
    assert doc["evidence"].startswith("compiled for TPU") and doc["libtpu"] and doc["jax"] and doc["date"]
    assert doc["results"]
    for r in doc["results"]:
        # compiled at largest_block_q, refused at refused_block_q (one step apart once bisected)
        assert r["refused_block_q"] > r["largest_block_q"] and r["largest_block_q"] % 256 == 0, r
        assert r["refused_mib"] > r["limit_mib"], r  # the refusal named a size over the limit
        # recomputed here: the estimate never fits a block_q the compiler refused
        fitting = [bq for bq in range(256, r["refused_block_q"] + 1, 256)
                   if estimate_vmem(r["method"], bq, r["block_kv"], r["head_dim"], r["dtype"], None, r["target"],
                                    splash_mask=r["splash_mask"]).fits]
        assert max(fitting, default=0) <= r["largest_block_q"], r


# The backward's kernels (svg_lib.kernels.backward) against the compiler on a 64 MiB chip, where the
# estimate decides whether training is allowed at all: fitted per-tile values (vmem._BACKWARD_BYTES_PER_SCORE)
# must still compile under the limit they ask for. The fused kernel's check holds 2 query tiles' dq.
# The fused kernel at the blog's tiles is compiled by test_compiler's blog-size gradient on four chips.
BACKWARD_POINTS = [
    ("v5p", "b3:dkv", 3328, 1536, 512, "bfloat16"),
    ("v5p", "b3:dq", 1024, 1024, 512, "float32"),
    ("v5p", "b1:fused", 1024, 1024, 512, "float32"),
]


@pytest.mark.not_on_colab  # every point is a v5p's (tests/conftest.py)
@pytest.mark.parametrize("point", BACKWARD_POINTS, ids=["-".join(map(str, p)) for p in BACKWARD_POINTS])
def test_backward_estimate_compiles_under_its_own_limit(tpu_compiler, point):
    target, method, bq, bkv, c, dtype = point
    assert target == "v5p"  # the marker above says so
    e = estimate_vmem(method, bq, bkv, 128, dtype, c, target, q_len=2 * bq)
    assert e.fits, e
    check = checks.compile_check(e)
    assert check.compiled, check.error
