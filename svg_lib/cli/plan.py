"""`python -m svg_lib plan`: the tile plan of a spatial SVG mask, in words and as an ASCII tile map."""
from __future__ import annotations

import argparse
import math

from svg_lib.cli.common import (Command, UsageError, add_json_argument, add_problem_arguments, emit_json, problem_values,
                                show)
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.masks import check_block_size
from svg_lib.core.svg_masks import SVGMask
from svg_lib.core.planner import plan_tiles
from svg_lib.teaching.plots import ascii_tile_map


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser, model=False)
    add_json_argument(parser, "also write plan.stats (the counts above, by name) as JSON to PATH")
    parser.add_argument("--max-cols", type=int, default=100, metavar="C",
                        help="widest ASCII tile map before key tiles are grouped (default 100)")


def _plan_settings(args: argparse.Namespace) -> dict:
    """The resolved plan settings: preset values overridden by explicit flags, all validated."""
    settings = problem_values(args, ("frames", "height", "width", "text_tokens", "density", "block_q", "block_kv"))
    for key in ("frames", "height", "width"):
        if settings[key] < 1:
            raise UsageError(f"--{key} must be a positive integer, got {settings[key]}")
    if settings["text_tokens"] < 0:
        raise UsageError(f"--text-tokens must be 0 or more, got {settings['text_tokens']}")
    density = settings["density"]
    if not math.isfinite(density) or not 0.0 < density <= 1.0:
        raise UsageError(f"--density must be in (0, 1] (the band's share of the pairs, e.g. 0.35), got {density}")
    for key in ("block_q", "block_kv"):
        try:
            check_block_size("--" + key.replace("_", "-"), settings[key])
        except ValueError as err:
            raise UsageError(str(err)) from None
    if args.max_cols < 1:
        raise UsageError(f"--max-cols must be a positive integer, got {args.max_cols}")
    return settings


def _describe_plan(plan, settings: dict, preset: str | None, max_cols: int) -> str:
    """The plan in words (B1, B2, B3 side by side) followed by its ASCII tile map."""
    mask, s = plan.mask, plan.stats
    g = mask.geometry
    n, nq, nk = s["tokens"], s["q_tiles"], s["kv_tiles"]
    report = mask.tile_aligned(plan.block_q, plan.block_kv, policy="balanced").report
    padding_only = s["tiles_masked"] - report.boundary_tiles
    pad_q, pad_kv = nq * plan.block_q - n, nk * plan.block_kv - n
    sink = f" + first-frame sink ({mask.sink_tokens:,} keys)" if mask.sink_tokens else " (no sink)"
    text = " + text rows/columns" if g.text_tokens else ""

    def pct(x, total):
        return f"{100.0 * x / max(total, 1):.1f}%"

    lines = [
        f"plan ({'preset ' + preset + ', ' if preset else ''}analytic: exact pair counts, no kernel runs)",
        f"  geometry      {g}",
        f"  mask          band |q - k| <= {mask.band_width:,}{sink}{text}; density {settings['density']} asked",
        f"  pair density  {s['pair_density']:.4f} ({int(plan.counts.sum()):,} of {n * n:,} pairs)",
        f"  tiles         {plan.block_q} x {plan.block_kv}: {nq} x {nk} = {s['tiles_total']:,} tiles; padding "
        f"{pad_q:,} query rows, {pad_kv:,} key columns ({s['tiles_touching_padding']} tiles touch it)",
        f"  B1 naive      visits {s['tiles_visited']:,} tiles ({pct(s['tiles_visited'], s['tiles_total'])}), "
        f"evaluates the mask on all {s['tiles_visited']:,}",
        f"  B2 full/edge  visits {s['tiles_visited']:,}, masks {s['tiles_masked']:,} "
        f"({pct(s['tiles_masked'], s['tiles_visited'])} of visited: {report.boundary_tiles} boundary, "
        f"{padding_only} only for key padding); {s['tiles_full']:,} full tiles run mask-free",
        f"  B3 aligned    visits {s['b3_tiles_visited']:,} ({pct(s['b3_tiles_visited'], s['tiles_total'])}), "
        f"masks {s['b3_tiles_masked']:,} (whole tiles: only key padding needs a mask)",
        f"                kept {report.boundary_kept} of {report.boundary_tiles} boundary tiles whole: "
        f"+{report.pairs_added:,} pairs added, -{report.pairs_dropped:,} dropped, "
        f"budget error {s['b3_budget_error']:+.4%}",
        f"  schedule      {s['grid_steps']:,} grid steps ({nq} query tiles x {plan.steps} steps)",
        "",
        ascii_tile_map(plan, max_cols=max_cols),
    ]
    return "\n".join(lines)


def _plan_run(args: argparse.Namespace) -> int:
    settings = _plan_settings(args)
    geometry = VideoGeometry(settings["frames"], settings["height"], settings["width"], settings["text_tokens"])
    mask = SVGMask.spatial(geometry, settings["density"], first_frame_sink=not args.no_sink)
    plan = plan_tiles(mask, settings["block_q"], settings["block_kv"])
    show(args, _describe_plan(plan, settings, args.preset, args.max_cols))
    emit_json(args, plan.stats)
    return 0


COMMAND = Command("plan", "tile plan of a spatial SVG mask: tiles visited and masked in B1/B2/B3",
               _plan_arguments, _plan_run)
