"""`python -m svg_lib vmem --sweep | --largest`: the VMEM estimate held against the TPU compiler."""
from __future__ import annotations

import argparse

from svg_lib.chips import check_target
from svg_lib.cli.common import (
    Command,
    UsageError,
    add_json_argument,
    argument_type,
    block_pair,
    block_size,
    emit_json,
    say,
)
from svg_lib.environment import INSTALL_HINT, has_libtpu
from svg_lib.memory.vmem import SPLASH_METHODS
from svg_lib.methods import PALLAS_METHODS, SERIES_FIRST_METHODS
from svg_lib.progress import bar as progress_bar
from svg_lib.progress import write
from svg_lib.instruments.tpu.checks import largest_block_q, sweep_points, verify_points


def _vmem_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweep", action="store_true",
                        help="estimate against compiler on a grid of blocks (one compile per method, block pair, "
                             "dtype and target: minutes for the default grid)")
    parser.add_argument("--largest", action="store_true",
                        help="the largest block_q at block_kv 1536 per method and target (slow: a bisection)")
    parser.add_argument("--methods", nargs="+", choices=PALLAS_METHODS,
                        default=list(SERIES_FIRST_METHODS))
    parser.add_argument("--targets", nargs="+", type=argument_type(lambda t: check_target(t).name, "target"),
                        default=["v6e", "v5e"])
    parser.add_argument("--blocks", nargs="+", type=block_pair, default=[(512, 512), (1024, 512), (2048, 1536)],
                        metavar="BQxBKV", help="block_q x block_kv pairs (default 512x512 1024x512 2048x1536)")
    parser.add_argument("--dtypes", nargs="+", choices=("bfloat16", "float32"), default=["bfloat16", "float32"])
    parser.add_argument("--block-kv-compute", nargs="+", type=block_size, default=None)
    add_json_argument(parser, "also write every point's estimate and compile as JSON to PATH")


def _sweep(args: argparse.Namespace) -> list:
    """The sweep's checks: every point estimated (and so checked) first, then compiled one by one."""
    points = sweep_points(args.methods, args.blocks, args.dtypes, args.targets,
                          block_kv_computes=args.block_kv_compute or (None,))
    say(f"vmem --sweep: {len(points)} kernels to compile for TPU on this CPU, one at a time; each result "
        "prints as it comes")
    return verify_points(points, log=write, bar=True)


def _largest(args: argparse.Namespace) -> list[dict]:
    """`largest_block_q` per target and method: a bisection of several compiles each."""
    pairs = [(target, method) for target in args.targets for method in args.methods]
    say(f"vmem --largest: {len(pairs)} bisections (method x target), several compiles each")
    rows = []
    shown = progress_bar(total=len(pairs), desc="vmem largest", unit="bisection")
    for target, method in pairs:
        shown.set_description(f"vmem largest: {method} on {target}")
        rows.append(largest_block_q(method, target, splash_mask="blocks" if method in SPLASH_METHODS else None,
                                    log=write))
        shown.update(1)
    shown.close()
    return rows


def _vmem_run(args: argparse.Namespace) -> int:
    if not (args.sweep or args.largest):
        raise UsageError("nothing asked: give --sweep (the estimate against the compiler on a grid of blocks) "
                         "or --largest (the largest block_q per method and target), or both")
    if not has_libtpu():
        raise UsageError("the TPU compiler (libtpu) is not installed. Install it with: " + INSTALL_HINT)
    rows, bad = [], []
    if args.sweep:
        checks = _sweep(args)
        rows += [c.row() for c in checks]
        bad = [c for c in checks if not c.agrees]
        print(f"{len(checks)} points, {len(bad)} disagreements, "
              f"{sum(c.conservative for c in checks)} where the estimate is conservative", flush=True)
    if args.largest:
        rows += _largest(args)
    emit_json(args, rows)
    return 1 if bad else 0


COMMAND = Command("vmem", "the VMEM estimate against the TPU compiler (libtpu, compile-only): --sweep or --largest",
                  _vmem_arguments, _vmem_run)
