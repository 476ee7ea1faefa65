"""Mosaic lowering of every kernel at the blog's full size, on a machine without a TPU.

`jax.export.export(..., platforms=["tpu"])` runs the Pallas -> Mosaic lowering here, so these
tests catch block-shape and unsupported-op errors at 75,600 tokens, and let us read what the
TPU would be handed: one `tpu_custom_call` per kernel, its operand shapes (75,600 tokens as they
are for the series' kernels; padded to whole tiles for Splash), the scalar-prefetch schedule baked in as constants, and the scoped-VMEM request.

No illegal-configuration test here: with jax 0.10.2 the Mosaic lowering accepted every odd
configuration tried (head_dim 1, 8, 96, 100; blocks of 64 or 200 passed straight to the
kernels), i.e. those would only fail in libtpu's compiler. That compiler runs on this CPU too
(tests/test_compiler.py compiles every kernel at this size and checks its refusals); svg_lib's
own checks (tests/test_kernels.py, tests/test_vmem.py) are what stop such configurations first.
"""
import functools
import re

import jax
import jax.numpy as jnp
from jax import export  # before jax 0.8, `jax.export` is reachable only once imported
import numpy as np
import pytest

from svg_lib import SVGMask, VideoGeometry, b3_mask, build_attention, estimate_vmem, plan_tiles
from svg_lib.core.planner import FULL, PARTIAL, unpack_schedule

# The blog's benchmark: Wan 2.1 720p (21 latent frames of 45 x 80), 10 heads of dim 128, bf16.
GEOMETRY = VideoGeometry(21, 45, 80)
HEADS, TOKENS, HEAD_DIM = 10, 75_600, 128
BQ, BKV = 3328, 1536
MASK = SVGMask.spatial(GEOMETRY, 0.35)
Q_LEN, KV_LEN = 23 * BQ, 50 * BKV  # 76,544 and 76,800: whole tiles


@functools.lru_cache(maxsize=None)
def exported(method):
    """(jax.export.Exported, its MLIR text) for `method` at the blog size; built once."""
    f = build_attention(MASK, method=method, heads=HEADS, tokens=TOKENS, head_dim=HEAD_DIM, dtype=jnp.bfloat16,
                        block_q=BQ, block_kv=BKV, interpret=False)
    spec = jax.ShapeDtypeStruct((HEADS, TOKENS, HEAD_DIM), jnp.bfloat16)
    exp = export.export(f, platforms=["tpu"])(spec, spec, spec)
    return exp, exp.mlir_module()


def custom_call(text):
    """The single tpu_custom_call of a module: (its line, operand types, result types)."""
    assert text.count("stablehlo.custom_call @tpu_custom_call") == 1
    assert text.count("stablehlo.custom_call @") == 1, "one kernel and no other custom call"
    start = text.index("stablehlo.custom_call @tpu_custom_call")
    line = text[start:text.index("\n", start)]
    types = re.search(r"\} : \(([^)]*)\) -> \(?([^)]*?)\)? loc", line)
    return line, types.group(1).split(", "), types.group(2).split(", ")


def int_constants(text):
    """Every non-splat integer constant of the module: {ssa name: numpy array} (little-endian)."""
    out = {}
    for m in re.finditer(r'(%\S+) = stablehlo.constant dense<"0x([0-9A-F]+)"> : tensor<([0-9x]+)xi(8|32)>', text):
        shape = tuple(int(s) for s in m.group(3).split("x"))
        dtype = np.dtype("i1") if m.group(4) == "8" else np.dtype("<i4")
        out[m.group(1)] = np.frombuffer(bytes.fromhex(m.group(2)), dtype=dtype).reshape(shape)
    return out


def test_blog_configuration():
    assert GEOMETRY.tokens == TOKENS
    assert -(-TOKENS // BQ) * BQ == Q_LEN and -(-TOKENS // BKV) * BKV == KV_LEN


@pytest.mark.parametrize("method", ["dense", "splash_dense", "splash", "b1", "b2", "b3"])
def test_lowers_to_one_mosaic_kernel(method):
    exp, text = exported(method)
    assert "tpu_custom_call" in text
    assert exp.platforms == ("tpu",)
    assert [(a.shape, a.dtype) for a in exp.out_avals] == [((HEADS, TOKENS, HEAD_DIM), jnp.bfloat16)]
    _, operands, results = custom_call(text)
    if method.startswith("splash"):
        # Splash sees q padded to whole query tiles, k and v to whole key tiles, and its output
        # is sliced back to 75,600 tokens outside it
        q, k = (f"tensor<{HEADS}x{n}x{HEAD_DIM}xbf16>" for n in (Q_LEN, KV_LEN))
        assert "stablehlo.pad" in text
    else:
        # the series' kernels see q, k and v as they are (their last tiles partial, cleared in
        # VMEM): no padded copy in HBM, no slice of the output
        q = k = f"tensor<{HEADS}x{TOKENS}x{HEAD_DIM}xbf16>"
        assert "stablehlo.pad" not in text and "stablehlo.slice" not in text
    assert operands.count(q) == 1 + 2 * (q == k) and operands.count(k) == 2 + (q == k)
    assert results[-1] == q


@pytest.mark.parametrize("method", ["b1", "b2", "b3"])
def test_block_sparse_schedule_is_baked_in(method):
    """The schedule in the module is the planner's packed table, half a word per grid step, and
    it sets the grid's length: 23 query tiles x (most tiles any query tile visits) steps per head.
    Before it come the per-head kinds (all 0: one mask for every head)."""
    _, text = exported(method)
    line, operands, _ = custom_call(text)
    assert f'kernel_name = "{method}_block_sparse_attention"' in line
    plan = plan_tiles(b3_mask(MASK, BQ, BKV) if method == "b3" else MASK, BQ, BKV)
    nq, steps = plan.grid[0], plan.steps
    words = -(-nq * steps // 2)  # two 16-bit steps per int32 word
    assert operands[:2] == [f"tensor<{HEADS}xi32>", f"tensor<{words}xi32>"]
    tables = [a for a in int_constants(text).values() if a.shape == (words,)]
    assert len(tables) == 1
    kv_index, step_class = unpack_schedule(tables[0], nq, steps)
    np.testing.assert_array_equal(kv_index, plan.kv_index)
    np.testing.assert_array_equal(step_class, plan.step_class)
    # B3 visits fewer tiles than B1/B2 at this size: a shorter grid
    steps = {m: plan_tiles(b3_mask(MASK, BQ, BKV) if m == "b3" else MASK, BQ, BKV).steps for m in ("b2", "b3")}
    assert steps["b3"] < steps["b2"]


@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3"])
def test_scoped_vmem_request_matches_the_estimate(method):
    line, _, _ = custom_call(exported(method)[1])
    want = estimate_vmem(method, BQ, BKV, HEAD_DIM, jnp.bfloat16).vmem_limit_bytes
    assert want is not None  # 40.5 MiB of tiles: more than v6e's 32 MiB default
    sizes = re.findall(r"scoped_memory_configs\\22: \[\{\\22memory_space\\22:1, \\22offset\\22: 0, "
                       r"\\22size\\22: (\d+)\}\]", line)
    assert sizes == [str(want)]


def test_dense_kernel_name():
    line, operands, _ = custom_call(exported("dense")[1])
    assert 'kernel_name = "dense_flash_attention"' in line
    assert len(operands) == 4  # q, k, v and the key-norm maxima of the bounded max: no tables


def _splash_tables(method):
    """Splash's block schedule as lowered: (data_next, block_mask), `[q tiles, steps]` int8."""
    line, operands, _ = custom_call(exported(method)[1])
    assert "splash_mha_fwd" in line
    # Splash reports its block sizes in the kernel metadata (jax 0.10: JSON, `block_q\22: 3328`;
    # older jax, the floor 0.8.1: in the kernel name, `..._block_q_3328_...`)
    for key, value in (("block_q", BQ), ("block_kv", BKV), ("block_kv_compute", 512)):
        assert re.search(rf"{key}(\\+22: |_){value}(?!\d)", line), key
    mask_type = operands[0]
    shape = tuple(int(s) for s in re.fullmatch(r"tensor<([0-9x]+)xi8>", mask_type).group(1).split("x"))
    tables = [a for a in int_constants(exported(method)[1]).values() if a.shape == shape]
    # one mask shared by all heads; the forward's two tables come first, then the tables Splash
    # builds for its backward (svg_lib gives it backward blocks, so jax.grad works)
    assert shape[0] == 1 and len(tables) >= 2
    data_next, block_mask = tables[0][0], tables[1][0]  # Splash's operand order
    assert set(np.unique(block_mask)) <= {0, 1, 2} and data_next.max() > 2
    return data_next, block_mask


def test_splash_dense_visits_every_tile():
    data_next, block_mask = _splash_tables("splash_dense")
    assert data_next.shape == (23, 50)
    np.testing.assert_array_equal(data_next, np.broadcast_to(np.arange(50), (23, 50)))
    # every tile full except the last key tile, whose columns reach into padding
    assert (block_mask[:, :-1] == FULL).all() and (block_mask[:, -1] == PARTIAL).all()


def test_splash_agrees_with_the_planner_at_blog_size():
    """Splash classifies tiles by evaluating the mask itself, block by block, on the host: an
    independent check of the planner's closed-form classes at 75,600 tokens."""
    data_next, block_mask = _splash_tables("splash")
    plan = plan_tiles(MASK, BQ, BKV)
    assert data_next.shape == plan.kv_index.shape  # the same compressed grid length
    # Splash lists a row's visits first, the planner after its idle steps: the same visits in the same order
    visited, ours = block_mask != 0, plan.step_class != 0
    np.testing.assert_array_equal(visited.sum(axis=1), ours.sum(axis=1))
    for row in range(plan.grid[0]):
        np.testing.assert_array_equal(data_next[row][visited[row]], plan.kv_index[row][ours[row]])
    # Classes agree everywhere but the last query tile: its rows past token 75,600 are
    # padding, which Splash masks (PARTIAL) while the planner lets them run mask-free (FULL)
    # because rows past the last token are never written out.
    for row in range(plan.grid[0] - 1):
        np.testing.assert_array_equal(block_mask[row][visited[row]], plan.step_class[row][ours[row]])
    splash_last, ours_last = block_mask[-1][visited[-1]], plan.step_class[-1][ours[-1]]
    differs = splash_last != ours_last
    assert differs.any()
    assert (ours_last[differs] == FULL).all() and (splash_last[differs] == PARTIAL).all()
