"""Gradients through the series' kernels (svg_lib.kernels.backward) against float64 and jax.grad."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from svg_lib import attention, b3_mask, plan_tiles, reference_attention
from svg_lib.extensions.references import attention_gradients_float64
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.core.planner import EMPTY, FULL, PARTIAL, schedule_rows, unpack_schedule
from svg_lib.memory.vmem import estimate_vmem
from helpers import EMPTY_TILE_ROW, HOLEY, method_tolerance, needs_race_state, races_found_in, random_qkv

# 315 tokens: padded to 384 queries (3 tiles of 128) and 512 keys (2 tiles of 256), each key
# tile in 2 slices of 128, so padding, several chunks and non-square tiles are all exercised.
MASK = SVGMask.spatial(VideoGeometry(3, 7, 15), 0.35)
BLOCKS = dict(block_q=128, block_kv=256, block_kv_compute=128)
METHODS = ["dense", "b1", "b2", "b3", "splash_dense", "splash"]
# Tolerances: helpers.method_tolerance (svg_lib/extensions/tolerances.py says why): float32 rounding, bf16
# inputs with p and ds rounded to bf16, and on a TPU Splash's one-pass products and the TPU's rounding.


def kernel_grads(q, k, v, dout, mask, method, interpret=None, backward=None, **blocks):
    def loss(q, k, v):
        out = attention(q, k, v, mask, method=method, interpret=interpret, backward=backward, **(blocks or BLOCKS))
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def computed_mask(mask, method, block_q=128, block_kv=256):
    """The mask a method computes: none for the dense ones, B3's rounded one for b3."""
    if method in ("dense", "splash_dense"):
        return None
    return b3_mask(mask, block_q, block_kv) if method == "b3" else mask


def assert_grads_close(got, want, tol):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        g = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        assert np.isfinite(g).all(), f"{name} has non-finite values"
        np.testing.assert_allclose(g, w, **tol, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_float64(method, dtype):
    q, k, v = random_qkv(3, 2, MASK.tokens, 128, dtype)
    dout = random_qkv(4, 2, MASK.tokens, 128, dtype)[0]
    mask = computed_mask(MASK, method)
    got = kernel_grads(q, k, v, dout, None if mask is None else MASK, method)
    assert_grads_close(got, attention_gradients_float64(q, k, v, dout, None if mask is None else mask.to_dense()),
                      method_tolerance(method, dtype, "gradients"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3"])
def test_split_backward_matches_float64(method, dtype):
    """The two-kernel backward (a dq kernel, then a dk/dv kernel), which runs where one head's dq
    does not fit in VMEM beside the fused kernel; at this size None picks the fused one."""
    q, k, v = random_qkv(3, 2, MASK.tokens, 128, dtype)
    dout = random_qkv(4, 2, MASK.tokens, 128, dtype)[0]
    mask = computed_mask(MASK, method)
    got = kernel_grads(q, k, v, dout, None if mask is None else MASK, method, backward="split")
    assert_grads_close(got, attention_gradients_float64(q, k, v, dout, None if mask is None else mask.to_dense()),
                      method_tolerance(method, dtype, "gradients"))


def _pallas_calls(jaxpr):
    """Every pallas_call equation in `jaxpr`, nested jaxprs included."""
    from jax.extend import core as jex_core
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (list, tuple)) else [param]):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jex_core.Jaxpr):
                    yield from _pallas_calls(inner)


def _kernel_name(eqn) -> str:
    """A pallas_call's name: its `name` parameter in recent jax; in jax 0.7 the first word of its kernel
    jaxpr's source info ("name at file:line")."""
    return eqn.params.get("name") or eqn.params["jaxpr"].debug_info.func_src_info.split()[0]


@pytest.mark.parametrize("backward", ["fused", "split"])
def test_which_backward_kernels_a_gradient_runs(backward):
    """jax.grad runs the form asked for: the fused kernel alone, or the dq and dk/dv kernels. Dense's
    backward, like its forward, reads no table (no scalar prefetch): its tiles come from program ids,
    so the compiler's static profile, which reads SMEM as 0, simulates every step as what it is."""
    q, k, v = random_qkv(3, 1, MASK.tokens, 128, "float32")
    for method in ("dense", "b2"):
        loss = lambda q, k, v: jnp.sum(attention(q, k, v, None if method == "dense" else MASK,  # noqa: E731
                                                 method=method, backward=backward, **BLOCKS))
        calls = list(_pallas_calls(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr))
        names = sorted(_kernel_name(c) for c in calls)
        want = [f"{method}_attention_fused_bwd"] if backward == "fused" else [f"{method}_attention_dkv",
                                                                                f"{method}_attention_dq"]
        assert [n for n in names if "bwd" in n or "attention_d" in n] == want, names
        prefetch = {_kernel_name(c): c.params["grid_mapping"].num_index_operands for c in calls}
        expected = 0 if method == "dense" else 1
        assert all(prefetch[n] == expected for n in want), prefetch


def test_the_fused_backward_is_taken_where_one_heads_dq_fits():
    """None picks the fused kernel while one head's f32 dq fits in VMEM beside it, else the split one;
    asking for the fused one where it does not fit says what to do instead."""
    from svg_lib import PRESETS
    from svg_lib.core.planner import plan_tiles as plan_of
    from svg_lib.memory.budget import check_memory
    blog = PRESETS["blog"]
    q_len = -(-blog.tokens // blog.block_q) * blog.block_q
    plan = plan_of(b3_mask(blog.mask(), blog.block_q, blog.block_kv), blog.block_q, blog.block_kv)
    common = dict(heads=1, head_dim=128, dtype=jnp.bfloat16, block_q=blog.block_q, block_kv=blog.block_kv,
                  block_kv_compute=blog.block_kv_compute, plan=plan, tables=plan.tables)
    budget = check_memory("b3", generation="v6e", q_len=q_len, **common)
    assert budget.backward_form == "fused" and budget.backward_limits()[0] == "fused"
    fused = budget.backward[0]
    assert fused.scratch >= 4 * q_len * 128  # one head's whole dq, f32
    # 1440p: 302,400 tokens, one head's dq is 148 MiB, more than a v6e's VMEM: the split kernels
    long = 4 * q_len
    assert check_memory("b3", generation="v6e", q_len=long, **common).backward_form == "split"
    with pytest.raises(ValueError, match="backward='split'"):
        check_memory("b3", generation="v6e", q_len=long, backward="fused", **common).backward_limits()
    with pytest.raises(ValueError, match="backward must be one of"):
        check_memory("b3", generation="v6e", q_len=q_len, backward="fast", **common)
    with pytest.raises(ValueError, match="q_len"):
        estimate_vmem("b3:fused", 512, 512, 128, jnp.bfloat16)


def test_a_wrong_mask_is_told_apart():
    """Negative control: B2's gradients are not those of the mask one token narrower."""
    q, k, v = random_qkv(3, 1, MASK.tokens, 128, "float32")
    dout = random_qkv(4, 1, MASK.tokens, 128, "float32")[0]
    narrower = SVGMask(MASK.geometry, MASK.band_width - 1, MASK.sink_tokens)
    got = kernel_grads(q, k, v, dout, MASK, "b2")
    wrong = attention_gradients_float64(q, k, v, dout, narrower.to_dense())
    assert max(float(np.max(np.abs(np.asarray(g) - w))) for g, w in zip(got, wrong)) > 1e-3


@pytest.mark.parametrize("mask, method", [(HOLEY, "b1"), (HOLEY, "b2"), (EMPTY_TILE_ROW, "b2"),
                                          (EMPTY_TILE_ROW, "b3")])
def test_rows_that_keep_no_key_get_zero_gradients(mask, method):
    q, k, v = random_qkv(7, 1, mask.tokens, 64, "float32")
    dout = random_qkv(8, 1, mask.tokens, 64, "float32")[0]
    blocks = dict(block_q=128, block_kv=128)
    got = kernel_grads(q, k, v, dout, mask, method, **blocks)
    dense = computed_mask(mask, method, 128, 128).to_dense()
    keyless = ~dense.any(axis=1)
    assert keyless.any()
    assert (np.asarray(got[0])[:, keyless] == 0).all(), "a row that keeps no key must get dq = 0"
    assert_grads_close(got, attention_gradients_float64(q, k, v, dout, dense), method_tolerance(method, "float32", "gradients"))


def test_transposed_schedule_visits_each_tile_once_from_the_keys():
    plan = plan_tiles(MASK, 128, 128)
    q_index, step_class, num_steps = plan.transposed_tables
    nq, nk = plan.grid
    seen = np.zeros((nq, nk), int)
    for j in range(nk):
        idle = q_index.shape[1] - num_steps[j]  # a row's idle steps come first
        for s in range(q_index.shape[1]):
            if s >= idle:
                assert step_class[j, s] == plan.classes[q_index[j, s], j] != EMPTY
                seen[q_index[j, s], j] += 1
            else:  # idle: no class, on the query tile the row visits first (copied once)
                assert step_class[j, s] == EMPTY and q_index[j, s] == q_index[j, min(idle, q_index.shape[1] - 1)]
    assert (seen == plan.visited).all()
    rows, cls = unpack_schedule(plan.transposed_schedule, nk, q_index.shape[1])
    assert (rows == q_index).all() and (cls == step_class).all()


def test_schedule_rows_of_a_column_with_nothing_idles_on_the_resident_tile():
    classes = np.array([[FULL, EMPTY, PARTIAL], [EMPTY, EMPTY, FULL]], np.int8).T  # key tiles as rows
    index, step_class, num_steps = schedule_rows(classes)
    assert num_steps.tolist() == [1, 0, 2]
    assert index[1].tolist() == [0, 0]  # nothing to visit: stays on the tile row 0 left resident
    assert (step_class[1] == EMPTY).all()


@needs_race_state
@pytest.mark.tpu_interpreter
@pytest.mark.parametrize("method, backward", [("dense", "fused"), ("b2", "fused"), ("b3", "fused"),
                                              ("dense", "split"), ("b3", "split")])
def test_backward_kernels_have_no_races(method, backward):
    """Under the interpreter that simulates a TPU's memory, DMAs and semaphores: the fused kernel's
    copy of dq to HBM included."""
    q, k, v = random_qkv(3, 1, MASK.tokens, 128, "float32")
    dout = random_qkv(4, 1, MASK.tokens, 128, "float32")[0]
    params = pltpu.InterpretParams(detect_races=True)
    got, found = races_found_in(lambda: [np.asarray(g) for g in kernel_grads(q, k, v, dout, MASK, method,
                                                                                 interpret=params, backward=backward)])
    assert not found, f"{method}: the interpreter reported a race in the {backward} backward"
    mask = computed_mask(MASK, method)
    assert_grads_close(got, attention_gradients_float64(q, k, v, dout, None if mask is None else mask.to_dense()), method_tolerance(method, "float32", "gradients"))


def test_backward_vmem_estimates():
    dq = estimate_vmem("b3:dq", 3328, 1536, 128, jnp.bfloat16, 512, "v6e")
    dkv = estimate_vmem("b3:dkv", 3328, 1536, 128, jnp.bfloat16, 512, "v6e")
    assert dq.fits and dkv.fits
    # per-tile values as the compiler was measured to keep them (compile-only v5p: 15 and 18 MiB in
    # all at these tiles), not every value as if live at once: training fits a 64 MiB chip
    for e, measured in ((dq, 15), (dkv, 18)):
        assert measured * 2**20 < e.total < 1.5 * measured * 2**20
        assert estimate_vmem(e.method, 3328, 1536, 128, jnp.bfloat16, 512, "v5p").fits
    assert dkv.scratch == 2 * 4 * 1536 * 128  # f32 dk and dv accumulators
    f32 = estimate_vmem("b3:dkv", 3328, 1536, 128, jnp.float32, 512, "v6e")
    assert f32.intermediates > 2 * dkv.intermediates  # float32 operands: the MXU's six bf16 passes and their parts
    with pytest.raises(ValueError, match="stage in"):
        estimate_vmem("splash:dq", 512, 512, 128, jnp.bfloat16)
    with pytest.raises(ValueError, match="pass"):
        estimate_vmem("b3:dx", 512, 512, 128, jnp.bfloat16)


def test_backward_that_overflows_vmem_is_refused_when_the_gradient_is_traced():
    """Blocks whose forward fits a v4 but whose dk/dv kernel does not: the forward builds and
    runs; taking the gradient raises the VMEM error instead of compiling something that fails."""
    from svg_lib.attention import build_attention
    head_dim, dtype = 128, jnp.float32
    # the dk/dv and fused kernels double-buffer k, v, dk and dv blocks where the forward has k and v
    bq, bkv, c = next((bq, bkv, c) for bkv in (512, 1024, 2048, 4096) for bq in range(256, 4097, 256)
                      for c in (128, 256, 512)
                      if estimate_vmem("dense", bq, bkv, head_dim, dtype, c, "v4").fits
                      and not estimate_vmem("dense:dkv", bq, bkv, head_dim, dtype, c, "v4").fits)
    f = build_attention(None, method="dense", heads=1, tokens=bq, head_dim=head_dim, dtype=dtype,
                        block_q=bq, block_kv=bkv, block_kv_compute=c, interpret=True, generation="v4")
    q = jax.ShapeDtypeStruct((1, bq, head_dim), dtype)
    assert jax.eval_shape(f, q, q, q).shape == q.shape
    with pytest.raises(ValueError, match="overflows VMEM"):
        jax.eval_shape(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v)), argnums=(0, 1, 2)), q, q, q)


@pytest.mark.parametrize("method", ["b2", "b3"])
def test_gradients_with_padding_inside_the_sequence(method):
    """A sliding-tile mask pads each 3-D cube: padded query rows run unmasked and are zeroed,
    padded keys are masked. Neither may leak into a gradient: every one matches float64."""
    from svg_lib.extensions.sliding import SlidingTileMask
    mask = SlidingTileMask(VideoGeometry(3, 5, 16), (1, 4, 32), (1, 3, 1))  # 128-token cubes, padding inside
    assert mask.tokens > VideoGeometry(3, 5, 16).tokens
    q, k, v = random_qkv(11, 1, mask.tokens, 64, "float32")
    dout = random_qkv(12, 1, mask.tokens, 64, "float32")[0]
    got = kernel_grads(q, k, v, dout, mask, method, block_q=128, block_kv=128)
    assert_grads_close(got, attention_gradients_float64(q, k, v, dout, computed_mask(mask, method, 128, 128).to_dense()),
                       method_tolerance(method, "float32", "gradients"))

@pytest.mark.parametrize("method", ["b3", "splash"])
def test_attention_first_called_under_jit_and_grad_caches_no_tracer(method):
    """attention() plans on its first call and caches the result; when that call is traced (a
    jitted training step), the cached kernel must not hold the trace's tracers: later eager
    calls and gradients must still work, and agree with the traced ones."""
    mask = SVGMask.spatial(VideoGeometry(3, 8, 16), 0.35)
    q, k, v = random_qkv(9, 1, mask.tokens, 64, "float32")

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, mask, method=method, block_q=128, block_kv=128) ** 2)

    traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    eager = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    out = attention(q, k, v, mask, method=method, block_q=128, block_kv=128)
    assert np.isfinite(np.asarray(out)).all()
    for t, e in zip(traced, eager):
        np.testing.assert_allclose(np.asarray(t), np.asarray(e), rtol=1e-5, atol=1e-6)
