"""The frontier (`python -m svg_lib frontier`) as JSON, with Radial Attention's recall on its own
128 x 128 blocks (before B3 rounds it to a kernel's tiles), for notebook 13 to read.

    python notebooks/data/13_frontier.py notebooks/data/13_frontier.json

Recall: planted heads (spatial, temporal, local3d; head_dim 64) at 21 x 45 x 80 = 75,600 tokens,
computed on this CPU. Cycles: simulated by the TPU compiler's static profile (committed probes).
A few minutes (semantic tiles' k-means).
"""
import datetime
import json
import pathlib
import sys

import jax

from svg_lib import RadialMask, attention_recall
from svg_lib.instruments.tools.frontier import MASKS, frontier, planted_heads
from svg_lib.environment import libtpu_version
from svg_lib.layers.synthetic import KINDS

ROWS = 64
result = frontier(rows=ROWS, masks=MASKS)  # semantic tiles included: a few minutes
g, _, rows, q, k = planted_heads(ROWS)  # the same heads and rows the frontier used
radial = []
for decay in (0.2, 1.0, 4.0):
    mask = RadialMask(g, "wan", decay)
    recall = attention_recall(q, k, mask, rows)
    radial.append(dict(decay_factor=decay, pair_density=mask.pair_density,
                       recall_per_head=dict(zip(KINDS, map(float, recall))), recall=float(recall.mean())))
    print(radial[-1], flush=True)
result.update(radial_128_blocks=radial, date=datetime.date.today().isoformat(), jax=jax.__version__,
              libtpu=libtpu_version(), command="python notebooks/data/13_frontier.py notebooks/data/13_frontier.json")
path = pathlib.Path(sys.argv[1])
path.write_text(json.dumps(result, indent=1, default=float) + "\n")
print(f"wrote {path}")
