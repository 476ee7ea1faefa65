"""Compile jax.grad through B3 for a TPU v6e at the case study's size, compile-only on this CPU,
and record what the TPU compiler reported as JSON (notebook 11 reads it).

    python notebooks/data/11_backward_compile.py notebooks/data/11_backward_compile.json

Takes minutes: the real TPU compiler (libtpu) compiles the forward and the backward (the fused kernel,
which build_attention picks at this size on a v6e).
"""
import datetime
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from svg_lib import build_attention
from svg_lib.instruments.tpu.compiler import compile_fn
from svg_lib.environment import libtpu_version
from svg_lib.problem import get_preset
from svg_lib.memory.vmem import estimate_vmem

blog = get_preset("blog")  # 21 x 45 x 80 = 75,600 tokens, blocks 3328 x 1536
out_path = pathlib.Path(sys.argv[1])
records = []
for heads in (1, blog.heads):
    start = time.perf_counter()
    f = build_attention(blog.mask(), method="b3", heads=heads, tokens=blog.tokens, head_dim=blog.head_dim,
                        dtype=jnp.bfloat16, block_q=blog.block_q, block_kv=blog.block_kv, interpret=False,
                        generation="v6e")
    build_s = time.perf_counter() - start
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    compiled, compile_s = compile_fn(grad, [((heads, blog.tokens, blog.head_dim), "bfloat16")] * 3, "v6e")
    memory = compiled.memory_analysis()
    records.append(dict(heads=heads, build_s=build_s, compile_s=compile_s,
                        argument_bytes=int(memory.argument_size_in_bytes),
                        output_bytes=int(memory.output_size_in_bytes),
                        temp_bytes=int(memory.temp_size_in_bytes),
                        code_bytes=int(memory.generated_code_size_in_bytes)))
    print(records[-1], flush=True)
    del compiled, grad, f

q_len = -(-blog.tokens // blog.block_q) * blog.block_q  # the fused backward holds a head's dq for the rows of whole query tiles
estimates = {name: estimate_vmem(name, blog.block_q, blog.block_kv, blog.head_dim, jnp.bfloat16, None, "v6e",
                                 q_len=q_len).total
             for name in ("b3", "b3:fused", "b3:dq", "b3:dkv")}
out_path.write_text(json.dumps({
    "what": "jax.grad of sum(attention(q, k, v, method='b3')) w.r.t. q, k, v, compiled for TPU v6e "
            "(compile-only topology v6e:1x1, libtpu on a CPU; nothing ran)",
    "problem": dict(frames=blog.geometry.frames, height=blog.geometry.height, width=blog.geometry.width,
                    tokens=blog.tokens, head_dim=blog.head_dim, dtype="bfloat16", density=blog.density,
                    block_q=blog.block_q, block_kv=blog.block_kv),
    "date": datetime.date.today().isoformat(), "jax": jax.__version__, "libtpu": libtpu_version(),
    "machine": "2-core CPU shared with other jobs",
    "vmem_estimate_bytes": estimates,
    "compiles": records,
    "command": "python notebooks/data/11_backward_compile.py notebooks/data/11_backward_compile.json",
}, indent=1) + "\n")
