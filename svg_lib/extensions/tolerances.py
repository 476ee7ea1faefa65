"""The series' tolerances, in one place per dtype: what the tests, the notebooks and the checkers compare with.

Each figure bounds what rounding does to a right answer, with the reason beside it, and stays far
below what a wrong answer changes (a wrong mask, a missing rescale: O(1) changes in these problems).
The references they are measured against are float64 (`svg_lib.extensions.references.attention_float64`,
`attention_gradients_float64`) or float32 at float32 precision (`reference_attention`), both on the
same inputs as the kernel (bf16 inputs upcast exactly). Every matmul of the kernels states its
precision (`svg_lib.kernels.forward.matmul_precision`), so these hold on a TPU as in the CPU interpreter.
"""
from __future__ import annotations

import numpy as np

# bfloat16 keeps 8 significant bits: rounding to it moves a value by up to 2^-8 of itself
BF16_ROUNDOFF = 2.0 ** -8

ATTENTION = {
    # float32 in, float32 accumulation like the reference, in another order (online softmax over
    # tiles, rescaled as the running max grows): a few float32 ulps of the output (measured worst
    # element ~2.4e-6 over a few hundred keys). At one bf16 pass per matmul (a TPU's default for
    # float32 operands, had the kernels not asked for HIGHEST) notebook 07's check errs by 6.4e-3.
    "float32": dict(rtol=1e-5, atol=1e-5),
    # bf16 in: q * 1/sqrt(D) rounded to bf16 (~0.4 % of each logit), p rounded to bf16 for the p @ v
    # matmul, the output rounded to bf16 (0.4 % of |out| <= ~3, i.e. 0.012). Measured worst element
    # ~1.2e-2 against float64.
    "bfloat16": dict(rtol=1e-2, atol=2e-2),
}

GRADIENTS = {
    # dq, dk, dv against float64: float32 rounding through two passes of rebuilt softmax weights
    "float32": dict(rtol=1e-4, atol=1e-4),
    # bf16 q, k, v, dO; the kernels round p and ds to bf16 before their matmuls, over ~300 keys
    "bfloat16": dict(rtol=3e-2, atol=3e-2),
}

# Splash attention's matmuls take no precision argument: with float32 operands they run at the
# backend's default, which on a TPU is one bf16 pass of the MXU (the CPU interpreter computes true
# float32). Its float32 results on a TPU then carry bf16 products: q and k rounded to bf16 move each
# logit by ~0.4 %, p and v rounded the same for p @ v, as bfloat16 inputs are (the forward takes the
# bfloat16 tolerance); the gradients round twice more (dp = do v^T and ds k) on top. Measured on a
# TPU v5e (float32, 315 tokens, 2 heads): forward worst element 1.4e-2, gradients 4.0e-2.
ONE_BF16_PASS = {"attention": dict(rtol=1e-2, atol=2e-2), "gradients": dict(rtol=6e-2, atol=6e-2)}

# float32 gradients on a TPU need no tolerance of their own: the kernels' matmuls ask for HIGHEST,
# and the forward refines its log-sum-exp past the TPU's float32 log (`kernels.forward.finish`;
# CONTRIBUTING.md, "The log-sum-exp refined past the TPU's log").

# A learner's float32 code in the exercises (E1), against float64: the learner may order the float32
# work any way it likes (and jnp's reductions differ by backend), and the mistakes the checker names
# are O(1); 2e-3 is between the two. The learner's own matmuls run at its backend's default
# precision, one bf16 pass on a TPU; the checker adds `one_bf16_pass_slack` for them.
LEARNER = {"float32": dict(rtol=2e-3, atol=2e-3)}


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return {"float32": "float32", "bfloat16": "bfloat16"}.get(name, name)


def tolerance(dtype, kind: str = "attention", *, one_bf16_pass: bool = False) -> dict:
    """`dict(rtol=..., atol=...)` for results of `dtype` ("float32" or "bfloat16", or the dtype itself).

    kind: "attention" (outputs, `ATTENTION`), "gradients" (`GRADIENTS`) or "learner" (`LEARNER`).
    `one_bf16_pass`: float32 results whose matmuls ran at one bf16 pass (Splash on a TPU:
    `ONE_BF16_PASS`); bfloat16 results are unchanged by it. Pass the result to
    `np.testing.assert_allclose(got, want, **tolerance(...))`.
    """
    if one_bf16_pass and _dtype_name(dtype) == "float32" and kind in ONE_BF16_PASS:
        return dict(ONE_BF16_PASS[kind])
    tables = {"attention": ATTENTION, "gradients": GRADIENTS, "learner": LEARNER}
    if kind not in tables:
        raise ValueError(f"kind must be one of {sorted(tables)}, got {kind!r}")
    name = _dtype_name(dtype)
    if name not in tables[kind]:
        raise ValueError(f"no {kind} tolerance for dtype {name!r}; the series has them for {sorted(tables[kind])}")
    return dict(tables[kind][name])


def one_bf16_pass_slack(abs_a, abs_b):
    """The most one bf16 pass of the MXU can move `a @ b` from its exact value, given `|a|` and `|b|`.

    One pass rounds each float32 operand to bf16 (up to `BF16_ROUNDOFF` of itself) and multiplies
    exactly, accumulating in float32: the product moves by at most (2u + u^2) |a| @ |b|. Doubled for
    the float32 work around it. NumPy arrays in, a float64 array shaped like `a @ b` out.
    """
    u = BF16_ROUNDOFF
    return 2 * (2 * u + u * u) * (np.asarray(abs_a, np.float64) @ np.asarray(abs_b, np.float64))
