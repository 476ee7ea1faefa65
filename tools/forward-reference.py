"""Re-measure the forward's simulated cost per grid step: the "after" group of svg_lib/data/cost_reference.json.

    python tools/forward-reference.py

The probes (svg_lib.instruments.tpu.probes) of svg_lib's tile bodies and Splash's, compiled compile-only with libtpu
for a v6e and a v5e at 512 x 256 and at the case study's 3328 x 1536 tiles (every kind), and for a v6e
at the two other block sizes notebooks 05 and 06 price (the kinds the cost model needs there). The
"running" and "before" groups are earlier bodies, kept as committed with their own versions. Took
11 minutes on a 2-core CPU (2026-12-06, libtpu 0.0.42.1); entries are written as they finish.
Evidence kind: simulated by the TPU compiler's static profile, nothing run.
"""
import json
import time

from svg_lib.instruments.tpu.cost import REFERENCE_FILE, tile_cost
from svg_lib.instruments.tpu.probes import BLOCKS_KIND, TILE_KINDS, versions

PARTIAL_KINDS = ("free", "idle", "svg_masked")
# A v5e's static profile cannot model the DMA of Splash's resident mask block ("Unsupported DMA
# direction: 10 on VL/VLP", libtpu 0.0.42.1): its "blocks" body is probed on a v6e only.
V5E_KINDS = tuple(k for k in TILE_KINDS if k != BLOCKS_KIND)
ENTRIES = (  # target, block_q, block_kv, block_kv_compute, kernels, kinds (None: every kind)
    ("v6e", 512, 256, 256, ("svg_lib", "splash"), None),
    ("v5e", 512, 256, 256, ("svg_lib", "splash"), V5E_KINDS),
    ("v6e", 3328, 1536, 512, ("svg_lib", "splash"), None),
    ("v5e", 3328, 1536, 512, ("svg_lib", "splash"), V5E_KINDS),
    ("v6e", 1024, 1536, 1536, ("svg_lib",), PARTIAL_KINDS),
    ("v6e", 4864, 1536, 384, ("svg_lib",), PARTIAL_KINDS),
)
NOTE = (
    "after: svg_lib's tile body as committed with this file (the bounded max, checked once per query tile: "
    "a tile's first step runs on the bound and is checked, then the bound to the end if its rows pass, the "
    "step again and the running max to the end if not, `kernels.forward.visit`; free_failing prices the tile "
    "that fails) and the jax "
    "wheel's Splash: free (no mask tables), svg_masked (its mask-function path with SVGMask's predicate) and "
    "blocks (its block-mask path on full blocks: B0 as the series runs it when keys are padded; v6e only, a "
    "v5e's static profile cannot model the mask block's DMA). "
    "running: the previous committed body (the running max on every step, l replicated over lanes, the "
    "eleven-operation predicate `SVGMask.keep`; source be340177e0cb1dbf, probed on 2026-11-30, matmuls "
    "added on 2026-12-02). before: the tile body of issue 9 (state broadcast with [:, :1], key-chunk loop "
    "always unrolled), probed the same way. Partial entries probe only the kinds the cost model needs for "
    "them. Written by tools/forward-reference.py.")

data = json.loads(REFERENCE_FILE.read_text())
after = []
for target, bq, bkv, c, kernels, kinds in ENTRIES:
    start = time.perf_counter()
    extra = {} if kinds is None else {"kinds": kinds}
    cost = tile_cost(target, block_q=bq, block_kv=bkv, block_kv_compute=c, kernels=kernels, **extra)
    print(f"{target} {bq}x{bkv}: {time.perf_counter() - start:.0f} s", flush=True)
    print(cost.table(), flush=True)
    after.append({k: v for k, v in cost.to_json().items() if k != "raw"})
    # written as each entry finishes: the entries not yet re-probed keep their old ones
    old = [e for e in data["groups"]["after"] if (e["target"], e["block_q"], e["block_kv"]) not in
           {(a["target"], a["block_q"], a["block_kv"]) for a in after}]
    data.update(date=time.strftime("%Y-%m-%d"), versions=versions("forward"), note=NOTE)
    data["groups"]["after"] = after + old
    REFERENCE_FILE.write_text(json.dumps(data, indent=1) + "\n")
print(f"wrote {REFERENCE_FILE}")
