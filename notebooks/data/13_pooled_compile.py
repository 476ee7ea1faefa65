"""Compile the pooled-estimate mask (plan, device tables and B3 forward in one program) for TPU v5e
and v6e at the case study's size, compile-only on this CPU, and record what the compiler reported.

    python notebooks/data/13_pooled_compile.py notebooks/data/13_pooled_compile.json

75,600 tokens, 10 heads, head_dim 128, bf16, density 0.3 (top-k, OR-ed with a window of one frame,
3,600 tokens), tiles of 128 x 128 and 512 x 256. Also records the mask's bytes (`mask_bytes`: the
tile table and the device tables) and, from a compile of the plan alone for this CPU, the bytes
XLA allocates for it.
"""
import datetime
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from svg_lib.environment import libtpu_version
from svg_lib.layers.pooled import mask_bytes, pooled_attention, pooled_plan
from svg_lib.problem import get_preset
from svg_lib.instruments.tpu.compiler import compile_fn

blog = get_preset("blog")
heads, tokens, head_dim = blog.heads, blog.geometry.tokens, blog.head_dim
density, window = 0.3, blog.geometry.frame_tokens
out_path = pathlib.Path(sys.argv[1])
shape = (heads, tokens, head_dim)
records = []
for block_q, block_kv in ((128, 128), (512, 256)):
    def plan_only(q, k):
        return pooled_plan(q, k, block_q=block_q, block_kv=block_kv, density=density, window=window)

    spec = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    plan_shape = jax.eval_shape(plan_only, spec, spec)
    cpu = jax.jit(lambda q, k: plan_only(q, k).tiles).lower(spec, spec).compile().memory_analysis()
    parts = mask_bytes(heads, tokens, block_q, block_kv, plan_shape.steps)
    for chip in ("v5e", "v6e"):
        def run(q, k, v):
            return pooled_attention(q, k, v, plan_only(q, k), interpret=False, generation=chip)

        record = dict(chip=chip, block_q=block_q, block_kv=block_kv, steps=plan_shape.steps, mask_bytes=parts,
                      plan_on_cpu=dict(output_bytes=int(cpu.output_size_in_bytes), temp_bytes=int(cpu.temp_size_in_bytes)))
        try:
            compiled, record["compile_s"] = compile_fn(run, [(shape, "bfloat16")] * 3, chip)
            memory = compiled.memory_analysis()
            record.update(compiled=True, temp_bytes=int(memory.temp_size_in_bytes),
                          code_bytes=int(memory.generated_code_size_in_bytes))
        except Exception as error:  # a refusal is a result too
            record.update(compiled=False, error=f"{type(error).__name__}: {str(error)[:400]}")
        records.append(record)
        print(record, flush=True)

out_path.write_text(json.dumps({
    "what": "pooled-estimate mask (top-k at density 0.3 OR-ed with a one-frame window): plan, device tables and the "
            "B3 forward in one jitted program, compiled for TPU v5e and v6e (compile-only topologies, libtpu on a CPU; "
            "nothing ran)",
    "problem": dict(tokens=tokens, heads=heads, head_dim=head_dim, dtype="bfloat16", density=density, window=window),
    "date": datetime.date.today().isoformat(), "jax": jax.__version__, "libtpu": libtpu_version(),
    "machine": f"{os.cpu_count()}-core CPU shared with other jobs",
    "compiles": records,
    "command": "python notebooks/data/13_pooled_compile.py notebooks/data/13_pooled_compile.json",
}, indent=1) + "\n")
print(out_path.read_text())
