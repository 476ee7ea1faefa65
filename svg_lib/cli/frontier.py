"""`python -m svg_lib frontier`: which mask reaches a given recall at the lowest predicted cost, per chip.

The arguments and the printing; what is computed, and how, is `svg_lib.instruments.tools.frontier`'s (its
docstring says what each number is and what evidence it rests on).
"""
from __future__ import annotations

import argparse
import json
import time

from svg_lib.cli.common import Command, output_file
from svg_lib.instruments.tools.frontier import DEFAULT_MASKS, MASKS, frontier, plot, table


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=64, help="query rows sampled for recall (default 64)")
    parser.add_argument("--plot", default="frontier.png", metavar="PATH", type=output_file, help="where to draw the Pareto plot")
    parser.add_argument("--masks", default=",".join(DEFAULT_MASKS), metavar="LIST",
                        help=f"comma-separated mask families of {','.join(MASKS)} (default {','.join(DEFAULT_MASKS)}; "
                             "semantic adds a few minutes of k-means on a CPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _run(args: argparse.Namespace) -> int:
    masks = tuple(m.strip() for m in args.masks.split(",") if m.strip())
    unknown = [m for m in masks if m not in MASKS]
    if unknown or not masks:
        raise ValueError(f"--masks takes a comma-separated list of {', '.join(MASKS)}; got {args.masks!r}")
    if args.rows < 1:
        raise ValueError(f"--rows must be a positive number of query rows, got {args.rows}")
    start = time.perf_counter()
    result = frontier(rows=args.rows, masks=masks, bar=True)
    plot(result, args.plot)
    result["plot"] = str(args.plot)
    result["seconds"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(result))
        return 0
    print(table(result))
    print(f"plot: {result['plot']} ({result['seconds']:.0f} s)")
    return 0


COMMAND = Command("frontier", "recall vs predicted time per mask (SVG bands, radial, sliding tiles, pooled) per chip",
                  _arguments, _run)
