"""Command line: `python -m svg_lib <command> ...`.

    python -m svg_lib plan --preset blog                  # the plan in words + ASCII tile map
    python -m svg_lib plan --preset blog --block-q 1024   # a preset with one value overridden
    python -m svg_lib compile --preset blog --target v6e  # compile every kernel for a TPU v6e (libtpu)
    python -m svg_lib plan --frames 21 --height 45 --width 80 --density 0.35 \\
        --block-q 3328 --block-kv 1536 --json             # plan.stats as one JSON object

Adding a command: write `add_arguments(parser)` and `run(args) -> int` in its own
module, define `COMMAND = Command(name, help, add_arguments, run)` there, and add the
module's name to `COMMAND_MODULES` below. Keep jax imports inside `run`, so that every
command (and `--help`) starts without loading jax. `run` reports bad input by raising
`UsageError` (or a library `ValueError`): main prints it as one line and returns 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from dataclasses import dataclass
from typing import Callable

PROG = "python -m svg_lib"

# Modules (relative to svg_lib) that each define COMMAND; "plan" lives in this module.
COMMAND_MODULES: tuple[str, ...] = ("bench", "lowering", "compiler", "tuner", "cost")


class UsageError(ValueError):
    """Bad command-line input: printed as one line on stderr, exit status 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its arguments and what it does (returns the exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump) so scripts can show them as they are."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- problem flags shared by every command ---------------------------------------------------

PROBLEM_DEFAULTS = {"text_tokens": 0, "heads": 2, "head_dim": 128, "dtype": "bfloat16"}


def add_problem_arguments(parser: argparse.ArgumentParser, *, model: bool = True, blocks: bool = True) -> None:
    """The problem flags of plan, bench, lower and tune: a --preset, then explicit overrides.

    Defaults are None so that "not given" can be told from "given". `model` adds heads, head
    dim and dtype (what a kernel run needs); `blocks` adds one block size per axis.
    """
    parser.add_argument("--preset", choices=("tiny", "small", "blog"),
                        help="start from a preset (flags given override it)")
    parser.add_argument("--frames", type=int, metavar="F", help="latent frames")
    parser.add_argument("--height", type=int, metavar="H", help="tokens per frame, vertically")
    parser.add_argument("--width", type=int, metavar="W", help="tokens per frame, horizontally")
    parser.add_argument("--text-tokens", type=int, metavar="P", help="text tokens after the video (default 0)")
    parser.add_argument("--density", type=float, metavar="D", help="fraction of pairs the band keeps, in (0, 1]")
    parser.add_argument("--no-sink", action="store_true", help="leave out the first-frame sink")
    if model:
        parser.add_argument("--heads", type=int, metavar="H", help="attention heads (default 2 without a preset)")
        parser.add_argument("--head-dim", type=int, metavar="D", help="head dimension (default 128 without a preset)")
        parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                            help="dtype of q, k, v (default bfloat16 without a preset)")
    if blocks:
        parser.add_argument("--block-q", type=int, metavar="BQ", help="query tile size, a multiple of 128")
        parser.add_argument("--block-kv", type=int, metavar="BKV", help="key/value tile size, a multiple of 128")


def problem_values(args: argparse.Namespace, keys) -> dict:
    """Values for `keys` (flag names with underscores): preset values overridden by flags.

    Raises UsageError naming every flag that is still missing.
    """
    from .runtime import get_preset

    values = {key: PROBLEM_DEFAULTS.get(key) for key in keys}
    if args.preset is not None:
        p = get_preset(args.preset)
        g = p.geometry
        preset = dict(frames=g.frames, height=g.height, width=g.width, text_tokens=g.text_tokens, heads=p.heads,
                      head_dim=p.head_dim, density=p.density, block_q=p.block_q, block_kv=p.block_kv, dtype=p.dtype)
        values.update({key: preset[key] for key in keys if key in preset})
    for key in keys:
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    missing = ["--" + k.replace("_", "-") for k, v in values.items() if v is None]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}; give them, or start from --preset tiny|small|blog")
    return values


# -- plan ----------------------------------------------------------------------------------

def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser, model=False)
    parser.add_argument("--json", action="store_true", help="print only plan.stats as one JSON object")
    parser.add_argument("--max-cols", type=int, default=100, metavar="C",
                        help="widest ASCII tile map before key tiles are grouped (default 100)")


def _plan_settings(args: argparse.Namespace) -> dict:
    """The resolved plan settings: preset values overridden by explicit flags, all validated."""
    from .masks import check_block_size

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
    from .plots import ascii_tile_map

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
    from .geometry import VideoGeometry
    from .masks import SVGMask
    from .planner import plan_tiles

    settings = _plan_settings(args)
    geometry = VideoGeometry(settings["frames"], settings["height"], settings["width"], settings["text_tokens"])
    mask = SVGMask.spatial(geometry, settings["density"], first_frame_sink=not args.no_sink)
    plan = plan_tiles(mask, settings["block_q"], settings["block_kv"])
    if args.json:
        print(json.dumps(plan.stats))
    else:
        print(_describe_plan(plan, settings, args.preset, args.max_cols))
    return 0


PLAN = Command("plan", "tile plan of a spatial SVG mask: tiles visited and masked in B1/B2/B3",
               _plan_arguments, _plan_run)


# -- the command line ----------------------------------------------------------------------

def commands() -> list[Command]:
    """Every registered command: `plan`, then one per module in COMMAND_MODULES."""
    found = [PLAN]
    for name in COMMAND_MODULES:
        found.append(importlib.import_module(f".{name}", __package__).COMMAND)
    return found


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog=PROG, description="svg_lib: tile-aligned sparse video attention, from the command line")
    parser.add_argument("--version", action="version", version=f"svg_lib {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands():
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(command_parser)
        command_parser.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the command, return its exit status.

    Bad input gives one line on stderr and status 2, never a traceback.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version and argparse errors: return instead of exiting
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    try:
        return int(args._run(args))
    except ValueError as err:  # UsageError, or the library refusing a value it was given
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 2
