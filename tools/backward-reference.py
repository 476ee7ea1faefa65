"""Re-measure the backward's simulated cost per grid step and write svg_lib/data/backward_cost_reference.json.

    python tools/backward-reference.py

The probes (svg_lib.instruments.tpu.probes) of our fused and split backward kernels and Splash's, mask-free and
SVG-masked, and the backward's floor (the fused tile's five matmuls alone), compiled compile-only
with libtpu for a v6e and a v5e at 512 x 256 and at the case study's 3328 x 1536 tiles. Takes
about half an hour on a 2-core CPU; notebook 11 and `python -m svg_lib cost --backward` read the
result. Evidence kind: simulated by the TPU compiler's static profile, nothing run.
"""
import time

from svg_lib.instruments.tpu.cost import backward_tile_cost, save_backward_reference

TILES = ((512, 256, 256), (3328, 1536, 512))
costs = []
for target in ("v6e", "v5e"):
    for bq, bkv, c in TILES:
        start = time.perf_counter()
        costs.append(backward_tile_cost(target, block_q=bq, block_kv=bkv, block_kv_compute=c,
                                        kinds=("free", "svg_masked")))
        print(f"{target} {bq}x{bkv}: {time.perf_counter() - start:.0f} s", flush=True)
        print(costs[-1].table(), flush=True)
path = save_backward_reference(costs, note=(
    "cycles per grid step of each backward kernel; the split backwards (ours, Splash's default) run a dq step "
    "and a dk/dv step per visited tile, the fused ones (ours, Splash's) one step; matmuls: the fused tile's "
    "five matmuls alone, the backward's floor"))
print(f"wrote {path}")
