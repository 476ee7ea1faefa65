"""Mixed-head attention (svg_lib.layers.routing): routing by flags, both permutation placements, no recompiles.

Interpret mode on CPU, 128-token tiles, 480 tokens (not a multiple of 128, so padding is exercised),
4 heads. The per-head reference is `reference_attention` under the spatial SVG mask for spatial heads
and under `TemporalMask` (the same band at temporal-major positions, frame-major coordinates) for
temporal heads: it never permutes anything, so it checks the permutation code independently.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svg_lib import (CompileCounter, SVGMask, TemporalMask, VideoGeometry, build_svg_attention,
                     build_svg_attention_in_kernel, compare_temporal_tiles, reference_attention, svg_attention,
                     svg_attention_in_kernel)
from svg_lib.extensions.stacked_schedules import stack_schedules
from svg_lib.methods import METHODS
from svg_lib.layers.routing import gather_heads, head_gather_index, permute_heads, plan_kind
from svg_lib.layers.synthetic import computed_mask
from helpers import needs_race_state, races_found_in

# float32 kernels vs float32 reference: summation order only (see tests/test_kernels.py for the derivation)
F32 = dict(rtol=1e-5, atol=1e-5)
GEOMETRY = VideoGeometry(5, 8, 12)  # 480 tokens
HEADS, HEAD_DIM, BLOCK = 4, 64, 128
ROUTINGS = {"all_spatial": [False] * 4, "all_temporal": [True] * 4, "mixed": [False, True, True, False],
            "mixed_other": [True, False, True, False]}


@pytest.fixture(scope="module")
def mask():
    return SVGMask.spatial(GEOMETRY, 0.35)


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(0)
    return tuple(jnp.asarray(rng.standard_normal((HEADS, GEOMETRY.tokens, HEAD_DIM)), jnp.float32) for _ in range(3))


@pytest.fixture(scope="module")
def per_kind_reference(mask, qkv):
    return reference_attention(*qkv, mask), reference_attention(*qkv, TemporalMask(mask))


@pytest.fixture(scope="module")
def layer(mask):
    return build_svg_attention(mask, method="b2", heads=HEADS, tokens=GEOMETRY.tokens, head_dim=HEAD_DIM,
                               dtype=jnp.float32, block_q=BLOCK, block_kv=BLOCK)


def expected(flags, per_kind_reference):
    spatial, temporal = per_kind_reference
    return jnp.where(jnp.asarray(flags)[:, None, None], temporal, spatial)


def test_the_two_head_kinds_really_differ(per_kind_reference):
    # otherwise every routing test below would pass with the wrong mask on some head
    spatial, temporal = per_kind_reference
    assert float(jnp.max(jnp.abs(spatial - temporal))) > 0.1


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_mixed_layer_matches_per_head_reference(routing, layer, qkv, per_kind_reference):
    flags = jnp.asarray(np.array(ROUTINGS[routing]))
    np.testing.assert_allclose(layer(*qkv, flags), expected(flags, per_kind_reference), **F32)


def test_public_entry_point_matches_and_caches(mask, qkv, per_kind_reference):
    import importlib

    cache = importlib.import_module("svg_lib.cache")._BUILT  # builds are cached there
    flags = np.array(ROUTINGS["mixed"])
    out = svg_attention(*qkv, flags, mask, method="b2", block_q=BLOCK, block_kv=BLOCK)
    np.testing.assert_allclose(out, expected(flags, per_kind_reference), **F32)
    before = len(cache)
    svg_attention(*qkv, ~flags, mask, method="b2", block_q=BLOCK, block_kv=BLOCK)
    assert len(cache) == before  # a new routing reuses the built layer


@pytest.mark.parametrize("method, routing", [("b2", "mixed_other"), ("b2", "all_temporal"), ("b1", "mixed")])
def test_in_kernel_version_equals_physical(method, routing, mask, qkv, per_kind_reference):
    flags = np.array(ROUTINGS[routing])
    in_kernel = svg_attention_in_kernel(*qkv, flags, mask, method=method, block_q=BLOCK, block_kv=BLOCK)
    # b1 and b2 are exact, so both placements compute the per-head reference
    np.testing.assert_allclose(in_kernel, expected(flags, per_kind_reference), **F32)


def test_in_kernel_b3_rounds_the_scattered_mask(mask, qkv):
    flags = np.array(ROUTINGS["mixed"])
    out = svg_attention_in_kernel(*qkv, flags, mask, method="b3", block_q=BLOCK, block_kv=BLOCK)
    for h, temporal in enumerate(flags):
        used = (TemporalMask(mask) if temporal else mask).tile_aligned(BLOCK, BLOCK)
        ref = reference_attention(*(x[h:h + 1] for x in qkv), used)
        np.testing.assert_allclose(out[h:h + 1], ref, **F32)


def test_in_kernel_predicate_matches_temporal_mask(mask):
    # jax indices take the lax.div / lax.rem path (what a kernel lowers), numpy the % and // one
    idx = np.arange(GEOMETRY.tokens + 40)  # past the end too: padding is never kept
    got = TemporalMask(mask).keep(jnp.asarray(idx)[:, None], jnp.asarray(idx)[None, :])
    np.testing.assert_array_equal(np.asarray(got), TemporalMask(mask).keep(idx[:, None], idx[None, :]))


def test_b3_temporal_heads_use_the_rounded_band_in_temporal_order(mask, qkv):
    flags = np.array(ROUTINGS["mixed"])
    out = svg_attention(*qkv, flags, mask, method="b3", block_q=BLOCK, block_kv=BLOCK)
    for h, temporal in enumerate(flags):
        used = computed_mask(mask, "temporal" if temporal else "spatial", "b3", BLOCK, BLOCK)
        ref = reference_attention(*(x[h:h + 1] for x in qkv), used)
        np.testing.assert_allclose(out[h:h + 1], ref, **F32)


@pytest.mark.parametrize("build", [build_svg_attention, build_svg_attention_in_kernel])
def test_changing_flags_never_recompiles(build, mask, qkv):
    f = build(mask, method="b2", heads=HEADS, tokens=GEOMETRY.tokens, head_dim=HEAD_DIM,
                            dtype=jnp.float32, block_q=BLOCK, block_kv=BLOCK)
    flag_sets = [jnp.asarray(np.array(ROUTINGS[name])) for name in ("all_spatial", "all_temporal", "mixed")]
    outs = []
    with CompileCounter() as counter:
        for flags in flag_sets:
            outs.append(f(*qkv, flags).block_until_ready())
    assert counter.count == 1  # the first call compiles (so the counter does count), the others reuse it
    assert f._cache_size() == 1
    assert float(jnp.max(jnp.abs(outs[0] - outs[1]))) > 0.1  # the routings really took effect


def test_counter_sees_a_real_recompilation(qkv):
    f = jax.jit(lambda x: x * 2)
    small = qkv[0][:2]  # sliced before counting: the eager slice is a compilation of its own
    with CompileCounter() as counter:
        f(qkv[0]).block_until_ready()
        f(small).block_until_ready()  # new shape: a second compilation
    assert counter.count == 2


def test_in_kernel_visits_more_tiles_than_the_band():
    stats = compare_temporal_tiles(SVGMask.spatial(VideoGeometry(8, 16, 16), 0.2), 128, 128)
    phys, ink = stats["physical"], stats["in_kernel"]
    assert phys["pair_density"] == pytest.approx(ink["pair_density"])  # same pairs, scattered differently
    assert ink["tiles_visited"] > 1.5 * phys["tiles_visited"]
    assert ink["tiles_masked"] > phys["tiles_masked"]


@pytest.mark.parametrize("flags, error", [
    (np.array([True, False]), ValueError),           # wrong length
    (np.array([1, 0, 1, 0]), TypeError),             # not booleans
])
def test_bad_flags_are_rejected(flags, error, mask, qkv):
    with pytest.raises(error, match="is_temporal"):
        svg_attention(*qkv, flags, mask, block_q=BLOCK, block_kv=BLOCK)


def test_temporal_mask_is_rejected_with_a_hint(mask, qkv):
    with pytest.raises(TypeError, match="spatial SVGMask"):
        svg_attention(*qkv, np.array(ROUTINGS["mixed"]), TemporalMask(mask), block_q=BLOCK, block_kv=BLOCK)


def test_public_layer_under_jit_compiles_once(mask, qkv, per_kind_reference):
    f = jax.jit(lambda q, k, v, flags: svg_attention(q, k, v, flags, mask, block_q=BLOCK, block_kv=BLOCK))
    for name in ("all_temporal", "mixed", "mixed_other"):
        flags = jnp.asarray(np.array(ROUTINGS[name]))
        np.testing.assert_allclose(f(*qkv, flags), expected(flags, per_kind_reference), **F32)
    assert f._cache_size() == 1


# -- one block-sparse kernel, planned at any size ------------------------------------------------

def test_in_kernel_layer_runs_the_one_block_sparse_kernel(mask, qkv, monkeypatch):
    """No second pallas_call: the routed layer calls kernels.block_sparse_attention with both
    kinds' predicates and the planner's stacked schedule."""
    import svg_lib.layers.routing as routing  # where the in-kernel routing finds the kernel

    calls = []
    real = routing.block_sparse_attention

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(routing, "block_sparse_attention", spy)
    f = build_svg_attention_in_kernel(mask, method="b2", heads=HEADS, tokens=GEOMETRY.tokens, head_dim=HEAD_DIM,
                                      dtype=jnp.float32, block_q=BLOCK, block_kv=BLOCK)
    f(*qkv, jnp.asarray(np.array(ROUTINGS["mixed"]))).block_until_ready()
    (args, kwargs), = calls
    assert len(kwargs["keep"]) == 2 and kwargs["method"] is METHODS["b2"]
    plans = [plan_kind(mask, kind, BLOCK, BLOCK) for kind in (0, 1)]
    np.testing.assert_array_equal(np.asarray(args[4]), stack_schedules(plans))
    assert kwargs["steps"] == max(p.steps for p in plans)


def test_in_kernel_b2_compiles_at_1440p(tpu_compiler):
    """Both kinds' schedules stacked (2 x 591 rows x 317 steps, packed: 735.5 KiB of SMEM with the rest) fit a
    v6e's 1 MiB; one head per kind, bf16, density 0.35, 512 x 512."""
    mask = SVGMask.spatial(VideoGeometry(21, 90, 160), 0.35)
    f = build_svg_attention_in_kernel(mask, method="b2", heads=2, tokens=mask.tokens, head_dim=128,
                                      dtype=jnp.bfloat16, block_q=512, block_kv=512, interpret=False)
    shapes = [((2, mask.tokens, 128), "bfloat16")] * 3 + [((2,), "bool")]
    compiled, seconds = tpu_compiler.compile_fn(f, shapes, target="v6e")
    print(f"in-kernel routing b2 at 1440p compiled for v6e in {seconds:.1f} s")
    assert compiled is not None


@pytest.mark.parametrize("inverse", [False, True])
def test_permute_heads_is_the_per_head_gather_without_one(inverse):
    """The layer's permutation (a transpose and a per-head select) equals the per-head row gather."""
    geometry = VideoGeometry(5, 4, 6, text_tokens=3)
    x = jnp.arange(4 * geometry.tokens * 2, dtype=jnp.float32).reshape(4, geometry.tokens, 2)
    flags = jnp.asarray([False, True, True, False])
    want = gather_heads(x, head_gather_index(flags, geometry, inverse=inverse))
    np.testing.assert_array_equal(np.asarray(permute_heads(x, flags, geometry, inverse=inverse)), np.asarray(want))


def test_the_routed_layer_lowered_for_tpu_holds_no_gather(mask):
    """Lowered for TPU (Mosaic kernels, jax.export on this CPU): around the kernel, the temporal
    heads' permutation and its inverse are transposes, not gathers."""
    f = build_svg_attention(mask, method="b2", heads=HEADS, tokens=GEOMETRY.tokens, head_dim=HEAD_DIM,
                            dtype=jnp.bfloat16, block_q=BLOCK, block_kv=BLOCK, interpret=False)
    qkv = [jax.ShapeDtypeStruct((HEADS, GEOMETRY.tokens, HEAD_DIM), jnp.bfloat16)] * 3
    from jax import export  # before jax 0.8, `jax.export` is reachable only once imported

    text = export.export(f, platforms=["tpu"])(*qkv, jax.ShapeDtypeStruct((HEADS,), jnp.bool_)).mlir_module()
    assert "tpu_custom_call" in text  # the kernel is there
    assert not re.search(r"stablehlo\.(dynamic_)?gather", text)
    assert text.count("stablehlo.transpose") >= 4  # q, k, v in; the output back


# -- TPU memory semantics ---------------------------------------------------------------------------

@needs_race_state
@pytest.mark.tpu_interpreter
@pytest.mark.parametrize("in_kernel", [False, True], ids=["physical", "in_kernel"])
def test_routed_layers_under_the_tpu_interpreter(in_kernel, mask, qkv, per_kind_reference):
    # the interpreter that simulates a TPU's memory: uninitialized VMEM reads as NaN (a kernel that
    # used a buffer before writing it would show), DMAs and accesses checked for races
    from jax.experimental.pallas import tpu as pltpu

    params = pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan")
    build = build_svg_attention_in_kernel if in_kernel else build_svg_attention
    layer = build(mask, method="b2", heads=HEADS, tokens=GEOMETRY.tokens, head_dim=HEAD_DIM, dtype=jnp.float32,
                  block_q=BLOCK, block_kv=BLOCK, interpret=params)
    flags = np.array(ROUTINGS["mixed"])
    out, found = races_found_in(lambda: np.asarray(layer(*qkv, jnp.asarray(flags))))
    assert not found, "the interpreter reported a race"
    np.testing.assert_allclose(out, expected(flags, per_kind_reference), **F32)
