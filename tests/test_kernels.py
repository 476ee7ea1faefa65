"""Tests of the attention kernels behind `svg_lib.attention` (interpret mode on CPU).

Every method is compared with the package's float64 attention (`attention_float64`), under the mask that
method computes: none for the dense baselines, the exact SVG mask for splash / b1 / b2, and
the tile-aligned (rounded) mask for b3. Sizes are small, tokens never fill whole tiles (so
q and kv padding is always exercised), and each kernel is built once per configuration and
its output reused by every test that needs it.
"""
import functools
import importlib
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svg_lib import METHODS, Mask, SVGMask, TileAlignedMask, VideoGeometry, attention, b3_mask, build_attention
from svg_lib.core.planner import EMPTY, plan_tiles
from svg_lib.extensions.references import attention_float64
from svg_lib.extensions.tolerances import tolerance
from svg_lib.methods import METHODS as RECORDS

from helpers import DTYPES, EMPTY_TILE_ROW, HOLEY, method_tolerance, needs_race_state, races_found_in, random_qkv

# -- tolerances ----------------------------------------------------------------------------
# One place per dtype, with the reasons: svg_lib/extensions/tolerances.py (float32: summation order only,
# every matmul at float32 precision; bfloat16: bf16 rounding inside the kernel). Both are far
# below the O(1) changes a wrong mask causes (checked in test_masks_are_told_apart).
TOL = {"float32": tolerance("float32"), "bfloat16": tolerance("bfloat16")}
F32 = TOL["float32"]
# Two kernels that compute the same masked attention from the same float32 data differ only
# in float32 summation order.
SAME_MATH = dict(rtol=2e-6, atol=2e-6)


# -- the configurations --------------------------------------------------------------------
# G1: 8 frames of 8x12 plus 20 text tokens = 788 tokens (not a multiple of 128 or 256), with
#     the first-frame sink: at 128x128 its 7x7 tiles mix empty, partial and full ones.
# G2: 5 frames of 10x13 = 650 tokens, no text, no sink.
# G3: 2 frames of 5x10 plus 12 text = 112 tokens: less than one tile in q and in kv.
G1 = VideoGeometry(8, 8, 12, text_tokens=20)
G2 = VideoGeometry(5, 10, 13)
G3 = VideoGeometry(2, 5, 10, text_tokens=12)


@dataclass(frozen=True)
class Case:
    geometry: VideoGeometry
    density: float
    sink: bool
    heads: int
    head_dim: int
    dtype: str
    block_q: int
    block_kv: int
    block_kv_compute: int | None = None
    seed: int = 0

    @functools.cached_property
    def mask(self) -> SVGMask:
        return SVGMask.spatial(self.geometry, self.density, first_frame_sink=self.sink)

    @property
    def tokens(self) -> int:
        return self.geometry.tokens


# A, B and C share their data (same geometry, heads, dtype and seed): only the tiles differ,
# so the padding differs (q pads 108 / 236 / 108 tokens, kv 108 / 108 / 236).
CASES = {
    "f32-h3-128x128": Case(G1, 0.3, True, 3, 64, "float32", 128, 128),
    "f32-h3-256x128": Case(G1, 0.3, True, 3, 64, "float32", 256, 128),
    "f32-h3-128x256-c128": Case(G1, 0.3, True, 3, 64, "float32", 128, 256, 128),
    "bf16-h3-nosink-256x256-c128": Case(G2, 0.35, False, 3, 128, "bfloat16", 256, 256, 128, seed=1),
    "bf16-h1-tiny-256x128": Case(G3, 0.5, True, 1, 128, "bfloat16", 256, 128, seed=2),
}
SAME_DATA = ["f32-h3-128x128", "f32-h3-256x128", "f32-h3-128x256-c128"]


@functools.lru_cache(maxsize=None)
def case_qkv(name):
    c = CASES[name]
    return random_qkv(c.seed, c.heads, c.tokens, c.head_dim, c.dtype)


def method_mask(name, method):
    """The mask `method` computes attention under, for case `name` (None = dense)."""
    c = CASES[name]
    if method in ("dense", "splash_dense"):
        return None
    if method == "b3":
        return b3_mask(c.mask, c.block_q, c.block_kv)
    return c.mask


@functools.lru_cache(maxsize=None)
def expected(name, which):
    """float64 attention of case `name` under no mask ("none"), the exact mask or B3's."""
    c = CASES[name]
    mask = {"none": None, "exact": c.mask, "b3": b3_mask(c.mask, c.block_q, c.block_kv)}[which]
    return attention_float64(*case_qkv(name), None if mask is None else mask.to_dense())


def expected_for(name, method):
    return expected(name, {"dense": "none", "splash_dense": "none", "b3": "b3"}.get(method, "exact"))


@functools.lru_cache(maxsize=None)
def kernel_output(name, method):
    """Build `method` for case `name` once and run it; float64 numpy `[heads, tokens, head_dim]`.

    Every method is handed the case's mask: the dense baselines must ignore it.
    """
    c = CASES[name]
    f = build_attention(c.mask, method=method, heads=c.heads, tokens=c.tokens, head_dim=c.head_dim,
                        dtype=DTYPES[c.dtype], block_q=c.block_q, block_kv=c.block_kv,
                        block_kv_compute=c.block_kv_compute)
    out = f(*case_qkv(name))
    assert out.shape == (c.heads, c.tokens, c.head_dim) and out.dtype == DTYPES[c.dtype]
    return np.asarray(jnp.asarray(out, jnp.float32), dtype=np.float64)


# -- every method against float64, under its own mask --------------------------------------

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(CASES))
def test_method_matches_float64_reference(name, method):
    got = kernel_output(name, method)
    np.testing.assert_allclose(got, expected_for(name, method), **method_tolerance(method, CASES[name].dtype),
                               err_msg=f"{method} on {name}")


@pytest.mark.parametrize("name", list(CASES))
def test_masks_are_told_apart(name):
    """The tolerances above are far tighter than the effect of a wrong mask, so the test above
    really checks that each method uses ITS mask (B3's rounded one is not the exact one)."""
    c = CASES[name]
    atol = TOL[c.dtype]["atol"]
    none, exact, b3 = (expected(name, w) for w in ("none", "exact", "b3"))
    if c.mask.pair_density < 1.0:
        assert np.abs(exact - none).max() > 10 * atol
    report = b3_mask(c.mask, c.block_q, c.block_kv).report
    if report.pairs_added or report.pairs_dropped:
        assert np.abs(b3 - exact).max() > 10 * atol
        # and B3's kernel output really is the rounded attention, not the exact one
        assert np.abs(kernel_output(name, "b3") - exact).max() > 10 * atol
    else:  # only the tiny case, whose single tile is not rounded at all
        assert name == "bf16-h1-tiny-256x128"
        np.testing.assert_array_equal(b3, exact)


def test_cases_cover_what_they_claim():
    # padding in q and kv everywhere; one case smaller than a tile; a block_kv_compute < block_kv
    for c in CASES.values():
        assert c.tokens % c.block_q and c.tokens % c.block_kv
    assert any(c.tokens < min(c.block_q, c.block_kv) for c in CASES.values())
    assert any(c.block_kv_compute and c.block_kv_compute < c.block_kv for c in CASES.values())
    assert {c.heads for c in CASES.values()} >= {1, 3}
    assert {c.dtype for c in CASES.values()} == {"float32", "bfloat16"}
    assert {c.sink for c in CASES.values()} == {True, False}
    assert any(c.geometry.text_tokens for c in CASES.values())
    # the 128x128 case has all three tile classes, so every kernel path runs
    classes = plan_tiles(CASES["f32-h3-128x128"].mask, 128, 128).classes
    assert set(np.unique(classes)) == {0, 1, 2}


def test_attention_entry_point_builds_once_and_matches(monkeypatch):
    """attention() is build_attention + a cache: the second call with the same mask and
    shapes must not build (plan, trace) again, and both give the built kernel's output."""
    attention_module = importlib.import_module("svg_lib.attention")
    builds = []
    real_build = attention_module.build_attention

    def counting_build(*args, **kwargs):
        builds.append(kwargs["method"])
        return real_build(*args, **kwargs)

    monkeypatch.setattr(attention_module, "build_attention", counting_build)
    built = importlib.import_module("svg_lib.cache")  # where attention() keeps what it built
    monkeypatch.setattr(built, "_BUILT", type(built._BUILT)())  # start empty
    name = "f32-h3-128x128"
    c = CASES[name]
    for _ in range(2):
        out = attention(*case_qkv(name), c.mask, method="b2", block_q=c.block_q, block_kv=c.block_kv)
        np.testing.assert_array_equal(np.asarray(out, np.float64), kernel_output(name, "b2"))
    assert builds == ["b2"]


# -- padding never leaks -------------------------------------------------------------------

@pytest.mark.parametrize("method", ["dense", "splash_dense", "splash", "b1", "b2"])
def test_output_does_not_depend_on_the_tiling(method):
    """Same data, three tilings with different q and kv padding: the same result up to
    float32 summation order (B3 is left out: its rounded mask depends on the tiling)."""
    first, *others = (kernel_output(name, method) for name in SAME_DATA)
    for name, out in zip(SAME_DATA[1:], others):
        np.testing.assert_allclose(out, first, **SAME_MATH, err_msg=f"{method}: {name} vs {SAME_DATA[0]}")


# Small problem for the direct kernel calls below and the race checks: 320 tokens (3x3
# tiles of 128, the last 64 rows / columns padding), band 128, no sink, no text, so tile
# (0, 2) and (2, 0) are empty and B1/B2 schedules have idle steps.
SMALL = SVGMask.spatial(VideoGeometry(4, 8, 10), 0.5, first_frame_sink=False)


def test_small_problem_has_empty_tiles_and_idle_steps():
    plan = plan_tiles(SMALL, 128, 128)
    assert SMALL.tokens == 320 and SMALL.band_width == 128
    assert (plan.classes == EMPTY).sum() == 2
    assert (plan.step_class == EMPTY).any()


@pytest.mark.parametrize("method", ["dense", "b2", "b3"])
@pytest.mark.parametrize("tpu_interpreter", [False, pytest.param(True, marks=pytest.mark.tpu_interpreter)])
def test_partial_last_tiles_do_not_leak(method, tpu_interpreter):
    """Call the kernel itself on unpadded arrays whose last query and key tiles are partial: both
    interpreters fill a block's part past the array's end with NaN (a TPU leaves whatever the buffer
    held), and one NaN key, value or query row that reached a matmul would poison whole rows."""
    from svg_lib.kernels.forward import block_sparse_attention, dense_flash_attention
    n, bq, bkv, d = SMALL.tokens, 128, 128, 64
    assert n % bq and n % bkv
    q, k, v = random_qkv(5, 2, n, d, "float32")
    qs = q / math.sqrt(d)
    interpret = pltpu.InterpretParams() if tpu_interpreter else True
    common = dict(block_q=bq, block_kv=bkv, block_kv_compute=bkv, interpret=interpret, residuals=True)
    if method == "dense":
        out, lse = dense_flash_attention(qs, k, v, **common)
        keep = None
    else:
        mask = SMALL if method == "b2" else b3_mask(SMALL, bq, bkv)
        plan = plan_tiles(mask, bq, bkv)
        pred = SMALL.keep if method == "b2" else (lambda qi, ki: ki < n)
        out, lse = block_sparse_attention(qs, k, v, jnp.zeros((2,), jnp.int32), jnp.asarray(plan.schedule),
                                          steps=plan.steps, method=RECORDS[method], keep=pred, **common)
        keep = mask.to_dense()
    assert out.shape == q.shape and lse.shape == (2, 1, n)
    assert np.isfinite(np.asarray(lse)).all()
    np.testing.assert_allclose(np.asarray(out, np.float64), attention_float64(q, k, v, keep), **F32)


# -- rows and tiles with nothing kept ------------------------------------------------------




def _run_small(mask, method, heads=2, head_dim=64, seed=9, interpret=None):
    q, k, v = random_qkv(seed, heads, mask.tokens, head_dim, "float32")
    f = build_attention(mask, method=method, heads=heads, tokens=mask.tokens, head_dim=head_dim,
                        dtype=jnp.float32, block_q=128, block_kv=128, interpret=interpret)
    return np.asarray(f(q, k, v), np.float64), (q, k, v)


@pytest.mark.parametrize("method", [
    "reference", "b1", "b2", "splash"])
def test_rows_with_no_kept_key_give_zeros(method):
    dense = HOLEY.to_dense()
    empty = ~dense.any(axis=1)
    assert empty.sum() == 57  # rows 3, 10, ..., 395
    # every query tile holds empty rows and visits tiles with kept pairs, so the kernels
    # compute those rows (they are not skipped)
    assert all(empty[i:i + 128].any() for i in range(0, 400, 128))
    assert (plan_tiles(HOLEY, 128, 128).num_steps > 0).all()
    got, qkv = _run_small(HOLEY, method)
    assert (got[:, empty] == 0).all()
    np.testing.assert_allclose(got, attention_float64(*qkv, dense), **method_tolerance(method, "float32"))


@pytest.mark.parametrize("method", [
    "reference", "b3", "b1", "b2", "splash"])
def test_query_tile_with_no_kept_tile_gives_zeros(method):
    plan = plan_tiles(EMPTY_TILE_ROW, 128, 128)
    assert plan.num_steps[1] == 0 and (plan.step_class[1] == EMPTY).all()
    got, qkv = _run_small(EMPTY_TILE_ROW, method)
    assert np.isfinite(got).all()
    assert (got[:, 128:256] == 0).all()
    np.testing.assert_allclose(got, attention_float64(*qkv, EMPTY_TILE_ROW.to_dense()),
                               **method_tolerance(method, "float32"))


# -- race detection (the detector: tests/helpers.py) -------------------------------------------

@needs_race_state
def test_race_detector_can_fail():
    """Positive control: reading a VMEM buffer while a DMA into it is in flight is a race."""
    def racy(x_ref, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_ref, buf, sem.at[0])
        copy.start()
        o_ref[...] = buf[...]  # read before the wait
        copy.wait()

    x = jnp.ones((8, 128), jnp.float32)
    call = pl.pallas_call(racy, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))],
                          interpret=pltpu.InterpretParams(detect_races=True))
    _, found = races_found_in(lambda: np.asarray(call(x)))
    assert found


@needs_race_state
@pytest.mark.tpu_interpreter
@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3", "splash_dense", "splash"])
def test_no_races_under_the_tpu_interpreter(method):
    params = pltpu.InterpretParams(detect_races=True)
    (got, qkv), found = races_found_in(lambda: _run_small(SMALL, method, heads=1, interpret=params))
    assert not found, f"{method}: the interpreter reported a race"
    mask = None if method in ("dense", "splash_dense") else (b3_mask(SMALL, 128, 128) if method == "b3" else SMALL)
    np.testing.assert_allclose(got, attention_float64(*qkv, None if mask is None else mask.to_dense()), **F32)


# -- the tile body's two code paths ------------------------------------------------------------
# The tile body picks its broadcasts at trace time: lane-replicated state widened by whole
# vregs for the TPU, [rows, 1] columns for the interpreter. Both must compute the same thing,
# so the TPU path is run here in the interpreter too, with 1 (unrolled), 2 (unrolled) and 3
# (rolled) key chunks per tile and head dims below, at and above the 128 lanes.

def _tile_body_attention(q, k, v, keep, *, block_q, block_kv, block_kv_compute, body_interpret):
    """Attention over every tile of one head through `online_softmax_tile` (masking each
    tile with `keep`, or none, its key-slice loop unrolled as `forward.unroll_factor` says), the body
    told `interpret=body_interpret`; run in the interpreter."""
    from svg_lib.kernels import forward as kernels

    tokens, head_dim = q.shape
    nq, nk = tokens // block_q, tokens // block_kv

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        i, j = pl.program_id(0), pl.program_id(1)

        @pl.when(j == 0)
        def _():
            kernels.init_state(m_ref, l_ref, acc_ref)

        pl.when(j >= 0)(lambda: kernels.online_softmax_tile(
            q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep=keep, q_start=i * block_q, k_start=j * block_kv,
            block_kv_compute=block_kv_compute, interpret=body_interpret,
            unrolled=frozenset(kernels.UNROLL_ORDER)))

        @pl.when(j == nk - 1)
        def _():
            kernels.finish(m_ref, l_ref, acc_ref, o_ref, body_interpret)

    return pl.pallas_call(
        kernel, grid=(nq, nk),
        in_specs=[pl.BlockSpec((block_q, head_dim), lambda i, j: (i, 0)),
                  pl.BlockSpec((block_kv, head_dim), lambda i, j: (j, 0)),
                  pl.BlockSpec((block_kv, head_dim), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((block_q, head_dim), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=kernels.softmax_scratch(block_q, head_dim),
        interpret=True)(q * (1.0 / math.sqrt(head_dim)), k, v)


@pytest.mark.parametrize("body_interpret", [True, False], ids=["interpreter-path", "tpu-path"])
@pytest.mark.parametrize("head_dim, block_kv, block_kv_compute",
                         [(64, 384, 384), (128, 256, 128), (256, 384, 128), (128, 768, 128)],
                         ids=["d64-1chunk", "d128-2chunks", "d256-3chunks", "d128-6chunks-by-3"])
@pytest.mark.parametrize("masked", [False, True], ids=["free", "masked"])
def test_tile_body_paths_agree_with_float64(body_interpret, head_dim, block_kv, block_kv_compute, masked):
    # every body's loop unrolled as the kernels unroll it: above MAX_UNROLLED_CHUNKS by a divisor, 6 chunks
    # three at a time (two iterations of a rolled loop)
    from svg_lib.kernels.forward import unroll_factor
    assert unroll_factor(block_kv // block_kv_compute) == (3 if block_kv == 768 else block_kv // block_kv_compute)
    tokens = 768
    mask = SVGMask.spatial(VideoGeometry(6, 8, 16), 0.3)  # 768 tokens, sink and band: partial tiles
    q, k, v = (x[0] for x in random_qkv(3, 1, tokens, head_dim, "float32"))
    keep = mask.kernel_predicate(256, block_kv) if masked else None
    got = _tile_body_attention(q, k, v, keep, block_q=256, block_kv=block_kv, block_kv_compute=block_kv_compute,
                               body_interpret=body_interpret)
    want = attention_float64(q[None], k[None], v[None], mask.to_dense() if masked else None)[0]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, **F32)


# -- bad input to attention() --------------------------------------------------------------

def _qkv(n=256):
    return random_qkv(0, 1, n, 64, "float32")


MASK256 = SVGMask.spatial(VideoGeometry(2, 8, 16), 0.5)


def test_unknown_method():
    with pytest.raises(ValueError, match=r"unknown method 'b4'.*b1, b2, b3"):
        attention(*_qkv(), MASK256, method="b4")


@pytest.mark.parametrize("method", ["splash", "b1", "b2", "b3"])
def test_sparse_methods_need_a_mask(method):
    with pytest.raises(ValueError, match="needs a mask"):
        attention(*_qkv(), None, method=method)


def test_mask_must_cover_the_tokens():
    other = SVGMask.spatial(VideoGeometry(3, 8, 16), 0.5)  # 384 tokens
    with pytest.raises(ValueError, match="covers 384 tokens but q, k, v have 256"):
        attention(*_qkv(), other, method="b2")


def test_mask_must_be_a_mask_object():
    with pytest.raises(TypeError, match="Mask"):
        attention(*_qkv(), np.ones((256, 256), bool), method="b2")


def test_qkv_shapes_must_agree():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="same shape"):
        attention(q, k[:, :200], v[:, :200], method="dense")
    with pytest.raises(ValueError, match="same shape"):
        attention(q, k, v[..., :32], method="dense")
    with pytest.raises(ValueError, match=r"\[heads, tokens, head_dim\]"):
        attention(q[0], k[0], v[0], method="dense")


@pytest.mark.parametrize("method", ["reference", "dense", "b2"])
@pytest.mark.parametrize("axis, name", [(0, "heads=0"), (1, "tokens=0"), (2, "head_dim=0")])
def test_an_empty_axis_is_refused_in_words(method, axis, name):
    # an empty grid or slice would fail deep inside jax, in words about slices, not about the input
    q, _, _ = _qkv()
    empty = jnp.zeros(tuple(0 if i == axis else s for i, s in enumerate(q.shape)), q.dtype)
    with pytest.raises(ValueError, match=f"{name}: q, k and v .* need at least one head, one token"):
        attention(empty, empty, empty, MASK256, method=method)
    with pytest.raises(ValueError, match=f"{name}: .* need at least one head"):
        build_attention(MASK256, method=method, heads=empty.shape[0], tokens=empty.shape[1], head_dim=empty.shape[2],
                        dtype=q.dtype, block_q=128, block_kv=128)


def test_qkv_dtypes_must_agree():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="share a dtype"):
        attention(q, k.astype(jnp.bfloat16), v, method="dense")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int32])
def test_only_float32_and_bfloat16(dtype):
    q, k, v = (x.astype(dtype) for x in _qkv())
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        attention(q, k, v, MASK256, method="b2")


@pytest.mark.parametrize("blocks,match", [
    (dict(block_q=200), r"block_q must be a positive multiple of 128.*128 and 256"),
    (dict(block_kv=64), r"block_kv must be a positive multiple of 128"),
    (dict(block_q=0), r"block_q must be a positive multiple of 128"),
    (dict(block_kv_compute=100), r"block_kv_compute must be a positive multiple of 128"),
    (dict(block_kv=512, block_kv_compute=384), r"must divide block_kv=512.*\[128, 256, 512\]"),
])
def test_block_sizes_are_checked(blocks, match):
    for method in ("dense", "b3"):
        with pytest.raises(ValueError, match=match):
            attention(*_qkv(), MASK256, method=method, **blocks)
