"""Compile Radial Attention's block mask through B3 for TPU v5e and v6e at the case study's size,
compile-only on this CPU, and record what the TPU compiler reported as JSON.

    python notebooks/data/13_radial_compile.py notebooks/data/13_radial_compile.json

The mask is `RadialMask` over the case study's 21 x 45 x 80 = 75,600 tokens (Wan 2.1 with its
first-frame sink, decay 1.0), 10 heads, head_dim 128, bf16. Two block sizes: 128 x 128, the
reference's own blocks (B3 runs the table as it is), and 512 x 256 (B3 rounds the table to those
tiles, keeping its pair budget). Each compile takes a minute or more; they run one after another.
"""
import datetime
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from svg_lib import build_attention, plan_tiles
from svg_lib.extensions.radial import RadialMask
from svg_lib.environment import libtpu_version
from svg_lib.problem import get_preset
from svg_lib.instruments.tpu.compiler import compile_fn

blog = get_preset("blog")
heads, head_dim = blog.heads, blog.head_dim
mask = RadialMask(blog.geometry, "wan", 1.0)
out_path = pathlib.Path(sys.argv[1])
records = []
for chip in ("v5e", "v6e"):
    for block_q, block_kv in ((128, 128), (512, 256)):
        computed = mask.tile_aligned(block_q, block_kv)
        plan = plan_tiles(computed, block_q, block_kv)
        record = dict(chip=chip, block_q=block_q, block_kv=block_kv, grid=list(plan.grid), steps=plan.steps,
                      visited_tiles=int(plan.visited.sum()), pair_density=computed.pair_density)
        try:
            start = time.perf_counter()
            kernel = build_attention(mask, method="b3", heads=heads, tokens=mask.tokens, head_dim=head_dim,
                                     dtype=jnp.bfloat16, block_q=block_q, block_kv=block_kv, interpret=False,
                                     generation=chip)
            record["build_s"] = time.perf_counter() - start
            compiled, record["compile_s"] = compile_fn(kernel, [((heads, mask.tokens, head_dim), "bfloat16")] * 3,
                                                       chip)
            memory = compiled.memory_analysis()
            record.update(compiled=True, temp_bytes=int(memory.temp_size_in_bytes),
                          argument_bytes=int(memory.argument_size_in_bytes),
                          code_bytes=int(memory.generated_code_size_in_bytes))
        except Exception as error:  # a refusal is a result too: record what the compiler said
            record.update(compiled=False, error=f"{type(error).__name__}: {str(error)[:400]}")
        records.append(record)
        print(record, flush=True)

out_path.write_text(json.dumps({
    "what": "RadialMask (Wan 2.1 rules, first-frame sink, decay 1.0) through method='b3', compiled for TPU v5e and "
            "v6e (compile-only topologies, libtpu on a CPU; nothing ran)",
    "problem": dict(frames=blog.geometry.frames, height=blog.geometry.height, width=blog.geometry.width,
                    tokens=mask.tokens, heads=heads, head_dim=head_dim, dtype="bfloat16",
                    mask_pair_density=mask.pair_density),
    "date": datetime.date.today().isoformat(), "jax": jax.__version__, "libtpu": libtpu_version(),
    "machine": f"{os.cpu_count()}-core CPU shared with other jobs",
    "compiles": records,
    "command": "python notebooks/data/13_radial_compile.py notebooks/data/13_radial_compile.json",
}, indent=1) + "\n")
print(out_path.read_text())
