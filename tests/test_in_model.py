"""svg_lib inside a model: every method under the caller's own `jax.jit` and `jax.grad`, for a TPU.

A model calls `svg_lib.attention(...)` from inside its own jitted training step, so nothing
the library builds may need to be the outermost jit. In particular Splash's raised VMEM limit
used to be a `jax.jit(..., compiler_options=...)` of ours, which jax refuses below a caller's
jit ("compiler_options can only be passed to top-level jax.jit"); it now travels in Splash's
own pallas_call CompilerParams (`svg_lib.kernels.splash.with_vmem_limit`).

Three kinds of check, at the small preset (10,080 tokens, 2 heads of 128, bf16, 512 x 256):
  * lowered for TPU with `jax.export` (no libtpu needed; the only check that runs under a jax
    whose libtpu cannot compile): the caller's jit holds the forward and the backward kernels;
  * compiled for a v6e by libtpu (compile-only, nothing runs): every Pallas method's forward
    and `jax.grad` in one caller's program, about 7 to 11 s each on a CPU core;
  * Splash at the blog's tiles (3328 x 1536) on 6,000 tokens, where a v6e's 32 MiB default
    scoped VMEM refuses it: nested in a caller's jit it carries its raised limit and compiles,
    and without that limit the compiler refuses it (the slowest tests here, named `..._slow`).
"reference" (jax.numpy) is lowered but not compiled: XLA takes minutes to compile its
gradient for a TPU at these sizes (about 40 s at 384 tokens, 12 minutes at 10,080), and it
holds no Pallas kernel.

Compile tests take the `tpu_compiler` fixture: they skip without libtpu, and fail instead under
SVG_LIB_REQUIRE_TPU_COMPILER=1 (`make test`).
"""
from __future__ import annotations

import importlib
import re

import jax
from jax import export as jax_export  # a submodule jax 0.7 does not import by itself
import jax.numpy as jnp
import numpy as np
import pytest

import svg_lib
from svg_lib.attention import METHODS
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.problem import PRESETS
from svg_lib.memory.vmem import estimate_vmem

SMALL = PRESETS["small"]
SHAPE = (SMALL.heads, SMALL.geometry.tokens, SMALL.head_dim)
PALLAS = tuple(m for m in METHODS if m != "reference")
SPLASH = ("splash_dense", "splash")

# Splash at the blog's tiles on a problem of two query tiles: one head, 6,000 tokens (key
# padding, so splash_dense holds a partial mask block: 43.88 MiB, over a v6e's 32 MiB default)
BIG_TILES = dict(block_q=3328, block_kv=1536)
BIG_TOKENS = 6_000
BIG_SHAPE = (1, BIG_TOKENS, 128)


def caller_model(method, *, mask_fn=SMALL.mask, block_q=SMALL.block_q, block_kv=SMALL.block_kv):
    """A model's step: attention inside the caller's code, its output and the gradient of a loss.

    The mask is built afresh on every call, as a model would (`preset.mask()`): equal masks
    must find the kernel already built."""
    def attend(q, k, v):
        return svg_lib.attention(q, k, v, mask_fn(), method=method, block_q=block_q, block_kv=block_kv,
                                 interpret=False)

    def loss(q, k, v):
        return jnp.sum(jnp.square(attend(q, k, v).astype(jnp.float32)))

    def step(q, k, v):
        return attend(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    return step


def structs(shape, dtype):
    return [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))] * 3


def custom_calls(text: str) -> list[str]:
    """The lines of a lowered module that call a Mosaic (Pallas TPU) kernel."""
    return [line for line in text.splitlines() if "tpu_custom_call" in line and "stablehlo.custom_call" in line]


_SCOPED = re.compile(r'"scoped_memory_configs": \[\{[^}]*"size": (\d+)')


def scoped_limits(text: str) -> list[int | None]:
    """Each Mosaic kernel's VMEM limit as its custom call's config carries it (None: the default).

    The config is JSON inside an MLIR string, whose quotes print as \\22."""
    return [int(m.group(1)) if (m := _SCOPED.search(line.replace("\\22", '"'))) else None
            for line in custom_calls(text)]


# -- lowered for TPU (jax.export, no libtpu) ----------------------------------------------------

@pytest.fixture(scope="module")
def exported():
    """{method: jax.export.Exported} of `caller_model(method)` at the small preset, each lowered once."""
    return {}


def _export(exported, method):
    if method not in exported:
        exported[method] = jax_export.export(jax.jit(caller_model(method)), platforms=["tpu"])(
            *structs(SHAPE, SMALL.dtype))
    return exported[method]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_lowers_for_tpu_inside_a_callers_jit_and_grad(method, exported):
    exp = _export(exported, method)
    assert exp.platforms == ("tpu",)
    assert [tuple(a.shape) for a in exp.out_avals] == [SHAPE] * 4  # the output and q, k, v's gradients
    assert all(a.dtype == jnp.bfloat16 for a in exp.out_avals)
    calls = custom_calls(exp.mlir_module())
    if method == "reference":
        assert calls == []  # jax.numpy throughout
    else:
        # a forward, the forward again with its residuals for the gradient, and the backward
        # kernel(s): Splash's fused dq/dk/dv, or our dq and dk/dv (svg_lib.kernels.backward)
        assert len(calls) >= 3, f"{method}: {len(calls)} Pallas kernels in the caller's program"


@pytest.mark.parametrize("method", SPLASH)
def test_splash_asks_for_what_the_estimate_says_at_the_small_preset(method, exported):
    # at 512 x 256 a v6e's default scoped VMEM holds Splash: it asks for no limit of its own
    form = "blocks"  # the small preset needs key padding, and is below the computable threshold
    e = estimate_vmem(method, SMALL.block_q, SMALL.block_kv, SMALL.head_dim, SMALL.dtype, generation="v6e",
                      splash_mask=form)
    assert e.vmem_limit_bytes is None
    assert scoped_limits(_export(exported, method).mlir_module()) == [None] * 3


def _big_splash(method):
    mask = None if method == "splash_dense" else SVGMask.spatial(VideoGeometry(6, 25, 40), 0.35)
    assert mask is None or mask.tokens == BIG_TOKENS
    return caller_model(method, mask_fn=lambda: mask, **BIG_TILES)


@pytest.mark.parametrize("method", SPLASH)
def test_splash_vmem_limit_travels_with_every_kernel_inside_a_callers_jit(method):
    e = estimate_vmem(method, **BIG_TILES, head_dim=128, dtype=jnp.bfloat16, generation="v6e",
                      splash_mask="blocks")
    assert e.total > 32 * 2**20 and e.vmem_limit_bytes > e.total  # the default would not do
    exp = jax_export.export(jax.jit(_big_splash(method)), platforms=["tpu"])(*structs(BIG_SHAPE, jnp.bfloat16))
    # the forward, the forward with residuals and the fused backward: all three at the raised limit
    assert scoped_limits(exp.mlir_module()) == [e.vmem_limit_bytes] * 3


def test_a_cached_trace_without_the_limit_does_not_take_its_place():
    # Splash's entry point is a jax.jit whose trace cache keys on shapes and static arguments,
    # not on our limit: a kernel of the same shapes traced first without a limit must not hand
    # its trace (no limit) to the one that has it
    from svg_lib.kernels.splash import make_splash

    common = dict(tokens=BIG_TOKENS, heads=1, q_len=2 * 3328, kv_len=4 * 1536, block_q=3328, block_kv=1536,
                  block_kv_compute=512, interpret=False)
    plain = make_splash(None, **common)
    limited = make_splash(None, **common, vmem_limit_bytes=80 * 2**20)
    q = jax.ShapeDtypeStruct((1, 2 * 3328, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 4 * 1536, 128), jnp.bfloat16)
    lower = lambda fn: jax.jit(fn).trace(q, kv, kv).lower(lowering_platforms=("tpu",)).as_text()  # noqa: E731
    assert scoped_limits(lower(plain)) == [None]
    assert scoped_limits(lower(limited)) == [80 * 2**20]
    assert scoped_limits(lower(plain)) == [None]  # and the limit did not stay behind


def test_a_splash_that_bypasses_pallas_call_is_refused_loudly():
    # if a jax's Splash ever stopped calling pl.pallas_call through its module, the limit would
    # be lost silently; svg_lib refuses instead
    from svg_lib.kernels.splash import _trace_with_limit

    with pytest.raises(RuntimeError, match="could not give them their VMEM limit of 64.0 MiB"):
        _trace_with_limit(64 * 2**20, lambda x: x, 1)


# -- compiled for a v6e by libtpu -----------------------------------------------------------------

@pytest.mark.parametrize("method", PALLAS)
def test_every_pallas_method_compiles_inside_a_callers_jit_and_grad(method, tpu_compiler):
    fn = jax.jit(caller_model(method))
    compiled, _ = tpu_compiler.compile_fn(fn, [(SHAPE, SMALL.dtype)] * 3, "v6e")
    memory = compiled.memory_analysis()
    array_bytes = int(np.prod(SHAPE)) * 2
    assert memory.argument_size_in_bytes == 3 * array_bytes
    # the output and three gradients (and the output tuple's small table of their addresses)
    assert 4 * array_bytes <= memory.output_size_in_bytes <= 4 * array_bytes + 4096


def test_splash_at_the_blog_tiles_compiles_nested_slow(tpu_compiler):
    """splash_dense, forward and gradient, in a caller's jit at 3328 x 1536 for a v6e: it needs
    its raised VMEM limit (the next test shows the default refusing it)."""
    fn = jax.jit(_big_splash("splash_dense"))
    verdict = tpu_compiler.compile_verdict(fn, [(BIG_SHAPE, jnp.bfloat16)] * 3, "v6e")
    assert verdict["ok"], verdict["summary"] or verdict["error"]


def test_splash_at_the_blog_tiles_is_refused_without_its_limit_slow(tpu_compiler):
    # the same forward kernel in a caller's jit, without the limit: refused for its scoped VMEM,
    # so the compile above is the limit's doing
    from svg_lib.kernels.splash import make_splash

    kernel = make_splash(None, tokens=BIG_TOKENS, heads=1, q_len=2 * 3328, kv_len=4 * 1536, block_q=3328,
                         block_kv=1536, block_kv_compute=512, interpret=False)

    def step(q, k, v):
        pad = ((0, 0), (0, 4 * 1536 - BIG_TOKENS), (0, 0))
        return kernel(jnp.pad(q, ((0, 0), (0, 2 * 3328 - BIG_TOKENS), (0, 0))), jnp.pad(k, pad), jnp.pad(v, pad))

    verdict = tpu_compiler.compile_verdict(jax.jit(step), [(BIG_SHAPE, jnp.bfloat16)] * 3, "v6e")
    assert not verdict["ok"] and verdict["stage"] == "vmem", verdict
    e = estimate_vmem("splash_dense", **BIG_TILES, head_dim=128, dtype=jnp.bfloat16, generation="v6e")
    assert "Scoped allocation" in verdict["error"] and e.vmem_limit_bytes > 32 * 2**20


# -- an equal mask reuses the built kernel --------------------------------------------------------

@pytest.fixture
def counted_builds(monkeypatch):
    """The methods `attention()` builds for, in order, from an empty cache."""
    attention_module = importlib.import_module("svg_lib.attention")
    builds = []
    real = attention_module.build_attention

    def counting(*args, **kwargs):
        builds.append(kwargs["method"])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_module, "build_attention", counting)
    built = importlib.import_module("svg_lib.cache")  # where attention() keeps what it built
    monkeypatch.setattr(built, "_BUILT", type(built._BUILT)())
    return builds


@pytest.mark.parametrize("method", ["b2", "splash"])
def test_a_mask_built_again_reuses_the_kernel(method, counted_builds):
    tiny = PRESETS["tiny"]
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((tiny.heads, tiny.geometry.tokens, tiny.head_dim)), jnp.float32)
               for _ in range(3))
    run = lambda mask: svg_lib.attention(q, k, v, mask, method=method, block_q=tiny.block_q,  # noqa: E731
                                         block_kv=tiny.block_kv, interpret=True)
    first, second = tiny.mask(), tiny.mask()
    assert first is not second and first == second
    out = run(first)
    np.testing.assert_array_equal(run(second), out)
    assert counted_builds == [method]  # the second, equal mask found the first one's kernel
    other = SVGMask.spatial(tiny.geometry, 0.6)
    assert other != first
    run(other)
    assert counted_builds == [method, method]  # a different mask is built for


def test_a_model_step_traced_twice_builds_each_method_once(counted_builds):
    # two traces of a caller's step (a fresh mask each time): one build, for forward and gradient
    # alike (export traces; nothing is compiled or run)
    for _ in range(2):
        jax_export.export(jax.jit(caller_model("b3")), platforms=["tpu"])(*structs(SHAPE, SMALL.dtype))
    assert counted_builds == ["b3"]
