"""float32 means float32 on every backend: every matmul of the kernels, the backward kernels and the
references states its precision (`svg_lib.kernels.forward.matmul_precision`).

With float32 operands Mosaic's and XLA:TPU's default matmul is one bf16 pass; only the CPU
interpreter computes true float32 by default, so a CPU cannot show the difference by running. The
tests here look at what the kernels ask for instead: the precision of every `dot_general` in the
traced kernels, the Mosaic kernels lowered for TPU (`jax.export`), and a compile for a v6e by the
real TPU compiler. One test emulates a single bf16 pass on the CPU to show that the series'
float32 tolerance tells the two apart.
"""
from __future__ import annotations

import base64
import collections
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from svg_lib import SVGMask, VideoGeometry, attention, build_attention, reference_attention
from svg_lib.kernels import forward as kernels
from svg_lib.kernels.forward import matmul_precision
from svg_lib.extensions.references import attention_float64
from svg_lib.extensions.tolerances import tolerance

MASK = SVGMask.spatial(VideoGeometry(3, 8, 16), 0.35)  # 384 tokens: 3 x 3 tiles of 128, some partial
HIGHEST, DEFAULT = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT


def test_matmul_precision_follows_the_dtype():
    assert matmul_precision(jnp.float32) == HIGHEST and matmul_precision(np.float32) == HIGHEST
    assert matmul_precision(jnp.bfloat16) == DEFAULT


def _dot_precisions(jaxpr, inside_kernel=False, found=None):
    """{(inside a pallas_call?, operand dtype): Counter of precisions} over every dot_general, recursively."""
    found = collections.defaultdict(collections.Counter) if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            precision = eqn.params["precision"]
            # dot_general stores None or a pair (one per operand) of Precision values
            pair = (DEFAULT, DEFAULT) if precision is None else tuple(
                DEFAULT if p is None else jax.lax.Precision(p) for p in precision)
            found[(inside_kernel, str(eqn.invars[0].aval.dtype))][pair] += 1
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _dot_precisions(inner, inside_kernel or eqn.primitive.name == "pallas_call", found)
    return found


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["dense", "b1", "b2", "b3"])
def test_every_kernel_matmul_states_its_precision(method, dtype):
    """Forward, dq and dk/dv kernels: HIGHEST on both operands for float32, DEFAULT for bf16."""
    f = build_attention(None if method == "dense" else MASK, method=method, heads=1, tokens=MASK.tokens, head_dim=128,
                        dtype=dtype, block_q=128, block_kv=128, interpret=False)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    arg = jax.ShapeDtypeStruct((1, MASK.tokens, 128), jnp.dtype(dtype))
    found = _dot_precisions(jax.make_jaxpr(grad)(arg, arg, arg).jaxpr)
    in_kernels = {dt: counts for (inside, dt), counts in found.items() if inside}
    assert set(in_kernels) == {dtype}, found  # every kernel matmul takes the inputs' dtype
    want = (HIGHEST, HIGHEST) if dtype == "float32" else (DEFAULT, DEFAULT)
    assert set(in_kernels[dtype]) == {want}, in_kernels
    # the forward's 2 matmuls, dq's 3 and dk/dv's 4, once per tile body the kernels carry
    assert sum(in_kernels[dtype].values()) >= 2 + 3 + 4


def test_reference_attention_states_its_precision():
    arg = jax.ShapeDtypeStruct((1, MASK.tokens, 16), jnp.float32)
    found = _dot_precisions(jax.make_jaxpr(lambda q, k, v: reference_attention(q, k, v, MASK))(arg, arg, arg).jaxpr)
    assert dict(found) == {(False, "float32"): collections.Counter({(HIGHEST, HIGHEST): 2})}
    # bf16 inputs are upcast first: the reference computes in float32 at float32 precision either way
    arg16 = jax.ShapeDtypeStruct((1, MASK.tokens, 16), jnp.bfloat16)
    found16 = _dot_precisions(jax.make_jaxpr(lambda q, k, v: reference_attention(q, k, v))(arg16, arg16, arg16).jaxpr)
    assert set(found16) == {(False, "float32")} and set(found16[(False, "float32")]) == {(HIGHEST, HIGHEST)}


def test_one_bf16_pass_would_break_the_float32_tolerance(monkeypatch):
    """Negative control: the kernels' tile body at one bf16 pass (a TPU's default for float32,
    emulated here by rounding both operands to bf16) misses the float32 tolerance by far; at the
    precision it states (true float32 on this CPU) it meets it."""
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (2, MASK.tokens, 64), jnp.float32) for key in keys)
    want = attention_float64(q, k, v, MASK)
    stated = np.asarray(attention(q, k, v, MASK, method="b2", block_q=128, block_kv=128))
    np.testing.assert_allclose(stated, want, **tolerance("float32"))

    def one_bf16_pass(a, b, dims):
        return jax.lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), dims,
                                   preferred_element_type=jnp.float32)

    monkeypatch.setattr(kernels, "dot", one_bf16_pass)
    jax.clear_caches()  # the kernel above is traced and cached: trace it again with the patched body
    try:
        one_pass = np.asarray(attention(q, k, v, MASK, method="b2", block_q=128, block_kv=128))
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    error = float(np.max(np.abs(one_pass - want)))
    assert error > 30 * tolerance("float32")["atol"], error
    assert error < tolerance("bfloat16")["atol"]  # still attention: bf16-sized errors, not a wrong mask


# -- lowered and compiled for TPU ---------------------------------------------------------------

def _mosaic_kernels(module_text: str) -> list:
    """The Mosaic MLIR text of each kernel a TPU export serialized, or [] where this jax's private
    MLIR bindings (used only here, to read the kernels back) are not importable."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.lib import tpu
        from jax._src.lib.mlir import ir
        from jaxlib.mlir.passmanager import PassManager
    except ImportError:
        return []
    found = []
    for config in re.findall(r'backend_config = "((?:[^"\\]|\\.)*)"', module_text):
        # MLIR escapes bytes as \XX (hex); the config is JSON holding the kernel as base64 bytecode
        raw = re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), config)
        if "custom_call_config" not in raw:
            continue
        body = base64.b64decode(json.loads(raw)["custom_call_config"]["body"])
        ctx = mlir.make_ir_context()
        tpu.register_dialect(ctx)
        with ctx, ir.Location.unknown():
            ctx.allow_unregistered_dialects = True
            module = ir.Module.parse(body)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
            found.append(str(module))
    return found


@pytest.mark.parametrize("backward", ["fused", "split"])
@pytest.mark.parametrize("dtype,precision", [("float32", "#tpu.contract_precision<fp32>"), ("bfloat16", None)])
def test_mosaic_lowering_accepts_the_stated_precision(dtype, precision, backward):
    """jax.export lowers the forward and the backward's kernels (the fused one, or dq and dk/dv) for
    TPU with the precision stated: Mosaic's matmuls carry contract_precision fp32 for float32 inputs,
    and no override for bf16."""
    f = build_attention(MASK, method="b2", heads=1, tokens=MASK.tokens, head_dim=128, dtype=dtype,
                        block_q=128, block_kv=128, interpret=False, backward=backward)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    arg = jax.ShapeDtypeStruct((1, MASK.tokens, 128), jnp.dtype(dtype))
    text = export.export(jax.jit(grad), platforms=["tpu"])(arg, arg, arg).mlir_module()
    want = (["b2_attention_fused_bwd"] if backward == "fused" else ["b2_attention_dkv", "b2_attention_dq"])
    assert sorted(re.findall(r'kernel_name = "(\w+)"', text)) == want + ["b2_block_sparse_attention"]
    bodies = _mosaic_kernels(text)
    if not bodies:
        pytest.skip("this jax's MLIR bindings cannot read the serialized kernels back")
    assert len(bodies) == len(want) + 1
    for body in bodies:
        matmuls = re.findall(r"tpu\.matmul[^\n]*", body)
        assert matmuls, body[:500]
        for line in matmuls:
            if precision is None:
                assert "contract_precision" not in line, line
            else:
                assert precision in line, line


def test_float32_kernels_at_highest_compile_for_a_v6e(tpu_compiler):
    """The real TPU compiler (libtpu, compile-only v6e) takes the float32 forward and gradient."""
    from svg_lib.problem import BenchConfig

    config = BenchConfig(geometry=MASK.geometry, heads=1, head_dim=128, density=0.35, block_q=128, block_kv=128,
                         dtype="float32")
    report = tpu_compiler.compile_for_tpu(config, "b2", "v6e")
    assert report.ok, report.line()
    verdict = tpu_compiler.compile_gradient(config, "b2", "v6e")
    assert verdict["ok"], verdict["error"]
