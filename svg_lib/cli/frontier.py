"""`python -m svg_lib frontier`: which mask reaches a given recall at the lowest predicted cost, per chip.

The arguments and the printing; what is computed, and how, is `svg_lib.instruments.tools.frontier`'s (its
docstring says what each number is and what evidence it rests on).
"""
from __future__ import annotations

import argparse
import time

from svg_lib.cli.common import (OUTPUT_NOTE, Command, add_json_argument, create_parent, emit_json, json_to_stdout,
                                output_file, say, write_json)
from svg_lib.instruments.tools.frontier import DEFAULT_MASKS, MASKS, frontier, plot, table
from svg_lib.instruments.tools.frontier_records import DEFAULT_POLICY, DENOISING_STEPS, RECORD_MASKS, run
from svg_lib.layers.plan_reuse import RefreshPolicy

SEMANTIC_NOTE = "semantic tiles run k-means at 75,600 tokens: minutes on a CPU"


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=64, help="query rows sampled for recall (default 64)")
    parser.add_argument("--plot", default="frontier.png", metavar="PATH", type=output_file,
                        help=f"where to draw the Pareto plot{OUTPUT_NOTE}")
    parser.add_argument("--masks", metavar="LIST",
                        help=f"comma-separated mask families of {','.join(MASKS)} (default {','.join(DEFAULT_MASKS)}, "
                             f"and with --json {','.join(RECORD_MASKS)}; {SEMANTIC_NOTE})")
    add_json_argument(parser, "write every cost on the frontier as JSON records to PATH instead of the table: per "
                              "mask, chip, head kind of the clip (content, mixed, spatial, temporal, local3d at 75,600 "
                              "tokens) and recall target, attention + plan (amortized) + permutation ms "
                              "(svg_lib.instruments.tools.frontier_records); its default masks add semantic tiles, "
                              "whose plan and permutation the records price")
    parser.add_argument("--refresh-every", type=int, default=DEFAULT_POLICY.every, metavar="STEPS",
                        help=f"with --json: semantic tiles plan again every STEPS of the {DENOISING_STEPS}-step run "
                             f"(default {DEFAULT_POLICY.every}; 0: never after the first)")


def _masks(args: argparse.Namespace) -> tuple[str, ...]:
    """The mask families to price: --masks, else the mode's default (the records' adds semantic tiles,
    since pricing their plan and permutation is what the records are for)."""
    if args.masks is None:
        return RECORD_MASKS if args.json else DEFAULT_MASKS
    masks = tuple(m.strip() for m in args.masks.split(",") if m.strip())
    if not masks or any(m not in MASKS for m in masks):
        raise ValueError(f"--masks takes a comma-separated list of {', '.join(MASKS)}; got {args.masks!r}")
    return masks


def _announce(args: argparse.Namespace, masks: tuple[str, ...]) -> None:
    """One line before the minutes of work: what is priced, what the mode added, and what is slow."""
    added = [] if args.masks else [m for m in masks if m not in DEFAULT_MASKS]
    line = f"frontier{' --json' if args.json else ''}: {', '.join(masks)}"
    if added:
        line += (f" ({', '.join(added)} added to the table's masks: the records price their plan and permutation; "
                 f"--masks {','.join(DEFAULT_MASKS)} leaves {'it' if len(added) == 1 else 'them'} out)")
    if "semantic" in masks:
        line += f"; {SEMANTIC_NOTE}"
    say(line)


def _run(args: argparse.Namespace) -> int:
    masks = _masks(args)
    if args.rows < 1:
        raise ValueError(f"--rows must be a positive number of query rows, got {args.rows}")
    if args.refresh_every < 0:
        raise ValueError(f"--refresh-every must be a number of steps >= 1, or 0 for never, got {args.refresh_every}")
    _announce(args, masks)
    start = time.perf_counter()
    if args.json:
        policy = RefreshPolicy(every=args.refresh_every or None)
        result = run(rows=args.rows, masks=masks, policy=policy, bar=True)
        result["seconds"] = time.perf_counter() - start
        result["command"] = "python -m svg_lib frontier --json PATH" + (f" --rows {args.rows}" if args.rows != 64 else "")
        if json_to_stdout(args):
            emit_json(args, result)
        else:  # one line saying how many, where and how long, in place of emit_json's "wrote PATH"
            write_json(args.json, result)
            print(f"wrote {len(result['records'])} records to {args.json} ({result['seconds']:.0f} s)")
        return 0
    result = frontier(rows=args.rows, masks=masks, bar=True)
    plot(result, create_parent(args.plot))
    result["plot"] = str(args.plot)
    result["seconds"] = time.perf_counter() - start
    print(table(result))
    print(f"plot: {result['plot']} ({result['seconds']:.0f} s)")
    return 0


COMMAND = Command("frontier", "recall vs predicted time per mask (SVG bands, radial, sliding tiles, pooled) per chip",
                  _arguments, _run)
