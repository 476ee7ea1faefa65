"""Compile a training step through semantic tiles at the case study's size for a v6e, compile-only.

    python tools/semantic-training-compile.py [--heads 10] [--block 512]

The step: `semantic_plan` (2 k-means iterations from a warm start, 20 % of key tiles), then the
gradient of a loss on `semantic_attention` with respect to q, k and v: 10 heads x 75,600 tokens x
128, bf16, 512 x 512 tiles. Prints the compile's seconds and the compiled program's temporaries
(XLA's memory analysis). Nothing runs: it shows that the step compiles for a TPU, VMEM included,
and what it holds in HBM. `svg_lib/layers/semantic.py`'s docstring quotes the result.
"""
import argparse

import jax
import jax.numpy as jnp

from svg_lib.layers.semantic import SemanticCentroids, semantic_attention, semantic_plan
from svg_lib.instruments.tpu.compiler import compile_fn

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--heads", type=int, default=10)
parser.add_argument("--tokens", type=int, default=75_600)
parser.add_argument("--block", type=int, default=512, help="block_q = block_kv")
args = parser.parse_args()
heads, tokens, head_dim, block = args.heads, args.tokens, 128, args.block
tiles = -(-tokens // block)


def step(q, k, v, cq, ck):
    plan = semantic_plan(q, k, block_q=block, block_kv=block, density=0.2, iterations=2,
                         centroids=SemanticCentroids(cq, ck))
    loss = lambda q, k, v: jnp.sum(semantic_attention(q, k, v, plan, interpret=False).astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v), plan.centroids


x, c = ((heads, tokens, head_dim), "bfloat16"), ((heads, tiles, head_dim), "float32")
compiled, seconds = compile_fn(step, [x, x, x, c, c], "v6e")
memory = compiled.memory_analysis()
print(f"v6e, compile-only, jax {jax.__version__}: {heads} heads x {tokens:,} tokens x {head_dim}, bf16, "
      f"{block} x {block} tiles: compiled in {seconds:.0f} s; temporaries {memory.temp_size_in_bytes / 2**20:,.0f} MiB, "
      f"arguments {memory.argument_size_in_bytes / 2**20:,.0f} MiB")
