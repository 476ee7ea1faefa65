"""Recall at equal computed pairs, per head, on heads built from the real clip: the tables of
issue 32 (deliver 6), recorded as JSON beside the notebook that prints them from its own run.

    python notebooks/data/12_recall_tables.py notebooks/data/12_recall_tables.json

Heads (`layers.clip_heads.clip_qkv`, 8 frames x 24 x 40 patches = 7,680 tokens, head_dim 64):
two content heads (seeds 0 and 1), a mixed one, and the planted position heads (`structured_qkv`'s
spatial, temporal and local3d on the clip's grid). `semantic_quality.recall_table` at 20 % of the
pairs (SVG's band without sink, rounded to tiles, sets the budget), 128 and 256-token tiles,
recall over 128 sampled queries, the router deciding on 256 others. CPU, jax as installed.
"""
import datetime
import json
import pathlib
import sys
import time

import jax
import numpy as np

from svg_lib.layers.clip_heads import clip_qkv, load_clip
from svg_lib.layers.profiling import sample_rows
from svg_lib.layers.semantic_quality import recall_table

KINDS = ["content", "mixed", "spatial", "temporal", "local3d"]
DENSITY, ROWS, ROUTE_ROWS, ITERATIONS = 0.2, 128, 256, 10

out_path = pathlib.Path(sys.argv[1])
frames = load_clip()
heads = []
for seed in (0, 1):  # two draws of the random projections: the content heads differ, the position ones too
    q, k, _, geometry = clip_qkv(frames, KINDS, seed=seed)
    heads.append((q, k, [f"{kind}/{seed}" for kind in KINDS]))
q = np.concatenate([np.asarray(h[0]) for h in heads])
k = np.concatenate([np.asarray(h[1]) for h in heads])
names = sum((h[2] for h in heads), [])
rows = sample_rows(geometry.tokens, ROWS, 0)
route_rows = np.setdiff1d(sample_rows(geometry.tokens, ROUTE_ROWS + ROWS, 1), rows)[:ROUTE_ROWS]
tables = {}
for block in (128, 256):
    start = time.perf_counter()
    table = recall_table(q, k, geometry=geometry, block_q=block, block_kv=block, density=DENSITY, rows=rows,
                         route_rows=route_rows, iterations=ITERATIONS, names=names)
    tables[f"{block}x{block}"] = table
    print(f"{block}x{block}: {time.perf_counter() - start:.0f} s", flush=True)
    for r in table:
        print(f"  {r['head']:12s} computed {r['computed']:.3f}/{r['semantic_computed']:.3f} band {r['best_band']:.3f} "
              f"tiles {r['tile_kmeans']:.3f} cut {r['cut_kmeans']:.3f} svg2 ideal {r['svg2_ideal']:.3f} on tiles "
              f"{r['svg2_tiles']:.3f} (x{r['svg2_waste']:.2f} pairs) router {r['choice']} {r['routed']:.3f}", flush=True)
out_path.write_text(json.dumps({
    "what": "recall (dense softmax mass inside the computed pairs, mean over sampled queries) per head at equal "
            "computed pairs: semantic_quality.recall_table",
    "heads": "layers.clip_heads.clip_qkv on svg_lib/data/clip_bbb.npz (Big Buck Bunny, CC BY 3.0), seeds 0 and 1",
    "geometry": str(geometry), "density": DENSITY, "rows": ROWS, "route_rows": ROUTE_ROWS, "iterations": ITERATIONS,
    "device": "CPU", "jax": jax.__version__, "date": datetime.date.today().isoformat(),
    "tables": tables,
    "command": "python notebooks/data/12_recall_tables.py notebooks/data/12_recall_tables.json",
}, indent=1) + "\n")
