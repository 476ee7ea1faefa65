#!/usr/bin/env python3
"""What a backend's float32 exp, log and reciprocal, and its float32 matmuls at HIGHEST, do inside a
Pallas kernel, against float64 on the host: the figures behind the forward's refined log-sum-exp
(`svg_lib.kernels.forward.finish`) and the tolerances (`svg_lib.extensions.tolerances`).

    python tools/tpu-precision-probe.py [--out FILE]

On a TPU the kernel is compiled; elsewhere it runs in the interpreter (which computes what the host
does). Prints the errors as JSON; `--out` also writes them, with the device and versions.
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

HIGHEST = jax.lax.Precision.HIGHEST
# contracting dimensions of the three matmul forms the kernels use: a @ b, a @ b^T, a^T @ b
FORMS = {"NN": (((1,), (0,)), ((), ())), "NT": (((1,), (1,)), ((), ())), "TN": (((0,), (0,)), ((), ()))}


def elementwise(x_ref, exp_ref, log_ref, refined_ref, recip_ref):
    x = x_ref[...]
    exp_ref[...] = jnp.exp(x - 20.0)                  # arguments in [-19.5, 0], where softmax's exps live
    y = jnp.log(x)
    log_ref[...] = y
    refined_ref[...] = y + (x * jnp.exp(-y) - 1.0)     # one Newton step on exp(y) = x, as finish() takes
    recip_ref[...] = 1.0 / x


def errors(interpret: bool) -> dict:
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 20.0, (512, 1024)).astype(np.float32)
    spec = pl.BlockSpec((256, 1024), lambda i: (i, 0))
    outs = pl.pallas_call(elementwise, out_shape=[jax.ShapeDtypeStruct(x.shape, jnp.float32)] * 4, grid=(2,),
                          in_specs=[spec], out_specs=[spec] * 4, interpret=interpret)(x)
    x64 = x.astype(np.float64)
    want = {"exp": np.exp(x64 - 20.0), "log": np.log(x64), "log_refined": np.log(x64), "reciprocal": 1.0 / x64}
    result = {}
    for (name, w), got in zip(want.items(), outs):
        diff = np.abs(np.asarray(got, np.float64) - w)
        result[name] = {"max_abs": float(diff.max()), "max_rel": float((diff / np.abs(w)).max())}
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    for name, dims in FORMS.items():
        def matmul(a_ref, b_ref, o_ref, dims=dims):
            o_ref[...] = jax.lax.dot_general(a_ref[...], b_ref[...], dims, precision=HIGHEST,
                                             preferred_element_type=jnp.float32)
        got = pl.pallas_call(matmul, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32), interpret=interpret)(a, b)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        exact = {"NN": a64 @ b64, "NT": a64 @ b64.T, "TN": a64.T @ b64}[name]
        result[f"matmul_{name}"] = {"max_rel_to_largest": float(np.abs(np.asarray(got, np.float64) - exact).max()
                                                               / np.abs(exact).max())}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the errors here, with the device and versions")
    args = parser.parse_args(argv)
    compiled = jax.default_backend() == "tpu"
    record = {"device": jax.devices()[0].device_kind, "mode": "compiled" if compiled else "interpret",
              "jax": jax.__version__, "date": datetime.date.today().isoformat(), "errors": errors(not compiled)}
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
