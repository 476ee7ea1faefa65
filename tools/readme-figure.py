#!/usr/bin/env python3
"""Draw the README's picture, docs/tile-maps.png: the case study's problem (75,600 tokens, the SVG
spatial mask at density 0.35 with the first-frame sink) on 3328 x 1536 tiles, as B1, B2 and B3
treat each tile: skipped, masked, or mask-free. Analytic plans only (svg_lib's planner and
plotting code); nothing runs a kernel, so the picture is the same on every machine.

    python tools/readme-figure.py              # writes docs/tile-maps.png
    python tools/readme-figure.py out.png      # ... or another path
"""
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from svg_lib import get_preset, plan_tiles  # noqa: E402
from svg_lib.core.planner import PARTIAL  # noqa: E402
from svg_lib.methods import METHODS, PLANNED_METHODS  # noqa: E402
from svg_lib.teaching.plots import plot_tile_maps, stage_classes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(out: Path) -> None:
    blog = get_preset("blog")
    bq, bkv = blog.block_q, blog.block_kv
    mask = blog.mask()
    stages = list(PLANNED_METHODS)  # each planned stage's plan is that of the mask its kernel computes
    plans = [plan_tiles(METHODS[stage].computed_mask(mask, bq, bkv), bq, bkv) for stage in stages]
    titles = [f"{stage.upper()}: {plan.stats['tiles_visited']} of {plan.stats['tiles_total']} tiles visited,\n"
              f"{int((stage_classes(plan, stage) == PARTIAL).sum())} masked"
              for plan, stage in zip(plans, stages)]
    fig = plot_tile_maps(plans, stages=stages, titles=titles, panel_size=3.2,
                         title=f"{mask.tokens:,} tokens, {bq} x {bkv} tiles: what each kernel does with each tile")
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "tile-maps.png")
