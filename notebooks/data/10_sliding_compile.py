"""Compile notebook 10's sliding-tile B3 kernel for a TPU v6e at the case study's size, compile-only
on this CPU, and record what the TPU compiler reported as JSON (notebook 10 reads it).

    python notebooks/data/10_sliding_compile.py notebooks/data/10_sliding_compile.json

Takes about a minute: the real TPU compiler (libtpu) compiles one Mosaic kernel for 10 heads.
"""
import datetime
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from svg_lib import SlidingTileMask, build_attention
from svg_lib.environment import libtpu_version
from svg_lib.problem import get_preset
from svg_lib.instruments.tpu.compiler import compile_fn

blog = get_preset("blog")                       # 21 x 45 x 80 = 75,600 tokens
tile, window, block, heads = (3, 8, 80), (3, 5, 1), 1920, blog.heads   # notebook 10's pick, section 4
mask = SlidingTileMask(blog.geometry, tile, window)
out_path = pathlib.Path(sys.argv[1])

start = time.perf_counter()
kernel = build_attention(mask, method="b3", heads=heads, tokens=mask.tokens, head_dim=blog.head_dim,
                         dtype=jnp.bfloat16, block_q=block, block_kv=block, interpret=False, generation="v6e")
build_s = time.perf_counter() - start
compiled, compile_s = compile_fn(kernel, [((heads, mask.tokens, blog.head_dim), "bfloat16")] * 3, "v6e")
memory = compiled.memory_analysis()
out_path.write_text(json.dumps({
    "what": "notebook 10's sliding-tile mask through method='b3' on tile-major q, k, v, compiled for TPU v6e "
            "(compile-only topology v6e:1x1, libtpu on a CPU; nothing ran)",
    "problem": dict(frames=blog.geometry.frames, height=blog.geometry.height, width=blog.geometry.width,
                    tokens=mask.tokens, heads=heads, head_dim=blog.head_dim, dtype="bfloat16",
                    tile=list(tile), window=list(window), block_q=block, block_kv=block),
    "date": datetime.date.today().isoformat(), "jax": jax.__version__, "libtpu": libtpu_version(),
    "machine": f"{os.cpu_count()}-core CPU shared with other jobs",
    "build_s": build_s, "compile_s": compile_s,
    "argument_bytes": int(memory.argument_size_in_bytes), "output_bytes": int(memory.output_size_in_bytes),
    "temp_bytes": int(memory.temp_size_in_bytes), "code_bytes": int(memory.generated_code_size_in_bytes),
    "command": "python notebooks/data/10_sliding_compile.py notebooks/data/10_sliding_compile.json",
}, indent=1) + "\n")
print(out_path.read_text())
